"""Count conntrack tuples `ip:port -> ip` straight from a ctnetlink dump, bounded in cost.

`conntrack -L` has the kernel build a message per entry, the tool print it as text, and us parse
the text again: 0.5 s at 100k entries. Here one dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP: the only
request sent, read-only) is read in this process's network namespace and each message is not
decoded: the tuple attributes the kernel writes are found by their fixed byte layout (a proto
nest of CTA_PROTO_NUM and CTA_PROTO_SRC_PORT right after the CTA_TUPLE_IP nest) with
`bytes.find`, and counted per (source ip, destination ip, protocol, source port). Both tuples of
an entry are counted: a tuple held in either direction takes that port from the SNAT search.

The dump is bounded: after `max_entries` messages the socket is closed and the kernel stops
(it fills the next batch only when we read the last). The kernel walks its hash table in bucket
order, and the bucket of an entry is a keyed hash of its tuple, so the first entries are a
uniform random sample of the table: counts are scaled by nf_conntrack_count / entries read
(`Dump.scale`). Below the bound the counts are exact.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET = 1
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
PROTO_NUMBERS = {"tcp": 6, "udp": 17, "sctp": 132}
_HDR = struct.Struct("=IHHII")
# A tuple as the kernel writes it (ctnetlink_dump_tuples), after the CTA_TUPLE_IP nest's header:
# CTA_IP_V4_SRC (len 8, type 1) / CTA_IP_V6_SRC (len 20, type 3), the address; the _DST attribute
# (type 2 / 4); the CTA_TUPLE_PROTO nest (len 28, type 2|NLA_F_NESTED) with CTA_PROTO_NUM (len 5,
# type 1, the number, 3 bytes of zero padding) and CTA_PROTO_SRC_PORT (len 6, type 2, the port).
_SRC = {4: b"\x08\x00\x01\x00", 16: b"\x14\x00\x03\x00"}
_DST = {4: b"\x08\x00\x02\x00", 16: b"\x14\x00\x04\x00"}
_PROTO = b"\x1c\x00\x02\x80\x05\x00\x01\x00"
_PORT = b"\x00\x00\x00\x06\x00\x02\x00"
_NAMES = {v: k for k, v in PROTO_NUMBERS.items()}

Key = tuple[str, str, str, int]  # (source ip, destination ip, protocol, source port) of one tuple


class DumpError(OSError):
    """ctnetlink is unavailable (no module, not root) or the dump failed."""


@dataclass
class Dump:
    counts: Counter[Key] = field(default_factory=Counter)
    entries: int = 0  # messages read
    complete: bool = True  # False: stopped at max_entries
    total: int = 0  # nf_conntrack_count when the dump was cut short

    @property
    def scale(self) -> float:
        """What one counted tuple stands for: 1 for a whole dump, total/read for a sample."""
        return 1.0 if self.complete or not self.entries else max(1.0, self.total / self.entries)


def request(seq: int, family: int = socket.AF_UNSPEC) -> bytes:
    nfgen = struct.pack("=BBH", family, 0, 0)
    kind = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
    return _HDR.pack(_HDR.size + len(nfgen), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + nfgen


def tuple_patterns(dsts: Iterable[str], protos: Iterable[str]) -> list[re.Pattern[bytes]]:
    """Regular expressions for the tuples `* -> dst` of `protos`, one per address family, each
    with the groups (src, dst, proto, port).

    Each starts with a literal, so the regex engine skips ahead at C speed: 0.14 s for 100k
    entries against 0.57 s for a find loop over every tuple (one pattern for both families
    would lose that: 0.34 s)."""
    by_size: dict[int, list[bytes]] = {}
    for d in sorted(set(dsts)):
        packed = ipaddress.ip_address(d).packed
        by_size.setdefault(len(packed), []).append(packed)
    nums = b"".join(re.escape(bytes([PROTO_NUMBERS[p]])) for p in sorted(set(protos)))
    if not nums:
        return []
    tail = re.escape(_PROTO) + b"([" + nums + b"])" + re.escape(_PORT) + b"(..)"
    return [
        re.compile(re.escape(_SRC[size]) + b"(.{%d})" % size + re.escape(_DST[size])
                   + b"(" + b"|".join(re.escape(a) for a in addrs) + b")" + tail, re.S)
        for size, addrs in sorted(by_size.items())
    ]


def count_tuples(chunk: bytes, patterns: list[re.Pattern[bytes]], into: Counter[Key]) -> None:
    """Add the tuples `patterns` find in a batch of messages to `into`."""
    for pattern in patterns:
        found: Counter[tuple[bytes, bytes, bytes, bytes]] = Counter(pattern.findall(chunk))
        for (src, dst, num, port), n in found.items():
            name = _NAMES.get(num[0], str(num[0]))
            into[(str(ipaddress.ip_address(src)), str(ipaddress.ip_address(dst)), name, int.from_bytes(port, "big"))] += n


def dump(dsts: Iterable[str], protos: Iterable[str] = ("udp",), *, max_entries: int = 20_000, total: int = 0,
         buffer: int = 1 << 20) -> Dump:
    """One dump of this namespace's conntrack table, at most `max_entries` entries read; counts
    the tuples of `protos` to the addresses `dsts` (the node's: where masquerade maps flows).

    `total` is the table's size (nf_conntrack_count), for the scale of a cut-short dump.
    """
    out = Dump(total=total)
    patterns = tuple_patterns(dsts, protos)
    if not patterns:
        return out
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    except OSError as exc:
        raise DumpError(exc.errno, f"ctnetlink socket: {exc.strerror}") from None
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        sock.bind((0, 0))
        sock.send(request(1))
        buf = bytearray(buffer)
        while True:
            got = sock.recv_into(buf)
            chunk = bytes(buf[:got])
            off = 0
            done = False
            while off + _HDR.size <= got:
                size, kind, _flags, _seq, _pid = _HDR.unpack_from(chunk, off)
                if size < _HDR.size:
                    raise DumpError(0, "ctnetlink: malformed message")
                if kind == NLMSG_DONE:
                    done = True
                    break
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", chunk, off + _HDR.size)
                    if code:
                        raise DumpError(-code, "ctnetlink dump refused")
                    done = True
                    break
                out.entries += 1
                off += (size + 3) & ~3
            count_tuples(chunk[:off], patterns, out.counts)
            if done:
                return out
            if out.entries >= max_entries:
                out.complete = False
                return out
