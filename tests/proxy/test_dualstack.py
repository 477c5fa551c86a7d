"""A dual-stack node on the package's fake node (no root): both families from one proxy.

The live loop runs one lane per family (kubeproxy/proxy/family_lanes.py, as upstream's meta-proxier):
each family's Services and EndpointSlices go to that family's tables, both in one sync, one
metric set labelled by ip_family, and a family that fails or that the kernel lacks leaves the
other working. tests/e2e/test_dualstack.py sends real packets through the same code.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.registry import offline_renderer
from kubeproxy.cluster.state import build_state
from kubeproxy.model.contract import OfflineOptions
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Body, Source, serve_with

NODE = "node-1"
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16", "fd00:10:244::/48"), min_sync_period=0.0, sync_period=30.0,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip
V4_IP, V6_IP = "10.96.0.10", "fd00:96::10"


def node(*ips: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip} for ip in ips]}}  # fmt: skip


def service(name: str, ips: list[str], *, port: int = 80, protocol: str = "TCP", **spec: Any) -> dict[str, Any]:
    families = ["IPv6" if ":" in ip else "IPv4" for ip in ips]
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": ips[0], "clusterIPs": ips, "ipFamilies": families,
                 "ipFamilyPolicy": "RequireDualStack" if len(ips) > 1 else "SingleStack",
                 "ports": [{"name": "p", "port": port, "protocol": protocol}], **spec},
    }  # fmt: skip


def endpoints(svc: str, family: str, *ips: str, protocol: str = "TCP") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{svc}-{family.lower()}", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "endpoints": [{"addresses": [ip], "nodeName": NODE, "conditions": {"ready": True}} for ip in ips],
        "ports": [{"name": "p", "port": 8080, "protocol": protocol}],
    }  # fmt: skip


DUAL = [
    node("192.168.0.2", "fd00::2"),
    service("both", [V4_IP, V6_IP]),
    endpoints("both", "IPv4", "10.244.1.5"),
    endpoints("both", "IPv6", "fd00:10:244:1::5"),
    service("v4only", ["10.96.0.20"]),
    endpoints("v4only", "IPv4", "10.244.1.6"),
    service("v6only", ["fd00:96::20"]),
    endpoints("v6only", "IPv6", "fd00:10:244:1::6"),
]


Runner = Callable[..., subprocess.CompletedProcess[str]]


def run_proxy(
    mode: str,
    run: Runner,
    initial: list[dict[str, Any]],
    body: Body,
    *,
    cfg: ProxyConfig = CFG,
    proc_ipv6: Path | None = None,
) -> LiveProxy:
    def make() -> LiveProxy:
        proxy = LiveProxy(replace(cfg, mode=mode), NODE, run_cmd=run)
        if proc_ipv6 is not None:
            proxy.proc_ipv6 = proc_ipv6
        return proxy

    return serve_with(make, initial, body)


async def nothing(proxy: LiveProxy, source: Source) -> None:
    pass


def rules(fake: FakeNode, mode: str, family: Family) -> str:
    if mode == "nftables":
        table = fake.nft.table(family.nft)
        return repr(table) if table else ""
    return fake.iptables.run(["ip6tables-save" if family.ipv6 else "iptables-save"]).stdout


@pytest.fixture(params=["iptables", "nftables"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_one_sync_programs_each_family_with_its_own_services(mode: str) -> None:
    fake = FakeNode()
    proxy = run_proxy(mode, fake, DUAL, nothing)
    v4, v6 = rules(fake, mode, Family.IPV4), rules(fake, mode, Family.IPV6)
    assert [lane.family for lane in proxy.lanes] == [Family.IPV4, Family.IPV6]
    assert proxy.syncs == 1 and proxy.failed_syncs == 0  # both families in the one sync
    # Dispatch by family: each table holds its family's ClusterIPs and endpoints only.
    for ip in (V4_IP, "10.96.0.20", "10.244.1.5", "10.244.1.6"):
        assert ip in v4 and ip not in v6
    for ip in (V6_IP, "fd00:96::20", "fd00:10:244:1::5", "fd00:10:244:1::6"):
        assert ip in v6 and ip not in v4
    families = {f for f in Family if proxy.health.status().families.get(f)}
    assert families == {Family.IPV4, Family.IPV6}


def test_an_ipv4_only_node_proxies_ipv6_too(mode: str) -> None:
    """As upstream (cmd/kube-proxy/app/server_linux.go, platformCheckSupported): both families
    whenever the kernel carries them, whatever the node's addresses and cluster CIDRs."""
    fake = FakeNode()
    cfg = replace(CFG, cluster_cidr=("10.244.0.0/16",))
    proxy = run_proxy(mode, fake, [node("192.168.0.2"), *DUAL[1:]], nothing, cfg=cfg)
    assert [lane.family for lane in proxy.lanes] == [Family.IPV4, Family.IPV6]
    v4, v6 = rules(fake, mode, Family.IPV4), rules(fake, mode, Family.IPV6)
    assert V4_IP in v4 and "fd00" not in v4
    assert V6_IP in v6 and "fd00:96::20" in v6 and V4_IP not in v6


