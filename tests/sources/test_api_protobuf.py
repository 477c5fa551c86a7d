"""The reflector asks for protobuf when clientConnection.contentType does, reads upstream's
protobuf answers (tests/fixtures/apiserver_protobuf) into the same events as the JSON answers for
the same state, and takes JSON where the server answers JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from prometheus_client import CollectorRegistry

from kubeproxy.cluster.objects import DEFAULT_OPTIONS, parse_endpoint_slice, parse_node, parse_service
from kubeproxy.cluster.proto_schema import PLAIN_KINDS
from kubeproxy.cluster.schema import Item, as_plain
from kubeproxy.cluster.servicecidr import parse_service_cidr
from kubeproxy.cluster.validation import ParseOptions
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.proxy import kube_proxy
from kubeproxy.proxy.flags import parse, resolve
from kubeproxy.proxy.preflight import ApiConnection
from kubeproxy.sources import protobuf
from kubeproxy.sources.api import (
    ACCEPT_JSON,
    ACCEPT_PROTOBUF,
    ApiSource,
    Reflector,
    ResourceSpec,
    accept_header,
    endpoint_slices,
    node,
    service_cidrs,
    services,
)
from kubeproxy.sources.events import Sink, WatchEvent
from tests.sources.test_api_reflector import Delays, reflecting, run, svc, take

pytestmark = pytest.mark.timeout(30)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "apiserver_protobuf"
PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"
SPECS = {"services": services(), "endpointslices": endpoint_slices(), "nodes": node("node-a"), "servicecidrs": service_cidrs()}
Answer = Callable[[httpx2.Request], Coroutine[None, None, httpx2.Response]]
PARSERS: dict[str, Callable[[Any, ParseOptions], object]] = {
    "Service": parse_service, "EndpointSlice": parse_endpoint_slice, "Node": parse_node,
    "ServiceCIDR": lambda obj, _: parse_service_cidr(obj),
}  # fmt: skip


class Captured:
    """Answers a reflector from one capture: the list, then its watch, then a watch that stays open."""

    def __init__(self, resource: str, suffix: str) -> None:
        self.resource, self.suffix = resource, suffix
        self.accepts: list[str] = []
        self.watches = 0

    def _body(self, what: str) -> bytes:
        return (FIXTURES / f"{self.resource}.{what}.{self.suffix}").read_bytes()

    async def answer(self, request: httpx2.Request) -> httpx2.Response:
        self.accepts.append(request.headers.get("accept", ""))
        media = protobuf.MEDIA_TYPE if self.suffix == "pb" else "application/json"
        if request.url.params.get("watch") != "true":
            return httpx2.Response(200, content=self._body("list"), headers={"content-type": media})
        self.watches += 1
        stream_media = PROTOBUF_WATCH if self.suffix == "pb" else "application/json"
        if self.watches == 1:
            return httpx2.Response(200, content=self._body("watch"), headers={"content-type": stream_media})
        return httpx2.Response(200, content=_open_stream(), headers={"content-type": stream_media})


async def _open_stream() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()  # a watch the server keeps open until the test ends
    yield b""


def _objects(events: list[WatchEvent]) -> list[tuple[str, object]]:
    """Each event's type and what the dict parsers make of its object (a deletion: its key)."""
    out: list[tuple[str, object]] = []
    for event in events:
        obj = as_plain(event.obj) if isinstance(event.obj, Item) else event.obj
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        out.append((event.type, key if event.type == "DELETED" else PARSERS[event.kind](obj, DEFAULT_OPTIONS)))
    return out


@contextlib.asynccontextmanager
async def _running(answer: Answer, spec: ResourceSpec, sink: Sink, **options: Any) -> AsyncIterator[Delays]:
    """A reflector answered by `answer` until the block ends; its injected sleep's record."""
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="http://api")
    delays = Delays()
    task = asyncio.create_task(Reflector(client, spec, sink, sleep=delays.sleep, **options).run())
    try:
        yield delays
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


async def _reflect(capture: Captured, spec: ResourceSpec, count: int, **options: Any) -> list[WatchEvent]:
    """The first `count` events a reflector delivers from `capture` (the list's and the watch's)."""
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    async with _running(capture.answer, spec, queue.put_nowait, **options):
        return [await queue.get() for _ in range(count)]


