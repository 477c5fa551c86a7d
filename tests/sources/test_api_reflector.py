"""The API reflector against the test API server: list, watch, bookmarks, 410, faults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import ApiSource, Reflector, ResourceSpec, SourceError, node, services
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import ConnectionConfigError, connect, load_config
from kubeproxy.sources.events import WatchEvent

pytestmark = pytest.mark.timeout(30)


class NoJitter(random.Random):
    def random(self) -> float:
        return 0.0


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))  # a bound for a hang, not a wait: a loaded CI machine is slow


def svc(name: str, port: Any = 80, ns: str = "default", **labels: str) -> dict[str, Any]:
    return builders.service(name, "", [builders.Port("", port, port)], namespace=ns, labels=labels)


@contextlib.asynccontextmanager
async def reflecting(
    server: ApiServer,
    tmp_path: Path,
    spec: ResourceSpec | None = None,
    *,
    sleep: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    sink: Callable[[WatchEvent], None] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Reflector, asyncio.Queue[WatchEvent]]]:
    client = connect(load_config(server.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    reflector = Reflector(
        client,
        spec or services(),
        sink or queue.put_nowait,
        backoff=Backoff(rand=NoJitter()),
        sleep=sleep or Delays().sleep,
        **options,
    )
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector, queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


class Delays:
    """An injected sleep: records the back-off delays and waits only a moment (so retries stay fast)."""

    def __init__(self, on_sleep: Callable[[int], None] | None = None) -> None:
        self.delays: list[float] = []
        self.slept = asyncio.Event()
        self.on_sleep = on_sleep

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.slept.set()
        if self.on_sleep is not None:
            self.on_sleep(len(self.delays))
        await asyncio.sleep(0.01)


def body(event: WatchEvent) -> dict[str, Any]:
    """The event's object as the plain dict a reflector without typed lists delivers."""
    assert isinstance(event.obj, dict)
    return event.obj


async def take(queue: asyncio.Queue[WatchEvent], n: int) -> list[tuple[str, str]]:
    return [(e.type, e.name) for e in [await queue.get() for _ in range(n)]]


async def watching(server: ApiServer, count: int = 1) -> None:
    await asyncio.to_thread(server.wait_for_watches, count)


async def nothing_else(server: ApiServer, queue: asyncio.Queue[WatchEvent]) -> None:
    """No duplicate is pending: the next event is for an object created only now."""
    server.apply(svc("sentinel"))
    assert await take(queue, 1) == [("ADDED", "sentinel")]


