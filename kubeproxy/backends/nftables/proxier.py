"""The nftables backend of the live proxy: render (incrementally) and let the applier diff.

One sync: render the view (only the changed services when the tracker says so, reusing the
previous rendering), hand it to the `NftApplier`, which sends only the difference from what it
applied last (nothing at all when nothing changed). A sync is a full one when the last full one
was over FULL_SYNC_PERIOD ago, as upstream. Between syncs the live loop asks `rules_intact` every
syncPeriod: a table someone flushed or deleted brings a full sync, as a vanished canary does in
iptables mode (upstream's nftables mode has no such check: its table comes back at the next
change, or within the hour).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeproxy.backends.nftables.apply import ApplyResult, NftApplier
from kubeproxy.backends.nftables.localhost import LocalhostNodePorts
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.kernel.libnft import for_runner
from kubeproxy.model.contract import FULL_SYNC_PERIOD
from kubeproxy.model.metrics import FamilyMetrics
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family, NodeOptions

log = logging.getLogger("kubeproxy.nftables")


@dataclass(frozen=True)
class NftSyncReport:
    full: bool
    rendering: NftRendering
    result: ApplyResult
    render_seconds: float

    @property
    def no_local_endpoints_internal(self) -> int:
        return self.rendering.no_local_endpoints_internal

    @property
    def no_local_endpoints_external(self) -> int:
        return self.rendering.no_local_endpoints_external

    @property
    def rule_counts(self) -> dict[str, int]:
        return {}  # upstream's nftables mode exposes no rule-count metric

    @property
    def written_rule_counts(self) -> dict[str, int]:
        return {}


@dataclass
class NftablesProxier:
    """One IP family's `kube-proxy` table; `sync` is called by the runner only."""

    family: Family = Family.IPV4
    run: Runner = local_run
    clock: Callable[[], float] = time.monotonic
    nfacct_counters: tuple[str, ...] = field(default=(), init=False)  # nftables has its own counters
    # Send transactions through libnftables in-process where `run` says which namespace
    # (kernel/libnft.py); False: always the `nft` process.
    in_process: bool = True
    _applier: NftApplier | None = field(default=None, init=False)
    _previous: NftRendering | None = field(default=None, init=False)
    _last_full_sync: float = field(default=float("-inf"), init=False)
    _warned: frozenset[str] = field(default=frozenset(), init=False)
    # KubeProxyNFTablesLocalhostNodePorts: on when the last sync's options turned it on, and
    # the loopback listeners while nodePortAddresses names loopback (localhost.py).
    localhost_nodeports: bool = field(default=False, init=False)
    localhost: LocalhostNodePorts | None = field(default=None, init=False)

    def prepare(self) -> None:
        """Nothing to set up before the first sync: the table carries its own base chains."""

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None:
        log.error('"nftables sync failed" err="%s"', exc)
        metrics.nftables_sync_failures_total.inc()

    def _current_applier(self) -> NftApplier:
        if self._applier is None or self._applier.family != self.family.nft:
            lib = for_runner(self.run) if self.in_process else None
            self._applier, self._previous = NftApplier(self.family.nft, self.run, lib=lib), None
        return self._applier

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> NftSyncReport:
        applier = self._current_applier()
        now = self.clock()
        if now - self._last_full_sync > FULL_SYNC_PERIOD:
            changed_services = None
        full = changed_services is None
        started = time.perf_counter()
        rendering = render(view, opts, previous=self._previous, changed_services=changed_services)
        rendered = time.perf_counter() - started
        new_warnings = set(rendering.warnings) - self._warned
        for warning in sorted(new_warnings):
            log.warning("%s", warning)
        self._warned = frozenset(rendering.warnings)
        try:
            result = applier.apply(rendering, full=full)
        finally:
            # The rendering is right whatever the kernel said; the applier knows what it holds.
            self._previous = rendering
        if full or result.mode == "full":
            self._last_full_sync = now
        self._sync_localhost(view, opts)
        return NftSyncReport(full or result.mode == "full", rendering, result, rendered)

    def _sync_localhost(self, view: NodeView, opts: NodeOptions) -> None:
        self.localhost_nodeports = bool(opts.localhost_nodeport_rejects) or opts.localhost_nodeport_proxy
        if opts.localhost_nodeport_proxy:
            if self.localhost is None or self.localhost.family != self.family:
                if self.localhost is not None:
                    self.localhost.stop()
                self.localhost = LocalhostNodePorts(self.family)
            self.localhost.sync(view, opts)
        elif self.localhost is not None:
            self.localhost.stop()
            self.localhost = None

    def rejected_localhost_packets(self) -> dict[str, int]:
        """Packets of each named counter of our table (`nft -j list counters`); {} without a table."""
        proc = self.run(["nft", "-j", "list", "counters", "table", self.family.nft, "kube-proxy"], check=False, timeout=2)
        if proc.returncode != 0:
            return {}
        try:
            items = json.loads(proc.stdout).get("nftables", [])
        except (ValueError, AttributeError):
            return {}
        out: dict[str, int] = {}
        for item in items:
            counter = item.get("counter") if isinstance(item, dict) else None
            if isinstance(counter, dict) and isinstance(counter.get("name"), str) and isinstance(counter.get("packets"), int):
                out[counter["name"]] = counter["packets"]
        return out

    def check(self, view: NodeView, opts: NodeOptions) -> str | None:
        """What nft says of a full sync to `view`, checked (`nft -c`) but not applied; None if it takes it."""
        return self._current_applier().check(render(view, opts))

    def rules_intact(self) -> bool:
        """False once the table the last sync wrote is gone or flushed; True before any sync."""
        return self._applier is None or self._applier.table_intact()  # the monitor logs a False

    def cleanup(self) -> list[str]:
        """Delete our tables (both families), and nothing else."""
        removed = []
        for family in ("ip", "ip6"):
            if NftApplier(family, self.run).cleanup():
                removed.append(f"nftables table {family} kube-proxy")
        return removed
