"""Both IP families from one proxy: upstream's meta-proxier, in the live loop's terms.

Upstream runs one proxier per family and hands each the Services and EndpointSlices of its
family. Here the cluster state is shared and each family's node view already holds only that
family's addresses (`build_view(..., family)`), so dispatching by family is building one view
per family. What must be separate per family is everything that remembers the previous sync:
the backend (its tables: `iptables`/`ip6tables`, `ip`/`ip6 kube-proxy`), the change tracker's
last view, the view builder, the quarantine and its last accepted view, and the health-check
listeners (bound to that family's addresses, counting that family's local endpoints). That is a
`FamilyLane`, with its metrics bound to its family; `LiveProxy` syncs every lane in turn, and a
lane that fails leaves the other's rules and health alone. A lane is swapped whole: when the
node's primary family changes, the lanes change places (`FamilyLanes.active`).

Which families the live proxy runs (`live_families`): as upstream's platformCheckSupported
(cmd/kube-proxy/app/server_linux.go), both in upstream's modes whatever the node's addresses, the
primary one of the first node IP; a family the kernel lacks (`kernel_lacks`) is logged once and
left out, and the other keeps working. A family the node has no address of gets the loopback
address as its node IP (upstream's detectNodeIPs). `kubeproxy render` works offline, without the
kernel to ask, and renders the families the node's addresses or --cluster-cidr name
(kubeproxy.model.node_choice.node_families); so does the userspace mode, which is not upstream's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubeproxy.backends import conntrack, registry
from kubeproxy.cluster.objects import Node
from kubeproxy.cluster.state import ClusterState
from kubeproxy.kernel.exec import Patience, PatientHost, Runner
from kubeproxy.kernel.host import host_of
from kubeproxy.kernel.interfaces import interface_addresses
from kubeproxy.model.changes import Changes, ChangeTracker
from kubeproxy.model.contract import Backend, SyncReport, ToolTimeout
from kubeproxy.model.metrics import FamilyMetrics, ProxyMetrics
from kubeproxy.model.node_choice import node_families, primary_family
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family, NodeOptions, node_options, nodeport_addresses, nodeport_cidrs, nodeport_matches_all
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.model.view import ViewBuilder
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers
from kubeproxy.proxy.quarantine import Quarantine
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.proxy")

# Every mode's backend programs one family per instance, so that two instances make a
# dual-stack node. IPVS's two instances share the IPVS table and kube-ipvs0: each reads and
# changes only its own family's virtual servers and addresses there, and names its IPv6 ipsets
# KUBE-6-... (upstream's NewIPSet). Userspace: each family has its own listeners (IPv6 ones
# with IPV6_V6ONLY on `::`), relay thread, ip6tables redirects and state file. Which families
# run is the mode's `upstream_dual_stack` (backends/registry.py).

PROC_IPV6 = Path("/proc/sys/net/ipv6")


TCP_BE_LIBERAL = Path("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")


@dataclass
class FamilyLane:
    """What one family's syncs remember; see the module docstring."""

    family: Family
    backend: Backend
    tracker: ChangeTracker
    service_health: ServiceHealthServers
    metrics: FamilyMetrics  # labelled with `family`
    view_builder: ViewBuilder = field(default_factory=ViewBuilder)
    quarantine: Quarantine = field(default_factory=Quarantine)  # and the view the kernel last accepted
    # How long this family's kernel tools may run: the backend's tools run through a
    # PatientHost of it (FamilyLanes.new_lane); `program` lengthens and resets it.
    patience: Patience = field(default_factory=Patience)
    last_report: SyncReport | None = None
    last_changes: Changes | None = None
    opts: NodeOptions | None = None  # of the last sync
    prepared: bool = False

    @property
    def last_good(self) -> NodeView | None:
        """The view the kernel last accepted."""
        return self.quarantine.last_good

    def moved_to(self, family: Family, metrics: ProxyMetrics) -> FamilyLane:
        """This lane's state, now programming `family` (the node's only family changed)."""
        return replace(self, family=family, metrics=metrics.for_family(family))

    def take(
        self,
        state: ClusterState,
        cfg: ProxyConfig,
        node_name: str,
        interface_ips: tuple[str, ...] | None,
        followers: Sequence[FamilyLane] = (),
    ) -> tuple[NodeView, NodeOptions, Changes]:
        """This family's view of `state`, the options to program it with and the changes since
        the last sync; the held Services those changes touch leave the quarantine.

        The primary lane's tracker alone sees the events: `followers` (the other active lanes)
        learn what it takes at the moment it takes it, with no await in between, so an event
        applied while a sync waits (for the interfaces' addresses, for the kernel) reaches every
        family's next sync.
        """
        pending = self.tracker.pending()
        for lane in followers:
            if pending is None:
                lane.tracker.request_full_sync()
            else:
                lane.tracker.touch(pending)
        opts = node_options(
            cfg,
            family=self.family,
            hostname=node_name,
            node=state.nodes.get(node_name),
            nfacct_counters=self.backend.nfacct_counters,
            conntrack_tcp_liberal=_tcp_liberal(),
            interface_ips=interface_ips,
            service_cidrs=state.service_cidr_list(),
            nodeports=registry.nodeport_traits(cfg.mode),
        )
        self.backend.family = self.family
        self.opts = opts
        self.service_health.set_bind_ips(_health_check_ips(opts))
        # Only the services touched since the last sync are recomputed (see ViewBuilder).
        view = self.view_builder.update(state, self.tracker.pending(), family=self.family, node_name=opts.node_name)
        changes = self.last_changes = self.tracker.take(view)
        log.info(kv(f"Syncing {cfg.mode} rules", ipFamily=self.family, full=changes.full, services=len(changes.services)))
        for key in self.quarantine.release(changes.services):
            log.info(kv("Quarantined service changed, trying it again", service=f"{key[0]}/{key[1]}", ipFamily=self.family))
        return view, opts, changes

    def program(self, view: NodeView, opts: NodeOptions, changes: Changes, *, primary: bool) -> tuple[SyncReport, NodeView]:
        """Program `view` (in a worker thread); see Quarantine.program. A tool that ran out of
        time gets twice the bound in this family's next attempt, a sync that finished resets it."""
        if not self.prepared and not primary:
            self.backend.prepare()  # the primary's is prepared by the live loop, before the first sync
            # `opts` was made before the nfacct counters were ensured: the first sync's rules
            # count with them too, as every later one's.
            opts = replace(opts, nfacct_counters=self.backend.nfacct_counters)
            self.opts = opts
        self.prepared = True
        try:
            done = self.quarantine.program(self.backend, view, opts, changes)
        except ToolTimeout:
            self.patience.ran_out()
            raise
        self.patience.reset()
        return done

    async def serve_health(self, view: NodeView) -> None:
        """This family's health-check listeners, on its addresses, counting its own local
        endpoints (as upstream)."""
        ports = {}
        local: dict[tuple[str, str], int] = {}
        for name, info in view.services.items():
            if info.health_check_node_port:
                ports[name.service] = info.health_check_node_port
                local[name.service] = sum(1 for ep in view.endpoints.get(name, []) if ep.is_local and ep.ready)
        await self.service_health.sync_services(ports)
        self.service_health.sync_endpoints(local)

    def count_failures(self, failures: list[Exception], changes: Changes) -> None:
        """Failed restores, each counted in the mode's metric (refusals the quarantine worked around too)."""
        for exc in failures:
            self.backend.record_failure(self.metrics, exc, partial=not changes.full)

    async def clean_conntrack(
        self, cleaner: conntrack.Reconciler, view: NodeView, opts: NodeOptions, changes: Changes, mode: str
    ) -> None:
        """Clear the stale UDP flows this sync's changes left, if any; NodePort flows only to
        where this sync's rules accept NodePorts."""
        if not conntrack.cleanup_required(changes):
            return
        started = time.perf_counter()
        node_ports = conntrack.NodePorts.of(opts, loopback_nodeports=registry.mode(mode).loopback_nodeports)
        deleted = await asyncio.to_thread(cleaner.reconcile, view, self.family, node_ports)
        self.metrics.conntrack_reconciler_sync_duration.observe(time.perf_counter() - started)
        self.metrics.conntrack_reconciler_deleted_entries_total.inc(deleted)
        if deleted:
            log.info(kv("Deleted stale UDP conntrack entries", ipFamily=self.family, count=deleted))


