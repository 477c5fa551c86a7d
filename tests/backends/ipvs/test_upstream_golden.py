"""Upstream's IPVS proxier tests (pkg/proxy/ipvs/proxier_test.go) as golden fixtures for our render.

Each tests/backends/ipvs/fixtures/<case>/ holds the scenario's Services and EndpointSlices (objects.yaml)
and, in case.yaml, the fake proxier's settings and what upstream asserts about the result: the
whole IPVS table (in `ipvsadm-save -n` form) where upstream compares it whole, otherwise the
number of virtual servers and the real servers of some; the entries of some ipsets; the
(target, match-set) sequence of some chains, read across nat then filter like upstream's
getRules. Only what upstream asserts is checked; `note` in a case says where an input differs.

Upstream's fake netlink knows only the node IPs it is given (no loopback), so NodePorts listen on
exactly those; `interfaces` plus CIDRs in `nodeport_addresses` select among interface addresses.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.backends.ipvs.render import FILTER_CHAINS, NAT_CHAINS, IpvsOptions, IpvsRendered, ipvsadm_save_text, render
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import build_state
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family, NodeOptions

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "case.yaml").exists())


def render_case(case: Path) -> tuple[dict[str, Any], IpvsRendered, NodeOptions]:
    """The case's spec, our rendering of its objects, and the node options it was rendered with."""
    spec = yaml.safe_load((case / "case.yaml").read_text())
    o = spec["options"]
    family = Family(o["ip_family"])
    objects = load_manifests([case / "objects.yaml"]) if (case / "objects.yaml").read_text().strip() else []
    state, problems = build_state(r.obj for r in objects)
    # Inputs the API server would refuse are refused here too; a case says how many it expects.
    assert len(problems) == spec.get("load_problems", 0), problems
    view = build_view(state.services.values(), state.slices.values(), family, o["node_name"])

    def of_family(ips: list[str]) -> tuple[str, ...]:
        return tuple(ip for ip in ips if Family.of(ipaddress.ip_address(ip)) == family)

    node_ips = of_family(o["node_ips"])
    cidrs = [ipaddress.ip_network(c) for c in o["nodeport_addresses"]]
    cidrs = [c for c in cidrs if Family.of(c) == family]
    match_all = not cidrs or any(c.prefixlen == 0 for c in cidrs)
    addresses = of_family(o.get("interfaces", [])) or node_ips
    selected = tuple(ip for ip in addresses if any(ipaddress.ip_address(ip) in c for c in cidrs))
    opts = NodeOptions(node_name=o["node_name"], node_ip=node_ips[0] if node_ips else "", family=family,
                       nodeport_ips=() if match_all else selected, nodeport_match_all=match_all,
                       random_fully=o["random_fully"])
    return spec, render(view, opts, IpvsOptions(node_addresses=addresses if match_all else selected)), opts


def _chain_rules(iptables: str) -> dict[str, list[str]]:
    """chain -> ["TARGET SET-or--"], nat rules then filter rules, as upstream's getRules reads them."""
    out: dict[str, list[str]] = {}
    for line in iptables.splitlines():
        words = line.split()
        if not words or words[0] != "-A":
            continue
        target = words[words.index("-j") + 1]
        match_set = words[words.index("--match-set") + 1] if "--match-set" in words else "-"
        out.setdefault(words[1], []).append(f"{target} {match_set}")
    return out


def _vs_key(text: str) -> tuple[str, str, int]:
    proto, hostport = text.split()
    host, _, port = hostport.rpartition(":")
    return proto, host.strip("[]"), int(port)


