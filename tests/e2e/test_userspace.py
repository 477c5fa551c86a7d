"""`kubeproxy run --proxy-mode userspace` in the node namespace: real packets through the relay.

The shared live scenarios assert that pods see the client's address; a relay cannot keep it
(every connection to a pod comes from the node), so this module has the userspace mode's own
versions of them, and reuses the shared ones that only look at where packets arrive.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import NODE_IP, MiniCluster
from tests.e2e import scenarios
from tests.e2e.scenarios import DNS, EXTERNAL_IP, HTTP, NODE_PORT, at, destinations, source_ips
from tests.e2e.test_live_proxy import _has_run_command

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not _has_run_command(), reason="`kubeproxy run` is not available yet"),
]

BULK = Port("bulk", 9000, 9000)
BULK_BYTES = 1 << 30  # 1 GiB
RESET = "error: Connection reset by peer"


@pytest.fixture
def proxy_mode() -> str:
    return "userspace"


# The bed's pods hang off unnumbered veths (as Calico's do), where REDIRECT has no address to
# send to: as upstream, a bind address makes the relay listen there and the rules DNAT to it.
ARGS = (*scenarios.PROXY_ARGS, "--bind-address", NODE_IP)


@pytest.fixture
def load(cluster: MiniCluster) -> scenarios.Load:
    return scenarios.live_load(cluster, cluster.write_manifests, lambda: cluster.start_proxy(*ARGS))


def not_the_client(c: MiniCluster, got: list[object], client_ip: str) -> None:
    # The relay connects from the node: the pods see one of its addresses, never the client's.
    assert client_ip not in source_ips(got), got


def test_cluster_ip_from_a_pod(cluster: MiniCluster, load: scenarios.Load) -> None:
    c = cluster
    load([service("web", "10.96.0.10", [HTTP, DNS]), endpoint_slice("web", c.backends("a", "b"), [HTTP, DNS])])
    for proto, dst, port in (("tcp", "10.96.0.10:80", 8080), ("udp", "10.96.0.10:53", 5353)):
        got = c.request(proto, c.pods["c"], dst, count=20)
        assert destinations(got) == at(c, "a", "b", port=port), got  # round robin reaches both
        not_the_client(c, got, c.pods["c"].ip)


def test_cluster_ip_from_the_node(cluster: MiniCluster, load: scenarios.Load) -> None:
    c = cluster
    load([service("web", "10.96.0.10", [HTTP, DNS]), endpoint_slice("web", c.backends("a", "b"), [HTTP, DNS])])
    for proto, dst, port in (("tcp", "10.96.0.10:80", 8080), ("udp", "10.96.0.10:53", 5353)):
        got = c.request(proto, c.node, dst, count=10)
        assert destinations(got) == at(c, "a", "b", port=port), got


def test_node_port_and_external_ip_from_the_client(cluster: MiniCluster, load: scenarios.Load) -> None:
    c = cluster
    port = Port("http", 80, 8080, node_port=NODE_PORT)
    udp = Port("dns", 53, 5353, "UDP")
    svc = service("web", "10.96.0.10", [port, udp], type="NodePort", external_ips=[EXTERNAL_IP])
    load([svc, endpoint_slice("web", c.backends("a", "r"), [port, udp])])
    got = c.request("tcp", c.client, f"{NODE_IP}:{NODE_PORT}", count=20)
    assert destinations(got) == at(c, "a", "r"), got
    for proto, dst, target in (("tcp", f"{EXTERNAL_IP}:80", 8080), ("udp", f"{EXTERNAL_IP}:53", 5353)):
        got = c.request(proto, c.client, dst, count=20)
        assert destinations(got) == at(c, "a", "r", port=target), got


def test_client_ip_affinity(cluster: MiniCluster, load: scenarios.Load) -> None:
    c = cluster
    svc = service("session", "10.96.0.30", [HTTP], affinity_timeout=600)
    load([svc, endpoint_slice("session", c.backends("a", "b"), [HTTP])])
    assert len(destinations(c.request("tcp", c.pods["c"], "10.96.0.30:80", count=15))) == 1
    assert len(destinations(c.request("tcp", c.node, "10.96.0.30:80", count=15))) == 1


def test_no_endpoints(cluster: MiniCluster, load: scenarios.Load) -> None:
    c = cluster
    load([service("gone", "10.96.0.40", [HTTP, DNS])])
    # TCP: the relay accepts and resets at once (a REJECT in the kernel modes): never a hang.
    assert c.request("tcp", c.pods["c"], "10.96.0.40:80", count=3, timeout=5) == [RESET] * 3
    # UDP: dropped, as upstream's userspace proxy did.
    assert c.request("udp", c.pods["c"], "10.96.0.40:53", count=2, timeout=0.5) == ["timeout"] * 2


def test_endpoints_change_under_traffic_without_a_failed_connection(cluster: MiniCluster, load: scenarios.Load) -> None:
    scenarios.endpoints_scale_under_traffic(cluster, load)


def test_udp_flow_moves_to_the_new_pod(cluster: MiniCluster, load: scenarios.Load) -> None:
    scenarios.udp_flow_moves_to_the_new_pod(cluster, load)


# A server that hashes everything it receives and, after the client's half-close, answers with
# the digest and the byte count: the answer only arrives if the relay passed the FIN on and
# kept the other direction open.
_HASH_SERVER = """
import hashlib, socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    h, n = hashlib.sha256(), 0
    while data := conn.recv(1 << 20):
        h.update(data); n += len(data)
    conn.sendall(f"{h.hexdigest()} {n}".encode()); conn.close()
"""

_HASH_CLIENT = """
import hashlib, json, os, socket, sys, time
dst, total = sys.argv[1].rsplit(":", 1), int(sys.argv[2])
s = socket.create_connection((dst[0], int(dst[1])), timeout=60)
block = os.urandom(1 << 20); h = hashlib.sha256(); sent = 0; t = time.perf_counter()
while sent < total:
    chunk = block[: total - sent]; s.sendall(chunk); h.update(chunk); sent += len(chunk)
    block = block[1:] + block[:1]  # vary the content, so a repeated or dropped block shows
s.shutdown(socket.SHUT_WR)
answer = b""
while data := s.recv(4096):
    answer += data
print(json.dumps({"sent": h.hexdigest(), "answer": answer.decode(), "seconds": time.perf_counter() - t}))
"""


def _hash_server(c: MiniCluster, pod: str) -> subprocess.Popen[str]:
    server = c.pods[pod].ns.popen([sys.executable, "-c", _HASH_SERVER, str(BULK.target)], stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


def _send(c: MiniCluster, total: int) -> dict[str, object]:
    proc = c.pods["c"].ns.run([sys.executable, "-c", _HASH_CLIENT, "10.96.0.90:9000", str(total)], timeout=60)
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_tcp_half_close(cluster: MiniCluster, load: scenarios.Load) -> None:
    _hash_server(cluster, "a")
    load([service("bulk", "10.96.0.90", [BULK]), endpoint_slice("bulk", cluster.backends("a"), [BULK])])
    got = _send(cluster, 1000)
    assert got["answer"] == f"{got['sent']} 1000"


def test_one_gigabyte_byte_for_byte(cluster: MiniCluster, load: scenarios.Load) -> None:
    _hash_server(cluster, "a")
    load([service("bulk", "10.96.0.90", [BULK]), endpoint_slice("bulk", cluster.backends("a"), [BULK])])
    got = _send(cluster, BULK_BYTES)
    assert got["answer"] == f"{got['sent']} {BULK_BYTES}", got
    print(f"1 GiB through the userspace relay in {got['seconds']:.2f} s")