def test_ipv6_node_with_ipv4_second(mode: str) -> None:
    """The primary family is the first node IP's: an IPv6-first node runs IPv6 in lane 0."""
    fake = FakeNode()
    proxy = run_proxy(mode, fake, [node("fd00::2", "192.168.0.2"), *DUAL[1:]], nothing)
    assert [lane.family for lane in proxy.lanes] == [Family.IPV6, Family.IPV4]
    assert V6_IP in rules(fake, mode, Family.IPV6) and V4_IP in rules(fake, mode, Family.IPV4)


def test_a_new_service_reaches_both_families_in_a_partial_sync(mode: str) -> None:
    fake = FakeNode()

    async def body(proxy: LiveProxy, source: Source) -> None:
        source.publish(service("late", ["10.96.0.30", "fd00:96::30"]), kind="ADDED")
        source.publish(endpoints("late", "IPv4", "10.244.1.7"), kind="ADDED")
        source.publish(endpoints("late", "IPv6", "fd00:10:244:1::7"), kind="ADDED")
        await proxy.wait_for_syncs(2)
        await asyncio.wait_for(_until(lambda: "fd00:10:244:1::7" in rules(fake, mode, Family.IPV6)), 5)

    proxy = run_proxy(mode, fake, DUAL, body)
    assert "10.244.1.7" in rules(fake, mode, Family.IPV4)
    for lane in proxy.lanes:
        assert lane.last_changes is not None and not lane.last_changes.full  # partial in both


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.01)


def _refusing_ipv6(fake: FakeNode, needle: str = "") -> Runner:
    """A runner whose kernel refuses every IPv6 transaction (or those naming `needle`)."""

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        text = kw.get("input") or ""
        probe = text == "add table ip6 kube-proxy\n"  # the start-up check that the kernel has IPv6
        ipv6_txn = argv[0].startswith("ip6tables-restore") or (argv[0] == "nft" and "ip6 kube-proxy" in text and not probe)
        if ipv6_txn and (not needle or needle in text):
            return subprocess.CompletedProcess(argv, 1, "", "refused (injected)")
        return fake.run(argv, **kw)

    return run


def test_a_failing_family_leaves_the_other_working(mode: str) -> None:
    fake = FakeNode()
    proxy = run_proxy(mode, _refusing_ipv6(fake), DUAL, nothing)
    assert V4_IP in rules(fake, mode, Family.IPV4)
    assert V6_IP not in rules(fake, mode, Family.IPV6)
    assert proxy.failed_syncs >= 1
    status = proxy.health.status().families
    assert status[Family.IPV4].last_updated is not None
    # The failure is counted under the family that failed, in the one metric set.
    page = proxy.metrics.exposition().decode()
    name = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total" if mode == "nftables" \
        else "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"  # fmt: skip
    assert f'{name}{{ip_family="IPv6"}}' in page
    assert f'{name}{{ip_family="IPv4"}} 1.0' not in page


