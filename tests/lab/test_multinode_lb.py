"""The multi-node lab's load balancer (kubeproxy/lab/multinode/lb.py), without root: two "nodes"
on loopback addresses (127.0.0.2 and 127.0.0.3), each with a health endpoint whose answer the
test sets and a TCP server answering as the lab's probe does."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.lab.multinode.lb import Balancer, Target, http_status, probe

NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}


@dataclass
class FakeNode:
    ip: str
    status: int = 200
    servers: list[socketserver.BaseServer] = field(default_factory=list)


def _loopback_alias_works(ip: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((ip, 0))
    except OSError:
        return False
    return True


@contextmanager
def fake_node(ip: str, health_port: int = 0, service_port: int = 0) -> Iterator[tuple[FakeNode, int, int]]:
    """A node on `ip`: health on one port (answering `node.status`), the service on another
    (any free ones by default; NodePorts are the same on every node, so pass the first's)."""
    node = FakeNode(ip)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(node.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class Service(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            here, peer = self.request.getsockname(), self.client_address
            self.request.sendall(json.dumps({"dst": f"{here[0]}:{here[1]}", "src": f"{peer[0]}:{peer[1]}"}).encode())

    health = http.server.ThreadingHTTPServer((ip, health_port), Health)
    service = socketserver.ThreadingTCPServer((ip, service_port), Service)
    node.servers = [health, service]
    for server in node.servers:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield node, health.server_address[1], service.server_address[1]
    finally:
        for server in node.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def two_nodes() -> Iterator[dict[str, tuple[FakeNode, int, int]]]:
    if not all(_loopback_alias_works(ip) for ip in NODES.values()):
        pytest.skip("127.0.0.2/127.0.0.3 are not usable here (loopback is not 127.0.0.0/8)")
    with fake_node(NODES["node-a"]) as a, fake_node(NODES["node-b"], a[1], a[2]) as b:
        yield {"node-a": a, "node-b": b}


def test_http_status_and_probe_report_what_happened(two_nodes: dict[str, tuple[FakeNode, int, int]]) -> None:
    node, health_port, service_port = two_nodes["node-a"]
    node.status = 503
    assert http_status(node.ip, health_port, "/healthz", 1.0) == 503
    answer = probe(node.ip, service_port, 1.0)
    assert answer["ok"] and answer["answer"]["dst"] == f"{node.ip}:{service_port}"
    node.servers[1].shutdown()
    node.servers[1].server_close()  # nothing listens any more
    assert probe(node.ip, service_port, 1.0) == {"ok": False, "error": "refused"}


def test_the_balancer_sends_only_to_nodes_that_pass_and_follows_changes(two_nodes: dict[str, tuple[FakeNode, int, int]]) -> None:
    a, health_port, service_port = two_nodes["node-a"]
    b = two_nodes["node-b"][0]
    records: list[dict[str, Any]] = []
    cond = threading.Condition()

    def out(record: dict[str, Any]) -> None:
        with cond:
            records.append(record)
            cond.notify_all()

    b.status = 503
    targets = tuple(Target(name, ip) for name, ip in NODES.items())
    balancer = Balancer(targets, service_port, health_port=health_port, interval=0.02, rate=200, timeout=1.0, out=out)
    runner = threading.Thread(target=balancer.run, daemon=True)
    runner.start()
    try:

        def reported(healthy: list[str]) -> int:
            """Where in the records the balancer reported `healthy`, once it has."""
            with cond:
                assert cond.wait_for(lambda: any(r.get("health") == healthy for r in records), 10), records[-5:]
                return next(i for i, r in enumerate(records) if r.get("health") == healthy)

        def requests_to(node: str, count: int) -> None:
            with cond:
                start = len(records)
                assert cond.wait_for(lambda: sum(1 for r in records[start:] if r.get("node") == node) >= count, 10)

        requests_to("node-a", 20)
        b.status = 200  # node-b joins ...
        added = reported(["node-a", "node-b"])
        requests_to("node-b", 10)
        a.status = 503  # ... and node-a leaves
        switched = reported(["node-b"])
        requests_to("node-b", 20)
    finally:
        balancer.stop()
        runner.join(5)
    healths = [r["health"] for r in records if "health" in r]
    assert healths == [["node-a"], ["node-a", "node-b"], ["node-b"]]
    sent = [r for r in records if "node" in r]
    assert all(r["ok"] for r in sent), [r for r in sent if not r["ok"]]
    # One thread checks and sends in turn: after the change is reported, nothing goes to node-a.
    assert {r["node"] for r in records[switched:] if "node" in r} == {"node-b"}
    assert {r["node"] for r in records[:added] if "node" in r} == {"node-a"}
