"""Stale UDP conntrack cleanup without a kernel: parsing `conntrack -L`, upstream's reconciler
cases (pkg/proxy/conntrack/cleanup_test.go), the `conntrack -D` selections and the failures of
the table.

Reconcile runs against `FakeConntrack`, the in-memory table the reconciler prunes as it prunes the
kernel's over ctnetlink (and a runner for `ip` and the conntrack program, which it also fakes), so
"what is left afterwards" is checked as upstream's fake netlink handler checks it. The kernel's
side is tests/backends/conntrack/test_kernel.py and test_fake_vs_kernel.py.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.backends.conntrack import (
    ConntrackError,
    ConntrackMissing,
    Deleted,
    Filter,
    Flow,
    NetlinkTable,
    NodePortDestinations,
    NodePorts,
    Reconciler,
    clean_stale_entries,
    cleanup_required,
    delete,
    local_routes,
    node_port_destinations,
    parse_flows,
    reconcile,
    stale,
    stale_filters,
    table_for,
)
from kubeproxy.backends.conntrack.fake import FakeConntrack
from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.cluster.objects import parse_endpoint_slice, parse_service
from kubeproxy.cluster.state import ClusterState
from kubeproxy.kernel.exec import local_run
from kubeproxy.model.changes import Changes, ChangeTracker
from kubeproxy.model.node_model import NodeView, ServicePortName, build_view
from kubeproxy.model.options import Family, NodeOptions

# -- upstream's fixture: one service with TCP, UDP and SCTP ports on the same numbers

CLUSTER_IP = "172.30.1.1"
EXTERNAL_IP = "192.168.99.100"
LB_IP = "1.2.3.4"
SERVING_EP = "10.240.0.4"
NON_SERVING_EP = "10.240.1.5"
DELETED_EP = "10.240.2.6"
OLD_EP_PORT = 8080  # the endpoint kept its IP but moved to EP_PORT
EP_PORT = 9090
SVC_PORT = 8000
NODE_PORT = 32000
NON_SVC_PORT = 3000  # flows to the service IPs on a port that is not the service's
NODE_IP = "10.0.0.1"
PROTO_NUM = {"tcp": 6, "udp": 17, "sctp": 132}
# Where NodePorts are, resolved: the node's address (as --nodeport-addresses could select it).
NODE = NodePortDestinations(frozenset({NODE_IP}))
# The kernel's local routes of type local on such a node, as `ip -j route show table local type local` lists them.
LOCAL_ROUTES = ["127.0.0.0/8", "127.0.0.1", NODE_IP]


def service_obj(name: str = "cleanup-test", ports: Sequence[tuple[str, str, int]] | None = None) -> dict[str, Any]:
    ports = ports or [("test-tcp", "TCP", 0), ("test-udp", "UDP", NODE_PORT), ("test-sctp", "SCTP", NODE_PORT)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "test", "name": name},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": CLUSTER_IP,
            "externalIPs": [EXTERNAL_IP],
            "ports": [{"name": n, "protocol": p, "port": SVC_PORT, **({"nodePort": np} if np else {})} for n, p, np in ports],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": LB_IP}]}},
    }


def slice_obj(service: str = "cleanup-test", protocols: Sequence[str] = ("TCP", "UDP", "SCTP")) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": "test", "name": "cleanup-test-0", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": f"test-{p.lower()}", "protocol": p, "port": EP_PORT} for p in protocols],
        "endpoints": [
            {"addresses": [SERVING_EP], "conditions": {"serving": True}},
            {"addresses": [NON_SERVING_EP], "conditions": {"ready": False, "serving": False}},
        ],
    }


def view_of(services: list[dict[str, Any]], slices: list[dict[str, Any]], family: Family = Family.IPV4) -> NodeView:
    return build_view([parse_service(s) for s in services], [parse_endpoint_slice(e) for e in slices], family, "test-worker")


class Lines:
    """`conntrack -L` lines, each flow from its own client port so that every one is distinct."""

    def __init__(self) -> None:
        self._sport = 10000

    def __call__(self, proto: str, orig_dst: str, orig_dport: int, reply_src: str, reply_sport: int) -> str:
        self._sport += 1
        client, sport = "10.0.0.99", self._sport
        state = "ESTABLISHED " if proto == "tcp" else ""
        return (
            f"{proto:<8} {PROTO_NUM[proto]} 29 {state}src={client} dst={orig_dst} sport={sport} dport={orig_dport} "
            f"[UNREPLIED] src={reply_src} dst={client} sport={reply_sport} dport={sport} mark=0 use=1"
        )


def upstream_view() -> NodeView:
    view = view_of([service_obj()], [slice_obj()])
    # The same sanity checks upstream makes on its fixture.
    assert {(n.port, n.protocol) for n in view.services} == {("test-tcp", "TCP"), ("test-udp", "UDP"), ("test-sctp", "SCTP")}
    for eps in view.endpoints.values():
        assert [(e.ip, e.port, e.serving) for e in eps] == [(SERVING_EP, EP_PORT, True), (NON_SERVING_EP, EP_PORT, False)]
    return view


# -- upstream's TestCleanStaleEntries


def upstream_table() -> tuple[list[str], list[str]]:
    """(the table before cleanup, the lines expected to survive it), built as upstream builds them."""
    line = Lines()
    before: list[str] = []
    after: list[str] = []
    # Endpoint kept its IP, changed its port: entries to the old port are stale.
    for dst in (CLUSTER_IP, LB_IP, EXTERNAL_IP):
        before.append(line("udp", dst, SVC_PORT, SERVING_EP, OLD_EP_PORT))
    for dnat in (SERVING_EP, NON_SERVING_EP, DELETED_EP):
        for proto in ("tcp", "udp", "sctp"):
            for dst in (CLUSTER_IP, LB_IP, EXTERNAL_IP):
                for port in (SVC_PORT, NON_SVC_PORT):
                    entry = line(proto, dst, port, dnat, EP_PORT)
                    before.append(entry)
                    if not (proto == "udp" and port == SVC_PORT and dnat != SERVING_EP):
                        after.append(entry)
            # NodePort: any destination address.
            entry = line(proto, NODE_IP, NODE_PORT, dnat, EP_PORT)
            before.append(entry)
            if not (proto == "udp" and dnat != SERVING_EP):
                after.append(entry)
    # Never DNATed (made while the service had no endpoints): the reply comes from the frontend.
    for ip in (CLUSTER_IP, LB_IP, EXTERNAL_IP):
        for port in (SVC_PORT, NON_SVC_PORT):
            entry = line("udp", ip, port, ip, port)
            before.append(entry)
            if port != SVC_PORT:
                after.append(entry)
    return before, after


def test_upstream_clean_stale_entries_pure() -> None:
    before, after = upstream_table()
    flows = parse_flows(before)
    assert len(flows) == len(before) == 3 + 63 + 6
    survivors = set(parse_flows(after))
    assert set(stale(flows, upstream_view(), NODE)) == set(flows) - survivors
    assert len(survivors) == len(after)


def test_upstream_clean_stale_entries_through_conntrack() -> None:
    before, after = upstream_table()
    ct = FakeConntrack(local=list(LOCAL_ROUTES), table=list(before))
    deleted = reconcile(upstream_view(), Family.IPV4, ct)
    udp_before = [line for line in before if line.startswith("udp ")]
    assert sorted(ct.table) == sorted(after)
    assert deleted == len(before) - len(after) == len(udp_before) - len([x for x in after if x.startswith("udp ")])
    # Every stale entry is its own (frontend, backend) pair here; no conntrack program ran.
    assert len(stale_filters(parse_flows(before), upstream_view(), NODE)) == deleted
    assert [c[0] for c in ct.calls] == ["ip"]


def test_upstream_performance_one_delete_for_many_stale_entries() -> None:
    """Upstream's TestPerformanceCleanStaleEntries, with 60k entries instead of 1M: one listing,
    and only the stale entries deleted."""
    view = view_of([service_obj(ports=[("test-udp", "UDP", 0)])], [slice_obj(protocols=["UDP"])])
    line = Lines()
    table = [line("udp", EXTERNAL_IP, SVC_PORT, SERVING_EP, EP_PORT), line("udp", EXTERNAL_IP, SVC_PORT, DELETED_EP, EP_PORT)]
    rng = random.Random(1)
    expected_deleted, expected_left = 1, 1
    for _ in range(60_000):
        port = rng.randrange(1, 65536)
        table.append(line("udp", EXTERNAL_IP, port, DELETED_EP, EP_PORT))
        if port == SVC_PORT:
            expected_deleted += 1
        else:
            expected_left += 1
    ct = FakeConntrack(local=list(LOCAL_ROUTES), table=table)
    assert reconcile(view, Family.IPV4, ct) == expected_deleted
    assert len(ct.table) == expected_left
    assert ct.calls == []  # no NodePort: not even the local addresses were asked for


def test_upstream_service_without_endpoints() -> None:
    """Upstream's TestServiceWithoutEndpoints: the slice belongs to another service, so this one
    has no serving endpoint and every UDP flow to its addresses and port goes, whichever endpoint
    it reached; a flow to another port, a TCP flow and a flow to its NodePort stay."""
    view = view_of([service_obj(ports=[("test-udp", "UDP", NODE_PORT)])],
                   [slice_obj(service="non-existing-service", protocols=["UDP"])])  # fmt: skip
    line = Lines()
    stale_lines = [line("udp", ip, SVC_PORT, ep, EP_PORT) for ip in (CLUSTER_IP, LB_IP, EXTERNAL_IP)
                   for ep in (SERVING_EP, DELETED_EP)]  # fmt: skip
    keep = [line("udp", EXTERNAL_IP, NON_SVC_PORT, DELETED_EP, EP_PORT), line("tcp", EXTERNAL_IP, SVC_PORT, DELETED_EP, EP_PORT),
            line("udp", NODE_IP, NODE_PORT, DELETED_EP, EP_PORT)]  # fmt: skip
    ct = FakeConntrack(local=list(LOCAL_ROUTES), table=stale_lines + keep)
    assert reconcile(view, Family.IPV4, ct) == 6
    assert ct.table == keep


@pytest.mark.parametrize(
    ("flt", "family", "argv"),
    [
        (
            Filter(53, "10.244.0.3", 5353, "10.96.0.10"),
            Family.IPV4,
            "-p udp -f ipv4 --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.0.3 --reply-port-src 5353",
        ),
        (
            Filter(8000, "4001:ab8::2", 9090, "2001:db8:1::2"),
            Family.IPV6,
            "-p udp -f ipv6 --orig-dst 2001:db8:1::2 --orig-port-dst 8000 --reply-src 4001:ab8::2 --reply-port-src 9090",
        ),
        (
            Filter(30053, "2001:db8:1::2", 53, "2001:db8::1"),  # a NodePort: the node address too
            Family.IPV6,
            "-p udp -f ipv6 --orig-dst 2001:db8::1 --orig-port-dst 30053 --reply-src 2001:db8:1::2 --reply-port-src 53",
        ),
    ],
)
def test_filter_argv(flt: Filter, family: str, argv: str) -> None:
    """Upstream's TestFilterForIPPortNAT / TestFilterForPortNAT, as conntrack options (our NodePort
    filter names the node address: upstream's matches any destination)."""
    assert flt.argv(family) == argv.split()


