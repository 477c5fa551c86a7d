"""Shared builders for doctor tests: the BIND report's world, and small clusters rendered by our own renderer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.cluster.manifest_load import load
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Finding, Report
from kubeproxy.lab import builders as O
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node
from kubeproxy.proxy.config import validate

SEED = Path(__file__).parents[1] / "fixtures" / "seed000"
SEED_IFACES = ["eth3=10.5.6.29/24", "docker0=10.100.13.1/24"]
SEED_CFG = ProxyConfig(cluster_cidr=("10.24.0.0/16",))
# A small node for rendered worlds: uplink eth0, pods behind cni0.
NODE_IFACES = ["eth0=192.168.0.2/24", "cni0=10.244.1.1/24"]
NODE_ROUTES = ["10.244.0.0/16=cni0", "default=eth0@192.168.0.1"]
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",), hostname_override="node-1")


def seed_state() -> ClusterState:
    loaded = load([SEED / "objects.yaml"])
    assert not loaded.warnings
    return loaded.state


def seed_report(dump: str, facts: NodeFacts | None = None) -> Report:
    rs = detect.parse((SEED / dump).read_text())
    node = Node.from_flags(ifaces=SEED_IFACES)
    return diagnose(DoctorInput(rs, seed_state(), validate(SEED_CFG), node, facts or NodeFacts(), "eth3"))


def state_of(objs: list[dict[str, Any]]) -> ClusterState:
    state, warnings = build_state(objs)
    assert not warnings, warnings
    return state


def rendered_report(objs: list[dict[str, Any]], facts: NodeFacts | None = None, *, cfg: ProxyConfig = CFG,
                    rules: str | None = None, snat_other_flows: float = 0.0) -> Report:
    """Doctor on the rules our iptables renderer makes for `objs` (with upstream's jumps)."""
    state = state_of(objs)
    cfg = validate(cfg)
    if rules is None:
        rules = with_jumps(render_iptables(state, cfg).rendered.text)
    node = Node.from_flags(ifaces=NODE_IFACES, routes=NODE_ROUTES)
    return diagnose(DoctorInput(detect.parse(rules), state, cfg, node, facts or NodeFacts(), "eth0",
                                snat_other_flows=snat_other_flows))


def dns_world(*, etp: str = "", pods: int = 1, annotations: dict[str, str] | None = None,
              local_pods: int | None = None) -> list[dict[str, Any]]:
    """The lab's snat world: a DNS Service with an external IP and a NodePort, `pods` BIND pods."""
    ports = [O.Port("dns", 53, 53, "UDP", node_port=30053), O.Port("dns-tcp", 53, 53, "TCP", node_port=30054)]
    svc = O.service("dns", "10.96.0.53", ports, type="NodePort", external_ips=["203.0.113.53"],
                    external_traffic_policy=etp)
    if annotations:
        svc["metadata"]["annotations"] = annotations
    local = pods if local_pods is None else local_pods
    backends = [O.Backend(f"10.244.{1 if i < local else 2}.{10 + i}", "node-1" if i < local else "node-2")
                for i in range(pods)]
    return [O.node("node-1", "192.168.0.2", "10.244.1.0/24"), svc, O.endpoint_slice("dns", backends, ports)]


def v6_world(etp: str = "", dual: bool = False) -> list[dict[str, Any]]:
    """The snat world in IPv6 (or dual-stack): an external IP and a NodePort, one BIND pod on this node."""
    ports = [O.Port("dns", 53, 53, "UDP", node_port=30053)]
    svc = O.service("dns", "fd00:96::53", ports, type="NodePort", external_ips=["2001:db8:113::53"],
                    external_traffic_policy=etp)
    svc["spec"]["ipFamilies"] = ["IPv6"]
    v6 = O.endpoint_slice("dns", [O.Backend("fd00:244:1::10", "node-1")], ports, address_type="IPv6")
    node = O.node("node-1", "fd00:168::2", "fd00:244:1::/64")
    if not dual:
        return [node, svc, v6]
    node["status"]["addresses"].insert(0, {"type": "InternalIP", "address": "192.168.0.2"})
    node["spec"]["podCIDRs"] = ["10.244.1.0/24", "fd00:244:1::/64"]
    svc["spec"].update(clusterIPs=["10.96.0.53", "fd00:96::53"], ipFamilies=["IPv4", "IPv6"],
                       ipFamilyPolicy="RequireDualStack", clusterIP="10.96.0.53",
                       externalIPs=["203.0.113.53", "2001:db8:113::53"])
    v4 = O.endpoint_slice("dns", [O.Backend("10.244.1.10", "node-1")], ports)
    v4["metadata"]["name"] = "dns-v4"
    return [node, svc, v4, v6]


V6_IFACES = ["eth0=fd00:168::2/64", "cni0=fd00:244:1::1/64"]
V6_ROUTES = ["fd00:244::/48=cni0", "default=eth0@fd00:168::1"]
V6_CFG = ProxyConfig(cluster_cidr=("fd00:244::/48",), hostname_override="node-1")


def by_kind(report: Report, kind: str) -> list[Finding]:
    return [f for f in report.findings if f.kind == kind]
