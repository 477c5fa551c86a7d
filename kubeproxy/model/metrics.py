"""kube-proxy's Prometheus metrics, with upstream's names, types, labels and buckets (v1.33+).

`ProxyMetrics` owns its registry (no process-global state) and registers what upstream
registers for the proxy mode: the common set for every mode, plus the families the mode's
record lists (`Mode.metrics` in backends/registry.py). Metrics of another mode still exist,
so a caller may update them unconditionally; they are just not exposed, as upstream.

Most metrics carry an `ip_family` label ("IPv4"/"IPv6"). Each family's syncs update them
through the view `for_family` gives, whose series carry that family's label:

    v6 = metrics.for_family("IPv6")
    v6.sync_duration.observe(0.12)                       # ...{ip_family="IPv6"}
    v6.iptables_total.labels(table="nat").set(1200)      # ...{ip_family="IPv6",table="nat"}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeproxy.model.component_metrics import BuildInfo, FeatureEnabled

if TYPE_CHECKING:
    from kubeproxy.model.contract import SyncReport

log = logging.getLogger(__name__)

IP_FAMILIES = ("IPv4", "IPv6")
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    return [start * factor**i for i in range(count)]


def linear_buckets(start: float, width: float, count: int) -> list[float]:
    return [start + width * i for i in range(count)]


SYNC_BUCKETS = exponential_buckets(0.001, 2, 15)  # 1 ms … 16.384 s
# Upstream merges its ranges onto a leading 0 bucket.
NETWORK_PROGRAMMING_BUCKETS = [
    0.0,
    *linear_buckets(0.25, 0.25, 2),
    *linear_buckets(1, 1, 59),
    *linear_buckets(60, 5, 12),
    *linear_buckets(120, 30, 7),
]

# The nfacct counters upstream's iptables mode exposes as counters of its own.
NFACCT_METRICS = (
    (
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "packets dropped by iptables to work around conntrack problems",
        "ct_state_invalid_dropped_pkts",
    ),
    (
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "Number of packets accepted on nodeports of loopback interface",
        "localhost_nps_accepted_pkts",
    ),
)

# nftables mode with KubeProxyNFTablesLocalhostNodePorts (name, help), by ip_family; the
# rejected packets also by protocol. Collected by backends/nftables/localhost_metrics.py.
LOCALHOST_NODEPORT_LISTENERS = (
    "kubeproxy_nftables_localhost_nodeport_listeners",
    "Number of active localhost NodePort userspace proxy listeners.",
)
LOCALHOST_NODEPORT_LISTENER_FAILURES = (
    "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
    "Number of localhost NodePort userspace proxy listener creation failures.",
)
LOCALHOST_NODEPORT_REJECTED_PACKETS = (
    "kubeproxy_nftables_localhost_nodeport_rejected_packets_total",
    "Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected "
    "when the localhost NodePort proxy is not running",
)

NfacctReader = Callable[[str], int | None]


M = TypeVar("M", Counter, Gauge, Histogram)


class _Child(Generic[M]):
    """The owner's family's series of ProxyMetrics's vector of the same name. A series is made
    on first use, not before: a labelled series exists only once it is used, in Go as here."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._vec = f"_{name}"

    def __get__(self, obj: FamilyMetrics, objtype: type | None = None) -> M:
        vec: M = getattr(obj.metrics, self._vec)
        return vec.labels(ip_family=obj.family)


