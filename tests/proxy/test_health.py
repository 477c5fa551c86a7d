"""Health over real HTTP on loopback: /healthz and /livez with a fake clock, the per-service
health-check listeners, the metrics server's endpoints, and the tiny HTTP server under them."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kubeproxy.backends import registry
from kubeproxy.model.metrics import ProxyMetrics
from kubeproxy.proxy import http
from kubeproxy.proxy.health import (
    TO_BE_DELETED_TAINT,
    ProxyHealth,
    ServiceHealthServers,
    rfc3339,
    serve_healthz,
    serve_metrics,
)
from kubeproxy.proxy.http import Response, parse_bind, routes, serve
from tests.proxy.servers import port_of

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
TIMEOUT = 10.0
WEB = ("default", "web")
DNS = ("kube-system", "dns")


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never an http_proxy from the environment


def _fetch(url: str, method: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with _opener.open(urllib.request.Request(url, method=method), timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read()


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    # urllib blocks, and the server runs on this loop: ask from a thread.
    return await asyncio.to_thread(_fetch, f"http://127.0.0.1:{port}{path}", method)


async def get_json(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, headers, body = await get(port, path)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    return status, json.loads(body)


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    writer.write_eof()  # all we will send: a truncated head is answered at once, not after a timeout
    answer = await reader.read()
    writer.close()
    return answer



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# --- /healthz and /livez ---------------------------------------------------------------------


def test_rfc3339_is_what_go_writes_for_a_time() -> None:
    assert rfc3339(T0) == "2023-11-14T22:13:20Z"
    assert rfc3339(T0 + 0.25) == "2023-11-14T22:13:20.25Z"
    assert rfc3339(None) == "0001-01-01T00:00:00Z"


def test_health_follows_queued_updates_and_syncs() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    metrics = ProxyMetrics()

    async def main() -> None:
        server = await serve_healthz(health, metrics, "127.0.0.1:0")
        port = port_of(server)
        try:
            # Before anything happened: healthy, lastUpdated reported as "now", no per-family status.
            for path in ("/healthz", "/livez"):
                status, doc = await get_json(port, path)
                assert status == 200
                assert doc["healthy"] is True and "status" not in doc
                assert doc["lastUpdated"] == doc["currentTime"] == rfc3339(T0)
            _, doc = await get_json(port, "/healthz")
            assert doc["nodeEligible"] is True
            _, doc = await get_json(port, "/livez")
            assert "nodeEligible" not in doc

            health.updated()  # the sync loop starts
            synced = clock.now
            clock.step(3 * TIMEOUT)  # no pending change: age alone does not make it unhealthy
            assert (await get_json(port, "/healthz"))[0] == 200

            health.queued_update()
            oldest = clock.now
            clock.step(TIMEOUT - 1)
            health.queued_update()  # a later change does not restart the clock
            status, doc = await get_json(port, "/healthz")
            assert status == 200 and doc["lastUpdated"] == rfc3339(clock.now)
            assert doc["status"] == {"IPv4": {"lastUpdated": rfc3339(synced), "healthy": True}}

            clock.step(1)  # the oldest pending change is now exactly TIMEOUT old
            assert clock.now - oldest == TIMEOUT
            for path in ("/healthz", "/livez"):
                status, doc = await get_json(port, path)
                assert status == 503
                assert doc["healthy"] is False
                assert doc["lastUpdated"] == rfc3339(synced) and doc["currentTime"] == rfc3339(clock.now)
                assert doc["status"]["IPv4"] == {"lastUpdated": rfc3339(synced), "healthy": False}

            health.updated()
            clock.step(1)
            for path in ("/healthz", "/livez"):
                status, doc = await get_json(port, path)
                assert status == 200 and doc["healthy"] is True
                assert doc["status"]["IPv4"] == {"lastUpdated": rfc3339(clock.now - 1), "healthy": True}
        finally:
            server.close()

    run(main)
    assert sample(metrics, "kubeproxy_proxy_healthz_total", code="200") == 5
    assert sample(metrics, "kubeproxy_proxy_healthz_total", code="503") == 1
    assert sample(metrics, "kubeproxy_proxy_livez_total", code="200") == 3
    assert sample(metrics, "kubeproxy_proxy_livez_total", code="503") == 1


def test_node_going_away_fails_healthz_but_not_livez() -> None:
    health = ProxyHealth(TIMEOUT, FakeClock())
    health.updated()

    async def main() -> None:
        server = await serve_healthz(health, ProxyMetrics(), "127.0.0.1:0")
        port = port_of(server)
        try:
            for node, eligible in (
                ({"deleting": True}, False),
                ({"taints": ["node.kubernetes.io/unschedulable"]}, True),
                ({"taints": ["other", TO_BE_DELETED_TAINT]}, False),
                ({}, True),
            ):
                health.sync_node(**node)
                status, doc = await get_json(port, "/healthz")
                assert (status, doc["nodeEligible"], doc["healthy"]) == (200 if eligible else 503, eligible, True), node
                status, doc = await get_json(port, "/livez")
                assert status == 200 and "nodeEligible" not in doc, node
        finally:
            server.close()

    run(main)


def test_a_family_is_judged_only_after_its_first_sync() -> None:
    # Upstream's rule: a proxier that never reported a sync is "starting up", however old its
    # pending change. That is why the sync loop reports one sync when it starts.
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.queued_update()
    clock.step(10 * TIMEOUT)
    assert health.healthy
    health.updated()
    health.queued_update()
    clock.step(TIMEOUT)
    assert not health.healthy


def test_one_late_family_makes_the_proxy_unhealthy() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.updated("IPv4")
    health.updated("IPv6")
    health.queued_update("IPv6")
    clock.step(TIMEOUT + 5)
    status = health.status()
    assert not status.healthy
    assert status.families["IPv4"].healthy and not status.families["IPv6"].healthy
    health.updated("IPv4")  # the punctual family syncing again does not help
    assert not health.healthy
    health.updated("IPv6")
    assert health.healthy


def test_bad_health_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="health timeout"):
        ProxyHealth(0)


# --- per-service health checks ---------------------------------------------------------------


def test_service_health_reports_local_endpoints_and_proxy_health() -> None:
    clock = FakeClock()
    health = ProxyHealth(TIMEOUT, clock)
    health.updated()
    servers = ServiceHealthServers(health, ("127.0.0.1",))
    port = free_port()

    async def main() -> None:
        await servers.sync_services({WEB: port})
        try:
            servers.sync_endpoints({})
            status, headers, body = await get(port, "/")
            assert status == 503
            assert headers["X-Load-Balancing-Endpoint-Weight"] == "0"
            assert headers["Content-Type"] == "application/json" and headers["X-Content-Type-Options"] == "nosniff"
            assert body.decode() == (
                '{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "web"\n\t},\n'
                '\t"localEndpoints": 0,\n\t"serviceProxyHealthy": true\n}'
            )

            servers.sync_endpoints({WEB: 2, DNS: 7})  # DNS has no listener: ignored
            status, headers, body = await get(port, "/any/path")
            assert status == 200 and headers["X-Load-Balancing-Endpoint-Weight"] == "2"
            assert json.loads(body) == {
                "service": {"namespace": "default", "name": "web"},
                "localEndpoints": 2,
                "serviceProxyHealthy": True,
            }

            health.queued_update()
            clock.step(TIMEOUT)  # the proxy is late: the node must not attract traffic
            status, headers, body = await get(port, "/")
            assert status == 503 and headers["X-Load-Balancing-Endpoint-Weight"] == "2"
            assert json.loads(body)["serviceProxyHealthy"] is False
        finally:
            await servers.close()

    run(main)
    assert refused(port)


def test_removed_service_closes_its_port_and_a_changed_port_moves() -> None:
    health = ProxyHealth(TIMEOUT, FakeClock())
    servers = ServiceHealthServers(health, ("127.0.0.1",))
    first, second = free_port(), free_port()

    async def main() -> None:
        await servers.sync_services({WEB: first})
        servers.sync_endpoints({WEB: 1})
        assert (await get(first, "/"))[0] == 200

        await servers.sync_services({WEB: second})
        servers.sync_endpoints({WEB: 1})
        assert refused(first)
        assert (await get(second, "/"))[0] == 200

        await servers.sync_services({})
        assert refused(second)
        assert servers.ports() == {}

    run(main)


def test_changed_bind_addresses_move_the_listeners() -> None:
    health = ProxyHealth(TIMEOUT, FakeClock())
    servers = ServiceHealthServers(health, ("127.0.0.1",))
    port = free_port()

    def answers(ip: str) -> bool:
        with socket.socket() as s:
            return s.connect_ex((ip, port)) == 0

    async def main() -> None:
        await servers.sync_services({WEB: port})
        assert answers("127.0.0.1") and not answers("127.0.0.2")
        servers.set_bind_ips(("127.0.0.2",))  # e.g. --nodeport-addresses now selects another address
        assert servers.ports() == {}  # closed at once, reopened by the next sync
        await servers.sync_services({WEB: port})
        assert answers("127.0.0.2") and not answers("127.0.0.1")
        servers.set_bind_ips(("127.0.0.2",))  # unchanged: the listener stays
        assert servers.ports() == {WEB: port}
        await servers.close()

    run(main)


def test_port_taken_by_another_service_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    health = ProxyHealth(TIMEOUT, FakeClock())
    servers = ServiceHealthServers(health, ("127.0.0.1",), node_name="node-1")
    port = free_port()

    async def main() -> None:
        try:
            await servers.sync_services({DNS: port})
            servers.sync_endpoints({DNS: 1, WEB: 1})
            with caplog.at_level(logging.ERROR, logger="kubeproxy.proxy.health"):
                await servers.sync_services({DNS: port, WEB: port})
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1
            assert '"Failed to start healthcheck"' in errors[0]
            assert 'service="default/web"' in errors[0] and f"port={port}" in errors[0] and 'node="node-1"' in errors[0]
            assert servers.ports() == {DNS: port}
            status, _, body = await get(port, "/")
            assert status == 200 and json.loads(body)["service"] == {"namespace": "kube-system", "name": "dns"}

            # Once the port is free, the next sync opens it for the service that wanted it.
            await servers.sync_services({WEB: port})
            servers.sync_endpoints({WEB: 3})
            status, headers, body = await get(port, "/")
            assert status == 200 and headers["X-Load-Balancing-Endpoint-Weight"] == "3"
            assert json.loads(body)["service"]["name"] == "web"
        finally:
            await servers.close()

    run(main)


# --- the metrics server -----------------------------------------------------------------------


def test_metrics_server_serves_metrics_proxy_mode_and_ping() -> None:
    metrics = registry.proxy_metrics("iptables")
    metrics.for_family("IPv4").sync_duration.observe(0.003)

    async def main() -> None:
        server = await serve_metrics(metrics, "127.0.0.1:0", "iptables")
        port = port_of(server)
        try:
            status, headers, body = await get(port, "/proxyMode")
            assert (status, body) == (200, b"iptables")
            assert headers["Content-Type"] == "text/plain; charset=utf-8" and headers["X-Content-Type-Options"] == "nosniff"

            for path in ("/healthz", "/healthz/ping"):
                assert (await get(port, path))[::2] == (200, b"ok")

            status, headers, body = await get(port, "/metrics")
            assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1.0' in body
            metrics.for_family("IPv4").sync_duration.observe(0.003)
            body = (await get(port, "/metrics"))[2]
            assert b'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 2.0' in body

            assert (await get(port, "/livez"))[0] == 404  # /livez lives on the healthz port only
        finally:
            server.close()

    run(main)


# --- the HTTP server itself -------------------------------------------------------------------


def _echo(method: str, path: str, headers: object) -> Response:
    return Response(200, {"Content-Type": "text/plain"}, f"{method} {path}".encode())


def _boom(method: str, path: str, headers: object) -> Response:
    raise RuntimeError("handler bug")


async def _async_handler(method: str, path: str, headers: object) -> Response:
    await asyncio.sleep(0)
    return Response(204)


def test_http_methods_paths_and_errors() -> None:
    async def main() -> None:
        server = await serve("127.0.0.1:0", routes({"/echo": _echo, "/boom": _boom, "/async": _async_handler}))
        port = port_of(server)
        try:
            status, headers, body = await get(port, "/echo?verbose=1")
            assert (status, body) == (200, b"GET /echo")
            assert headers["Connection"] == "close" and headers["Content-Length"] == "9"

            status, headers, body = await get(port, "/echo", method="HEAD")
            assert (status, body, headers["Content-Length"]) == (200, b"", str(len("HEAD /echo")))

            status, headers, _ = await get(port, "/echo", method="POST")
            assert status == 405 and headers["Allow"] == "GET, HEAD"

            status, _, body = await get(port, "/missing")
            assert (status, body) == (404, b"404 page not found\n")
            assert (await get(port, "/boom"))[0] == 500
            assert (await get(port, "/async"))[0] == 204

            assert (await raw(port, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            assert (await raw(port, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            huge = b"GET /echo HTTP/1.1\r\nX-Filler: " + b"a" * (2 * http.MAX_REQUEST_HEAD) + b"\r\n\r\n"
            assert (await raw(port, huge)).startswith(b"HTTP/1.1 431 ")
            assert await raw(port, b"GET /echo HTTP/1.1\r\n") == b""  # closed before the head ended
        finally:
            server.close()

    run(main)


def test_http_silent_client_is_dropped() -> None:
    async def main() -> None:
        server = await serve("127.0.0.1:0", _echo, limits=http.Limits(head_timeout=0.2))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up without answering
            writer.close()
        finally:
            server.close()

    run(main)


def test_http_ipv6_bind() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")

    async def main() -> None:
        try:
            server = await serve("[::1]:0", _echo)
        except OSError as exc:
            pytest.skip(f"no IPv6 loopback here: {exc}")
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("::1", port)
            writer.write(b"GET /v6 HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"GET /v6")
        finally:
            server.close()

    run(main)


@pytest.mark.parametrize(
    ("bind", "expected"),
    [
        ("0.0.0.0:10256", ("0.0.0.0", 10256)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::]:10249", ("::", 10249)),
        ("[fd00::1]:80", ("fd00::1", 80)),
        (":10256", (None, 10256)),
    ],
)
def test_parse_bind(bind: str, expected: tuple[str | None, int]) -> None:
    assert parse_bind(bind) == expected


@pytest.mark.parametrize(
    "bind", ["10256", "localhost:10256", "1.2.3.4:70000", "1.2.3.4:", "::1:80", "[1.2.3.4]:80", "1.2.3.4:-1"]
)
def test_parse_bind_refuses_bad_addresses(bind: str) -> None:
    with pytest.raises(ValueError, match="bind address"):
        parse_bind(bind)
