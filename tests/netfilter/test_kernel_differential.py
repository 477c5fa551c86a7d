"""The kernel is the oracle: load a ruleset in a namespace, send real packets, compare with the tracer.

Each test builds client -- node -- backends namespaces, loads the rules into the node with
iptables-restore or nft -f, sends UDP/TCP probes (one new connection each) and checks that what
the receivers saw (destination, source address), a reject, or silence, is what the tracer
predicted, and, for random rules, as often as it predicted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.netfilter import detect
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace
from tests.netfilter.kernel_bed import assert_kernel_agrees, bed

pytestmark = pytest.mark.root
FIX = Path(__file__).parent / "fixtures"

SEED_BED = {
    "client_ip": "10.5.6.2/24",
    "node_front": ("eth3", "10.5.6.29/24"),
    "node_back": ("docker0", "10.100.13.1/24"),
    "backends": ["10.100.13.3/24"],
}


def _check(b, rules_text: str, proto: str, dst: str, count: int, *, in_iface: str | None, src: str,
           timeout: float = 1.0) -> list:  # type: ignore[no-untyped-def]
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
    with bed(**SEED_BED) as b:  # type: ignore[arg-type]
        b.load_iptables(text)
        b.serve(b.backend, proto, ["10.100.13.3:53"])
        outs = _check(b, text, proto, dst, 20, in_iface="eth3", src=b.client_ip)
    # the seed's finding: the pod sees the node's docker0 address, not the client
    assert [o.masquerade for o in outs] == [True]


def test_seed000_manual_dnat_keeps_the_client_address() -> None:
    text = (FIX / "seed000_manual_dnat.iptables-save").read_text()
    with bed(**SEED_BED) as b:  # type: ignore[arg-type]
        b.load_iptables(text)
        b.serve(b.backend, "udp", ["10.100.13.3:53"])
        outs = _check(b, text, "udp", "10.5.6.29:53", 20, in_iface="eth3", src=b.client_ip)
    assert [o.masquerade for o in outs] == [False]


KUBE_RANDOM = (FIX / "kube_random.iptables-save").read_text()
PLAIN_BED = {
    "client_ip": "10.1.0.2/24",
    "node_front": ("eth0", "10.1.0.1/24"),
    "node_back": ("eth1", "10.2.0.1/24"),
    "backends": ["10.2.0.2/24", "10.2.0.3/24", "10.2.0.4/24"],
}


def test_statistic_split_matches_the_kernel_distribution() -> None:
    # deliberately uneven (1/2, 1/4, 1/4), so that a tracer that spread evenly would fail
    with bed(**PLAIN_BED) as b:  # type: ignore[arg-type]
        b.load_iptables(KUBE_RANDOM)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353", "10.2.0.4:5353"])
        outs = _check(b, KUBE_RANDOM, "udp", "10.96.0.10:53", 1500, in_iface="eth0", src=b.client_ip)
    assert sorted(float(o.probability) for o in outs) == [0.25, 0.25, 0.5]
    assert all(o.masquerade for o in outs)


def test_from_host_output_dnat_then_masquerade() -> None:
    with bed(**PLAIN_BED) as b:  # type: ignore[arg-type]
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
    with bed(**PLAIN_BED) as b:  # type: ignore[arg-type]
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
    with bed(**PLAIN_BED) as b:  # type: ignore[arg-type]
        b.load_iptables(CALICO)
        b.serve(b.backend, "udp", ["10.2.0.2:7005", "10.2.0.2:7100", "10.2.0.2:7200", "10.2.0.2:7300"])
        outs = _check(b, CALICO, "udp", dst, count, in_iface="eth0", src=b.client_ip, timeout=0.5)
    assert [o.verdict for o in outs] == [expect]


NFT = (FIX / "nft_numgen.nft").read_text()


def test_nftables_numgen_vmap_distribution_and_reject() -> None:
    with bed(**PLAIN_BED) as b:  # type: ignore[arg-type]
        b.load_nft(NFT)
        b.serve(b.backend, "udp", ["10.2.0.2:5353", "10.2.0.3:5353", "10.2.0.4:6000"])
        json_text = b.node.run(["nft", "-j", "list", "ruleset"]).stdout
        rs = detect.parse(json_text)
        res = trace(rs, b.model, make_packet("udp", b.client_ip, "10.96.0.10:53", in_iface="eth0"))
        observed = b.send("udp", "10.96.0.10:53", 800, timeout=0.5)
    assert_kernel_agrees(res.outcomes, observed)
    got = sorted((o.verdict, float(o.probability)) for o in res.outcomes)
    assert got == [("ACCEPT", 0.25), ("ACCEPT", 0.5), ("REJECT", 0.25)]