@dataclass
class FamilyLanes:
    """The lanes of one proxy, the primary first: lanes[0] sees the events, and its tracker's
    changes are passed on to the others before each sync."""

    cfg: ProxyConfig
    node_name: str
    run: Runner
    variant: str
    health: ProxyHealth
    metrics: ProxyMetrics
    all: list[FamilyLane] = field(default_factory=list)
    lacking: dict[Family, str] = field(default_factory=dict)  # families the kernel lacks, logged once
    _interface_ips: tuple[str, ...] | None = field(default=None, init=False)  # the last read

    def __post_init__(self) -> None:
        if not self.all:
            self.all.append(self.new_lane(Family.IPV4, ServiceHealthServers(self.health, node_name=self.node_name)))
        # A mode with state of its own (the userspace relay) shows it in /metrics and /healthz.
        seen = registry.observers(self.cfg.mode, lambda: [(lane.family, lane.backend) for lane in self.all])
        if seen is not None:
            self.metrics.registry.register(seen.collector)
            if seen.health_key:
                self.health.details[seen.health_key] = seen.health

    @property
    def primary(self) -> FamilyLane:
        return self.all[0]

    def new_lane(self, family: Family, service_health: ServiceHealthServers) -> FamilyLane:
        cfg = self.cfg
        patience = Patience()
        run = PatientHost(host_of(self.run), patience)
        backend = registry.create(cfg.mode, run=run, sync_period=cfg.sync_period, variant=self.variant, cfg=cfg)
        backend.family = family
        return FamilyLane(family, backend, ChangeTracker(self.node_name), service_health, self.metrics.for_family(family),
                          patience=patience)  # fmt: skip

    async def active(self, node: Node | None, proc_ipv6: Path = PROC_IPV6) -> list[FamilyLane]:
        """The lanes of the families this node proxies now, the primary first; creates the
        second lane when the node turns dual-stack. A family the kernel lacks is logged once and
        left out, and so is a second family in a mode that programs one family only."""
        families = live_families(self.cfg, node)
        if self.primary.family != families[0]:
            # The node's primary address changed family (or became known): a second lane of
            # that family (its tables, listeners and quarantine) takes the lead, whole.
            log.info(kv("Primary IP family", ipFamily=families[0]))
            second = next((lane for lane in self.all[1:] if lane.family == families[0]), None)
            if second is None:
                self.all[0] = self.primary.moved_to(families[0], self.metrics)
            else:
                at = self.all.index(second)
                self.all[0], self.all[at] = second, self.all[0]
                self.all[at].tracker.request_full_sync()
            self.primary.tracker.request_full_sync()
        active = [self.primary]
        for family in families[1:]:
            found = next((lane for lane in self.all[1:] if lane.family == family), None)
            if found is None:
                found = await self._second(family, families[0], proc_ipv6)
            if found is not None:
                active.append(found)
        return active

    def show_quarantine(self) -> None:
        """Each family's quarantine in its metric, and every held Service's name in /healthz."""
        names: dict[str, None] = {}
        for lane in self.all:
            lane.metrics.quarantined_services.set(len(lane.quarantine))
            names.update(dict.fromkeys(lane.quarantine.names()))
        self.health.quarantined = tuple(names)

    async def interface_ips(self, family: Family, node: Node | None) -> tuple[str, ...] | None:
        """The interfaces' addresses that nodePortAddresses CIDRs select from, read at each sync
        as upstream does, and only when CIDRs select among them (None otherwise). A failed read
        is logged and the last good one kept (the Node's addresses before any, None): the
        NodePorts programmed on them stay."""
        traits = registry.nodeport_traits(self.cfg.mode)
        if nodeport_matches_all(nodeport_cidrs(self.cfg, node, family, traits)):
            return None
        try:
            self._interface_ips = tuple(a.ip for a in await asyncio.to_thread(interface_addresses, self.run))
        except Exception as exc:  # whatever the runner raises: the sync goes on without a fresh list
            log.error(kv("Failed to get node ip address matching nodeport cidrs, services with nodeport may not work as intended",
                         err=str(exc) or type(exc).__name__, CIDRs=list(nodeport_addresses(self.cfg, traits))))
        return self._interface_ips

    async def _second(self, family: Family, primary: Family, proc_ipv6: Path) -> FamilyLane | None:
        """A lane for the second family, or None (logged once) if this node cannot run one."""
        reason = self.lacking.get(family)
        if reason is None:
            reason = await asyncio.to_thread(
                kernel_lacks, family, self.cfg.mode, self.run, variant=self.variant, proc_ipv6=proc_ipv6
            )
        if reason is not None:
            if family not in self.lacking:
                log.warning(kv("Not proxying an IP family, the other keeps working", ipFamily=family, reason=reason))
                self.lacking[family] = reason
            return None
        log.info(kv("kube-proxy running in dual-stack mode", primaryIPFamily=primary))
        first = self.primary.service_health
        # Its own listeners (on this family's addresses), one connection budget for all.
        lane = self.new_lane(family, ServiceHealthServers(
            self.health, node_name=self.node_name, budget=first.budget, errors=first.errors, on_failure=first.on_failure,
        ))  # fmt: skip
        self.all.append(lane)
        return lane


