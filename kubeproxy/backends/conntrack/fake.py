"""An in-memory conntrack for tests without root, shipped with the backend it fakes.

`FakeConntrack` is a `Runner` that behaves like conntrack-tools 1.4.7 on a table of `-L`
lines (UDP only, as the reconciler asks), and like `ip -j route show table local type local` on
a list of local route destinations. It answers as the real tools do where the reconciler can
tell: `-L`/`-D` see only the entries of the `-f` family; `-D` matches the tuples' addresses as
addresses, exits 1 when nothing matched and 2 (usage error) for an address of another family
than `-f`; lines may carry accounting counters (`packets= bytes=` after each tuple), flags,
`mark=`/`zone=`/`use=` or the `-o extended` family prefix. `ip -4`/`-6` list only that family's
routes. It is also the table the reconciler prunes over ctnetlink (`udp_flows`, `delete_flows`: see
netlink.py), on the same lines. tests/backends/conntrack/test_fake_vs_kernel.py runs the same
scenarios on this and on the kernel's conntrack table in namespaces (fed the kernel's own lines),
through the program and through ctnetlink, which keeps it honest.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.conntrack.flows import Flow, parse_flows
from kubeproxy.backends.conntrack.netlink import Deleted
from kubeproxy.model.options import Family

# One direction of an entry, as libnetfilter_conntrack prints it (the original tuple first).
_TUPLE = re.compile(r"(?:^|\s)src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)(?=\s|$)")
_FAMILIES = {"ipv4": 4, "ipv6": 6}
_TOOL = "conntrack v1.4.7 (conntrack-tools)"


@dataclass
class FakeConntrack:
    """conntrack -L/-D on `table` (lines as `conntrack -L` prints them); `local`: local route destinations."""

    table: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    dumps: list[str] = field(default_factory=list)  # the family of each table listing over ctnetlink

    def __call__(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "ip":
            local_routes = ["route", "show", "table", "local", "type", "local"]
            if argv[1] != "-j" or argv[2] not in ("-4", "-6") or argv[3:] != local_routes:
                return subprocess.CompletedProcess(argv, 2, "", f"fake ip: unsupported {argv}")
            version = 6 if argv[2] == "-6" else 4
            mine = [dst for dst in self.local if ipaddress.ip_network(dst, strict=False).version == version]
            routes = [{"type": "local", "dst": dst, "dev": "eth0", "protocol": "kernel"} for dst in mine]
            return subprocess.CompletedProcess(argv, 0, json.dumps(routes), "")
        opts = dict(zip(argv[2::2], argv[3::2], strict=False))
        family = _FAMILIES.get(opts.get("-f", ""))
        if argv[0] != "conntrack" or opts.get("-p") != "udp" or family is None:
            return subprocess.CompletedProcess(argv, 2, "", f"fake conntrack: unsupported {argv}")
        entries = [(line, tuples) for line in self.table if (tuples := _entry(line, family)) is not None]
        if argv[1] == "-L":
            shown = "".join(f"{line}\n" for line, _ in entries)
            return self._done(argv, 0, shown, f"{len(entries)} flow entries have been shown.")
        if argv[1] != "-D":
            return subprocess.CompletedProcess(argv, 2, "", f"fake conntrack: unsupported {argv[1]}")
        wanted = {k: v for k, v in opts.items() if k in _SELECTORS}
        for key in ("--orig-dst", "--reply-src"):
            if key in wanted and ipaddress.ip_address(wanted[key]).version != family:
                usage = f"{_TOOL}: mismatched address family\nTry `conntrack -h' or 'conntrack --help' for more information.\n"
                return subprocess.CompletedProcess(argv, 2, "", usage)
        gone = [line for line, tuples in entries if _selects(wanted, tuples)]
        self.table = [line for line in self.table if line not in gone]
        out = "".join(f"{line}\n" for line in gone)
        return self._done(argv, 0 if gone else 1, out, f"{len(gone)} flow entries have been deleted.")

    # The table over ctnetlink (netlink.ConntrackTable), on the same lines.

    def udp_flows(self, family: str) -> list[Flow]:
        version = _family_version(family)
        self.dumps.append(family)
        return list(dict.fromkeys(flow for line in self.table if _entry(line, version) is not None
                                  for flow in parse_flows([line])))  # fmt: skip

    def delete_flows(self, family: str, flows: Collection[Flow]) -> Deleted:
        version = _family_version(family)
        wanted = set(flows)
        gone = [line for line in self.table if _entry(line, version) is not None and set(parse_flows([line])) & wanted]
        self.table = [line for line in self.table if line not in gone]
        return Deleted(len(gone))

    @staticmethod
    def _done(argv: list[str], rc: int, out: str, summary: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, rc, out, f"{_TOOL}: {summary}\n")


# `-D` option -> (tuple: 0 original, 1 reply; field: 0 src, 1 dst, 2 sport, 3 dport)
_SELECTORS = {"--orig-dst": (0, 1), "--orig-port-dst": (0, 3), "--reply-src": (1, 0), "--reply-port-src": (1, 2)}


def _family_version(family: str) -> int:
    if family not in (Family.IPV4, Family.IPV6):
        raise ValueError(f"IP family must be {Family.IPV4} or {Family.IPV6}, not {family!r}")
    return 6 if family == Family.IPV6 else 4


def _entry(line: str, family: int) -> list[tuple[str, ...]] | None:
    """The two tuples of a UDP entry of `family`; None for any other line."""
    start = line.find("src=")
    if start < 0 or "udp" not in line[:start].split():
        return None
    tuples = _TUPLE.findall(line)
    if len(tuples) != 2 or ipaddress.ip_address(tuples[0][0]).version != family:
        return None
    return tuples


def _selects(wanted: dict[str, str], tuples: list[tuple[str, ...]]) -> bool:
    for option, value in wanted.items():
        direction, index = _SELECTORS[option]
        got = tuples[direction][index]
        # conntrack compares addresses as addresses (fd00::0:1 selects fd00::1) and ports as numbers
        same = ipaddress.ip_address(got) == ipaddress.ip_address(value) if index < 2 else int(got) == int(value)
        if not same:
            return False
    return True
