"""Upstream's nftables packet-flow tests: our nftables table must send each packet where theirs does.

tests/fixtures/upstream_nftables/ holds the scenarios of upstream's nftables mode
(`runPacketFlowTests` in pkg/proxy/nftables/proxier_test.go: objects, the fake proxier's options and
the expected outcome of each flow; see the README there). Each scenario is rendered by our
renderer, loaded by nft into a throwaway namespace (nft_json.parse_text: the kernel's own reading
of our text) and every flow is traced through it by kubeproxy.netfilter, the same tracer the
iptables flows go through (tests/backends/iptables/test_upstream_flows.py).

Upstream's tracer always walks the prerouting path, even for a packet whose source is a node
address; ours walks the path the kernel takes: a packet from a node address leaves the node
through the output hooks (like the iptables flows test). Both must give upstream's answer.

The last tests pin what iptables mode and nftables mode do differently, on purpose (docs/modes/nftables.md,
"nftables mode and iptables mode"), and prove a few of these flows with real packets.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.render import render as render_iptables
from kubeproxy.backends.nftables.render import render
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import build_state
from kubeproxy.cluster.validation import ParseOptions
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.proxy_config import LocalDetector
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter import iptables_save, nft_json
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.ruleset import Ruleset
from kubeproxy.netfilter.simulate import Outcome, trace
from tests.netfilter.kernel_bed import BedSpec, assert_kernel_agrees, bed, observed_key
from tests.paths import TESTS

pytestmark = pytest.mark.root

FIXTURES = TESTS / "fixtures" / "upstream_nftables"
# The fake proxier's network interfaces: lo, and eth0 with these addresses.
NODE_IPS = ("192.168.0.2", "192.168.1.2", "192.168.99.11", "2001:db8::1", "2001:db8:1::2")

FLOWS = [
    pytest.param(case.name, i, flow, id=f"{case.name}-{i}-{flow['name']}")
    for case in sorted(FIXTURES.iterdir())
    if (case / "flows.yaml").exists()
    for i, flow in enumerate(yaml.safe_load((case / "flows.yaml").read_text()))
]


def fixture_options(raw: dict[str, Any]) -> NodeOptions:
    """Upstream's fake nftables proxier: mark 0x4000, --nodeport-addresses resolved to `nodeport_ips`."""
    family = raw["ip_family"]
    detector = LocalDetector("ClusterCIDR", (raw["local_detector"],)) if raw["local_detector"] else LocalDetector()
    return NodeOptions(
        node_name=raw["node_name"],
        node_ip=raw["node_ip"],
        family=family,
        masquerade_all=raw["masquerade_all"],
        masquerade_mark="0x4000",
        local_detector=detector,
        localhost_nodeports=False,
        nodeport_ips=tuple(raw["nodeport_ips"]),
        nodeport_match_all=not raw["nodeport_ips"],
        nfacct_counters=(),
    )


def fixture_view(objects: list[dict[str, Any]] | Path, family: Family, node: str) -> NodeView:
    raw = (r.obj for r in load_manifests([objects])) if isinstance(objects, Path) else iter(objects)
    # Upstream's fake API objects use NodePorts such as 3001, outside the default range.
    state, warnings = build_state(raw, ParseOptions(node_port_range=None))
    assert not warnings, warnings
    return build_view(state.services.values(), state.slices.values(), family, node)


def tracer_node(v6: bool) -> Node:
    """The fake proxier's node: every NODE_IPS address is local; the default route is eth0."""
    ifaces = ["eth0=2001:db8::1/64", "eth0=2001:db8:1::2/64"] if v6 else ["eth0=192.168.0.2/24"]
    routes = ["::/0=eth0"] if v6 else ["default=eth0"]
    return Node.from_flags(list(NODE_IPS), ifaces, routes)