def _event_count(resource: str) -> int:
    """The list's objects and the watch's events, counted in the JSON capture."""
    listed = len(json.loads((FIXTURES / f"{resource}.list.json").read_bytes())["items"])
    watched = sum(1 for line in (FIXTURES / f"{resource}.watch.json").read_bytes().splitlines() if line.strip())
    return listed + watched


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "plain"])
@pytest.mark.parametrize("resource", sorted(SPECS))
def test_protobuf_answers_deliver_the_events_json_answers_deliver(resource: str, typed: bool) -> None:
    count = _event_count(resource)
    as_json, as_protobuf = Captured(resource, "json"), Captured(resource, "pb")

    async def main() -> tuple[list[WatchEvent], list[WatchEvent]]:
        json_events = await _reflect(as_json, SPECS[resource], count, typed_lists=typed)
        pb_events = await _reflect(as_protobuf, SPECS[resource], count, typed_lists=typed, content_type=protobuf.MEDIA_TYPE)
        return json_events, pb_events

    json_events, pb_events = asyncio.run(asyncio.wait_for(main(), 20))
    assert _objects(pb_events) == _objects(json_events)
    assert {e.type for e in pb_events} >= {"ADDED", "MODIFIED"}
    # As a JSON list's items and watch-list events: structs where the typed schema holds the kind.
    assert all(isinstance(e.obj, Item) == (typed and e.kind not in PLAIN_KINDS) for e in pb_events)
    assert set(as_protobuf.accepts) == {ACCEPT_PROTOBUF}
    assert set(as_json.accepts) == {ACCEPT_JSON}


