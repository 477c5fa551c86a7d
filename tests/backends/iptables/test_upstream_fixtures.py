"""Upstream kube-proxy's own iptables test scenarios: our renderer must produce their dumps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kubeproxy.backends.iptables.render import render
from kubeproxy.cluster.addresses import valid_cidr
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.objects import Node
from kubeproxy.cluster.state import build_state
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import NodeOptions, node_options
from kubeproxy.model.proxy_config import ProxyConfig
from tests.backends.iptables.canonical import diff
from tests.backends.iptables.rules_invariants import check_invariants, parse
from tests.paths import TESTS

FIXTURES = TESTS / "fixtures" / "upstream"

def _is_full_sync(case: Path) -> bool:
    # Steps of upstream's repeated-sync test after the first are partial syncs (only changed
    # services' chains are rewritten): tests/backends/iptables/test_partial_sync.py replays those.
    partial = "sync_proxy_rules_repeated" in case.name and not case.name.endswith("_step1")
    return (case / "expected.rules").exists() and not partial


CASES = sorted(p.name for p in FIXTURES.iterdir() if _is_full_sync(p))
PARTIAL_SYNC_CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.rules").exists() and not _is_full_sync(p))


def fixture_options(case: Path, node: Node | None = None) -> NodeOptions:
    """NodeOptions for a fixture's options.yaml, through the same path the CLI takes."""
    raw = yaml.safe_load((case / "options.yaml").read_text())
    if raw["node_pod_cidr"]:
        pod_cidr = valid_cidr(raw["node_pod_cidr"])
        node = Node(raw["node_name"], dict(node.labels) if node else {}, (), (pod_cidr,))
    cfg = ProxyConfig(
        hostname_override=raw["node_name"],
        node_ip=raw["node_ip"],
        cluster_cidr=tuple(raw["cluster_cidr"].split(",")) if raw["cluster_cidr"] else (),
        detect_local_mode=raw["detect_local_mode"] or "",
        bridge_interface=raw["bridge_interface"] or "",
        interface_name_prefix=raw["interface_name_prefix"] or "",
        masquerade_all=raw["masquerade_all"],
        masquerade_bit=raw["masquerade_bit"],
        localhost_nodeports=raw["localhost_nodeports"],
        nodeport_addresses=tuple(raw["nodeport_addresses"]),
        random_fully=raw["random_fully"],
    )
    opts = node_options(
        cfg,
        family=raw["ip_family"],
        hostname=raw["node_name"],
        node=node,
        nfacct_counters=raw["nfacct_counters"],
        conntrack_tcp_liberal=raw["conntrack_tcp_liberal"],
        interface_ips=raw["node_port_ips"],
    )
    # Upstream's fake proxier hard-codes the mark as "0x4000"; the real one (and our
    # ProxyConfig) formats 1<<14 with Go's %#08x as "0x00004000".
    return dataclasses.replace(opts, masquerade_mark="0x4000")


def render_fixture(case: Path) -> str:
    state, _ = build_state(r.obj for r in load_manifests([case / "objects.yaml"]))
    node_name = yaml.safe_load((case / "options.yaml").read_text())["node_name"]
    opts = fixture_options(case, state.nodes.get(node_name))
    view = build_view(state.services.values(), state.slices.values(), opts.family, opts.node_name)
    return render(view, opts).text


@pytest.mark.parametrize("case", CASES)
def test_matches_upstream(case: str) -> None:
    expected = (FIXTURES / case / "expected.rules").read_text()
    actual = render_fixture(FIXTURES / case)
    problems = diff(expected, actual)
    assert not problems, f"{case} differs from upstream:\n{problems}"
    check_invariants(actual)


CHAIN_CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected_chains.yaml").exists())


@pytest.mark.parametrize("case", CHAIN_CASES)
def test_chains_match_upstream(case: str) -> None:
    """Upstream tests that check single chains (nfacct, tcp-liberal, --random-fully)."""
    rules = parse(render_fixture(FIXTURES / case))
    for expected in yaml.safe_load((FIXTURES / case / "expected_chains.yaml").read_text()):
        assert rules[expected["table"]][1][expected["chain"]] == expected["rules"]


def test_upstream_dump_tests_are_all_here() -> None:
    # Upstream's current test file asserts complete dumps in exactly these tests.
    assert {"test_overall_iptables_rules", "test_bad_ips", "test_sync_proxy_rules_repeated_step1"} <= set(CASES)
    assert len(PARTIAL_SYNC_CASES) == 8
    assert len(CHAIN_CASES) >= 5
