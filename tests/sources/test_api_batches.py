"""The reflector's list path: batches, typed items, and a relist diff kept as versions only.

- a list goes to a `BatchSink` in one call (watch events one by one), or event by event to the sink;
- with `typed_lists`, listed objects come as `schema.Item` structs when the list fits the schema,
  and the cluster state built from them is the one built from the plain dicts, with the same
  warnings word for word, whether the list fits the schema or not (then it comes as dicts);
- the reflector keeps the key and resourceVersion of what it delivered, not the objects: a relist
  that no longer shows an object deletes it with a stub that still removes it from the state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.cluster.schema import Item, as_plain
from kubeproxy.cluster.state import ClusterState
from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import Reflector, ResourceSpec, endpoint_slices, services
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.sources.test_api_reflector import Delays, NoJitter, run, svc, take, watching

pytestmark = pytest.mark.timeout(30)


def eps(name: str, address: str, service: str = "web", port: Any = 8080) -> dict[str, Any]:
    return builders.endpoint_slice(service, [builders.Backend(address, "")], [builders.Port("http", 80, port)], name=name)


@contextlib.asynccontextmanager
async def reflecting(
    server: ApiServer, tmp_path: Path, spec: ResourceSpec, **options: Any
) -> AsyncIterator[tuple[Reflector, asyncio.Queue[WatchEvent], list[list[WatchEvent]]]]:
    """A running reflector; single events go to the queue, batches to the list (when asked for)."""
    client = connect(load_config(server.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    batches: list[list[WatchEvent]] = []

    def batch_sink(events: Sequence[WatchEvent]) -> None:
        batches.append(list(events))

    if options.pop("batches", False):
        options["batch_sink"] = batch_sink
    reflector = Reflector(client, spec, queue.put_nowait, backoff=Backoff(rand=NoJitter()), sleep=Delays().sleep, **options)
    task = asyncio.create_task(reflector.run())
    try:
        yield reflector, queue, batches
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


def test_a_list_is_one_batch_and_watch_events_come_one_at_a_time(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        for name in ("a", "b", "c"):
            apiserver.apply(svc(name))
        async with reflecting(apiserver, tmp_path, services(), batches=True) as (reflector, queue, batches):
            await reflector.wait_synced()
            assert [[(e.type, e.name) for e in batch] for batch in batches] == [[("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]]
            await watching(apiserver)
            apiserver.apply(svc("d"))
            while len(batches) < 2:
                await asyncio.sleep(0.01)
            assert [(e.type, e.name) for e in batches[1]] == [("ADDED", "d")]
            assert queue.empty()  # a consumer with a batch sink gets nothing twice

    run(main())


def test_without_a_batch_sink_a_list_goes_event_by_event(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        for name in ("a", "b"):
            apiserver.apply(svc(name))
        async with reflecting(apiserver, tmp_path, services()) as (reflector, queue, batches):
            await reflector.wait_synced()
            assert await take(queue, 2) == [("ADDED", "a"), ("ADDED", "b")]
            assert batches == []

    run(main())


def test_a_relist_deletes_with_a_stub_that_removes_the_object(apiserver: ApiServer, tmp_path: Path) -> None:
    """The reflector no longer holds deleted objects' last state; the stub it sends carries their
    key, which is all the state needs to remove them (and their endpoints from their service)."""
    state = ClusterState()

    async def main() -> None:
        apiserver.apply(eps("web-1", "10.1.0.1"))
        gone = apiserver.apply(eps("web-2", "10.1.0.2"))
        async with reflecting(apiserver, tmp_path, endpoint_slices()) as (reflector, queue, _):
            await reflector.wait_synced()
            for event in [await queue.get() for _ in range(2)]:
                assert state.apply(event.obj) is None
            assert set(state.slices) == {("default", "web-1"), ("default", "web-2")}
            await watching(apiserver)
            apiserver.stop()
            apiserver.delete("EndpointSlice", "default", "web-2")
            apiserver.expire_history()  # the watch cannot resume: 410, relist
            apiserver.start()
            event = await queue.get()
            assert (event.type, event.name) == ("DELETED", "web-2")
            assert event.obj == {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"name": "web-2", "namespace": "default", "resourceVersion": gone["metadata"]["resourceVersion"]},
            }
            assert state.apply(event.obj, deleted=True) is None
            assert set(state.slices) == {("default", "web-1")}
            assert [str(ep.addresses[0]) for s in state.slices.values() for ep in s.endpoints] == ["10.1.0.1"]
            kept = apiserver.get("EndpointSlice", "default", "web-1")
            assert reflector.versions == {("default", "web-1"): kept["metadata"]["resourceVersion"]}
            assert queue.empty()

    run(main())


def test_a_relist_reports_changed_versions_only(apiserver: ApiServer, tmp_path: Path) -> None:
    async def main() -> None:
        for name in ("same", "edited"):
            apiserver.apply(svc(name))
        async with reflecting(apiserver, tmp_path, services()) as (reflector, queue, _):
            await reflector.wait_synced()
            await take(queue, 2)
            await watching(apiserver)
            apiserver.stop()
            apiserver.apply(svc("edited", port=81))
            apiserver.expire_history()
            apiserver.start()
            event = await queue.get()
            assert (event.type, event.name) == ("MODIFIED", "edited")
            await reflector.wait_listed(2)
            assert queue.empty()  # "same" kept its version: no event

    run(main())


# -- typed lists: the same state and the same warnings as plain dicts

VALID = [
    svc("web"),
    svc("dns", ns="kube-system"),
    eps("web-1", "10.1.0.1"),
    eps("web-2", "10.1.0.2"),
]
# Within the schema, but refused by the state's checks: the typed path leaves them to the dict parsers.
REFUSED_VALUES = [
    svc("Upper-Case"),
    builders.service("bad-ip", "10.96.0.300", [builders.Port("", 80, 80)]),
    eps("bad-endpoint", "10.1.0.999"),
    eps("bad-port", "10.1.0.3", port=70000),
]
# Outside the schema (a port that is not a number, a field the schema does not know): the whole
# list decodes as plain dicts. The state refuses the first and takes the second (it reads only
# the fields it knows).
OUTSIDE_SCHEMA = [eps("typo", "10.1.0.4", port="abc"), {**svc("extra"), "surprise": {"x": 1}}]


async def _listed(server: ApiServer, tmp_path: Path, *, typed: bool) -> tuple[ClusterState, list[str], list[type]]:
    state, warnings, types = ClusterState(), [], []
    for spec in (services(), endpoint_slices()):
        async with reflecting(server, tmp_path, spec, batches=True, typed_lists=typed) as (reflector, _, batches):
            await reflector.wait_synced()
            for event in (e for batch in batches for e in batch):
                types.append(type(event.obj))
                if warning := state.apply(event.obj):
                    warnings.append(f"{event}: {warning}")
    return state, warnings, types


@pytest.mark.parametrize(
    ("world", "typed_items", "refused"),
    [(VALID, True, 0), (VALID + REFUSED_VALUES, True, 4), (VALID + REFUSED_VALUES + OUTSIDE_SCHEMA, False, 5)],
    ids=["valid", "refused-values", "outside-schema"],
)
def test_typed_lists_build_the_same_state_with_the_same_warnings(
    apiserver: ApiServer, tmp_path: Path, world: list[dict[str, Any]], typed_items: bool, refused: int
) -> None:
    for obj in world:
        apiserver.apply(obj)

    async def main() -> None:
        plain_state, plain_warnings, plain_types = await _listed(apiserver, tmp_path, typed=False)
        typed_state, typed_warnings, typed_types = await _listed(apiserver, tmp_path, typed=True)
        assert set(plain_types) == {dict}
        assert set(typed_types) == ({Item} if typed_items else {dict})
        assert typed_state.services == plain_state.services
        assert typed_state.slices == plain_state.slices
        assert typed_warnings == plain_warnings
        assert len(plain_warnings) == refused
        assert set(plain_state.services) >= {("default", "web"), ("kube-system", "dns")}

    run(main())


def test_a_typed_item_reads_as_the_dicts_the_server_sent(apiserver: ApiServer, tmp_path: Path) -> None:
    """kind and apiVersion filled in as for dicts; name and namespace read the same way."""
    stored = apiserver.apply(eps("web-1", "10.1.0.1"))

    async def main() -> None:
        async with reflecting(apiserver, tmp_path, endpoint_slices(), batches=True, typed_lists=True) as (reflector, _, batches):
            await reflector.wait_synced()
            [[event]] = batches
            assert isinstance(event.obj, Item)
            assert as_plain(event.obj) == stored
            assert (event.namespace, event.name, str(event)) == ("default", "web-1", "ADDED EndpointSlice default/web-1")

    run(main())
