"""Protobuf answers of upstream's kube-apiserver (tests/fixtures/apiserver_protobuf, captured by
its capture.py from v1.37.2) decode into the same structs and objects as the JSON answers for
the same server state; truncated and garbled bytes are a WireError, never another exception."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kubeproxy.cluster import proto_schema as PS
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.objects import DEFAULT_OPTIONS, parse_endpoint_slice, parse_node, parse_service
from kubeproxy.cluster.schema import Item, Metadata, as_plain
from kubeproxy.cluster.servicecidr import ServiceCIDR, parse_service_cidr
from kubeproxy.cluster.typed import parse_item
from kubeproxy.cluster.validation import ParseOptions
from kubeproxy.sources import protobuf, wire

FIXTURES = Path(__file__).parents[1] / "fixtures" / "apiserver_protobuf"
RESOURCES = [("services", "Service"), ("endpointslices", "EndpointSlice"), ("nodes", "Node"), ("servicecidrs", "ServiceCIDR")]
TYPED = [(resource, kind) for resource, kind in RESOURCES if kind not in PS.PLAIN_KINDS]  # the struct parse path's
PARSERS: dict[str, Callable[[dict[str, Any], ParseOptions], object]] = {
    "Service": parse_service, "EndpointSlice": parse_endpoint_slice, "Node": parse_node,
    "ServiceCIDR": lambda obj, _: parse_service_cidr(obj),
}  # fmt: skip


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def prune(value: dict[str, Any], message: PS.Message) -> dict[str, Any]:
    """A JSON object without the fields the protobuf tables do not read (managedFields,
    ownerReferences, a Node's conditions, ...) and without JSON's null for a nil list."""
    out: dict[str, Any] = {}
    for spec in message.fields.values():
        name = spec.attr.rstrip("_")
        found = value.get(name)
        if found is None:
            continue
        if spec.kind == PS.MSG:
            assert spec.message is not None
            found = [prune(entry, spec.message) for entry in found] if spec.repeated else prune(found, spec.message)
        out[name] = found
    return out


def frames(stream: bytes) -> list[bytes]:
    """A protobuf watch body split into its length-delimited frames."""
    out, pos = [], 0
    while pos < len(stream):
        size = protobuf.frame_length(stream[pos : pos + 4])
        out.append(stream[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(stream)
    return out


def json_lines(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.splitlines() if line.strip()]


def parsed(kind: str, obj: dict[str, Any]) -> object:
    """What the dict parsers make of an object, or the message they refuse it with."""
    try:
        return PARSERS[kind](obj, DEFAULT_OPTIONS)
    except ObjectError as e:
        return str(e)


def test_service_cidrs_parse_alike_from_both_encodings() -> None:
    """Outside the typed schema, a ServiceCIDR's struct is read as plain dicts, as its JSON is."""
    _, items = protobuf.decode_list(fixture("servicecidrs.list.pb"), "ServiceCIDR")
    listed = json.loads(fixture("servicecidrs.list.json"))["items"]
    cidrs = [parse_service_cidr(as_plain(item)) for item in items]
    assert cidrs == [parse_service_cidr(obj) for obj in listed]
    assert all(isinstance(cidr, ServiceCIDR) for cidr in cidrs)
    assert [str(net) for cidr in cidrs for net in cidr.cidrs] == [
        "10.250.0.0/24",
        "fd00:250::/112",
        "10.96.0.0/12",
        "10.251.0.0/24",
    ]


@pytest.mark.parametrize(("resource", "kind"), RESOURCES)
def test_a_list_decodes_to_the_json_lists_fields(resource: str, kind: str) -> None:
    head, items = protobuf.decode_list(fixture(f"{resource}.list.pb"), kind)
    listed = json.loads(fixture(f"{resource}.list.json"))
    assert head == {"kind": listed["kind"], "apiVersion": listed["apiVersion"], "metadata": listed["metadata"]}
    assert len(items) == len(listed["items"]) > 0
    for item, obj in zip(items, listed["items"], strict=True):
        assert isinstance(item, Item)
        assert as_plain(item) == prune(obj, PS.KINDS[kind])


@pytest.mark.parametrize(("resource", "kind"), TYPED)
def test_a_list_gives_the_json_lists_objects_on_both_parse_paths(resource: str, kind: str) -> None:
    _, items = protobuf.decode_list(fixture(f"{resource}.list.pb"), kind)
    listed = json.loads(fixture(f"{resource}.list.json"))["items"]
    for item, obj in zip(items, listed, strict=True):
        item.kind = obj["kind"] = kind
        from_json = parsed(kind, obj)
        assert not isinstance(from_json, str), from_json
        assert parse_item(item, DEFAULT_OPTIONS, CheckCache()) == from_json  # the struct path
        assert parsed(kind, as_plain(item)) == from_json  # the dict path


@pytest.mark.parametrize("stream", ["watch", "watchlist"])
@pytest.mark.parametrize(("resource", "kind"), RESOURCES)
def test_watch_frames_decode_to_the_json_watchs_events(resource: str, kind: str, stream: str) -> None:
    events = [protobuf.watch_event(frame) for frame in frames(fixture(f"{resource}.{stream}.pb"))]
    lines = json_lines(fixture(f"{resource}.{stream}.json"))
    assert [e.type for e in events] == [line["type"] for line in lines]
    # capture.py's changes (a ServiceCIDR's deletion waits for its finalizer: MODIFIED)
    changes = {"Node": {"MODIFIED"}, "ServiceCIDR": {"ADDED", "MODIFIED"}}.get(kind, {"ADDED", "MODIFIED", "DELETED"})
    assert {e.type for e in events} == (changes if stream == "watch" else {"ADDED", "BOOKMARK"})
    for event, line in zip(events, lines, strict=True):
        item = protobuf.event_object(event)
        assert (item.kind, item.apiVersion) == (line["object"]["kind"], line["object"]["apiVersion"])
        item.kind = item.apiVersion = msgspec.UNSET  # the tables hold no TypeMeta: the envelope does
        expected = prune(line["object"], PS.KINDS[kind])
        if event.type == "BOOKMARK":
            # The two watch-lists were asked for one after the other: each ends at the version
            # current when it was asked, which may differ. Their objects are the same state.
            assert isinstance(item.metadata, Metadata)
            item.metadata.resourceVersion = expected["metadata"]["resourceVersion"]
        assert as_plain(item) == expected
    if stream == "watchlist":
        end = as_plain(protobuf.event_object(events[-1]))
        assert end["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_a_status_decodes_as_its_json() -> None:
    decoded = wire.status_of(protobuf.status(fixture("status404.pb")))
    assert decoded == wire.status_of(json.loads(fixture("status404.json")))
    assert (decoded.code, decoded.reason) == (404, "NotFound")


# -- hostile bytes


def _every_prefix_and_flip(data: bytes, seed: int) -> list[bytes]:
    rand = random.Random(seed)
    cases = [data[:n] for n in range(len(data))]
    for _ in range(400):
        garbled = bytearray(data)
        for _ in range(rand.randint(1, 4)):
            garbled[rand.randrange(len(garbled))] = rand.randrange(256)
        cases.append(bytes(garbled))
    return cases


@pytest.mark.parametrize(("resource", "kind"), RESOURCES)
def test_truncated_or_garbled_lists_are_wire_errors(resource: str, kind: str) -> None:
    refused = 0
    for case in _every_prefix_and_flip(fixture(f"{resource}.list.pb"), seed=len(resource)):
        try:
            protobuf.decode_list(case, kind)
        except wire.WireError as e:
            refused += 1
            assert str(e)
    assert refused > len(fixture(f"{resource}.list.pb")) // 2  # most cuts land inside a field


@pytest.mark.parametrize(("resource", "kind"), RESOURCES)
def test_truncated_or_garbled_watch_frames_are_wire_errors(resource: str, kind: str) -> None:
    for index, frame in enumerate(frames(fixture(f"{resource}.watch.pb"))):
        for case in _every_prefix_and_flip(frame, seed=index):
            try:
                protobuf.event_object(protobuf.watch_event(case))
            except wire.WireError as e:
                assert str(e)


def test_truncated_or_garbled_statuses_are_wire_errors() -> None:
    for case in _every_prefix_and_flip(fixture("status404.pb"), seed=404):
        try:
            wire.status_of(protobuf.status(case))
        except wire.WireError as e:
            assert str(e)


def _tag(number: int, wire_type: int) -> bytes:
    return bytes([number << 3 | wire_type])


def _ld(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return _tag(number, 2) + bytes([len(payload)]) + payload


def _list_of(kind: str, *items: bytes) -> bytes:
    body = _ld(1, _ld(2, b"7")) + b"".join(_ld(2, item) for item in items)
    unknown = _ld(1, _ld(1, b"v1") + _ld(2, f"{kind}List".encode())) + _tag(2, 2) + bytes([len(body)]) + body
    return protobuf.MAGIC + unknown


def test_a_malformed_item_is_named_by_its_index_and_name() -> None:
    good = _ld(1, _ld(1, b"web") + _ld(3, b"pb"))
    bad = _ld(1, _ld(1, b"db") + _ld(3, b"pb")) + _ld(2, _tag(3, 2) + b"\x01")  # clusterIP's length runs out
    with pytest.raises(wire.WireError, match=r"item 1 \(pb/db\): Service.spec: ServiceSpec.clusterIP: 1 bytes run past"):
        protobuf.decode_list(_list_of("Service", good, bad), "Service")
    wrong_type = _ld(1, _ld(1, b"db")) + _ld(2, _ld(1, _tag(3, 2) + b"\x00"))  # a port number as bytes
    with pytest.raises(
        wire.WireError, match=r"item 0 \(db\): Service.spec: ServiceSpec.ports: ServicePort.port has wire type length-delimited"
    ):
        protobuf.decode_list(_list_of("Service", wrong_type), "Service")


def test_a_list_of_another_kind_keeps_only_its_head() -> None:
    head, items = protobuf.decode_list(fixture("nodes.list.pb"), "Service")
    assert (head["kind"], items) == ("NodeList", [])


def test_an_encoded_envelope_and_a_body_that_is_not_protobuf_are_refused() -> None:
    body = _list_of("Service")
    gzipped = body + _ld(3, b"gzip")
    with pytest.raises(wire.WireError, match="encoded as 'gzip'"):
        protobuf.decode_list(gzipped, "Service")
    with pytest.raises(wire.WireError, match="not Kubernetes protobuf"):
        protobuf.decode_list(b'{"kind": "ServiceList"}', "Service")


def test_over_long_varints_and_undefined_wire_types_are_refused() -> None:
    with pytest.raises(wire.WireError, match="longer than 10 bytes"):
        protobuf.decode_list(_list_of("Service", _tag(4, 0) + b"\xff" * 11 + b"\x01"), "Service")
    with pytest.raises(wire.WireError, match="wire type 3"):
        protobuf.decode_list(_list_of("Service", _tag(9, 3)), "Service")
    with pytest.raises(wire.WireError, match="field number 0"):
        protobuf.decode_list(_list_of("Service", b"\x02\x00"), "Service")


def test_times_outside_years_1_to_9999_are_refused() -> None:
    # ObjectMeta.deletionTimestamp (9) at 2^40 seconds: past the year 9999.
    seconds = 1 << 40
    varint = bytearray()
    while seconds >= 0x80:
        varint.append(seconds & 0x7F | 0x80)
        seconds >>= 7
    varint.append(seconds)
    item = _ld(1, _ld(1, b"web") + _ld(9, _tag(1, 0) + bytes(varint)))
    with pytest.raises(wire.WireError, match="outside the years 1-9999"):
        protobuf.decode_list(_list_of("Service", item), "Service")


def test_a_list_of_too_many_items_is_refused_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protobuf, "MAX_LIST_ITEMS", 3)
    item = _ld(1, _ld(1, b"a"))
    assert len(protobuf.decode_list(_list_of("Service", *[item] * 3), "Service")[1]) == 3
    with pytest.raises(wire.WireError, match="over 3 objects"):
        protobuf.decode_list(_list_of("Service", *[item] * 4), "Service")
