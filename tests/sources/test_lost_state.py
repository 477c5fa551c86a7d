"""An API server that lost its state (item 11): same objects, resourceVersions low again.

Found: the test API server restarted with a fresh store (versions from ~19,800 back to ~4,000);
the proxy resumed its watches from the old versions, never saw another event and kept stale
endpoints while /healthz said 200. A real server accepts such a watch and stays silent, answers a
list from such a version with "Too large resource version", and sends that error inside a
watch-list. These tests hold the test server to that behaviour (with the real kubectl too) and
the reflector to relisting on every sign of it: the error, a version going backwards, silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import ApiServer, status_object, too_large_resource_version
from kubeproxy.sources.api import (
    Gone,
    Reflector,
    ResourceSpec,
    SourceError,
    Stale,
    TooLargeResourceVersion,
    _status_error,
    endpoint_slices,
    services,
)
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.sources.conftest import RawWatch, request
from tests.sources.test_api_reflector import Delays, NoJitter, body, svc, take, watching

pytestmark = pytest.mark.timeout(60)


def eps(name: str, address: str, service: str = "web") -> dict[str, Any]:
    return builders.endpoint_slice(service, [builders.Backend(address, "")], [builders.Port("http", 80, 8080)], name=name)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    # A short wait for a version the store does not have: upstream waits 3 s before answering.
    with ApiServer(block_timeout=0.1) as server:
        yield server


@contextlib.asynccontextmanager
async def reflecting(
    server: ApiServer, tmp_path: Path, spec: ResourceSpec, delays: Delays, **options: Any
) -> AsyncIterator[tuple[Reflector, asyncio.Queue[WatchEvent]]]:
    client = connect(load_config(server.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    reflector = Reflector(client, spec, queue.put_nowait, backoff=Backoff(rand=NoJitter()), sleep=delays.sleep, **options)
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector, queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


def requests_since(server: ApiServer, mark: int) -> list[dict[str, str]]:
    """The resource requests made after the first `mark` ones, as their query parameters (+path)."""
    out = []
    for _, raw in list(server.requests)[mark:]:
        url = urlsplit(raw)
        out.append({"path": url.path, **{k: v[-1] for k, v in parse_qs(url.query).items()}})
    return out


def without_version(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 40))


# ---------------------------------------------------------------------------------------------
# The test API server answers as a real one


def test_list_from_a_future_version_is_too_large_with_a_retry_hint(api: ApiServer) -> None:
    api.apply(svc("a"))
    current = api.resource_version
    started = time.monotonic()
    status, body = request(api, "GET", f"/api/v1/services?resourceVersion={current + 5}&resourceVersionMatch=NotOlderThan")
    assert time.monotonic() - started >= 0.1  # it waited for the store to catch up first, as upstream
    assert status == 504
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"Timeout: Too large resource version: {current + 5}, current: {current}",
        "reason": "Timeout",
        "details": {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
        "code": 504,
    }
    # The version the store has, or an older one, is fine; so is "any" ("0").
    for rv in (current, current - 1, 0):
        status, body = request(api, "GET", f"/api/v1/services?resourceVersion={rv}")
        assert status == 200 and body["metadata"]["resourceVersion"] == str(current)
    status, body = request(api, "GET", "/api/v1/services?resourceVersionMatch=NotOlderThan")
    assert status == 422 and "forbidden unless resourceVersion is provided" in body["message"]


def test_watch_from_a_future_version_is_accepted_and_silent_until_the_store_passes_it(api: ApiServer) -> None:
    future = api.resource_version + 3
    watch = RawWatch(api, f"/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={future}")
    try:
        assert watch.response.status == 200
        api.wait_for_watches(1)
        api.bookmark()  # upstream never sends a watch a bookmark older than where it started
        for name in ("a", "b", "c", "d"):
            api.apply(svc(name))
        event = watch.next()
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "d")
        assert int(event["object"]["metadata"]["resourceVersion"]) == future + 1
    finally:
        watch.close()


def test_watch_list_from_a_future_version_gets_the_error_as_an_event(api: ApiServer) -> None:
    current = api.resource_version
    path = (
        "/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        f"&allowWatchBookmarks=true&resourceVersion={current + 9}"
    )
    watch = RawWatch(api, path)
    try:
        assert watch.response.status == 200  # the error comes inside the stream, as upstream's errWatcher
        assert watch.next() == {"type": "ERROR", "object": too_large_resource_version(current + 9, current).status()}
        with pytest.raises(EOFError):
            watch.next()
    finally:
        watch.close()


def test_watch_list_sends_the_state_then_the_end_bookmark(api: ApiServer) -> None:
    api.apply(svc("a"))
    path = "/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    watch = RawWatch(api, path)
    try:
        assert [watch.next()["type"], watch.next()["object"]["metadata"]] == [
            "ADDED",
            {"resourceVersion": str(api.resource_version), "annotations": {"k8s.io/initial-events-end": "true"}},
        ]
    finally:
        watch.close()


def test_restart_with_a_fresh_store_keeps_the_objects_and_starts_the_versions_again(api: ApiServer) -> None:
    for n in range(20):
        api.apply(svc("a", port=80 + n))
    api.apply(eps("web-1", "10.1.0.5"))
    before = {
        (o["kind"], o["metadata"]["name"]): o
        for o in (api.get("Service", "default", "a"), api.get("EndpointSlice", "default", "web-1"))
    }
    old_rv = api.resource_version
    api.restart_with_fresh_store()
    assert api.resource_version < old_rv
    for (kind, name), old in before.items():
        new = api.get(kind, "default", name)
        assert int(new["metadata"]["resourceVersion"]) <= api.resource_version
        # same uid, same content: only the version changed
        assert without_version(new) == without_version(old)
    status, _ = request(api, "GET", f"/api/v1/services?resourceVersion={old_rv}")
    assert status == 504


# ---------------------------------------------------------------------------------------------
# The reflector relists on every sign that the server lost the history it follows


def test_status_errors_are_classified_as_client_go_does() -> None:
    url = "/api/v1/services"
    assert isinstance(_status_error(url, 504, too_large_resource_version(9, 2).status()), TooLargeResourceVersion)
    # Servers 1.17.0-1.18.5: the cause message without the cause type; before 1.17 only the message.
    old = status_object(
        504,
        "Timeout",
        "Timeout: Too large resource version: 9, current: 2",
        {"causes": [{"message": "Too large resource version"}]},
    )
    assert isinstance(_status_error(url, 504, old), TooLargeResourceVersion)
    older = status_object(504, "Timeout", "Timeout: Too large resource version: 9, current: 2")
    assert isinstance(_status_error(url, 504, older), TooLargeResourceVersion)
    assert isinstance(_status_error(url, 410, status_object(410, "Expired", "too old")), Gone)
    other = _status_error(url, 504, status_object(504, "Timeout", "the etcd request timed out"))
    assert type(other) is SourceError and not isinstance(other, Stale)


def test_a_fresh_store_is_noticed_on_reconnect_and_the_change_after_it_delivered(
    api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(a) The finding itself: restart with a fresh store, same objects, then change an endpoint."""
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")
    delays = Delays()

    async def main() -> None:
        api.apply(eps("web-1", "10.1.0.5"))
        for n in range(30):  # history, so that the fresh store's versions are well below ours
            api.apply(eps("other", f"10.2.0.{n}", service="other"))
        async with reflecting(api, tmp_path, endpoint_slices(), delays, proof_wait=0.2) as (reflector, queue):
            await reflector.wait_synced()
            await take(queue, 2)
            await watching(api)
            old_rv = reflector.resource_version
            mark = len(api.requests)
            api.restart_with_fresh_store()
            assert api.resource_version < int(old_rv or 0)
            await delays.slept.wait()  # the reflector saw the cut and is backing off
            assert not reflector.connected
            fresh = api.apply(eps("web-1", "10.1.0.6"))
            while True:
                event = await queue.get()
                if event.name == "web-1" and body(event)["endpoints"][0]["addresses"] == ["10.1.0.6"]:
                    break
            await reflector.wait_listed(2)
            assert reflector.connected
            assert reflector.versions[("default", "web-1")] == fresh["metadata"]["resourceVersion"]
            assert int(reflector.resource_version or 0) <= api.resource_version
            # The watch resumed from the old version heard nothing within the proof wait: the
            # resume check (504 Too large), then a consistent list, then a watch from its version.
            sent = [{k: v for k, v in r.items() if k != "timeoutSeconds"} for r in requests_since(api, mark)]
            path = "/apis/discovery.k8s.io/v1/endpointslices"
            resumed = {"path": path, "watch": "true", "resourceVersion": old_rv, "allowWatchBookmarks": "true"}
            check = {"path": path, "resourceVersion": old_rv, "resourceVersionMatch": "NotOlderThan", "limit": "1"}
            # Read from the last resumed watch: the watch after the list may or may not be asked yet.
            assert resumed in sent, sent
            last = max(i for i, r in enumerate(sent) if r == resumed)
            assert sent[last : last + 3] == [resumed, check, {"path": path, "limit": "500"}], sent

    run(main())
    assert any("Too large resource version" in r.message and "relisting" in r.message for r in caplog.records)
    assert any("went back from resourceVersion" in r.message for r in caplog.records)


