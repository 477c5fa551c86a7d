"""Conntrack entries as `conntrack -L` prints them, parsed into typed flows.

    udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=40000 dport=53 [UNREPLIED] src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40000

The first src/dst/sport/dport group is the original direction, the second the reply direction
(where a DNATed flow really goes). Everything else on the line (state, timeout, [UNREPLIED] /
[ASSURED] flags, packets=/bytes= counters, mark=, zone=, use=, id=, delta-time=, the `ipv4 2`
prefix of `-o extended`) is ignored. A line that does not parse is skipped with a debug log:
one odd entry must not stop the cleanup of all the others.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

log = logging.getLogger("kubeproxy.conntrack")

# libnetfilter_conntrack prints each tuple's four fields together, in this order.
_TUPLE = re.compile(r"(?:^|\s)src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)(?=\s|$)")
# Layer-4 protocols whose tuples carry ports; other protocols (icmp, gre, ...) are not ours.
_PORTED = frozenset({"udp", "tcp", "sctp", "udplite", "dccp"})


@dataclass(frozen=True, slots=True)
class Flow:
    """One conntrack entry: the original tuple and the reply tuple. Addresses are normalised
    (`str(ipaddress.ip_address(...))`) so they compare equal to the node model's."""

    protocol: str  # "udp", "tcp", ...
    orig_src: str
    orig_dst: str
    orig_sport: int
    orig_dport: int
    reply_src: str
    reply_dst: str
    reply_sport: int
    reply_dport: int


class _Unparsable(ValueError):
    pass


def parse_flows(lines: str | Iterable[str]) -> list[Flow]:
    """Every flow in `conntrack -L` output (text or lines); unparsable lines are skipped."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    return list(_iter_flows(lines))


def _iter_flows(lines: Iterable[str]) -> Iterator[Flow]:
    # Service and endpoint addresses repeat on most lines: normalise each distinct text once.
    seen: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield _parse_line(line, seen)
        except _Unparsable as exc:
            log.debug("skipping conntrack line %d (%s): %r", number, exc, line)


def _parse_line(line: str, seen: dict[str, str]) -> Flow:
    tuples = _TUPLE.findall(line)
    if len(tuples) != 2 or line.count("src=") != 2:
        raise _Unparsable("expected an original and a reply tuple with src, dst, sport and dport")
    head = line[: line.find("src=")].split()
    protocol = next((token for token in head if token in _PORTED), "")
    if not protocol:
        raise _Unparsable("no port-carrying protocol")
    (osrc, odst, osport, odport), (rsrc, rdst, rsport, rdport) = tuples
    return Flow(
        protocol,
        _address(osrc, seen),
        _address(odst, seen),
        _port(osport),
        _port(odport),
        _address(rsrc, seen),
        _address(rdst, seen),
        _port(rsport),
        _port(rdport),
    )


def _address(text: str, seen: dict[str, str]) -> str:
    normal = seen.get(text)
    if normal is None:
        try:
            normal = str(ipaddress.ip_address(text))
        except ValueError:
            raise _Unparsable(f"bad address {text!r}") from None
        seen[text] = normal
    return normal


def _port(text: str) -> int:
    port = int(text)  # the pattern admits digits only
    if port > 65535:
        raise _Unparsable(f"bad port {text!r}")
    return port
