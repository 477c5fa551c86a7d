"""The live proxy's batched event path, without root.

`on_events` takes a source's whole list at once: the state, the change tracker, the trigger
times, the counters and gauges and /healthz must end up exactly as if the same events had come
one by one through `on_event`, for dicts and for the typed decoder's structs alike; a failing
event must not lose the rest of the batch. With `manage_gc` the collector is paused for the cold
start and the heap frozen after the first sync.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.cluster.schema import Item
from kubeproxy.cluster.typed import as_item
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.events import WatchEvent
from tests.live.served import serving
from tests.live.test_live import _service

CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",), min_sync_period=0.0, sync_period=30.0,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip
NOW = 1_800_000_000.0
METRICS = (
    "kubeproxy_sync_proxy_rules_service_changes_total",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
)


def _proxy(node: FakeNode | None = None) -> LiveProxy:
    return LiveProxy(CFG, "node-1", run_cmd=(node or FakeNode()).run, wall_clock=lambda: NOW)


def _triggered(obj: dict[str, Any], at: str) -> dict[str, Any]:
    meta = {**obj["metadata"], "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": at}}
    return {**obj, "metadata": meta}


def _events() -> list[WatchEvent]:
    web, web_eps = _service("web", "10.96.0.10", ["10.244.1.1", "10.244.1.2"])
    dns, dns_eps = _service("dns", "10.96.0.53", ["10.244.2.1"])
    bad = {**web, "metadata": {"name": "Bad_Name", "namespace": "default"}}
    moved = _triggered(_service("web", "10.96.0.10", ["10.244.1.3"])[1], "2027-01-15T08:00:05Z")
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {"zone": "a"}}}
    return [
        WatchEvent("ADDED", "Service", web),
        WatchEvent("ADDED", "EndpointSlice", _triggered(web_eps, "2027-01-15T08:00:01Z")),
        WatchEvent("ADDED", "Service", bad),  # refused: counts nothing
        WatchEvent("ADDED", "Service", dns),
        WatchEvent("ADDED", "EndpointSlice", dns_eps),
        WatchEvent("ADDED", "Node", node),
        WatchEvent("MODIFIED", "EndpointSlice", moved),
        WatchEvent("DELETED", "EndpointSlice", {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                                "metadata": {"name": "dns-1", "namespace": "default"}}),
    ]  # fmt: skip


def _typed(events: list[WatchEvent]) -> list[WatchEvent]:
    """The same events with the objects as structs where the schema takes them (as a typed list gives)."""
    out = []
    for event in events:
        item = as_item(event.obj) if event.type != "DELETED" else None
        out.append(WatchEvent(event.type, event.kind, item) if item is not None else event)
    return out


def _observed(proxy: LiveProxy) -> dict[str, Any]:
    registry = proxy.metrics.registry
    return {
        "services": proxy.state.services,
        "slices": proxy.state.slices,
        "nodes": proxy.state.nodes,
        "touched": proxy.lanes[0].tracker.pending(),
        "triggers": proxy._triggers.take(),
        "metrics": {name: registry.get_sample_value(name) for name in METRICS},
        "queued": registry.get_sample_value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", {"ip_family": "IPv4"}),
        "health": proxy.health.status(),
    }


@pytest.mark.parametrize("typed", [False, True], ids=["dicts", "structs"])
def test_a_batch_ends_as_the_same_events_one_by_one(typed: bool) -> None:
    events = _typed(_events()) if typed else _events()
    assert any(isinstance(e.obj, Item) for e in events) == typed
    one_by_one, batched = _proxy(), _proxy()
    for event in events:
        one_by_one.on_event(event)
    batched.on_events(events)
    expected = _observed(one_by_one)
    assert _observed(batched) == expected
    # Every change counted (the refused one not), the deleted slice gone, its trigger time too.
    assert expected["metrics"] == {METRICS[0]: 2.0, METRICS[1]: 4.0, METRICS[2]: 2.0, METRICS[3]: 4.0}
    assert set(expected["slices"]) == {("default", "web-1")}
    assert list(expected["triggers"]) == [("default", "web")] and len(expected["triggers"][("default", "web")]) == 2
    assert expected["queued"] == NOW


def test_structs_and_dicts_give_the_same_proxy_state() -> None:
    from_dicts, from_structs = _proxy(), _proxy()
    from_dicts.on_events(_events())
    from_structs.on_events(_typed(_events()))
    assert _observed(from_structs) == _observed(from_dicts)


def test_a_batch_of_refused_objects_queues_nothing() -> None:
    proxy = _proxy()
    web = _service("web", "10.96.0.10", ["10.244.1.1"])[0]
    proxy.on_events([WatchEvent("ADDED", "Service", {**web, "spec": {"clusterIP": "10.96.0.300"}})])
    seen = _observed(proxy)
    assert seen["metrics"] == dict.fromkeys(METRICS, 0.0) and seen["queued"] is None
    assert proxy.lanes[0].tracker.pending() is None  # full sync still due: nothing touched


def test_one_failing_event_does_not_lose_the_rest_of_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    proxy = _proxy()
    real = proxy.lanes[0].tracker.apply

    def apply(state, obj, *, deleted=False):  # type: ignore[no-untyped-def]
        if obj["metadata"]["name"] == "dns":
            raise RuntimeError("a bug (injected)")
        return real(state, obj, deleted=deleted)

    proxy.lanes[0].tracker.apply = apply  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="kubeproxy.proxy"):
        proxy.on_events(_events())
    assert set(proxy.state.services) == {("default", "web")}
    assert set(proxy.state.slices) == {("default", "web-1")}
    assert [r.getMessage() for r in caplog.records] == ["the proxy failed on ADDED Service default/dns: a bug (injected)"]


class _Source:
    """Delivers `initial` as one batch, noting whether the collector was running meanwhile."""

    def __init__(self, proxy: LiveProxy, initial: list[dict[str, Any]]) -> None:
        self.proxy, self.initial, self.connected = proxy, initial, True
        self.collector_during_list: bool | None = None
        self._synced = asyncio.Event()

    async def run(self) -> None:
        self.collector_during_list = gc.isenabled()
        self.proxy.on_events([WatchEvent("ADDED", obj["kind"], obj) for obj in self.initial])
        self._synced.set()
        await asyncio.Event().wait()

    async def wait_synced(self) -> None:
        await self._synced.wait()


@pytest.fixture
def restore_gc() -> Any:
    """These tests change the process's collector: leave it as they found it."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


