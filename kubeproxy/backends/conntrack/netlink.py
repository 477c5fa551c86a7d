"""The conntrack table the reconciler reads and prunes, over ctnetlink (backends/conntrack/ctnetlink.py), as
upstream does since 1.32: no `conntrack` program.

`ConntrackTable` is what the reconciler needs: one family's UDP flows, and the deletion of some of
them. `NetlinkTable` is the kernel's (this process's namespace, or the one at `netns_path`);
`FakeConntrack` (fake.py) is the in-memory one. `table_for` picks the table where a `Runner`
runs its tools, so a proxy driving a namespace or a fake node cleans up there.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kubeproxy.backends.conntrack import ctnetlink
from kubeproxy.backends.conntrack.flows import Flow
from kubeproxy.kernel.exec import Runner
from kubeproxy.kernel.host import Capability, host_of
from kubeproxy.model.contract import SyncError
from kubeproxy.model.options import Family

UDP = 17
_AF = {Family.IPV4: socket.AF_INET, Family.IPV6: socket.AF_INET6}
# ctnetlink missing (module not there) or not allowed: the cleanup cannot run on this node at all.
_UNAVAILABLE = {errno.EPROTONOSUPPORT, errno.EPERM, errno.EACCES, errno.EAFNOSUPPORT}


class ConntrackError(SyncError):
    """The conntrack table could not be read or changed; the message says what and why."""


class ConntrackMissing(ConntrackError):
    """ctnetlink is not available here (no nf_conntrack_netlink, or no CAP_NET_ADMIN)."""


@dataclass(frozen=True)
class Deleted:
    """What a deletion did: entries removed, and a message per entry the kernel refused."""

    count: int = 0
    errors: tuple[str, ...] = ()


@runtime_checkable
class ConntrackTable(Protocol):
    def udp_flows(self, family: str) -> list[Flow]:
        """The UDP entries of `family` (Family.IPV4/IPV6). ConntrackError when unreadable."""
        ...

    def delete_flows(self, family: str, flows: Collection[Flow]) -> Deleted:
        """Delete the entries of `family` that are these flows; one already gone is not counted."""
        ...


def _af(family: str) -> int:
    try:
        return _AF[Family(family)]
    except ValueError:
        raise ValueError(f"IP family must be {Family.IPV4} or {Family.IPV6}, not {family!r}") from None


def _flow(entry: ctnetlink.CtEntry) -> Flow:
    o, r = entry.orig, entry.reply
    proto = "udp" if o.proto == UDP else str(o.proto)
    return Flow(proto, o.src, o.dst, o.sport, o.dport, r.src, r.dst, r.sport, r.dport)


@dataclass
class NetlinkTable:
    """The kernel's table, in this namespace or `netns_path`'s. One socket, opened on first use
    and kept; the lanes of a dual-stack proxy share it one call at a time."""

    netns_path: str | None = None
    _table: ctnetlink.Table | None = field(default=None, init=False)
    _listed: dict[str, dict[Flow, list[ctnetlink.CtEntry]]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _open(self) -> ctnetlink.Table:
        if self._table is None:
            try:
                self._table = ctnetlink.Table(ctnetlink.open_socket(self.netns_path))
            except ctnetlink.DumpError as exc:
                kind = ConntrackMissing if exc.errno in _UNAVAILABLE else ConntrackError
                why = exc.strerror or exc
                raise kind(f"{why} (the UDP cleanup needs ctnetlink: nf_conntrack_netlink and CAP_NET_ADMIN)") from None
        return self._table

    def _reset(self) -> None:
        # A socket that failed mid-answer may hold the rest of it: start the next call afresh.
        if self._table is not None:
            self._table.sock.close()
            self._table = None

    def udp_flows(self, family: str) -> list[Flow]:
        af = _af(family)
        with self._lock:
            table = self._open()
            try:
                entries = table.entries(af, UDP)
            except (ctnetlink.DumpError, OSError) as exc:
                self._reset()
                raise ConntrackError(f"listing the {family} UDP conntrack entries: {exc}") from None
            by_flow: dict[Flow, list[ctnetlink.CtEntry]] = {}
            for entry in entries:
                by_flow.setdefault(_flow(entry), []).append(entry)
            self._listed[family] = by_flow
            return list(by_flow)

    def delete_flows(self, family: str, flows: Collection[Flow]) -> Deleted:
        """Delete `flows`, each as the last `udp_flows(family)` listed it (its exact entries)."""
        af = _af(family)
        count = 0
        errors: list[str] = []
        with self._lock:
            listed = self._listed.get(family, {})
            for flow in flows:
                for entry in listed.get(flow, ()):
                    try:
                        count += self._open().delete(af, entry)
                    except (ctnetlink.DumpError, OSError) as exc:
                        self._reset()
                        errors.append(f"{_describe(flow)}: {exc}")
        return Deleted(count, tuple(errors))

    def close(self) -> None:
        with self._lock:
            self._reset()


def _describe(flow: Flow) -> str:
    return (f"{flow.protocol} {flow.orig_src}:{flow.orig_sport} -> {flow.orig_dst}:{flow.orig_dport} "
            f"reply from {flow.reply_src}:{flow.reply_sport}")  # fmt: skip


@runtime_checkable
class WithConntrackTable(Protocol):
    """A host that holds a conntrack table of its own (the fake node's)."""

    @property
    def conntrack(self) -> ConntrackTable: ...


def table_for(run: Runner) -> ConntrackTable:
    """The table where `run` runs its tools: a namespace's for a host that may be entered
    (host.Capability.ENTER: this host, the lab's namespaces), the fake node's, or `run` itself
    when it is a table (a `FakeConntrack`)."""
    if isinstance(run, ConntrackTable):
        return run
    host = host_of(run)
    if Capability.ENTER in host.capabilities:
        return NetlinkTable(host.netns_path)
    if isinstance(host, WithConntrackTable):
        return host.conntrack
    raise ConntrackError(f"no conntrack table where {getattr(run, '__qualname__', type(run).__name__)} runs its tools")
