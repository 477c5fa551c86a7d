"""The live proxy (`kubeproxy run`): events in, syncs out (docs/live-proxy.md).

A source delivers events to `on_events`, which update the cluster state (proxy/event_intake.py)
and ask the bounded-frequency runner for a sync, run at most every minSyncPeriod; without a
change, at least every syncPeriod in ipvs mode and every FULL_SYNC_PERIOD (an hour) in iptables
and nftables modes, where a monitor looks every syncPeriod whether the rules are still in the
kernel instead (proxy/rules_monitor.py), as upstream's runners and iptables Monitor. Each IP
family's lane (proxy/family_lanes.py) programs in a worker thread, so a large render stalls
neither the watches nor the health servers. As upstream, the first sync waits
for the source's initial state, a failed sync is retried in full after minSyncPeriod, and SIGTERM
leaves the rules in the kernel; unlike upstream, a refusal is narrowed down to the Services that
cause it (proxy/quarantine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kubeproxy.backends import conntrack, registry
from kubeproxy.backends.iptables.apply import nfacct_packets
from kubeproxy.cluster.state import ClusterState
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.model.changes import Changes
from kubeproxy.model.contract import FULL_SYNC_PERIOD, SyncError, SyncReport
from kubeproxy.model.metrics import ProxyMetrics
from kubeproxy.model.node_model import ServiceKey
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.event_intake import EventIntake
from kubeproxy.proxy.family_lanes import PROC_IPV6, FamilyLane, FamilyLanes, live_families
from kubeproxy.proxy.health import ProxyHealth
from kubeproxy.proxy.http import Handler
from kubeproxy.proxy.programming import TriggerTimes, latencies
from kubeproxy.proxy.rules_monitor import RulesMonitor, Watched
from kubeproxy.proxy.runner import BoundedFrequencyRunner, Clock, LoopClock
from kubeproxy.proxy.source_watch import HEALTH_FIELD as SOURCE_HEALTH_FIELD
from kubeproxy.proxy.source_watch import SourceWatch
from kubeproxy.proxy.status_servers import StatusServers
from kubeproxy.proxy.workers import DEFAULT_JOIN_TIMEOUT, DaemonExecutor
from kubeproxy.runtime.logs import kv
from kubeproxy.runtime.memory import ColdStartHeap
from kubeproxy.sources.events import WatchEvent

log = logging.getLogger("kubeproxy.proxy")

class Source(Protocol):
    async def run(self) -> None: ...

    async def wait_synced(self) -> None: ...

    # False while the source is out of sync: shown (proxy/source_watch.py), never health.
    @property
    def connected(self) -> bool: ...


@dataclass
class LiveProxy:
    """The proxy for one node. `serve(source)` runs it until cancelled."""

    cfg: ProxyConfig
    node_name: str
    run_cmd: Runner = local_run
    iptables_variant: str = ""  # "legacy" / "nft": which iptables to drive; "" the system's
    wall_clock: Callable[[], float] = time.time
    clock: Clock = field(default_factory=LoopClock)  # the runner's and the rules monitor's
    state: ClusterState = field(default_factory=ClusterState)
    source: Source | None = None
    proc_ipv6: Path = PROC_IPV6  # absent: the kernel has no IPv6 (tests point it elsewhere)
    # The proxy owns its process's garbage collector (runtime/memory.py); off for a proxy that
    # shares its process (tests), where freezing the heap would keep others' garbage for ever.
    manage_gc: bool = False
    source_name: str = "source"  # which source, in the lines that say it is out of sync or back
    source_check_interval: float = 1.0  # how often the source's state is read (proxy/source_watch.py)
    metrics_pages: Mapping[str, Handler] = field(default_factory=dict)  # /configz, /flagz, /statusz (proxy/zpages.py)
    syncs: int = field(default=0, init=False)  # successful syncs
    failed_syncs: int = field(default=0, init=False)
    last_report: SyncReport | None = field(default=None, init=False)  # the primary family's
    last_changes: Changes | None = field(default=None, init=False)
    servers: dict[str, asyncio.AbstractServer] = field(default_factory=dict, init=False)  # proxy.http.HttpServer

    def __post_init__(self) -> None:
        self.metrics: ProxyMetrics = registry.proxy_metrics(self.cfg.mode, nfacct=self._nfacct_packets,
                                                            feature_gates=self.cfg.feature_gates)
        self.health = ProxyHealth(2 * self.cfg.sync_period, clock=self.wall_clock)
        self._triggers = TriggerTimes(start=self.wall_clock())  # for the network-programming metric
        self._intake = EventIntake(self.state, self.node_name, self.health, self._triggers)
        self.conntrack_cleaner = conntrack.Reconciler(run=self.run_cmd)
        # Only an unexpected exception gets to the runner; failed syncs schedule their own retry.
        quiet = registry.mode(self.cfg.mode).quiet_resync
        max_interval = max(FULL_SYNC_PERIOD, self.cfg.min_sync_period) if quiet else self.cfg.sync_period
        self.runner = BoundedFrequencyRunner(self.sync, min_interval=self.cfg.min_sync_period, max_interval=max_interval,
                                             retry_interval=self.cfg.sync_period, clock=self.clock,
                                             name=f"{self.cfg.mode}-sync")  # fmt: skip
        self.rules_monitor = RulesMonitor(self._watched, self._rules_lost, self.cfg.sync_period, self.clock) if quiet else None
        self.family_lanes = FamilyLanes(self.cfg, self.node_name, self.run_cmd, self.iptables_variant, self.health, self.metrics)
        self._heap = ColdStartHeap()
        self._initialized = False
        self._pending = [0, 0]  # Service and EndpointSlice changes since the last sync
        self._progress = asyncio.Condition()  # bound to the loop that first waits on it

    @property
    def lanes(self) -> list[FamilyLane]:
        """The lanes, the primary first: its tracker sees every event."""
        return self.family_lanes.all

    # -- events in

    def on_event(self, event: WatchEvent) -> None:
        self.on_events((event,))

    def on_events(self, events: Sequence[WatchEvent]) -> None:
        """Apply a batch of events in order (a source's whole list, or one watch event).

        What upstream does per change and that only the last change decides (the pending
        gauges, the queued-update time for /healthz, the sync request) is done once per batch;
        the change counters still count every change.
        """
        accepted = self._intake.apply(self.lanes[0].tracker, events)
        if not accepted:
            return
        m = self.metrics
        self._pending = [self._pending[0] + accepted.services, self._pending[1] + accepted.endpoints]
        m.service_changes_total.inc(accepted.services)
        m.endpoint_changes_total.inc(accepted.endpoints)
        m.service_changes_pending.set(self._pending[0])
        m.endpoint_changes_pending.set(self._pending[1])
        now = self.wall_clock()
        for lane in self.lanes:
            self.health.queued_update(lane.family)
            lane.metrics.last_queued_timestamp.set(now)
        if self._initialized:
            self.runner.run()

    def _watched(self) -> list[Watched]:
        return [Watched(lane.family, lane.backend, lane.last_good is not None) for lane in self.lanes]

    def _rules_lost(self, family: Family) -> None:
        for lane in self.lanes:
            if lane.family == family:
                lane.tracker.request_full_sync()
        self.runner.run()

    # -- syncs out

    async def sync(self) -> None:
        """One sync of every family, called by the runner only. A family whose rules fail
        is retried (in full) after minSyncPeriod; the other's are programmed all the same."""
        if not self._initialized:
            log.debug("not syncing: the source has not delivered its initial state yet")
            return
        lanes = await self.family_lanes.active(self.state.nodes.get(self.node_name), self.proc_ipv6)
        triggers = self._triggers.take()
        self._pending = [0, 0]
        failed = False
        for lane in lanes:
            failed = not await self._sync_lane(lane, triggers, lanes[1:] if lane is lanes[0] else ()) or failed
        self.last_changes, self.last_report = self.lanes[0].last_changes, self.lanes[0].last_report
        if failed:
            self.failed_syncs += 1
            self.runner.retry_after(self.cfg.min_sync_period)
        else:
            self.syncs += 1
        self._heap.settle()
        async with self._progress:
            self._progress.notify_all()

    async def _sync_lane(self, lane: FamilyLane, triggers: dict[ServiceKey, list[float]], others: Sequence[FamilyLane]) -> bool:
        started = time.perf_counter()
        interface_ips = await self.family_lanes.interface_ips(lane.family, self.state.nodes.get(self.node_name))
        view, opts, changes = lane.take(self.state, self.cfg, self.node_name, interface_ips, others)
        self.family_lanes.show_quarantine()
        try:
            report, view = await asyncio.to_thread(lane.program, view, opts, changes, primary=lane is self.lanes[0])
        except (SyncError, OSError) as exc:
            lane.metrics.record_duration(changes.full, time.perf_counter() - started)
            lane.tracker.request_full_sync()  # what the failed sync consumed is lost: the retry rewrites everything
            lane.count_failures([*lane.quarantine.take_refusals(), exc], changes)
            self.family_lanes.show_quarantine()
            return False
        lane.count_failures([*lane.quarantine.take_refusals()], changes)
        self.family_lanes.show_quarantine()
        elapsed = time.perf_counter() - started
        lane.last_report = report
        now = self.wall_clock()
        lane.metrics.record_sync(report, elapsed, now, latencies(triggers, now))
        self.metrics.service_changes_pending.set(0)
        self.metrics.endpoint_changes_pending.set(0)
        self.health.updated(lane.family)
        await lane.serve_health(view)
        await lane.clean_conntrack(self.conntrack_cleaner, view, opts, changes, self.cfg.mode)
        log.info(kv("SyncProxyRules complete", ipFamily=lane.family, elapsed=f"{elapsed * 1000:.1f}ms", full=report.full))
        lane.view_builder.warm()  # after the sync is reported (see ViewBuilder.warm)
        return True

    async def wait_for_syncs(self, count: int) -> None:
        """Until `count` syncs (successful or failed) have finished: for tests and benchmarks."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.syncs + self.failed_syncs >= count)

    def prepare(self) -> None:
        """Kernel set-up before the first sync (the backend's: canary chains, nfacct counters, ...)."""
        self.lanes[0].backend.prepare()

    def _nfacct_packets(self, name: str) -> int | None:
        return nfacct_packets(name, self.run_cmd) if name in self.lanes[0].backend.nfacct_counters else None

    async def serve(self, source: Source) -> None:
        """Run until cancelled: source, runner, health and metrics servers."""
        self.source = source
        source_watch = SourceWatch(source, self.metrics.registry, self.source_name, clock=self.wall_clock)
        self.health.details[SOURCE_HEALTH_FIELD] = source_watch.health_field
        self.prepare()
        # As upstream: a proxy that never manages a first sync must not look healthy forever.
        self.health.updated(self.lanes[0].family)
        status = StatusServers(self.cfg, self.health, self.metrics, self.lanes[0].service_health, self.metrics_pages,
                               self.servers)  # fmt: skip
        await status.start()
        if self.manage_gc:
            self._heap.pause()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(source.run(), name="source")
                group.create_task(self.runner.loop(), name="sync-runner")
                group.create_task(source_watch.run(self.source_check_interval), name="source-watch")
                if self.rules_monitor is not None:
                    group.create_task(self.rules_monitor.run(), name="rules-monitor")
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
                    await status.start(ipv6_wildcard=True)
                self.runner.run()
        finally:
            self._heap.resume()  # stopped before the first sync
            status.close()
            for lane in self.lanes:
                await lane.service_health.close()


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

