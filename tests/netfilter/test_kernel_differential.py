"""The kernel is the oracle: load a ruleset in a namespace, send real packets, compare with the tracer.

Each test builds client -- node -- backends namespaces, loads the rules into the node with
iptables-restore or nft -f, sends UDP/TCP probes (one new connection each) and checks that what
the receivers saw (destination, source address), a reject, or silence, is what the tracer
predicted, and, for random rules, as often as it predicted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubeproxy.lab import netns as L
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node, Route
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import Outcome, trace
from tests.netfilter.kernel_bed import Bed, BedSpec, assert_kernel_agrees, bed

pytestmark = pytest.mark.root
FIX = Path(__file__).parent / "fixtures"
WIRE = [sys.executable, str(Path(__file__).parent / "wire.py")]

SEED_BED: BedSpec = {
    "client_ip": "10.5.6.2/24",
    "node_front": ("eth3", "10.5.6.29/24"),
    "node_back": ("docker0", "10.100.13.1/24"),
    "backends": ["10.100.13.3/24"],
}


def _check(b: Bed, rules_text: str, proto: str, dst: str, count: int, *, in_iface: str | None, src: str,
           timeout: float = 1.0) -> list[Outcome]:
    rs = detect.parse(rules_text)
    res = trace(rs, b.model, make_packet(proto, src, dst, in_iface=in_iface))
    observed = b.send(proto, dst, count, timeout=timeout, from_node=in_iface is None,
                      src=src if in_iface is None else None)
    assert_kernel_agrees(res.outcomes, observed)
    return res.outcomes


@pytest.mark.parametrize(("proto", "dst"), [("udp", "10.5.6.29:53"), ("tcp", "10.5.6.29:53"),
                                            ("udp", "10.24.138.29:53")])
def test_seed000_kube_proxy_dump_masquerades_incoming_queries(proto: str, dst: str) -> None:
    text = (FIX / "seed000_kube_proxy.iptables-save").read_text()
    with bed(**SEED_BED) as b:
        b.load_iptables(text)
        b.serve(b.backend, proto, ["10.100.13.3:53"])
        outs = _check(b, text, proto, dst, 20, in_iface="eth3", src=b.client_ip)
    # the seed's finding: the pod sees the node's docker0 address, not the client
    assert [o.masquerade for o in outs] == [True]


def test_seed000_manual_dnat_keeps_the_client_address() -> None:
    text = (FIX / "seed000_manual_dnat.iptables-save").read_text()
    with bed(**SEED_BED) as b:
        b.load_iptables(text)
        b.serve(b.backend, "udp", ["10.100.13.3:53"])
        outs = _check(b, text, "udp", "10.5.6.29:53", 20, in_iface="eth3", src=b.client_ip)
    assert [o.masquerade for o in outs] == [False]


KUBE_RANDOM = (FIX / "kube_random.iptables-save").read_text()
PLAIN_BED: BedSpec = {
    "client_ip": "10.1.0.2/24",
    "node_front": ("eth0", "10.1.0.1/24"),
    "node_back": ("eth1", "10.2.0.1/24"),
    "backends": ["10.2.0.2/24", "10.2.0.3/24", "10.2.0.4/24"],
}


def test_statistic_split_matches_the_kernel_distribution() -> None:
    # deliberately uneven (1/2, 1/4, 1/4), so that a tracer that spread evenly would fail
    with bed(**PLAIN_BED) as b:
        b.load_iptables(KUBE_RANDOM)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353", "10.2.0.4:5353"])
        outs = _check(b, KUBE_RANDOM, "udp", "10.96.0.10:53", 1500, in_iface="eth0", src=b.client_ip)
    assert sorted(float(o.probability) for o in outs) == [0.25, 0.25, 0.5]
    assert all(o.masquerade for o in outs)


def test_from_host_output_dnat_then_masquerade() -> None:
    with bed(**PLAIN_BED) as b:
        b.load_iptables(KUBE_RANDOM)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353", "10.2.0.4:5353"])
        # the node's own process; the source is its front address, rerouted out eth1 by the DNAT
        _check(b, KUBE_RANDOM, "udp", "10.96.0.10:53", 600, in_iface=None, src="10.1.0.1")


DOCKER = (FIX / "docker_style.iptables-save").read_text()


@pytest.mark.parametrize(
    ("proto", "dst", "count", "expect"),
    [
        ("tcp", "10.1.0.1:8080", 10, "ACCEPT"),  # published port: DNAT, client address kept
        ("udp", "10.1.0.1:8053", 5, "REJECT"),  # DNAT, then rejected in FORWARD
        ("tcp", "10.2.0.3:22", 3, "DROP"),  # no DNAT: FORWARD policy DROP
        ("udp", "10.2.0.3:9999", 3, "DROP"),  # DOCKER-USER drop
    ],
)
def test_docker_style_rules(proto: str, dst: str, count: int, expect: str) -> None:
    with bed(**PLAIN_BED) as b:
        b.load_iptables(DOCKER)
        b.serve(b.backend, "tcp", ["10.2.0.2:80", "10.2.0.3:22"])
        b.serve(b.backend, "udp", ["10.2.0.3:53", "10.2.0.3:9999"])
        outs = _check(b, DOCKER, proto, dst, count, in_iface="eth0", src=b.client_ip, timeout=0.5)
    assert [o.verdict for o in outs] == [expect]


CALICO = (FIX / "calico_style.iptables-save").read_text()


@pytest.mark.parametrize(
    ("dst", "count", "expect"),
    [
        ("10.2.0.2:7005", 3, "DROP"),  # marked in mangle, dropped by the policy chain
        ("10.2.0.2:7100", 10, "ACCEPT"),  # marked, policy returns, accepted
        ("10.2.0.2:7200", 5, "REJECT"),  # unmarked: goto cali-from-hep-forward rejects
        ("10.2.0.2:7300", 10, "ACCEPT"),  # unmarked: goto'd chain falls off, FORWARD policy
    ],
)
def test_calico_style_marks_and_gotos(dst: str, count: int, expect: str) -> None:
    with bed(**PLAIN_BED) as b:
        b.load_iptables(CALICO)
        b.serve(b.backend, "udp", ["10.2.0.2:7005", "10.2.0.2:7100", "10.2.0.2:7200", "10.2.0.2:7300"])
        outs = _check(b, CALICO, "udp", dst, count, in_iface="eth0", src=b.client_ip, timeout=0.5)
    assert [o.verdict for o in outs] == [expect]


NFT = (FIX / "nft_numgen.nft").read_text()


def test_nftables_numgen_vmap_distribution_and_reject() -> None:
    with bed(**PLAIN_BED) as b:
        b.load_nft(NFT)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353", "10.2.0.4:6000"])
        json_text = b.node.run(["nft", "-j", "list", "ruleset"]).stdout
        rs = detect.parse(json_text)
        res = trace(rs, b.model, make_packet("udp", b.client_ip, "10.96.0.10:53", in_iface="eth0"))
        observed = b.send("udp", "10.96.0.10:53", 800, timeout=0.5)
    assert_kernel_agrees(res.outcomes, observed)
    got = sorted((o.verdict, float(o.probability)) for o in res.outcomes)
    assert got == [("ACCEPT", 0.25), ("ACCEPT", 0.5), ("REJECT", 0.25)]


META_RANDOM = (FIX / "nft_meta_random.nft").read_text()


@pytest.mark.parametrize("in_iface", ["eth0", None])
def test_nft_meta_random_splits_and_a_node_packet_has_no_input_interface(in_iface: str | None) -> None:
    # `meta random & 2147483647 < N` is how nft prints iptables' statistic match (here a 1/4
    # chance); a packet the node sends has the empty input interface, so `iifname != "eth0"`
    # holds for it in the output hook
    with bed(**PLAIN_BED) as b:
        b.load_nft(META_RANDOM)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353"])
        rs = detect.parse(b.node.run(["nft", "-j", "list", "ruleset"]).stdout)
        src = b.client_ip if in_iface else "10.1.0.1"
        res = trace(rs, b.model, make_packet("udp", src, "10.96.0.11:53", in_iface=in_iface))
        observed = b.send("udp", "10.96.0.11:53", 400, timeout=0.5, from_node=in_iface is None,
                          src=src if in_iface is None else None)
    assert_kernel_agrees(res.outcomes, observed)
    got = sorted((A.fmt_ip(o.dst), float(o.probability)) for o in res.outcomes)
    assert got == [("10.2.0.2", 0.25), ("10.2.0.3", 0.75)] and not any(o.unknown for o in res.outcomes)


# --------------------------------------------------------------------------- the tracer defects the kernel found
PHYSDEV = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -o eth1 -m physdev --physdev-out vethwe-bridge --physdev-is-bridged -j ACCEPT
-A FORWARD -m physdev --physdev-is-bridged -j ACCEPT
-A FORWARD -m physdev --physdev-out vethwe+ -j ACCEPT
-A FORWARD -m physdev --physdev-in eth0 -j ACCEPT
-A FORWARD -m physdev ! --physdev-is-bridged -p udp --dport 53 -j DROP
-A FORWARD -j REJECT
COMMIT
"""


