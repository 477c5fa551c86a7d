"""nftables mode's default nodePortAddresses (`primary`, as upstream) in a real kernel: a node
with two addresses (the Node's InternalIP and ExternalIP) answers NodePorts on its node IP only.

The node also runs its own listener on the NodePort: a packet the rules do not take reaches it,
so both outcomes are positive answers (no waiting to show that nothing happened).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import validate
from tests.netfilter.kernel_bed import bed

pytestmark = pytest.mark.root

NODE_IP, OTHER_IP, BACKEND = "172.16.0.1", "172.16.0.9", "10.244.1.10"
OBJECTS = f"""
apiVersion: v1
kind: Node
metadata: {{name: node-a}}
status:
  addresses:
  - {{type: InternalIP, address: {NODE_IP}}}
  - {{type: ExternalIP, address: {OTHER_IP}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: ns1}}
spec:
  type: NodePort
  clusterIP: 10.96.10.10
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: ns1
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- addresses: [{BACKEND}]
  conditions: {{ready: true}}
  nodeName: node-b
ports: [{{name: http, port: 8080, protocol: TCP}}]
"""


def _state(tmp_path: Path) -> ClusterState:
    path = tmp_path / "objects.yaml"
    path.write_text(OBJECTS)
    state, warnings = build_state(r.obj for r in load_manifests([path]))
    assert not warnings
    return state


@pytest.mark.parametrize(
    ("nodeport_addresses", "other_ip_reaches"),
    [((), "node"), (("all",), "backend"), (("primary", f"{OTHER_IP}/32"), "backend")],
    ids=["default-primary", "all", "primary-and-cidr"],
)
def test_nodeports_answer_where_nodeport_addresses_say(
    tmp_path: Path, nodeport_addresses: tuple[str, ...], other_ip_reaches: str
) -> None:
    cfg = validate(ProxyConfig(mode="nftables", hostname_override="node-a", cluster_cidr=("10.244.0.0/16",),
                               nodeport_addresses=nodeport_addresses))
    text = render_nftables(_state(tmp_path), cfg, service_cidrs=("10.96.0.0/16",)).rendering.text()
    with bed("172.16.0.2/24", ("eth0", f"{NODE_IP}/24"), ("eth1", "10.244.0.1/16"), [f"{BACKEND}/16"]) as b:
        b.node.run(["ip", "addr", "add", f"{OTHER_IP}/24", "dev", "eth0"])
        b.load_nft(text)
        b.serve(b.backend, "tcp", [f"{BACKEND}:8080"])
        b.serve(b.node, "tcp", ["0.0.0.0:30080"])
        at_node_ip = b.send("tcp", f"{NODE_IP}:30080", 3)
        at_other_ip = b.send("tcp", f"{OTHER_IP}:30080", 3)
    reached = {"backend": f"{BACKEND}:8080", "node": f"{OTHER_IP}:30080"}
    assert [r["dst"] for r in at_node_ip] == [f"{BACKEND}:8080"] * 3
    assert [r["dst"] for r in at_other_ip] == [reached[other_ip_reaches]] * 3
