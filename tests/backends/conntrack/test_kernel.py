"""The reconciler against the real conntrack table, in namespaces.

A client namespace talks UDP to a "node" namespace whose nat rules (plain iptables-restore text,
as a sync would load) DNAT service X (a cluster IP and a NodePort) to pod A and service Y to pod
C; the pods are addresses on the node's loopback, answered by one UDP server that replies with
the address each datagram reached. Then X's rules are switched to pod B. The client keeps its
source port, so its flow stays on A through the old conntrack entry, until `reconcile` with a
view where B is X's only endpoint deletes that entry (and nothing of Y's).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from kubeproxy.backends.conntrack import NodePorts, Reconciler, list_flows, reconcile
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.lab.netns import NetNS, link, netns
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family

pytestmark = pytest.mark.root

POD_PORT = 5300
SVC_PORT = 53
NODE_PORT = 30053

# Answers each datagram with the local address it arrived at.
SERVER = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
for spec in sys.argv[1:]:
    host, _, port = spec.rpartition(":")
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, int(port)))
    sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        data, peer = key.fileobj.recvfrom(2048)
        key.fileobj.sendto(key.fileobj.getsockname()[0].encode(), peer)
"""

# One datagram from a fixed source port (so the same conntrack flow every time); prints the
# pod address that answered, or "timeout".
SEND = """
import socket, sys
src, sport, dst, dport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.settimeout(3)
    s.bind((src, sport))
    s.connect((dst, dport))
    s.send(b"probe")
    try:
        print(s.recv(2048).decode())
    except TimeoutError:
        print("timeout")
"""


@dataclass(frozen=True)
class Addrs:
    family: Family
    client: str
    node: str
    prefix: int
    pod_a: str
    pod_b: str
    pod_c: str
    vip_x: str
    vip_y: str
    vip_net: str


ADDRS = {
    Family.IPV4: Addrs(
        Family.IPV4, "10.0.0.2", "10.0.0.1", 24, "10.244.1.1", "10.244.2.2", "10.244.3.3",
        "10.96.0.10", "10.96.0.20", "10.96.0.0/16",
    ),
    Family.IPV6: Addrs(
        Family.IPV6, "fd00::2", "fd00::1", 64, "fd00:244::1", "fd00:244::2", "fd00:244::3",
        "fd00:96::10", "fd00:96::20", "fd00:96::/64",
    ),
}


def hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def nat_rules(a: Addrs, pod_x: str) -> str:
    """What a sync would load: X (cluster IP and NodePort) to pod_x, Y to pod C."""
    return (
        "*nat\n:PREROUTING ACCEPT [0:0]\n"
        f"-A PREROUTING -d {a.vip_x} -p udp --dport {SVC_PORT} -j DNAT --to-destination {hostport(pod_x, POD_PORT)}\n"
        f"-A PREROUTING -d {a.node} -p udp --dport {NODE_PORT} -j DNAT --to-destination {hostport(pod_x, POD_PORT)}\n"
        f"-A PREROUTING -d {a.vip_y} -p udp --dport {SVC_PORT} -j DNAT --to-destination {hostport(a.pod_c, POD_PORT)}\n"
        "COMMIT\n"
    )


def load(node: NetNS, a: Addrs, pod_x: str) -> None:
    node.run(["ip6tables-restore" if a.family == Family.IPV6 else "iptables-restore"], input=nat_rules(a, pod_x))