# -- our own cases


def test_ipv6_addresses_compare_in_canonical_form() -> None:
    svc = service_obj(ports=[("test-udp", "UDP", 0)])
    svc["spec"].update(clusterIP="fd00:96::10", externalIPs=[])
    svc["status"] = {}
    eps = slice_obj(protocols=["UDP"])
    eps["addressType"] = "IPv6"
    eps["endpoints"] = [{"addresses": ["fd00:244::4"], "conditions": {"serving": True}}]
    view = view_of([svc], [eps], Family.IPV6)
    text = (
        "udp      17 29 src=fd00::99 dst=fd00:96:0:0::10 sport=40000 dport=8000 src=fd00:244:0::4 dst=fd00::99 "
        "sport=9090 dport=40000 [ASSURED] mark=0 use=1\n"
        "udp      17 29 src=fd00::99 dst=FD00:96::10 sport=40001 dport=8000 src=fd00:244::5 dst=fd00::99 "
        "sport=9090 dport=40001 mark=0 use=1\n"
    )
    flows = parse_flows(text)
    assert flows[0].orig_dst == "fd00:96::10" and flows[0].reply_src == "fd00:244::4"
    assert stale(flows, view, NODE) == [flows[1]]
    assert stale_filters(flows, view, NODE) == [Filter(8000, "fd00:244::5", 9090, "fd00:96::10")]


