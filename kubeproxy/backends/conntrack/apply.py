"""The reconciler: list the UDP entries of one family, delete the stale ones, over ctnetlink
(netlink.py). It reads the kernel's local addresses with `ip route`, to know where NodePorts are.

`list_flows` and `delete` drive the `conntrack` program instead, for an operator's look at the
same selection (`Filter.argv`); the proxy does not run it.

Every function takes a `run` callable (argv, input=, check=, timeout=) so that the same code
drives the host or a test namespace (`NetNS.run`).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.conntrack.flows import Flow, parse_flows
from kubeproxy.backends.conntrack.netlink import ConntrackError, ConntrackMissing, ConntrackTable, table_for
from kubeproxy.backends.conntrack.stale import ALL_LOCAL_NODE_PORTS, UDP, Filter, NodePortDestinations, NodePorts, stale
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family

log = logging.getLogger("kubeproxy.conntrack")

_DELETED = re.compile(r"(\d+) flow entries have been deleted")
# `ip netns exec` reports a missing program on stderr instead of raising FileNotFoundError.
_NOT_FOUND = re.compile(r'exec of ".*" failed: No such file or directory')


def _call(run: Runner, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        proc = run(list(argv), check=False, timeout=timeout)
    except FileNotFoundError:
        raise ConntrackMissing(f"{argv[0]}: not found (install conntrack-tools)") from None
    except subprocess.TimeoutExpired:
        raise ConntrackError(f"{' '.join(argv)}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise ConntrackError(f"{' '.join(argv)}: {exc}") from None
    if proc.returncode != 0 and _NOT_FOUND.search(proc.stderr):
        raise ConntrackMissing(f"{argv[0]}: not found (install conntrack-tools)")
    return proc


def _family_flag(family: str) -> str:
    if family not in (Family.IPV4, Family.IPV6):
        raise ValueError(f"IP family must be {Family.IPV4} or {Family.IPV6}, not {family!r}")
    return "ipv6" if family == Family.IPV6 else "ipv4"


def list_flows(family: str, run: Runner = local_run, *, binary: str = "conntrack", timeout: float = 60) -> list[Flow]:
    """The UDP conntrack entries of one family."""
    argv = [binary, "-L", "-p", "udp", "-f", _family_flag(family)]
    proc = _call(run, argv, timeout)
    if proc.returncode != 0:
        raise ConntrackError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return parse_flows(proc.stdout)


def delete(flt: Filter, family: str, run: Runner = local_run, *, binary: str = "conntrack", timeout: float = 60) -> int:
    """Delete the entries `flt` selects; returns how many went. None matching is not an error
    (conntrack exits 1 then)."""
    _family_flag(family)
    argv = [binary, "-D", *flt.argv(family)]
    proc = _call(run, argv, timeout)
    counted = _DELETED.search(proc.stderr)
    if proc.returncode == 0:
        # conntrack prints each deleted entry on stdout and the total on stderr.
        return int(counted.group(1)) if counted else len(parse_flows(proc.stdout))
    if proc.returncode == 1 and counted and counted.group(1) == "0":
        return 0
    raise ConntrackError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def local_routes(family: str, run: Runner = local_run, *, binary: str = "ip", timeout: float = 10) -> list[str]:
    """The destinations of the kernel's local routes of type local (what `addrtype LOCAL` and
    `fib daddr type local` match): each local address, and prefixes such as 127.0.0.0/8."""
    argv = [binary, "-j", "-6" if _family_flag(family) == "ipv6" else "-4", "route", "show", "table", "local", "type", "local"]
    try:
        proc = run(argv, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConntrackError(f"{' '.join(argv)}: {exc}") from None
    if proc.returncode != 0:
        raise ConntrackError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    try:
        routes = json.loads(proc.stdout or "[]")
    except ValueError as exc:
        raise ConntrackError(f"{' '.join(argv)}: unreadable output: {exc}") from None
    if not isinstance(routes, list):
        raise ConntrackError(f"{' '.join(argv)}: unreadable output: not a list")
    return [str(r["dst"]) for r in routes if isinstance(r, dict) and isinstance(r.get("dst"), str)]


def node_port_destinations(
    view: NodeView, family: str, node_ports: NodePorts, run: Runner = local_run, *, ip_binary: str = "ip"
) -> NodePortDestinations:
    """Where this node's NodePorts are, for the reconciler. The kernel is asked for its local
    addresses only when NodePorts match all of them and a UDP service has a NodePort. If it
    cannot say, no NodePort flow is touched (logged): better a stale flow than a foreign one gone."""
    if not node_ports.all_local:
        return node_ports.resolve()
    if not any(info.node_port and info.protocol == UDP for info in view.services.values()):
        return NodePortDestinations()
    try:
        return node_ports.resolve(local_routes(family, run, binary=ip_binary))
    except ConntrackError as exc:
        log.error("Cannot list the node's local addresses; NodePort conntrack entries are left alone: %s", exc)
        return NodePortDestinations()


def clean_stale_entries(
    view: NodeView,
    family: str,
    run: Runner = local_run,
    *,
    node_ports: NodePorts = ALL_LOCAL_NODE_PORTS,
    table: ConntrackTable | None = None,
    ip_binary: str = "ip",
) -> int:
    """Delete every stale UDP entry of `family` (see `stale`) from the conntrack table where
    `run` runs its tools (`table_for`), or from `table`; returns the number deleted.
    `node_ports` says where NodePorts are (`NodePorts.of`): only flows to those
    addresses are NodePort flows.

    Raises ConntrackError (ConntrackMissing without ctnetlink) when the table cannot be listed;
    an entry the kernel refuses to delete is logged and the others still go, as upstream does.
    """
    started = time.perf_counter()
    log.debug("Started to reconcile conntrack entries ipFamily=%s", family)
    table = table if table is not None else table_for(run)
    flows = table.udp_flows(family)
    destinations = node_port_destinations(view, family, node_ports, run, ip_binary=ip_binary)
    gone = stale(flows, view, destinations)
    result = table.delete_flows(family, gone)
    for problem in result.errors:
        log.debug("Failed to delete a conntrack entry ipFamily=%s err=%s", family, problem)
    took = time.perf_counter() - started
    if result.errors:
        log.error(
            "Failed to clear all conntrack entries ipFamily=%s entriesDeleted=%d failed=%d took=%.3fs err=%s",
            family, result.count, len(result.errors), took, result.errors[0],
        )  # fmt: skip
    else:
        log.debug("Finished reconciling conntrack entries ipFamily=%s entries=%d entriesDeleted=%d took=%.3fs",
                  family, len(flows), result.count, took)  # fmt: skip
    return result.count


def reconcile(
    view: NodeView,
    family: str,
    run: Runner = local_run,
    *,
    node_ports: NodePorts = ALL_LOCAL_NODE_PORTS,
) -> int:
    """`clean_stale_entries` that never raises: failures are logged and count as 0 deleted.

    A one-shot: missing ctnetlink is logged on every call. A long-running proxy holds a
    `Reconciler`, which says it once.
    """
    return Reconciler(run).reconcile(view, family, node_ports)


@dataclass
class Reconciler:
    """`reconcile` for the live proxy: errors are logged, never raised, and missing ctnetlink is
    reported once (a node without it still proxies; only the UDP cleanup is lost). The table
    (`table_for(run)`, a ctnetlink socket for the kernel) is opened once and kept."""

    run: Runner = local_run
    table: ConntrackTable | None = None
    _missing_reported: bool = field(default=False, init=False)

    def reconcile(self, view: NodeView, family: str, node_ports: NodePorts = ALL_LOCAL_NODE_PORTS) -> int:
        try:
            if self.table is None:
                self.table = table_for(self.run)
            deleted = clean_stale_entries(view, family, self.run, node_ports=node_ports, table=self.table)
        except ConntrackMissing as exc:
            if not self._missing_reported:
                log.warning("Cannot clean up stale UDP conntrack entries: %s", exc)
                self._missing_reported = True
            return 0
        except ConntrackError as exc:
            log.error("Failed to list conntrack entries ipFamily=%s err=%s", family, exc)
            return 0
        self._missing_reported = False  # available since: say so again if it goes away
        return deleted
