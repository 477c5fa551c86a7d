"""The reflector against answers no real API server gives: each one is a logged error retried
with back-off, never an exception out of the reflector, and the reflector converges once the
server is sane. The same against the real `kube-proxy` process: tests/sources/test_api_hostile_live.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.apiserver.hostile import FAULTS, Hostility
from kubeproxy.sources import wire
from kubeproxy.sources.api import ApiSource, Reflector, services
from kubeproxy.sources.backoff import MAX_SERVER_DELAYS, Backoff
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.sources.test_api_reflector import Delays, NoJitter, run, svc, take, watching

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def reflecting(
    server: ApiServer, delays: Delays, **options: Any
) -> AsyncIterator[tuple[Reflector, asyncio.Queue[WatchEvent]]]:
    client = connect(load_config(master=server.url), trust_env=False)
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    reflector = Reflector(client, services(), queue.put_nowait, backoff=Backoff(rand=NoJitter()), sleep=delays.sleep, **options)
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector, queue
        assert not task.done(), "the reflector ended"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


def backing_off(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith('"Failed to watch"')]


def no_defects(caplog: pytest.LogCaptureFixture) -> None:
    defects = [r.getMessage() for r in caplog.records if r.name == "kubeproxy.sources.api" and r.levelno >= logging.ERROR]
    assert defects == []


# The shapes of the finding: a watch ERROR whose Status code is a list, an object or 1e400.
CONFUSED_CODES = ["[1]", '{"a": 1}', "1e400", "-1e400", '"410"', "410.0", "4294967296"]


@pytest.mark.parametrize("code", CONFUSED_CODES)
def test_a_watch_error_with_a_confused_status_code_is_retried(code: str, caplog: pytest.LogCaptureFixture) -> None:
    hostility = Hostility(rate=0.0)
    delays = Delays()

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            server.apply(svc("a"))
            async with reflecting(server, delays) as (reflector, queue):
                await reflector.wait_synced()
                assert await take(queue, 1) == [("ADDED", "a")]
                await watching(server)
                hostility.script(b'{"type": "ERROR", "object": {"kind": "Status", "code": ' + code.encode() + b"}}\n", watch=True)
                server.drop_watches()
                await delays.slept.wait()
                await watching(server)
                server.apply(svc("b"))
                assert await take(queue, 1) == [("ADDED", "b")]

    run(main())
    # (The dropped watch is one error; the Status the next one meets is another.)
    assert any("500 MalformedStatus: the Status is malformed" in m and "$.code" in m for m in backing_off(caplog))
    no_defects(caplog)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"kind": "ServiceList", "apiVersion": "v1", "metadata": [1], "items": []}', "the list is malformed"),
        (b'{"kind": "ServiceList", "apiVersion": "v1", "metadata": "rv", "items": []}', "$.metadata"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": 7}, "items": []}', "$.metadata.resourceVersion"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "7", "continue": {}}}', "$.metadata.continue"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": {"a": 1}}', "items are not a JSON list"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": [5]}', "item 0 of the list is not a JSON"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": [{"metadata": 5}]}', "metadata is not"),
        (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": [{"metadata": {}}]}', "no metadata.name"),
        (b'{"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": []}', "PodList is not a list of Service"),
        (
            b'{"metadata": {"resourceVersion": "7"}, "items": [{"kind": "Pod", "metadata": {"name": "p"}}]}',
            "is a Pod, not a Service",
        ),
        (b"[1, 2]", "the list is not a JSON object"),
        (b'{"kind": "ServiceList", "items": [', "not JSON"),
    ],
)
def test_a_malformed_list_is_refused_whole_and_retried(body: bytes, says: str, caplog: pytest.LogCaptureFixture) -> None:
    """Refused whole, not item by item: a list that skipped the bad items would delete them."""
    hostility = Hostility(rate=0.0)
    delays = Delays()

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            server.apply(svc("a"))
            hostility.script(body, watch=False)
            async with reflecting(server, delays, typed_lists=True) as (reflector, queue):
                await reflector.wait_synced()
                assert await take(queue, 1) == [("ADDED", "a")]

    run(main())
    [message] = backing_off(caplog)
    assert "BadList" in message and says in message, message
    no_defects(caplog)


def test_a_relist_that_meets_a_malformed_list_keeps_every_object(caplog: pytest.LogCaptureFixture) -> None:
    hostility = Hostility(rate=0.0)
    delays = Delays()

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            server.apply(svc("a"))
            async with reflecting(server, delays) as (reflector, queue):
                await reflector.wait_synced()
                assert await take(queue, 1) == [("ADDED", "a")]
                await watching(server)
                for bad in (b'{"kind": "ServiceList", "metadata": {"resourceVersion": "99"}, "items": [{"metadata": {}}]}',
                            b'{"kind": "ServiceList", "metadata": {"resourceVersion": "99"}, "items": ["a"]}'):  # fmt: skip
                    hostility.script(bad, watch=False)
                server.end_watches_with({"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired"})
                await watching(server)
                server.apply(svc("b"))
                assert await take(queue, 1) == [("ADDED", "b")]  # no DELETED "a" before it
                assert reflector.lists == 2

    run(main())
    assert len([m for m in backing_off(caplog) if "BadList" in m]) == 2
    no_defects(caplog)


@pytest.mark.parametrize(
    "frame",
    [
        b"[1]",
        b'{"type": 7, "object": {}}',
        b'{"type": "SOMETHING", "object": {"metadata": {"name": "x"}}}',
        b'{"type": "ADDED", "object": "a string"}',
        b'{"type": "ADDED", "object": {"metadata": [1]}}',
        b'{"type": "MODIFIED", "object": {"metadata": {"name": ["x"]}}}',
        b'{"type": "ADDED", "object": {"metadata": {"namespace": "default"}}}',
        b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": 5}}}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "x"}',
        b"\x00\xff not json",
    ],
)
def test_a_malformed_watch_event_ends_the_watch_and_it_resumes(frame: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """As client-go: the watch ends with an error and restarts from the last version, so the
    event the bad line stood for is not lost (skipping the line would lose it)."""
    hostility = Hostility(rate=0.0)
    delays = Delays()

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            async with reflecting(server, delays) as (reflector, queue):
                await reflector.wait_synced()
                await watching(server)
                hostility.script(frame + b"\n", watch=True)
                server.drop_watches()
                await delays.slept.wait()
                server.apply(svc("b"))
                assert await take(queue, 1) == [("ADDED", "b")]

    run(main())
    assert any("MalformedEvent" in m or "MalformedStatus" in m for m in backing_off(caplog)), backing_off(caplog)
    no_defects(caplog)


def test_an_event_of_another_kind_is_skipped_as_client_go_does(caplog: pytest.LogCaptureFixture) -> None:
    hostility = Hostility(rate=0.0)

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            async with reflecting(server, Delays()) as (reflector, queue):
                await reflector.wait_synced()
                await watching(server)
                pod = b'{"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}}\n'
                hostility.script(pod, watch=True)
                server.drop_watches()
                await watching(server)
                server.apply(svc("b"))
                assert await take(queue, 1) == [("ADDED", "b")]

    run(main())
    assert any("skipping a ADDED event for a Pod, not a Service" in r.getMessage() for r in caplog.records)


def test_a_line_that_never_ends_is_cut_at_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    hostility = Hostility(rate=0.0)
    delays = Delays()
    limit = 256 * 1024

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            async with reflecting(server, delays, max_frame_bytes=limit) as (reflector, queue):
                await reflector.wait_synced()
                await watching(server)
                hostility.script(b'{"type": "ADDED", "object": {"metadata": {"name": "' + b"a" * (4 * limit), watch=True)
                server.drop_watches()
                await delays.slept.wait()
                server.apply(svc("b"))
                assert await take(queue, 1) == [("ADDED", "b")]

    run(main())
    assert any(f"FrameTooLarge: a watch event is over {limit} bytes without a newline" in m for m in backing_off(caplog))


def test_the_default_frame_bound_takes_the_largest_real_object(caplog: pytest.LogCaptureFixture) -> None:
    """The API server refuses a request body over 3 MiB: an object that size arrives whole."""
    delays = Delays()

    async def main() -> None:
        with ApiServer() as server:
            async with reflecting(server, delays) as (reflector, queue):
                await reflector.wait_synced()
                await watching(server)
                big = svc("big")
                big["metadata"]["annotations"] = {"big": "x" * (3 * wire.MIB)}
                server.apply(big)
                event = await queue.get()
                assert isinstance(event.obj, dict)
                assert (event.name, len(event.obj["metadata"]["annotations"]["big"])) == ("big", 3 * wire.MIB)

    run(main())
    assert delays.delays == []


@pytest.mark.parametrize("bound", ["pages", "bytes"])
def test_a_continue_token_that_never_ends_is_cut_at_the_bound(bound: str, caplog: pytest.LogCaptureFixture) -> None:
    hostility = Hostility(rate=1.0, faults=("endless-continue",), pages=10**9)
    delays = Delays(on_sleep=lambda attempt: setattr(hostility, "rate", 0.0))
    options = {"max_list_pages": 30} if bound == "pages" else {"max_list_bytes": 3000}

    async def main() -> None:
        with ApiServer(hostility=hostility) as server:
            server.apply(svc("a"))
            async with reflecting(server, delays, **options) as (reflector, queue):
                await reflector.wait_synced()
                assert await take(queue, 1) == [("ADDED", "a")]

    run(main())
    [message] = backing_off(caplog)
    expected = "did not end within 30 pages" if bound == "pages" else "the list is over"
    assert expected in message, message
    no_defects(caplog)


def test_retry_after_is_read_as_client_go_reads_it() -> None:
    assert wire.retry_after(429, "5") == 5
    assert wire.retry_after(503, "+5") == 5 and wire.retry_after(500, "-3") == -3
    assert wire.retry_after(504, "0") == 0
    for header in ("1e3", "\u0661", "Wed, 21 Oct 2015 07:28:00 GMT", "99999999999999999999", "", "5s", " "):
        assert wire.retry_after(429, header) is None, header
    for status in (200, 404, 410, 499):
        assert wire.retry_after(status, "5") is None


def test_retry_after_replaces_the_schedule_capped_and_at_most_ten_times_in_a_row() -> None:
    backoff = Backoff(rand=NoJitter())
    assert [backoff.next(7), backoff.next(), backoff.next(-3), backoff.next(10**6)] == [7, 0.8, 0, 30.0]
    backoff.succeeded()
    obeyed = [backoff.next(1) for _ in range(MAX_SERVER_DELAYS + 2)]
    # A server cannot keep the client spinning: then the schedule goes on from where it was.
    assert obeyed == [1] * MAX_SERVER_DELAYS + [1.6, 3.2]
    backoff.succeeded()
    assert backoff.next(2) == 2


def test_a_429_with_retry_after_is_obeyed_with_an_injected_clock(caplog: pytest.LogCaptureFixture) -> None:
    delays = Delays(on_sleep=lambda attempt: server.fail_with(None) if attempt == 3 else None)
    server = ApiServer()

    async def main() -> None:
        server.apply(svc("a"))
        server.fail_with(429, retry_after=7)
        with server:
            async with reflecting(server, delays) as (reflector, queue):
                await reflector.wait_synced()
                assert await take(queue, 1) == [("ADDED", "a")]

    run(main())
    assert delays.delays == [7, 7, 7]
    assert 'retryIn="7s" retryAfter="7s"' in backing_off(caplog)[0]


# ---------------------------------------------------------------------------------------------
# The seeded campaign, in process: every fault, three reflectors, objects changing meanwhile.


@dataclass
class Mirror:
    """What the consumer holds, and every deletion it was told of."""

    objects: dict[tuple[str, str, str], object] = field(default_factory=dict)
    deleted: list[tuple[str, str, str]] = field(default_factory=list)

    def on_event(self, event: WatchEvent) -> None:
        key = (event.kind, event.namespace, event.name)
        if event.type == "DELETED":
            self.deleted.append(key)
            self.objects.pop(key, None)
        else:
            self.objects[key] = event.obj


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_hostile_campaign_never_ends_a_reflector_or_loses_an_object(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    hostility = Hostility(seed=seed, rate=0.6, endless_bytes=wire.MAX_FRAME_BYTES + wire.MIB, pages=40, slow_seconds=0.3)
    mirror = Mirror()
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "me"}}

    async def fast(delay: float) -> None:
        await asyncio.sleep(0.001)  # the injected clock: back-off is recorded, not waited

    async def main() -> None:
        with ApiServer(hostility=hostility, bookmark_interval=0.05) as server:
            server.apply(node)
            for n in range(5):
                server.apply(svc(f"s{n}"))
            # No rate limit (test_throttle.py): the campaign wants many answers, soon.
            client = connect(load_config(master=server.url), trust_env=False, qps=0)
            source = ApiSource(client, "me", mirror.on_event, backoff_factory=lambda: Backoff(rand=NoJitter()), sleep=fast,
                               typed_lists=bool(seed % 2))  # fmt: skip
            task = asyncio.create_task(source.run())
            try:
                n = 5
                while sum(hostility.served.values()) < 100:
                    server.apply(svc(f"s{n}"))  # objects keep changing while the server misbehaves
                    n += 1
                    if n % 3 == 0:
                        server.drop_watches()  # a healthy watch would otherwise ask for nothing more
                    await asyncio.sleep(0.05)
                    assert not task.done()
                hostility.rate = 0.0
                want = {("Service", "default", f"s{i}") for i in range(n)} | {("Node", "", "me")}
                while set(mirror.objects) != want:
                    await asyncio.sleep(0.02)
                    assert not task.done()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 50))
    assert mirror.deleted == []  # nothing was deleted: no deletion may have been delivered
    assert len(hostility.served) >= 5, hostility.served
    no_defects(caplog)


def test_every_fault_is_drawn() -> None:
    hostility = Hostility(rate=1.0)
    drawn = {(hostility.draw(watch, {}) or ("",))[0] for watch in (True, False) for _ in range(300)}
    assert drawn == set(FAULTS)
