"""A protobuf message's table (field number to struct attribute) and the decoder compiled from it.

`cluster/proto_schema.py` writes Kubernetes' messages as `Message` tables; each table becomes,
when it is made, one Python function that reads that message's bytes into its struct. The
function is generated from the table (its source exists only in memory): the field numbers are
constants in a tree of comparisons on the field's key, each field's attribute a local variable,
and the struct made with positional arguments, which a loop over the table's entries spends most
of its time looking up and dispatching. Only the tables' own names and numbers go into the
source; the bytes being read are data to the function, never code.

What a decoded field gives, as the JSON typed decoder gives it (`schema.py`): protobuf writes a
non-pointer Go field even at its zero value ("" or 0), where the JSON encoder leaves an
`omitempty` field out, so such a field read as zero is left unset; a pointer field (`keep`) is
set whenever it is on the wire. A field the table does not list is skipped by its wire type; a
listed field of another wire type is an error, as in Go's unmarshalling. Every error is a
`ProtoError` naming the message and field, prefixed by each enclosing message's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from msgspec import UNSET, Struct

from kubeproxy.cluster.protowire import BYTES, VARINT, WIRE_TYPES, ProtoError, signed64, skip, varint

STR, INT, BOOL, MSG, MAP, TIME, INTSTR = range(7)
_WIRE_OF = {STR: BYTES, INT: VARINT, BOOL: VARINT, MSG: BYTES, MAP: BYTES, TIME: BYTES, INTSTR: BYTES}

Decoder = Callable[[bytes, int, int], Any]
# The bounds of what a flat message's decoder remembers (see `compile_decoder`): a server can
# fill them, with at most 64 KiB of keys, and then messages are decoded, not looked up.
SEEN_BYTES, SEEN_MESSAGES = 64, 1024


@dataclass(frozen=True)
class Field:
    attr: str
    kind: int
    message: Message | None = None
    repeated: bool = False
    keep: bool = False  # a Go pointer (or always-written) field: zero values are kept


@dataclass(frozen=True)
class Message:
    name: str
    struct: type[Struct]
    fields: Mapping[int, Field] = field(default_factory=dict)
    # buf[pos:end] as `struct`; ProtoError naming the field that is wrong.
    decoder: Decoder = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoder", compile_decoder(self))


def wrong_wire_type(message: Message, key: int) -> ProtoError:
    known = message.fields[key >> 3]
    wire, expected = key & 7, WIRE_TYPES[_WIRE_OF[known.kind]]
    return ProtoError(f"{message.name}.{known.attr.rstrip('_')} has wire type {WIRE_TYPES.get(wire, wire)}, not {expected}")


# -- the decoder's source, made from the table


def compile_decoder(message: Message) -> Decoder:
    """The function reading `message`'s bytes, generated from its table."""
    slots = message.struct.__struct_fields__
    if not message.name.isidentifier():  # it is written into the source, as are the attributes
        raise ValueError(f"{message.name!r} is not a message name")
    for number, spec in message.fields.items():
        if spec.attr not in slots:
            raise ValueError(f"{message.name} field {number}: {message.struct.__name__} has no {spec.attr!r}")
        if spec.repeated and spec.kind not in (STR, MSG):
            raise ValueError(f"{message.name} field {number}: only texts and messages are read as repeated")
        if (spec.kind == MSG) != (spec.message is not None):
            raise ValueError(f"{message.name} field {number}: a message field, and only one, names its message")
    namespace: dict[str, Any] = {
        "UNSET": UNSET, "ProtoError": ProtoError, "varint": varint, "skip": skip, "Struct": message.struct,
        "wrong_wire_type": wrong_wire_type, "MESSAGE": message, "KNOWN": frozenset(message.fields),
        "entry": _entry, "time_text": _time_text, "int_or_string": _int_or_string,
        "SEEN_BYTES": SEEN_BYTES, "SEEN_MESSAGES": SEEN_MESSAGES,
    }  # fmt: skip
    for number, spec in message.fields.items():
        if spec.message is not None:
            namespace[f"sub_{number}"] = spec.message.decoder
    keys = sorted(number << 3 | _WIRE_OF[spec.kind] for number, spec in message.fields.items())
    last = max((slots.index(spec.attr) for spec in message.fields.values()), default=-1)
    attrs = {spec.attr for spec in message.fields.values()}
    made = ", ".join(f"a_{name}" if name in attrs else "UNSET" for name in slots[: last + 1])
    # A message of texts and numbers only (a port, an endpoint's conditions) is mostly one of a
    # few byte strings: its values are remembered by its bytes, and each copy is a new struct.
    flat = all(spec.kind not in (MSG, MAP) and not spec.repeated for spec in message.fields.values())
    namespace["SEEN"] = {}
    recall = [
        "    short = end - pos <= SEEN_BYTES",
        "    if short:",
        "        whole = buf[pos:end]",
        "        seen = SEEN.get(whole)",
        "        if seen is not None:",
        "            return Struct(*seen)",
    ]
    remember = ["    if short and len(SEEN) < SEEN_MESSAGES:", f"        SEEN[whole] = ({made},)"]
    lines = [
        "def decode(buf, pos, end):",
        *(recall if flat else []),
        *[f"    a_{spec.attr} = UNSET" for spec in message.fields.values()],
        "    while pos < end:",
        *_varint("        ", "key", within=True),
        *_tree(message, keys, "        "),
        *(remember if flat else []),
        f"    return Struct({made})",
    ]
    exec(compile("\n".join(lines), f"<decoder of {message.name}>", "exec"), namespace)  # the table's source: see the module's doc
    decoder: Decoder = namespace["decode"]
    return decoder


