"""Graceful termination as upstream's graceful_termination.go does it, on the package's fake node.

A TCP real server whose endpoint is gone gets weight 0 and stays until its ActiveConn+InActConn
reach 0; a UDP or SCTP one is deleted at once (upstream's IsRsGracefulTerminationNeeded), however
many flows `ipvsadm -Ln` still counts for it.
"""

from __future__ import annotations

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.ipvs.apply import diff_ipvs, graceful_termination_needed
from kubeproxy.backends.ipvs.proxier import IpvsProxier
from kubeproxy.backends.ipvs.render import RealServer, VirtualServer
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions

OPTS = NodeOptions(node_name="node", node_ip="192.168.0.2")


def _view(protocol: str, *pods: str) -> NodeView:
    name = ServicePortName("default", "dns", "p53", protocol)
    svc = ServicePortInfo(name, valid_ip("10.96.0.10"), 53, protocol)
    return NodeView({name: svc}, {name: [EndpointInfo(ip_text(valid_ip(ip)), 5353) for ip in pods]})


@pytest.mark.parametrize(("protocol", "needed"), [("TCP", True), ("UDP", False), ("SCTP", False), ("udp", False)])
def test_only_tcp_needs_graceful_termination(protocol: str, needed: bool) -> None:
    assert graceful_termination_needed(protocol) is needed


@pytest.mark.parametrize("protocol", ["UDP", "SCTP"])
def test_busy_udp_and_sctp_real_servers_are_deleted_at_once(protocol: str) -> None:
    vs = VirtualServer(protocol, "10.96.0.10", 53)
    have = {vs: [RealServer("10.244.1.10", 5353), RealServer("10.244.2.10", 5353)]}
    busy = {(protocol, "10.96.0.10", 53, "10.244.2.10", 5353): (3, 40)}
    ops = diff_ipvs({vs: (RealServer("10.244.1.10", 5353),)}, have, busy)
    opt = "-u" if protocol == "UDP" else "--sctp-service"
    assert ops.lines == (f"-d {opt} 10.96.0.10:53 -r 10.244.2.10:5353",)
    assert (ops.deleted_reals, ops.quiesced_reals) == (1, 0)


def test_busy_tcp_real_server_is_quiesced_not_deleted() -> None:
    vs = VirtualServer("TCP", "10.96.0.10", 53)
    have = {vs: [RealServer("10.244.1.10", 5353), RealServer("10.244.2.10", 5353)]}
    busy = {("TCP", "10.96.0.10", 53, "10.244.2.10", 5353): (0, 1)}  # InActConn alone also holds it
    ops = diff_ipvs({vs: (RealServer("10.244.1.10", 5353),)}, have, busy)
    assert ops.lines == ("-e -t 10.96.0.10:53 -r 10.244.2.10:5353 -m -w 0",)
    assert (ops.deleted_reals, ops.quiesced_reals) == (0, 1)


@pytest.mark.parametrize("protocol", ["UDP", "SCTP"])
def test_proxier_removes_a_busy_udp_or_sctp_endpoint_in_one_sync(protocol: str) -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view(protocol, "10.244.1.10", "10.244.2.10"), OPTS, None)
    vs = VirtualServer(protocol, "10.96.0.10", 53)
    node.ipvs.connections[(protocol, "10.96.0.10", 53, "10.244.2.10", 5353)] = (0, 12)
    report = proxier.sync(_view(protocol, "10.244.1.10"), OPTS, None)
    assert node.ipvs.table()[vs] == (RealServer("10.244.1.10", 5353, 1),)
    assert report.ipvs_ops.quiesced_reals == 0


def test_proxier_keeps_a_busy_tcp_endpoint_at_weight_zero() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view("TCP", "10.244.1.10", "10.244.2.10"), OPTS, None)
    vs = VirtualServer("TCP", "10.96.0.10", 53)
    node.ipvs.connections[("TCP", "10.96.0.10", 53, "10.244.2.10", 5353)] = (1, 0)
    proxier.sync(_view("TCP", "10.244.1.10"), OPTS, None)
    assert node.ipvs.table()[vs] == (RealServer("10.244.1.10", 5353, 1), RealServer("10.244.2.10", 5353, 0))
    node.ipvs.connections.clear()
    proxier.sync(_view("TCP", "10.244.1.10"), OPTS, None)
    assert node.ipvs.table()[vs] == (RealServer("10.244.1.10", 5353, 1),)
