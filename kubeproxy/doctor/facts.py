"""What doctor knows about the node besides its rules: sysctls, conntrack counters and entries.

Offline these come from flags (`--sysctl NAME=VALUE`, `--stat NAME=VALUE`); `live` reads them
from /proc and `conntrack` (read-only). Missing facts fall back to the kernel's defaults and the
report says which were assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeproxy.backends.conntrack.flows import Flow

# The kernel's defaults (net/netfilter/nf_conntrack_proto_udp.c, _tcp.c; ip_local_port_range).
DEFAULT_SYSCTLS: dict[str, int | tuple[int, int]] = {
    "net.netfilter.nf_conntrack_udp_timeout": 30,
    "net.netfilter.nf_conntrack_udp_timeout_stream": 120,
    "net.netfilter.nf_conntrack_tcp_timeout_time_wait": 120,
    "net.ipv4.ip_local_port_range": (32768, 60999),
}
UDP_TIMEOUT = "net.netfilter.nf_conntrack_udp_timeout"
TCP_TIME_WAIT = "net.netfilter.nf_conntrack_tcp_timeout_time_wait"
PORT_RANGE = "net.ipv4.ip_local_port_range"
CT_MAX = "net.netfilter.nf_conntrack_max"
CT_COUNT = "net.netfilter.nf_conntrack_count"
# Counters of `conntrack -S` (summed over CPUs) that say the table refused or evicted flows.
STAT_NAMES = ("insert_failed", "drop", "early_drop", "error", "search_restart")


class FactError(ValueError):
    pass


@dataclass
class NodeFacts:
    sysctls: dict[str, int | tuple[int, int]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    # conntrack entries (None: not read, so current use is unknown).
    flows: list[Flow] | None = None
    node_ips: set[str] = field(default_factory=set)
    zone: str = ""
    assumed: list[str] = field(default_factory=list)

    def sysctl(self, name: str) -> int | tuple[int, int] | None:
        if name in self.sysctls:
            return self.sysctls[name]
        if name in DEFAULT_SYSCTLS:
            if name not in self.assumed:
                self.assumed.append(name)
            return DEFAULT_SYSCTLS[name]
        return None

    def int_sysctl(self, name: str) -> int | None:
        v = self.sysctl(name)
        return v if isinstance(v, int) else None


def parse_sysctl_value(name: str, value: str) -> int | tuple[int, int]:
    parts = value.split()
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise FactError(f"sysctl {name}={value!r}: not a number") from None
    if len(nums) == 1:
        return nums[0]
    if len(nums) == 2:
        return (nums[0], nums[1])
    raise FactError(f"sysctl {name}={value!r}: expected one number or two")


def sysctls_from_flags(specs: list[str] | tuple[str, ...]) -> dict[str, int | tuple[int, int]]:
    """`net.netfilter.nf_conntrack_udp_timeout=30`, `net.ipv4.ip_local_port_range=32768 60999`;
    slashes are accepted as in /proc/sys paths."""
    out: dict[str, int | tuple[int, int]] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        if not eq or not name:
            raise FactError(f"--sysctl {spec!r}: expected NAME=VALUE")
        name = name.strip().replace("/", ".")
        out[name] = parse_sysctl_value(name, value.replace(",", " ").replace("-", " "))
    return out


def stats_from_flags(specs: list[str] | tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise FactError(f"--stat {spec!r}: expected NAME=INTEGER") from None
        if not eq:
            raise FactError(f"--stat {spec!r}: expected NAME=INTEGER")
    return out


def parse_conntrack_stats(text: str) -> dict[str, int]:
    """`conntrack -S`: one line per CPU (`cpu=0 found=0 invalid=3 insert_failed=0 drop=0 ...`), summed."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        for tok in line.split():
            key, eq, value = tok.partition("=")
            if eq and key != "cpu" and value.isdigit():
                out[key] = out.get(key, 0) + int(value)
    return out