@pytest.mark.parametrize(("proto", "expect"), [("udp", "DROP"), ("tcp", "REJECT")])
def test_physdev_never_matches_a_routed_packet(proto: str, expect: str) -> None:
    # a Weave-style FORWARD chain: routed packets carry no bridge ports, so only the inverted
    # `! --physdev-is-bridged` matches (the tracer used to assume every physdev match held)
    with bed(**PLAIN_BED) as b:
        b.load_iptables(PHYSDEV)
        b.serve(b.backend, proto, ["10.2.0.2:53"])
        outs = _check(b, PHYSDEV, proto, "10.2.0.2:53", 5, in_iface="eth0", src=b.client_ip, timeout=0.5)
    assert [o.verdict for o in outs] == [expect] and not outs[0].unknown


MASQ_SELF = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A OUTPUT -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-MARK-MASQ
-A OUTPUT -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.2.0.1:6443
-A OUTPUT -d 10.96.0.1/32 -p udp -m udp --dport 443 -j KUBE-MARK-MASQ
-A OUTPUT -d 10.96.0.1/32 -p udp -m udp --dport 443 -j DNAT --to-destination 10.2.0.1:6443
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE
COMMIT
"""


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_masquerade_to_the_node_itself_takes_the_first_global_address(proto: str) -> None:
    # a node process -> `kubernetes` service -> the API server on this node: the packet leaves by
    # lo, whose only address (127.0.0.1) has host scope, so the kernel's inet_select_addr falls
    # back to the first global address (eth0's), whatever the sender's own address was
    with bed(**PLAIN_BED) as b:
        b.load_iptables(MASQ_SELF)
        b.serve(b.node, proto, ["10.2.0.1:6443"])
        outs = _check(b, MASQ_SELF, proto, "10.96.0.1:443", 5, in_iface=None, src="10.2.0.1")
    assert [(o.masquerade, A.fmt_ip(o.src)) for o in outs] == [(True, "10.1.0.1")]


MASQ_VETH = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -o vx+ -j MASQUERADE
COMMIT
"""


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_masquerade_out_of_an_addressless_veth(proto: str) -> None:
    # a veth without an address (as some CNIs leave the host end): MASQUERADE takes the first
    # global address of the node (the tracer used to call this a drop)
    with bed(**PLAIN_BED) as b, L.netns("kpx") as pod:
        _veth(b.node, "vx0", pod, "eth0", "10.50.0.2/24")
        b.node.run(["ip", "route", "add", "10.50.0.0/24", "dev", "vx0"])
        pod.run(["ip", "route", "add", "default", "dev", "eth0"])
        b.model.interfaces["vx0"] = []
        b.model.routes.append(Route(A.ip4_to_int("10.50.0.0"), A.ip4_to_int("255.255.255.0"), "vx0"))
        b.load_iptables(MASQ_VETH)
        b.serve(pod, proto, ["10.50.0.2:53"])
        outs = _check(b, MASQ_VETH, proto, "10.50.0.2:53", 5, in_iface="eth0", src=b.client_ip)
    assert [(o.verdict, A.fmt_ip(o.src)) for o in outs] == [("ACCEPT", "10.1.0.1")]


