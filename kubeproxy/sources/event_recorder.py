"""Kubernetes Events written to the API server as upstream kube-proxy writes them.

Upstream records through client-go's events.k8s.io/v1 recorder (tools/events at v0.37.2): each
Event is created with POST /apis/events.k8s.io/v1/namespaces/<ns>/events, named
`<regarding name>.<unix nanoseconds in hex>`, in the regarding object's namespace (`default` for
a Node), with `reportingController: kube-proxy` and `reportingInstance: kube-proxy-<hostname>`.
A transport failure is retried up to 12 tries, 10 s (±25% jitter) apart; an answer from the
server that refuses the Event (any error Status) is logged and the Event dropped.

Recording never blocks and never fails the proxy: `record` puts the Event on a bounded queue
(upstream's broadcaster holds 1000 and drops beyond) and `run`, a task beside the source,
writes them one at a time. An Event recorded before `run` starts waits in the queue: upstream's
broadcaster drops the Events recorded before it starts recording to the API (its start-up
warnings about the default mode and IPVS), which we deliver instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.events")

REPORTING_CONTROLLER = "kube-proxy"
MAX_QUEUED = 1000  # client-go's maxQueuedEvents
MAX_TRIES = 12  # client-go's maxTriesPerEvent
RETRY_SECONDS = 10.0  # client-go's defaultSleepDuration, jittered by up to 25%
MAX_NAME = 253  # a DNS subdomain, what the API server accepts as an Event name
SERIES_FINISH_NS = 6 * 60 * 10**9  # client-go's finishTime
SERIES_REFRESH_NS = 30 * 60 * 10**9  # client-go's refreshTime

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (`regarding`): kube-proxy's Node, or a Service."""

    kind: str
    name: str
    namespace: str = ""
    api_version: str = "v1"

    def body(self) -> dict[str, str]:
        out = {"kind": self.kind, "name": self.name, "apiVersion": self.api_version}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


def node_ref(node_name: str) -> ObjectRef:
    """Upstream's NodeRef: the Node by name, no namespace, no UID."""
    return ObjectRef("Node", node_name)


@dataclass(frozen=True)
class KubeEvent:
    """One Event as upstream's `Recorder.Eventf(regarding, nil, type, reason, action, note)` takes it."""

    regarding: ObjectRef
    type: EventType
    reason: str
    action: str
    note: str = ""


def event_name(regarding: str, unix_nanos: int) -> str:
    """client-go's GenerateEventName; a name too long for the API (a long Node name) gets a
    random one, as there (a UUID)."""
    name = f"{regarding}.{unix_nanos:x}"
    if len(name) > MAX_NAME:
        import uuid

        return str(uuid.uuid4())
    return name


def micro_time(at: datetime) -> str:
    """metav1.MicroTime's JSON form: RFC 3339 in UTC with microseconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event: KubeEvent, *, instance: str, now_ns: int) -> dict[str, Any]:
    """The events.k8s.io/v1 Event upstream's recorder creates for `event` at `now_ns`."""
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(event.regarding.name, now_ns), "namespace": event.regarding.namespace or "default"},
        "eventTime": micro_time(_at(now_ns)),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": event.action,
        "reason": event.reason,
        "regarding": event.regarding.body(),
        "type": event.type,
    }
    if event.note:
        body["note"] = event.note
    return body


def reporting_instance(hostname: str | None = None) -> str:
    """`kube-proxy-<hostname>`: the machine's hostname, as client-go's recorder takes it (os.Hostname)."""
    return f"{REPORTING_CONTROLLER}-{hostname if hostname is not None else socket.gethostname()}"


