"""The ctnetlink table (backends/conntrack/ctnetlink.py): messages as the kernel writes them, decoded; the
kernel's own dump filter; deletion of exactly one entry by its tuple, zone and id.

The kernel part inserts its entries with the conntrack program (`-I`), an independent way in,
and reads what is left with it: UDP in zone 0 and the same tuple in zone 7, a TCP entry on the
same addresses and ports, and an IPv6 UDP entry, with a long timeout so none can expire.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from kubeproxy.backends.conntrack import ctnetlink, parse_flows
from kubeproxy.lab.netns import NetNS, netns


def _nla(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _tuple(src: str, dst: str, proto: int, sport: int, dport: int) -> bytes:
    six = ":" in src
    ip = _nla(3 if six else 1, socket.inet_pton(socket.AF_INET6 if six else socket.AF_INET, src))
    ip += _nla(4 if six else 2, socket.inet_pton(socket.AF_INET6 if six else socket.AF_INET, dst))
    l4 = _nla(1, bytes([proto])) + _nla(2, sport.to_bytes(2, "big")) + _nla(3, dport.to_bytes(2, "big"))
    return _nla(1 | 0x8000, ip) + _nla(2 | 0x8000, l4)


def _message(*attrs: bytes) -> bytes:
    body = struct.pack("=BBH", socket.AF_INET, 0, 0) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (1 << 8) | 0, 0x2, 1, 0) + body


def test_an_entry_is_decoded_and_keyed_by_its_tuple_zone_and_id() -> None:
    orig = _nla(1 | 0x8000, _tuple("10.0.0.1", "10.96.0.10", 17, 40001, 53))
    reply = _nla(2 | 0x8000, _tuple("10.244.1.1", "10.0.0.1", 17, 5300, 40001))
    status, ident, zone = _nla(3, b"\0\0\0\x08"), _nla(12, b"\x12\x34\x56\x78"), _nla(18, b"\x00\x07")
    entry = ctnetlink.decode_entry(_message(orig, reply, status, ident, zone))
    assert entry is not None
    assert entry.orig == ctnetlink.CtTuple(17, "10.0.0.1", "10.96.0.10", 40001, 53)
    assert entry.reply == ctnetlink.CtTuple(17, "10.244.1.1", "10.0.0.1", 5300, 40001)
    assert entry.key == orig + ident + zone  # no reply tuple, no status: only what selects the entry
    assert ctnetlink.decode_entry(_message(orig, status)) is None  # half an entry is not one


def test_malformed_attributes_are_an_error_not_a_loop() -> None:
    with pytest.raises(ctnetlink.DumpError, match="malformed"):
        ctnetlink.decode_entry(_message(struct.pack("=HH", 2, 1)))
    with pytest.raises(ctnetlink.DumpError, match="malformed"):
        ctnetlink.decode_entry(_message(struct.pack("=HH", 400, 1) + b"\0" * 8))


def test_the_dump_filter_keeps_one_protocol() -> None:
    flt = ctnetlink.proto_filter(17)
    attrs = {kind: payload for kind, payload, _ in ctnetlink._attrs(flt)}
    assert set(attrs) == {ctnetlink.CTA_TUPLE_ORIG, ctnetlink.CTA_FILTER}
    flags = {kind: struct.unpack("=I", p)[0] for kind, p, _ in ctnetlink._attrs(attrs[ctnetlink.CTA_FILTER])}
    assert flags == {ctnetlink.CTA_FILTER_ORIG_FLAGS: ctnetlink.CTA_FILTER_FLAG_PROTO_NUM, ctnetlink.CTA_FILTER_REPLY_FLAGS: 0}


def test_an_entry_without_its_tuple_is_never_sent() -> None:
    """A delete request without a tuple would flush the table."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        table = ctnetlink.Table(sock)
        bare = ctnetlink.CtEntry(ctnetlink.CtTuple(17, "10.0.0.1", "10.0.0.2", 1, 2),
                                 ctnetlink.CtTuple(17, "10.0.0.2", "10.0.0.1", 2, 1), _nla(12, b"\0\0\0\1"))  # fmt: skip
        with pytest.raises(ctnetlink.DumpError, match="cannot be deleted"):
            table.delete(socket.AF_INET, bare)


# ------------------------------------------------------------------ the kernel

ENTRIES = (
    ["-p", "udp", "-s", "10.0.0.1", "-d", "10.0.0.2", "--sport", "1000", "--dport", "53"],
    ["-p", "udp", "-s", "10.0.0.1", "-d", "10.0.0.2", "--sport", "1000", "--dport", "53", "--zone", "7"],
    ["-p", "tcp", "-s", "10.0.0.1", "-d", "10.0.0.2", "--sport", "1000", "--dport", "53", "--state", "ESTABLISHED"],
    ["-p", "udp", "-s", "fd00::1", "-d", "fd00::2", "--sport", "1000", "--dport", "53"],
)


@pytest.fixture
def table_ns() -> Iterator[NetNS]:
    with netns("kpctn") as ns:
        for entry in ENTRIES:
            ns.run(["conntrack", "-I", *entry, "-t", "3600"])
        yield ns


def _left(ns: NetNS) -> list[str]:
    return sorted(line for line in ns.run(["conntrack", "-L"]).stdout.splitlines() if line.strip())


@pytest.mark.root
def test_the_kernel_filters_the_dump_and_deletes_one_entry(table_ns: NetNS) -> None:
    with ctnetlink.open_socket(table_ns.netns_path) as sock:
        table = ctnetlink.Table(sock)
        # The kernel's filter, not ours: the unfiltered dump has the TCP entry, the filtered one not.
        everything, _ = table._dump(socket.AF_INET, None)
        udp, _ = table._dump(socket.AF_INET, 17)
        assert sorted(e.orig.proto for e in everything) == [6, 17, 17]
        assert [e.orig.proto for e in udp] == [17, 17]
        assert table.entries(socket.AF_INET, 17) == udp
        six = table.entries(socket.AF_INET6, 17)
        assert [(e.orig.src, e.reply.src) for e in six] == [("fd00::1", "fd00::2")]
        # Same tuple, two zones: the one whose key carries the zone goes, the other stays.
        zoned = next(e for e in udp if struct.pack("=HH", 6, ctnetlink.CTA_ZONE) in e.key)
        assert table.delete(socket.AF_INET, zoned) is True
        left = _left(table_ns)
        assert len(left) == 3 and not any("zone=7" in line for line in left)
        assert table.delete(socket.AF_INET, zoned) is False  # gone already: ENOENT, not an error
        assert table.delete(socket.AF_INET6, six[0]) is True
    flows = parse_flows(_left(table_ns))
    assert sorted((f.protocol, f.orig_src) for f in flows) == [("tcp", "10.0.0.1"), ("udp", "10.0.0.1")]
