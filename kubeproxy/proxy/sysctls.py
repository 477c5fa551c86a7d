"""The node set-up upstream's kube-proxy does before its first sync: conntrack sysctls, OOM score.

Conntrack, as upstream's conntrack configurer (cmd/kube-proxy/app/conntrack.go and
server_linux.go's setupConntrack):

- nf_conntrack_max = maxPerCore × CPUs, at least `min` (maxPerCore 0: left alone); when the
  hash table is smaller than max/4, /sys/module/nf_conntrack/parameters/hashsize = max/4;
- nf_conntrack_tcp_timeout_established / _close_wait from the TCP timeouts (0: left alone);
- nf_conntrack_tcp_be_liberal = 1 when tcpBeLiberal;
- nf_conntrack_udp_timeout / _udp_timeout_stream from the UDP timeouts (0: left alone);
- a value already in place is not written again.

The timeouts and be_liberal are per network namespace; nf_conntrack_max and the hash size are
the kernel's, writable only from the initial namespace (a container or `ip netns` sees them
read-only). Upstream tolerates exactly that case for the maximum (its "/sys is read-only:
cannot modify conntrack limits" event) and fails for the others; so do we, with a warning
naming the sysctl instead of the event. When /proc/sys itself is mounted read-only (an
unprivileged container) nothing can be set: every setting that would change is named in one
warning and skipped.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.model.proxy_config import ConntrackConfig
from kubeproxy.runtime.logs import STARTUP_LOGGER, kv

log = logging.getLogger(STARTUP_LOGGER)

NETFILTER = "net/netfilter"
HASHSIZE = Path("/sys/module/nf_conntrack/parameters/hashsize")


class SysctlError(RuntimeError):
    """A conntrack sysctl could not be set (fatal at start-up, as upstream); names the sysctl."""


@dataclass
class ConntrackReport:
    set: dict[str, int] = field(default_factory=dict)  # sysctl → value written
    unchanged: dict[str, int] = field(default_factory=dict)  # already at the wanted value
    warnings: list[str] = field(default_factory=list)


def conntrack_max(ct: ConntrackConfig, cpus: int) -> int:
    """Upstream's getConntrackMax: maxPerCore × CPUs, at least min; 0 means leave it alone."""
    if not ct.max_per_core or ct.max_per_core <= 0:
        return 0
    scaled = ct.max_per_core * cpus
    floor = ct.min or 0
    return scaled if scaled > floor else floor


def wanted_sysctls(ct: ConntrackConfig, cpus: int) -> list[tuple[str, int]]:
    """(sysctl under net/netfilter, value) in upstream's order, only those that are to be set."""
    out: list[tuple[str, int]] = []
    if maximum := conntrack_max(ct, cpus):
        out.append(("nf_conntrack_max", maximum))
    if ct.tcp_established_timeout:
        out.append(("nf_conntrack_tcp_timeout_established", int(ct.tcp_established_timeout)))
    if ct.tcp_close_wait_timeout:
        out.append(("nf_conntrack_tcp_timeout_close_wait", int(ct.tcp_close_wait_timeout)))
    if ct.tcp_be_liberal:
        out.append(("nf_conntrack_tcp_be_liberal", 1))
    if ct.udp_timeout:
        out.append(("nf_conntrack_udp_timeout", int(ct.udp_timeout)))
    if ct.udp_stream_timeout:
        out.append(("nf_conntrack_udp_timeout_stream", int(ct.udp_stream_timeout)))
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def configure_conntrack(
    ct: ConntrackConfig,
    *,
    proc_sys: Path = Path("/proc/sys"),
    hashsize: Path = HASHSIZE,
    cpus: int | None = None,
    on_change: Callable[[str, int], None] | None = None,
) -> ConntrackReport:
    """Set the conntrack sysctls `ct` asks for; SysctlError when a per-namespace one cannot be set."""
    cpus = cpus or os.cpu_count() or 1
    report = ConntrackReport()
    base = proc_sys / NETFILTER
    wanted = wanted_sysctls(ct, cpus)
    pending = [(name, value) for name, value in wanted if _read_int(base / name) != value]
    report.unchanged = {name: value for name, value in wanted if (name, value) not in pending}
    if pending and _read_only_mount(base):
        names = ", ".join(f"{name}={value}" for name, value in pending)
        report.warnings.append(f"/proc/sys is read-only (a container without the host's /proc/sys?): conntrack "
                               f"settings not applied: {names}")
        return report
    for name, value in pending:
        path = base / name
        log.info(kv("Set sysctl", entry=f"{NETFILTER}/{name}", value=value))
        try:
            path.write_text(str(value))
        except OSError as exc:
            if name == "nf_conntrack_max" and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                report.warnings.append(
                    f"{NETFILTER}/nf_conntrack_max: cannot set it to {value} ({exc.strerror}): it is the kernel's "
                    f"and writable only from the host's network namespace; it stays {_read_int(path)}: "
                    "problems may arise later (upstream: \"cannot modify conntrack limits\")"
                )
                continue
            raise SysctlError(f"{NETFILTER}/{name}: cannot set it to {value}: {exc.strerror}") from None
        report.set[name] = value
        if on_change:
            on_change(name, value)
        if name == "nf_conntrack_max":
            _grow_hash_table(value, hashsize, report)
    return report


def _grow_hash_table(maximum: int, hashsize: Path, report: ConntrackReport) -> None:
    current = _read_int(hashsize)
    if current is None or current >= maximum // 4:
        return
    if _read_only_mount(hashsize.parent):
        report.warnings.append("/sys is read-only: cannot modify conntrack limits, problems may arise later "
                               f"(conntrack hashsize stays {current}, wanted {maximum // 4})")
        return
    log.info(kv("Setting conntrack hashsize", conntrackHashsize=maximum // 4))
    try:
        hashsize.write_text(str(maximum // 4))
    except OSError as exc:
        report.warnings.append(f"conntrack hashsize: cannot set it to {maximum // 4}: {exc.strerror}")


def apply_oom_score_adj(value: int | None, path: Path = Path("/proc/self/oom_score_adj")) -> str | None:
    """Upstream's oomAdjuster for its own process; a failure is only a warning (as upstream)."""
    if value is None:
        return None
    try:
        path.write_text(str(value))
    except OSError as exc:
        return f"oomScoreAdj: cannot set it to {value}: {exc.strerror}"
    return None