# -- NodePort cleanup touches only flows to the node's NodePort addresses (item 7)


def dns_node_port_view() -> NodeView:
    """A UDP service with nodePort 53 (a manifest can say so) and one serving endpoint."""
    return view_of([service_obj(ports=[("test-udp", "UDP", 53)])], [slice_obj(protocols=["UDP"])])


def dns_flows() -> tuple[list[str], list[str]]:
    """(the table, the lines that must survive): the node's own DNS flows, never DNATed, to an
    outside resolver, to a local stub resolver on loopback and to a pod, plus stale NodePort
    flows to the node's address (one never DNATed, one DNATed to a deleted endpoint)."""
    line = Lines()
    keep = [
        line("udp", "8.8.8.8", 53, "8.8.8.8", 53),
        line("udp", "127.0.0.53", 53, "127.0.0.53", 53),
        line("udp", "10.240.7.7", 53, "10.240.7.7", 53),
        line("udp", NODE_IP, 53, SERVING_EP, EP_PORT),  # the NodePort's live flow
    ]
    stale_lines = [line("udp", NODE_IP, 53, NODE_IP, 53), line("udp", NODE_IP, 53, DELETED_EP, EP_PORT)]
    return keep + stale_lines, keep


def test_node_port_53_leaves_the_nodes_own_dns_flows_alone() -> None:
    """The issue's finding: with upstream's any-destination NodePort filter, every one of the
    node's DNS flows was 'stale' (its reply does not come from a serving endpoint)."""
    table, keep = dns_flows()
    ct = FakeConntrack(local=list(LOCAL_ROUTES), table=list(table))
    assert reconcile(dns_node_port_view(), Family.IPV4, ct) == 2
    assert sorted(ct.table) == sorted(keep)
    assert all(f.orig_dst == NODE_IP for f in set(parse_flows(table)) - set(parse_flows(ct.table)))


