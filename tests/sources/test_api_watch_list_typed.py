"""A watch-list's initial events through the typed decoder (`typed_lists`): the reflector reads
every line as the general path does. Each stream below is a scripted watch-list answer (valid,
odd but valid, hostile); the reflector with and without `typed_lists` delivers the same first
state (as plain dicts) after the same warnings, and takes the typed path for the objects within
the schema (they arrive as `schema.Item`)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.cluster.schema import Item, as_plain
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.apiserver.hostile import Hostility
from kubeproxy.sources.api import INITIAL_EVENTS_END
from kubeproxy.sources.events import WatchEvent
from tests.sources.test_api_reflector import NoJitter, reflecting, run, svc

pytestmark = pytest.mark.timeout(60)


def event(type_: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": type_, "object": obj}).encode()


def added(name: str, rv: str = "3", type_: str = "ADDED", **extra: Any) -> bytes:
    obj = svc(name)
    obj["metadata"]["resourceVersion"] = rv
    return event(type_, {**obj, **extra})


def bookmark(rv: str = "9", kind: str = "Service", end: bool = True) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return event("BOOKMARK", {"kind": kind, "apiVersion": "v1", "metadata": meta})


STREAMS: dict[str, list[bytes]] = {
    "valid": [added("a"), added("b"), bookmark()],
    "deleted-and-modified-in-the-initial-events": [
        added("a"),
        added("b"),
        added("a", "4", "DELETED"),
        added("b", "5", "MODIFIED"),
        bookmark(),
    ],
    "a bookmark without the end annotation first": [added("a"), bookmark("4", end=False), added("b"), bookmark()],
    "an end bookmark without a resourceVersion is not the end": [added("a"), bookmark(""), added("b"), bookmark()],
    "an end bookmark of another kind is skipped": [added("a"), bookmark("4", kind="Pod"), added("b"), bookmark()],
    "an object of another kind is skipped": [
        added("a"),
        event("ADDED", {"kind": "Pod", "metadata": {"name": "p"}}),
        bookmark(),
    ],
    "an object outside the schema": [added("a"), added("extra", surprise={"x": 1}), bookmark()],
    "a port outside the schema": [added("a"), event("ADDED", {**svc("p", port="abc"), "metadata": {"name": "p"}}), bookmark()],
    "no kind": [event("ADDED", {"metadata": {"name": "bare", "namespace": "default", "resourceVersion": "3"}}), bookmark()],
    "null metadata fields": [
        event("ADDED", {"kind": "Service", "metadata": {"name": "n", "namespace": None, "resourceVersion": None}}),
        bookmark(),
    ],
    "extra envelope field": [
        added("a"),
        b'{"type": "ADDED", "object": {"metadata": {"name": "x"}}, "more": [[[1]]]}',
        bookmark(),
    ],
    "no name": [added("a"), event("ADDED", {"metadata": {"namespace": "default"}}), bookmark()],
    "an empty name": [added("a"), event("ADDED", {"metadata": {"name": ""}}), bookmark()],
    "null metadata": [added("a"), event("ADDED", {"kind": "Service", "metadata": None}), bookmark()],
    "a name that is a list": [added("a"), event("MODIFIED", {"metadata": {"name": ["x"]}}), bookmark()],
    "an unknown event type": [added("a"), event("SOMETHING", {"metadata": {"name": "x"}}), bookmark()],
    "an ERROR 410": [added("a"), event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}), bookmark()],
    "an ERROR 500": [added("a"), event("ERROR", {"kind": "Status", "code": 500}), bookmark()],
    "a confused ERROR code": [added("a"), b'{"type": "ERROR", "object": {"kind": "Status", "code": 1e400}}', bookmark()],
    "a resourceVersion that is a number": [
        added("a"),
        b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": 5}}}',
        bookmark(),
    ],
    "not JSON": [added("a"), b"\x00\xff not json", bookmark()],
    "a number too large for the schema": [
        added("a"),
        b'{"type": "ADDED", "object": {"metadata": {"name": "x", "generation": 1e400}}}',
        bookmark(),
    ],
    "a lone surrogate": [added("a"), b'{"type": "ADDED", "object": {"metadata": {"name": "x\\ud800"}}}', bookmark()],
    "no end bookmark": [added("a"), added("b")],
}

# The objects of the lines above that are outside the schema (they stay plain dicts).
OUTSIDE_SCHEMA = {"extra", "p", "x", "x\ud800"}


async def first_state(tmp_path: Path, stream: list[bytes], caplog: pytest.LogCaptureFixture, *, typed: bool) -> tuple[
    list[tuple[str, dict[str, Any]]], list[type], list[str]
]:  # fmt: skip
    """The first batch delivered (type, plain object), the objects' types, and the messages of
    the reflector's log (INFO and up) until then."""
    hostility = Hostility(rate=0.0)
    caplog.clear()
    delivered: list[Sequence[WatchEvent]] = []
    messages: list[str] = []

    def batch_sink(events: Sequence[WatchEvent]) -> None:
        if not delivered:
            # Each run has its own server: its port is left out.
            messages.extend(re.sub(r"127\.0\.0\.1:\d+", "server", r.getMessage()) for r in caplog.records
                            if r.name == "kubeproxy.sources.api")  # fmt: skip
        delivered.append(events)

    with ApiServer(hostility=hostility) as server:
        server.apply(svc("listed"))  # what a fallback list finds
        hostility.script(b"\n".join(stream) + b"\n", watch=True)
        async with reflecting(server, tmp_path, batch_sink=batch_sink, watch_list=True, typed_lists=typed, rand=NoJitter()) as (
            reflector,
            _,
        ):
            await reflector.wait_synced()
    first = delivered[0]
    state: list[tuple[str, dict[str, Any]]] = [
        (e.type, same_in_both(as_plain(e.obj) if isinstance(e.obj, Item) else e.obj)) for e in first
    ]
    return state, [type(e.obj) for e in first], messages


def same_in_both(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` without what each run's own server makes up (a fallback list's uid and timestamp)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "creationTimestamp")}
    return {**obj, "metadata": meta}


@pytest.mark.parametrize("name", list(STREAMS))
def test_typed_initial_events_read_as_the_general_path_reads_them(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")
    stream = STREAMS[name]

    async def main() -> None:
        plain, plain_types, plain_log = await first_state(tmp_path, stream, caplog, typed=False)
        typed, typed_types, typed_log = await first_state(tmp_path, stream, caplog, typed=True)
        assert typed == plain
        assert typed_log == plain_log
        assert set(plain_types) == {dict}
        # The objects within the schema took the typed path (a streamed state, not a fallback list's).
        if any("streamed" in m for m in typed_log):
            within = [obj for _, obj in plain if obj["metadata"]["name"] not in OUTSIDE_SCHEMA]
            assert typed_types.count(Item) == len(within) > 0

    run(main())


def test_the_streams_cover_both_paths(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The cases above are not all fallbacks: the valid stream is streamed, a malformed one is not."""
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.api")

    async def main() -> None:
        state, types, messages = await first_state(tmp_path, STREAMS["deleted-and-modified-in-the-initial-events"], caplog,
                                                   typed=True)  # fmt: skip
        assert [(t, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]) for t, obj in state] == [("ADDED", "b", "5")]
        assert types == [Item]
        assert any("streamed 1 services at resourceVersion 9" in m for m in messages), messages
        _, _, messages = await first_state(tmp_path, STREAMS["no name"], caplog, typed=True)
        assert any("MalformedEvent" in m and "has no metadata.name" in m for m in messages), messages

    run(main())
