"""The live proxy (`kubeproxy run`): sources → cluster state → change tracker → runner → backend.

One asyncio loop runs everything: a source (the API reflectors or the manifest-file watcher)
delivers events to `on_event`, which updates the cluster state, notes what changed and asks the
bounded-frequency runner for a sync; the runner calls `sync` at most every minSyncPeriod and at
least every syncPeriod. A sync builds this node's view, takes the changes since the last one and
hands both to the backend in a worker thread (rendering 10k services takes most of a second and
must not stall the watches and the health servers), then clears stale UDP conntrack entries and
updates health, the per-service health-check servers and the metrics.

Failure handling, as upstream:
- the first sync waits until the source has delivered its initial state, so that a restart
  never programs a half-empty rule set;
- a failed restore is logged and counted, and the next sync (retried after minSyncPeriod, not
  after a whole syncPeriod) is a full one;
- unlike upstream, a refusal is narrowed down to the Services that cause it (checked with
  `nft -c` / `iptables-restore --test`, so the kernel keeps its rules meanwhile); they are
  quarantined with their last accepted rules (proxy/quarantine.py, the metric
  kubeproxy_sync_proxy_rules_quarantined_services, `quarantinedServices` in /healthz) and
  every other Service is programmed in the same sync;
- while the source cannot reach the API server the rules already programmed stay, periodic
  syncs keep them in place, and /healthz turns unhealthy once the outage is older than the
  health timeout (2 × syncPeriod): the node's rules may no longer match the cluster;
- SIGTERM stops the loop and leaves the rules in the kernel, so traffic keeps flowing while a
  new proxy starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kubeproxy.backends import conntrack, registry
from kubeproxy.backends.base import Backend, SyncError, SyncReport
from kubeproxy.backends.exec import Runner, local_run
from kubeproxy.backends.iptables.apply import nfacct_packets
from kubeproxy.backends.iptables.options import iptables_options
from kubeproxy.backends.iptables.render import IptablesOptions
from kubeproxy.cluster.state import ClusterState
from kubeproxy.proxy.changes import Changes, ChangeTracker
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers, serve_healthz, serve_metrics
from kubeproxy.proxy.metrics import ProxyMetrics
from kubeproxy.proxy.model import IPV6, NodeView, ServiceKey
from kubeproxy.proxy.programming import TriggerTimes, latencies, slice_key, trigger_time
from kubeproxy.proxy.quarantine import Held, Quarantine, isolate, substitute
from kubeproxy.proxy.runner import BoundedFrequencyRunner
from kubeproxy.proxy.view import ViewBuilder
from kubeproxy.render import primary_family
from kubeproxy.sources.events import WatchEvent

log = logging.getLogger("kubeproxy.proxy")

TCP_BE_LIBERAL = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")


class Source(Protocol):
    async def run(self) -> None: ...

    async def wait_synced(self) -> None: ...

    @property
    def connected(self) -> bool: ...


def kv(message: str, **fields: object) -> str:
    """A log line in klog's structured form: `"Message" key="value" ...`, as upstream writes them
    (numbers and booleans bare, as Go prints them; the parts kept for --logging-format=json)."""
    from kubeproxy.proxy.logs import kv as structured

    return structured(message, **fields)


@dataclass
class LiveProxy:
    """The proxy for one node. `serve(source)` runs it until cancelled."""

    cfg: ProxyConfig
    node_name: str
    run_cmd: Runner = local_run
    iptables_variant: str = ""  # "legacy" / "nft": which iptables to drive; "" the system's
    wall_clock: Callable[[], float] = time.time
    state: ClusterState = field(default_factory=ClusterState)
    metrics: ProxyMetrics = field(init=False)
    source: Source | None = None
    tracker: ChangeTracker = field(init=False)
    health: ProxyHealth = field(init=False)
    service_health: ServiceHealthServers = field(init=False)
    runner: BoundedFrequencyRunner = field(init=False)
    conntrack_cleaner: conntrack.Reconciler = field(init=False)
    view_builder: ViewBuilder = field(default_factory=ViewBuilder, init=False)
    backend: Backend = field(init=False)
    _initialized: bool = field(default=False, init=False)
    _family: str = field(default="IPv4", init=False)
    _triggers: TriggerTimes = field(init=False)  # for the network-programming metric
    quarantine: Quarantine = field(default_factory=Quarantine, init=False)
    _last_good: NodeView | None = field(default=None, init=False)  # the view the kernel last accepted
    _pending_services: int = field(default=0, init=False)
    _pending_endpoints: int = field(default=0, init=False)
    syncs: int = field(default=0, init=False)  # successful syncs
    failed_syncs: int = field(default=0, init=False)
    last_report: SyncReport | None = field(default=None, init=False)
    last_changes: Changes | None = field(default=None, init=False)
    servers: dict[str, asyncio.AbstractServer] = field(default_factory=dict, init=False)  # proxy.http.HttpServer
    _progress: asyncio.Condition | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.metrics = ProxyMetrics(self.cfg.mode, nfacct=self._nfacct_packets)
        self.tracker = ChangeTracker(self.node_name)
        self._triggers = TriggerTimes(start=self.wall_clock())
        self.conntrack_cleaner = conntrack.Reconciler(run=self.run_cmd)
        self.health = ProxyHealth(2 * self.cfg.sync_period, clock=self.wall_clock)
        self.service_health = ServiceHealthServers(self.health, node_name=self.node_name)
        self.runner = BoundedFrequencyRunner(
            self.sync,
            min_interval=self.cfg.min_sync_period,
            max_interval=self.cfg.sync_period,
            # Only an unexpected exception gets here; restore failures schedule their own retry.
            retry_interval=self.cfg.sync_period,
            name=f"{self.cfg.mode}-sync",
        )
        self.backend = registry.create(
            self.cfg.mode, run=self.run_cmd, sync_period=self.cfg.sync_period, variant=self.iptables_variant,
            cfg=self.cfg,
        )

    # -- events

    def on_event(self, event: WatchEvent) -> None:
        slice_at = slice_key(event.obj) if event.kind == "EndpointSlice" else None
        slice_before = self.state.slices.get(slice_at) if slice_at else None
        warning = self.tracker.apply(self.state, event.obj, deleted=event.type == "DELETED")
        if warning:
            log.warning("%s: %s", event, warning)
            return
        ref = f"{event.namespace}/{event.name}" if event.namespace else event.name
        if event.kind == "Service":
            self._pending_services += 1
            self.metrics.service_changes_total.inc()
            verb = {"ADDED": "Adding new service", "MODIFIED": "Updating existing service", "DELETED": "Removing service"}
            log.info(kv(verb[event.type], service=ref))
        elif event.kind == "EndpointSlice":
            self._pending_endpoints += 1
            self.metrics.endpoint_changes_total.inc()
            slice_after = self.state.slices.get(slice_at) if slice_at else None
            self._triggers.slice_event(slice_before, slice_after, trigger_time(event.obj))
            count = sum(len(ep.addresses) for ep in slice_after.endpoints) if slice_after is not None else 0
            log.info(kv("Setting endpoints" if event.type != "DELETED" else "Removing endpoints", slice=ref, addresses=count))
        elif event.kind == "Node":
            # Manifests carry every Node; only this one's changes matter (labels, deletion).
            ours = event.name == self.node_name
            (log.info if ours else log.debug)(kv("Node changed", node=ref, event=event.type, thisNode=ours))
            if ours:
                node = self.state.nodes.get(self.node_name)
                if event.type == "DELETED" or node is None:
                    self.health.sync_node(deleting=True)
                else:
                    self.health.sync_node(deleting=node.deleting, taints=node.taints)
        self.metrics.service_changes_pending.set(self._pending_services)
        self.metrics.endpoint_changes_pending.set(self._pending_endpoints)
        self.health.queued_update(self._family)
        self.metrics.last_queued_timestamp.set(self.wall_clock())
        if self._initialized:
            self.runner.run()

    # -- sync

    def _view(self) -> tuple[NodeView, IptablesOptions]:
        node = self.state.nodes.get(self.node_name)
        family = primary_family(self.cfg, node)
        opts = iptables_options(
            self.cfg,
            family=family,
            hostname=self.node_name,
            node=node,
            nfacct_counters=self.backend.nfacct_counters,
            conntrack_tcp_liberal=_tcp_liberal(),
        )
        self.backend.ipv6 = family == IPV6
        self.metrics.ip_family = family
        self._family = family
        self.service_health.set_bind_ips(_health_check_ips(opts))
        # Only the services touched since the last sync are recomputed (2.8 s → ms at 10k).
        view = self.view_builder.update(self.state, self.tracker.pending(), family=family, node_name=opts.node_name)
        return view, opts

    async def sync(self) -> None:
        """One sync, called by the runner only."""
        if not self._initialized:
            log.debug("not syncing: the source has not delivered its initial state yet")
            return
        started = time.perf_counter()
        view, opts = self._view()
        changes = self.tracker.take(view)
        self.last_changes = changes
        triggers = self._triggers.take()
        self._pending_services = self._pending_endpoints = 0
        log.info(kv(f"Syncing {self.cfg.mode} rules", full=changes.full, services=len(changes.services)))
        for key in self.quarantine.release(changes.services):
            log.info(kv("Quarantined service changed, trying it again", service=f"{key[0]}/{key[1]}"))
        self._show_quarantine()
        try:
            report, view = await asyncio.to_thread(self._apply, view, opts, changes)
        except (SyncError, OSError) as exc:
            # What the failed sync consumed is lost: the retry rewrites everything.
            self.tracker.request_full_sync()
            self._count_failure(exc, changes)
            self.runner.retry_after(self.cfg.min_sync_period)
            self.failed_syncs += 1
            self._show_quarantine()
            await self._finished()
            return
        elapsed = time.perf_counter() - started
        self._record(report, elapsed, triggers)
        # NodePort conntrack cleanup touches only flows to where this sync's rules accept NodePorts.
        await self._after_sync(view, changes, conntrack.NodePorts.of(opts, self.cfg.mode))
        log.info(kv("SyncProxyRules complete", elapsed=f"{elapsed * 1000:.1f}ms", full=report.full))
        await self._finished()

    def _apply(self, view: NodeView, opts: IptablesOptions, changes: Changes) -> tuple[SyncReport, NodeView]:
        """Program `view`; if the kernel refuses it, quarantine the Services it refuses and program the rest.

        Runs in the worker thread. Returns the report and the view actually programmed (held
        Services as the kernel last accepted them). Raises the kernel's error when no Service
        is to blame (the check fails even with every candidate set aside).
        """
        programmed = self.quarantine.apply(view)
        try:
            return self.backend.sync(programmed, opts, changes.changed_services), self._accepted(programmed)
        except SyncError as exc:
            refused = exc
        # A failed partial sync names its suspects; after a failed full sync every Service is one.
        suspects = sorted(view.by_service if changes.full else changes.services)
        suspects = [key for key in suspects if key not in self.quarantine]
        last_good = self._last_good
        log.warning(kv("Rules refused, looking for the services that cause it", suspects=len(suspects), err=refused))

        def passes(aside: frozenset[ServiceKey]) -> bool:
            trial = substitute(programmed, {key: Held.of(key, "", last_good) for key in aside})
            return self.backend.check(trial, opts) is None

        culprits = isolate(suspects, passes)
        if not culprits:
            raise refused  # counted by the caller, as any failed sync
        self._count_failure(refused, changes)
        reason = str(refused).strip()
        for key in culprits:
            self.quarantine.hold(key, reason, last_good)
            log.warning(
                kv(
                    "Service quarantined: the kernel refuses its rules; it keeps its last accepted rules until it changes",
                    service=f"{key[0]}/{key[1]}",
                    err=reason,
                )
            )
        self._show_quarantine()
        programmed = self.quarantine.apply(view)
        return self.backend.sync(programmed, opts, None), self._accepted(programmed)

    def _accepted(self, view: NodeView) -> NodeView:
        self._last_good = view
        return view

    def _show_quarantine(self) -> None:
        self.metrics.quarantined_services.set(len(self.quarantine))
        self.health.quarantined = tuple(self.quarantine.names())

    def _count_failure(self, exc: Exception, changes: Changes) -> None:
        self.backend.record_failure(self.metrics, exc, partial=not changes.full)

    async def wait_for_syncs(self, count: int) -> None:
        """Until `count` syncs (successful or failed) have finished: for tests and benchmarks."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.syncs + self.failed_syncs >= count)

    def _condition(self) -> asyncio.Condition:
        if self._progress is None:
            self._progress = asyncio.Condition()
        return self._progress

    async def _finished(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()

    def _record(self, report: SyncReport, elapsed: float, triggers: dict[ServiceKey, list[float]]) -> None:
        self.syncs += 1
        self.last_report = report
        m = self.metrics
        m.sync_duration.observe(elapsed)
        (m.sync_full_duration if report.full else m.sync_partial_duration).observe(elapsed)
        now = self.wall_clock()
        m.last_timestamp.set(now)
        m.service_changes_pending.set(0)
        m.endpoint_changes_pending.set(0)
        for table, count in report.rule_counts.items():
            m.iptables_total.labels(table=table).set(count)
        m.no_local_endpoints_total.labels(traffic_policy="internal").set(report.no_local_endpoints_internal)
        m.no_local_endpoints_total.labels(traffic_policy="external").set(report.no_local_endpoints_external)
        for latency in latencies(triggers, now):
            m.network_programming_duration.observe(latency)
        source = self.source
        if source is None or source.connected:
            self.health.updated(self._family)
        else:
            # The rules are in place but may be stale: leave the queued update pending, so
            # /healthz fails once the outage outlasts the health timeout.
            self.health.queued_update(self._family)

    async def _after_sync(self, view: NodeView, changes: Changes, node_ports: conntrack.NodePorts) -> None:
        ports = {}
        local: dict[tuple[str, str], int] = {}
        for name, info in view.services.items():
            if info.health_check_node_port:
                ports[name.service] = info.health_check_node_port
                local[name.service] = sum(1 for ep in view.endpoints.get(name, []) if ep.is_local and ep.ready)
        await self.service_health.sync_services(ports)
        self.service_health.sync_endpoints(local)
        if conntrack.cleanup_required(changes):
            started = time.perf_counter()
            deleted = await asyncio.to_thread(self.conntrack_cleaner.reconcile, view, self._family, node_ports)
            self.metrics.conntrack_reconciler_sync_duration.observe(time.perf_counter() - started)
            self.metrics.conntrack_reconciler_deleted_entries_total.inc(deleted)
            if deleted:
                log.info(kv("Deleted stale UDP conntrack entries", count=deleted))

    # -- running

    def prepare(self) -> None:
        """Kernel set-up before the first sync (the backend's: canary chains, nfacct counters, ...)."""
        self.backend.prepare()

    def _nfacct_packets(self, name: str) -> int | None:
        return nfacct_packets(name, self.run_cmd) if name in self.backend.nfacct_counters else None

    async def serve(self, source: Source) -> None:
        """Run until cancelled: source, runner, health and metrics servers."""
        self.source = source
        self.prepare()
        # As upstream: a proxy that never manages a first sync must not look healthy forever.
        self.health.updated(self._family)
        # One connection budget (sized from RLIMIT_NOFILE) for every HTTP server of this proxy.
        budget, errors = self.service_health.budget, self.service_health.errors
        starters: list[tuple[str, str, Callable[[str], Awaitable[asyncio.AbstractServer]]]] = [
            ("healthz", self.cfg.healthz_bind_address,
             lambda b: serve_healthz(self.health, self.metrics, b, budget=budget, errors=errors)),
            ("metrics", self.cfg.metrics_bind_address,
             lambda b: serve_metrics(self.metrics, b, self.cfg.mode, budget=budget, errors=errors)),
        ]  # fmt: skip
        for what, bind, start in starters:
            if not bind:  # an empty address disables the server, as upstream
                continue
            try:
                self.servers[what] = await start(bind)
            except OSError as exc:
                # Upstream keeps proxying without the server; so do we, loudly.
                log.error(kv("Failed to start server", address=bind, err=exc))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(source.run(), name="source")
                group.create_task(self.runner.loop(), name="sync-runner")
                await source.wait_synced()
                self._initialized = True
                log.info(kv("Initial state received, syncing"))
                self.runner.run()
        finally:
            for server in self.servers.values():
                server.close()
            await self.service_health.close()


def _tcp_liberal() -> bool:
    try:
        return TCP_BE_LIBERAL.read_text().strip() == "1"
    except OSError:
        return False


async def run_until_signalled(proxy: LiveProxy, source: Source) -> None:
    """Serve until SIGTERM or SIGINT; the rules stay in the kernel (upstream does the same)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await proxy.serve(source)
    log.info(kv("Exiting, leaving the rules in place"))


def _health_check_ips(opts: IptablesOptions) -> tuple[str, ...]:
    """Where health-check node ports listen, as upstream: on the node's addresses that
    --nodeport-addresses selects, or on every address of the family when it selects all."""
    if opts.nodeport_match_all:
        return ("::",) if opts.family == IPV6 else ("0.0.0.0",)
    return opts.nodeport_ips