def trace_flow(ruleset: Ruleset, flow: dict[str, Any]) -> list[Outcome]:
    v6 = ":" in flow["dest_ip"]
    src, dst = flow["source_ip"], flow["dest_ip"]
    # Upstream's tracer counts the node's addresses as "fib saddr type local"; here such a packet
    # is sent by the node itself, as in the kernel.
    from_node = src in NODE_IPS
    fmt = "[{}]:{}" if v6 else "{}:{}"
    packet = make_packet(
        flow["protocol"], fmt.format(src, 40000), fmt.format(dst, flow["dest_port"]), in_iface=None if from_node else "eth0"
    )
    return trace(ruleset, tracer_node(v6), packet).outcomes


def endpoint(o: Outcome) -> str | None:
    if o.dnat is None:
        return None
    ip = A.fmt_ip(o.dnat[0], o.v6)
    return f"[{ip}]:{o.dnat[1]}" if o.v6 else f"{ip}:{o.dnat[1]}"


def assert_upstream_outcome(outcomes: list[Outcome], flow: dict[str, Any]) -> None:
    expected = flow["output"]
    if expected in ("REJECT", "DROP"):
        assert {o.verdict for o in outcomes} == {expected}, outcomes
        return
    if expected == "":
        # No service rule touched the packet.
        assert all(o.dnat is None and o.verdict == "ACCEPT" and not o.masquerade for o in outcomes), outcomes
        return
    assert {o.verdict for o in outcomes} == {"ACCEPT"}, outcomes
    assert {endpoint(o) for o in outcomes} == {e.strip() for e in expected.split(",")}, outcomes
    assert {o.masquerade for o in outcomes} == {flow["masq"]}, outcomes


@pytest.fixture(scope="module")
def loaded() -> Iterator[Callable[[str], Ruleset]]:
    """Each scenario rendered and read back through nft once, for all of its flows."""
    cache: dict[str, Ruleset] = {}

    def get(case: str) -> Ruleset:
        if case not in cache:
            raw = yaml.safe_load((FIXTURES / case / "options.yaml").read_text())
            opts = fixture_options(raw)
            view = fixture_view(FIXTURES / case / "objects.yaml", opts.family, opts.node_name)
            cache[case] = nft_json.parse_text(render(view, opts, service_cidrs=raw["service_cidrs"]).text())
        return cache[case]

    yield get


@pytest.mark.parametrize(("case", "index", "flow"), FLOWS)
def test_upstream_nftables_flow(loaded: Callable[[str], Ruleset], case: str, index: int, flow: dict[str, Any]) -> None:
    assert_upstream_outcome(trace_flow(loaded(case), flow), flow)


def test_every_upstream_flow_test_is_here() -> None:
    # runPacketFlowTests callers in that proxier_test.go, with their subtests and steps.
    cases = {p.name for p in FIXTURES.iterdir() if (p / "flows.yaml").exists()}
    assert len(cases) == 37
    assert sum(len(yaml.safe_load((FIXTURES / c / "flows.yaml").read_text())) for c in cases) == 207


# ------------------------------------------------------------------------------------------
# Where iptables mode and nftables mode differ, and where they must not.
#
# Rows of the table in docs/modes/nftables.md: (name, objects, flow, iptables mode's outcome, nftables mode's outcome).
# Outcomes are upstream's words: endpoints ("masq" if masqueraded), "REJECT", "DROP", or ""
# (no rule touched the packet: it leaves the node for the address as it is).

OPTIONS: dict[str, Any] = {  # as an options.yaml of upstream's fixtures reads
    "node_name": "test-node",
    "node_ip": "192.168.0.2",
    "ip_family": "IPv4",
    "masquerade_all": False,
    "local_detector": "10.0.0.0/8",
    "nodeport_ips": ["192.168.0.2"],
    "service_cidrs": ["172.30.0.0/16"],
}


def _service(**spec: Any) -> dict[str, Any]:
    lb = spec.pop("lb", None)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "ns1", "name": "svc1"},
        "spec": {"clusterIP": "172.30.0.41", "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}], **spec},
    }
    if lb:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in lb]}}
    return obj


def _slice(*endpoints: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": "ns1", "name": "svc1-1", "labels": {"kubernetes.io/service-name": "svc1"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "nodeName": node} for ip, node in endpoints],
        "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}],
    }


def _flow(src: str, dst: str, port: int = 80) -> dict[str, Any]:
    return {"protocol": "tcp", "source_ip": src, "dest_ip": dst, "dest_port": port}