def test_quarantine_is_per_family(mode: str) -> None:
    """A Service whose IPv6 rules the kernel refuses is held in the IPv6 lane only."""
    fake = FakeNode()
    proxy = run_proxy(mode, _refusing_ipv6(fake, "fd00:96::20"), DUAL, nothing)
    v4, v6 = proxy.lanes
    assert v6.quarantine.names() == ["default/v6only"]
    assert len(v4.quarantine) == 0
    assert V6_IP in rules(fake, mode, Family.IPV6)  # the rest of IPv6 is programmed
    assert proxy.health.quarantined == ("default/v6only",)
    page = proxy.metrics.exposition().decode()
    assert 'kubeproxy_sync_proxy_rules_quarantined_services{ip_family="IPv6"} 1.0' in page
    assert 'kubeproxy_sync_proxy_rules_quarantined_services{ip_family="IPv4"} 0.0' in page


def test_kernel_without_ipv6_is_logged_once(mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNode()

    async def body(proxy: LiveProxy, source: Source) -> None:
        for n in range(3):
            source.publish(service("v4only", ["10.96.0.20"], port=81 + n))
            await proxy.wait_for_syncs(2 + n)

    with caplog.at_level(logging.WARNING, logger="kubeproxy.proxy"):
        proxy = run_proxy(mode, fake, DUAL, body, proc_ipv6=tmp_path / "absent")
    lines = [r.getMessage() for r in caplog.records if "Not proxying an IP family" in r.getMessage()]
    assert len(lines) == 1 and 'ipFamily="IPv6"' in lines[0] and "no IPv6" in lines[0]
    assert [lane.family for lane in proxy.lanes] == [Family.IPV4]
    assert proxy.syncs == 4 and proxy.failed_syncs == 0
    assert V4_IP in rules(fake, mode, Family.IPV4) and V6_IP not in rules(fake, mode, Family.IPV6)


def test_missing_ipv6_tool_is_logged_once(mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """/proc says IPv6, but ip6tables has no nat table / nft refuses an ip6 table."""
    fake = FakeNode()
    (tmp_path / "ipv6").mkdir()

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[0].startswith("ip6tables") or (argv[0] == "nft" and "ip6" in (kw.get("input") or "")):
            return subprocess.CompletedProcess(argv, 3, "", "can't initialize ip6tables table `nat'")
        return fake.run(argv, **kw)

    async def body(proxy: LiveProxy, source: Source) -> None:
        source.publish(service("v4only", ["10.96.0.20"], port=90))
        await proxy.wait_for_syncs(2)

    with caplog.at_level(logging.WARNING, logger="kubeproxy.proxy"):
        proxy = run_proxy(mode, run, DUAL, body, proc_ipv6=tmp_path / "ipv6")
    lines = [r.getMessage() for r in caplog.records if "Not proxying an IP family" in r.getMessage()]
    assert len(lines) == 1 and "can't initialize" in lines[0]
    assert proxy.failed_syncs == 0 and V4_IP in rules(fake, mode, Family.IPV4)


def test_metrics_carry_both_families(mode: str) -> None:
    fake = FakeNode()
    proxy = run_proxy(mode, fake, DUAL, nothing)
    page = proxy.metrics.exposition().decode()
    for family in Family:
        assert f'kubeproxy_sync_proxy_rules_duration_seconds_count{{ip_family="{family}"}} 1.0' in page
    if mode == "iptables":
        assert 'kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="nat"}' in page


def _gauge(page: str, name: str, family: str, table: str) -> float:
    prefix = f'{name}{{ip_family="{family}",table="{table}"}} '
    return next(float(line[len(prefix):]) for line in page.splitlines() if line.startswith(prefix))


def test_iptables_last_counts_what_each_sync_wrote() -> None:
    """`..._iptables_last` is the rules a sync wrote: all of them in the first (full) sync, fewer
    than the table holds after a partial one (unchanged services' chains are not rewritten)."""
    fake = FakeNode()
    last = "kubeproxy_sync_proxy_rules_iptables_last"
    total = "kubeproxy_sync_proxy_rules_iptables_total"
    seen: dict[str, float] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        page = proxy.metrics.exposition().decode()
        seen["full"] = _gauge(page, last, "IPv4", "nat")
        seen["full_total"] = _gauge(page, total, "IPv4", "nat")
        source.publish(service("another", ["10.96.0.30"], port=91))
        await proxy.wait_for_syncs(2)

    proxy = run_proxy("iptables", fake.run, DUAL, body)
    page = proxy.metrics.exposition().decode()
    assert seen["full"] == seen["full_total"] > 0
    assert 0 < _gauge(page, last, "IPv4", "nat") < _gauge(page, total, "IPv4", "nat")
    assert _gauge(page, last, "IPv6", "filter") >= 0


def test_udp_conntrack_cleanup_runs_per_family(mode: str) -> None:
    fake = FakeNode()
    initial = [
        DUAL[0],
        service("dns", ["10.96.0.53", "fd00:96::53"], port=53, protocol="UDP"),
        endpoints("dns", "IPv4", "10.244.1.53", protocol="UDP"),
        endpoints("dns", "IPv6", "fd00:10:244:1::53", protocol="UDP"),
    ]

    async def body(proxy: LiveProxy, source: Source) -> None:
        source.publish(endpoints("dns", "IPv4", protocol="UDP"))
        source.publish(endpoints("dns", "IPv6", protocol="UDP"))
        await proxy.wait_for_syncs(2)

    run_proxy(mode, fake, initial, body)
    assert set(fake.conntrack.dumps) == {Family.IPV4, Family.IPV6}


def _free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        return int(s.getsockname()[1])


def _get(host: str, port: int, path: str = "/") -> bytes:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect((host, port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def test_health_check_node_port_answers_on_both_families(mode: str) -> None:
    """Each family's listener counts that family's local endpoints, as upstream's per-family servers."""
    fake = FakeNode()
    fake.ipvs.local_addresses.append(("lo", "::1"))  # the interfaces --nodeport-addresses selects from
    port = _free_port()
    initial = [
        DUAL[0],
        service("lb", ["10.96.0.40", "fd00:96::40"], type="LoadBalancer", externalTrafficPolicy="Local",
                healthCheckNodePort=port),
        endpoints("lb", "IPv4", "10.244.1.40"),
        endpoints("lb", "IPv6", "fd00:10:244:1::40", "fd00:10:244:1::41"),
    ]  # fmt: skip
    answers: dict[str, bytes] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        for host in ("127.0.0.1", "::1"):
            answers[host] = await asyncio.to_thread(_get, host, port)

    # Loopback only (--nodeport-addresses), so that the test opens nothing on the host's interfaces.
    run_proxy(mode, fake, initial, body, cfg=replace(CFG, nodeport_addresses=("127.0.0.0/8", "::1/128")))
    assert b'"localEndpoints": 1' in answers["127.0.0.1"]
    assert b'"localEndpoints": 2' in answers["::1"]


def test_render_prints_both_families() -> None:
    state, _ = build_state(DUAL)
    cfg = replace(CFG, hostname_override=NODE)
    ipt = offline_renderer("iptables")(state, cfg, OfflineOptions()).text
    assert "# iptables-restore (IPv4)" in ipt and "# ip6tables-restore (IPv6)" in ipt
    v4, v6 = ipt.split("# ip6tables-restore (IPv6)")
    assert V4_IP in v4 and V6_IP not in v4 and V6_IP in v6 and V4_IP not in v6
    nft = offline_renderer("nftables")(state, cfg, OfflineOptions()).text
    assert "table ip kube-proxy" in nft and "table ip6 kube-proxy" in nft
    single = offline_renderer("iptables")(state, replace(cfg, cluster_cidr=("10.244.0.0/16",)), OfflineOptions()).text
    # A node with an IPv6 address is dual-stack even without an IPv6 cluster CIDR.
    assert "# ip6tables-restore" in single
    state4, _ = build_state([node("192.168.0.2"), *DUAL[1:]])
    plain = offline_renderer("iptables")(state4, replace(cfg, cluster_cidr=("10.244.0.0/16",)), OfflineOptions()).text
    assert "ip6tables" not in plain and plain.startswith("*")


def test_healthz_on_the_ipv4_wildcard_answers_on_ipv6_too() -> None:
    """Go's listener on 0.0.0.0 takes IPv6 as well; a dual-stack node's /healthz must answer on both."""
    fake = FakeNode()
    port = _free_port()
    answers: dict[str, bytes] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        for host in ("127.0.0.1", "::1"):
            answers[host] = await asyncio.to_thread(_get, host, port, "/healthz")

    run_proxy("nftables", fake.run, DUAL, body, cfg=replace(CFG, healthz_bind_address=f"0.0.0.0:{port}"))
    for host in ("127.0.0.1", "::1"):
        assert answers[host].startswith(b"HTTP/1.1 200"), answers[host][:200]
        assert b'"IPv6"' in answers[host]


def test_node_switching_primary_family(mode: str) -> None:
    """IPv4-only first (both lanes, IPv4 primary); an IPv6 address appears; then IPv6 becomes
    primary: the lanes trade places and each family's rules stay in its own tables."""
    fake = FakeNode()
    cfg = replace(CFG, cluster_cidr=("10.244.0.0/16",))

    async def body(proxy: LiveProxy, source: Source) -> None:
        assert [lane.family for lane in proxy.lanes] == [Family.IPV4, Family.IPV6]
        source.publish(node("192.168.0.2", "fd00::2"))
        await proxy.wait_for_syncs(2)
        assert [lane.family for lane in proxy.lanes] == [Family.IPV4, Family.IPV6]
        assert V6_IP in rules(fake, mode, Family.IPV6)
        source.publish(service("v6only", ["fd00:96::21"]))
        source.publish(node("fd00::2", "192.168.0.2"))
        await proxy.wait_for_syncs(3)

    proxy = run_proxy(mode, fake, [node("192.168.0.2"), *DUAL[1:]], body, cfg=cfg)
    assert [lane.family for lane in proxy.lanes] == [Family.IPV6, Family.IPV4]
    assert proxy.failed_syncs == 0
    v4, v6 = rules(fake, mode, Family.IPV4), rules(fake, mode, Family.IPV6)
    assert "fd00:96::21" in v6 and "fd00:96::20" not in v6 and V4_IP in v4 and V6_IP not in v4


# IPVS mode: both families share the IPVS table and kube-ipvs0; each lane owns its family's
# part there, its ipsets (IPv6: KUBE-6-..., upstream's NewIPSet) and its ip(6)tables rules.


def test_ipvs_dual_stack_programs_each_family_beside_the_other() -> None:
    fake = FakeNode()

    async def body(proxy: LiveProxy, source: Source) -> None:
        # A partial sync of each family removes that family's service only.
        source.publish(service("v6only", ["fd00:96::20"]), kind="DELETED")
        source.publish(service("v4only", ["10.96.0.20"]), kind="DELETED")
        await proxy.wait_for_syncs(2)

    before: dict[str, object] = {}

    async def first(proxy: LiveProxy, source: Source) -> None:
        before["vips"] = {vs.address for vs in fake.ipvs.table()}
        before["sets"] = {name: set(entries) for name, (_, entries) in fake.ipvs.sets.items()}
        await body(proxy, source)

    proxy = run_proxy("ipvs", fake.run, DUAL, first)
    assert [lane.family for lane in proxy.lanes] == [Family.IPV4, Family.IPV6] and proxy.failed_syncs == 0
    assert {V4_IP, V6_IP, "10.96.0.20", "fd00:96::20"} <= before["vips"]  # type: ignore[operator]
    sets = before["sets"]
    assert isinstance(sets, dict)
    assert sets["KUBE-CLUSTER-IP"] == {f"{V4_IP},tcp:80", "10.96.0.20,tcp:80"}
    assert sets["KUBE-6-CLUSTER-IP"] == {f"{V6_IP},tcp:80", "fd00:96::20,tcp:80"}
    assert "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS" in sets  # cut to ipset's 31 characters, as upstream
    assert fake.ipvs.families["KUBE-6-CLUSTER-IP"] == "inet6" and fake.ipvs.families["KUBE-CLUSTER-IP"] == "inet"
    v4, v6 = rules(fake, "ipvs", Family.IPV4), rules(fake, "ipvs", Family.IPV6)
    assert "--match-set KUBE-CLUSTER-IP dst,dst" in v4 and "KUBE-6-" not in v4
    assert "--match-set KUBE-6-CLUSTER-IP dst,dst" in v6 and "--match-set KUBE-CLUSTER-IP " not in v6
    assert "-s ::1/128 -j RETURN" in v6
    table = {vs.address: [rs.address for rs in reals] for vs, reals in fake.ipvs.table().items()}
    assert table == {V4_IP: ["10.244.1.5"], V6_IP: ["fd00:10:244:1::5"]}
    assert fake.ipvs.dummy == {V4_IP, V6_IP}
    assert fake.ipvs.sets["KUBE-6-IPVS-IPS"][1] == {V6_IP} and fake.ipvs.sets["KUBE-IPVS-IPS"][1] == {V4_IP}


def test_ipvs_check_uses_per_family_scratch_sets() -> None:
    """check() loads the entries into throwaway sets: IPv6 ones must be inet6 sets of their own name."""
    from kubeproxy.backends.ipvs.proxier import IpvsProxier
    from kubeproxy.model.node_model import build_view
    from kubeproxy.model.options import NodeOptions

    fake = FakeNode()
    state, _ = build_state(DUAL)
    for family, scratch in ((Family.IPV4, "KUBE-CHECK-1"), (Family.IPV6, "KUBE-6-CHECK-1")):
        proxier = IpvsProxier(run=fake.run, family=family)
        view = build_view(state.services.values(), state.slices.values(), family, NODE)
        assert proxier.check(view, NodeOptions(node_name=NODE, family=family)) is None
        created = [c for c in fake.ipvs.calls if c[:2] == ["ipset", "destroy"]]
        assert ["ipset", "destroy", scratch] in created
    assert fake.ipvs.sets == {}  # every scratch set is gone


def test_ipvs_cleanup_removes_only_its_family_sets() -> None:
    from kubeproxy.backends.ipvs.proxier import IpvsProxier

    fake = FakeNode()
    run_proxy("ipvs", fake.run, DUAL, nothing)
    removed = IpvsProxier(run=fake.run, family=Family.IPV6).cleanup()
    assert "ipset KUBE-6-CLUSTER-IP" in removed
    assert not any(name.startswith("KUBE-6-") for name in fake.ipvs.sets)
    assert "KUBE-CLUSTER-IP" in fake.ipvs.sets


def test_ipvs_render_prints_the_ipv6_set_names() -> None:
    from kubeproxy.backends.ipvs.render import SET_BY_NAME, create_line, render, render_text, set_name
    from kubeproxy.model.node_model import build_view
    from kubeproxy.model.options import NodeOptions

    assert set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", Family.IPV6) == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    assert set_name("KUBE-CLUSTER-IP", Family.IPV4) == "KUBE-CLUSTER-IP"
    assert "family inet6" in create_line(SET_BY_NAME["KUBE-CLUSTER-IP"], Family.IPV6)
    state, _ = build_state(DUAL)
    opts = NodeOptions(node_name=NODE, family=Family.IPV6)
    view = build_view(state.services.values(), state.slices.values(), Family.IPV6, NODE)
    text = render_text(render(view, opts), opts)
    assert f"add KUBE-6-CLUSTER-IP {V6_IP},tcp:80" in text and "create KUBE-CLUSTER-IP " not in text


def test_ipvs_render_prints_both_families() -> None:
    state, _ = build_state(DUAL)
    text = offline_renderer("ipvs")(state, replace(CFG, hostname_override=NODE), OfflineOptions()).text
    v4, v6 = text.split("# ===== IPv6 =====")
    assert v4.startswith("# ===== IPv4 =====") and "KUBE-6-" not in v4 and V4_IP in v4 and V6_IP not in v4
    assert "create KUBE-6-CLUSTER-IP hash:ip,port family inet6" in v6 and f"-A -t [{V6_IP}]:80 -s rr" in v6


# --node-ip takes a dual-stack pair (as kubelet's --node-ip, upstream kube-proxy's --node-ip-override).


def test_node_ip_pair_flag_makes_both_families_and_their_node_ips() -> None:
    from kubeproxy.model.node_choice import node_families
    from kubeproxy.model.options import node_ips, node_options
    from kubeproxy.proxy.flags import FlagError, parse, resolve

    cfg = resolve(parse(["--node-ip", "fd00::2, 192.168.0.2"])).cfg
    assert cfg.node_ip == "fd00::2,192.168.0.2"
    assert node_ips(cfg, None) == ["fd00::2", "192.168.0.2"]
    assert node_families(cfg, None) == (Family.IPV6, Family.IPV4)  # the first is the primary
    assert node_options(cfg, family=Family.IPV4, hostname=NODE, node=None, nfacct_counters=()).node_ip == "192.168.0.2"
    assert node_options(cfg, family=Family.IPV6, hostname=NODE, node=None, nfacct_counters=()).node_ip == "fd00::2"
    for bad, why in (("192.168.0.2,10.0.0.1", "one IPv4 and one IPv6"), ("1.2.3.4,::1,::2", "at most two"),
                     ("nope", "not a valid IP"), ("0.0.0.0", "unspecified")):
        with pytest.raises(FlagError, match=why):
            parse(["--node-ip", bad])


def test_node_ip_pair_is_validated_in_the_configuration() -> None:
    from kubeproxy.model.proxy_config import ConfigError
    from kubeproxy.proxy.config import validate

    validate(replace(CFG, node_ip="192.168.0.2,fd00::2"))
    with pytest.raises(ConfigError, match=r"--node-ip: .*one IPv4 and one IPv6"):
        validate(replace(CFG, node_ip="fd00::2,fd00::3"))


def test_node_ip_pair_feeds_the_ipv6_lane() -> None:
    """No Node object addresses: the pair alone makes the node dual-stack, each lane with its IP."""
    fake = FakeNode()
    cfg = replace(CFG, node_ip="192.168.0.2,fd00::2", cluster_cidr=())
    proxy = run_proxy("iptables", fake.run, [node(), *DUAL[1:]], nothing, cfg=cfg)
    assert [(lane.family, lane.opts.node_ip if lane.opts else "") for lane in proxy.lanes] == [
        (Family.IPV4, "192.168.0.2"), (Family.IPV6, "fd00::2")]
    assert V6_IP in rules(fake, "iptables", Family.IPV6)


def test_userspace_render_prints_both_families() -> None:
    state, _ = build_state(DUAL)
    out = offline_renderer("userspace")(state, replace(CFG, hostname_override=NODE), OfflineOptions())
    v4, v6 = out.text.split("# ip6tables-restore (IPv6)")
    assert v4.startswith("# iptables-restore (IPv4)") and V4_IP in v4 and V6_IP not in v4
    assert f"-d {V6_IP}/128 -p tcp" in v6 and "REDIRECT --to-ports" in v6 and V4_IP not in v6
    assert len([w for w in out.warnings if w.startswith("proxy ports")]) == 1


def test_userspace_ipv6_lane_needs_ip6tables() -> None:
    from kubeproxy.proxy.family_lanes import kernel_lacks

    def no_ip6tables(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    assert "ip6tables" in (kernel_lacks(Family.IPV6, "userspace", no_ip6tables) or "")
    assert kernel_lacks(Family.IPV4, "userspace", no_ip6tables) is None


def test_an_event_applied_while_a_sync_waits_reaches_the_second_family() -> None:
    """nftables mode reads the interfaces' addresses at each sync (nodePortAddresses defaults to
    the primary address there): an event applied while the first lane waits for them must reach
    the second lane's next sync, not only the first's."""
    fake = FakeNode()
    entered, release = threading.Event(), threading.Event()
    hold = {"on": False}

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[:1] == ["ip"] and hold["on"]:
            hold["on"] = False
            entered.set()
            release.wait(10)
        return fake.run(argv, **kw)

    async def body(proxy: LiveProxy, source: Source) -> None:
        hold["on"] = True
        source.publish(endpoints("both", "IPv6", "fd00:10:244:1::30"))
        await asyncio.to_thread(entered.wait, 10)  # the sync waits for the interfaces' addresses
        source.publish(endpoints("v6only", "IPv6", "fd00:10:244:1::31"))  # a Service of the second family only
        release.set()
        await _until(lambda: "fd00:10:244:1::31" in rules(fake, "nftables", Family.IPV6))

    run_proxy("nftables", run, DUAL, body)
