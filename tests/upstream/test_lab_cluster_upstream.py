"""`kubeproxy lab cluster --control-plane upstream`: the multi-node lab against upstream's etcd,
kube-apiserver and kube-controller-manager, our proxy on every node as deployed (deploy/'s RBAC,
a ServiceAccount token, TLS verified). The pod is reported by the lab kubelet and its endpoint
put in the Service's EndpointSlice by upstream's controller; the kernel answers for the ClusterIP
and the NodePort."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.cluster import kubeproxy_binary
from kubeproxy.lab.multinode import MultiNodeCluster
from kubeproxy.lab.multinode.bed import CLIENT_IP
from kubeproxy.lab.multinode.upstream import UpstreamControl

pytestmark = pytest.mark.root

CLUSTER_IP = "10.96.0.80"
NODE_PORT = 30080


def _dsts(results: list[Any]) -> list[str]:
    return [r["dst"] if isinstance(r, dict) else r for r in results]


def test_cluster_ip_and_node_port_answer_with_upstreams_control_plane(upstream_binaries: Path) -> None:
    with MultiNodeCluster.build(2, control_plane="upstream") as bed:
        assert isinstance(bed.api, UpstreamControl)
        pod = bed.add_pod("web-0", "node-1")
        bed.report_pod("web-0", {"app": "web"})
        port = builders.Port("http", 80, 8080, node_port=NODE_PORT)
        bed.apply(builders.service("web", CLUSTER_IP, [port], type="NodePort", spec={"selector": {"app": "web"}}))
        bed.start_proxies()
        bed.wait_synced(timeout=60)
        endpoint = f"{pod.ip}:8080"
        bed.wait_endpoints("default/web:http", {name: [endpoint] for name in bed.nodes}, timeout=60)
        # The slice the proxies programmed is upstream's controller's, not one the lab wrote.
        slices = bed.api.cp.api.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                                    params={"labelSelector": "kubernetes.io/service-name=web"}).json()["items"]  # fmt: skip
        managers = {s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] for s in slices}
        assert managers == {"endpointslice-controller.k8s.io"}

        # The ClusterIP from the other node (to a remote pod), the NodePort from the client.
        via_cluster_ip = bed.request(bed.node("node-2").ns, f"{CLUSTER_IP}:80", count=3)
        assert _dsts(via_cluster_ip) == [endpoint] * 3, via_cluster_ip
        via_node_port = bed.request(bed.client, f"{bed.node('node-2').ip}:{NODE_PORT}", count=3)
        assert _dsts(via_node_port) == [endpoint] * 3, via_node_port
        # Cluster traffic policy: masqueraded to the node it came in by, so the answer goes back through it.
        assert {r["src"].rpartition(":")[0] for r in via_node_port} == {bed.node("node-2").ip} != {CLIENT_IP}


def test_the_command_moves_a_pod_through_upstreams_controller(upstream_binaries: Path) -> None:
    """`kubeproxy lab cluster --control-plane upstream`: the move is pods reported and deleted
    through the API, the balancer's count has no failure, and no namespace is left."""
    argv = [kubeproxy_binary(), "lab", "cluster", "--control-plane", "upstream", "--moves", "1", "--rate", "20"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "upstream's v1.37.2 control plane at https://192.168.10.2:6443" in proc.stdout, proc.stdout
    assert "move 1: web-0 -> web-1 on node-2" in proc.stdout, proc.stdout
    summary = re.search(r"load balancer: (\d+) requests, (\d+) failed", proc.stdout)
    assert summary is not None and int(summary[1]) > 0 and summary[2] == "0", proc.stdout
    netns = set(re.findall(r"(?:netns|\(in) ([\w-]+)", proc.stdout))
    assert len(netns) == 6, proc.stdout  # the control plane's, three nodes, the client and the balancer
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert netns.isdisjoint(line.split()[0] for line in listed.splitlines() if line.strip()), listed


def test_the_command_refuses_dual_stack_with_upstream() -> None:
    argv = [kubeproxy_binary(), "lab", "cluster", "--control-plane", "upstream", "--dual-stack"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--control-plane upstream runs IPv4 only" in proc.stderr, proc.stderr
