"""The tracer does bounded work: random rules that do not end the walk fork inside one chain, ways
that rejoin with the same packet state merge, and a branch budget ends the rest as UNTRACED."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import Simulator, TraceResult

NODE = Node.from_flags(ifaces=["eth0=192.168.0.10/24"])
PACKET = make_packet("tcp", "192.168.0.7:40000", "192.168.0.10:80", in_iface="eth0")


def iptables_forks(rules: int, distinct: bool) -> str:
    """mangle PREROUTING: `rules` rules that each mark half the packets and let all go on."""
    lines = ["*mangle", ":PREROUTING ACCEPT [0:0]"]
    for k in range(rules):
        bit = 1 << (k % 32) if distinct else 1
        lines.append(f"-A PREROUTING -m statistic --mode random --probability 0.5 -j MARK --set-xmark 0x{bit:x}/0x{bit:x}")
    return "\n".join([*lines, "COMMIT", ""])


def nft_forks(rules: int, distinct: bool) -> str:
    """The same in nft JSON: `numgen random mod 2 == 0` then a mark set, or a counter."""
    objs: list[dict[str, object]] = [
        {"table": {"family": "ip", "name": "t"}},
        {"chain": {"family": "ip", "table": "t", "name": "pre", "type": "filter", "hook": "prerouting", "prio": 0,
                   "policy": "accept"}},
    ]  # fmt: skip
    for k in range(rules):
        mark = {"|": [{"meta": {"key": "mark"}}, 1 << (k % 32)]}
        action = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": mark}} if distinct else {"counter": None}
        match = {"match": {"op": "==", "left": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "right": 0}}
        objs.append({"rule": {"family": "ip", "table": "t", "chain": "pre", "expr": [match, action]}})
    return json.dumps({"nftables": objs})


def traced(dump: str, max_branches: int = 20_000) -> TraceResult:
    return Simulator(detect.parse(dump), NODE, max_branches=max_branches).trace(PACKET)


def test_forty_marking_random_rules_rejoin_into_two_outcomes() -> None:
    result = traced(iptables_forks(40, distinct=False))
    chances = sorted(o.probability for o in result.outcomes)
    # marked by at least one of the 40 rules, or by none: two packet states, whatever the paths
    assert chances == [Fraction(1, 2**40), 1 - Fraction(1, 2**40)]
    assert all(o.verdict == "ACCEPT" and o.local for o in result.outcomes)
    assert any("merged" in note for o in result.outcomes for note in o.notes)


def test_forty_numgen_rules_with_a_counter_are_one_outcome() -> None:
    [outcome] = traced(nft_forks(40, distinct=False)).outcomes
    assert outcome.probability == 1 and outcome.verdict == "ACCEPT"


def test_forks_within_the_budget_are_all_followed() -> None:
    for dump in (iptables_forks(6, distinct=True), nft_forks(6, distinct=True)):
        result = traced(dump, max_branches=100)
        assert len(result.outcomes) == 64 and all(o.probability == Fraction(1, 64) for o in result.outcomes)
        assert not any("budget" in note for note in result.notes)


def test_the_budget_ends_the_walk_as_an_untraced_outcome() -> None:
    for dump in (iptables_forks(40, distinct=True), nft_forks(40, distinct=True)):
        result = traced(dump, max_branches=500)
        untraced = [o for o in result.outcomes if o.verdict == "UNTRACED"]
        assert untraced and sum(o.probability for o in result.outcomes) == 1
        assert len(result.outcomes) <= 10  # one per rule where ways stopped, not one per way
        [note] = [n for n in result.notes if "branch budget" in n]
        assert "500 forks" in note and "UNTRACED" in note
        # the hop it stopped at is the random rule where the budget ran out
        assert all(o.path and o.path[-1].chain in ("PREROUTING", "pre") for o in untraced)


def test_the_cli_shows_the_budget_outcome(tmp_path: Path) -> None:
    dump = tmp_path / "forks.rules"
    dump.write_text(iptables_forks(40, distinct=True))
    args = ["trace", "--rules", str(dump), "--proto", "tcp", "--src", "192.168.0.7:40000", "--dst", "192.168.0.10:80",
            "--in-iface", "eth0", "--iface", "eth0=192.168.0.10/24"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "UNTRACED" in result.output and "the tracer's branch budget ran out" in result.output
    assert "note: the branch budget (20,000 forks) ran out" in result.output
    as_json = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert {o["verdict"] for o in as_json["outcomes"]} == {"UNTRACED"}
