"""The decoders compiled from the protobuf tables (cluster/proto_message.py): random Services and
EndpointSlices, encoded here field by field, decode to the structs their values make, whatever
the widths of their varints (1, 2, 3+ bytes: the inline and the general reads), the lengths of
their texts and the unknown fields between them; every cut and byte flip of them is a
ProtoError or a decoded struct, never another exception; remembered flat messages are new
structs each time, and a table the compiler cannot read is refused when it is made."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET, Struct

from kubeproxy.cluster import proto_message as PM
from kubeproxy.cluster import proto_schema as PS
from kubeproxy.cluster import schema as S
from kubeproxy.cluster.protowire import ProtoError, fields


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 as protobuf writes it: ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def number(field: int, value: int) -> bytes:
    return key(field, 0) + varint(value)


def delimited(field: int, payload: bytes) -> bytes:
    return key(field, 2) + varint(len(payload)) + payload


def text(field: int, value: str) -> bytes:
    return delimited(field, value.encode())


# Numbers either side of the 1-, 2- and 3-byte varint widths, and negative ones (ten bytes).
NUMBERS = st.sampled_from([0, 1, 127, 128, 300, 16383, 16384, 65535, 2**31 - 1, -1, -(2**31)]) | st.integers(-(2**31), 2**31 - 1)
# Texts either side of the 1- and 2-byte length widths.
TEXTS = st.text(max_size=3) | st.integers(120, 140).map(lambda n: "é" * (n // 2)) | st.sampled_from(["", "x" * 16384, "TCP"])
# A field none of the tables lists (an unread field, as managedFields is), of each wire type.
UNKNOWN = st.sampled_from([
    number(99, 5), number(99, 2**40), key(99, 1) + bytes(8), key(99, 5) + bytes(4), delimited(99, b"x" * 200),
    delimited(2047, b""), number(2047, 300),
])  # fmt: skip


@st.composite
def service_port(draw: st.DrawFn) -> tuple[bytes, S.Port]:
    name, protocol, port, node_port = draw(TEXTS), draw(st.sampled_from(["TCP", "UDP", ""])), draw(NUMBERS), draw(NUMBERS)
    target: int | str = draw(NUMBERS | TEXTS)
    if isinstance(target, int):
        encoded_target, target = number(2, target), target
    else:
        encoded_target = number(1, 1) + text(3, target)
    body = (
        text(1, name) + text(2, protocol) + number(3, port) + delimited(4, encoded_target) + number(5, node_port)
        + draw(UNKNOWN)
    )  # fmt: skip
    # Protobuf writes a zero: JSON leaves it out, but for a pointer (port).
    expected = S.Port(
        name=name or UNSET, protocol=protocol or UNSET, port=port, targetPort=target or UNSET, nodePort=node_port or UNSET
    )
    return body, expected


@st.composite
def service(draw: st.DrawFn) -> tuple[bytes, S.Item]:
    name, uid, seconds = draw(TEXTS), draw(TEXTS), draw(st.integers(0, 2**33))
    labels = draw(st.dictionaries(TEXTS, TEXTS, max_size=3))
    meta = text(1, name) + text(5, uid) + delimited(8, number(1, seconds))
    meta += b"".join(delimited(11, text(1, k) + text(2, v)) for k, v in labels.items())
    ports = draw(st.lists(service_port(), max_size=3))
    cluster_ips = draw(st.lists(TEXTS, max_size=2))
    health, publish, timeout = draw(NUMBERS), draw(st.booleans()), draw(NUMBERS)
    spec = b"".join(delimited(1, body) for body, _ in ports) + b"".join(text(18, ip) for ip in cluster_ips)  # 18: two-byte key
    spec += draw(UNKNOWN) + number(12, health) + number(13, publish) + number(20, False)
    spec += delimited(14, delimited(1, number(1, timeout)))
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    expected = S.Item(
        metadata=S.Metadata(name=name or UNSET, uid=uid or UNSET, creationTimestamp=stamp, labels=labels or UNSET),
        spec=S.Spec(
            ports=[port for _, port in ports] or UNSET,
            clusterIPs=cluster_ips or UNSET,
            healthCheckNodePort=health or UNSET,
            publishNotReadyAddresses=publish or UNSET,
            allocateLoadBalancerNodePorts=False,  # a pointer: kept at its zero
            sessionAffinityConfig=S.SessionAffinityConfig(clientIP=S.ClientIPConfig(timeoutSeconds=timeout)),
        ),
    )
    return delimited(1, meta) + delimited(2, spec), expected


@st.composite
def endpoint_slice(draw: st.DrawFn) -> tuple[bytes, S.Item]:
    endpoints, expected = b"", []
    for _ in range(draw(st.integers(0, 4))):
        address, ready, node = draw(TEXTS), draw(st.booleans()), draw(TEXTS)
        conditions = number(1, ready) + number(2, True) + number(3, False)
        endpoints += delimited(2, text(1, address) + delimited(2, conditions) + draw(UNKNOWN) + text(6, node))
        expected.append(
            S.Endpoint(addresses=[address], conditions=S.Conditions(ready=ready, serving=True, terminating=False), nodeName=node)
        )
    body = delimited(1, text(1, "s")) + endpoints + text(4, "IPv4")
    return body, S.Item(metadata=S.Metadata(name="s"), addressType="IPv4", endpoints=expected or UNSET)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(service())
def test_a_service_decodes_to_the_values_encoded(case: tuple[bytes, S.Item]) -> None:
    body, expected = case
    assert PS.decode_item(body, 0, len(body), "Service") == expected


@settings(max_examples=200, deadline=None)
@given(endpoint_slice())
def test_an_endpoint_slice_decodes_to_the_values_encoded(case: tuple[bytes, S.Item]) -> None:
    body, expected = case
    assert PS.decode_item(body, 0, len(body), "EndpointSlice") == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(service(), st.randoms(use_true_random=False))
def test_cut_or_flipped_bytes_are_a_proto_error_or_a_struct(case: tuple[bytes, S.Item], rand: random.Random) -> None:
    body, _ = case
    cases = [body[:n] for n in range(0, len(body), max(1, len(body) // 200))]
    for _ in range(50):
        garbled = bytearray(body)
        for _ in range(rand.randint(1, 3)):
            garbled[rand.randrange(len(garbled))] = rand.randrange(256)
        cases.append(bytes(garbled))
    for data in cases:
        # Inside a larger buffer: nothing past the message's end may be read as its own.
        buf = data + b"\x0a\x7f" + b"\xff" * 8
        try:
            decoded = PS.decode_item(buf, 0, len(data), "Service")
        except ProtoError as e:
            assert str(e)
            with pytest.raises(ProtoError):
                PS.decode_item(data, 0, len(data), "Service")
        else:
            assert decoded == PS.decode_item(data, 0, len(data), "Service")


def test_a_cut_inside_a_two_byte_length_or_key_is_a_proto_error() -> None:
    spec = text(18, "x" * 200)  # key 0x92 0x01, length 0xc8 0x01
    for cut in range(1, 4):
        body = delimited(2, spec[:cut])
        with pytest.raises(ProtoError, match=r"cut off|run past"):
            PS.decode_item(body + b"\x01" * 4, 0, len(body), "Service")
    # A number's first byte the message's last: the byte after it, outside, is not its second.
    cut_number = delimited(2, number(12, 300)[:-1])
    with pytest.raises(ProtoError, match=r"Service\.spec: a varint at offset \d+ is cut off"):
        PS.decode_item(cut_number + b"\x01", 0, len(cut_number), "Service")
    wrong = delimited(2, number(18, 1))
    with pytest.raises(ProtoError, match=r"Service\.spec: ServiceSpec\.clusterIPs has wire type varint, not length-delimited"):
        PS.decode_item(wrong, 0, len(wrong), "Service")


def test_remembered_flat_messages_are_new_structs_and_the_memory_is_bounded() -> None:
    port = text(1, "http") + number(3, 80) + delimited(4, number(2, 8080))
    decoded = [PS.SERVICE_PORT.decoder(port, 0, len(port)) for _ in range(3)]
    assert decoded == [S.Port(name="http", port=80, targetPort=8080)] * 3
    assert len({id(struct) for struct in decoded}) == 3
    decoded[1].port = 81
    assert PS.SERVICE_PORT.decoder(port, 0, len(port)).port == 80
    # More distinct ports than are remembered, and ports too long to be: each decoded as itself.
    for value in [*range(PM.SEEN_MESSAGES + 100), 0]:
        body = number(3, value) + text(1, "n" * (PM.SEEN_BYTES if value == 7 else 2))
        assert PS.SERVICE_PORT.decoder(body, 0, len(body)) == S.Port(port=value, name="n" * (PM.SEEN_BYTES if value == 7 else 2))
    seen = PS.SERVICE_PORT.decoder.__globals__["SEEN"]  # the compiled decoder's own memory
    assert 0 < len(seen) <= PM.SEEN_MESSAGES
    assert max(len(raw) for raw in seen) <= PM.SEEN_BYTES


def test_times_long_or_short_decode_alike() -> None:
    short = number(1, 1_700_000_000)
    padded = short + delimited(99, b"p" * (PM.SEEN_BYTES + 10))
    stamps = [PM._time_text(body, 0, len(body)) for body in (short, padded)]
    assert stamps == ["2023-11-14T22:13:20Z"] * 2
    assert PM._time_text(b"", 0, 0) is None


class _Two(Struct):
    a: int | None = None
    b: list[int] | None = None


@pytest.mark.parametrize(
    ("name", "fields", "refusal"),
    [
        ("Two", {1: PM.Field("c", PM.INT)}, "has no 'c'"),
        ("Two", {1: PM.Field("b", PM.INT, repeated=True)}, "only texts and messages"),
        ("Two", {1: PM.Field("a", PM.MSG)}, "names its message"),
        ("Two(", {1: PM.Field("a", PM.INT)}, "not a message name"),
    ],
)
def test_a_table_the_compiler_cannot_read_is_refused(name: str, fields: dict[int, PM.Field], refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        PM.Message(name, _Two, fields)


def test_the_field_reader_reads_one_and_two_byte_keys_and_lengths_within_its_message() -> None:
    body = text(1, "a") + text(16, "b" * 200) + number(2, 300)
    assert [(n, w) for n, w, _, _ in fields(body + b"\x0a\x7f", 0, len(body))] == [(1, 2), (16, 2), (2, 0)]
    for cut, refusal in [(1, "cut off"), (2, "run past"), (5, "cut off"), (len(body) - 1, "cut off")]:
        with pytest.raises(ProtoError, match=refusal):
            list(fields(body[:cut] + b"\x01" * 4, 0, cut))
