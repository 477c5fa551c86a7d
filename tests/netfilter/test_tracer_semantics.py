"""Tracer semantics that the kernel-differential tests also pin with real packets, checked here
without root: unknown matches fork the trace, physdev on routed and bridged packets, the source
MASQUERADE picks, IPv6 dumps and node models."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.addr import fmt_ip, parse_ip
from kubeproxy.netfilter.iptables_save import dump_family
from kubeproxy.netfilter.node import IfAddr, Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace

UNKNOWN_MATCH = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p udp -m u32 --u32 "0>>22&0x3C@8=0x1234" -j DROP
-A FORWARD -p udp --dport 53 -j REJECT
COMMIT
"""


def _node() -> Node:
    return Node.from_flags(ifaces=["eth0=10.1.0.1/24", "eth1=10.2.0.1/24"], routes=["default=eth0@10.1.0.2"])


def test_an_unknown_match_gives_an_outcome_for_each_answer() -> None:
    rs = detect.parse(UNKNOWN_MATCH)
    res = trace(rs, _node(), make_packet("udp", "10.1.0.2", "10.2.0.2:53", in_iface="eth0"))
    keys = res.unknowns()
    assert len(keys) == 1 and keys[0][:3] == ("filter", "FORWARD", 1) and "u32" in keys[0][4]
    by = {o.unknown[0].assumed: o for o in res.outcomes}
    assert set(by) == {"matches", "does not match"}
    assert by["matches"].verdict == "DROP" and by["does not match"].verdict == "REJECT"
    assert by["matches"].unknown[0].line == 5 and "--u32" in by["matches"].unknown[0].text
    for answer in ("matches", "does not match"):
        assert sum(o.probability for o in res.given({keys[0]: answer})) == 1