def test_node_port_destinations_follow_the_options() -> None:
    view, flows = dns_node_port_view(), parse_flows(dns_flows()[0])

    def removed(dsts: NodePortDestinations) -> set[tuple[str, str]]:
        return {(f.orig_dst, f.reply_src) for f in stale(flows, view, dsts)}

    nodes_own = {(NODE_IP, NODE_IP), (NODE_IP, DELETED_EP)}
    # Every local address (the default): the kernel's local routes, loopback left out.
    assert removed(NodePorts().resolve(LOCAL_ROUTES)) == nodes_own
    # iptables with localhost NodePorts: 127.0.0.0/8 accepts NodePorts too, so the stub
    # resolver's flow is one of the NodePort's (the rules now DNAT it): it goes.
    assert removed(NodePorts(loopback=True).resolve(LOCAL_ROUTES)) == nodes_own | {("127.0.0.53", "127.0.0.53")}
    # --nodeport-addresses selecting other addresses: none of these flows is a NodePort's.
    assert removed(NodePorts(ips=("10.0.0.9",), all_local=False).resolve(LOCAL_ROUTES)) == set()
    assert removed(NodePorts(ips=(NODE_IP, "127.0.0.1"), all_local=False).resolve()) == nodes_own
    assert removed(NodePortDestinations()) == set()


def test_node_ports_of_options_as_each_mode_renders_them() -> None:
    base = dict(node_name="n", node_ip=NODE_IP, node_labels={}, family=Family.IPV4)
    opts = NodeOptions(**base, localhost_nodeports=True)  # type: ignore[arg-type]
    assert NodePorts.of(opts, loopback_nodeports=True) == NodePorts((), True, True)
    assert NodePorts.of(opts, loopback_nodeports=False) == NodePorts((), True, False)  # no localhost NodePorts in nft
    selected = NodeOptions(
        **base,  # type: ignore[arg-type]
        localhost_nodeports=False,
        nodeport_ips=(NODE_IP, "127.0.0.1"),
        nodeport_match_all=False,
    )
    assert NodePorts.of(selected, loopback_nodeports=True).resolve() == NodePortDestinations(frozenset({NODE_IP}))


def test_resolve_keeps_single_addresses_and_prefixes_normalised() -> None:
    dsts = NodePorts(loopback=True).resolve(["127.0.0.0/8", "fd00:0::1", "not-an-ip", "10.0.0.1"])
    assert dsts.addresses == frozenset({"fd00::1", "10.0.0.1"})
    assert dsts.networks == (ipaddress.ip_network("127.0.0.0/8"),)
    assert "127.1.2.3" in dsts and "fd00::1" in dsts and "10.0.0.2" not in dsts and "x" not in dsts
    assert "::1" not in NodePorts().resolve(["::1", "fd00::1"])


