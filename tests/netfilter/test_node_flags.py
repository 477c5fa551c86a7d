"""The tracer's NAME=VALUE flags take any name: split at the last "=" (a member or address holds none)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node, NodeError

WEAVE_SET = "weave-k?Z;!f)=W=_2oJ"  # weave-npc's hashed names hold "=" and punctuation


def test_ipset_names_may_hold_equals_signs() -> None:
    node = Node.from_flags(ipsets=[f"{WEAVE_SET}=10.32.0.7", f"{WEAVE_SET}=10.32.0.0/12", "plain=10.0.0.1,tcp:80"])
    assert node.ipsets == {WEAVE_SET: ["10.32.0.7", "10.32.0.0/12"], "plain": ["10.0.0.1,tcp:80"]}


def test_recent_lists_and_interfaces_may_hold_equals_signs() -> None:
    node = Node.from_flags(ifaces=["br=lan=10.1.0.1/24"], affinity=["KUBE-SEP=X=10.1.0.9"],
                           routes=["10.9.0.0/16=br=lan@10.1.0.254", "10.8.0.0/16=odd@if"])  # fmt: skip
    assert [a.ip for a in node.interfaces["br=lan"]] == [A.ip4_to_int("10.1.0.1")]
    assert node.recent == {"KUBE-SEP=X": {A.ip4_to_int("10.1.0.9")}}
    assert {(r.iface, r.via) for r in node.routes} == {("br=lan", A.ip4_to_int("10.1.0.254")), ("odd@if", None)}


@pytest.mark.parametrize(("flag", "spec"), [("ipsets", "name="), ("ipsets", "=10.0.0.1"), ("ipsets", "name"),
                                            ("affinity", "=10.0.0.1"), ("ifaces", "=10.0.0.1/24")])  # fmt: skip
def test_a_spec_without_name_or_value_is_refused_naming_it(flag: str, spec: str) -> None:
    with pytest.raises(NodeError, match="expected NAME="):
        Node.from_flags(**{flag: [spec]})


def test_trace_matches_a_set_whose_name_holds_equals(tmp_path: Path) -> None:
    rules = tmp_path / "filter.rules"
    rules.write_text(f"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m set ! --match-set {WEAVE_SET} src -j DROP\nCOMMIT\n")
    args = ["trace", "--rules", str(rules), "--proto", "tcp", "--dst", "10.0.0.1:80", "--in-iface", "eth0",
            "--iface", "eth0=10.0.0.1/8", "--ipset", f"{WEAVE_SET}=10.32.0.7"]  # fmt: skip
    member = CliRunner().invoke(main, [*args, "--src", "10.32.0.7:40000"])
    assert member.exit_code == 0, member.output
    assert "Outcome 1/1: 100%: ACCEPT" in member.output
    other = CliRunner().invoke(main, [*args, "--src", "10.32.0.8:40000"])
    assert "Outcome 1/1: 100%: DROP" in other.output