def _veth(a: L.NetNS, a_if: str, b: L.NetNS, b_if: str, b_cidr: str) -> None:
    """A veth pair with an address only on b's end."""
    tmp_a, tmp_b = f"kx{os.getpid() % 10000}a", f"kx{os.getpid() % 10000}b"
    subprocess.run(["ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b], check=True, capture_output=True)
    for tmp, ns, name in ((tmp_a, a, a_if), (tmp_b, b, b_if)):
        subprocess.run(["ip", "link", "set", tmp, "netns", ns.name], check=True, capture_output=True)
        ns.run(["ip", "link", "set", tmp, "name", name])
        ns.run(["ip", "link", "set", name, "up"])
    b.run(["ip", "addr", "add", b_cidr, "dev", b_if])


# --------------------------------------------------------------------------- IPv6
KUBE_RANDOM6 = (FIX / "kube_random6.ip6tables-save").read_text()
V6_BED: BedSpec = {
    **PLAIN_BED, "v6": ("fd00:1::2/64", "fd00:1::1/64", "fd00:2::1/64", ["fd00:2::2/64", "fd00:2::3/64", "fd00:2::4/64"])
}


def test_ipv6_statistic_split_and_masquerade() -> None:
    with bed(**V6_BED) as b:
        b.load_iptables(KUBE_RANDOM6, "ip6tables-restore")
        b.serve(b.backend, "udp", ["[fd00:2::2]:5353", "[fd00:2::3]:5353", "[fd00:2::4]:5353"])
        outs = _check(b, KUBE_RANDOM6, "udp", "[fd00:96::10]:53", 1200, in_iface="eth0", src="fd00:1::2")
    assert sorted(float(o.probability) for o in outs) == [0.25, 0.25, 0.5]
    assert {(o.masquerade, A.fmt_ip(o.src, True)) for o in outs} == {(True, "fd00:2::1")}


def test_ipv6_from_the_node_itself() -> None:
    with bed(**V6_BED) as b:
        b.load_iptables(KUBE_RANDOM6, "ip6tables-restore")
        b.serve(b.backend, "udp", ["[fd00:2::2]:5353", "[fd00:2::3]:5353", "[fd00:2::4]:5353"])
        _check(b, KUBE_RANDOM6, "udp", "[fd00:96::10]:53", 600, in_iface=None, src="fd00:1::1")


@pytest.mark.parametrize(("proto", "expect"), [("tcp", "REJECT"), ("udp", "DROP")])
def test_ipv6_filter_verdicts(proto: str, expect: str) -> None:
    with bed(**V6_BED) as b:
        b.load_iptables(KUBE_RANDOM6, "ip6tables-restore")
        b.serve(b.backend, proto, ["[fd00:2::2]:9"])
        # the sender sees the ICMPv6 error only for the SYN retransmitted after 1 s (the first
        # one's error does not reach it on this kernel), so the wait is 3 s, not 0.5
        outs = _check(b, KUBE_RANDOM6, proto, "[fd00:2::2]:9", 3, in_iface="eth0", src="fd00:1::2",
                      timeout=3.0 if proto == "tcp" else 0.5)
    assert [o.verdict for o in outs] == [expect]


BRIDGED = """*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -o weave -p udp -m udp --dport 7001 -m physdev --physdev-out vethwe-bridge --physdev-is-bridged -j ACCEPT
-A FORWARD -p udp -m udp --dport 7002 -m physdev --physdev-in vethwepl1 ! --physdev-out vethwe+ -j ACCEPT
-A FORWARD -p udp -m udp --dport 7003 -m physdev --physdev-is-in --physdev-is-out -j ACCEPT
-A FORWARD -p udp -m udp --dport 7004 -m physdev ! --physdev-is-bridged -j ACCEPT
COMMIT
"""


def test_physdev_on_bridged_packets() -> None:
    # br_netfilter: a packet bridged from one port of `weave` to another crosses FORWARD with its
    # bridge ports known; the same physdev matches that never hold for a routed packet do here
    with L.netns("kpbn") as node, L.netns("kpb1") as pod, L.netns("kpb2") as peer:
        node.run(["ip", "link", "add", "weave", "type", "bridge"])
        node.run(["ip", "link", "set", "weave", "up"])
        for ns, port, ip in ((pod, "vethwepl1", "10.32.0.5/12"), (peer, "vethwe-bridge", "10.32.0.6/12")):
            _veth(node, port, ns, "eth0", ip)
            node.run(["ip", "link", "set", port, "master", "weave"])
        node.run(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"])
        node.run(["iptables-restore"], input=BRIDGED)
        model = Node.from_flags(ifaces=["weave=10.32.0.1/12"])
        rs = detect.parse(BRIDGED)
        sniff = peer.popen([*WIRE, "sniff", "eth0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert sniff.stdout is not None and sniff.stdout.readline().strip() == "ready"
        ports = (7001, 7002, 7003, 7004, 7005)
        pod.run([*WIRE, "send", json.dumps([["udp", "10.32.0.5", 42000 + p, "10.32.0.6", p] for p in ports])])
        sniff.terminate()
        out, _ = sniff.communicate(timeout=10)
    arrived = {json.loads(ln)["dport"] for ln in out.splitlines() if ln.startswith("{")}
    for p in ports:
        pkt = make_packet("udp", "10.32.0.5", f"10.32.0.6:{p}", in_iface="weave", physdev_in="vethwepl1",
                          physdev_out="vethwe-bridge")
        (o,) = trace(rs, model, pkt).outcomes
        assert (o.verdict == "ACCEPT") == (p in arrived), (p, o.verdict, arrived)
    assert arrived == {7001, 7003}
