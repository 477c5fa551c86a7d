"""IpvsProxier against the package's fake node: diffing, graceful termination, cleanup, the
start-up error, and the live loop in ipvs mode. tests/vm runs the same backend on a real kernel."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.ipvs.apply import IpvsUnavailable
from kubeproxy.backends.ipvs.proxier import IpvsProxier
from kubeproxy.backends.ipvs.render import RealServer, VirtualServer
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.kernel.fake_tool import SlowTool
from kubeproxy.kernel.host import Intercepted
from kubeproxy.model.contract import ToolTimeout
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source, serving
from tests.live.test_live import _service
from tests.live.test_live_fake import CFG

NAME = ServicePortName("default", "web", "http", "TCP")
SVC = ServicePortInfo(NAME, valid_ip("10.96.10.10"), 80, "TCP", node_port=30080)
OPTS = NodeOptions(node_name="node", node_ip="192.168.0.2")
VS = VirtualServer("TCP", "10.96.10.10", 80)


def _view(*pods: str) -> NodeView:
    return NodeView({NAME: SVC}, {NAME: [EndpointInfo(ip_text(valid_ip(ip)), 8080) for ip in pods]})


def test_sync_programs_the_table_and_a_resync_sends_nothing() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.prepare()
    report = proxier.sync(_view("10.244.1.10"), OPTS, None)
    table = node.ipvs.table()
    assert table[VS] == (RealServer("10.244.1.10", 8080),)
    assert VirtualServer("TCP", "192.168.0.2", 30080) in table
    assert VirtualServer("TCP", "127.0.0.1", 30080) not in table  # upstream serves no NodePort on loopback
    assert node.ipvs.dummy == {"10.96.10.10"}
    assert node.ipvs.sets["KUBE-CLUSTER-IP"][1] == {"10.96.10.10,tcp:80"}
    assert node.ipvs.sysctls["net.ipv4.vs.conntrack"] == "1"
    assert report.ipvs_ops.added_services == 2
    before_ipvs, before_ipt = len(node.ipvs.calls), len(node.iptables.calls)
    again = proxier.sync(_view("10.244.1.10"), OPTS, None)
    assert again.ipvs_ops.lines == () and again.ipset_lines == 0 and not again.iptables_loaded
    writes = [c for c in node.ipvs.calls[before_ipvs:]
              if c[0] == "ipvsadm-restore" or c[:2] in (["ipvsadm", "-R"], ["ipset", "restore"])]
    assert writes == [] and not any(c[0].endswith("-restore") for c in node.iptables.calls[before_ipt:])


def test_removed_endpoint_keeps_its_connections_then_goes() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view("10.244.1.10", "10.244.2.10"), OPTS, None)
    node.ipvs.connections[("TCP", "10.96.10.10", 80, "10.244.2.10", 8080)] = (1, 0)
    proxier.sync(_view("10.244.1.10"), OPTS, None)
    assert node.ipvs.table()[VS] == (RealServer("10.244.1.10", 8080, 1), RealServer("10.244.2.10", 8080, 0))
    del node.ipvs.connections[("TCP", "10.96.10.10", 80, "10.244.2.10", 8080)]
    proxier.sync(_view("10.244.1.10"), OPTS, None)
    assert node.ipvs.table()[VS] == (RealServer("10.244.1.10", 8080, 1),)
    # The endpoint coming back while quiesced gets its weight again, as upstream re-adds it.
    node.ipvs.connections[("TCP", "10.96.10.10", 80, "10.244.1.10", 8080)] = (1, 0)
    proxier.sync(_view("10.244.2.10"), OPTS, None)
    proxier.sync(_view("10.244.1.10", "10.244.2.10"), OPTS, None)
    assert node.ipvs.table()[VS] == (RealServer("10.244.1.10", 8080, 1), RealServer("10.244.2.10", 8080, 1))


def test_deleted_service_leaves_ipvs_sets_and_kube_ipvs0() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view("10.244.1.10"), OPTS, None)
    proxier.sync(NodeView({}, {}), OPTS, None)
    assert node.ipvs.table() == {} and node.ipvs.dummy == set()
    assert node.ipvs.sets["KUBE-CLUSTER-IP"][1] == set()


def test_check_accepts_a_good_view_and_leaves_no_sets_behind() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    assert proxier.check(_view("10.244.1.10"), OPTS) is None
    assert not any(name.startswith("KUBE-CHECK") for name in node.ipvs.sets)


def test_cleanup_removes_what_ipvs_mode_installed() -> None:
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view("10.244.1.10"), OPTS, None)
    removed = proxier.cleanup()
    assert "kube-ipvs0" in removed and "ipset KUBE-CLUSTER-IP" in removed and "nat KUBE-SERVICES" in removed
    assert node.ipvs.table() == {} and node.ipvs.dummy is None and node.ipvs.sets == {}
    assert "KUBE-SERVICES" not in node.iptables.run(["iptables-save"]).stdout


def test_kernel_without_ipvs_is_a_clear_start_up_error() -> None:
    node = FakeNode()
    node.ipvs.has_ipvs = False
    with pytest.raises(IpvsUnavailable, match=r"needs IPVS in the kernel.*ip_vs, ip_vs_rr"):
        IpvsProxier(run=node).prepare()


def test_live_loop_in_ipvs_mode() -> None:
    node = FakeNode()

    async def main() -> None:
        proxy = LiveProxy(replace(CFG, mode="ipvs"), "node-1", run_cmd=node)
        async with serving(proxy, Source(proxy, _service("web", "10.96.0.10", ["10.244.1.10"]))):
            pass

    asyncio.run(main())
    assert any(vs.address == "10.96.0.10" for vs in node.ipvs.table())


def test_ipvs_section_reaches_the_backend_and_is_validated_at_start_up() -> None:
    from kubeproxy.backends import registry
    from kubeproxy.model.proxy_config import ConfigError
    from kubeproxy.proxy.config import validate

    cfg = replace(CFG, mode="ipvs", ipvs={"scheduler": "wlc", "strictARP": True, "tcpTimeout": 900})
    backend = registry.create("ipvs", run=FakeNode().run, sync_period=30.0, cfg=cfg)
    assert isinstance(backend, IpvsProxier)
    assert (backend.options.scheduler, backend.options.strict_arp, backend.options.tcp_timeout) == ("wlc", True, 900.0)
    with pytest.raises(ConfigError, match=r"ipvs.scheduler: 'fastest' is not an IPVS scheduler"):
        validate(replace(cfg, ipvs={"scheduler": "fastest"}))


def test_a_new_service_leaves_the_others_alone() -> None:
    # ipvsadm-restore flushes the table before loading: a sync through it would drop every other
    # virtual server and reset their connections (seen in the VM). Syncs go through `ipvsadm -R`.
    node = FakeNode()
    proxier = IpvsProxier(run=node)
    proxier.sync(_view("10.244.1.10"), OPTS, None)
    other = ServicePortName("default", "other", "", "TCP")
    view = NodeView({NAME: SVC, other: ServicePortInfo(other, valid_ip("10.96.30.30"), 81, "TCP")},
                    {NAME: _view("10.244.1.10").endpoints[NAME], other: [EndpointInfo(ip_text(valid_ip("10.244.3.10")), 81)]})
    report = proxier.sync(view, OPTS, None)
    assert report.ipvs_ops.lines == ("-A -t 10.96.30.30:81 -s rr", "-a -t 10.96.30.30:81 -r 10.244.3.10:81 -m -w 1")
    assert node.ipvs.table()[VS] == (RealServer("10.244.1.10", 8080),)


@pytest.mark.parametrize(
    ("release", "conn_reuse"),
    [("5.4.0-150-generic", "0"), ("4.19.0", "0"), ("5.9.0", None), ("6.1.0-28-amd64", None), ("3.10.0-1160.el7", None)],
)
def test_conn_reuse_mode_is_set_only_where_upstream_sets_it(release: str, conn_reuse: str | None) -> None:
    node = FakeNode()
    IpvsProxier(run=node, kernel_release=release).prepare()
    # 0 on 4.1-5.8 (reused connections waited 1 s with conntrack on); the kernel's own value elsewhere
    assert node.ipvs.sysctls.get("net.ipv4.vs.conn_reuse_mode") == conn_reuse
    assert node.ipvs.sysctls["net.ipv4.vs.expire_nodest_conn"] == "1"


def test_strict_arp_and_timeouts_reach_the_kernel_tools() -> None:
    from kubeproxy.backends.ipvs.render import IpvsOptions

    node = FakeNode()
    IpvsProxier(run=node).prepare()
    assert "net.ipv4.conf.all.arp_ignore" not in node.ipvs.sysctls
    assert not any(c[:2] == ["ipvsadm", "--set"] for c in node.ipvs.calls)

    node = FakeNode()
    options = IpvsOptions(strict_arp=True, tcp_timeout=900, tcpfin_timeout=0, udp_timeout=60)
    IpvsProxier(run=node, options=options).prepare()
    assert (node.ipvs.sysctls["net.ipv4.conf.all.arp_ignore"], node.ipvs.sysctls["net.ipv4.conf.all.arp_announce"]) == ("1", "2")
    # 0 keeps the kernel's value, as upstream's ConfigureTimeouts
    assert ["ipvsadm", "--set", "900", "0", "60"] in node.ipvs.calls


@pytest.mark.parametrize("tool", [["ipvsadm", "-R"], ["ipset", "restore"], ["ip", "-batch"], ["iptables-restore"]])
def test_a_tool_that_outruns_its_bound_is_a_timeout_not_a_refusal(tool: list[str]) -> None:
    """Every tool an IPVS sync feeds is bounded by its input's size, and running out of that
    bound is a ToolTimeout (no Service to blame), the tool's input never committed."""
    node = FakeNode()
    slow = SlowTool(lambda argv: list(argv[: len(tool)]) == tool)
    IpvsProxier(run=Intercepted(node, slow)).sync(_view("10.244.1.10"), OPTS, None)
    assert slow.bounds and all(bound is not None and lines for bound, lines in slow.bounds)
    slow.seconds = 10_000.0
    other = ServicePortName("default", "db", "tcp", "TCP")
    grown = NodeView({NAME: SVC, other: ServicePortInfo(other, valid_ip("10.96.10.11"), 5432, "TCP")},
                     {NAME: [EndpointInfo(ip_text(valid_ip("10.244.1.10")), 8080)],
                      other: [EndpointInfo(ip_text(valid_ip("10.244.1.11")), 5432)]})  # fmt: skip
    with pytest.raises(ToolTimeout) as caught:
        IpvsProxier(run=Intercepted(node, slow)).sync(grown, OPTS, None)  # a restarted proxy: every tool writes
    assert caught.value.tool == tool[0] and caught.value.lines == slow.bounds[-1][1]
    if tool[0] == "ipvsadm":
        assert VirtualServer("TCP", "10.96.10.11", 5432) not in node.ipvs.table()
