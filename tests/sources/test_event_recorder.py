"""The Event recorder: upstream's Event bodies, written to our test API server, and a proxy that
never waits for or fails with them (bounded queue, transport errors retried on a fake clock,
refusals logged and dropped).

The expected body is what upstream v1.37.2's kube-proxy created in our test API server
(captured with `--kube-api-content-type=application/json`): its `Starting` Event about node n1.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from kubeproxy.backends.ipvs import deprecation
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.event_recorder import (
    MAX_TRIES,
    RETRY_SECONDS,
    EventRecorder,
    KubeEvent,
    ObjectRef,
    event_body,
    event_name,
    node_ref,
    reporting_instance,
)

# Upstream's Starting Event as our test API server stored it (server-set metadata removed).
UPSTREAM_STARTING: dict[str, Any] = {
    "metadata": {"name": "n1.18ec31ee0d3d6440", "namespace": "default"},
    "eventTime": "2026-11-28T11:27:29.908089Z",
    "reportingController": "kube-proxy",
    "reportingInstance": "kube-proxy-vm",
    "action": "StartKubeProxy",
    "reason": "Starting",
    "regarding": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
    "type": "Normal",
}
UPSTREAM_NANOS = 0x18EC31EE0D3D6440
STARTING = KubeEvent(node_ref("n1"), "Normal", "Starting", "StartKubeProxy")


def test_the_body_is_upstreams() -> None:
    body = event_body(STARTING, instance=reporting_instance("vm"), now_ns=UPSTREAM_NANOS)
    assert body.pop("apiVersion") == "events.k8s.io/v1" and body.pop("kind") == "Event"
    # Upstream's eventTime is taken a moment after the name's clock reading: same second here.
    assert body.pop("eventTime")[:20] == UPSTREAM_STARTING["eventTime"][:20]
    assert body == {k: v for k, v in UPSTREAM_STARTING.items() if k != "eventTime"}


def test_names_and_namespaces() -> None:
    assert event_name("n1", 255) == "n1.ff"
    long = event_name("n" * 250, 1 << 60)
    assert len(long) == 36 and long.count("-") == 4  # a UUID, as client-go's GenerateEventName
    svc = KubeEvent(ObjectRef("Service", "dns", "kube-system"), "Warning", "FailedToStartServiceHealthcheck", "Listen", "x")
    body = event_body(svc, instance="kube-proxy-vm", now_ns=1)
    assert body["metadata"]["namespace"] == "kube-system" and body["note"] == "x"
    assert body["regarding"] == {"kind": "Service", "name": "dns", "namespace": "kube-system", "apiVersion": "v1"}


def test_the_ipvs_deprecation_event_lands_in_the_api_server() -> None:
    """Through a real HTTP client into the test API server, as `kube-proxy --proxy-mode=ipvs` records it."""
    with ApiServer() as server:

        async def write() -> None:
            async with httpx2.AsyncClient(base_url=server.url) as client:
                rec = EventRecorder(client, instance="kube-proxy-vm", clock_ns=lambda: 0x10)
                rec.record(KubeEvent(node_ref("n1"), "Warning", deprecation.REASON, deprecation.ACTION, deprecation.MESSAGE))
                writer = asyncio.create_task(rec.run())
                await rec.flush()
                writer.cancel()
                assert rec.written == 1

        asyncio.run(write())
        stored = server.get("Event", "default", "n1.10")
    assert stored["reason"] == "IPVSDeprecation" and stored["type"] == "Warning" and stored["action"] == "StartKubeProxy"
    assert stored["note"].startswith("The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40")
    assert stored["regarding"] == {"kind": "Node", "name": "n1", "apiVersion": "v1"}
    assert (stored["reportingController"], stored["reportingInstance"]) == ("kube-proxy", "kube-proxy-vm")


def test_a_repeat_patches_the_stored_events_series() -> None:
    with ApiServer() as server:

        async def write() -> None:
            async with httpx2.AsyncClient(base_url=server.url) as client:
                rec = EventRecorder(client, instance="kube-proxy-vm", clock_ns=lambda: 0x20)
                rec.record(STARTING)
                rec.record(STARTING)
                writer = asyncio.create_task(rec.run())
                await rec.flush()
                writer.cancel()
                assert rec.written == 2

        asyncio.run(write())
        stored = server.get("Event", "default", "n1.20")
    assert stored["series"] == {"count": 2, "lastObservedTime": "1970-01-01T00:00:00.000000Z"}
    assert stored["reason"] == "Starting"


# ------------------------------------------------------------------ failures, on a fake client


@dataclass
class _Answer:
    status_code: int
    text: str = ""


@dataclass
class _Client:
    """Answers each POST with the next of `answers` (an exception is raised)."""

    answers: list[_Answer | Exception]
    posted: list[tuple[str, Any]] = field(default_factory=list)

    async def post(self, url: str, *, json: Any) -> _Answer:
        self.posted.append((url, json))
        return self._answer()

    async def patch(self, url: str, *, content: bytes, headers: dict[str, str]) -> _Answer:
        assert headers == {"Content-Type": "application/strategic-merge-patch+json"}
        self.posted.append((url, content))
        return self._answer()

    def _answer(self) -> _Answer:
        answer = self.answers.pop(0) if self.answers else _Answer(201)
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class _Sleeps:
    slept: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


def _drive(rec: EventRecorder, events: list[KubeEvent]) -> None:
    async def go() -> None:
        for ev in events:
            rec.record(ev)
        writer = asyncio.create_task(rec.run())
        await rec.flush()
        writer.cancel()

    asyncio.run(go())


def _recorder(client: _Client, sleeps: Callable[[float], Awaitable[None]], max_queued: int = 10,
              clock: Callable[[], int] = lambda: 1) -> EventRecorder:  # fmt: skip
    return EventRecorder(client, instance="kube-proxy-vm", max_queued=max_queued, sleep=sleeps, clock_ns=clock,
                         jitter=lambda: 1.0)  # fmt: skip


def _node(n: int) -> KubeEvent:
    """Distinct Events (another Node each): none is a repeat of another."""
    return KubeEvent(node_ref(f"n{n}"), "Normal", "Starting", "StartKubeProxy")


def test_transport_errors_are_retried_then_given_up(caplog: pytest.LogCaptureFixture) -> None:
    down: Exception = httpx2.ConnectError("connection refused")
    answers: list[_Answer | Exception] = [*([down] * MAX_TRIES), down, _Answer(201)]
    client, sleeps = _Client(answers), _Sleeps()
    rec = _recorder(client, sleeps)
    with caplog.at_level(logging.ERROR, "kubeproxy.events"):
        _drive(rec, [_node(1), _node(2)])
    # The first: 12 tries, 11 sleeps of 10 s + 25% jitter; the second: one failure, then written.
    assert len(client.posted) == MAX_TRIES + 2 and rec.written == 1
    assert sleeps.slept == [RETRY_SECONDS * 1.25] * (MAX_TRIES - 1 + 1)
    assert sum("retry limit exceeded" in r.getMessage() for r in caplog.records) == 1
    assert all(url == "/apis/events.k8s.io/v1/namespaces/default/events" for url, _ in client.posted)


def test_a_refusal_is_logged_and_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    client, sleeps = _Client([_Answer(403, "events.events.k8s.io is forbidden"), _Answer(409)]), _Sleeps()
    rec = _recorder(client, sleeps)
    with caplog.at_level(logging.ERROR, "kubeproxy.events"):
        _drive(rec, [_node(1), _node(2), _node(3)])
    assert len(client.posted) == 3 and sleeps.slept == [] and rec.written == 1
    rejected = [r.getMessage() for r in caplog.records if "Server rejected event" in r.getMessage()]
    assert len(rejected) == 1 and "forbidden" in rejected[0]  # the 409 (already exists) is quiet


def test_a_full_queue_drops_and_never_blocks(caplog: pytest.LogCaptureFixture) -> None:
    client = _Client([])
    rec = _recorder(client, _Sleeps(), max_queued=3)
    with caplog.at_level(logging.WARNING, "kubeproxy.events"):
        for _ in range(5):
            rec.record(_node(_))  # no writer running: the queue fills
    assert rec.pending() == 3 and rec.dropped == 2
    assert sum("Event queue full" in r.getMessage() for r in caplog.records) == 1
    _drive(rec, [])
    assert rec.written == 3 and len(client.posted) == 3


MINUTE = 60 * 10**9


def test_repeats_are_one_event_with_a_series_as_client_go_aggregates_them() -> None:
    now = [10**18]
    client = _Client([])
    rec = _recorder(client, _Sleeps(), clock=lambda: now[0])
    failed = KubeEvent(ObjectRef("Service", "dns", "kube-system"), "Warning", "FailedToStartServiceHealthcheck", "Listen", "")

    def happens(at_minute: float, note: str = "port 30000 in use") -> None:
        now[0] = 10**18 + int(at_minute * MINUTE)
        rec.record(KubeEvent(failed.regarding, failed.type, failed.reason, failed.action, note))

    async def written() -> None:
        writer = asyncio.create_task(rec.run())
        await rec.flush()
        writer.cancel()

    async def go() -> None:
        for minute in (0, 1, 2, 3):  # a different note is the same Event (client-go's key has none)
            happens(minute, note=f"attempt {minute}")
        await written()
        created, patched = client.posted
        assert created[0] == "/apis/events.k8s.io/v1/namespaces/kube-system/events" and created[1]["note"] == "attempt 0"
        name = created[1]["metadata"]["name"]
        assert patched[0] == f"{created[0]}/{name}"
        assert json.loads(patched[1]) == {"series": {"count": 2, "lastObservedTime": "2001-09-09T01:47:40.000000Z"}}
        # Repeats every few minutes: the count is sent again only 30 minutes after the last.
        for minute in range(5, 40, 5):
            happens(minute)
        await written()  # minute 35 is 34 after the last count sent
        assert len(client.posted) == 3 and json.loads(client.posted[2][1])["series"]["count"] == 11
        # Six minutes without a repeat end the series: the next is a new Event.
        happens(42)
        await written()
        assert len(client.posted) == 4 and client.posted[3][0] == created[0]
        assert client.posted[3][1]["metadata"]["name"] != name

    asyncio.run(go())


def test_a_series_the_server_lost_is_created_whole() -> None:
    client = _Client([_Answer(201), _Answer(404)])
    rec = _recorder(client, _Sleeps())
    _drive(rec, [STARTING, STARTING])
    url, body = client.posted[2]
    assert url == "/apis/events.k8s.io/v1/namespaces/default/events" and body["series"]["count"] == 2
    assert rec.written == 2