def test_local_addresses_are_asked_only_when_needed() -> None:
    no_node_port = view_of([service_obj(ports=[("test-udp", "UDP", 0)])], [slice_obj(protocols=["UDP"])])
    ct = FakeConntrack(local=list(LOCAL_ROUTES), table=[])
    assert node_port_destinations(no_node_port, Family.IPV4, NodePorts(), ct) == NodePortDestinations()
    assert node_port_destinations(dns_node_port_view(), Family.IPV4, NodePorts(ips=(NODE_IP,), all_local=False), ct) == NODE
    assert ct.calls == []
    assert node_port_destinations(dns_node_port_view(), Family.IPV4, NodePorts(), ct) == NODE
    assert [c[0] for c in ct.calls] == ["ip"]


@pytest.mark.parametrize(
    "failure",
    [(1, "", "Cannot open netlink socket\n"), (0, "{not json", ""), FileNotFoundError(2, "No such file", "ip")],
)
def test_unknown_local_addresses_leave_node_port_flows_alone(failure: Any, caplog: pytest.LogCaptureFixture) -> None:
    table, _ = dns_flows()
    ct = FakeConntrack(table=list(table))
    with caplog.at_level(logging.ERROR, logger="kubeproxy.conntrack"):
        run = runner(failure)
        assert clean_stale_entries(dns_node_port_view(), Family.IPV4, run, table=ct) == 0
    assert [c[0] for c in run.calls] == ["ip"] and ct.table == table  # listed, asked, deleted nothing
    assert "NodePort conntrack entries are left alone" in caplog.text
    with pytest.raises(Exception, match="route show"):
        local_routes(Family.IPV4, runner(failure))


def test_shared_frontend_keeps_flows_to_either_services_endpoints() -> None:
    # Two UDP services on the same external IP and port: a flow to either one's endpoint stays.
    a = service_obj("a", ports=[("test-udp", "UDP", 0)])
    b = service_obj("b", ports=[("test-udp", "UDP", 0)])
    b["spec"]["clusterIP"] = "172.30.1.2"
    b["status"] = {}
    sa = slice_obj("a", protocols=["UDP"])
    sb = slice_obj("b", protocols=["UDP"])
    sb["metadata"]["name"] = "b-0"
    sb["endpoints"] = [{"addresses": ["10.240.9.9"], "conditions": {"serving": True}}]
    view = view_of([a, b], [sa, sb])
    line = Lines()
    flows = parse_flows(
        [
            line("udp", EXTERNAL_IP, SVC_PORT, SERVING_EP, EP_PORT),
            line("udp", EXTERNAL_IP, SVC_PORT, "10.240.9.9", EP_PORT),
            line("udp", EXTERNAL_IP, SVC_PORT, DELETED_EP, EP_PORT),
        ]
    )
    assert stale(flows, view, NODE) == [flows[2]]


def test_terminating_but_serving_endpoint_keeps_its_flows() -> None:
    eps = slice_obj(protocols=["UDP"])
    eps["endpoints"] = [
        {"addresses": [SERVING_EP], "conditions": {"ready": False, "serving": True, "terminating": True}},
        {"addresses": ["10.240.0.5"], "conditions": {"ready": True, "serving": True}},
    ]
    view = view_of([service_obj(ports=[("test-udp", "UDP", 0)])], [eps])
    flows = parse_flows([Lines()("udp", CLUSTER_IP, SVC_PORT, SERVING_EP, EP_PORT)])
    assert stale(flows, view, NODE) == []


# -- parsing


CAPTURED = """\
udp      17 29 src=10.0.0.2 dst=10.96.0.10 sport=40000 dport=53 [UNREPLIED] src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000 mark=0 use=1
udp      17 29 src=10.0.0.2 dst=10.0.0.1 sport=40000 dport=53 packets=1 bytes=29 [UNREPLIED] src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000 packets=0 bytes=0 mark=0 delta-time=1 use=1
ipv4     2 udp      17 29 src=10.0.0.2 dst=10.0.0.1 sport=40000 dport=53 [UNREPLIED] src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000 mark=0 use=1 id=262948508
udp      17 176 src=10.0.0.2 dst=10.96.0.10 sport=40001 dport=53 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40001 [ASSURED] mark=0 zone=7 use=2
udp      17 29 src=fd00::2 dst=fd00::1 sport=37456 dport=53 packets=1 bytes=49 [UNREPLIED] src=fd00:244::1 dst=fd00::2 sport=5300 dport=37456 packets=0 bytes=0 mark=0 delta-time=1 use=1
tcp      6 431999 ESTABLISHED src=10.0.0.2 dst=10.96.0.1 sport=51000 dport=443 src=10.244.0.9 dst=10.0.0.2 sport=6443 dport=51000 [ASSURED] mark=0 use=1
"""  # noqa: E501


