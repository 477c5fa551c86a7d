"""nftables mode's localhost NodePorts (KubeProxyNFTablesLocalhostNodePorts, upstream v1.37):
`kubeproxy run` in the node namespace serves a TCP NodePort on 127.0.0.1 when the gate is on and
nodePortAddresses names loopback, rejects (and counts) a UDP one, and leaves 127.0.0.1 to the
kernel (connection refused) when the gate is off."""

from __future__ import annotations

import sys

import pytest

from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import _METRICS_GET, METRICS_BIND, NODE_IP, MiniCluster, poll
from tests.e2e import scenarios
from tests.e2e.scenarios import DNS, NODE_PORT, at, destinations
from tests.e2e.test_live_proxy import _has_run_command

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not _has_run_command(), reason="`kubeproxy run` is not available yet"),
]

GATE = "KubeProxyNFTablesLocalhostNodePorts"
UDP_NODE_PORT = 30053
LISTENERS = 'kubeproxy_nftables_localhost_nodeport_listeners{ip_family="IPv4"}'
REJECTED_UDP = 'kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="UDP"}'


@pytest.fixture
def proxy_mode() -> str:
    return "nftables"


def _metric(c: MiniCluster, sample: str) -> float | None:
    proc = c.node.run([sys.executable, "-c", _METRICS_GET, f"http://{METRICS_BIND}/metrics"], check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def _load(c: MiniCluster, gate: bool) -> None:
    http = Port("http", 80, 8080, node_port=NODE_PORT)
    dns = Port("dns", 53, 5353, "UDP", node_port=UDP_NODE_PORT)
    objs = [service("web", "10.96.0.10", [http, dns], type="NodePort"), endpoint_slice("web", c.backends("a", "b"), [http, DNS])]
    args = (*scenarios.PROXY_ARGS, "--nodeport-addresses", "localhost,primary", "--feature-gates", f"{GATE}={str(gate).lower()}")
    scenarios.live_load(c, c.write_manifests, lambda: c.start_proxy(*args))(objs)


def test_gate_on_serves_tcp_on_loopback_and_rejects_udp(cluster: MiniCluster) -> None:
    c = cluster
    _load(c, gate=True)
    poll("the loopback listener", lambda: _metric(c, LISTENERS) == 1 or None, timeout=15)
    got = c.request("tcp", c.node, f"127.0.0.1:{NODE_PORT}", count=20)
    assert destinations(got) == at(c, "a", "b"), got
    got = c.request("tcp", c.node, f"{NODE_IP}:{NODE_PORT}", count=20)  # the primary IP: the rules
    assert destinations(got) == at(c, "a", "b"), got
    got = c.request("udp", c.node, f"127.0.0.1:{UDP_NODE_PORT}", count=3)
    assert all(not isinstance(r, dict) for r in got), got  # refused, never answered
    assert (_metric(c, REJECTED_UDP) or 0) >= 1


def test_gate_off_leaves_loopback_nodeports_unserved(cluster: MiniCluster) -> None:
    c = cluster
    _load(c, gate=False)
    got = c.request("tcp", c.node, f"{NODE_IP}:{NODE_PORT}", count=5)
    assert destinations(got) <= at(c, "a", "b") and got, got  # the proxy is up and serving
    got = c.request("tcp", c.node, f"127.0.0.1:{NODE_PORT}", count=3)
    assert all(not isinstance(r, dict) for r in got), got  # the kernel refuses: nobody listens
    assert _metric(c, LISTENERS) is None
