"""The KubeProxyNFTablesLocalhostNodePorts metrics, read at scrape time from each family's proxier.

Upstream v1.37.2 (pkg/proxy/metrics) registers three when the gate is on in nftables mode:
the listener gauge and creation-failure counter of the loopback relay, and the packets of the
table's named reject counters (`localhost-nodeport-rejected-<protocol>`), all by `ip_family`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeproxy.backends.nftables.proxier import NftablesProxier
from kubeproxy.backends.nftables.render import localhost_rejected_counter
from kubeproxy.model.metrics import (
    LOCALHOST_NODEPORT_LISTENER_FAILURES,
    LOCALHOST_NODEPORT_LISTENERS,
    LOCALHOST_NODEPORT_REJECTED_PACKETS,
)
from kubeproxy.model.options import LOCALHOST_NODEPORT_REJECTABLE, Family

log = logging.getLogger("kubeproxy.nftables")

Lanes = Callable[[], Iterable[tuple[Family, object]]]


class LocalhostNodePortCollector(Collector):
    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time

    def collect(self) -> Iterator[Metric]:
        proxiers = [(f, b) for f, b in self._lanes() if isinstance(b, NftablesProxier) and b.localhost_nodeports]
        if not proxiers:
            return
        listeners = GaugeMetricFamily(*LOCALHOST_NODEPORT_LISTENERS, labels=["ip_family"])
        failures = CounterMetricFamily(*LOCALHOST_NODEPORT_LISTENER_FAILURES, labels=["ip_family"])
        rejected = CounterMetricFamily(*LOCALHOST_NODEPORT_REJECTED_PACKETS, labels=["ip_family", "protocol"])
        for family, proxier in proxiers:
            if proxier.localhost is not None:
                listeners.add_metric([family], proxier.localhost.listeners)
                if proxier.localhost.creation_failures:
                    failures.add_metric([family], proxier.localhost.creation_failures)
            try:
                packets = proxier.rejected_localhost_packets()
            except Exception as exc:
                # Upstream logs and leaves the samples out; a scrape must not fail over it.
                log.error('"failed to list nftables counters" ipFamily="%s" err="%s"', family, exc)
                continue
            for protocol in LOCALHOST_NODEPORT_REJECTABLE:
                name = localhost_rejected_counter(protocol)
                if name in packets:
                    rejected.add_metric([family, protocol], packets[name])
        yield from (m for m in (listeners, failures, rejected) if m.samples)
