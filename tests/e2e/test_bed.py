"""The bed itself: every namespace reaches the others it should, it leaves nothing behind, and the
scenarios pass on the offline renderer's rules loaded into the node (test_live_proxy.py runs the
same scenarios against `kubeproxy run`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kubeproxy.lab.builders import JSON
from kubeproxy.lab.cluster import CLIENT_EXTRA_IPS, CLIENT_IP, CLUSTER_CIDR, NODE_IP, NODE_NAME, MiniCluster
from kubeproxy.model.proxy_config import ProxyConfig
from tests.e2e import scenarios

pytestmark = pytest.mark.root


def test_client_and_node_reach_each_other(cluster: MiniCluster) -> None:
    cluster.serve(cluster.node, "tcp", [f"{NODE_IP}:9000"])
    cluster.serve(cluster.client, "udp", [f"{CLIENT_IP}:9000"])
    for src in (CLIENT_IP, *CLIENT_EXTRA_IPS):
        got = cluster.request("tcp", cluster.client, f"{NODE_IP}:9000", src_ip=src)
        assert scenarios.source_ips(got) == {src}
    assert scenarios.destinations(cluster.request("udp", cluster.node, f"{CLIENT_IP}:9000")) == {f"{CLIENT_IP}:9000"}


def test_node_and_pods_reach_each_other(cluster: MiniCluster) -> None:
    cluster.serve(cluster.node, "tcp", [f"{NODE_IP}:9000"])
    for pod in cluster.pods.values():
        for proto, port in (("tcp", 8080), ("udp", 5353)):
            got = cluster.request(proto, cluster.node, f"{pod.ip}:{port}")
            assert scenarios.destinations(got) == {f"{pod.ip}:{port}"}
            assert scenarios.source_ips(got) == {NODE_IP}
        assert scenarios.source_ips(cluster.request("tcp", pod, f"{NODE_IP}:9000")) == {pod.ip}


def test_pods_reach_each_other_with_their_own_addresses(cluster: MiniCluster) -> None:
    a, r = cluster.pods["a"], cluster.pods["r"]
    for src, dst in ((a, r), (r, a), (cluster.pods["c"], cluster.pods["b"])):
        got = cluster.request("udp", src, f"{dst.ip}:5353")
        assert got == [{"dst": f"{dst.ip}:5353", "src": got[0]["src"]}]
        assert scenarios.source_ips(got) == {src.ip}


def test_the_client_cannot_reach_pods_directly(cluster: MiniCluster) -> None:
    # like an outside host: it routes only service and external ranges to the node
    got = cluster.request("tcp", cluster.client, f"{cluster.pods['a'].ip}:8080", timeout=0.5)
    assert got != [] and not isinstance(got[0], dict)


def test_teardown_removes_namespaces_and_processes() -> None:
    with MiniCluster.build(pods=("a",), remote_pods=()) as bed:
        names = [bed.node.name, bed.client.name, bed.pods["a"].ns.name]
        pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", names[2]], capture_output=True, text=True).stdout.split()]
        assert pids, "the pod's probes run in its namespace"
        with pytest.raises(RuntimeError, match="boom"), MiniCluster.build(pods=("x",), remote_pods=()) as failing:
            names.append(failing.pods["x"].ns.name)
            raise RuntimeError("boom")
        assert failing.pods == {}
    listed = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not listed & set(names)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


@pytest.fixture
def load(cluster: MiniCluster) -> scenarios.Load:
    cfg = ProxyConfig(hostname_override=NODE_NAME, cluster_cidr=(CLUSTER_CIDR,))

    def load(objs: list[JSON]) -> None:
        cluster.load_rendered([cluster.node_object(), *objs], cfg)

    return load


@pytest.mark.parametrize("scenario", scenarios.ALL, ids=lambda f: f.__name__)
def test_rendered_rules(cluster: MiniCluster, load: scenarios.Load, scenario: scenarios.Scenario) -> None:
    scenario(cluster, load)


def test_udp_flow_sticks_to_its_dead_pod_without_conntrack_cleanup(cluster: MiniCluster, load: scenarios.Load) -> None:
    """Why the live proxy's UDP scenario is a real test: rules alone do not move an existing flow."""
    with pytest.raises(AssertionError, match="timeout"):
        scenarios.udp_flow_moves_to_the_new_pod(cluster, load)
    # what the proxy's clean-up must do: forget the flows that were DNATed to the removed endpoint
    cluster.node.run(["conntrack", "-D", "-p", "udp", "--orig-dst", "10.96.0.53"])
    got = cluster.request("udp", cluster.pods["c"], "10.96.0.53:53", sport=scenarios.UDP_FLOW_PORT)
    assert scenarios.destinations(got) == scenarios.at(cluster, "b", port=5353)