def test_parse_captured_lines() -> None:
    flows = parse_flows(CAPTURED)
    assert flows[0] == Flow("udp", "10.0.0.2", "10.96.0.10", 40000, 53, "10.244.1.1", "10.0.0.2", 5300, 40000)
    assert flows[1] == Flow("udp", "10.0.0.2", "10.0.0.1", 40000, 53, "10.244.1.1", "10.0.0.2", 5300, 40000)
    assert flows[2] == flows[1]  # -o extended,id prefix and suffix
    assert flows[3].orig_sport == 40001 and flows[3].reply_src == "10.244.1.1"
    assert flows[4] == Flow("udp", "fd00::2", "fd00::1", 37456, 53, "fd00:244::1", "fd00::2", 5300, 37456)
    assert flows[5].protocol == "tcp" and flows[5].reply_sport == 6443
    assert len(flows) == 6


@pytest.mark.parametrize(
    "line",
    [
        "conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.",
        "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=40000 dport=53 [UNREPLIED]",  # no reply tuple
        "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=40000 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000",
        "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=40000 dport=99999 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000",
        "udp 17 29 src=10.0.0.2 dst=10.96.0.300 sport=40000 dport=53 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000",
        "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=x dport=53 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000",
        "icmp 1 29 src=10.0.0.2 dst=10.96.0.10 type=8 code=0 id=7 src=10.96.0.10 dst=10.0.0.2 type=0 code=0 id=7 mark=0 use=1",
        "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=1 dport=53 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=1 src=1.1.1.1",
        "garbage",
    ],
)
def test_unparsable_line_is_skipped_with_a_debug_log(line: str, caplog: pytest.LogCaptureFixture) -> None:
    good = CAPTURED.splitlines()[0]
    with caplog.at_level(logging.DEBUG, logger="kubeproxy.conntrack"):
        flows = parse_flows([good, line, good])
    assert len(flows) == 2
    assert any("skipping conntrack line 2" in r.getMessage() for r in caplog.records)


# -- running conntrack: exit codes and failures


def runner(*results: tuple[int, str, str] | BaseException) -> Any:
    calls: list[list[str]] = []
    queue = list(results)

    def run(argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None) -> Any:
        calls.append(list(argv))
        result = queue.pop(0)
        if isinstance(result, BaseException):
            raise result
        rc, out, err = result
        return subprocess.CompletedProcess(list(argv), rc, out, err)

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_delete_nothing_matched_is_not_an_error() -> None:
    run = runner((1, "", "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n"))
    assert delete(Filter(53, "10.244.1.1", 5300, "10.96.0.10"), Family.IPV4, run) == 0
    assert run.calls == [["conntrack", "-D", *Filter(53, "10.244.1.1", 5300, "10.96.0.10").argv(Family.IPV4)]]


def test_delete_other_failure_is_an_error() -> None:
    run = runner((1, "", "conntrack v1.4.7 (conntrack-tools): Operation failed: invalid parameters\n"))
    with pytest.raises(ConntrackError, match="invalid parameters"):
        delete(Filter(53, "10.244.1.1", 5300, "10.96.0.10"), Family.IPV4, run)


@dataclass
class _Table:
    """A conntrack table that fails as told: listing raises `listing`, each delete of a flow in
    `refused` fails with a message."""

    flows: list[Flow] = field(default_factory=list)
    listing: ConntrackError | None = None
    refused: frozenset[Flow] = frozenset()
    deleted: list[Flow] = field(default_factory=list)

    def udp_flows(self, family: str) -> list[Flow]:
        if self.listing is not None:
            raise self.listing
        return list(self.flows)

    def delete_flows(self, family: str, flows: Collection[Flow]) -> Deleted:
        errors = tuple(f"{f.orig_dst}: Operation not permitted" for f in flows if f in self.refused)
        self.deleted += [f for f in flows if f not in self.refused]
        return Deleted(len(flows) - len(errors), errors)