class _Response(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...


class Poster(Protocol):
    """What the recorder needs of the API client (httpx2.AsyncClient has it)."""

    def post(self, url: str, *, json: Any) -> Awaitable[_Response]: ...

    def patch(self, url: str, *, content: bytes, headers: dict[str, str]) -> Awaitable[_Response]: ...


def _describe(event: KubeEvent) -> str:
    ref = event.regarding
    where = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
    return f"{event.type} {event.reason} {ref.kind}/{where}"


# client-go's eventKey: the same Event again (whatever its note) is one series.
_Key = tuple[str, str, str, ObjectRef]


def _key(event: KubeEvent) -> _Key:
    return (event.type, event.action, event.reason, event.regarding)


@dataclass
class _Series:
    """An Event already created, and how often it happened since (client-go's eventCache entry)."""

    body: dict[str, Any]
    first_ns: int
    count: int = 1
    last_ns: int = 0
    written_ns: int = 0  # when its count was last sent


@dataclass(frozen=True)
class _Write:
    event: KubeEvent
    body: dict[str, Any]  # the whole Event (with its series, for a repeat)
    series: bool  # a repeat: PATCH its series, create it if the server lost it


@dataclass
class EventRecorder:
    """Upstream's recorder and broadcaster for one proxy: `record` from the event loop's thread,
    `run` as a task. `sleep`, `clock_ns` and `jitter` are injected for tests.

    Repeats are aggregated as client-go does: the same Event (type, action, reason, regarding)
    again becomes a series, its count sent (a PATCH) on the first repeat and then at most every
    30 minutes; 6 minutes without a repeat ends it, and the next one is a new Event.
    """

    client: Poster
    instance: str = field(default_factory=reporting_instance)
    max_queued: int = MAX_QUEUED
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock_ns: Callable[[], int] = time.time_ns
    jitter: Callable[[], float] = random.random
    dropped: int = 0
    written: int = 0
    _queue: asyncio.Queue[_Write] = field(init=False)
    _series: dict[_Key, _Series] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(self.max_queued)

    def record(self, event: KubeEvent) -> None:
        """Queue `event` (or its series' new count) with the time it happened; a full queue drops
        it (logged once per run of drops)."""
        now = self.clock_ns()
        key = _key(event)
        seen = self._series.get(key)
        if seen is not None and now - max(seen.first_ns, seen.last_ns) > SERIES_FINISH_NS:
            seen = None  # the series ended: a new Event
        if seen is None:
            body = event_body(event, instance=self.instance, now_ns=now)
            self._series[key] = _Series(body, now)
            self._put(_Write(event, body, series=False))
            return
        seen.count += 1
        seen.last_ns = now
        if seen.count == 2 or now - seen.written_ns >= SERIES_REFRESH_NS:
            seen.written_ns = now
            body = {**seen.body, "series": {"count": seen.count, "lastObservedTime": micro_time(_at(now))}}
            self._put(_Write(event, body, series=True))

    def _put(self, write: _Write) -> None:
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            if not self.dropped:
                log.error(kv("Event queue full, dropping events", limit=self.max_queued, event=_describe(write.event)))
            self.dropped += 1
            return
        if self.dropped:
            log.warning(kv("Event queue has room again", dropped=self.dropped))
            self.dropped = 0

    def pending(self) -> int:
        return self._queue.qsize()

    async def run(self) -> None:
        """Write queued Events until cancelled."""
        while True:
            write = await self._queue.get()
            try:
                await self._write(write)
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Wait until every Event queued so far is written or given up (with `run` running)."""
        await self._queue.join()

    async def _send(self, write: _Write, create: bool) -> _Response:
        meta = write.body["metadata"]
        events = f"/apis/events.k8s.io/v1/namespaces/{meta['namespace']}/events"
        if create:
            return await self.client.post(events, json=write.body)
        # client-go's two-way strategic merge patch from the Event without its series to it.
        patch = json.dumps({"series": write.body["series"]}, separators=(",", ":")).encode()
        return await self.client.patch(f"{events}/{meta['name']}", content=patch,
                                       headers={"Content-Type": "application/strategic-merge-patch+json"})  # fmt: skip

    async def _write(self, write: _Write) -> None:
        create = not write.series
        for attempt in range(1, MAX_TRIES + 1):
            try:
                response = await self._send(write, create)
            except Exception as exc:  # the transport's errors, whatever the client: retried
                problem = f"{type(exc).__name__}: {exc}"
            else:
                code = response.status_code
                if 200 <= code < 300:
                    self.written += 1
                    return
                if code == 404 and not create:
                    create = True  # the server lost the Event: create it, series and all
                    continue
                # Any other answer from the server abandons the Event (409 AlreadyExists quietly).
                if code != 409:
                    log.error(kv("Server rejected event (will not retry!)", event=_describe(write.event), status=code,
                                 err=response.text[:300]))  # fmt: skip
                return
            if attempt == MAX_TRIES:
                log.error(kv("Unable to write event (retry limit exceeded!)", event=_describe(write.event), err=problem))
                return
            log.error(kv("Unable to write event (may retry after sleeping)", event=_describe(write.event), err=problem))
            await self.sleep(RETRY_SECONDS * (1 + 0.25 * self.jitter()))


def _at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)