def _tree(message: Message, keys: list[int], indent: str) -> list[str]:
    """Comparisons on `key` down to each listed key's reading, halving the keys at each level."""
    if len(keys) > 3:
        middle = len(keys) // 2
        return [
            f"{indent}if key < {keys[middle]}:",
            *_tree(message, keys[:middle], indent + "    "),
            f"{indent}else:",
            *_tree(message, keys[middle:], indent + "    "),
        ]
    lines: list[str] = []
    for index, key in enumerate(keys):
        lines.append(f"{indent}{'if' if index == 0 else 'elif'} key == {key}:")
        lines += _read(message, key >> 3, indent + "    ")
    lines += [f"{indent}{'else' if keys else 'if True'}:", *_other(indent + "    ")]
    return lines


def _varint(indent: str, name: str, *, within: bool = False) -> list[str]:
    """A varint into `name`, read inline up to two bytes (a field number or length under 16384);
    `within`: pos is known to be before `end`."""
    return [
        f"{indent}{name} = buf[pos]" if within else f"{indent}{name} = buf[pos] if pos < end else 128",
        f"{indent}if {name} < 128:",
        f"{indent}    pos += 1",
        f"{indent}elif pos + 1 < end and buf[pos + 1] < 128:",
        f"{indent}    {name} = {name} & 127 | buf[pos + 1] << 7",
        f"{indent}    pos += 2",
        f"{indent}else:",
        f"{indent}    {name}, pos = varint(buf, pos, end)",
    ]


def _length(indent: str, where: str) -> list[str]:
    """A length-delimited field's size and its end, `stop`, checked."""
    return [
        *_varint(indent, "size"),
        f"{indent}stop = pos + size",
        f"{indent}if stop > end:",
        f"{indent}    raise ProtoError({where})",
    ]


def _other(indent: str) -> list[str]:
    """A key no field of the table has: a listed field of another wire type is an error; any
    other field is skipped, a length-delimited one (an unread sub-message) inline."""
    return [
        f"{indent}if key >> 3 in KNOWN:",
        f"{indent}    raise wrong_wire_type(MESSAGE, key)",
        f"{indent}if key & 7 == 2 and key > 7:",
        *_length(indent + "    ", 'f"field {key >> 3} runs past the end of its message"'),
        f"{indent}    pos = stop",
        f"{indent}else:",
        f"{indent}    pos = skip(buf, pos, end, key)",
    ]