def other(family: Family) -> Family:
    return Family.IPV4 if family.ipv6 else Family.IPV6


def live_families(cfg: ProxyConfig, node: Node | None) -> tuple[Family, ...]:
    """The families the live proxy runs, the primary first (see the module docstring)."""
    if registry.mode(cfg.mode).upstream_dual_stack:
        primary = primary_family(cfg, node)
        return (primary, other(primary))
    return node_families(cfg, node)


def kernel_lacks(family: Family, mode: str, run: Runner, *, variant: str = "", proc_ipv6: Path = PROC_IPV6) -> str | None:
    """Why this node's kernel cannot carry `family`'s rules in `mode`, or None if it can.

    As upstream's platform check: IPv4 is assumed; IPv6 needs the kernel's IPv6 stack, not
    disabled by net.ipv6.conf.all.disable_ipv6, and the mode's tool for it (ip6tables with a
    nat table; nft accepting an `ip6` table, checked with `nft -c`, which changes nothing): the
    mode's `ipv6_probe`.
    """
    if not family.ipv6:
        return None
    if not proc_ipv6.exists():
        return f"{proc_ipv6} is absent: the kernel has no IPv6"
    disabled = proc_ipv6 / "conf" / "all" / "disable_ipv6"
    try:
        if disabled.read_text().strip() == "1":
            return f"IPv6 is disabled ({disabled} is 1)"
    except OSError:
        pass  # upstream too reads it only to see a 1
    probe = registry.mode(mode).ipv6_probe
    if probe is None:
        return None
    argv, stdin = probe(variant)
    try:
        proc = run(argv, input=stdin, check=False)
    except OSError as exc:  # the tool is not installed
        return f"{argv[0]}: {exc.strerror or exc}"
    if proc.returncode != 0:
        return f"`{' '.join(argv)}` failed: {(proc.stderr or '').strip() or f'exit status {proc.returncode}'}"
    return None


def _tcp_liberal() -> bool:
    try:
        return TCP_BE_LIBERAL.read_text().strip() == "1"
    except OSError:
        return False


def _health_check_ips(opts: NodeOptions) -> tuple[str, ...]:
    """Where health-check node ports listen, as upstream: on the node's addresses that
    --nodeport-addresses selects, or on every address of the family when it selects all."""
    if opts.nodeport_match_all:
        return ("::",) if opts.family == Family.IPV6 else ("0.0.0.0",)
    return opts.nodeport_ips
