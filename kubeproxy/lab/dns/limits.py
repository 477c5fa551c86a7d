"""Sender-side resources: open files and ephemeral ports, which a socket per query consumes."""

from __future__ import annotations

import resource
from pathlib import Path


def ensure_open_files(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `needed` (at most to the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """How many ports the kernel hands out to unbound sockets (per local address)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 28232  # the kernel default, 32768-60999
    return high - low + 1