LOCAL_LB_REMOTE_ONLY = [
    _service(type="LoadBalancer", externalTrafficPolicy="Local", externalIPs=["192.168.99.22"], lb=["1.2.3.4"]),
    _slice(("10.180.0.1", "node2"), ("10.180.2.1", "node3")),
]
LB_NO_ENDPOINTS = [_service(type="LoadBalancer", externalIPs=["192.168.99.22"], lb=["1.2.3.4"])]
LB_RANGES_NO_ENDPOINTS = [_service(type="LoadBalancer", loadBalancerSourceRanges=["203.0.113.0/25"], lb=["1.2.3.4"])]
CLUSTER_IP_EXTERNAL_LOCAL = [
    _service(type="ClusterIP", externalTrafficPolicy="Local", externalIPs=["192.168.99.22"]),
    _slice(("10.180.0.1", "node2"), ("10.180.2.1", "test-node")),
]
BOTH = "10.180.0.1:80, 10.180.2.1:80"
DIFFERENCES = [
    # (a) upstream PR #132456 (issue #131765) moved the no-endpoint checks after DNAT: the node's
    # own traffic to an external address is short-circuited to every endpoint, in both modes.
    (
        "node to LB IP, eTP Local, endpoints only elsewhere",
        LOCAL_LB_REMOTE_ONLY,
        _flow("192.168.0.2", "1.2.3.4"),
        BOTH + " masq",
        BOTH + " masq",
    ),
    (
        "node to external IP, eTP Local, endpoints only elsewhere",
        LOCAL_LB_REMOTE_ONLY,
        _flow("192.168.0.2", "192.168.99.22"),
        BOTH + " masq",
        BOTH + " masq",
    ),
    (
        "external client to LB IP, eTP Local, endpoints only elsewhere",
        LOCAL_LB_REMOTE_ONLY,
        _flow("203.0.113.2", "1.2.3.4"),
        "DROP",
        "DROP",
    ),
    # (b) iptables mode rejects in filter INPUT/FORWARD only (KUBE-EXTERNAL-SERVICES); nftables
    # mode checks @no-endpoint-services in filter-output too.
    ("node to LB IP, no endpoints", LB_NO_ENDPOINTS, _flow("192.168.0.2", "1.2.3.4"), "", "REJECT"),
    ("node to external IP, no endpoints", LB_NO_ENDPOINTS, _flow("192.168.0.2", "192.168.99.22"), "", "REJECT"),
    ("external client to LB IP, no endpoints", LB_NO_ENDPOINTS, _flow("203.0.113.2", "1.2.3.4"), "REJECT", "REJECT"),
    # (c) iptables mode writes the source-range DROP only when there are endpoints; nftables mode's
    # firewall-check (before DNAT) applies whether or not there are.
    (
        "client outside loadBalancerSourceRanges, no endpoints",
        LB_RANGES_NO_ENDPOINTS,
        _flow("203.0.113.130", "1.2.3.4"),
        "REJECT",
        "DROP",
    ),
    (
        "client inside loadBalancerSourceRanges, no endpoints",
        LB_RANGES_NO_ENDPOINTS,
        _flow("203.0.113.2", "1.2.3.4"),
        "REJECT",
        "REJECT",
    ),
    # Upstream's ExternalPolicyLocal: a ClusterIP Service with externalIPs is externally
    # accessible, so externalTrafficPolicy Local applies to its external IPs.
    (
        "external client to external IP of a ClusterIP Service, eTP Local",
        CLUSTER_IP_EXTERNAL_LOCAL,
        _flow("203.0.113.2", "192.168.99.22"),
        "10.180.2.1:80",
        "10.180.2.1:80",
    ),
    (
        "pod to external IP of a ClusterIP Service, eTP Local",
        CLUSTER_IP_EXTERNAL_LOCAL,
        _flow("10.0.0.2", "192.168.99.22"),
        BOTH,
        BOTH,
    ),
]


def _as_upstream(expected: str, flow: dict[str, Any]) -> dict[str, Any]:
    masq = expected.endswith(" masq")
    return {**flow, "output": expected.removesuffix(" masq"), "masq": masq}


