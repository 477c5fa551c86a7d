"""DNS messages on the wire, just enough for the lab (RFC 1035 section 4).

A query is built once (`make_query`) and only its 2-byte ID changes per packet, so the senders
do no encoding in their hot loop. `response_rcode` decides whether a datagram answers a query:
same ID, the QR bit set, and the same question (names compared case-insensitively, because
resolvers may randomise letter case). `answer` is the responder's side: one A record for names in
a zone.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

QTYPES: dict[str, int] = {
    "A": 1,
    "NS": 2,
    "CNAME": 5,
    "SOA": 6,
    "PTR": 12,
    "MX": 15,
    "TXT": 16,
    "AAAA": 28,
    "SRV": 33,
    "HTTPS": 65,
    "ANY": 255,
}
RCODES: dict[int, str] = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
CLASS_IN = 1
HEADER_LEN = 12

_QR = 0x8000
_AA = 0x0400
_RD = 0x0100


class WireError(ValueError):
    """A name, type or message that cannot be put on (or read off) the wire."""


def rcode_name(rcode: int) -> str:
    return RCODES.get(rcode, f"RCODE{rcode}")


def parse_qtype(text: str) -> int:
    """A record type by mnemonic (`A`, `aaaa`), as `TYPE65`, or as a number."""
    upper = text.strip().upper()
    if upper in QTYPES:
        return QTYPES[upper]
    digits = upper.removeprefix("TYPE")
    if digits.isdigit() and 0 < int(digits) < 65536:
        return int(digits)
    raise WireError(f"unknown record type {text!r} (use one of {', '.join(QTYPES)} or TYPE<n>)")


def qtype_name(qtype: int) -> str:
    for name, value in QTYPES.items():
        if value == qtype:
            return name
    return f"TYPE{qtype}"


def encode_name(name: str) -> bytes:
    """`www.example.com` or `www.example.com.` in label form; ASCII only (no IDNA)."""
    text = name.strip()
    if text in ("", "."):
        return b"\x00"
    if not text.isascii():
        raise WireError(f"name {name!r}: only ASCII names are supported")
    labels = text.removesuffix(".").split(".")
    out = bytearray()
    for label in labels:
        if not label:
            raise WireError(f"name {name!r} has an empty label")
        if len(label) > 63:
            raise WireError(f"name {name!r}: label {label[:20]!r}... is longer than 63 bytes")
        out.append(len(label))
        out += label.encode()
    out.append(0)
    if len(out) > 255:
        raise WireError(f"name {name!r} is longer than 255 bytes")
    return bytes(out)


def decode_name(data: bytes, offset: int) -> tuple[str, int]:
    """The (uncompressed) name at offset, and the offset just past it. Queries never compress."""
    labels: list[str] = []
    pos = offset
    while True:
        if pos >= len(data):
            raise WireError("name runs past the end of the message")
        length = data[pos]
        if length == 0:
            return ".".join(labels) + ".", pos + 1
        if length & 0xC0:
            raise WireError("compressed name in a question")
        labels.append(data[pos + 1 : pos + 1 + length].decode("ascii", "replace"))
        pos += 1 + length


@dataclass(frozen=True)
class Query:
    """One question, encoded once. `packet(qid)` is the whole datagram for a given ID."""

    name: str
    qtype: int
    question: bytes  # the question section: name, type, class
    tail: bytes  # everything after the ID: header flags and counts, then the question

    def packet(self, qid: int) -> bytes:
        return qid.to_bytes(2, "big") + self.tail

    def describe(self) -> str:
        return f"{self.name} {qtype_name(self.qtype)}"


def make_query(name: str, qtype: int | str = "A", *, recursion_desired: bool = True) -> Query:
    code = parse_qtype(qtype) if isinstance(qtype, str) else qtype
    wire_name = encode_name(name)
    question = wire_name + struct.pack("!HH", code, CLASS_IN)
    flags = _RD if recursion_desired else 0
    tail = struct.pack("!HHHHH", flags, 1, 0, 0, 0) + question
    shown = name.strip() if name.strip().endswith(".") else name.strip() + "."
    return Query(name=shown, qtype=code, question=question, tail=tail)


def response_rcode(data: bytes, qid: bytes, question: bytes) -> int | None:
    """The RCODE if `data` is a response to the query with this ID and question, else None."""
    end = HEADER_LEN + len(question)
    if len(data) < end or data[:2] != qid or not data[2] & 0x80:
        return None
    if data[4:6] != b"\x00\x01":
        return None
    got = data[HEADER_LEN:end]
    if got != question and (got[:-4].lower() != question[:-4].lower() or got[-4:] != question[-4:]):
        return None
    return data[3] & 0x0F


@dataclass(frozen=True)
class Zone:
    """What the lab responder serves: every name under `origin` has one A record, `address`."""

    origin: str = "lab.test."
    address: str = "192.0.2.53"
    ttl: int = 300

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.address)
        encode_name(self.origin)

    def contains(self, name: str) -> bool:
        origin = self.origin.lower().removesuffix(".") + "."
        fqdn = name.lower()
        return origin == "." or fqdn == origin or fqdn.endswith("." + origin)


def answer(query: bytes, zone: Zone) -> bytes | None:
    """The response to a query datagram, or None for what a server ignores (responses, garbage).

    Names in the zone: NOERROR with one A record for type A, no records (NODATA) for other types.
    Names outside: REFUSED, as an authoritative-only server answers. Additional records (EDNS OPT)
    in the query are not echoed.
    """
    if len(query) < HEADER_LEN + 5:
        return None
    qid, flags, qdcount = struct.unpack_from("!HHH", query)
    if flags & _QR or qdcount != 1:
        return None
    try:
        name, end = decode_name(query, HEADER_LEN)
    except WireError:
        return None
    if end + 4 > len(query):
        return None
    question = query[HEADER_LEN : end + 4]
    (qtype,) = struct.unpack_from("!H", query, end)
    opcode_rd = flags & 0x7900
    records = b""
    if not zone.contains(name):
        out_flags, ancount = _QR | opcode_rd | 5, 0
    elif qtype == QTYPES["A"]:
        out_flags, ancount = _QR | _AA | opcode_rd, 1
        records = struct.pack("!HHHIH", 0xC00C, QTYPES["A"], CLASS_IN, zone.ttl, 4) + ipaddress.IPv4Address(zone.address).packed
    else:
        out_flags, ancount = _QR | _AA | opcode_rd, 0
    return struct.pack("!HHHHHH", qid, out_flags, 1, ancount, 0, 0) + question + records
