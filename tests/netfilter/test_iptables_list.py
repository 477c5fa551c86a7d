"""`iptables -L` listings pasted in questions (seeds 001, 002, 004)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from kubeproxy.netfilter import detect, iptables_list
from kubeproxy.netfilter.addr import fmt_ip
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.ruleset import AddrType, Jump, Mark, Nat, ParseError, Port, Ruleset, SetMark, Statistic
from kubeproxy.netfilter.simulate import trace

FIX = Path(__file__).parent / "fixtures"


def test_seed001_numeric_listing() -> None:
    rs = detect.parse((FIX / "seed001_nat.iptables-list").read_text())
    assert rs.source == "iptables-list"
    nat = rs.table("nat")
    assert nat is not None and nat.chains["PREROUTING"].hook == "prerouting"
    svc = nat.chains["KUBE-SVC-M42ZCW2EYUCRBVAF"].rules
    assert svc[0].load()[0] == Statistic(Fraction(round(0.14286000002 * 2**31), 2**31))
    assert nat.chains["KUBE-MARK-MASQ"].rules[0].load() == [SetMark(~0x4000 & 0xFFFFFFFF, 0x4000)]
    sep = nat.chains["KUBE-SEP-BVMKBOC4GGNJ3567"].rules[1].load()
    assert sep[-1] == Nat("dnat", (172 << 24) | (31 << 16) | (9 << 8) | 52, 80)
    assert any("not in the listing" in n for n in rs.notes)


def test_seed001_trace_reaches_the_listed_endpoint_or_stops_at_unlisted_chains() -> None:
    rs = detect.parse((FIX / "seed001_nat.iptables-list").read_text())
    node = Node.from_flags(ifaces=["eth0=172.6.6.10/24", "cni0=172.31.0.1/16"])
    res = trace(rs, node, make_packet("tcp", "8.8.8.8", "172.30.5.207:443", in_iface="eth0"))
    # the six unlisted endpoint chains: each may end the walk or return, and the outcomes cover
    # both; when they all end it, only the last endpoint's chain remains:
    # 1 - P(any of the six statistic rules)
    keys = res.unknowns()
    assert len(keys) == 6 and {k[4] for k in keys} == {f"chain {c}" for c in _unlisted(rs) if c.startswith("KUBE-SEP")}
    outs = res.given(dict.fromkeys(keys, "ends the walk"))
    assert sum(o.probability for o in outs) == 1
    listed = [o for o in outs if o.verdict == "ACCEPT"]
    assert len(listed) == 1 and fmt_ip(listed[0].dst) == "172.31.9.52" and listed[0].dport == 80
    assert abs(float(listed[0].probability) - 1 / 7) < 1e-6
    assert {o.verdict for o in outs} == {"ACCEPT", "UNKNOWN"}
    # when they all return, every packet reaches the listed endpoint
    outs = res.given(dict.fromkeys(keys, "returns"))
    assert sum(o.probability for o in outs) == 1
    assert {(o.verdict, fmt_ip(o.dst)) for o in outs} == {("ACCEPT", "172.31.9.52")}


def _unlisted(rs: Ruleset) -> set[str]:
    nat = rs.table("nat")
    assert nat is not None
    return {r.load()[-1].chain for c in nat.chains.values() for r in c.rules
            if isinstance(r.load()[-1], Jump) and r.load()[-1].chain not in nat.chains}


def test_seed002_names_instead_of_numbers() -> None:
    rs = detect.parse((FIX / "seed002_nat.iptables-list").read_text())
    nat = rs.table("nat")
    assert nat is not None
    rows = nat.chains["KUBE-SERVICES"].rules
    assert Port("dport", ((443, 443),)) in rows[0].load()  # dpt:https
    assert Port("dport", ((53, 53),)) in rows[6].load()  # dpt:domain
    assert rows[-1].load()[0] == AddrType(dst_types=frozenset({"LOCAL"}))
    # the chain listed twice is kept once
    assert len(nat.chains["KUBE-SEP-V7KWRXXOBQHQVWAT"].rules) == 2


def test_seed004_verbose_listing_with_a_wrapped_row() -> None:
    rs = detect.parse((FIX / "seed004_nat_verbose.iptables-list").read_text())
    nat = rs.table("nat")
    assert nat is not None
    post = nat.chains["KUBE-POSTROUTING"].rules
    assert len(post) == 1 and post[0].load() == [Mark(0x4000, 0x4000), Nat("masquerade")]
    node = Node.from_flags(ifaces=["eth0=192.168.0.10/24"])
    res = trace(rs, node, make_packet("tcp", "192.168.0.50", "192.168.0.10:30915", in_iface="eth0"))
    assert sum(o.probability for o in res.outcomes) == 1


def test_hostnames_need_numeric_output() -> None:
    text = "Chain INPUT (policy ACCEPT)\ntarget prot opt source destination\nACCEPT all -- ares-k29 anywhere\n"
    with pytest.raises(ParseError, match=r"^line 3: .*host name"):
        iptables_list.parse(text)
