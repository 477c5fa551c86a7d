"""What a proxy must do to real packets, one function per behaviour, whoever puts the rules in.

Each scenario takes the cluster and a `load(objects)` that returns once the node's kernel has the
rules for those objects: the offline renderer loaded with iptables-restore (test_bed.py) or a
live `kubeproxy run` reading the manifests (test_live_proxy.py). The pods answer with the
destination they were reached at and the source they saw, so each assertion is about what a
pod really received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubeproxy.lab.cluster import CLIENT_EXTRA_IPS, CLIENT_IP, NODE_IP, MiniCluster
from kubeproxy.lab.objects import JSON, Port, endpoint_slice, service

Load = Callable[[list[JSON]], None]
Scenario = Callable[[MiniCluster, Load], None]

HTTP = Port("http", 80, 8080)
DNS = Port("dns", 53, 5353, "UDP")
NODE_PORT = 30080
EXTERNAL_IP = "203.0.113.10"
LB_IP = "198.51.100.7"


def destinations(results: list[Any]) -> set[str]:
    """Where the probes arrived (`ip:port`); a refusal or a timeout counts as itself."""
    return {r["dst"] if isinstance(r, dict) else r for r in results}


def source_ips(results: list[Any]) -> set[str]:
    """The source addresses the receivers saw."""
    return {r["src"].rsplit(":", 1)[0] if isinstance(r, dict) else r for r in results}


def at(c: MiniCluster, *pods: str, port: int = 8080) -> set[str]:
    return {f"{c.pods[p].ip}:{port}" for p in pods}


def cluster_ip_from_a_pod(c: MiniCluster, load: Load) -> None:
    load([service("web", "10.96.0.10", [HTTP, DNS]), endpoint_slice("web", c.backends("a", "b"), [HTTP, DNS])])
    for proto, dst, port in (("tcp", "10.96.0.10:80", 8080), ("udp", "10.96.0.10:53", 5353)):
        got = c.request(proto, c.pods["c"], dst, count=20)
        # both endpoints in 20 tries (a miss has odds 2^-19); no SNAT inside the cluster
        assert destinations(got) == at(c, "a", "b", port=port), got
        assert source_ips(got) == {c.pods["c"].ip}, got


def cluster_ip_from_the_node(c: MiniCluster, load: Load) -> None:
    load([service("web", "10.96.0.10", [HTTP]), endpoint_slice("web", c.backends("a", "b"), [HTTP])])
    got = c.request("tcp", c.node, "10.96.0.10:80", count=20)
    assert destinations(got) == at(c, "a", "b"), got
    assert source_ips(got) == {NODE_IP}, got


def node_port_cluster_policy_masquerades(c: MiniCluster, load: Load) -> None:
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    load([service("web", "10.96.0.10", [port], type="NodePort"), endpoint_slice("web", c.backends("a", "r"), [port])])
    got = c.request("tcp", c.client, f"{NODE_IP}:{NODE_PORT}", count=20)
    # the remote endpoint is used too, so the node must SNAT for the reply to come back through it
    assert destinations(got) == at(c, "a", "r"), got
    assert source_ips(got) == {NODE_IP}, got


def node_port_local_policy_keeps_the_client(c: MiniCluster, load: Load) -> None:
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    svc = service("web", "10.96.0.10", [port], type="NodePort", external_traffic_policy="Local")
    load([svc, endpoint_slice("web", c.backends("a", "r"), [port])])
    for src in (CLIENT_IP, CLIENT_EXTRA_IPS[0]):
        got = c.request("tcp", c.client, f"{NODE_IP}:{NODE_PORT}", count=10, src_ip=src)
        # only the local endpoint, and it sees the real client
        assert destinations(got) == at(c, "a"), got
        assert source_ips(got) == {src}, got


def external_ip_from_the_client(c: MiniCluster, load: Load) -> None:
    load(
        [
            service("web", "10.96.0.10", [HTTP, DNS], external_ips=[EXTERNAL_IP]),
            endpoint_slice("web", c.backends("a", "b"), [HTTP, DNS]),
        ]
    )
    for proto, port, target in (("tcp", 80, 8080), ("udp", 53, 5353)):
        got = c.request(proto, c.client, f"{EXTERNAL_IP}:{port}", count=20)
        assert destinations(got) == at(c, "a", "b", port=target), got
        assert source_ips(got) == {NODE_IP}, got


def load_balancer_source_ranges(c: MiniCluster, load: Load) -> None:
    allowed, denied = CLIENT_EXTRA_IPS[0], CLIENT_EXTRA_IPS[1]
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    svc = service("shop", "10.96.0.20", [port], type="LoadBalancer", load_balancer_ips=[LB_IP], source_ranges=[f"{allowed}/32"])
    load([svc, endpoint_slice("shop", c.backends("a", "b"), [port])])
    assert destinations(c.request("tcp", c.client, f"{LB_IP}:80", count=10, src_ip=allowed)) == at(c, "a", "b")
    # outside the ranges: dropped, not refused (a firewall, not a missing service)
    assert c.request("tcp", c.client, f"{LB_IP}:80", count=2, src_ip=denied, timeout=0.5) == ["timeout"] * 2


def hairpin(c: MiniCluster, load: Load) -> None:
    load([service("web", "10.96.0.10", [HTTP, DNS]), endpoint_slice("web", c.backends("a"), [HTTP, DNS])])
    for proto, dst, port in (("tcp", "10.96.0.10:80", 8080), ("udp", "10.96.0.10:53", 5353)):
        got = c.request(proto, c.pods["a"], dst, count=3)
        # a pod reaching itself through its service: masqueraded, or its own reply would bypass the DNAT
        assert destinations(got) == at(c, "a", port=port), got
        assert source_ips(got) == {NODE_IP}, got


def client_ip_affinity_sticks(c: MiniCluster, load: Load) -> None:
    svc = service("session", "10.96.0.30", [HTTP], affinity_timeout=600)
    load([svc, endpoint_slice("session", c.backends("a", "b"), [HTTP])])
    first = c.request("tcp", c.pods["c"], "10.96.0.30:80", count=15)
    assert len(destinations(first)) == 1, first
    # another client is balanced independently, and sticks too
    assert len(destinations(c.request("tcp", c.node, "10.96.0.30:80", count=15))) == 1


def no_endpoints_is_refused(c: MiniCluster, load: Load) -> None:
    load([service("gone", "10.96.0.40", [HTTP, DNS])])
    for proto, dst in (("tcp", "10.96.0.40:80"), ("udp", "10.96.0.40:53")):
        # refused at once (REJECT), never a timeout
        assert c.request(proto, c.pods["c"], dst, count=3, timeout=5) == ["refused"] * 3


def endpoints_scale_under_traffic(c: MiniCluster, load: Load) -> None:
    steady = [service("steady", "10.96.0.60", [HTTP]), endpoint_slice("steady", c.backends("a"), [HTTP])]

    def web(*pods: str) -> list[JSON]:
        return [*steady, service("web", "10.96.0.10", [HTTP]), endpoint_slice("web", c.backends(*pods), [HTTP])]

    load(web("b"))
    b = at(c, "b")
    caller = c.pods["c"]
    with c.traffic("tcp", caller, "10.96.0.60:80") as unchanged, c.traffic("tcp", caller, "10.96.0.10:80") as scaled:
        scaled.wait_for_more(10)
        c.add_pod("d")  # up: the pod serves before its endpoint is published
        load(web("b", "d"))
        scaled.wait_for_more(20)
        load(web("d"))  # down: the endpoint goes first, the pod afterwards
        scaled.wait_for_more(10)
        c.remove_pod("b")
        c.add_pod("e")
        load(web("d", "e"))
        scaled.wait_for_more(20)
    assert unchanged.results and unchanged.failures() == [], unchanged.failures()
    assert destinations(unchanged.results) == at(c, "a")
    # done in that order, not even the scaled service fails a request
    assert scaled.failures() == [], scaled.failures()
    assert destinations(scaled.results) == b | at(c, "d", "e"), destinations(scaled.results)


UDP_FLOW_PORT = 40053  # one fixed source port: every probe is the same conntrack entry


def udp_flow_moves_to_the_new_pod(c: MiniCluster, load: Load) -> None:
    def dns(*pods: str) -> list[JSON]:
        return [service("dns", "10.96.0.53", [DNS]), endpoint_slice("dns", c.backends(*pods), [DNS])]

    load(dns("a"))
    caller = c.pods["c"]
    assert destinations(c.request("udp", caller, "10.96.0.53:53", count=3, sport=UDP_FLOW_PORT)) == at(c, "a", port=5353)
    load(dns("b"))
    c.remove_pod("a")
    # the flow's conntrack entry still says "DNAT to a": only its removal lets the flow reach b
    got = c.request("udp", caller, "10.96.0.53:53", count=3, sport=UDP_FLOW_PORT)
    assert destinations(got) == at(c, "b", port=5353), got


ALL: list[Scenario] = [
    cluster_ip_from_a_pod,
    cluster_ip_from_the_node,
    node_port_cluster_policy_masquerades,
    node_port_local_policy_keeps_the_client,
    external_ip_from_the_client,
    load_balancer_source_ranges,
    hairpin,
    client_ip_affinity_sticks,
    no_endpoints_is_refused,
    endpoints_scale_under_traffic,
]
# These need the proxy's conntrack clean-up; the offline renderer alone cannot pass them.
NEEDS_CONNTRACK_CLEANUP: list[Scenario] = [udp_flow_moves_to_the_new_pod]
