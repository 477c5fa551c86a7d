"""The network-programming latency metric follows upstream's rules (endpointschangetracker.go):
deleted slices and triggers from before the proxy started are not observed; an unchanged slice
(a resync, a relist) is not observed again; a normal update is observed once as now - trigger."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from kubeproxy.cluster.objects import parse_endpoint_slice
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.proxy.programming import TRIGGER_TIME_ANNOTATION, TriggerTimes, latencies, trigger_time
from kubeproxy.sources.events import WatchEvent

START = 1_700_000_000.0


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def eps(name: str, ips: list[str], trigger: float | None, *, service: str = "web") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}}
    if trigger is not None:
        meta["annotations"] = {TRIGGER_TIME_ANNOTATION: stamp(trigger)}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]} for ip in ips],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def no_commands(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"no command expected: {argv}")


@pytest.fixture
def proxy() -> tuple[LiveProxy, Clock]:
    clock = Clock(START)
    return LiveProxy(ProxyConfig(), "node-1", run_cmd=no_commands, wall_clock=clock), clock


def observed(proxy: LiveProxy, now: float) -> tuple[float, float]:
    """Record one successful sync at `now`; returns the histogram's (count, sum)."""
    proxy.wall_clock.now = now  # type: ignore[attr-defined]
    report = SimpleNamespace(
        full=True, no_local_endpoints_internal=0, no_local_endpoints_external=0, rule_counts={}, written_rule_counts={}
    )
    lane = proxy.lanes[0]
    lane.metrics.record_sync(report, 0.01, now, latencies(proxy._triggers.take(), now))
    hist = lane.metrics.network_programming_duration
    samples = {s.name: s.value for m in hist.collect() for s in m.samples}
    return samples["kubeproxy_network_programming_duration_seconds_count"], samples[
        "kubeproxy_network_programming_duration_seconds_sum"
    ]


def test_a_normal_update_is_observed_once_as_now_minus_trigger(proxy: tuple[LiveProxy, Clock]) -> None:
    p, _ = proxy
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("web-1", ["10.0.0.1"], START + 10)))
    assert observed(p, START + 12.5) == (1, 2.5)
    # The same sync's triggers are not observed twice.
    assert observed(p, START + 20) == (1, 2.5)


def test_a_deleted_slice_is_not_observed_and_drops_its_services_pending_triggers(proxy: tuple[LiveProxy, Clock]) -> None:
    p, _ = proxy
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("web-1", ["10.0.0.1"], START + 10)))
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("other-1", ["10.0.0.9"], START + 11, service="other")))
    p.on_event(WatchEvent("DELETED", "EndpointSlice", eps("web-1", ["10.0.0.1"], START + 10)))
    # Only the other service's trigger is left; the deletion itself records nothing.
    assert observed(p, START + 13) == (1, 2.0)
    p.on_event(WatchEvent("DELETED", "EndpointSlice", eps("other-1", ["10.0.0.9"], START + 11, service="other")))
    assert observed(p, START + 500) == (1, 2.0)


def test_a_trigger_from_before_the_proxy_started_is_not_observed(proxy: tuple[LiveProxy, Clock]) -> None:
    p, _ = proxy
    # The initial list after a restart: slices last changed an hour ago.
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("web-1", ["10.0.0.1"], START - 3600)))
    # Exactly at the start is not after it (upstream: t.After(trackerStartTime)).
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("web-2", ["10.0.0.2"], START)))
    assert observed(p, START + 1) == (0, 0.0)


def test_an_unchanged_slice_from_a_resync_is_not_observed_again(proxy: tuple[LiveProxy, Clock]) -> None:
    p, _ = proxy
    obj = eps("web-1", ["10.0.0.1"], START + 10)
    p.on_event(WatchEvent("ADDED", "EndpointSlice", obj))
    assert observed(p, START + 11) == (1, 1.0)
    p.on_event(WatchEvent("MODIFIED", "EndpointSlice", obj))  # a relist delivers it again
    assert observed(p, START + 300) == (1, 1.0)


def test_a_slice_without_or_with_a_malformed_trigger_is_not_observed(proxy: tuple[LiveProxy, Clock]) -> None:
    p, _ = proxy
    p.on_event(WatchEvent("ADDED", "EndpointSlice", eps("web-1", ["10.0.0.1"], None)))
    bad = eps("web-2", ["10.0.0.2"], None)
    bad["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: "yesterday"}
    p.on_event(WatchEvent("ADDED", "EndpointSlice", bad))
    assert observed(p, START + 1) == (0, 0.0)


def test_trigger_time_parses_rfc3339_and_rejects_the_rest() -> None:
    assert trigger_time(eps("a", [], START + 0.25)) == START + 0.25
    for raw in ("", "soon", "2024-01-01T00:00:00"):  # the last has no offset
        assert trigger_time({"metadata": {"annotations": {TRIGGER_TIME_ANNOTATION: raw}}}) is None
    assert trigger_time({"metadata": "x"}) is None
    assert trigger_time({}) is None


def test_trigger_times_are_kept_per_service_and_taken_once() -> None:
    t = TriggerTimes(start=START)
    a1 = parse_endpoint_slice(eps("a-1", ["10.0.0.1"], None, service="a"))
    a2 = parse_endpoint_slice(eps("a-1", ["10.0.0.2"], None, service="a"))
    b1 = parse_endpoint_slice(eps("b-1", ["10.0.0.3"], None, service="b"))
    t.slice_event(None, a1, START + 1)
    t.slice_event(a1, a2, START + 2)
    t.slice_event(None, b1, START + 3)
    assert len(t) == 3
    taken = t.take()
    assert taken == {("default", "a"): [START + 1, START + 2], ("default", "b"): [START + 3]}
    assert len(t) == 0 and t.take() == {}
    assert sorted(latencies(taken, START + 10)) == [7.0, 8.0, 9.0]
