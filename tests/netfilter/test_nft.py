"""nft JSON parsing and tracing: kube-proxy's nftables layout (verdict maps, numgen, masquerade)."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from kubeproxy.netfilter import detect, nft_json
from kubeproxy.netfilter.addr import fmt_ip
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.ruleset import ParseError, Ruleset
from kubeproxy.netfilter.simulate import trace

FIX = Path(__file__).parent / "fixtures"
NODE = Node.from_flags(ifaces=["eth0=192.168.1.1/24", "eth1=10.180.0.254/16"], routes=["default=eth0@192.168.1.254"])


def _rs() -> Ruleset:
    return detect.parse((FIX / "kube_proxy_nft.json").read_text())


def test_sets_maps_and_base_chains() -> None:
    rs = _rs()
    t = rs.table("kube-proxy", "ip")
    assert t is not None
    assert t.chains["nat-prerouting"].hook == "prerouting" and t.chains["nat-prerouting"].type == "nat"
    assert t.chains["filter-prerouting"].priority == -110
    svc = t.sets["service-ips"]
    assert svc.is_map and svc.key_type == ("ipv4_addr", "inet_proto", "inet_service")
    ((key, verdict),) = svc.mapping.items()
    assert key == ((10 << 24) | (96 << 16) | 10, 17, 53)
    assert verdict.goto and verdict.chain.startswith("service-ULMVA6XW")
    assert t.sets["local-cidrs"].intervals == [(10 << 24, (10 << 24) | 0xFFFFFF), (0xC0A80000, 0xC0A8FFFF)]


def test_numgen_vmap_splits_evenly_and_dnats() -> None:
    res = trace(_rs(), NODE, make_packet("udp", "10.0.5.5", "10.96.0.10:53", in_iface="eth0"))
    got = {(fmt_ip(o.dst), o.dport): o.probability for o in res.outcomes}
    assert got == {("10.180.0.1", 53): Fraction(1, 2), ("10.180.0.2", 53): Fraction(1, 2)}
    assert all(o.verdict == "ACCEPT" and o.out_iface == "eth1" and not o.masquerade for o in res.outcomes)


def test_dnat_through_numgen_map_of_addr_port() -> None:
    res = trace(_rs(), NODE, make_packet("tcp", "10.0.5.5", "192.168.1.1:3001", in_iface="eth0"))
    got = {(fmt_ip(o.dst), o.dport): o.probability for o in res.outcomes}
    assert got == {("10.180.0.3", 80): Fraction(1, 3), ("10.180.0.4", 80): Fraction(1, 3),
                   ("10.180.0.5", 8080): Fraction(1, 3)}


def test_hairpin_is_masqueraded_by_mark() -> None:
    # the endpoint itself calls its service: marked, then masqueraded (mark bit cleared first)
    res = trace(_rs(), NODE, make_packet("udp", "10.180.0.1", "10.96.0.10:53", in_iface="eth1"))
    by_dst = {fmt_ip(o.dst): o for o in res.outcomes}
    assert by_dst["10.180.0.1"].masquerade and fmt_ip(by_dst["10.180.0.1"].src) == "10.180.0.254"
    # the other endpoint: source 10.180.0.1 is outside 10.0.0.0/8? no: inside, so no service mark
    assert not by_dst["10.180.0.2"].masquerade


def test_reject_via_verdict_map_and_drop_by_range() -> None:
    rs = _rs()
    r = trace(rs, NODE, make_packet("tcp", "10.0.5.5", "10.96.0.11:80", in_iface="eth0")).outcomes
    assert [o.verdict for o in r] == ["REJECT"]
    r = trace(rs, NODE, make_packet("udp", "10.1.0.5", "10.2.0.1:9", in_iface="eth0")).outcomes
    assert [o.verdict for o in r] == ["DROP"]
    r = trace(rs, NODE, make_packet("udp", "10.1.0.10", "10.2.0.1:9", in_iface="eth0")).outcomes
    assert [o.verdict for o in r] == ["ACCEPT"]


def test_errors_name_the_object() -> None:
    with pytest.raises(ParseError, match=r"^line 1: .*not JSON"):
        nft_json.parse('{"nftables": [')
    bad = {"nftables": [{"table": {"family": "ip", "name": "t"}},
                        {"chain": {"family": "ip", "table": "t", "name": "c"}},
                        {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"frob": 1}]}}]}
    with pytest.raises(ParseError, match=r"^object 3: .*unsupported statement 'frob'"):
        nft_json.parse(json.dumps(bad))


@pytest.mark.root
@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft")
def test_nft_text_is_loaded_in_a_throwaway_namespace() -> None:
    rs = detect.parse((FIX / "kube_proxy.nft").read_text())
    assert rs.table("kube-proxy", "ip") is not None
    with pytest.raises(ParseError, match=r"^line 2: "):
        detect.parse("table ip t {\n  chain c { frobnicate }\n}\n", "nft")


def _one_rule(*exprs: object) -> Ruleset:
    return nft_json.parse(json.dumps({"nftables": [
        {"table": {"family": "ip", "name": "t"}},
        {"chain": {"family": "ip", "table": "t", "name": "pre", "type": "nat", "hook": "prerouting",
                   "prio": -100, "policy": "accept"}},
        {"rule": {"family": "ip", "table": "t", "chain": "pre", "expr": [
            *exprs, {"dnat": {"addr": "10.180.0.2"}}]}},
    ]}))


def _random_below(mask: int, op: str, n: int) -> dict[str, object]:
    return {"match": {"op": op, "left": {"&": [{"meta": {"key": "random"}}, mask]}, "right": n}}


@pytest.mark.parametrize(("mask", "op", "n", "chance"), [
    (0x7FFFFFFF, "<", 0x40000000, Fraction(1, 2)),  # iptables' statistic 0.5, as nft prints it
    (0x7FFFFFFF, "<", 0, Fraction(0)),
    (3, "<=", 0, Fraction(1, 4)),
    (3, ">", 0, Fraction(3, 4)),
    (3, "!=", 5, Fraction(1)),
])
def test_meta_random_is_a_chance_not_a_miss(mask: int, op: str, n: int, chance: Fraction) -> None:
    res = trace(_one_rule(_random_below(mask, op, n)), NODE, make_packet("udp", "192.168.1.9", "192.168.1.1:53",
                                                                             in_iface="eth0"))
    dnat = sum((o.probability for o in res.outcomes if fmt_ip(o.dst) == "10.180.0.2"), Fraction(0))
    assert dnat == chance and not any(o.unknown for o in res.outcomes)


@pytest.mark.parametrize("left", [
    {"&": [{"meta": {"key": "random"}}, 6]},  # a mask that is not 2^k-1
    {"meta": {"key": "skuid"}},
    {"payload": {"protocol": "tcp", "field": "flags"}},
    {"ct": {"key": "daddr", "dir": "reply"}},
])
def test_a_match_the_tracer_cannot_compute_forks_as_unknown(left: dict[str, object]) -> None:
    rs = _one_rule({"match": {"op": "==", "left": left, "right": 2}})
    res = trace(rs, NODE, make_packet("tcp", "192.168.1.9", "192.168.1.1:80", in_iface="eth0"))
    assert sorted(bool(o.unknown) for o in res.outcomes) == [True, True]
    assert {fmt_ip(o.dst) for o in res.outcomes} == {"10.180.0.2", "192.168.1.1"}


def test_an_xt_comment_matches_every_packet() -> None:
    """nft -j names an iptables-nft comment match without its text; a comment matches anyway."""
    rs = _one_rule({"xt": {"type": "match", "name": "comment"}})
    res = trace(rs, NODE, make_packet("tcp", "192.168.1.9", "192.168.1.1:80", in_iface="eth0"))
    assert [(fmt_ip(o.dst), bool(o.unknown)) for o in res.outcomes] == [("10.180.0.2", False)]


# `nft list ruleset` of an iptables-nft node, as nft prints what it cannot translate: the newer
# `xt match NAME` / `xt target NAME`, and the older `# xt_NAME` (which nft -f reads as a comment
# swallowing the rest of the line: the jump would be lost and the rule would match everything).
XT_TEXT = """table ip nat {
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		# xt_addrtype counter packets 675 bytes 51804 jump DOCKER
	}

	chain DOCKER {
		iifname "docker0" counter packets 0 bytes 0 return
		ip saddr 192.168.1.9 xt match recent counter packets 0 bytes 0 return
		tcp dport 8080 counter packets 0 bytes 0 dnat to 10.180.0.2:80
	}

	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth1" counter packets 0 bytes 0 xt target CHECKSUM
	}
}
"""


@pytest.mark.root
@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft")
def test_iptables_extensions_nft_cannot_print_fork_as_unknown() -> None:
    rs = detect.parse(XT_TEXT, "nft")
    nat = rs.table("nat", "ip")
    assert nat is not None
    assert [r.text.endswith("xt match addrtype") for r in nat.chains["PREROUTING"].rules] == [True]
    assert nat.chains["DOCKER"].rules[1].text.endswith("xt match recent")
    assert any("traced as unknown" in n for n in rs.notes)
    # addrtype unknown: the jump to DOCKER is taken or not; recent unknown for this client only
    res = trace(rs, NODE, make_packet("tcp", "192.168.1.9", "192.168.1.1:8080", in_iface="eth0"))
    assert {(fmt_ip(o.dst), o.dport) for o in res.outcomes} == {("10.180.0.2", 80), ("192.168.1.1", 8080)}
    assert all(o.unknown for o in res.outcomes)
    other = trace(rs, NODE, make_packet("tcp", "192.168.1.8", "192.168.1.1:8080", in_iface="eth0"))
    assert {(fmt_ip(o.dst), o.dport) for o in other.outcomes} == {("10.180.0.2", 80), ("192.168.1.1", 8080)}
    # the line numbers stay those of the text given
    with pytest.raises(ParseError, match=r"^line 10: "):
        detect.parse(XT_TEXT.replace("tcp dport 8080", "frobnicate"), "nft")


def _two_nat_tables(first: list[dict[str, object]]) -> Ruleset:
    """Two tables with a nat chain at postrouting, the same priority: `first`'s rule, then the
    other table's masquerade of 10.180.0.0/16 (as LXD's inet table beside libvirt's ip nat)."""
    def table(family: str, name: str, exprs: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{"table": {"family": family, "name": name}},
                {"chain": {"family": family, "table": name, "name": "post", "type": "nat", "hook": "postrouting",
                           "prio": 100, "policy": "accept"}},
                {"rule": {"family": family, "table": name, "chain": "post", "expr": exprs}}]
    masq: list[dict[str, object]] = [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                       "right": {"prefix": {"addr": "10.180.0.0", "len": 16}}}}, {"masquerade": None}]
    return nft_json.parse(json.dumps({"nftables": [*table("inet", "a", first), *table("ip", "b", masq)]}))


@pytest.mark.parametrize(("first", "source"), [
    # binds nothing (accepts, or matches nothing): the other table's nat chain is consulted
    ([{"accept": None}], "192.168.1.1"),
    ([{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "version"}}, "right": 6}},
      {"masquerade": None}], "192.168.1.1"),
    # binds the connection: the next nat chain is not consulted (nf_nat_inet_fn)
    ([{"snat": {"addr": "192.168.1.77"}}], "192.168.1.77"),
])
def test_a_hook_s_nat_chains_are_consulted_until_one_binds(first: list[dict[str, object]], source: str) -> None:
    res = trace(_two_nat_tables(first), NODE, make_packet("udp", "10.180.0.9", "192.168.1.99:53", in_iface="eth1"))
    assert [(fmt_ip(o.src), bool(o.unknown)) for o in res.outcomes] == [(source, False)]