def test_too_large_error_on_a_watch_relists(api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """(b) The error as a watch ERROR event (a watch-list, or an older server) leads to a relist."""
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    async def main() -> None:
        api.apply(svc("a"))
        async with reflecting(api, tmp_path, services(), Delays()) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            mark = len(api.requests)
            api.end_watches_with(too_large_resource_version(api.resource_version + 100, api.resource_version).status())
            await reflector.wait_listed(2)
            assert "resourceVersion" not in requests_since(api, mark)[0]  # a list from scratch, at once
            assert reflector.connected
            assert queue.qsize() == 1  # nothing changed: the relist's diff is empty

    run(main())
    # Right after a list the reflector backs off before listing again (a server that keeps
    # refusing must not be relisted in a tight loop); later on it relists at once.
    assert any("Too large resource version: " in r.message for r in caplog.records)


def test_a_bookmark_going_backwards_relists(api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """(c) A server that forgot, and does not filter its bookmarks, sends one older than our version."""
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    async def main() -> None:
        for name in ("a", "b", "c"):
            api.apply(svc(name))
        async with reflecting(api, tmp_path, services(), Delays()) as (reflector, _):
            await reflector.wait_synced()
            await watching(api)
            api.bookmark(resource_version=2)
            await reflector.wait_listed(2)
            assert reflector.resource_version == str(api.resource_version)
            # A bookmark that moves forward is just progress. Right after the relist the old watch
            # may still be counted while the new one is not open yet, and a bookmark sent then
            # reaches nobody: send it again until one arrives.
            api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
            target = str(api.resource_version)
            for _ in range(20):
                await watching(api)
                api.bookmark()
                try:
                    await asyncio.wait_for(reflector.wait_for_version(target), 1.0)
                    break
                except TimeoutError:
                    continue
            assert reflector.resource_version == target
            assert reflector.lists == 2

    run(main())
    assert any("ResourceVersionWentBack" in r.message and "BOOKMARK at 2" in r.message for r in caplog.records)


class MovableClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves forward: timers it passes fire at the loop's next turn."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = 0.0

    def time(self) -> float:
        return super().time() + self.moved


def test_a_watch_silent_past_the_bound_relists(api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """(d) No event and no bookmark for `max_silence`: the watch is not trusted any more. The loop's
    clock jumps the bound while the watch is open and quiet (that it waits the whole bound and no
    less: the bookmarks test below, where jumps of 3/4 of it never end the watch)."""
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, MovableClockLoop)
        async with reflecting(api, tmp_path, services(), Delays(), max_silence=4.0) as (reflector, _):
            await reflector.wait_synced()
            await watching(api)
            assert reflector.lists == 1
            loop.moved += 4.0
            await reflector.wait_listed(2)
            assert reflector.connected

    with asyncio.Runner(loop_factory=MovableClockLoop) as runner:  # bounded by the module's timeout mark
        runner.run(main())
    assert any("no event or bookmark for 4s" in r.message for r in caplog.records)


def test_bookmarks_keep_a_quiet_watch_trusted_past_the_bound(api: ApiServer, tmp_path: Path) -> None:
    """The bound counts from the last sign of progress, not from the watch's start: the loop's
    clock jumps 3/4 of the bound before each bookmark, three bounds in all, and the watch stays."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, MovableClockLoop)
        async with reflecting(api, tmp_path, services(), Delays(), max_silence=4.0) as (reflector, _):
            await reflector.wait_synced()
            for step in range(4):
                loop.moved += 3.0
                api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"podCIDR": f"{step}"}})
                await watching(api)
                api.bookmark()
                await reflector.wait_for_version(str(api.resource_version))
            assert loop.moved == 12.0 and reflector.lists == 1

    with asyncio.Runner(loop_factory=MovableClockLoop) as runner:  # bounded by the module's timeout mark
        runner.run(main())


def test_the_silent_bound_defaults_to_three_watch_timeouts() -> None:
    assert Reflector(None, services(), lambda e: None).silence_bound == 900.0  # type: ignore[arg-type]  # no client: only the bound is read
    assert Reflector(None, services(), lambda e: None, watch_timeout=60).silence_bound == 180.0  # type: ignore[arg-type]  # no client: only the bound is read
    with pytest.raises(ValueError, match="must be positive"):
        Reflector(None, services(), lambda e: None, max_silence=0)  # type: ignore[arg-type]  # no client: only the bound is read


# ---------------------------------------------------------------------------------------------
# kubectl sees the error a real server gives


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (CI installs it)")
def test_kubectl_gets_the_real_servers_error(api: ApiServer, tmp_path: Path) -> None:
    """(e) As against a real server: kubectl honours Retry-After (10 retries, ~1 s each), then
    prints the Status message; a watch-list prints the ERROR event it received."""
    api.apply(svc("a"))
    current = api.resource_version
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        argv = ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"), *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=50)

    mark = len(api.requests)
    listed = kubectl("get", "--raw", f"/api/v1/services?resourceVersion={current + 50}&resourceVersionMatch=NotOlderThan")
    assert listed.returncode == 1
    assert (
        listed.stderr.strip()
        == f"Error from server (Timeout): Timeout: Too large resource version: {current + 50}, current: {current}"
    )
    lists = [r for r in requests_since(api, mark) if r["path"] == "/api/v1/services"]
    assert len(lists) == 11  # the request and client-go's 10 retries after Retry-After

    path = (
        f"/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        f"&resourceVersion={current + 50}"
    )
    watched = kubectl("get", "--raw", path)
    assert watched.returncode == 0
    event = json.loads(watched.stdout)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 504 and event["object"]["reason"] == "Timeout"
    assert event["object"]["details"]["causes"] == [
        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    ]