def test_unknown_shows_in_text_and_json(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.write_text(UNKNOWN_MATCH)
    base = ["trace", "--rules", str(rules), "--proto", "udp", "--src", "10.1.0.2", "--dst", "10.2.0.2:53",
            "--in-iface", "eth0", "--iface", "eth0=10.1.0.1/24", "--iface", "eth1=10.2.0.1/24"]
    out = CliRunner().invoke(main, [*base, "--json"])
    assert out.exit_code == 0, out.output
    outs = json.loads(out.stdout)["outcomes"]
    assert sorted((o["verdict"], o["unknown"][0]["assumed"]) for o in outs) == [
        ("DROP", "matches"), ("REJECT", "does not match")]
    assert all(o["unknown"][0]["line"] == 5 for o in outs)
    text = CliRunner().invoke(main, base).stdout
    assert "unknown: filter FORWARD #1 (line 5)" in text and "assumes it does not match" in text


def test_several_unknowns_every_combination_sums_to_one() -> None:
    text = """*filter
:FORWARD ACCEPT [0:0]
:X - [0:0]
-A FORWARD -m u32 --u32 "0=1" -j X
-A FORWARD -m cgroup --cgroup 1 -j DROP
-A X -m u32 --u32 "0=2" -j REJECT
-A X -j NOT-IN-THIS-DUMP
COMMIT
"""
    res = trace(detect.parse(text), _node(), make_packet("tcp", "10.1.0.2", "10.2.0.2:80", in_iface="eth0"))
    keys = res.unknowns()
    assert len(keys) == 4
    answers_of = {k: (["ends the walk", "continues"] if "target" in k[4] else ["matches", "does not match"])
                  for k in keys}
    for combo in itertools.product(*answers_of.values()):
        outs = res.given(dict(zip(answers_of, combo, strict=True)))
        assert sum(o.probability for o in outs) == 1, combo


PHYSDEV = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -o weave -m physdev --physdev-out vethwe-bridge --physdev-is-bridged -j ACCEPT
-A FORWARD -m physdev --physdev-is-bridged -j ACCEPT
-A FORWARD -m physdev --physdev-out vethwe+ -j ACCEPT
-A FORWARD -m physdev ! --physdev-is-bridged -p udp --dport 53 -j DROP
-A FORWARD -j REJECT
COMMIT
"""


def test_physdev_never_matches_a_routed_packet_unless_inverted() -> None:
    res = trace(detect.parse(PHYSDEV), _node(), make_packet("udp", "10.1.0.2", "10.2.0.2:53", in_iface="eth0"))
    assert [o.verdict for o in res.outcomes] == ["DROP"]  # rule 4, the inverted one
    assert res.outcomes[0].path[-1].rule == 4 and not res.outcomes[0].unknown
    res = trace(detect.parse(PHYSDEV), _node(), make_packet("tcp", "10.1.0.2", "10.2.0.2:80", in_iface="eth0"))
    assert [o.verdict for o in res.outcomes] == ["REJECT"]


def test_physdev_on_a_bridged_packet() -> None:
    node = Node.from_flags(ifaces=["weave=10.32.0.1/12"])
    pkt = make_packet("udp", "10.32.0.5", "10.32.0.6:53", in_iface="weave", physdev_in="vethwepl1",
                      physdev_out="vethwe-bridge")
    res = trace(detect.parse(PHYSDEV), node, pkt)
    assert [(o.verdict, o.path[-1].rule, o.out_iface) for o in res.outcomes] == [("ACCEPT", 1, "weave")]
    # routed after arriving through a bridge port: an in port, no out port
    pkt = make_packet("udp", "10.32.0.5", "10.1.0.9:53", in_iface="weave", physdev_in="vethwepl1")
    node = Node.from_flags(ifaces=["weave=10.32.0.1/12", "eth0=10.1.0.1/24"])
    res = trace(detect.parse(PHYSDEV), node, pkt)
    assert [(o.verdict, o.path[-1].rule) for o in res.outcomes] == [("DROP", 4)]


def _ip(s: str) -> int:
    return parse_ip(s)[0]


def test_masquerade_source_follows_inet_select_addr() -> None:
    node = Node.from_flags(ifaces=["eth0=192.168.0.2/24", "eth0=10.9.0.2/24", "eth1=10.2.0.1/24"])
    # the out interface's primary global address in the next hop's subnet, else its first
    assert node.masquerade_source("eth0", _ip("10.9.0.7"), False) == _ip("10.9.0.2")
    assert node.masquerade_source("eth0", _ip("8.8.8.8"), False) == _ip("192.168.0.2")
    # lo has only 127.0.0.1 (host scope): the first global address of the interfaces in order
    assert node.masquerade_source("lo", _ip("10.2.0.1"), False) == _ip("192.168.0.2")
    # an address-less veth: the same fallback
    node.interfaces["veth0"] = []
    assert node.masquerade_source("veth0", _ip("10.50.0.2"), False) == _ip("192.168.0.2")
    # a secondary address is never picked
    node = Node.from_flags(ifaces=["eth0=10.9.0.2/24", "eth0=10.9.0.3/24"])
    assert node.masquerade_source("eth0", _ip("10.9.0.7"), False) == _ip("10.9.0.2")
    # no global address anywhere: the kernel drops
    assert Node.from_flags().masquerade_source("lo", _ip("10.2.0.1"), False) is None
    # IPv6: the destination itself when it is ours, else a global one, preferring the out interface
    node = Node.from_flags(ifaces=["eth0=2001:db8::2/64", "eth1=fd00:2::1/64"])
    node.interfaces["eth1"].append(IfAddr(_ip("fe80::1"), 64, True))
    assert node.masquerade_source("eth1", _ip("fd00:2::9"), True) == _ip("fd00:2::1")
    assert node.masquerade_source("lo", _ip("fd00:2::1"), True) == _ip("fd00:2::1")
    assert node.masquerade_source("eth1", _ip("fe80::9"), True) == _ip("fe80::1")


def test_masquerade_out_of_an_addressless_veth_is_not_dropped() -> None:
    text = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o veth+ -j MASQUERADE\nCOMMIT\n"
    node = Node.from_flags(ifaces=["eth0=10.1.0.1/24"], routes=["10.50.0.0/24=veth0"])
    res = trace(detect.parse(text), node, make_packet("udp", "10.1.0.2", "10.50.0.2:53", in_iface="eth0"))
    assert [(o.verdict, fmt_ip(o.src), o.masquerade) for o in res.outcomes] == [("ACCEPT", "10.1.0.1", True)]


def test_ip6tables_dumps_and_ipv6_node_model() -> None:
    assert dump_family("# Generated by ip6tables-save v1.8.7\n*nat\nCOMMIT\n") == "ip6"
    assert dump_family("-A X -m mac --mac-source aa:bb:cc:dd:ee:ff -j DROP\n") == "ip"
    assert dump_family("-A X -d 10.0.0.1/32 -j DNAT --to-destination 10.0.0.2:80\n") == "ip"
    assert dump_family("-A X -j DNAT --to-destination [fd00::2]:80\n") == "ip6"
    text = """*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d fd00:96::10/128 -p udp --dport 53 -j DNAT --to-destination [fd00:2::2]:5353
-A POSTROUTING -o eth1 -j MASQUERADE
COMMIT
"""
    rs = detect.parse(text)
    assert {t.family for t in rs.tables} == {"ip6"}
    node = Node.from_flags(ifaces=["eth0=fd00:1::1/64", "eth1=fd00:2::1/64"], routes=["default=eth0"])
    res = trace(rs, node, make_packet("udp", "[fd00:1::2]:4000", "[fd00:96::10]:53", in_iface="eth0"))
    assert [(o.verdict, fmt_ip(o.dst), o.dport, fmt_ip(o.src), o.out_iface) for o in res.outcomes] == [
        ("ACCEPT", "fd00:2::2", 5353, "fd00:2::1", "eth1")]
    # an IPv4 packet does not see an ip6tables dump
    node4 = Node.from_flags(ifaces=["eth0=10.1.0.1/24", "eth1=10.2.0.1/24"])
    res = trace(rs, node4, make_packet("udp", "10.1.0.2", "10.2.0.2:53", in_iface="eth0"))
    assert [o.path for o in res.outcomes] == [[]]


def test_iptables_S_output_is_the_filter_table() -> None:
    rs = detect.parse("-P INPUT ACCEPT\n-P FORWARD DROP\n-N KUBE-FORWARD\n-A FORWARD -j KUBE-FORWARD\n")
    (t,) = rs.tables
    assert t.name == "filter" and t.chains["FORWARD"].policy == "DROP" and "KUBE-FORWARD" in t.chains


def test_line_numbered_listings() -> None:
    text = """Chain KUBE-SVC-X (1 references)
num   pkts bytes target     prot opt in     out     source               destination
1        3   180 KUBE-MARK-MASQ  6    --  *      *      !10.131.0.0/16        100.67.0.1           tcp dpt:443
2        4   240 DNAT       6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp to:172.18.0.7:6443
"""
    rs = detect.parse(text)
    rules = rs.tables[0].chains["KUBE-SVC-X"].rules
    assert [r.target for r in rules] == ["KUBE-MARK-MASQ", "DNAT"]
