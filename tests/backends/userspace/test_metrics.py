"""The relay's metrics and /healthz detail, read at scrape time (loopback, no root)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kubeproxy.backends.userspace.proxier import UserspaceProxier
from kubeproxy.backends.userspace.relay_loop import RelayServer
from kubeproxy.backends.userspace.relay_metrics import RelayCollector, relay_health
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.backends.userspace.test_relay import WEB, TcpBackend, free_port, serve, wait_for


@pytest.fixture
def proxier() -> Iterator[UserspaceProxier]:
    p = UserspaceProxier(splice=False)
    p.server = RelayServer(splice=False)
    p.server.start()
    yield p
    p.server.stop()


def scrape(lanes: list[tuple[Family, object]]) -> str:
    reg = CollectorRegistry()
    reg.register(RelayCollector(lambda: lanes))
    return generate_latest(reg).decode()


def value(page: str, series: str) -> float:
    return float(next(line for line in page.splitlines() if line.startswith(series + " ")).split()[-1])


def test_counters_and_gauges_per_family(proxier: UserspaceProxier) -> None:
    relay = proxier.server
    assert relay is not None
    backend = TcpBackend()
    port = serve(relay, WEB, [("127.0.0.1", free_port()), ("127.0.0.1", backend.port)])
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    for conn in held:
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"  # relayed: the dead endpoint was dialled, then the live one
    page = scrape([(Family.IPV4, proxier)])
    assert 'kubeproxy_userspace_relay_connections{ip_family="IPv4"} 2.0' in page
    assert 'kubeproxy_userspace_relay_listeners{ip_family="IPv4"} 1.0' in page
    assert 'kubeproxy_userspace_relay_accepted_connections_total{ip_family="IPv4"} 2.0' in page
    # Round robin starts one or both connections on the dead endpoint: each such start is one failed dial.
    assert value(page, 'kubeproxy_userspace_relay_failed_dials_total{ip_family="IPv4"}') in (1.0, 2.0)
    assert 'kubeproxy_userspace_relay_fd_limit_hits_total{ip_family="IPv4"} 0.0' in page
    assert relay_health(lambda: [(Family.IPV4, proxier)]) == {
        "IPv4": {"running": True, "acceptingConnections": True, "listeners": 1, "connections": 2, "udpFlows": 0}}
    for conn in held:
        conn.close()
    wait_for("the connections to end", lambda: relay.stats().connections == 0)
    backend.close()


def test_fd_limit_hits_are_counted() -> None:
    proxier = UserspaceProxier(splice=False)
    proxier.server = relay = RelayServer(splice=False, max_fds=0)
    relay.start()
    try:
        port = serve(relay, WEB, [("127.0.0.1", free_port())])
        probe = socket.create_connection(("127.0.0.1", port), timeout=5)  # queued in the backlog, not accepted
        wait_for("the limit to be hit", lambda: relay.stats().fd_limit_hits >= 1)
        assert relay_health(lambda: [(Family.IPV4, proxier)])["IPv4"]["acceptingConnections"] is False
        assert 'kubeproxy_userspace_relay_fd_limit_hits_total{ip_family="IPv4"} 1.0' in scrape([(Family.IPV4, proxier)])
        probe.close()
    finally:
        relay.stop()


def test_live_proxy_exposes_the_relay_only_in_userspace_mode() -> None:
    cfg = ProxyConfig(healthz_bind_address="", metrics_bind_address="")
    userspace = LiveProxy(ProxyConfig(mode="userspace", healthz_bind_address="", metrics_bind_address=""), "node-1")
    assert b"# TYPE kubeproxy_userspace_relay_connections gauge" in userspace.metrics.exposition()
    assert json.loads(userspace.health.healthz().body)["userspaceRelay"] == {}  # no relay before prepare()
    kernel = LiveProxy(cfg, "node-1")
    assert b"userspace_relay" not in kernel.metrics.exposition()
    assert "userspaceRelay" not in json.loads(kernel.health.healthz().body)