@pytest.mark.parametrize("off_before", [False, True], ids=["collector-on", "off-since-start-up"])
@pytest.mark.parametrize("mode", ["iptables", "nftables"])
@pytest.mark.usefixtures("restore_gc")
def test_managed_gc_is_paused_for_the_cold_start_and_the_heap_frozen_after_it(
    mode: str, off_before: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """`off_before`: `kubeproxy run` turns the collector off before its imports (cli.py); the
    proxy still owns it and turns it on after the first sync."""
    caplog.set_level(logging.INFO, logger="kubeproxy")
    gc.unfreeze()
    if off_before:
        gc.disable()
    node = FakeNode()
    proxy = LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=node)
    proxy.manage_gc = True
    source = _Source(proxy, _service("web", "10.96.0.10", ["10.244.1.1"]))

    async def main() -> None:
        async with serving(proxy, source):
            assert source.collector_during_list is False
            assert gc.isenabled() and gc.get_freeze_count() > 0
            assert proxy.syncs == 1
            # and the freed heap went back to the system once (runtime/memory.py)
            assert sum("Returned freed heap memory" in r.getMessage() for r in caplog.records) == 1

    asyncio.run(main())
    assert gc.isenabled()


@pytest.mark.usefixtures("restore_gc")
def test_managed_gc_comes_back_when_the_proxy_stops_before_a_first_sync() -> None:
    proxy = _proxy()
    proxy.manage_gc = True

    class Never:
        connected = True

        async def run(self) -> None:
            await asyncio.Event().wait()

        async def wait_synced(self) -> None:
            await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(proxy.serve(Never()))
        while proxy.health.status().last_updated is None:  # serve has started
            await asyncio.sleep(0)
        assert not gc.isenabled()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_proxy_that_shares_its_process_leaves_the_collector_alone() -> None:
    node = FakeNode()
    proxy = LiveProxy(CFG, "node-1", run_cmd=node)
    source = _Source(proxy, _service("web", "10.96.0.10", ["10.244.1.1"]))
    frozen = gc.get_freeze_count()

    async def main() -> None:
        task = asyncio.create_task(proxy.serve(source))
        try:
            await asyncio.wait_for(proxy.wait_for_syncs(1), 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert source.collector_during_list is True and gc.get_freeze_count() == frozen
