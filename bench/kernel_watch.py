#!/usr/bin/env python3
"""Watch the current network namespace's kernel for Service rules as they are committed.

Usage (inside the namespace): python3 bench/kernel_watch.py nftables|iptables-legacy

Prints one line per event, `<CLOCK_MONOTONIC seconds> <what>`, flushed at once:
- nftables (also iptables-nft): every element added to a set named `service-ips`
  (`elem <ip> <proto> <port>`) and every chain added (`chain <name>`), read from the nf_tables
  netlink multicast group as the transaction commits (what `nft monitor` listens to, without
  formatting the whole transaction first, which at 10k Services delays the line awaited by the
  time it takes to print the objects before it);
- iptables-legacy: every `KUBE-SVC-` chain name new in the nat table (`chain <name>`): the table's
  (entries, size) read every 2 ms with IPT_SO_GET_INFO, an O(1) getsockopt without the xtables
  lock; when they change, the table's blob (IPT_SO_GET_ENTRIES, one copy from the kernel) is
  searched for chain names. The time is that of the poll that saw the change.

`ready` once listening; `lost <error>` if the kernel dropped events (the socket's buffer overran).
Read by bench/vs_upstream.py, which awaits the lines it needs.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import re
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFNLGRP_NFTABLES = 7
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWCHAIN = 3
NFT_MSG_NEWSETELEM = 12
NFTA_CHAIN_NAME = 3
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY = 1
NFTA_DATA_VALUE = 1
NLA_TYPE_MASK = 0x3FFF
PROTOCOLS = {6: "tcp", 17: "udp", 132: "sctp"}

IPT_SO_GET_INFO = 64
IPT_SO_GET_ENTRIES = 65
GETINFO = struct.Struct("32sI5I5III")  # struct ipt_getinfo
ENTRIES_HEADER = 40  # struct ipt_get_entries: name[32], size, then 8-aligned entries
SERVICE_CHAIN = re.compile(rb"KUBE-SVC-[A-Z2-7]{16}")


def emit(what: str) -> None:
    print(f"{time.monotonic():.6f} {what}", flush=True)


def attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each netlink attribute in `data`."""
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, at)
        if length < 4:
            return
        yield kind & NLA_TYPE_MASK, data[at + 4 : at + length]
        at += (length + 3) & ~3


def element_keys(payload: bytes) -> Iterator[bytes]:
    for kind, value in attributes(payload):
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS:
            continue
        for item_kind, item in attributes(value):
            if item_kind != NFTA_LIST_ELEM:
                continue
            for field, nested in attributes(item):
                if field == NFTA_SET_ELEM_KEY:
                    yield from (data for data_kind, data in attributes(nested) if data_kind == NFTA_DATA_VALUE)


def describe_key(key: bytes) -> str | None:
    """`ip proto port` of a `ipv4_addr . inet_proto . inet_service` key (each field 4-byte padded)."""
    if len(key) != 12:
        return None
    port = struct.unpack_from(">H", key, 8)[0]
    return f"{ipaddress.IPv4Address(key[:4])} {PROTOCOLS.get(key[4], key[4])} {port}"


def watch_nftables() -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 28)  # a 10k-Service transaction at once
    sock.bind((0, 0))
    sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTABLES)
    emit("ready")
    while True:
        try:
            datagram = sock.recv(1 << 20)
        except OSError as e:
            if e.errno == errno.ENOBUFS:
                emit(f"lost {e.strerror}")
                continue
            raise
        at = 0
        while at + 16 <= len(datagram):
            length, kind = struct.unpack_from("IH", datagram, at)
            if length < 16:
                break
            if kind >> 8 == NFNL_SUBSYS_NFTABLES:
                payload = datagram[at + 20 : at + length]  # after nlmsghdr (16) and nfgenmsg (4)
                message = kind & 0xFF
                if message == NFT_MSG_NEWSETELEM:
                    named = dict(attributes(payload)).get(NFTA_SET_ELEM_LIST_SET, b"")
                    if named.rstrip(b"\0") == b"service-ips":
                        for key in element_keys(payload):
                            described = describe_key(key)
                            if described:
                                emit(f"elem {described}")
                elif message == NFT_MSG_NEWCHAIN:
                    name = dict(attributes(payload)).get(NFTA_CHAIN_NAME, b"")
                    emit(f"chain {name.rstrip(bytes(1)).decode(errors='replace')}")
            at += (length + 3) & ~3


def watch_iptables_legacy() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)

    def getsockopt(option: int, buffer: ctypes.Array[ctypes.c_char]) -> int:
        length = ctypes.c_uint(len(buffer))
        if libc.getsockopt(sock.fileno(), socket.IPPROTO_IP, option, buffer, ctypes.byref(length)) != 0:
            return ctypes.get_errno()
        return 0

    seen: set[bytes] = set()
    last: tuple[int, int] | None = None
    emit("ready")
    while True:
        info = ctypes.create_string_buffer(GETINFO.pack(b"nat", 0, *[0] * 10, 0, 0), GETINFO.size)
        if getsockopt(IPT_SO_GET_INFO, info) == 0:
            fields = GETINFO.unpack(info.raw)
            entries, size = fields[-2], fields[-1]
            if (entries, size) != last:
                when = time.monotonic()
                blob = ctypes.create_string_buffer(struct.pack("32sI", b"nat", size), ENTRIES_HEADER + size)
                if getsockopt(IPT_SO_GET_ENTRIES, blob) == 0:  # EAGAIN: replaced meanwhile, read again
                    last = (entries, size)
                    for name in set(SERVICE_CHAIN.findall(blob.raw)) - seen:
                        seen.add(name)
                        print(f"{when:.6f} chain {name.decode()}", flush=True)
                    continue
        time.sleep(0.002)  # polling the kernel: legacy x_tables send no events


def main() -> None:
    if sys.argv[1:] == ["iptables-legacy"]:
        watch_iptables_legacy()
    elif sys.argv[1:] in (["nftables"], ["iptables-nft"]):
        watch_nftables()
    else:
        sys.exit("usage: kernel_watch.py nftables|iptables-nft|iptables-legacy")


if __name__ == "__main__":
    main()
