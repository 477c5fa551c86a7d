"""The protobuf wire format, read: varints, fixed-width numbers and length-delimited fields.

Only reading, and only what Kubernetes' messages use (proto2, no groups). Every read is bounded
by the buffer it is given: a varint longer than 10 bytes, a length past the end of its message,
a wire type protobuf does not define (3, 4: the groups Kubernetes never sends; 6, 7) or a field
number 0 is a `ProtoError` saying what and at which offset, never an IndexError or a read past
the message. Decoding into objects is `cluster/proto_schema.py`'s job.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
WIRE_TYPES = {VARINT: "varint", FIXED64: "fixed64", BYTES: "length-delimited", FIXED32: "fixed32"}


class ProtoError(ValueError):
    """Bytes that are not a protobuf message: the message says what and at which offset."""


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(the unsigned varint at `pos`, the offset after it); ProtoError if it runs past `end` or 10 bytes."""
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise ProtoError(f"a varint at offset {start} is cut off by the end of its message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if shift == 63 and byte > 1:
                raise ProtoError(f"the varint at offset {start} is over 64 bits")
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError(f"the varint at offset {start} is longer than 10 bytes")


def skip(buf: bytes, pos: int, end: int, key: int) -> int:
    """The offset after the value of the field whose key (number << 3 | wire type) was read at `pos`."""
    number, wire = key >> 3, key & 7
    if number == 0:
        raise ProtoError(f"field number 0 at offset {pos}")
    if wire == VARINT:
        return varint(buf, pos, end)[1]
    if wire == BYTES:
        size, pos = varint(buf, pos, end)
        stop = pos + size
    elif wire == FIXED64:
        stop = pos + 8
    elif wire == FIXED32:
        stop = pos + 4
    else:
        raise ProtoError(f"field {number} has wire type {wire}, which no Kubernetes message uses")
    if stop > end:
        raise ProtoError(f"field {number} runs past the end of its message")
    return stop


def signed64(value: int) -> int:
    """An int64/int32 field's varint as the signed number it encodes (two's complement, 64 bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message in buf[pos:end] as (number, wire type, value, end): for a varint
    or fixed field `value` is the number and `end` the offset after it; for a length-delimited
    one `value` is the offset where its bytes start and `end` where they stop."""
    if end > len(buf):
        raise ProtoError(f"a message claims {end - pos} bytes where {len(buf) - pos} are left")
    while pos < end:
        key = buf[pos]  # a one-byte key or length read inline: the envelope of every watch frame
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtoError(f"field number 0 at offset {pos}")
        if wire == VARINT:
            value, pos = varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == BYTES:
            size = buf[pos] if pos < end else 0x80
            if size < 0x80:
                start = pos + 1
            else:
                size, start = varint(buf, pos, end)
            pos = start + size
            if pos > end:
                raise ProtoError(f"field {number}'s {size} bytes at offset {start} run past the end of its message")
            yield number, wire, start, pos
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise ProtoError(f"field {number}'s {WIRE_TYPES[wire]} at offset {pos} is cut off")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
            yield number, wire, value, pos
        else:
            raise ProtoError(f"field {number} has wire type {wire}, which no Kubernetes message uses")
