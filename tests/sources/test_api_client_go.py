"""What the reflector asks the API server, request by request, against client-go v0.37.2's
reflector (tools/cache/reflector.go) and pager: list versions, watch-lists and their fallback,
the waits before relists, the resume check only where a restart may hide, and upstream
kube-proxy's Service field selector. The test API server's request log is the evidence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import ApiServer, status_object
from kubeproxy.sources.api import NOT_HEADLESS, ApiSource, Reflector, services
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.sources.conftest import request
from tests.sources.test_api_reflector import Delays, reflecting, svc, take, watching
from tests.sources.test_lost_state import requests_since

pytestmark = pytest.mark.timeout(60)

WATCH_LIST = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    # A short wait for a version the store does not have: upstream waits 3 s before answering.
    with ApiServer(block_timeout=0.1) as server:
        yield server


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 40))


def without_timeout(sent: list[dict[str, str]]) -> list[dict[str, str]]:
    """The requests without their path and the randomised `timeoutSeconds`."""
    return [{k: v for k, v in r.items() if k not in ("path", "timeoutSeconds")} for r in sent]


def gone() -> dict[str, Any]:
    return status_object(410, "Expired", "too old resource version: 1 (9)")


# ---------------------------------------------------------------------------------------------
# Plain lists (no watch-list)


def test_first_list_at_zero_relist_at_the_last_version_after_a_wait(api: ApiServer, tmp_path: Path) -> None:
    """client-go: the first list at "0" (the watch cache, paged by the pager's 500, which the
    cache ignores), a 410 on the watch relists at the last version seen without a limit (the
    cache again: no etcd read), after a wait from the back-off schedule."""
    delays = Delays()

    async def main() -> None:
        api.apply(svc("a"))
        async with reflecting(api, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            first = str(api.resource_version)
            api.apply(svc("b"))
            assert await take(queue, 2) == [("ADDED", "a"), ("ADDED", "b")]
            last = str(api.resource_version)
            mark = len(api.requests)
            api.end_watches_with(gone())
            await reflector.wait_listed(2)
            assert queue.empty()  # nothing changed: the relist delivers nothing
            api.apply(svc("c"))  # reaches the reflector on the watch after the relist
            assert await take(queue, 1) == [("ADDED", "c")]
            assert without_timeout(requests_since(api, mark)) == [
                {"resourceVersion": last},
                {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"},
            ]
        assert without_timeout(requests_since(api, 0))[:2] == [
            {"resourceVersion": "0", "limit": "500"},
            {"watch": "true", "resourceVersion": first, "allowWatchBookmarks": "true"},
        ]

    run(main())
    assert delays.delays == [0.8]  # the wait before the relist, drawn from the schedule


def test_a_list_at_a_version_the_server_lacks_is_a_consistent_read_at_once(api: ApiServer, tmp_path: Path) -> None:
    """A relist at the last version meets "Too large resource version" (the server came back
    from an old backup): client-go lists again at once without a version (from etcd)."""
    delays = Delays()

    async def main() -> None:
        for n in range(10):
            api.apply(svc("a", port=80 + n))
        async with reflecting(api, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            last = reflector.resource_version
            old = api.store
            api.store = old.fresh_copy()  # the versions start low again; the open watch is the old one's
            mark = len(api.requests)
            old.end_watches_with(gone())
            await reflector.wait_listed(2)
            sent = requests_since(api, mark)
            assert without_timeout(sent[:2]) == [{"resourceVersion": last}, {"limit": "500"}]
            assert reflector.resource_version == str(api.resource_version)
            # The ADDED of the first list, and a MODIFIED: the version changed.
            assert await take(queue, 2) == [("ADDED", "a"), ("MODIFIED", "a")]

    run(main())
    assert delays.delays == [0.8]  # the fallback did not wait


# ---------------------------------------------------------------------------------------------
# Watch-lists


def test_watch_list_streams_the_state_then_watches_on_the_same_stream(api: ApiServer, tmp_path: Path) -> None:
    delays = Delays()

    async def main() -> None:
        api.apply(svc("a"))
        api.apply(svc("b"))
        async with reflecting(api, tmp_path, sleep=delays.sleep, watch_list=True) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 2) == [("ADDED", "a"), ("ADDED", "b")]
            assert reflector.resource_version == str(api.resource_version)
            api.apply(svc("c"))
            assert await take(queue, 1) == [("ADDED", "c")]
            # One request so far: the state and the change came on the same stream, no list.
            assert without_timeout(requests_since(api, 0)) == [WATCH_LIST]
            last = str(api.resource_version)
            mark = len(api.requests)
            api.delete("Service", "default", "a")
            api.expire_history()  # the watch's version is gone: 410 on the stream
            await reflector.wait_listed(2)
            # Again a watch-list, from the last version seen: the server streams the state as of
            # then or newer; only what changed is delivered.
            assert without_timeout(requests_since(api, mark)) == [{**WATCH_LIST, "resourceVersion": last}]
            assert await take(queue, 1) == [("DELETED", "a")]
            assert reflector.lists == 2

    run(main())
    assert delays.delays == [0.8]


def test_a_server_without_watch_lists_is_listed_and_not_asked_again(tmp_path: Path) -> None:
    """A kube-apiserver with its WatchList feature off refuses sendInitialEvents with 422, as
    apimachinery's validateWatchOptions: the reflector lists instead, at once, and does not ask
    for a watch-list again."""
    delays = Delays()

    async def main() -> None:
        with ApiServer(watch_list=False) as api:
            api.apply(svc("a"))
            async with reflecting(api, tmp_path, sleep=delays.sleep, watch_list=True) as (reflector, queue):
                await reflector.wait_synced()
                await watching(api)
                assert await take(queue, 1) == [("ADDED", "a")]
                last = str(api.resource_version)
                mark = len(api.requests)
                api.end_watches_with(gone())
                await reflector.wait_listed(2)
                await watching(api)
                sent = without_timeout(requests_since(api, 0))
                assert sent[:3] == [
                    WATCH_LIST,
                    {"resourceVersion": "0", "limit": "500"},
                    {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"},
                ]
                assert without_timeout(requests_since(api, mark))[0] == {"resourceVersion": last}

    run(main())
    assert delays.delays == [0.8]  # the refusal was not backed off; the 410 was waited for


def test_watch_list_options_are_validated_as_upstream(api: ApiServer) -> None:
    path = "/api/v1/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true"
    status, body = request(api, "GET", path)
    assert status == 422
    assert body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires '
        "setting resourceVersionMatch to NotOlderThan"
    )
    status, body = request(api, "GET", "/api/v1/services?watch=true&resourceVersionMatch=NotOlderThan")
    assert status == 422 and "resourceVersionMatch is forbidden for watch unless sendInitialEvents" in body["message"]
    api.watch_list = False
    status, body = request(api, "GET", path + "&resourceVersionMatch=NotOlderThan")
    assert status == 422 and body["message"].endswith(
        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    )


def test_a_watch_list_from_a_version_the_server_lacks_streams_the_current_state(api: ApiServer, tmp_path: Path) -> None:
    """The server answers the watch-list from our version with "Too large resource version" (an
    ERROR event): client-go asks again at once without a version."""
    delays = Delays()

    async def main() -> None:
        for n in range(10):
            api.apply(svc("a", port=80 + n))
        async with reflecting(api, tmp_path, sleep=delays.sleep, watch_list=True) as (reflector, queue):
            await reflector.wait_synced()
            last = reflector.resource_version
            await watching(api)
            old = api.store
            api.store = old.fresh_copy()
            mark = len(api.requests)
            old.end_watches_with(gone())
            await reflector.wait_listed(2)
            assert without_timeout(requests_since(api, mark)[:2]) == [{**WATCH_LIST, "resourceVersion": last}, WATCH_LIST]
            assert reflector.resource_version == str(api.resource_version)
            assert [e.type for e in [queue.get_nowait() for _ in range(queue.qsize())]] == ["ADDED", "MODIFIED"]

    run(main())
    assert delays.delays == [0.8]


def test_a_watch_list_that_ends_before_its_initial_events_falls_back_to_a_list() -> None:
    """A server that ignores sendInitialEvents (before 1.27) streams no end bookmark: the
    stream ends as a plain watch would, and the reflector lists instead."""
    seen: list[dict[str, str]] = []
    item = {"metadata": {"name": "a", "namespace": "default", "resourceVersion": "5"}}

    def answer(req: httpx2.Request) -> httpx2.Response:
        params = dict(req.url.params)
        seen.append(params)
        if params.get("watch") and params.get("sendInitialEvents"):
            frame = {"type": "ADDED", "object": {"kind": "Service", "apiVersion": "v1", **item}}
            return httpx2.Response(200, content=json.dumps(frame).encode() + b"\n")
        if params.get("watch"):
            return httpx2.Response(200, content=b"")
        listed = {"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": [item]}
        return httpx2.Response(200, json=listed)

    async def main() -> None:
        client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="http://api")
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        reflector = Reflector(client, services(), queue.put_nowait, sleep=Delays().sleep, watch_list=True)
        task = asyncio.create_task(reflector.run())
        try:
            await reflector.wait_synced()
            assert await take(queue, 1) == [("ADDED", "a")]
            assert queue.empty()  # the streamed ADDED was not delivered: only the list's
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.aclose()

    run(main())
    assert [{k: v for k, v in r.items() if k != "timeoutSeconds"} for r in seen[:2]] == [
        WATCH_LIST,
        {"resourceVersion": "0", "limit": "500"},
    ]


# ---------------------------------------------------------------------------------------------
# Waits and resume checks


async def until(condition: Callable[[], bool]) -> None:
    """Until `condition()` holds (another task's progress, read by polling), at most 10 s."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


async def resumed(api: ApiServer, mark: int) -> None:
    """Until a watch was asked for after the first `mark` requests: the reflector saw its cut."""
    await until(lambda: any(r.get("watch") for r in requests_since(api, mark)))


def test_a_watch_cut_after_an_event_is_resumed_at_once_and_its_event_proves_the_history(api: ApiServer, tmp_path: Path) -> None:
    """As client-go, a cut watch that had carried an event is watched again at once; the server
    may have restarted without its history, and the resumed watch's first event (never older
    than the version it started from) shows it did not: no request more than client-go's."""
    delays = Delays()

    async def main() -> None:
        async with reflecting(api, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            api.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            last = str(api.resource_version)
            mark = len(api.requests)
            api.drop_watches()
            await resumed(api, mark)  # before the change, so that the change proves it
            assert not reflector.connected
            api.apply(svc("b"))
            assert await take(queue, 1) == [("ADDED", "b")]
            await until(lambda: reflector.connected)
            assert without_timeout(requests_since(api, mark)) == [
                {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"},
            ]
            assert reflector.lists == 1

    run(main())
    assert delays.delays == []


def test_a_resumed_watch_with_no_news_is_proven_by_its_bookmark(api: ApiServer, tmp_path: Path) -> None:
    """A quiet cluster: the server's periodic bookmark, at or past our version, is the proof."""

    async def main() -> None:
        async with reflecting(api, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            api.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            mark = len(api.requests)
            api.drop_watches()
            await resumed(api, mark)
            assert not reflector.connected

            def bookmarked() -> bool:
                # The server's revision moved on (another resource's write): its bookmark carries
                # it. Sent until it lands (the resumed watch may not be registered yet).
                api.bookmark(api.resource_version + 1)
                return reflector.connected

            await until(bookmarked)
            assert [r.get("watch") for r in requests_since(api, mark)] == ["true"]

    run(main())


def test_a_resumed_watch_with_no_proof_asks_once_with_the_watch_open(api: ApiServer, tmp_path: Path) -> None:
    """No event and no bookmark within `proof_wait`: one object at our version is asked for, and
    the watch that was open goes on (the change after the check arrives on it)."""

    async def main() -> None:
        async with reflecting(api, tmp_path, proof_wait=0.2) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            api.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            last = str(api.resource_version)
            mark = len(api.requests)
            api.drop_watches()
            await resumed(api, mark)
            await until(lambda: reflector.connected)
            api.apply(svc("b"))
            assert await take(queue, 1) == [("ADDED", "b")]
            assert without_timeout(requests_since(api, mark)) == [
                {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"},
                {"resourceVersion": last, "resourceVersionMatch": "NotOlderThan", "limit": "1"},
            ]
            assert reflector.lists == 1

    run(main())


def test_no_resume_check_after_an_error_from_a_live_server(api: ApiServer, tmp_path: Path) -> None:
    """An ERROR event or a 429 comes from a server that is up and keeps its history: after the
    back-off the watch resumes from our version with no check before it."""

    def recover(attempt: int) -> None:
        if attempt == 2:
            api.fail_with(None)

    delays = Delays(on_sleep=recover)

    async def main() -> None:
        api.apply(svc("a"))
        async with reflecting(api, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            last = str(api.resource_version)
            mark = len(api.requests)
            api.fail_with(429)
            api.end_watches_with(status_object(500, "InternalError", "an error on the server"))
            await delays.slept.wait()
            api.apply(svc("b"))  # reaches the reflector only on the watch open after the 429
            assert await take(queue, 2) == [("ADDED", "a"), ("ADDED", "b")]
            sent = without_timeout(requests_since(api, mark))
            watch = {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"}
            assert sent == [watch, watch]  # the 429, then the watch that is open now
            assert reflector.lists == 1

    run(main())
    assert delays.delays == [0.8, 1.6]


def test_seeded_jitter_spreads_the_wait_before_a_relist(tmp_path: Path) -> None:
    """Full jitter: the wait before a relist is drawn from [0.8, 1.6) s, by the injected seed."""
    waits = []
    for seed in range(5):
        delays = Delays()

        async def main(api: ApiServer, seed: int = seed, delays: Delays = delays) -> None:
            client = connect(load_config(api.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
            backoff = Backoff(rand=random.Random(seed))
            reflector = Reflector(client, services(), lambda event: None, backoff=backoff, sleep=delays.sleep)
            task = asyncio.create_task(reflector.run())
            try:
                await reflector.wait_synced()
                await watching(api)
                api.end_watches_with(gone())
                await reflector.wait_listed(2)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await client.aclose()

        with ApiServer() as api:
            run(main(api))
        assert delays.delays == [0.8 * (1 + random.Random(seed).random())]
        waits.extend(delays.delays)
    assert all(0.8 <= w < 1.6 for w in waits) and len(set(waits)) == 5


# ---------------------------------------------------------------------------------------------
# Upstream kube-proxy's Service filter


def test_headless_services_are_left_out_by_the_server(api: ApiServer, tmp_path: Path) -> None:
    """Upstream kube-proxy's Service informer asks for `spec.clusterIP!=None`; the test API server
    honours it on lists and watches, as the real one does for Services."""

    def headless(name: str) -> dict[str, Any]:
        return builders.service(name, "None", [builders.Port("", 80, 80)])

    status, body = request(api, "GET", "/api/v1/services?fieldSelector=spec.clusterIP%21%3DNone")
    assert status == 200
    status, body = request(api, "GET", "/apis/discovery.k8s.io/v1/endpointslices?fieldSelector=spec.clusterIP%21%3DNone")
    assert status == 400 and "field label not supported" in body["message"]

    async def main() -> None:
        api.apply(headless("h1"))
        api.apply(svc("a"))
        client = connect(load_config(api.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        source = ApiSource(client, "node-1", queue.put_nowait)
        task = asyncio.create_task(source.run())
        try:
            await source.wait_synced()
            await watching(api, len(source.reflectors))
            api.apply(headless("h2"))
            api.apply(svc("b"))
            names = [e.name for e in [await queue.get() for _ in range(2)] if e.kind == "Service"]
            assert names == ["a", "b"]
            sent = [r for r in requests_since(api, 0) if r["path"] == "/api/v1/services"]
            assert sent and all(r["fieldSelector"] == NOT_HEADLESS for r in sent)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.aclose()

    run(main())
