"""The rendered text loads into a real kernel, in a namespace each test creates and removes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.backends.iptables.apply import RestoreError, ensure_nfacct_counters, restore
from kubeproxy.cli import main
from kubeproxy.lab.netns import NetNS
from kubeproxy.model.options import NFACCT_COUNTERS, Family
from tests.backends.iptables.canonical import uncommented
from tests.backends.iptables.rules_invariants import parse
from tests.backends.iptables.test_render_golden import GOLDEN, SCENARIOS
from tests.backends.iptables.test_upstream_fixtures import FIXTURES, render_fixture
from tests.paths import DEMO

pytestmark = pytest.mark.root


def _saved(ns: NetNS, ipv6: bool) -> dict[str, Any]:
    out = ns.run(["ip6tables-save" if ipv6 else "iptables-save"]).stdout
    return parse(out)


def _render(path: Path, *args: str, nfacct: bool) -> str:
    flags = [] if nfacct else ["--no-nfacct"]
    result = CliRunner().invoke(main, ["render", "--manifests", str(path), *args, *flags])
    assert result.exit_code == 0, result.output
    return result.stdout


def _assert_loaded(ns: NetNS, text: str, ipv6: bool = False) -> None:
    restore(text, ns, family=Family.IPV6 if ipv6 else Family.IPV4)
    saved = _saved(ns, ipv6)
    for table, (declared, rules) in parse(text).items():
        saved_declared, saved_rules = saved[table]
        assert set(declared) <= set(saved_declared), f"{table}: chains missing after restore"
        for chain, chain_rules in rules.items():
            assert len(saved_rules.get(chain, [])) == len(chain_rules), f"{table} {chain}: rule count differs"


def test_demo_loads_with_nfacct_counters(netns: NetNS) -> None:
    counters = ensure_nfacct_counters(NFACCT_COUNTERS, netns)
    text = _render(DEMO, "--cluster-cidr", "10.244.0.0/16", nfacct=counters == set(NFACCT_COUNTERS))
    _assert_loaded(netns, text)
    # A second full sync of the same text is accepted too (chain lines flush, rules re-added).
    _assert_loaded(netns, text)
    nat = _saved(netns, False)["nat"][1]
    assert any("--probability 0.50000000000" in r or "--probability 0.5" in r for r in nat["KUBE-SVC-XQATF6GKVNVCZZMN"])


def test_missing_nfacct_counter_is_refused_and_rendering_without_loads(netns: NetNS) -> None:
    with_counters = _render(DEMO, nfacct=True)
    with pytest.raises(RestoreError):
        restore(with_counters, netns)
    _assert_loaded(netns, _render(DEMO, nfacct=False))


@pytest.mark.parametrize("name", SCENARIOS)
def test_golden_scenarios_load(netns: NetNS, name: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    args = path.read_text().splitlines()[0].removeprefix("# args:").split()
    ensure_nfacct_counters(NFACCT_COUNTERS, netns)
    _assert_loaded(netns, _render(path, *args, nfacct=True), ipv6=name == "ipv6")


def test_upstream_overall_scenario_loads(netns: NetNS) -> None:
    ensure_nfacct_counters(NFACCT_COUNTERS, netns)
    _assert_loaded(netns, render_fixture(FIXTURES / "test_overall_iptables_rules"))


def test_host_ruleset_untouched(netns: NetNS) -> None:
    import subprocess

    before = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
    ensure_nfacct_counters(NFACCT_COUNTERS, netns)
    _assert_loaded(netns, _render(DEMO, nfacct=True))
    after = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
    assert uncommented(before) == uncommented(after)
