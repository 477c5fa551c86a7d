"""The live proxy (`kubeproxy run`): sources → cluster state → change tracker → runner → backend.

One asyncio loop runs everything: a source (the API reflectors or the manifest-file watcher)
delivers events to `on_events` (a list at once) or `on_event`, which update the cluster state,
note what changed and ask the bounded-frequency runner for a sync; the runner calls `sync` at
most every minSyncPeriod and at least every syncPeriod. A sync builds this node's view, takes
the changes since the last one and hands both to the backend in a worker thread (a full render
of 10k services takes a quarter of a second and must not stall the watches and the health
servers), then clears stale UDP conntrack entries and updates health, the per-service
health-check servers and the metrics.

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
- while the source cannot reach the API server (or knows its data is stale) the rules already
  programmed stay and periodic syncs keep them in place; health stays upstream's (freshness
  against queued updates: an outage queues none), and the outage shows in the log, a metric and
  the /healthz body instead (proxy/source_watch.py);
- SIGTERM stops the loop and leaves the rules in the kernel, so traffic keeps flowing while a
  new proxy starts.

Garbage collection (`manage_gc`, set by `run_until_signalled`: the proxy owns its process): the
cold start makes a million long-lived objects (20k parsed objects, the view, the render caches)
and no garbage worth collecting, so the cyclic collector is paused until the first sync is over
(as `cluster.bulk` does for one decode), and then `gc.freeze()` moves everything alive to the
permanent generation: a later collection walks only what changed since, not the million objects
again (a full collection at 10k services took 0.2-0.5 s, paid by whichever change was waiting).
The price: a reference cycle that was already garbage at that moment (a few asyncio and HTTP
objects of the start-up) is frozen with the rest and never freed, once; collecting first would
cost the full walk this avoids. Objects frozen and dropped later are freed by reference counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from kubeproxy.backends import conntrack, registry
from kubeproxy.backends.base import Backend, SyncError, SyncReport
from kubeproxy.backends.exec import Runner, local_run
from kubeproxy.backends.iptables.apply import nfacct_packets
from kubeproxy.cluster.state import ClusterState
from kubeproxy.proxy.changes import Changes, ChangeTracker
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.family_lanes import PROC_IPV6, FamilyLane, kernel_lacks, live_families
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers, serve_healthz, serve_metrics
from kubeproxy.proxy.http import Handler
from kubeproxy.proxy.interfaces import interface_addresses
from kubeproxy.proxy.memory import release_free_memory
from kubeproxy.proxy.metrics import ProxyMetrics
from kubeproxy.proxy.node_model import NodeView, ServiceKey
from kubeproxy.proxy.options import (
    Family,
    NodeOptions,
    node_options,
    nodeport_addresses,
    nodeport_cidrs,
    nodeport_matches_all,
)
from kubeproxy.proxy.programming import TRIGGER_TIME_ANNOTATION, TriggerTimes, latencies, slice_key, trigger_time
from kubeproxy.proxy.quarantine import Held, Quarantine, isolate, substitute
from kubeproxy.proxy.runner import BoundedFrequencyRunner
from kubeproxy.proxy.source_watch import HEALTH_FIELD as SOURCE_HEALTH_FIELD
from kubeproxy.proxy.source_watch import SourceWatch
from kubeproxy.proxy.view import ViewBuilder
from kubeproxy.proxy.workers import DEFAULT_JOIN_TIMEOUT, DaemonExecutor
from kubeproxy.sources.events import WatchEvent

log = logging.getLogger("kubeproxy.proxy")

TCP_BE_LIBERAL = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")


class Source(Protocol):
    async def run(self) -> None: ...

    async def wait_synced(self) -> None: ...

    # False while the source is out of sync: shown (proxy/source_watch.py), never health.
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
    backend: Backend = field(init=False)  # the primary family's (lanes[0])
    # One lane per IP family this node proxies, the primary first (see proxy/family_lanes.py).
    lanes: list[FamilyLane] = field(default_factory=list, init=False)
    proc_ipv6: Path = PROC_IPV6  # absent: the kernel has no IPv6 (tests point it elsewhere)
    _lacking: dict[Family, str] = field(default_factory=dict, init=False)  # families the kernel lacks, logged once
    _initialized: bool = field(default=False, init=False)
    _interface_ips: tuple[str, ...] | None = field(default=None, init=False)  # the last read (see _nodeport_interface_ips)
    _triggers: TriggerTimes = field(init=False)  # for the network-programming metric
    quarantine: Quarantine = field(default_factory=Quarantine, init=False)  # the primary family's
    _pending_services: int = field(default=0, init=False)
    _pending_endpoints: int = field(default=0, init=False)
    syncs: int = field(default=0, init=False)  # successful syncs
    failed_syncs: int = field(default=0, init=False)
    last_report: SyncReport | None = field(default=None, init=False)
    last_changes: Changes | None = field(default=None, init=False)
    servers: dict[str, asyncio.AbstractServer] = field(default_factory=dict, init=False)  # proxy.http.HttpServer
    _progress: asyncio.Condition | None = field(default=None, init=False)
    # The proxy owns its process's garbage collector (see the module doc); off for a proxy that
    # shares its process (tests), where freezing the heap would keep others' garbage for ever.
    manage_gc: bool = False
    _gc_paused: bool = field(default=False, init=False)
    source_name: str = "source"  # which source, in the lines that say it is out of sync or back
    source_check_interval: float = 1.0  # how often the source's state is read (proxy/source_watch.py)
    metrics_pages: Mapping[str, Handler] = field(default_factory=dict)  # /configz, /flagz, /statusz (proxy/zpages.py)

    def __post_init__(self) -> None:
        self.metrics = ProxyMetrics(self.cfg.mode, nfacct=self._nfacct_packets, feature_gates=self.cfg.feature_gates)
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
        self.backend = self._new_backend()
        self.lanes = [
            FamilyLane(Family.IPV4, self.backend, self.tracker, self.service_health, self.view_builder, self.quarantine)
        ]
        # A mode with state of its own (the userspace relay) shows it in /metrics and /healthz.
        seen = registry.observers(self.cfg.mode, lambda: [(lane.family, lane.backend) for lane in self.lanes])
        if seen is not None:
            self.metrics.registry.register(seen.collector)
            if seen.health_key:
                self.health.details[seen.health_key] = seen.health

    def _new_backend(self) -> Backend:
        return registry.create(
            self.cfg.mode, run=self.run_cmd, sync_period=self.cfg.sync_period, variant=self.iptables_variant,
            cfg=self.cfg,
        )

    # -- events

    def on_event(self, event: WatchEvent) -> None:
        self.on_events((event,))

    def on_events(self, events: Sequence[WatchEvent]) -> None:
        """Apply a batch of events in order (a source's whole list, or one watch event).

        What upstream does per change and that only the last change decides (the pending
        gauges, the queued-update time for /healthz, the sync request) is done once per batch;
        the change counters still count every change. One event that fails does not stop the
        others (it is logged, as the sources log a consumer failure).
        """
        # The cold start delivers 20k events at 10k services: building their log lines costs ~8% of
        # it even when the level drops them, so they are only built when INFO is on.
        verbose = log.isEnabledFor(logging.INFO)
        services = endpoints = accepted = 0
        for event in events:
            try:
                kind = self._apply_event(event, verbose)
            except Exception as e:  # a bug for one object must not lose the rest of the list
                log.error("the proxy failed on %s: %s", event, str(e) or type(e).__name__)
                continue
            if kind is None:
                continue
            accepted += 1
            if kind == "Service":
                services += 1
            elif kind == "EndpointSlice":
                endpoints += 1
        if not accepted:
            return
        if services:
            self._pending_services += services
            self.metrics.service_changes_total.inc(services)
        if endpoints:
            self._pending_endpoints += endpoints
            self.metrics.endpoint_changes_total.inc(endpoints)
        self.metrics.service_changes_pending.set(self._pending_services)
        self.metrics.endpoint_changes_pending.set(self._pending_endpoints)
        now = self.wall_clock()
        for lane in self.lanes:
            self.health.queued_update(lane.family)
            self.metrics.ip_family = lane.family
            self.metrics.last_queued_timestamp.set(now)
        if self._initialized:
            self.runner.run()

    def _apply_event(self, event: WatchEvent, verbose: bool) -> str | None:
        """One event into the state: its kind, or None if the state rejected it (logged)."""
        slice_at = slice_key(event.obj) if event.kind == "EndpointSlice" else None  # type: ignore[arg-type]
        slice_before = self.state.slices.get(slice_at) if slice_at else None
        warning = self.tracker.apply(self.state, event.obj, deleted=event.type == "DELETED")
        if warning:
            log.warning("%s: %s", event, warning)
            return None
        ref = (f"{event.namespace}/{event.name}" if event.namespace else event.name) if verbose else ""
        if event.kind == "Service":
            verb = {"ADDED": "Adding new service", "MODIFIED": "Updating existing service", "DELETED": "Removing service"}
            if verbose:
                log.info(kv(verb[event.type], service=ref))
        elif event.kind == "EndpointSlice":
            slice_after = self.state.slices.get(slice_at) if slice_at else None
            self._triggers.slice_event(slice_before, slice_after, _trigger_time(event))
            if verbose:
                count = sum(len(ep.addresses) for ep in slice_after.endpoints) if slice_after is not None else 0
                log.info(kv("Setting endpoints" if event.type != "DELETED" else "Removing endpoints", slice=ref, addresses=count))
        elif event.kind == "Node":
            # Manifests carry every Node; only this one's changes matter (labels, deletion).
            ours = event.name == self.node_name
            if log.isEnabledFor(logging.INFO if ours else logging.DEBUG):
                ref = f"{event.namespace}/{event.name}" if event.namespace else event.name
                (log.info if ours else log.debug)(kv("Node changed", node=ref, event=event.type, thisNode=ours))
            if ours:
                node = self.state.nodes.get(self.node_name)
                if event.type == "DELETED" or node is None:
                    self.health.sync_node(deleting=True)
                else:
                    self.health.sync_node(deleting=node.deleting, taints=node.taints)
        return event.kind

    # -- sync

    async def _active_lanes(self) -> list[FamilyLane]:
        """The lanes of the families this node proxies now, the primary first; creates the
        second lane when the node turns dual-stack. A family the kernel lacks is logged once and
        left out, and so is a second family in a mode that programs one family only."""
        node = self.state.nodes.get(self.node_name)
        families = live_families(self.cfg, node)
        primary = self.lanes[0]
        primary.backend, primary.quarantine = self.backend, self.quarantine  # tests may swap them
        if primary.family != families[0]:
            # The node's primary address changed family (or became known). A second lane of
            # that family already holds its tables, listeners and quarantine: the two lanes
            # trade those (the primary lane keeps the tracker that sees the events).
            log.info(kv("Primary IP family", ipFamily=families[0]))
            second = next((lane for lane in self.lanes[1:] if lane.family == families[0]), None)
            if second is None:
                primary.family = families[0]
            else:
                for attr in _LANE_STATE:
                    mine, theirs = getattr(primary, attr), getattr(second, attr)
                    setattr(primary, attr, theirs)
                    setattr(second, attr, mine)
                second.tracker.request_full_sync()
                self.backend, self.quarantine = primary.backend, primary.quarantine
                self.view_builder, self.service_health = primary.view_builder, primary.service_health
            primary.tracker.request_full_sync()
        self.backend.family = families[0]
        active = [primary]
        for family in families[1:]:
            found = next((lane for lane in self.lanes[1:] if lane.family == family), None)
            if found is None:
                found = await self._new_lane(family, families[0])
            if found is not None:
                active.append(found)
        # The primary lane's tracker sees every event; the others learn what it saw.
        pending = self.tracker.pending()
        for lane in active[1:]:
            if pending is None:
                lane.tracker.request_full_sync()
            else:
                lane.tracker.touch(pending)
        return active

    async def _new_lane(self, family: Family, primary: Family) -> FamilyLane | None:
        """A lane for the second family, or None (logged once) if this node cannot run one."""
        reason = self._lacking.get(family)
        if reason is None:
            reason = await asyncio.to_thread(
                kernel_lacks, family, self.cfg.mode, self.run_cmd, variant=self.iptables_variant, proc_ipv6=self.proc_ipv6
            )
        if reason is not None:
            if family not in self._lacking:
                log.warning(kv("Not proxying an IP family, the other keeps working", ipFamily=family, reason=reason))
                self._lacking[family] = reason
            return None
        log.info(kv("kube-proxy running in dual-stack mode", primaryIPFamily=primary))
        backend = self._new_backend()
        backend.family = family
        lane = FamilyLane(
            family, backend, ChangeTracker(self.node_name),
            # Its own listeners (on this family's addresses), one connection budget for all.
            ServiceHealthServers(
                self.health, node_name=self.node_name, budget=self.service_health.budget, errors=self.service_health.errors,
                on_failure=self.service_health.on_failure,
            ),
        )  # fmt: skip
        self.lanes.append(lane)
        return lane

    def _nodeport_interface_ips(self) -> tuple[str, ...] | None:
        """The interfaces' addresses that nodePortAddresses CIDRs select from, read at each sync
        as upstream does. Runs in a worker thread. A failed read is logged and the last good one
        kept (the Node's addresses before any, None): the NodePorts programmed on them stay."""
        try:
            self._interface_ips = tuple(a.ip for a in interface_addresses(self.run_cmd))
        except Exception as exc:  # whatever the runner raises: the sync goes on without a fresh list
            log.error(kv("Failed to get node ip address matching nodeport cidrs, services with nodeport may not work as intended",
                         err=str(exc) or type(exc).__name__, CIDRs=list(nodeport_addresses(self.cfg))))
        return self._interface_ips

    def _view(self, lane: FamilyLane, interface_ips: tuple[str, ...] | None) -> tuple[NodeView, NodeOptions]:
        node = self.state.nodes.get(self.node_name)
        opts = node_options(
            self.cfg,
            family=lane.family,
            hostname=self.node_name,
            node=node,
            nfacct_counters=lane.backend.nfacct_counters,
            conntrack_tcp_liberal=_tcp_liberal(),
            interface_ips=interface_ips,
            service_cidrs=self.state.service_cidr_list(),
        )
        lane.backend.family = lane.family
        lane.opts = opts
        lane.service_health.set_bind_ips(_health_check_ips(opts))
        # Only the services touched since the last sync are recomputed (2.8 s → ms at 10k).
        view = lane.view_builder.update(self.state, lane.tracker.pending(), family=lane.family, node_name=opts.node_name)
        return view, opts

    async def sync(self) -> None:
        """One sync of every family, called by the runner only. A family whose rules fail
        is retried (in full) after minSyncPeriod; the other's are programmed all the same."""
        if not self._initialized:
            log.debug("not syncing: the source has not delivered its initial state yet")
            return
        lanes = await self._active_lanes()
        triggers = self._triggers.take()
        self._pending_services = self._pending_endpoints = 0
        failed = False
        for lane in lanes:
            failed = not await self._sync_lane(lane, triggers) or failed
        self.last_changes = self.lanes[0].last_changes
        self.last_report = self.lanes[0].last_report
        if failed:
            self.failed_syncs += 1
            self.runner.retry_after(self.cfg.min_sync_period)
        else:
            self.syncs += 1
        self._settle_heap()
        await self._finished()

    def _pause_gc(self) -> None:
        # The process is the proxy's: whoever turned the collector off before (the start-up's
        # imports, cli.py), it stays off until the first sync is over and then goes on.
        if self.manage_gc:
            gc.disable()
            self._gc_paused = True

    def _settle_heap(self) -> None:
        """After the first sync (successful or not: a collector paused while syncs keep failing
        would let their garbage pile up): freeze what the cold start made, then collect as usual.
        glibc keeps the pages the cold start's peak freed (decoded lists, rendered text): they go
        back to the kernel here, 27-36 MiB at 1k-10k services (bench/memory.py --trim)."""
        if self._gc_paused:
            self._gc_paused = False
            gc.freeze()
            gc.enable()
            released = release_free_memory()
            log.info(kv("Returned freed heap memory to the system", bytes=released))

    async def _sync_lane(self, lane: FamilyLane, triggers: dict[ServiceKey, list[float]]) -> bool:
        started = time.perf_counter()
        self.metrics.ip_family = lane.family
        # Upstream reads the interfaces only when CIDRs select among them.
        cidrs = nodeport_cidrs(self.cfg, self.state.nodes.get(self.node_name), lane.family)
        interface_ips = None if nodeport_matches_all(cidrs) else await asyncio.to_thread(self._nodeport_interface_ips)
        view, opts = self._view(lane, interface_ips)
        changes = lane.tracker.take(view)
        lane.last_changes = changes
        log.info(kv(f"Syncing {self.cfg.mode} rules", ipFamily=lane.family, full=changes.full, services=len(changes.services)))
        for key in lane.quarantine.release(changes.services):
            log.info(kv("Quarantined service changed, trying it again", service=f"{key[0]}/{key[1]}", ipFamily=lane.family))
        self._show_quarantine()
        try:
            report, view = await asyncio.to_thread(self._apply, lane, view, opts, changes)
        except (SyncError, OSError) as exc:
            # What the failed sync consumed is lost: the retry rewrites everything.
            lane.tracker.request_full_sync()
            self._count_refusals(lane, changes)
            self._count_failure(lane, exc, changes)
            self._show_quarantine()
            return False
        self._count_refusals(lane, changes)
        self._show_quarantine()
        elapsed = time.perf_counter() - started
        self.metrics.ip_family = lane.family
        self._record(lane, report, elapsed, triggers)
        # NodePort conntrack cleanup touches only flows to where this sync's rules accept NodePorts.
        await self._after_sync(lane, view, changes, conntrack.NodePorts.of(opts, self.cfg.mode))
        log.info(kv("SyncProxyRules complete", ipFamily=lane.family, elapsed=f"{elapsed * 1000:.1f}ms", full=report.full))
        lane.view_builder.warm()  # after the sync is reported (see ViewBuilder.warm)
        return True

    def _apply(self, lane: FamilyLane, view: NodeView, opts: NodeOptions, changes: Changes) -> tuple[SyncReport, NodeView]:
        """Program `view`; if the kernel refuses it, quarantine the Services it refuses and program the rest.

        Runs in the worker thread. Returns the report and the view actually programmed (held
        Services as the kernel last accepted them). Raises the kernel's error when no Service
        is to blame (the check fails even with every candidate set aside).
        """
        backend, quarantine = lane.backend, lane.quarantine
        if not lane.prepared and lane is not self.lanes[0]:
            backend.prepare()  # the primary's is prepared by `prepare`, before the first sync
            # `opts` was made before the nfacct counters were ensured: the first sync's rules
            # count with them too, as every later one's.
            opts = replace(opts, nfacct_counters=backend.nfacct_counters)
            lane.opts = opts
        lane.prepared = True
        programmed = quarantine.apply(view)
        try:
            return backend.sync(programmed, opts, changes.changed_services), self._accepted(lane, programmed)
        except SyncError as exc:
            refused = exc
        # A failed partial sync names its suspects; after a failed full sync every Service is one.
        suspects = sorted(view.by_service if changes.full else changes.services)
        suspects = [key for key in suspects if key not in quarantine]
        last_good = lane.last_good
        log.warning(kv("Rules refused, looking for the services that cause it", suspects=len(suspects), err=refused))

        def passes(aside: frozenset[ServiceKey]) -> bool:
            trial = substitute(programmed, {key: Held.of(key, "", last_good) for key in aside})
            return backend.check(trial, opts) is None

        culprits = isolate(suspects, passes)
        if not culprits:
            raise refused  # counted by the caller, as any failed sync
        # Counted by the caller, on the event loop: the metrics' family label is not thread-safe.
        lane.refusals.append(refused)
        reason = str(refused).strip()
        for key in culprits:
            quarantine.hold(key, reason, last_good)
            log.warning(
                kv(
                    "Service quarantined: the kernel refuses its rules; it keeps its last accepted rules until it changes",
                    service=f"{key[0]}/{key[1]}",
                    ipFamily=lane.family,
                    err=reason,
                )
            )
        programmed = quarantine.apply(view)
        return backend.sync(programmed, opts, None), self._accepted(lane, programmed)

    @staticmethod
    def _accepted(lane: FamilyLane, view: NodeView) -> NodeView:
        lane.last_good = view
        return view

    def _show_quarantine(self) -> None:
        names: dict[str, None] = {}
        for lane in self.lanes:
            self.metrics.ip_family = lane.family
            self.metrics.quarantined_services.set(len(lane.quarantine))
            names.update(dict.fromkeys(lane.quarantine.names()))
        self.health.quarantined = tuple(names)

    def _count_failure(self, lane: FamilyLane, exc: Exception, changes: Changes) -> None:
        self.metrics.ip_family = lane.family  # on the event loop only: the label is shared state
        lane.backend.record_failure(self.metrics, exc, partial=not changes.full)

    def _count_refusals(self, lane: FamilyLane, changes: Changes) -> None:
        """The refusals the worker thread worked around by quarantining: each a failed restore."""
        refusals, lane.refusals = lane.refusals, []
        for exc in refusals:
            self._count_failure(lane, exc, changes)

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

    def _record(self, lane: FamilyLane, report: SyncReport, elapsed: float, triggers: dict[ServiceKey, list[float]]) -> None:
        lane.last_report = report
        m = self.metrics
        m.ip_family = lane.family
        m.sync_duration.observe(elapsed)
        (m.sync_full_duration if report.full else m.sync_partial_duration).observe(elapsed)
        now = self.wall_clock()
        m.last_timestamp.set(now)
        m.service_changes_pending.set(0)
        m.endpoint_changes_pending.set(0)
        for table, count in report.rule_counts.items():
            m.iptables_total.labels(table=table).set(count)
        for table, count in report.written_rule_counts.items():
            m.iptables_last.labels(table=table).set(count)
        m.no_local_endpoints_total.labels(traffic_policy="internal").set(report.no_local_endpoints_internal)
        m.no_local_endpoints_total.labels(traffic_policy="external").set(report.no_local_endpoints_external)
        for latency in latencies(triggers, now):
            m.network_programming_duration.observe(latency)
        self.health.updated(lane.family)

    async def _after_sync(self, lane: FamilyLane, view: NodeView, changes: Changes, node_ports: conntrack.NodePorts) -> None:
        ports = {}
        local: dict[tuple[str, str], int] = {}
        for name, info in view.services.items():
            if info.health_check_node_port:
                ports[name.service] = info.health_check_node_port
                local[name.service] = sum(1 for ep in view.endpoints.get(name, []) if ep.is_local and ep.ready)
        # Each family's listeners, on its addresses, count its own local endpoints (as upstream).
        await lane.service_health.sync_services(ports)
        lane.service_health.sync_endpoints(local)
        if conntrack.cleanup_required(changes):
            started = time.perf_counter()
            deleted = await asyncio.to_thread(self.conntrack_cleaner.reconcile, view, lane.family, node_ports)
            self.metrics.ip_family = lane.family
            self.metrics.conntrack_reconciler_sync_duration.observe(time.perf_counter() - started)
            self.metrics.conntrack_reconciler_deleted_entries_total.inc(deleted)
            if deleted:
                log.info(kv("Deleted stale UDP conntrack entries", ipFamily=lane.family, count=deleted))

    # -- running

    def prepare(self) -> None:
        """Kernel set-up before the first sync (the backend's: canary chains, nfacct counters, ...)."""
        self.backend.prepare()

    async def _start_servers(self, starters: list[tuple[str, str, Callable[[str], Awaitable[asyncio.AbstractServer]]]]) -> None:
        for what, bind, start in starters:
            if not bind:  # an empty address disables the server, as upstream
                continue
            try:
                self.servers[what] = await start(bind)
            except OSError as exc:
                # Upstream keeps proxying without the server; so do we, loudly.
                log.error(kv("Failed to start server", address=bind, err=exc))

    def _nfacct_packets(self, name: str) -> int | None:
        return nfacct_packets(name, self.run_cmd) if name in self.backend.nfacct_counters else None

    async def serve(self, source: Source) -> None:
        """Run until cancelled: source, runner, health and metrics servers."""
        self.source = source
        source_watch = SourceWatch(source, self.metrics.registry, self.source_name, clock=self.wall_clock)
        self.health.details[SOURCE_HEALTH_FIELD] = source_watch.health_field
        self.prepare()
        # As upstream: a proxy that never manages a first sync must not look healthy forever.
        self.health.updated(self.lanes[0].family)
        # One connection budget (sized from RLIMIT_NOFILE) for every HTTP server of this proxy.
        budget, errors = self.service_health.budget, self.service_health.errors
        starters: list[tuple[str, str, Callable[[str], Awaitable[asyncio.AbstractServer]]]] = [
            ("healthz", self.cfg.healthz_bind_address,
             lambda b: serve_healthz(self.health, self.metrics, b, budget=budget, errors=errors)),
            ("metrics", self.cfg.metrics_bind_address,
             lambda b: serve_metrics(self.metrics, b, self.cfg.mode, budget=budget, errors=errors, pages=self.metrics_pages)),
        ]  # fmt: skip
        await self._start_servers(starters)
        self._pause_gc()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(source.run(), name="source")
                group.create_task(self.runner.loop(), name="sync-runner")
                group.create_task(source_watch.run(self.source_check_interval), name="source-watch")
                if self.cfg.snat_watch_interval > 0:  # opt-in: a sample dumps conntrack (proxy/snat_watch.py)
                    from kubeproxy.proxy.snat_watch import SnatWatch

                    watch = SnatWatch(lambda: [ln.last_good for ln in self.lanes if ln.last_good], self.metrics.registry,
                                      self.cfg.snat_watch_interval, self.cfg.snat_watch_threshold,
                                      self.cfg.snat_watch_max_entries, self.cfg.masquerade_all, self.run_cmd)
                    group.create_task(watch.run(), name="snat-watch")
                await source.wait_synced()
                self._initialized = True
                log.info(kv("Initial state received, syncing"))
                if len(live_families(self.cfg, self.state.nodes.get(self.node_name))) > 1:
                    # Go's listener on 0.0.0.0 takes IPv6 too; ours takes one family: add `::`.
                    await self._start_servers([(f"{what} IPv6", v6, start) for what, bind, start in starters
                                               if (v6 := _ipv6_wildcard(bind))])
                self.runner.run()
        finally:
            if self._gc_paused:  # stopped before the first sync
                self._gc_paused = False
                gc.enable()
            for server in self.servers.values():
                server.close()
            for lane in self.lanes:
                await lane.service_health.close()


# What a lane holds of its family's kernel state (everything but the change tracker).
_LANE_STATE = ("family", "backend", "view_builder", "quarantine", "service_health", "last_good", "prepared")


def _trigger_time(event: WatchEvent) -> float | None:
    """The slice's trigger time annotation (see proxy/programming.py), plain dicts or a struct."""
    if isinstance(event.obj, dict):
        return trigger_time(event.obj)
    annotations = event.annotations
    if TRIGGER_TIME_ANNOTATION not in annotations:
        return None
    return trigger_time({"metadata": {"annotations": {TRIGGER_TIME_ANNOTATION: annotations[TRIGGER_TIME_ANNOTATION]}}})


def _tcp_liberal() -> bool:
    try:
        return TCP_BE_LIBERAL.read_text().strip() == "1"
    except OSError:
        return False


async def run_until_signalled(proxy: LiveProxy, source: Source, join_timeout: float = DEFAULT_JOIN_TIMEOUT) -> None:
    """Serve until SIGTERM or SIGINT; the rules stay in the kernel (upstream does the same).

    Worker threads still running then are waited for `join_timeout` seconds at most (workers.py):
    a source stuck in a read must not keep the process alive."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(DaemonExecutor(join_timeout))
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    proxy.manage_gc = True  # the process is the proxy's
    with contextlib.suppress(asyncio.CancelledError):
        await proxy.serve(source)
    log.info(kv("Exiting, leaving the rules in place"))


def _ipv6_wildcard(bind: str) -> str | None:
    """`[::]:port` for a bind address on every IPv4 address (`0.0.0.0:port`), else None."""
    host, sep, port = bind.rpartition(":")
    return f"[::]:{port}" if sep and host == "0.0.0.0" else None


def _health_check_ips(opts: NodeOptions) -> tuple[str, ...]:
    """Where health-check node ports listen, as upstream: on the node's addresses that
    --nodeport-addresses selects, or on every address of the family when it selects all."""
    if opts.nodeport_match_all:
        return ("::",) if opts.family == Family.IPV6 else ("0.0.0.0",)
    return opts.nodeport_ips
