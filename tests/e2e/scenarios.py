"""What a proxy must do to real packets, one function per behaviour, whoever puts the rules in.

Each scenario takes the cluster and a `load(objects)` that returns once the node's kernel has the
rules for those objects: the offline renderer loaded with iptables-restore (test_bed.py), or a
live `kubeproxy run` (`live_load`) to which the objects are published as manifest files
(test_live_proxy.py) or with `kubectl` through an API server (test_live_kubectl.py). The pods
answer with the destination they were reached at and the source they saw, so each assertion is
about what a pod really received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubeproxy.backends.conntrack import parse_flows
from kubeproxy.lab.builders import JSON, Port, endpoint_slice, service
from kubeproxy.lab.cluster import (
    CLIENT_EXTRA_IPS,
    CLIENT_IP,
    CLUSTER_CIDR,
    HEALTHZ_BIND,
    NODE_IP,
    ClusterError,
    HttpAnswer,
    MiniCluster,
    poll,
)

Load = Callable[[list[JSON]], None]
Scenario = Callable[[MiniCluster, Load], None]
# Puts the whole desired set of objects where the proxy reads them (files, or the API server).
Publish = Callable[[list[JSON]], object]

# Every change synced at once: the tests wait for rules, never for a period to pass.
PROXY_ARGS = ("--min-sync-period", "0s", "--cluster-cidr", CLUSTER_CIDR)


def live_load(c: MiniCluster, publish: Publish, start_proxy: Callable[[], object]) -> Load:
    """The `load` of a live proxy: publish node-1's Node and the objects, start the proxy on first
    use (after the first publish, so its first sync has them), and return once the node's rules
    show them."""

    def load(objs: list[JSON]) -> None:
        publish([c.node_object(), *objs])
        if c.proxy is None:
            start_proxy()
            c.wait_synced()
        c.wait_applied(objs)

    return load


HTTP = Port("http", 80, 8080)
DNS = Port("dns", 53, 5353, "UDP")
NODE_PORT = 30080
EXTERNAL_IP = "203.0.113.10"
LB_IP = "198.51.100.7"


# Probes that must reach both of two endpoints a random rule chooses between: a correct proxy
# misses one with odds 2 * 2^-30 = 2^-29 (2e-9) per check. With 20 (2^-19, 2e-6 a check) the
# checks below, run in every mode, by three loaders and in the VM, came to ~7e-5 a suite.
BOTH = 30


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
        got = c.request(proto, c.pods["c"], dst, count=BOTH)
        # both endpoints (see BOTH); no SNAT inside the cluster
        assert destinations(got) == at(c, "a", "b", port=port), got
        assert source_ips(got) == {c.pods["c"].ip}, got


def cluster_ip_from_the_node(c: MiniCluster, load: Load) -> None:
    load([service("web", "10.96.0.10", [HTTP]), endpoint_slice("web", c.backends("a", "b"), [HTTP])])
    got = c.request("tcp", c.node, "10.96.0.10:80", count=BOTH)
    assert destinations(got) == at(c, "a", "b"), got
    assert source_ips(got) == {NODE_IP}, got


def node_port_cluster_policy_masquerades(c: MiniCluster, load: Load) -> None:
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    load([service("web", "10.96.0.10", [port], type="NodePort"), endpoint_slice("web", c.backends("a", "r"), [port])])
    got = c.request("tcp", c.client, f"{NODE_IP}:{NODE_PORT}", count=BOTH)
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
        got = c.request(proto, c.client, f"{EXTERNAL_IP}:{port}", count=BOTH)
        assert destinations(got) == at(c, "a", "b", port=target), got
        assert source_ips(got) == {NODE_IP}, got


def load_balancer_source_ranges(c: MiniCluster, load: Load) -> None:
    allowed, denied = CLIENT_EXTRA_IPS[0], CLIENT_EXTRA_IPS[1]
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    svc = service("shop", "10.96.0.20", [port], type="LoadBalancer", load_balancer_ips=[LB_IP], source_ranges=[f"{allowed}/32"])
    load([svc, endpoint_slice("shop", c.backends("a", "b"), [port])])
    # both endpoints (see BOTH): with 10 probes, a random split missed one in 1 of 512 runs (CI saw it in the VM)
    got = c.request("tcp", c.client, f"{LB_IP}:80", count=BOTH, src_ip=allowed)
    assert destinations(got) == at(c, "a", "b"), got
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
        # e is one of two random choices, and the batch in flight when the rules changed counts
        # towards those 20 (as few as 10 had the choice: e missed ~1 run in 5,000): wait for e itself.
        poll("a probe answered by the new pod e", lambda: at(c, "e") <= destinations(scaled.results), timeout=60)
    assert unchanged.results and unchanged.failures() == [], unchanged.failures()
    assert destinations(unchanged.results) == at(c, "a")
    # done in that order, not even the scaled service fails a request
    assert scaled.failures() == [], scaled.failures()
    assert destinations(scaled.results) == b | at(c, "d", "e"), destinations(scaled.results)


UDP_FLOW_PORT = 40053  # one fixed source port: every probe is the same conntrack entry


def _flow_pinned_to(c: MiniCluster, pod: str) -> bool:
    """Whether the node's conntrack still holds the UDP_FLOW_PORT flow to the service, answered by `pod`."""
    listed = c.node.run(["conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.0.53"], check=False).stdout
    return any(f.orig_sport == UDP_FLOW_PORT and f.reply_src == c.pods[pod].ip for f in parse_flows(listed))


