"""Against upstream's kube-apiserver (v1.37.2): API sources asking for protobuf and for JSON hold
the same objects for the same server state (Services, EndpointSlices, the Node and ServiceCIDRs),
through a watch-list or a list, then through the watch's ADDED, MODIFIED and DELETED events; the
protobuf ones are really answered in protobuf."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.objects import DEFAULT_OPTIONS, Service, parse_endpoint_slice, parse_node, parse_service
from kubeproxy.cluster.schema import Item, as_plain
from kubeproxy.cluster.servicecidr import parse_service_cidr
from kubeproxy.cluster.typed import parse_item
from kubeproxy.lab.control_plane import ControlPlane
from kubeproxy.sources import protobuf
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.fixtures.apiserver_protobuf import capture
from tests.upstream.conftest import require_upstream_binaries

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

PARSERS: dict[str, Callable[..., object]] = {
    "Service": parse_service, "EndpointSlice": parse_endpoint_slice, "Node": parse_node,
    "ServiceCIDR": lambda obj, _: parse_service_cidr(obj),
}  # fmt: skip
LAST = "zz-last"  # written after every other change: seen, everything before it was delivered


def model(kind: str, obj: dict[str, Any] | Item) -> object:
    """The cluster model's object, by the struct path where it takes the object, else the dict path."""
    if isinstance(obj, Item):
        made = parse_item(obj, DEFAULT_OPTIONS, CheckCache())
        if made is not None:
            return made
        obj = as_plain(obj)
    return PARSERS[kind](obj, DEFAULT_OPTIONS)


@dataclass
class Mirror:
    """What one source delivered, as the model's objects by (kind, namespace, name)."""

    objects: dict[tuple[str, str, str], object] = field(default_factory=dict)
    media: set[str] = field(default_factory=set)
    last: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def on_event(self, event: WatchEvent) -> None:
        if event.kind not in PARSERS:
            return
        key = (event.kind, event.namespace, event.name)
        if event.type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = model(event.kind, event.obj)
        if event.name == LAST or event.annotations.get("example.com/last") == "yes":
            self.last.add(event.kind)
        if self.last == set(PARSERS):
            self.done.set()

    async def on_response(self, response: httpx2.Response) -> None:
        self.media.add(response.headers.get("content-type", "").split(";")[0])


def last_changes(cp: ControlPlane) -> None:
    capture.after(cp)
    capture.apply(cp, capture.service(LAST, {"ports": [{"name": "http", "port": 80}]}))
    capture.apply(cp, capture.slice_(LAST, LAST, "IPv4", [capture.endpoint(["10.1.0.99"])], [{"name": "http", "port": 80}]))
    cp.run_kubectl("annotate", "node", "node-a", "example.com/last=yes")
    capture.apply(cp, capture.service_cidr(LAST, ["10.252.0.0/24"]))


@pytest.mark.parametrize("watch_list", [True, False], ids=["watch-list", "list"])
def test_protobuf_and_json_sources_hold_the_same_objects(tmp_path: Path, watch_list: bool) -> None:
    bin_dir = require_upstream_binaries()
    with ControlPlane.start(bin_dir, tmp_path / "cp") as cp:
        capture.before(cp)
        config = load_config(cp.admin_kubeconfig)
        mirrors = {"protobuf": Mirror(), "json": Mirror()}

        async def main() -> None:
            sources, tasks = [], []
            for encoding, mirror in mirrors.items():
                client = connect(config, trust_env=False)
                client.event_hooks["response"].append(mirror.on_response)
                content_type = protobuf.MEDIA_TYPE if encoding == "protobuf" else "application/json"
                source = ApiSource(client, "node-a", mirror.on_event, typed_lists=True, watch_list=watch_list,
                                   content_type=content_type)  # fmt: skip
                sources.append(source)
                tasks.append(asyncio.create_task(source.run()))
            try:
                for reflector in (r for source in sources for r in source.reflectors):
                    await reflector.wait_synced()  # ServiceCIDRs too, which the source's sync does not wait for
                assert mirrors["protobuf"].objects == mirrors["json"].objects
                await asyncio.to_thread(last_changes, cp)
                for mirror in mirrors.values():
                    await mirror.done.wait()
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                for source in sources:
                    await source.client.aclose()

        asyncio.run(asyncio.wait_for(main(), 120))

    pb, js = mirrors["protobuf"], mirrors["json"]
    assert pb.media == {protobuf.MEDIA_TYPE} and js.media == {"application/json"}
    assert pb.objects == js.objects
    names = {(kind, name) for kind, _, name in pb.objects}
    assert {("Service", "web"), ("Service", "late"), ("EndpointSlice", "manual-c"), ("Node", "node-a")} <= names
    assert {("ServiceCIDR", "kubernetes"), ("ServiceCIDR", "extra"), ("ServiceCIDR", "late")} <= names
    assert ("Service", "ext") not in names and ("EndpointSlice", "manual-b") not in names  # deleted
    web = pb.objects[("Service", "pb", "web")]
    assert isinstance(web, Service) and [p.port for p in web.ports] == [81, 53]  # the port the watch changed