@pytest.mark.parametrize(("objects", "flow", "iptables", "nftables"), [d[1:] for d in DIFFERENCES],
                         ids=[d[0] for d in DIFFERENCES])  # fmt: skip
def test_nftables_and_iptables_mode(objects: list[dict[str, Any]], flow: dict[str, Any], iptables: str, nftables: str) -> None:
    opts = fixture_options(OPTIONS)
    view = fixture_view(objects, opts.family, opts.node_name)
    nft = nft_json.parse_text(render(view, opts, service_cidrs=OPTIONS["service_cidrs"]).text())
    assert_upstream_outcome(trace_flow(nft, flow), _as_upstream(nftables, flow))
    ipt = iptables_save.parse(with_jumps(render_iptables(view, opts).text))
    assert_upstream_outcome(trace_flow(ipt, flow), _as_upstream(iptables, flow))


# ------------------------------------------------------------------------------------------
# The same flows with real packets: client (203.0.113.2, .130) -- node -- endpoints (10.180.x).

BED: BedSpec = {
    "client_ip": "203.0.113.2/24",
    "node_front": ("eth0", "203.0.113.1/24"),
    "node_back": ("eth1", "10.180.255.254/16"),
    "backends": ["10.180.0.1/16", "10.180.2.1/16"],
}
NODE_BACK = "10.180.255.254"  # the node's address toward the endpoints: what masquerading shows
KERNEL = [
    # (id, scenario, sender, source, destination, what the endpoints see: (destination, source), or
    # "refused" / "timeout")
    (
        "a-node-to-lb",
        LOCAL_LB_REMOTE_ONLY,
        "node",
        None,
        "1.2.3.4:80",
        {("10.180.0.1:80", NODE_BACK), ("10.180.2.1:80", NODE_BACK)},
    ),
    ("a-client-to-lb", LOCAL_LB_REMOTE_ONLY, "client", None, "1.2.3.4:80", {"timeout"}),
    ("b-node-to-lb", LB_NO_ENDPOINTS, "node", None, "1.2.3.4:80", {"refused"}),
    ("c-blocked-client", LB_RANGES_NO_ENDPOINTS, "client", "203.0.113.130", "1.2.3.4:80", {"timeout"}),
    ("c-allowed-client", LB_RANGES_NO_ENDPOINTS, "client", None, "1.2.3.4:80", {"refused"}),
    (
        "local-policy-external-ip",
        CLUSTER_IP_EXTERNAL_LOCAL,
        "client",
        None,
        "192.168.99.22:80",
        {("10.180.2.1:80", "203.0.113.2")},
    ),
]


def _kernel(text: str, src: str | None, dst: str, *, from_node: bool) -> tuple[list[Outcome], list[object]]:
    """Load `text` into the bed's node, predict with the tracer, then send real connections."""
    with bed(**BED) as b:
        for ip in NODE_IPS[:3]:  # the fake proxier's IPv4 node addresses
            b.node.run(["ip", "addr", "add", f"{ip}/32", "dev", "eth0"])
            b.model.local_ips.add(A.parse_ip(ip)[0])
        b.client.run(["ip", "addr", "add", "203.0.113.130/24", "dev", "eth0"])
        b.load_nft(text)
        b.serve(b.backend, "tcp", ["10.180.0.1:80", "10.180.2.1:80"])
        rs = nft_json.parse(b.node.run(["nft", "-j", "list", "ruleset"]).stdout)
        source = src or ("203.0.113.1" if from_node else b.client_ip)
        res = trace(rs, b.model, make_packet("tcp", f"{source}:40000", dst, in_iface=None if from_node else "eth0"))
        drops = any(o.verdict == "DROP" for o in res.outcomes)
        # A dropped connection costs its whole timeout: a few are proof enough.
        observed = b.send("tcp", dst, 3 if drops else 60, src=src, timeout=0.5, from_node=from_node)
    return res.outcomes, observed