@contextmanager
def bed(family: Family) -> Iterator[tuple[NetNS, NetNS, Addrs]]:
    a = ADDRS[family]
    with netns("kpct") as client, netns("kpct") as node:
        v4 = ADDRS[Family.IPV4]
        link(client, "eth0", f"{v4.client}/{v4.prefix}", node, "eth0", f"{v4.node}/{v4.prefix}")
        if family == Family.IPV6:
            # No duplicate address detection: it would hold the addresses back for a second.
            for ns, ip in ((client, a.client), (node, a.node)):
                ns.run(["ip", "-6", "addr", "add", f"{ip}/{a.prefix}", "dev", "eth0", "nodad"])
        client.run(["ip", "route", "add", a.vip_net, "via", a.node])
        host_len = 128 if family == Family.IPV6 else 32
        for pod in (a.pod_a, a.pod_b, a.pod_c):
            # nodad: a tentative IPv6 address cannot be bound (EADDRNOTAVAIL) until DAD is over.
            node.run(["ip", "addr", "add", f"{pod}/{host_len}", "dev", "lo", *(["nodad"] if host_len == 128 else [])])
        server = node.popen(
            [sys.executable, "-c", SERVER, *(f"{pod}:{POD_PORT}" for pod in (a.pod_a, a.pod_b, a.pod_c))],
            stdout=subprocess.PIPE,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        load(node, a, a.pod_a)
        yield client, node, a


def send(client: NetNS, a: Addrs, sport: int, dst: str, dport: int) -> str:
    return client.run([sys.executable, "-c", SEND, a.client, str(sport), dst, str(dport)]).stdout.strip()


def view_after_switch(a: Addrs) -> NodeView:
    """X's only endpoint is now B; Y unchanged on C."""
    x = ServicePortName("default", "x", "dns", "UDP")
    y = ServicePortName("default", "y", "dns", "UDP")
    ip = valid_ip
    return NodeView(
        services={
            x: ServicePortInfo(x, ip(a.vip_x), SVC_PORT, "UDP", node_port=NODE_PORT),
            y: ServicePortInfo(y, ip(a.vip_y), SVC_PORT, "UDP"),
        },
        endpoints={
            x: [EndpointInfo(ip_text(valid_ip(a.pod_b)), POD_PORT)],
            y: [EndpointInfo(ip_text(valid_ip(a.pod_c)), POD_PORT)],
        },
    )


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
def test_stale_udp_flow_moves_to_the_new_endpoint_only_after_reconcile(family: Family) -> None:
    with bed(family) as (client, node, a):
        # Flows from fixed source ports: X by cluster IP, X by NodePort, Y.
        assert send(client, a, 40001, a.vip_x, SVC_PORT) == a.pod_a
        assert send(client, a, 40004, a.node, NODE_PORT) == a.pod_a
        assert send(client, a, 40002, a.vip_y, SVC_PORT) == a.pod_c

        load(node, a, a.pod_b)  # the sync that moved X to pod B

        # New flows follow the new rules; the existing ones are pinned to A by conntrack.
        assert send(client, a, 40003, a.vip_x, SVC_PORT) == a.pod_b
        assert send(client, a, 40001, a.vip_x, SVC_PORT) == a.pod_a
        assert send(client, a, 40004, a.node, NODE_PORT) == a.pod_a

        before = list_flows(family, node)
        assert {(f.orig_sport, f.reply_src) for f in before} == {
            (40001, a.pod_a),
            (40004, a.pod_a),
            (40002, a.pod_c),
            (40003, a.pod_b),
        }

        assert reconcile(view_after_switch(a), family, node) == 2

        after = list_flows(family, node)
        assert {(f.orig_sport, f.reply_src) for f in after} == {(40002, a.pod_c), (40003, a.pod_b)}
        y_flow = next(f for f in before if f.orig_sport == 40002)
        assert y_flow in after  # Y's entry survived untouched

        assert send(client, a, 40001, a.vip_x, SVC_PORT) == a.pod_b
        assert send(client, a, 40004, a.node, NODE_PORT) == a.pod_b
        assert send(client, a, 40002, a.vip_y, SVC_PORT) == a.pod_c

        # Nothing stale is left: a second pass deletes nothing (conntrack -D exits 1 then).
        assert Reconciler(node).reconcile(view_after_switch(a), family) == 0


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
@pytest.mark.parametrize("selected", [False, True], ids=["all-local", "nodeport-addresses"])
def test_node_port_cleanup_only_touches_flows_to_the_nodes_node_port_addresses(family: Family, selected: bool) -> None:
    """Issue 11, item 7: the node's own flow to another host on the NodePort's port number was
    never DNATed, so its reply source is no serving endpoint; upstream's any-destination NodePort
    filter deleted it. Only the stale flow to the node's address may go."""
    with bed(family) as (client, node, a):
        # Something on the client answers on the NodePort's number, as an outside DNS server
        # answers the node on 53 when a manifest says nodePort: 53.
        outside = client.popen([sys.executable, "-c", SERVER, f"{a.client}:{NODE_PORT}"], stdout=subprocess.PIPE)
        assert outside.stdout is not None and outside.stdout.readline().strip() == "ready"

        assert send(client, a, 40004, a.node, NODE_PORT) == a.pod_a  # X by NodePort, pinned to A
        own = node.run([sys.executable, "-c", SEND, a.node, "40010", a.client, str(NODE_PORT)]).stdout.strip()
        assert own == a.client  # the node's own flow out, not NATed

        load(node, a, a.pod_b)
        before = {(f.orig_dst, f.orig_sport, f.reply_src) for f in list_flows(family, node)}
        assert (a.node, 40004, a.pod_a) in before and (a.client, 40010, a.client) in before

        # Where the rules accept NodePorts: every local address (the kernel is asked), or
        # what --nodeport-addresses selected.
        node_ports = NodePorts(ips=(a.node,), all_local=False) if selected else NodePorts()
        assert Reconciler(node).reconcile(view_after_switch(a), family, node_ports) == 1

        after = {(f.orig_dst, f.orig_sport, f.reply_src) for f in list_flows(family, node)}
        assert (a.node, 40004, a.pod_a) not in after
        assert (a.client, 40010, a.client) in after  # the foreign flow survived
        assert send(client, a, 40004, a.node, NODE_PORT) == a.pod_b