def test_failed_delete_is_logged_and_the_others_still_go(caplog: pytest.LogCaptureFixture) -> None:
    line = Lines()
    flows = parse_flows([line("udp", ip, SVC_PORT, DELETED_EP, EP_PORT) for ip in (CLUSTER_IP, LB_IP)])
    table = _Table(flows, refused=frozenset(flows[:1]))
    view = view_of([service_obj(ports=[("test-udp", "UDP", 0)])], [slice_obj(protocols=["UDP"])])
    with caplog.at_level(logging.ERROR, logger="kubeproxy.conntrack"):
        assert Reconciler(runner(), table).reconcile(view, Family.IPV4) == 1
    assert table.deleted == flows[1:]
    assert any("Failed to clear all conntrack entries" in r.getMessage() for r in caplog.records)


def test_listing_failure_raises_from_clean_stale_entries_and_is_logged_by_reconcile(caplog: pytest.LogCaptureFixture) -> None:
    view = upstream_view()
    refused = ConntrackError("listing the IPv4 UDP conntrack entries: [Errno 105] No buffer space available")
    with pytest.raises(ConntrackError, match="No buffer space"):
        clean_stale_entries(view, Family.IPV4, runner(), table=_Table(listing=refused))
    with caplog.at_level(logging.ERROR, logger="kubeproxy.conntrack"):
        assert Reconciler(runner(), _Table(listing=refused)).reconcile(view, Family.IPV4) == 0
        assert Reconciler(runner()).reconcile(view, Family.IPV4) == 0  # a runner with no table
    assert caplog.text.count("Failed to list conntrack entries") == 2


def test_missing_ctnetlink_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    view = upstream_view()
    missing = _Table(listing=ConntrackMissing("Protocol not supported (the UDP cleanup needs ctnetlink: ...)"))
    rec = Reconciler(runner(), missing)
    with caplog.at_level(logging.DEBUG, logger="kubeproxy.conntrack"):
        assert [rec.reconcile(view, Family.IPV4) for _ in range(3)] == [0, 0, 0]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "needs ctnetlink" in warnings[0].getMessage()


def test_tables_for_each_runner() -> None:
    node = FakeNode()
    assert table_for(node) is node.conntrack
    ct = FakeConntrack()
    assert table_for(ct) is ct
    assert isinstance(table_for(local_run), NetlinkTable) and table_for(local_run).netns_path is None  # type: ignore[attr-defined]
    with pytest.raises(ConntrackError, match="no conntrack table"):
        table_for(runner())


def test_bad_family_names_the_choices() -> None:
    with pytest.raises(ValueError, match="IPv4 or IPv6, not 'ipv4'"):
        reconcile(upstream_view(), "ipv4", FakeConntrack())


# -- when to run


def test_cleanup_required_follows_udp_changes() -> None:
    spn = ServicePortName("ns", "dns", "p", "UDP")
    assert cleanup_required(Changes(full=True))
    assert not cleanup_required(Changes(full=False, services=frozenset({("ns", "dns")})))
    assert cleanup_required(Changes(full=False, newly_active_udp_services=frozenset({spn})))
    assert cleanup_required(Changes(full=False, deleted_udp_cluster_ips=frozenset({"10.96.0.10"})))


def test_cleanup_required_with_the_change_tracker() -> None:
    state, tracker = ClusterState(), ChangeTracker(node_name="test-worker")

    def take() -> Changes:
        return tracker.take(build_view(state.services.values(), state.slices.values(), Family.IPV4, "test-worker"))

    udp = service_obj(ports=[("test-udp", "UDP", 0)])
    eps = slice_obj(protocols=["UDP"])
    tracker.apply(state, udp)
    tracker.apply(state, eps)
    assert cleanup_required(take())  # first sync is full
    assert not cleanup_required(take())  # nothing changed
    eps["endpoints"].append({"addresses": ["10.240.0.7"], "conditions": {"serving": True}})
    tracker.apply(state, eps)
    assert not cleanup_required(take())  # an endpoint added: nothing can be stale
    eps["endpoints"] = eps["endpoints"][:1]
    eps["endpoints"][0]["conditions"] = {"serving": False, "ready": False}
    tracker.apply(state, eps)
    assert cleanup_required(take())  # the last serving endpoint stopped serving
