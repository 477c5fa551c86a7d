"""Upstream's TestOverallNFTablesRules as an oracle, where our structure is upstream's.

Same inputs as upstream (they are those of the iptables overall test); compared: every base
line (tables, sets, maps, base chains and their jumps), the elements of cluster-ips,
nodeport-ips and the no-endpoint maps (verbatim), the keys of service-ips, service-nodeports and
firewall-ips (their values point at our shared selectors instead of per-service chains), the
hashed chain names, and the per-service chains we keep (ClientIP affinity, svc5).
"""

from __future__ import annotations

import re
from pathlib import Path

from kubeproxy.backends.nftables import naming
from kubeproxy.backends.nftables.render import render
from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import build_state
from kubeproxy.model.node_model import ServicePortName, build_view
from kubeproxy.model.options import Family
from tests.backends.nftables.helpers import NODE, options
from tests.paths import TESTS

HERE = Path(__file__).parent / "fixtures" / "overall"
OBJECTS = TESTS / "fixtures" / "upstream" / "test_overall_iptables_rules" / "objects.yaml"
_ELEMENT = re.compile(r'^add element ip kube-proxy (\S+) \{ (.*?)(?: comment "([^"]*)")?(?: : (.*))? \}$')


def _upstream() -> tuple[list[str], list[str]]:
    """(base lines, per-service lines) of upstream's expected dump."""
    lines = [line for line in (HERE / "upstream_expected.nft").read_text().splitlines() if line.strip()]
    cut = lines.index("# svc1")
    return lines[:cut], [line for line in lines[cut:] if not line.startswith("#")]


def _ours() -> list[str]:
    state, warnings = build_state(r.obj for r in load_manifests([OBJECTS]))
    assert not warnings
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, NODE)
    # upstream's fake proxier: --nodeport-addresses 192.168.0.2/32, service CIDR 172.30.0.0/16
    opts = options(nodeport_match_all=False, nodeport_ips=("192.168.0.2",))
    text = render(view, opts, service_cidrs=["172.30.0.0/16"]).text()
    out = []
    for line in text.splitlines():
        m = re.match(r"^add element ip kube-proxy (\S+) \{ (.*) \}$", line)
        if m:  # one element per line, as upstream prints them
            out += [f"add element ip kube-proxy {m.group(1)} {{ {e} }}" for e in _split(m.group(2))]
        else:
            out.append(line)
    return out


def _split(body: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == '"':
            depth ^= 1
        if ch == "," and not depth:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*parts, cur.strip()]


def _elements(lines: list[str]) -> dict[str, dict[str, tuple[str | None, str | None]]]:
    out: dict[str, dict[str, tuple[str | None, str | None]]] = {}
    for line in lines:
        m = _ELEMENT.match(line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2)] = (m.group(4), m.group(3))
    return out


def test_every_upstream_base_line_is_ours_and_our_additions_are_known() -> None:
    base, _ = _upstream()
    ours = set(_ours())
    assert [line for line in base if line not in ours] == []
    per_service = re.compile(r"/|^(nodeport-)?((cluster|local)-endpoints|external)-|^affinity$")
    ours_base = {
        line for line in ours
        if not per_service.search(line.split()[4]) and (not line.startswith("add element") or "nodeport-ips" in line)
    }  # fmt: skip
    assert sorted(ours_base - set(base)) == sorted(
        [
            'add set ip kube-proxy hairpin { type ipv4_addr . ipv4_addr ; comment "endpoint . endpoint: a pod that reached'
            ' itself through a service" ; }',
            "add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade"
            ' comment "hairpin"',
            "add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
            ' comment "masquerade off-cluster traffic to cluster IPs"',
        ]
    )


def test_elements_match_upstream() -> None:
    _, per_service = _upstream()
    base, _ = _upstream()
    theirs = _elements(base + per_service)
    ours = _elements(_ours())
    for name in ("cluster-ips", "nodeport-ips", "no-endpoint-services", "no-endpoint-nodeports"):
        assert ours[name] == theirs[name], name
    for name in ("service-ips", "service-nodeports", "firewall-ips"):
        assert ours[name].keys() == theirs[name].keys(), name
    # svc5 (ClientIP affinity) keeps upstream's per-service chains: the same targets; ours name
    # the Service in a comment (upstream's name it only through the chain they go to)
    for name, key in (("service-ips", "172.30.0.45 . tcp . 80"), ("service-ips", "5.6.7.8 . tcp . 80"),
                      ("service-nodeports", "tcp . 3002")):  # fmt: skip
        assert ours[name][key] == (theirs[name][key][0], "ns5/svc5:p80")
    # the others go to shared selectors and external chains
    assert ours["service-ips"]["172.30.0.44 . tcp . 80"] == ("goto cluster-endpoints-2", "ns4/svc4:p80")
    assert ours["service-ips"]["192.168.99.22 . tcp . 80"] == ("goto external-local-1-0", "ns2/svc2:p80")
    # loadBalancerSourceRanges: upstream's per-service firewall chain, by the same name
    assert ours["firewall-ips"]["5.6.7.8 . tcp . 80"] == (theirs["firewall-ips"]["5.6.7.8 . tcp . 80"][0], "ns5/svc5:p80")


def test_chain_names_are_upstreams() -> None:
    _, per_service = _upstream()
    names = {line.split()[4] for line in per_service if line.startswith("add chain")}
    for ns, svc in (("ns1", "svc1"), ("ns2", "svc2"), ("ns3", "svc3"), ("ns4", "svc4"), ("ns5", "svc5")):
        spn = ServicePortName(ns, svc, "p80", "TCP")
        assert naming.cluster_chain(spn) in names
    assert naming.endpoint_chain(ServicePortName("ns4", "svc4", "p80", "TCP"), AddressText("10.180.0.5"), 80) in names
    assert naming.external_chain(ServicePortName("ns2", "svc2", "p80", "TCP")) in names


def test_affinity_service_chains_are_upstreams_but_the_affinity_set_is_shared() -> None:
    _, per_service = _upstream()
    ours = set(_ours())
    ep = "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
    same = [
        f"add chain ip kube-proxy {ep}",
        f"add rule ip kube-proxy {ep} ip saddr 10.180.0.3 jump mark-for-masquerade",
        f"add rule ip kube-proxy {ep} meta l4proto tcp dnat to 10.180.0.3:80",
        "add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80",
        "add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80",
        "add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade",
        "add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80",
    ]
    assert all(line in per_service for line in same)
    assert [line for line in same if line not in ours] == []
    assert not [line for line in ours if "@affinity-" in line]  # no per-endpoint sets