def test_initial_list_is_delivered_as_added_then_synced(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        stored = [apiserver.apply(svc("a")), apiserver.apply(svc("b", ns="other"))]
        async with reflecting(apiserver, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            assert queue.qsize() == 2
            events = [queue.get_nowait() for _ in range(2)]
            assert {(e.type, e.kind, e.namespace, e.name) for e in events} == {
                ("ADDED", "Service", "default", "a"),
                ("ADDED", "Service", "other", "b"),
            }
            # Exactly the server's JSON, kind and apiVersion filled in although list items lack them.
            assert sorted((body(e) for e in events), key=lambda o: o["metadata"]["name"]) == stored
            assert reflector.resource_version == str(apiserver.resource_version)

    run(main())


def test_watch_delivers_create_update_delete_in_order(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        async with reflecting(apiserver, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            await watching(apiserver)
            apiserver.apply(svc("web"))
            apiserver.apply(svc("web", port=81))
            apiserver.delete("Service", "default", "web")
            events = [await queue.get() for _ in range(3)]
            assert [(e.type, e.name) for e in events] == [("ADDED", "web"), ("MODIFIED", "web"), ("DELETED", "web")]
            assert body(events[1])["spec"]["ports"][0]["port"] == 81
            await nothing_else(apiserver, queue)

    run(main())


def test_bookmark_advances_the_version_without_an_event(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        async with reflecting(apiserver, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            await watching(apiserver)
            before = reflector.resource_version
            apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
            apiserver.bookmark()
            await reflector.wait_for_version(str(apiserver.resource_version))
            assert reflector.resource_version != before
            assert queue.empty()

    run(main())


def test_410_relists_and_emits_only_the_differences(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    async def main() -> None:
        for name in ("a", "b", "c"):
            apiserver.apply(svc(name))
        async with reflecting(apiserver, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 3) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
            await watching(apiserver)
            apiserver.stop()
            apiserver.apply(svc("a", port=81))
            apiserver.delete("Service", "default", "b")
            apiserver.apply(svc("d"))
            apiserver.expire_history()
            apiserver.start()
            assert sorted(await take(queue, 3)) == [("ADDED", "d"), ("DELETED", "b"), ("MODIFIED", "a")]
            await nothing_else(apiserver, queue)
            assert set(reflector.versions) == {("default", n) for n in ("a", "c", "d", "sentinel")}

    run(main())
    assert any("is gone (410), relisting" in r.message for r in caplog.records)
    assert any(r.message.startswith("listed 3 services") for r in caplog.records)


def test_server_down_at_start_backs_off_then_syncs(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.apply(svc("a"))
    apiserver.stop()  # the port is known, nothing listens

    def come_up(attempt: int) -> None:
        if attempt == 3:
            apiserver.start()

    delays = Delays(on_sleep=come_up)

    async def main() -> None:
        async with reflecting(apiserver, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 1) == [("ADDED", "a")]

    run(main())
    assert delays.delays == [0.8, 1.6, 3.2]


def test_server_errors_back_off_with_a_logged_reason(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.fail_with(503)

    def recover(attempt: int) -> None:
        if attempt == 2:
            apiserver.fail_with(None)

    delays = Delays(on_sleep=recover)

    async def main() -> None:
        async with reflecting(apiserver, tmp_path, sleep=delays.sleep) as (reflector, _):
            await reflector.wait_synced()

    run(main())
    assert delays.delays == [0.8, 1.6]
    backing = [r.message for r in caplog.records if r.message.startswith('"Failed to watch"')]
    assert backing[0].startswith('"Failed to watch" err="failed to list *v1.Service: GET /api/v1/services: 503')
    assert backing[0].endswith('type="*v1.Service" retryIn="800ms"')


def test_server_killed_mid_watch_catches_up_without_duplicates_or_losses(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")
    delays = Delays()

    async def main() -> None:
        apiserver.apply(svc("a"))
        async with reflecting(apiserver, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 1) == [("ADDED", "a")]
            await watching(apiserver)
            apiserver.stop()
            await delays.slept.wait()  # the reflector noticed and is retrying
            apiserver.apply(svc("b"))
            apiserver.apply(svc("a", port=81))
            apiserver.start()
            assert await take(queue, 2) == [("ADDED", "b"), ("MODIFIED", "a")]
            await nothing_else(apiserver, queue)

    run(main())
    assert any(r.message.startswith("watch of services restarted from resourceVersion") for r in caplog.records)


def test_dropped_watch_resumes_from_the_last_version(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        async with reflecting(apiserver, tmp_path) as (reflector, queue):
            await reflector.wait_synced()
            await watching(apiserver)
            apiserver.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            apiserver.drop_watches()
            apiserver.apply(svc("b"))
            assert await take(queue, 1) == [("ADDED", "b")]
            await nothing_else(apiserver, queue)

    run(main())


def test_malformed_object_is_delivered_and_a_failing_consumer_stops_nothing(apiserver: ApiServer, tmp_path: Path) -> None:
    received: list[WatchEvent] = []
    done = asyncio.Event()

    def picky_sink(event: WatchEvent) -> None:
        received.append(event)
        if event.name == "last":
            done.set()
        if body(event)["spec"]["ports"][0]["port"] == "abc":
            raise ValueError("spec.ports[0].port: 'abc' is not a port")

    async def main() -> None:
        async with reflecting(apiserver, tmp_path, sink=picky_sink) as (reflector, _):
            await reflector.wait_synced()
            await watching(apiserver)
            apiserver.apply(svc("bad", port="abc"))
            apiserver.apply(svc("last"))
            await done.wait()

    run(main())
    assert [(e.type, e.name) for e in received] == [("ADDED", "bad"), ("ADDED", "last")]
    assert [p["port"] for p in body(received[0])["spec"]["ports"]] == ["abc"]


def test_node_reflector_sees_only_its_own_node(apiserver: ApiServer, tmp_path: Path) -> None:
    def a_node(name: str, zone: str) -> dict[str, Any]:
        labels = {"topology.kubernetes.io/zone": zone}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}

    async def main() -> None:
        apiserver.apply(a_node("n1", "a"))
        apiserver.apply(a_node("n2", "a"))
        async with reflecting(apiserver, tmp_path, node("n1")) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 1) == [("ADDED", "n1")]
            await watching(apiserver)
            apiserver.apply(a_node("n2", "b"))
            apiserver.apply(a_node("n1", "b"))
            event = await queue.get()
            assert (event.type, event.kind, event.name) == ("MODIFIED", "Node", "n1")
            assert body(event)["metadata"]["labels"]["topology.kubernetes.io/zone"] == "b"
            assert queue.empty()

    run(main())


def test_api_source_syncs_all_three_and_leaves_other_proxies_objects_out(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        apiserver.apply(svc("ours"))
        apiserver.apply(svc("theirs", **{"service.kubernetes.io/service-proxy-name": "other"}))
        apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "me"}})
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        client = connect(load_config(master=apiserver.url), trust_env=False)
        source = ApiSource(client, "me", queue.put_nowait, backoff_factory=lambda: Backoff(rand=NoJitter()))
        task = asyncio.create_task(source.run())
        try:
            await source.wait_synced()
            assert source.synced
            got = {(e.kind, e.name) for e in [queue.get_nowait() for _ in range(queue.qsize())]}
            assert got == {("Service", "ours"), ("Node", "me")}
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.aclose()

    run(main())


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConnectionConfigError, match=r"cannot load kubeconfig .*nope.*not found"):
        load_config(tmp_path / "nope")


class Clock:
    """An injected monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class AlwaysMax(random.Random):
    def random(self) -> float:
        return 1.0


def test_backoff_is_client_gos_reflector_schedule() -> None:
    """800 ms doubling to 30 s, as client-go v0.37.2's reflector (defaultBackoffInit/Max/Factor)."""
    clock = Clock()
    backoff = Backoff(rand=NoJitter(), clock=clock)
    assert [backoff.next() for _ in range(9)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    # Full jitter (1.0): each delay d is drawn from [d, 2d), so [30, 60) s at the cap.
    widest = Backoff(rand=AlwaysMax(), clock=clock)
    assert [widest.next() for _ in range(8)] == [1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 60.0, 60.0]
    seeded = Backoff(rand=random.Random(7), clock=clock)
    draws = [seeded.next() for _ in range(8)]
    assert all(d <= x < 2 * d for d, x in zip([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0], draws, strict=True))
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=0)


def test_backoff_starts_again_after_two_minutes_by_the_clock_alone() -> None:
    """wait.Backoff.DelayWithReset(clock, 2 min): the schedule restarts once more than 2 min have
    passed since it last did, whatever happened in between; a success does not restart it."""
    clock = Clock()
    backoff = Backoff(rand=NoJitter(), clock=clock)
    assert [backoff.next() for _ in range(3)] == [0.8, 1.6, 3.2]
    backoff.succeeded()
    clock.now += 120.0  # not more than the interval yet
    assert backoff.next() == 6.4
    clock.now += 0.5
    assert [backoff.next(), backoff.next()] == [0.8, 1.6]
    # A long outage goes back to short delays every 2 minutes, as client-go's manager does.
    clock.now += 60.0
    assert backoff.next() == 3.2
    clock.now += 61.0
    assert backoff.next() == 0.8


def test_http_410_on_watch_and_list_relists_with_back_off(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    def recover(attempt: int) -> None:
        # The cut watch's back-off, the wait before the relist the 410 asks for, then the
        # back-off after the list met the 410 too.
        if attempt == 3:
            apiserver.fail_with(None)

    delays = Delays(on_sleep=recover)

    async def main() -> None:
        apiserver.apply(svc("a"))
        async with reflecting(apiserver, tmp_path, sleep=delays.sleep) as (reflector, queue):
            await reflector.wait_synced()
            assert await take(queue, 1) == [("ADDED", "a")]
            await watching(apiserver)
            apiserver.fail_with(410)
            apiserver.stop()  # the next watch request meets the 410
            apiserver.apply(svc("b"))
            apiserver.start()
            assert await take(queue, 1) == [("ADDED", "b")]
            await nothing_else(apiserver, queue)

    run(main())
    assert any("is gone (410), relisting" in r.message for r in caplog.records)
    # Connection refused while stopped, then the list answered 410 and backed off too.
    assert any(r.message.startswith('"Failed to watch"') and "410" in r.message for r in caplog.records)


def test_periodic_bookmarks_keep_an_idle_watch_current(tmp_path: Path) -> None:
    async def main() -> None:
        with ApiServer(bookmark_interval=0.05) as server:
            async with reflecting(server, tmp_path) as (reflector, queue):
                await reflector.wait_synced()
                server.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
                await reflector.wait_for_version(str(server.resource_version))
                assert queue.empty()

    run(main())


def test_master_overrides_the_kubeconfig_server(apiserver: ApiServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = load_config(kubeconfig, master="http://127.0.0.1:1")
    assert config.cluster.server == "http://127.0.0.1:1"
    assert config.user is not None and config.user.token == "lab-token"
    assert load_config(master=apiserver.url).cluster.server == apiserver.url


def test_one_lasting_http_error_is_said_once_whichever_request_met_it(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RBAC forbidding a resource denies the resumed watch and the relist after it, each in its
    own words ("cannot watch", "cannot list"): one state, one warning; another status is said."""
    caplog.set_level(logging.DEBUG, logger="kubeproxy.sources.api")

    def forbidden(verb: str) -> SourceError:
        return SourceError("/apis/discovery.k8s.io/v1/endpointslices", 403, "Forbidden",
                           f'endpointslices.discovery.k8s.io is forbidden: cannot {verb} resource "endpointslices"')

    async def main() -> None:
        client = connect(load_config(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
        # Not running: nothing in between answers and ends the failing state.
        reflector = Reflector(client, services(), lambda event: None, backoff=Backoff(rand=NoJitter()), sleep=Delays().sleep)
        for error in (forbidden("watch"), forbidden("list"), forbidden("watch"),
                      SourceError("/apis", 503, "Service Unavailable", "")):  # fmt: skip
            await reflector._back_off(error)

    run(main())
    said = [r for r in caplog.records if r.getMessage().startswith('"Failed to watch"')]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.WARNING]
    assert "cannot watch" in said[0].getMessage() and "503" in said[3].getMessage()
