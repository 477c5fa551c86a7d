"""Health as upstream defines it, whatever the source's state, on a fake clock and the fake node.

Upstream's rule (pkg/proxy/healthcheck/proxy_health.go): a family is unhealthy once an update
queued for it has waited `2 × syncPeriod` without a successful sync; nothing queued, healthy.
A source out of sync (API server unreachable, or stale and not relisted) queues nothing, so it
never fails /healthz or /livez: it shows in the log, `kubeproxy_source_out_of_sync` and the
body's `source` field instead (proxy/source_watch.py). The same outage against a real kernel and
the test API server: tests/live/test_source_outage_live.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.health import rfc3339
from kubeproxy.proxy.http import Response
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.proxy.source_watch import METRIC, SourceWatch
from kubeproxy.runtime.logs import STARTUP_LOGGER
from tests.live.served import Source, serving
from tests.live.test_live import _service
from tests.proxy.test_health import T0, FakeClock

SYNC_PERIOD = 30.0
HEALTH_TIMEOUT = 2 * SYNC_PERIOD  # upstream: cmd/kube-proxy/app/server.go
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",), min_sync_period=0.0, sync_period=SYNC_PERIOD,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip
UPSTREAM_HEALTHZ_FIELDS = ["lastUpdated", "currentTime", "nodeEligible", "healthy", "status"]


def _doc(response: Response) -> dict[str, Any]:
    doc = json.loads(response.body)
    assert isinstance(doc, dict)
    return doc


def _run(body: Callable[[LiveProxy, Source, FakeClock], Awaitable[None]]) -> None:
    async def main() -> None:
        clock = FakeClock()
        node = FakeNode()
        # The source's state is read at each health request: no need for the periodic check here.
        proxy = LiveProxy(replace(CFG, mode="iptables"), "node-1", run_cmd=node, wall_clock=clock,
                          source_check_interval=3600.0)  # fmt: skip
        source = Source(proxy, _service("web", "10.96.0.10", ["10.244.1.5"]))
        async with serving(proxy, source):
            await asyncio.wait_for(body(proxy, source, clock), 10)

    asyncio.run(main())


async def _sync(proxy: LiveProxy) -> None:
    """Ask for a sync and wait until it is over (successful or not)."""
    done = proxy.syncs + proxy.failed_syncs
    proxy.runner.run()
    await proxy.wait_for_syncs(done + 1)


def test_the_health_timeout_is_twice_the_sync_period() -> None:
    proxy = LiveProxy(CFG, "node-1", run_cmd=FakeNode().run)
    assert proxy.health.health_timeout == HEALTH_TIMEOUT


def test_an_out_of_sync_source_for_three_health_timeouts_keeps_both_endpoints_healthy(caplog: pytest.LogCaptureFixture) -> None:
    async def body(proxy: LiveProxy, source: Source, clock: FakeClock) -> None:
        registry = proxy.metrics.registry
        assert registry.get_sample_value(METRIC) == 0.0
        lost = clock.now
        source.connected = False
        doc = _doc(proxy.health.healthz())
        assert doc["source"] == {"inSync": False, "outOfSyncSince": rfc3339(lost)}
        assert registry.get_sample_value(METRIC) == 1.0
        # A change arriving just before the watch broke, synced during the outage, then periodic
        # syncs only: nothing stays queued, so age alone never fails health.
        source.publish(*_service("web", "10.96.0.10", ["10.244.1.6"]))
        await proxy.wait_for_syncs(2)
        for _ in range(3):
            clock.step(HEALTH_TIMEOUT)
            await _sync(proxy)
            for response in (proxy.health.healthz(), proxy.health.livez()):
                doc = _doc(response)
                assert response.status == 200, doc
                # Both families, as upstream runs them on a kernel that carries both.
                fresh = {"lastUpdated": rfc3339(clock.now), "healthy": True}
                assert doc["healthy"] is True and doc["status"] == {"IPv4": fresh, "IPv6": fresh}
                assert doc["source"] == {"inSync": False, "outOfSyncSince": rfc3339(lost)}
        # Even with no sync at all for that long, nothing queued is healthy (upstream's rule).
        clock.step(3 * HEALTH_TIMEOUT)
        assert proxy.health.healthz().status == proxy.health.livez().status == 200

        healthz = _doc(proxy.health.healthz())
        assert list(healthz)[: len(UPSTREAM_HEALTHZ_FIELDS)] == UPSTREAM_HEALTHZ_FIELDS
        assert "nodeEligible" not in _doc(proxy.health.livez())

        source.connected = True
        assert _doc(proxy.health.healthz())["source"] == {"inSync": True}
        assert registry.get_sample_value(METRIC) == 0.0

    with caplog.at_level(logging.INFO):
        _run(body)
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if "Source " in r.getMessage()]
    # Once each way, however many times the state was read in between.
    assert [(name, level) for name, level, _ in lines] == [("kubeproxy.proxy", logging.WARNING), (STARTUP_LOGGER, logging.INFO)]
    assert f"outOfSyncSeconds={6 * HEALTH_TIMEOUT:.1f}" in lines[1][2]


def test_an_update_queued_longer_than_the_health_timeout_fails_both_endpoints() -> None:
    async def body(proxy: LiveProxy, source: Source, clock: FakeClock) -> None:
        # The next sync hangs in the kernel (as a stuck iptables-restore would) until released.
        entered, release = threading.Event(), threading.Event()
        real = proxy.lanes[0].backend.sync

        def stuck(*args: Any) -> Any:
            entered.set()
            release.wait(10)
            return real(*args)

        proxy.lanes[0].backend.sync = stuck  # type: ignore[method-assign,assignment]
        source.publish(*_service("web", "10.96.0.10", ["10.244.1.6"]))
        await asyncio.to_thread(entered.wait, 10)
        try:
            clock.step(HEALTH_TIMEOUT - 1)
            assert proxy.health.healthz().status == proxy.health.livez().status == 200
            clock.step(1)
            for response in (proxy.health.healthz(), proxy.health.livez()):
                doc = _doc(response)
                assert response.status == 503, doc
                assert doc["healthy"] is False and doc["status"]["IPv4"]["healthy"] is False
                # The source was in sync throughout: the failure is the proxier's own.
                assert doc["source"] == {"inSync": True}
                assert doc["lastUpdated"] == rfc3339(T0)  # the last successful sync, not "now"
        finally:
            release.set()
        await proxy.wait_for_syncs(2)
        assert proxy.syncs == 2 and proxy.health.healthz().status == 200

    _run(body)


@dataclass
class Flag:
    connected: bool = True


def test_source_watch_logs_each_change_once_and_keeps_the_gauge(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    flag = Flag()
    registry = CollectorRegistry()
    watch = SourceWatch(flag, registry, "API server (kubeconfig)", clock=clock)
    with caplog.at_level(logging.INFO):
        assert watch.check() and watch.health_field() == {"inSync": True}
        assert registry.get_sample_value(METRIC) == 0.0 and not caplog.records
        flag.connected = False
        clock.step(1.5)
        for _ in range(3):
            assert not watch.check()
            clock.step(1)
        assert watch.health_field() == {"inSync": False, "outOfSyncSince": rfc3339(T0 + 1.5)}
        assert registry.get_sample_value(METRIC) == 1.0
        flag.connected = True
        assert watch.check() and watch.check()
    assert registry.get_sample_value(METRIC) == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        '"Source out of sync: the rules stay as programmed, health is not affected" source="API server (kubeconfig)"',
        '"Source back in sync" source="API server (kubeconfig)" outOfSyncSeconds=3.0',
    ]
    help_text = next(m.documentation for m in registry.collect() if m.name == METRIC)
    assert "not upstream" in help_text


def test_source_watch_run_checks_until_cancelled() -> None:
    flag = Flag(connected=False)
    watch = SourceWatch(flag, CollectorRegistry(), clock=FakeClock())

    async def main() -> None:
        task = asyncio.create_task(watch.run(0.01))
        # Seen by the loop, not by a request: the state changes without anyone asking.
        while watch.out_since is None:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 5))
    assert watch.out_since == T0