def udp_flow_moves_to_the_new_pod(c: MiniCluster, load: Load) -> None:
    def dns(*pods: str) -> list[JSON]:
        return [service("dns", "10.96.0.53", [DNS]), endpoint_slice("dns", c.backends(*pods), [DNS])]

    load(dns("a"))
    caller = c.pods["c"]
    assert destinations(c.request("udp", caller, "10.96.0.53:53", count=3, sport=UDP_FLOW_PORT)) == at(c, "a", port=5353)
    load(dns("b"))
    if c.proxy is not None:
        # The proxy deletes the stale entry after the sync whose rules `load` saw (as upstream), so
        # a probe sent at once could still meet it: wait for the deletion itself.
        poll("the proxy to delete the flow's conntrack entry to pod a", lambda: not _flow_pinned_to(c, "a"), timeout=60)
    c.remove_pod("a")
    # the flow's conntrack entry still says "DNAT to a": only its removal lets the flow reach b
    got = c.request("udp", caller, "10.96.0.53:53", count=3, sport=UDP_FLOW_PORT)
    assert destinations(got) == at(c, "b", port=5353), got


HEALTH_CHECK_NODE_PORT = 32000


def answer_eventually(c: MiniCluster, url: str, status: int, weight: int, timeout: float = 10) -> HttpAnswer:
    """GET `url` from the client until it answers `status` with `weight` local endpoints: a
    listener opens, and its count changes, just after the sync whose rules `load` waited for."""
    seen: list[str] = []

    def check() -> HttpAnswer | None:
        try:
            got = c.http_get(c.client, url)
        except ClusterError as exc:
            seen.append(str(exc))
            return None
        seen.append(f"{got.status} {got.headers} {got.body!r}")
        return got if (got.status, got.header("X-Load-Balancing-Endpoint-Weight")) == (status, str(weight)) else None

    try:
        return poll(f"{status} with weight {weight} from {url}", check, timeout=timeout, interval=0.1)
    except ClusterError as exc:
        raise AssertionError(f"{exc}; last answer: {seen[-1] if seen else 'none'}") from None


def health_check_node_port(c: MiniCluster, load: Load) -> None:
    port = Port("http", 80, 8080, node_port=NODE_PORT)

    def shop(*pods: str) -> list[JSON]:
        svc = service(
            "shop",
            "10.96.0.20",
            [port],
            type="LoadBalancer",
            load_balancer_ips=[LB_IP],
            external_traffic_policy="Local",
            health_check_node_port=HEALTH_CHECK_NODE_PORT,
        )
        return [svc, endpoint_slice("shop", c.backends(*pods), [port])]

    url = f"http://{NODE_IP}:{HEALTH_CHECK_NODE_PORT}/"
    load(shop("a", "r"))
    # a load balancer asks each node, from outside: this one has one local endpoint
    got = answer_eventually(c, url, 200, weight=1)
    assert got.header("Content-Type") == "application/json", got
    assert got.json() == {"service": {"namespace": "default", "name": "shop"}, "localEndpoints": 1, "serviceProxyHealthy": True}
    load(shop("a", "b", "r"))
    assert answer_eventually(c, url, 200, weight=2).json()["localEndpoints"] == 2
    load(shop("r"))
    # only node-2 serves: this node must be taken out of the pool
    health = answer_eventually(c, url, 503, weight=0)
    assert health.json()["localEndpoints"] == 0, health
    # and what the health check says is what the rules do: outside traffic is dropped here
    probes = c.request("tcp", c.client, f"{LB_IP}:80", count=2, timeout=0.5)
    if c.proxy_mode == "ipvs":
        # Upstream's IPVS mode (kubernetes#97081) sends it on to the remote endpoints, un-masqueraded
        # (so that pods here still reach the service): on a real node-2 the reply carries the pod's
        # address and the client discards it. This bed's node-1 routes r itself, so the reply returns.
        assert destinations(probes) == at(c, "r") and source_ips(probes) == {CLIENT_IP}, probes
    else:
        assert probes == ["timeout"] * 2, probes


def healthz_from_the_client(c: MiniCluster, load: Load) -> None:
    load([service("web", "10.96.0.10", [HTTP]), endpoint_slice("web", c.backends("a"), [HTTP])])
    port = HEALTHZ_BIND.rsplit(":", 1)[1]
    for path in ("/healthz", "/livez"):
        got = c.http_get(c.client, f"http://{NODE_IP}:{port}{path}")
        assert got.status == 200, got
        assert got.header("Content-Type") == "application/json", got
        doc = got.json()
        assert doc["healthy"] is True and doc["status"]["IPv4"]["healthy"] is True, doc
        assert {"lastUpdated", "currentTime"} <= set(doc), doc
        # only /healthz judges the node (a load balancer drains a node that is going away)
        assert doc.get("nodeEligible") is (True if path == "/healthz" else None), doc


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
# These need the proxy's health servers.
NEEDS_HEALTH_SERVERS: list[Scenario] = [health_check_node_port, healthz_from_the_client]
LIVE: list[Scenario] = ALL + NEEDS_CONNTRACK_CLEANUP + NEEDS_HEALTH_SERVERS