@pytest.mark.parametrize(("objects", "sender", "src", "dst", "seen"), [k[1:] for k in KERNEL], ids=[k[0] for k in KERNEL])
def test_real_packets(objects: list[dict[str, Any]], sender: str, src: str | None, dst: str, seen: set[object]) -> None:
    opts = fixture_options(OPTIONS)
    view = fixture_view(objects, opts.family, opts.node_name)
    text = render(view, opts, service_cidrs=OPTIONS["service_cidrs"]).text()
    outcomes, observed = _kernel(text, src, dst, from_node=sender == "node")
    assert {observed_key(r) for r in observed} == seen
    assert_kernel_agrees(outcomes, observed)


# Upstream flows whose addresses the bed has: external clients, the node, endpoints 10.180.x.
KERNEL_UPSTREAM = [
    ("test_load_balancer", "accepted external to LB1"),
    ("test_load_balancer", "blocked external to LB1"),
    ("test_load_balancer", "node to LB1 (allowed by LoadBalancerSourceRanges)"),
    ("test_load_balancer", "nodePort bypasses LoadBalancerSourceRanges"),
    ("test_external_traffic_policy_local", "external to LB IP hits only local endpoint, unmasqueraded"),
    ("test_external_traffic_policy_local", "external to external IP hits only local endpoint, unmasqueraded"),
    ("test_external_traffic_policy_cluster", "external to LB IP hits both endpoints, masqueraded"),
    ("test_no_endpoints_reject", "external to LoadBalancer IP with no endpoints"),
    ("test_no_endpoints_reject", "external to NodePort with no endpoints"),
    ("test_node_ports_ipv4", "node to nodePort"),
]


@pytest.mark.parametrize(("case", "name"), KERNEL_UPSTREAM, ids=[f"{c}-{n}" for c, n in KERNEL_UPSTREAM])
def test_upstream_flows_with_real_packets(case: str, name: str) -> None:
    raw = yaml.safe_load((FIXTURES / case / "options.yaml").read_text())
    opts = fixture_options(raw)
    view = fixture_view(FIXTURES / case / "objects.yaml", opts.family, opts.node_name)
    text = render(view, opts, service_cidrs=raw["service_cidrs"]).text()
    (flow,) = [f for f in yaml.safe_load((FIXTURES / case / "flows.yaml").read_text()) if f["name"] == name]
    src = flow["source_ip"]
    outcomes, observed = _kernel(text, src, f"{flow['dest_ip']}:{flow['dest_port']}", from_node=src in NODE_IPS)
    if flow["output"] in ("REJECT", "DROP"):
        seen: set[object] = {"refused" if flow["output"] == "REJECT" else "timeout"}
    else:
        # What an endpoint sees as the source: the node's own address toward it when masqueraded.
        seen = {(e.strip(), NODE_BACK if flow["masq"] else src) for e in flow["output"].split(",")}
    assert {observed_key(r) for r in observed} == seen
    assert_kernel_agrees(outcomes, observed)


# ------------------------------------------------------------------------------------------
# Random clusters: every probe goes where it goes in iptables mode, or differs as documented.


def _random_cluster(rng: random.Random) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i in range(6):
        kind = rng.choice(["ClusterIP", "NodePort", "LoadBalancer"])
        spec: dict[str, Any] = {"type": kind}
        if kind != "ClusterIP":
            spec["ports"] = [{"name": "p80", "port": 80, "protocol": "TCP", "nodePort": 30000 + i}]
        if rng.random() < 0.4:
            spec["externalIPs"] = [f"192.168.99.{20 + i}"]
        if kind != "ClusterIP" or "externalIPs" in spec:
            spec["externalTrafficPolicy"] = rng.choice(["Cluster", "Local"])
        spec["internalTrafficPolicy"] = rng.choice(["Cluster", "Local"])
        if kind == "LoadBalancer":
            spec["lb"] = [f"1.2.{i}.4"]
            if rng.random() < 0.5:
                spec["loadBalancerSourceRanges"] = rng.choice([["203.0.113.0/25"], ["203.0.113.0/25", "192.168.0.0/24"]])
        svc = _service(**spec)
        svc["metadata"]["name"] = f"svc{i}"
        svc["spec"]["clusterIP"] = f"172.30.0.{10 + i}"
        objects.append(svc)
        endpoints = []
        for j in range(rng.choice([0, 0, 1, 2, 3])):
            ready = rng.random() < 0.8
            ep: dict[str, Any] = {"addresses": [f"10.180.{i}.{j + 1}"], "nodeName": rng.choice(["test-node", "node2"])}
            ep["conditions"] = {"ready": ready, "serving": ready or rng.random() < 0.5, "terminating": not ready}
            endpoints.append(ep)
        if endpoints:
            eps = _slice()
            eps["metadata"]["name"] = f"svc{i}-1"
            eps["metadata"]["labels"]["kubernetes.io/service-name"] = f"svc{i}"
            eps["endpoints"] = endpoints
            objects.append(eps)
    return objects