@pytest.mark.parametrize("name", CASES)
def test_ipvs_render_matches_upstream(name: str) -> None:
    spec, r, _ = render_case(FIXTURES / name)
    expect = spec["expect"]
    checked = 0
    if "ipvs" in expect:
        assert ipvsadm_save_text(r.services) == expect["ipvs"]
        checked += 1
    if "vs_count" in expect:
        assert len(r.services) == expect["vs_count"], sorted(vs.key for vs in r.services)
        checked += 1
    by_key = {vs.key: reals for vs, reals in r.services.items()}
    for key in expect.get("vs_present", []):
        assert _vs_key(key) in by_key, key
        checked += 1
    for key, reals in expect.get("virtual_servers", {}).items():
        got = [f"[{rs.address}]:{rs.port}" if ":" in rs.address else f"{rs.address}:{rs.port}" for rs in by_key[_vs_key(key)]]
        assert got == reals, key
        assert all(rs.weight == 1 for rs in by_key[_vs_key(key)])
        checked += 1
    for set_name, entries in expect.get("ipsets", {}).items():
        assert sorted(r.sets[set_name]) == sorted(entries), set_name
        checked += 1
    rules = _chain_rules(r.iptables)
    for chain, want in expect.get("chains", {}).items():
        assert rules.get(chain, []) == want, chain
        checked += 1
    if "bind_addresses" in expect:
        assert sorted(r.bind_addresses) == sorted(expect["bind_addresses"])
        checked += 1
    if "loop_back_count" in expect:
        assert len(r.sets["KUBE-LOOP-BACK"]) == expect["loop_back_count"]
        checked += 1
    if "persistent_all" in expect:
        assert r.services and all(vs.persistent == expect["persistent_all"] for vs in r.services)
        checked += 1
    if "masquerade_random_fully" in expect:
        masq = [ln for ln in r.iptables.splitlines() if ln.startswith("-A KUBE-POSTROUTING") and "-j MASQUERADE" in ln]
        assert len(masq) == 1 and masq[0].endswith("--random-fully") == expect["masquerade_random_fully"]
        checked += 1
    if "first_services_rule" in expect:
        first = next(ln for ln in r.iptables.splitlines() if ln.startswith("-A KUBE-SERVICES "))
        assert first == "-A KUBE-SERVICES " + expect["first_services_rule"]
        checked += 1
    if "chain_declarations" in expect:
        decl = expect["chain_declarations"]
        assert (list(NAT_CHAINS), list(FILTER_CHAINS)) == (decl["nat"], decl["filter"])
        tables = r.iptables.split("*filter")
        assert [ln[1:].split()[0] for ln in tables[0].splitlines() if ln.startswith(":")] == decl["nat"]
        assert [ln[1:].split()[0] for ln in tables[1].splitlines() if ln.startswith(":")] == decl["filter"]
        checked += 1
    for key, attr in (("no_local_endpoints_internal", "no_local_endpoints_internal"),
                      ("no_local_endpoints_external", "no_local_endpoints_external")):
        if key in expect:
            assert getattr(r, attr) == expect[key], key
            checked += 1
    known = {"ipvs", "vs_count", "bind_addresses", "vs_present", "virtual_servers", "ipsets", "chains", "loop_back_count",
             "persistent_all",
             "masquerade_random_fully", "first_services_rule", "chain_declarations", "no_local_endpoints_internal",
             "no_local_endpoints_external"}
    assert set(expect) <= known, f"{name}: unknown expectations {set(expect) - known}"
    assert checked, f"{name}: case.yaml asserts nothing"


def test_every_fixture_names_its_upstream_test() -> None:
    assert len(CASES) >= 45
    for name in CASES:
        spec = yaml.safe_load((FIXTURES / name / "case.yaml").read_text())
        assert spec["upstream"].startswith("Test") and "proxier_test.go" in spec["source"]


# Upstream tests of the sync step (not of the render): the same facts against diff_ipvs.

def test_clean_legacy_service_keeps_excluded_cidrs() -> None:
    """TestCleanLegacyService: of six UDP services, the two still wanted stay, those inside
    --ipvs-exclude-cidrs (3.3.3.0/24, 4.4.4.0/24) are someone else's, the other two go."""
    from kubeproxy.backends.ipvs.apply import diff_ipvs
    from kubeproxy.backends.ipvs.render import RealServer, VirtualServer

    have: dict[VirtualServer, list[RealServer]] = {VirtualServer("UDP", f"{i}.{i}.{i}.{i}", 52 + i): [] for i in range(1, 7)}
    want = {vs: () for vs in have if vs.address in ("1.1.1.1", "2.2.2.2")}
    ops = diff_ipvs(want, have, {}, exclude_cidrs=("3.3.3.0/24", "4.4.4.0/24"))
    assert ops.lines == ("-D -u 5.5.5.5:57", "-D -u 6.6.6.6:58")


def test_clean_legacy_real_servers_exclude_cidrs() -> None:
    """TestCleanLegacyRealServersExcludeCIDRs: an excluded virtual server keeps its real servers."""
    from kubeproxy.backends.ipvs.apply import diff_ipvs
    from kubeproxy.backends.ipvs.render import RealServer, VirtualServer

    vs = VirtualServer("UDP", "4.4.4.4", 56)
    ops = diff_ipvs({}, {vs: [RealServer("10.10.10.10", 56), RealServer("11.11.11.11", 56)]}, {},
                    exclude_cidrs=("4.4.4.4/32",))
    assert ops.lines == ()


def test_sync_endpoint_update_weights_on_restart() -> None:
    """Test_syncEndpoint_updateWeightsOnRestart: a wanted real server found at weight 0 gets weight 1."""
    from kubeproxy.backends.ipvs.apply import diff_ipvs
    from kubeproxy.backends.ipvs.render import RealServer, VirtualServer

    vs = VirtualServer("TCP", "10.20.30.41", 80)
    ops = diff_ipvs({vs: (RealServer("10.180.0.1", 80),)}, {vs: [RealServer("10.180.0.1", 80, 0)]}, {})
    assert ops.lines == ("-e -t 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1",)
