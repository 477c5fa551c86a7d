"""Which source ports the kernel's MASQUERADE picks: the range doctor's SNAT bound counts.

doctor takes 1024-65535 for a MASQUERADE without --to-ports, and the rule's range otherwise; the
node's net.ipv4.ip_local_port_range (the ephemeral range of its own sockets) plays no part. Checked
on this kernel in a namespace: a sender whose port would be kept if it were free, and one whose
port is taken, under a narrowed ip_local_port_range.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from kubeproxy.lab import netns as L

pytestmark = pytest.mark.root

NODE, PEER, CLIENT = "10.9.0.1", "10.9.0.2", "10.9.1.1"
EPHEMERAL = (40000, 40099)
# Two datagrams from CLIENT:5000 and one from NODE:5000 (which takes port 5000 first, unmasqueraded).
SEND = f"""
import socket
for src in (("{NODE}", 5000), ("{CLIENT}", 5000), ("{CLIENT}", 5001)):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(src)
    s.sendto(b"x", ("{PEER}", 53))
"""


@pytest.fixture
def node() -> Iterator[L.NetNS]:
    with L.netns("kpmasq") as node, L.netns("kpmasqpeer") as peer:
        L.link(node, "eth0", f"{NODE}/24", peer, "eth0", f"{PEER}/24")
        node.run(["ip", "addr", "add", f"{CLIENT}/32", "dev", "lo"])
        node.run(["sysctl", "-qw", f"net.ipv4.ip_local_port_range={EPHEMERAL[0]} {EPHEMERAL[1]}"])
        yield node


def _masqueraded_ports(node: L.NetNS, *target: str) -> dict[int, int]:
    """Original source port -> the port the node's address sends from, for CLIENT's flows."""
    node.run(["iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", CLIENT, "-p", "udp", "-j", "MASQUERADE", *target])
    node.run(["python3", "-c", SEND])
    out = node.run(["conntrack", "-L", "-p", "udp", "-s", CLIENT]).stdout
    flow = re.compile(r"sport=(\d+) dport=53 .*?dst=" + re.escape(NODE) + r" sport=53 dport=(\d+)")
    got = {int(m[1]): int(m[2]) for m in flow.finditer(out)}
    assert set(got) == {5000, 5001}, out
    return got


def test_masquerade_without_to_ports_ignores_the_ephemeral_range(node: L.NetNS) -> None:
    got = _masqueraded_ports(node)
    # 5001 is free and >= 1024: kept, though it lies outside the node's ephemeral range
    assert got[5001] == 5001
    # 5000 is taken by the node's own flow: remapped into 1024-65535, not into the ephemeral range
    assert got[5000] != 5000 and 1024 <= got[5000] <= 65535


def test_to_ports_confines_masquerade_to_its_range(node: L.NetNS) -> None:
    got = _masqueraded_ports(node, "--to-ports", "20000-20009")
    assert all(20000 <= p <= 20009 for p in got.values()), got