Summary = frozenset[tuple[str, str | None, bool]]  # (verdict, endpoint, masqueraded) of each outcome


def _summary(outcomes: list[Outcome]) -> Summary:
    return frozenset((o.verdict, endpoint(o), o.masquerade) for o in outcomes)


def _documented(svc: dict[str, Any], has_endpoints: bool, src: str, dst_ip: str, ipt: Summary, nft: Summary) -> bool:
    spec = svc["spec"]
    external = dst_ip in spec.get("externalIPs", []) or dst_ip in [i["ip"] for i in svc.get("status", {}).get(
        "loadBalancer", {}).get("ingress", [])]  # fmt: skip
    left_alone = ipt == {("ACCEPT", None, False)}
    # (b) the node's own connection to an external address of a Service without endpoints
    if src == "192.168.0.2" and external and not has_endpoints and left_alone and nft == {("REJECT", None, False)}:
        return True
    # (c) a source outside loadBalancerSourceRanges, no endpoints: REJECT in iptables, DROP here
    lb_ips = [i["ip"] for i in svc.get("status", {}).get("loadBalancer", {}).get("ingress", [])]
    return (
        dst_ip in lb_ips
        and bool(spec.get("loadBalancerSourceRanges"))
        and not has_endpoints
        and ipt == {("REJECT", None, False)}
        and nft == {("DROP", None, False)}
    )


@pytest.mark.parametrize("seed", range(12))
def test_random_clusters_differ_only_as_documented(seed: int) -> None:
    rng = random.Random(seed)
    objects = _random_cluster(rng)
    opts = fixture_options(OPTIONS)
    view = fixture_view(objects, opts.family, opts.node_name)
    nft = nft_json.parse_text(render(view, opts, service_cidrs=OPTIONS["service_cidrs"]).text())
    ipt = iptables_save.parse(with_jumps(render_iptables(view, opts).text))
    usable = {
        (s["metadata"]["name"]): any(e["conditions"]["serving"] for e in s["endpoints"])
        for s in objects
        if s["kind"] == "EndpointSlice"
    }
    problems = []
    probes = 0
    for svc in (o for o in objects if o["kind"] == "Service"):
        spec, name = svc["spec"], svc["metadata"]["name"]
        lb_ips = [i["ip"] for i in svc.get("status", {}).get("loadBalancer", {}).get("ingress", [])]
        dsts = [(ip, 80) for ip in [spec["clusterIP"], *spec.get("externalIPs", []), *lb_ips]]
        dsts += [("192.168.0.2", p["nodePort"]) for p in spec["ports"] if p.get("nodePort")]
        for src in ("10.0.0.2", "192.168.0.2", "203.0.113.2", "203.0.113.130"):
            for dst_ip, dport in dsts:
                flow = _flow(src, dst_ip, dport)
                a, b = _summary(trace_flow(ipt, flow)), _summary(trace_flow(nft, flow))
                probes += 1
                if a != b and not _documented(svc, usable.get(f"{name}-1", False), src, dst_ip, a, b):
                    problems.append(
                        f"{name} {src} -> {dst_ip}:{dport}: iptables {sorted(a, key=str)}, nftables {sorted(b, key=str)}"
                    )
    assert probes > 0
    assert not problems, f"{len(problems)}/{probes} probes differ:\n" + "\n".join(problems)
