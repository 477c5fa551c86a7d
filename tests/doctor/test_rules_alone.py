"""`doctor --rules` without the objects: the Services read back from the proxy's own rules
(kubeproxy/doctor/reconstruct.py) give the findings the objects would have given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.cluster.state import ClusterState
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Report
from kubeproxy.doctor.reconstruct import from_iptables, from_nftables, state_from_rules
from kubeproxy.lab import builders as O
from kubeproxy.model.options import Family
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node
from kubeproxy.proxy.config import validate
from tests.doctor.helpers import CFG, SEED, SEED_CFG, SEED_IFACES, by_kind, dns_world, state_of, v6_world


def _alone(dump: str) -> tuple[Report, list[str]]:
    rs = detect.parse((SEED / dump).read_text())
    state, notes = state_from_rules(rs, "iptables")
    node = Node.from_flags(ifaces=SEED_IFACES)
    return diagnose(DoctorInput(rs, state, validate(SEED_CFG), node, NodeFacts(), "eth3")), notes


def test_seed000_kube_proxy_dump_alone_gives_the_snat_bound() -> None:
    report, notes = _alone("kube_proxy.iptables-save")
    (udp,) = [f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP"]
    assert udp.subject == "Service default/ares-k29-bindapp:dns-udp-53 (UDP)"
    # 64,512 ports / 30 s, as with the objects (tests/doctor/test_seed000.py)
    assert udp.data["bound_per_service"] == pytest.approx(2150.4)
    assert udp.data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30, abs=0.1)
    assert {x["address"] for x in udp.data["frontends"]} == {"10.24.138.29:53", "10.5.6.29:53", "203.0.113.29:53"}
    assert [e["address"] for e in udp.data["endpoints"]] == ["10.100.13.3:53"]
    assert "read back from the proxy's own rules" in notes[0]
    assert any("KUBE-SEP-UPD7ND2TPNSDBE6L" in n and "has no DNAT rule" in n for n in notes)


def test_seed000_manual_dump_alone_names_the_dnat_that_bypasses_the_proxy() -> None:
    report, notes = _alone("manual_dnat.iptables-save")
    assert not by_kind(report, "snat-capacity")
    dnat = by_kind(report, "foreign-dnat")
    assert [(f.subject, f.data["dnat_to"]) for f in dnat] == [
        ("nat PREROUTING line 4", ["10.100.13.3:53"]), ("nat PREROUTING line 5", ["10.100.13.3:53"])]
    assert "no Service rules of the proxy" in notes[0]


def _rules(state: ClusterState, family: Family) -> str:
    return with_jumps(render_iptables(state, validate(CFG), family=family).rendered.text)


def _affinity_and_local_world() -> list[dict[str, Any]]:
    objs = dns_world(etp="Local", pods=3, local_pods=1)
    web = O.service("web", "10.96.0.80", [O.Port("http", 80, 8080)], affinity_timeout=600,
                    internal_traffic_policy="Local")
    lb = O.service("lb", "10.96.0.81", [O.Port("", 443, 8443, node_port=30443)], type="LoadBalancer",
                   load_balancer_ips=["198.51.100.7"])
    empty = O.service("empty", "10.96.0.82", [O.Port("x", 81, 81, "UDP")])
    backends = [O.Backend("10.244.1.20", "node-1"), O.Backend("10.244.2.20", "node-2")]
    return [*objs, web, lb, empty, O.endpoint_slice("web", backends, [O.Port("http", 80, 8080)]),
            O.endpoint_slice("lb", backends, [O.Port("", 443, 8443)])]


@pytest.mark.parametrize(("world", "family"), [
    (_affinity_and_local_world, Family.IPV4),
    (lambda: v6_world(etp="Local"), Family.IPV6),
    (lambda: v6_world(dual=True), Family.IPV4),
    (lambda: v6_world(dual=True), Family.IPV6),
], ids=["v4-affinity-local-lb-empty", "v6-local", "dual-v4", "dual-v6"])
def test_read_back_objects_render_the_same_rules(world: Any, family: Family) -> None:
    """The objects read back from a render make that render again: nothing the rules say is lost."""
    rules = _rules(state_of(world()), family)
    found = from_iptables(detect.parse(rules), node_name="node-1")
    assert found.services == len(state_of(world()).services)
    assert _rules(state_of(found.objects), family) == rules


WORLD_NFT = SEED.parent / "doctor" / "world_nft.json"  # `nft -j list ruleset` of our render of the world above
WORLD_NODE = Node.from_flags(ifaces=["eth0=192.168.0.2/24", "cni0=10.244.1.1/24"],
                             routes=["10.244.0.0/16=cni0", "default=eth0@192.168.0.1"])


def _findings(report: Report) -> list[tuple[str, str, str]]:
    return sorted((f.severity, f.kind, f.subject) for f in report.findings)


def test_nftables_dump_alone_gives_the_findings_the_objects_give() -> None:
    rs = detect.parse(WORLD_NFT.read_text())
    cfg = validate(CFG)
    with_objects = diagnose(DoctorInput(rs, state_of(_affinity_and_local_world()), cfg, WORLD_NODE, NodeFacts(), "eth0"))
    state, notes = state_from_rules(rs, "nftables", "node-1", WORLD_NODE, "eth0")
    alone = diagnose(DoctorInput(rs, state, cfg, WORLD_NODE, NodeFacts(), "eth0"))
    assert _findings(alone) == _findings(with_objects)
    # NodePorts are probed on the addresses of the table's nodeport-ips set only (the primary
    # address here, nftables mode's default): the pod bridge's address is no false alarm
    assert not [f for f in alone.findings if f.kind == "not-translated"]
    assert len(state.services) == 4 and "read back from the proxy's own rules" in notes[0]
    assert any(f.kind == "snat-capacity" and f.subject == "Service default/dns:dns (UDP)" for f in alone.findings)


def test_upstreams_nftables_layout_is_read_by_its_chain_names() -> None:
    rs = detect.parse((Path(__file__).parents[1] / "netfilter" / "fixtures" / "kube_proxy_nft.json").read_text())
    node = Node.from_flags(ifaces=["eth0=192.168.1.1/24", "eth1=10.180.0.254/16"], routes=["default=eth0@192.168.1.254"])
    found = from_nftables(rs, node, "eth0")
    (svc,) = [o for o in found.objects if o["kind"] == "Service"]
    assert (svc["metadata"]["name"], svc["spec"]["clusterIP"], svc["spec"]["ports"]) == (
        "svc1", "10.96.0.10", [{"protocol": "UDP", "port": 53, "name": "p53"}])
    (eps,) = [o for o in found.objects if o["kind"] == "EndpointSlice"]
    assert [e["addresses"] for e in eps["endpoints"]] == [["10.180.0.1"], ["10.180.0.2"]]
