"""The userspace relay's state in /metrics and /healthz, read at scrape time from each family's relay.

The relay keeps plain counters on its own thread (relay_loop.RelayStats); nothing is pushed to the
Prometheus registry per connection, so a busy relay pays nothing for its metrics. Names are in the
`kubeproxy_` namespace, labelled by `ip_family` like upstream's other metrics (a dual-stack node
runs one relay per family).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeproxy.backends.userspace.proxier import UserspaceProxier
from kubeproxy.backends.userspace.relay_loop import RelayStats
from kubeproxy.model.options import Family

# Each lane's (family, backend), read at every scrape: lanes come and go with the node's families.
Lanes = Callable[[], Iterable[tuple[Family, object]]]

GAUGES: tuple[tuple[str, str, str], ...] = (
    ("kubeproxy_userspace_relay_listeners", "Service ports the userspace relay listens for", "listeners"),
    ("kubeproxy_userspace_relay_connections", "Open TCP connections relayed by the userspace proxy", "connections"),
    ("kubeproxy_userspace_relay_udp_flows", "UDP client flows the userspace relay holds open", "udp_flows"),
    ("kubeproxy_userspace_relay_open_fds", "File descriptors the userspace relay holds for connections and flows", "fds"),
    ("kubeproxy_userspace_relay_fd_budget", "File descriptors the userspace relay may hold (from RLIMIT_NOFILE)",
     "fd_budget"),
)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("kubeproxy_userspace_relay_accepted_connections", "TCP connections accepted by the userspace relay", "accepted"),
    ("kubeproxy_userspace_relay_failed_dials", "Connects from the userspace relay to an endpoint that failed",
     "failed_dials"),
    ("kubeproxy_userspace_relay_no_endpoint", "Connections or datagrams the userspace relay had no endpoint for",
     "no_endpoint"),
    ("kubeproxy_userspace_relay_fd_limit_hits", "Connections or flows refused because the fd budget was used up",
     "fd_limit_hits"),
)


def relay_stats(lanes: Lanes) -> list[tuple[Family, RelayStats]]:
    out: list[tuple[Family, RelayStats]] = []
    for family, backend in lanes():
        if isinstance(backend, UserspaceProxier) and backend.server is not None:
            out.append((family, backend.server.stats()))
    return out


class RelayCollector(Collector):
    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time

    def collect(self) -> Iterator[Metric]:
        stats = relay_stats(self._lanes)
        for name, doc, attr in GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["ip_family"])
            for family, s in stats:
                gauge.add_metric([str(family)], getattr(s, attr))
            yield gauge
        for name, doc, attr in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=["ip_family"])
            for family, s in stats:
                counter.add_metric([str(family)], getattr(s, attr))
            yield counter


def relay_health(lanes: Lanes) -> dict[str, Any]:
    """/healthz's `userspaceRelay`: per family, whether the relay runs and takes new connections."""
    return {
        str(family): {"running": s.running, "acceptingConnections": s.accepting, "listeners": s.listeners,
                      "connections": s.connections, "udpFlows": s.udp_flows}
        for family, s in relay_stats(lanes)
    }  # fmt: skip
