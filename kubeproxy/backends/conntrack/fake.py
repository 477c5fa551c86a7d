"""An in-memory conntrack for tests without root, shipped with the backend it fakes.

`FakeConntrack` is a `Runner` that behaves like conntrack-tools 1.4.7 on a table of `-L`
lines (UDP only, as the reconciler asks), and like `ip -j route show table local type local` on
a list of local route destinations. tests/backends/conntrack/test_kernel.py runs the reconciler against
a real conntrack table, which keeps it honest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class FakeConntrack:
    """conntrack -L/-D on `table` (lines as `conntrack -L` prints them); `local`: local route destinations."""

    table: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "ip":
            local_routes = ["route", "show", "table", "local", "type", "local"]
            if argv[1] != "-j" or argv[2] not in ("-4", "-6") or argv[3:] != local_routes:
                return subprocess.CompletedProcess(argv, 2, "", f"fake ip: unsupported {argv}")
            routes = [{"type": "local", "dst": dst, "dev": "eth0", "protocol": "kernel"} for dst in self.local]
            return subprocess.CompletedProcess(argv, 0, json.dumps(routes), "")
        opts = dict(zip(argv[2::2], argv[3::2], strict=False))
        if argv[0] != "conntrack" or opts.get("-p") != "udp" or opts.get("-f") not in ("ipv4", "ipv6"):
            return subprocess.CompletedProcess(argv, 2, "", f"fake conntrack: unsupported {argv}")
        udp = [line for line in self.table if line.startswith("udp ")]
        if argv[1] == "-L":
            return self._done(argv, 0, "".join(f"{line}\n" for line in udp), f"{len(udp)} flow entries have been shown.")
        if argv[1] != "-D":
            return subprocess.CompletedProcess(argv, 2, "", f"fake conntrack: unsupported {argv[1]}")
        gone = [line for line in udp if self._selects(opts, line.split())]
        self.table = [line for line in self.table if line not in gone]
        out = "".join(f"{line}\n" for line in gone)
        return self._done(argv, 0 if gone else 1, out, f"{len(gone)} flow entries have been deleted.")

    @staticmethod
    def _selects(opts: dict[str, str], tokens: list[str]) -> bool:
        fields = [t for t in tokens if "=" in t]
        orig = dict(f.split("=") for f in fields[:4])
        reply = dict(f.split("=") for f in fields[4:8])
        wanted = {
            "--orig-dst": orig["dst"],
            "--orig-port-dst": orig["dport"],
            "--reply-src": reply["src"],
            "--reply-port-src": reply["sport"],
        }
        return all(opts[k] == v for k, v in wanted.items() if k in opts)

    @staticmethod
    def _done(argv: list[str], rc: int, out: str, summary: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, rc, out, f"conntrack v1.4.7 (conntrack-tools): {summary}\n")