class _Labelled(Generic[M]):
    """Like `_Child` for a vector with more labels: `.labels(**others)` adds `ip_family`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._vec = f"_{name}"

    def __get__(self, obj: FamilyMetrics, objtype: type | None = None) -> _BoundLabels[M]:
        return _BoundLabels(getattr(obj.metrics, self._vec), obj.family)


class _BoundLabels(Generic[M]):
    def __init__(self, vec: M, family: str) -> None:
        self._vec: M = vec
        self._family = family

    def labels(self, **labels: str) -> M:
        return self._vec.labels(ip_family=self._family, **labels)


class FamilyMetrics:
    """ProxyMetrics's series for one IP family: what that family's syncs update."""

    sync_duration = _Child[Histogram]()
    sync_full_duration = _Child[Histogram]()
    sync_partial_duration = _Child[Histogram]()
    last_timestamp = _Child[Gauge]()
    last_queued_timestamp = _Child[Gauge]()
    network_programming_duration = _Child[Histogram]()
    restore_failures_total = _Child[Counter]()
    partial_restore_failures_total = _Child[Counter]()
    nftables_sync_failures_total = _Child[Counter]()
    nftables_cleanup_failures_total = _Child[Counter]()
    conntrack_reconciler_sync_duration = _Child[Histogram]()
    conntrack_reconciler_deleted_entries_total = _Child[Counter]()
    quarantined_services = _Child[Gauge]()
    iptables_total = _Labelled[Gauge]()
    iptables_last = _Labelled[Gauge]()
    no_local_endpoints_total = _Labelled[Gauge]()

    def __init__(self, metrics: ProxyMetrics, family: str) -> None:
        if family not in IP_FAMILIES:
            raise ValueError(f"ip_family {family!r}: want one of {', '.join(IP_FAMILIES)}")
        self.metrics = metrics
        self.family = str(family)

    def record_duration(self, full: bool, elapsed: float) -> None:
        """How long a sync of this family took, whether it succeeded or not (upstream observes the
        latencies in a deferred function, so a failed sync is timed too)."""
        self.sync_duration.observe(elapsed)
        (self.sync_full_duration if full else self.sync_partial_duration).observe(elapsed)

    def record_sync(self, report: SyncReport, elapsed: float, now: float, latencies: Iterable[float]) -> None:
        """A successful sync of this family: its duration, rule counts and programming latencies."""
        self.record_duration(report.full, elapsed)
        self.last_timestamp.set(now)
        for table, count in report.rule_counts.items():
            self.iptables_total.labels(table=table).set(count)
        for table, count in report.written_rule_counts.items():
            self.iptables_last.labels(table=table).set(count)
        self.no_local_endpoints_total.labels(traffic_policy="internal").set(report.no_local_endpoints_internal)
        self.no_local_endpoints_total.labels(traffic_policy="external").set(report.no_local_endpoints_external)
        for latency in latencies:
            self.network_programming_duration.observe(latency)


class ProxyMetrics:
    """The metrics one proxy updates and `/metrics` exposes."""

    def __init__(
        self,
        mode_metrics: Collection[str] = (),
        *,
        nfacct: NfacctReader | None = None,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        """`mode_metrics`: the mode's own families, by name (its record's `metrics` in
        backends/registry.py; `registry.proxy_metrics` builds a mode's). `nfacct(name)` returns
        an nfacct counter's packet count (None: unavailable); given, the two nfacct-backed
        counters are exposed, read at scrape time.
        `feature_gates`: the proxy's settings, for `kubernetes_feature_enabled`."""
        self._families: dict[str, FamilyMetrics] = {}
        self.registry = CollectorRegistry()
        fam = ["ip_family"]

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(f"kubeproxy_{name}", doc, fam, buckets=buckets, registry=None)

        self._sync_duration = histogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", SYNC_BUCKETS)
        self._sync_full_duration = histogram(
            "sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", SYNC_BUCKETS
        )
        self._sync_partial_duration = histogram(
            "sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", SYNC_BUCKETS
        )
        self._last_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            fam,
            registry=None,
        )
        self._last_queued_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            fam,
            registry=None,
        )
        self._network_programming_duration = histogram(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            NETWORK_PROGRAMMING_BUCKETS,
        )
        self.endpoint_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes", registry=None
        )
        self.endpoint_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes", registry=None
        )
        self.service_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes", registry=None
        )
        self.service_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes", registry=None
        )
        self._restore_failures_total = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            fam,
            registry=None,
        )
        self._partial_restore_failures_total = Counter(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "Cumulative proxy iptables partial restore failures",
            fam,
            registry=None,
        )
        self._iptables_total = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            [*fam, "table"],
            registry=None,
        )
        self._iptables_last = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            [*fam, "table"],
            registry=None,
        )
        self._nftables_sync_failures_total = Counter(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "Cumulative proxy nftables sync failures",
            fam,
            registry=None,
        )
        self._nftables_cleanup_failures_total = Counter(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            "Cumulative proxy nftables cleanup failures",
            fam,
            registry=None,
        )
        # Ours (no upstream counterpart): Services whose rules the kernel refused, set aside.
        self._quarantined_services = Gauge(
            "kubeproxy_sync_proxy_rules_quarantined_services",
            "Services whose rules the kernel refused; they keep their last accepted rules, or none",
            fam,
            registry=None,
        )
        self.proxy_healthz_total = Counter(
            "kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", ["code"], registry=None
        )
        self.proxy_livez_total = Counter(
            "kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status", ["code"], registry=None
        )
        self._no_local_endpoints_total = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            [*fam, "traffic_policy"],
            registry=None,
        )
        self._conntrack_reconciler_sync_duration = histogram(
            "conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", SYNC_BUCKETS
        )
        self._conntrack_reconciler_deleted_entries_total = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            fam,
            registry=None,
        )

        common = [
            self._sync_duration,
            self._last_queued_timestamp,
            self._last_timestamp,
            self.endpoint_changes_pending,
            self.endpoint_changes_total,
            self.service_changes_pending,
            self.service_changes_total,
            self.proxy_healthz_total,
            self.proxy_livez_total,
            self._network_programming_duration,
            self._no_local_endpoints_total,
            self._conntrack_reconciler_sync_duration,
            self._conntrack_reconciler_deleted_entries_total,
            self._quarantined_services,
        ]
        optional = (
            self._sync_full_duration,
            self._sync_partial_duration,
            self._restore_failures_total,
            self._partial_restore_failures_total,
            self._iptables_total,
            self._iptables_last,
            self._nftables_sync_failures_total,
            self._nftables_cleanup_failures_total,
        )
        by_name = {_exposed_name(collector): collector for collector in optional}
        for collector in (*common, *(by_name[name] for name in mode_metrics)):
            self.registry.register(collector)
        if nfacct is not None:
            self.registry.register(_NfacctCollector(nfacct))
        # Upstream's Go runtime exposes process_* metrics; these are the same names for this process.
        ProcessCollector(registry=self.registry)
        self.registry.register(BuildInfo())
        self.registry.register(FeatureEnabled(feature_gates))

    def for_family(self, family: str) -> FamilyMetrics:
        """The series labelled with `family` ("IPv4" or "IPv6"; ValueError for another)."""
        bound = self._families.get(family)
        if bound is None:
            bound = self._families[family] = FamilyMetrics(self, family)
        return bound

    def exposition(self) -> bytes:
        """The registry in Prometheus text format 0.0.4, as upstream's /metrics writes it."""
        return generate_latest(_WithoutCreated(self.registry))


def _exposed_name(collector: Counter | Gauge | Histogram) -> str:
    """The family's name as /metrics shows it (a counter's with its `_total`), as modes list theirs."""
    family = next(iter(collector.describe()))
    name: str = family.name
    return name + "_total" if family.type == "counter" else name


class _WithoutCreated:
    """The registry minus prometheus_client's `*_created` series, which Go's client never writes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _NfacctCollector(Collector):
    def __init__(self, read: NfacctReader) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return []  # values come from the kernel at scrape time

    def collect(self) -> Iterator[Metric]:
        for name, doc, counter in NFACCT_METRICS:
            try:
                packets = self._read(counter)
            except Exception as exc:
                # Upstream logs and leaves the metric out; a scrape must not fail over it.
                log.error('"failed to collect nfacct counter" counter="%s" err="%s"', counter, exc)
                continue
            if packets is not None:
                yield CounterMetricFamily(name, doc, value=packets)