def test_a_protobuf_reflector_takes_json_from_a_server_that_answers_json(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.apply(svc("a"))

    async def main() -> None:
        async with reflecting(apiserver, tmp_path, content_type=protobuf.MEDIA_TYPE) as (reflector, queue):
            assert await take(queue, 1) == [("ADDED", "a")]
            await reflector.wait_synced()
            apiserver.apply(svc("b"))
            assert await take(queue, 1) == [("ADDED", "b")]

    run(main())


def _stream(*frames: bytes) -> bytes:
    return b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x00\x00\x00\x05ab", "ended inside a protobuf frame"),
        (b"\x00\x00", "ended inside a protobuf frame"),
        (b"\xff\xff\xff\xff", "is over"),
        (_stream(b"\x0a\x05ADDED"), "has no object"),
        (_stream(b"\x0a\x05ADDED\x12\x06\x0a\x04k8s\x00\x0a\x01"), "malformed protobuf"),
        (_stream(b"\x0a\x04GONE\x12\x06\x0a\x04k8s\x00"), "is not one of"),
        (_stream(b"\x0a\x05ADDED\x12\x06\x0a\x04k8s\x00"), "names no kind"),
    ],
    ids=["cut-frame", "cut-header", "huge-frame", "no-object", "cut-envelope", "bad-type", "no-kind"],
)
def test_a_malformed_protobuf_watch_is_an_error_named_and_retried(
    body: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The error names the resource and what is wrong; the reflector backs off and watches again
    from where it was, and the events after it are delivered."""
    seen: list[str] = []
    list_body = (FIXTURES / "services.list.pb").read_bytes()
    good_watch = (FIXTURES / "services.watch.pb").read_bytes()

    async def answer(request: httpx2.Request) -> httpx2.Response:
        watch = request.url.params.get("watch") == "true"
        seen.append(f"watch {request.url.params.get('resourceVersion')}" if watch else "list")
        if not watch:
            return httpx2.Response(200, content=list_body, headers={"content-type": protobuf.MEDIA_TYPE})
        if seen.count("list") == 1 and len(seen) == 2:
            return httpx2.Response(200, content=body, headers={"content-type": PROTOBUF_WATCH})
        if len(seen) == 3:
            return httpx2.Response(200, content=good_watch, headers={"content-type": PROTOBUF_WATCH})
        return httpx2.Response(200, content=_open_stream(), headers={"content-type": PROTOBUF_WATCH})

    async def main() -> list[WatchEvent]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        async with _running(answer, services(), queue.put_nowait, content_type=protobuf.MEDIA_TYPE):
            return [await queue.get() for _ in range(_event_count("services"))]

    events = asyncio.run(asyncio.wait_for(main(), 20))
    assert [e.type for e in events][-1] in ("ADDED", "MODIFIED", "DELETED")
    assert seen[:3] == ["list", f"watch {seen[1].split()[1]}", seen[1]]  # watched again from the same version
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(reason in w and "Service" in w for w in warnings), warnings


def test_a_protobuf_error_answer_is_read_as_its_status(caplog: pytest.LogCaptureFixture) -> None:
    status = (FIXTURES / "status404.pb").read_bytes()
    calls = 0

    async def answer(request: httpx2.Request) -> httpx2.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx2.Response(404, content=status, headers={"content-type": protobuf.MEDIA_TYPE})
        return httpx2.Response(200, content=_open_stream(), headers={"content-type": PROTOBUF_WATCH})

    async def main() -> None:
        async with _running(answer, services(), lambda e: None, content_type=protobuf.MEDIA_TYPE) as delays:
            await delays.slept.wait()

    asyncio.run(asyncio.wait_for(main(), 20))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any('404 NotFound: services \\"none\\" not found' in w for w in warnings), warnings


# clientConnection.acceptContentTypes


@pytest.mark.parametrize(
    ("content_type", "accept", "kind", "header"),
    [
        (protobuf.MEDIA_TYPE, "", "Service", ACCEPT_PROTOBUF),
        ("application/json", "", "Service", ACCEPT_JSON),
        (protobuf.MEDIA_TYPE, "application/json", "Service", "application/json"),
        ("application/json", "application/vnd.kubernetes.protobuf", "EndpointSlice", "application/vnd.kubernetes.protobuf"),
        # client-go asks application/cbor as application/json while its ClientsAllowCBOR gate is off.
        (
            "",
            "application/cbor;q=0.9, application/vnd.kubernetes.protobuf",
            "Node",
            "application/json;q=0.9, " + protobuf.MEDIA_TYPE,
        ),
        (protobuf.MEDIA_TYPE, "application/vnd.kubernetes.protobuf", "Pod", ACCEPT_JSON),  # no protobuf schema here
    ],
)
def test_the_accept_header_is_client_gos(content_type: str, accept: str, kind: str, header: str) -> None:
    assert accept_header(content_type, accept, kind) == header


def test_accept_content_types_is_what_the_requests_ask_for() -> None:
    """acceptContentTypes wins over contentType's default (client-go's setAcceptHeader): JSON only,
    though protobuf is the content type, and the JSON answers deliver the same events."""
    count = _event_count("services")
    as_json = Captured("services", "json")
    options = {"content_type": protobuf.MEDIA_TYPE, "accept_content_types": "application/json", "typed_lists": True}
    events = asyncio.run(asyncio.wait_for(_reflect(as_json, services(), count, **options), 20))
    assert len(events) == count
    assert set(as_json.accepts) == {"application/json"}


def test_an_answer_in_a_type_not_decoded_is_an_error_named_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    """acceptContentTypes may let the server answer YAML: refused by name, backed off, nothing delivered."""
    events: list[WatchEvent] = []

    async def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"kind: ServiceList\nitems: []\n", headers={"content-type": "application/yaml"})

    async def main() -> None:
        async with _running(answer, services(), events.append, accept_content_types="application/yaml") as delays:
            await delays.slept.wait()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert events == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("answered application/yaml, which kubeproxy does not decode" in w for w in warnings), warnings


def test_kube_proxy_asks_with_the_configured_accept_content_types(tmp_path: Path) -> None:
    """As upstream's server.go copies clientConnection.acceptContentTypes into its client's config."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "clientConnection:\n  acceptContentTypes: application/json\n"
    )

    async def main() -> None:
        async with httpx2.AsyncClient(base_url="http://api") as client:
            for args, expected in ((["--config", str(config)], {"application/json"}), ([], {ACCEPT_PROTOBUF})):
                proxy = SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry()), node_name="node-a",
                                        on_event=lambda event: None, on_events=lambda events: None)  # fmt: skip
                source, _ = kube_proxy._source(resolve(parse(args)), proxy, ApiConnection(client, "http://api", "test"))
                assert isinstance(source, ApiSource)
                assert {r.accept for r in source.reflectors} == expected, args

    asyncio.run(main())
