"""The relay over loopback, without root: TCP echo (splice and copy), half-close, retries,
no endpoints, UDP flows and their idle timeout, the file-descriptor limit."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubeproxy.backends.userspace.balancer import PortTable
from kubeproxy.backends.userspace.ports import Binder
from kubeproxy.backends.userspace.relay import HAVE_SPLICE
from kubeproxy.backends.userspace.relay_loop import Listener, RelayServer
from kubeproxy.model.node_model import ServicePortName
from kubeproxy.model.options import Family

WEB = ServicePortName("default", "web", "http", "TCP")
DNS = ServicePortName("default", "dns", "dns", "UDP")
MODES = [pytest.param(True, id="splice"), pytest.param(False, id="copy")]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class TcpBackend:
    """A loopback TCP server: echo, or hash everything then answer with the digest on EOF."""

    def __init__(self, mode: str = "echo") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.mode = mode
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        # A reset is how the relay's teardown ends connections still open.
        with conn, contextlib.suppress(ConnectionResetError):
            digest = hashlib.sha256()
            while data := conn.recv(1 << 16):
                if self.mode == "echo":
                    conn.sendall(data)
                else:
                    digest.update(data)
            if self.mode == "hash":
                # Still writable after the client's half-close: the answer proves it.
                conn.sendall(digest.hexdigest().encode())

    def close(self) -> None:
        self.sock.close()


def free_port() -> int:
    """A port nobody listens on (bound and closed at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=MODES)
def relay(request: pytest.FixtureRequest) -> Iterator[RelayServer]:
    if request.param and not HAVE_SPLICE:
        pytest.skip("os.splice is not available on this platform")
    server = RelayServer(splice=request.param, udp_timeout=0.25)
    server.start()
    yield server
    server.stop()


def serve(relay: RelayServer, name: ServicePortName, endpoints: list[tuple[str, int]], **kw: Any) -> int:
    sock, port = Binder().open(name.protocol, Family.IPV4)
    table = PortTable(name, name.protocol, tuple(endpoints), **kw)
    relay.call(relay.adopt, [Listener(name, name.protocol, sock, port)], {name: table}, [])
    return port


def test_tcp_echo(relay: RelayServer) -> None:
    backend = TcpBackend()
    port = serve(relay, WEB, [("127.0.0.1", backend.port)])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        for size in (1, 1000, 200_000):
            payload = os.urandom(size)
            c.sendall(payload)
            got = b""
            while len(got) < size:
                got += c.recv(1 << 16)
            assert got == payload
    wait_for("the connection to be closed", lambda: relay.call(lambda: len(relay.connections)) == 0)
    assert relay.call(lambda: relay.fds_used) == 0


def test_half_close_and_bytes_checked(relay: RelayServer) -> None:
    # The client sends 64 MB, shuts its write side; the backend answers only after EOF.
    backend = TcpBackend("hash")
    port = serve(relay, WEB, [("127.0.0.1", backend.port)])
    digest = hashlib.sha256()
    chunk = os.urandom(1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        for _ in range(64):
            c.sendall(chunk)
            digest.update(chunk)
        c.shutdown(socket.SHUT_WR)
        answer = b""
        while data := c.recv(4096):
            answer += data
    assert answer.decode() == digest.hexdigest()


def test_connect_failure_moves_on_to_the_next_endpoint(relay: RelayServer) -> None:
    backend = TcpBackend()
    dead = free_port()
    port = serve(relay, WEB, [("127.0.0.1", dead), ("127.0.0.1", backend.port)])
    for _ in range(4):  # round robin would start half of these on the dead endpoint
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"ping"
    assert relay.call(lambda: relay.failed_dials) >= 1


def test_no_endpoints_resets_the_connection(relay: RelayServer) -> None:
    port = serve(relay, WEB, [])
    # Over loopback the reset can come before connect() has even returned.
    with pytest.raises(ConnectionResetError), socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"x")
        c.recv(1)
        c.recv(1)


def test_endpoint_change_keeps_established_connections(relay: RelayServer) -> None:
    a, b = TcpBackend(), TcpBackend()
    port = serve(relay, WEB, [("127.0.0.1", a.port)])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as old:
        old.sendall(b"1")
        assert old.recv(1) == b"1"
        relay.call(relay.adopt, [], {WEB: PortTable(WEB, "TCP", (("127.0.0.1", b.port),))}, [])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as new:
            new.sendall(b"2")
            assert new.recv(1) == b"2"
        old.sendall(b"3")
        assert old.recv(1) == b"3"
    assert (a.accepted, b.accepted) == (1, 1)


def test_closing_a_listener(relay: RelayServer) -> None:
    backend = TcpBackend()
    port = serve(relay, WEB, [("127.0.0.1", backend.port)])
    relay.call(relay.adopt, [], {}, [WEB])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_fd_limit_pauses_accepting_until_a_connection_ends(caplog: pytest.LogCaptureFixture) -> None:
    server = RelayServer(splice=False, max_fds=2)  # room for exactly one relayed connection
    server.start()
    try:
        backend = TcpBackend()
        port = serve(server, WEB, [("127.0.0.1", backend.port)])
        first = socket.create_connection(("127.0.0.1", port), timeout=5)
        first.sendall(b"a")
        assert first.recv(1) == b"a"
        second = socket.create_connection(("127.0.0.1", port), timeout=5)  # waits in the backlog
        second.settimeout(0.3)
        second.sendall(b"b")
        with pytest.raises(TimeoutError):
            second.recv(1)
        assert "Too many open files" in caplog.text
        first.close()
        second.settimeout(5)
        assert second.recv(1) == b"b"
        second.close()
    finally:
        server.stop()


class UdpEcho:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: set[tuple[str, int]] = set()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(65535)
            except OSError:
                return
            self.peers.add(peer)
            self.sock.sendto(data, peer)


def test_udp_flows_per_client_and_idle_timeout(relay: RelayServer) -> None:
    echo = UdpEcho()
    port = serve(relay, DNS, [("127.0.0.1", echo.port)])
    clients = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    for i, c in enumerate(clients):
        c.settimeout(2)
        c.sendto(f"q{i}".encode(), ("127.0.0.1", port))
        assert c.recv(100) == f"q{i}".encode()
    # One relay socket per client: the endpoint sees three sources.
    assert len(echo.peers) == 3
    assert relay.call(lambda: len(relay.flows)) == 3
    wait_for("idle flows to close after --udp-timeout", lambda: relay.call(lambda: len(relay.flows)) == 0, 3)
    for c in clients:
        c.close()