def _read(message: Message, number: int, indent: str) -> list[str]:
    spec = message.fields[number]
    local, label = f"a_{spec.attr}", f"{message.name}.{spec.attr.rstrip('_')}"
    if spec.kind in (INT, BOOL):
        lines = _varint(indent, "raw")
        if spec.kind == BOOL:
            return [*lines, f"{indent}{local} = raw != 0" if spec.keep else f"{indent}if raw:\n{indent}    {local} = True"]
        signed = "raw - 18446744073709551616 if raw >= 9223372036854775808 else raw"
        return [*lines, f"{indent}{local} = {signed}" if spec.keep else f"{indent}if raw:\n{indent}    {local} = {signed}"]
    lines = _length(indent, f'f"{label}: {{size}} bytes run past the end of the {message.name}"')
    if spec.kind == STR:
        text = 'buf[pos:stop].decode("utf-8", "replace")'  # bad UTF-8 as Go's JSON encoder writes it: U+FFFD
        if spec.repeated:
            lines += _first_or_more(indent, local, f"[{text}]", f"{local}.append({text})")
        elif spec.keep:
            lines.append(f"{indent}{local} = {text}")
        else:
            lines += [f"{indent}if size:", f"{indent}    {local} = {text}"]
        return [*lines, f"{indent}pos = stop"]
    call = {MSG: f"sub_{number}", MAP: "entry", TIME: "time_text", INTSTR: "int_or_string"}[spec.kind]
    lines += [
        f"{indent}try:",
        f"{indent}    value = {call}(buf, pos, stop)",
        f"{indent}except ProtoError as e:",
        f'{indent}    raise ProtoError(f"{label}: {{e}}") from None',
        f"{indent}pos = stop",
    ]
    if spec.repeated:
        return [*lines, *_first_or_more(indent, local, "[value]", f"{local}.append(value)")]
    if spec.kind == MAP:
        return [*lines, *_first_or_more(indent, local, "{value[0]: value[1]}", f"{local}[value[0]] = value[1]")]
    if spec.kind == TIME:
        return [*lines, f"{indent}if value is not None:", f"{indent}    {local} = value"]
    if spec.kind == MSG or spec.keep:
        return [*lines, f"{indent}{local} = value"]
    return [*lines, f"{indent}if value:", f"{indent}    {local} = value"]


def _first_or_more(indent: str, local: str, first: str, more: str) -> list[str]:
    """A repeated field's (or a map's) first value makes its list (or dict); the others are added."""
    return [f"{indent}if {local} is UNSET:", f"{indent}    {local} = {first}", f"{indent}else:", f"{indent}    {more}"]


# -- the values that are small messages of their own


def _entry(buf: bytes, pos: int, end: int) -> tuple[str, str]:
    """A map<string, string> entry (key 1, value 2): absent parts are "", as Go reads them."""
    key = value = ""
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number in (1, 2) and wire == BYTES:
            size = buf[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(buf, pos, end)
            if pos + size > end:
                raise ProtoError("a map entry's text runs past the entry")
            text = buf[pos : pos + size].decode("utf-8", "replace")
            pos += size
            if number == 1:
                key = text
            else:
                value = text
        else:
            pos = skip(buf, pos, end, tag)
    return key, value


# Go's time.Time range as metav1.Time writes it in JSON (RFC 3339, years 0000-9999).
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def _time_text(buf: bytes, pos: int, end: int) -> str | None:
    """metav1.Time (seconds 1, nanos 2) as its JSON text: RFC 3339 in seconds, UTC; None for the
    zero time, which JSON writes as null."""
    if pos == end:
        return None
    if end - pos <= SEEN_BYTES:
        return _short_time_text(buf[pos:end])
    return _read_time(buf, pos, end)


@lru_cache(maxsize=1024)
def _short_time_text(raw: bytes) -> str | None:
    """Cached by the message's bytes: the objects of a list were mostly made within the same few seconds."""
    return _read_time(raw, 0, len(raw))


def _read_time(buf: bytes, pos: int, end: int) -> str | None:
    seconds = 0
    while pos < end:
        tag, pos = varint(buf, pos, end)
        if tag == 0x08:  # seconds, a varint
            value, pos = varint(buf, pos, end)
            seconds = signed64(value)
        else:
            pos = skip(buf, pos, end, tag)
    if seconds == _MIN_SECONDS:
        return None
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise ProtoError(f"a time of {seconds} seconds is outside the years 1-9999")
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(buf: bytes, pos: int, end: int) -> int | str:
    """IntOrString (type 1: 0 int, 1 string; intVal 2; strVal 3) as JSON writes it: a number or a text."""
    is_text, value, text = 0, 0, ""
    while pos < end:
        tag, pos = varint(buf, pos, end)
        if tag in (0x08, 0x10):  # type, intVal: varints
            raw, pos = varint(buf, pos, end)
            if tag == 0x08:
                is_text = raw
            else:
                value = signed64(raw)
        elif tag == 0x1A:  # strVal: length-delimited
            size, pos = varint(buf, pos, end)
            if pos + size > end:
                raise ProtoError("IntOrString.strVal runs past its message")
            text = buf[pos : pos + size].decode("utf-8", "replace")
            pos += size
        else:
            pos = skip(buf, pos, end, tag)
    if is_text == 1:
        return text
    if not -(2**31) <= value < 2**31:
        raise ProtoError(f"IntOrString.intVal {value} is not an int32")
    return value
