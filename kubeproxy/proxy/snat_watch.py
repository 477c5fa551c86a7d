"""The live SNAT gauge (`kubeproxy run --snat-watch=10s`): how full each masqueraded endpoint's port space is.

Masqueraded flows from the node's address to one endpoint ip:port differ only in the source port
the node picks (docs/labs.md, "The SNAT problem"); each holds its port until its conntrack entry
expires, and the lab's health checks start failing once about 86% of an endpoint's ports are in
use, every masqueraded flow counted. Every interval one bounded ctnetlink dump (backends/conntrack/ctnetlink.py) counts the tuples
`endpoint ip:port -> node address`, per endpoint of every UDP Service whose outside traffic is
masqueraded; the highest share per Service is exported (kubeproxy_snat_port_utilization) and a
Service passing the threshold is logged once per crossing (and once when it falls back).

The same counting over `conntrack -L` text or parsed flows (`sample`, `sample_text`) serves
`kubeproxy doctor`. Opt-in: a sample costs a dump of up to --snat-watch-max-entries entries
(bench/doctor_snat_watch.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client import Gauge as PromGauge

from kubeproxy.backends.conntrack import ctnetlink
from kubeproxy.backends.conntrack.flows import Flow
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.model.node_model import NodeView, ServicePortName
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.snat")

# MASQUERADE/SNAT without --to-ports keep a source port >= 1024 in 1024-65535 (nf_nat_l4proto_unique_tuple).
DEFAULT_SNAT_PORTS = (1024, 65535)
SNAT_PORTS = DEFAULT_SNAT_PORTS[1] - DEFAULT_SNAT_PORTS[0] + 1
# The share of an endpoint's SNAT ports in use, every masqueraded flow counted (the lab's own 100
# health-check queries/s included), from which the lab's health checks fail: (rate + 100) x timeout
# / 64,512 lies at 0.79-0.84 at the max healthy step and 0.88-0.94 at the first failing one of the
# three ramps it is fitted on (1,600/s at 30 s, 800/s at 60 s, 10,000/s at 5 s); the midpoint of
# that bracket predicted nine ramps it never saw within 10% (docs/labs.md, "The capacity rule" and
# "The prediction on runs it was not fitted on").
HEALTHY_FRACTION = 0.86
# Warn at about 70% of where health checks start failing, before they do.
DEFAULT_THRESHOLD = 0.6
CT_COUNT = "/proc/sys/net/netfilter/nf_conntrack_count"


@dataclass(frozen=True)
class Gauge:
    endpoint: str
    services: tuple[str, ...]
    in_use: int
    utilisation: float  # in_use / SNAT ports


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def masqueraded_endpoints(view: NodeView, masquerade_all: bool = False) -> dict[str, list[ServicePortName]]:
    """Endpoints whose traffic the proxy masquerades from outside clients: eTP=Cluster NodePort,
    LoadBalancer and external IPs (and every Service with --masquerade-all)."""
    out: dict[str, list[ServicePortName]] = {}
    for name, svc in view.services.items():
        if svc.protocol != "UDP":
            continue
        if masquerade_all or (svc.externally_accessible and not svc.external_policy_local):
            for e in view.endpoints.get(name, []):
                out.setdefault(e.address, []).append(name)
    return out


def _gauges(counts: Mapping[str, int], targets: Mapping[str, list[ServicePortName]]) -> list[Gauge]:
    gauges = [Gauge(a, tuple(sorted(str(n) for n in targets[a])), c, c / SNAT_PORTS) for a, c in counts.items()]
    return sorted(gauges, key=lambda g: (-g.utilisation, g.endpoint))


def sample(flows: Iterable[Flow], targets: Mapping[str, list[ServicePortName]], node_ips: set[str]) -> list[Gauge]:
    counts = dict.fromkeys(targets, 0)
    for f in flows:
        if f.protocol != "udp" or f.reply_dst not in node_ips or f.reply_dst == f.orig_src:
            continue
        key = f"[{f.reply_src}]:{f.reply_sport}" if ":" in f.reply_src else f"{f.reply_src}:{f.reply_sport}"
        if key in counts:
            counts[key] += 1
    return _gauges(counts, targets)


def sample_text(text: str, targets: Mapping[str, list[ServicePortName]], node_ips: set[str]) -> list[Gauge]:
    """`sample` straight from `conntrack -L -p udp` text, without building a Flow per line: a
    fifth of the cost at 100k entries (bench/doctor_snat_watch.py). Lines it cannot read are skipped."""
    counts = dict.fromkeys(targets, 0)
    for line in text.splitlines():
        first = line.find(" src=")
        second = line.find(" src=", first + 5) if first >= 0 else -1
        if second < 0 or not line.startswith("udp"):
            continue
        orig_src = line[first + 5: line.find(" ", first + 5)]
        reply = line[second + 1:].split(" ", 4)
        if len(reply) < 4 or not reply[1].startswith("dst=") or not reply[2].startswith("sport="):
            continue
        reply_dst = reply[1][4:]
        if reply_dst not in node_ips or reply_dst == orig_src:
            continue
        src = reply[0][4:]
        key = f"[{src}]:{reply[2][6:]}" if ":" in src else f"{src}:{reply[2][6:]}"
        if key in counts:
            counts[key] += 1
    return _gauges(counts, targets)


def sample_dump(dump: ctnetlink.Dump, targets: Mapping[str, list[ServicePortName]], node_ips: set[str]) -> list[Gauge]:
    """The gauges from a ctnetlink dump: per endpoint, the tuples `endpoint -> node address` (a
    cut-short dump's counts scaled up to the table, see backends/conntrack/ctnetlink.py)."""
    per_endpoint: dict[tuple[str, int], int] = {}
    for (src, dst, proto, port), n in dump.counts.items():
        if proto == "udp" and dst in node_ips:
            per_endpoint[(src, port)] = per_endpoint.get((src, port), 0) + n
    counts = {a: round(per_endpoint.get(_split(a), 0) * dump.scale) for a in targets}
    return _gauges(counts, targets)


def warnings(gauges: list[Gauge], limit: float = DEFAULT_THRESHOLD) -> list[str]:
    """A warning per endpoint whose share of its SNAT ports in use reaches `limit`."""
    return [
        f"Service {', '.join(g.services)}: endpoint {g.endpoint} holds {g.in_use:,} SNAT ports "
        f"({g.utilisation:.0%} of {SNAT_PORTS:,}); the lab's health checks fail from {HEALTHY_FRACTION:.0%}"
        for g in gauges if g.utilisation >= limit
    ]


def node_addresses(run: Runner = local_run) -> set[str]:
    """The node's own addresses (not loopback, not link-local): where MASQUERADE can map flows to."""
    proc = run(["ip", "-j", "addr", "show"], check=False, timeout=10)
    out: set[str] = set()
    if proc.returncode != 0:
        return out
    for link in json.loads(proc.stdout or "[]"):
        for a in link.get("addr_info", []):
            if a.get("scope") == "global" and a.get("local"):
                out.add(str(a["local"]))
    return out


def read_ct_count() -> int:
    try:
        with open(CT_COUNT) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


@dataclass
class WatchMetrics:
    """The gauge's metrics, registered in the proxy's own registry (no global state)."""

    registry: CollectorRegistry
    utilization: PromGauge = field(init=False)
    in_use: PromGauge = field(init=False)
    ports: PromGauge = field(init=False)
    duration: PromGauge = field(init=False)
    entries: PromGauge = field(init=False)

    def __post_init__(self) -> None:
        self.utilization = PromGauge(
            "kubeproxy_snat_port_utilization",
            "Highest share of the SNAT port space in use by one masqueraded endpoint of the Service (0-1)",
            ["service"], registry=self.registry)
        self.in_use = PromGauge(
            "kubeproxy_snat_ports_in_use", "Conntrack tuples from the Service's fullest endpoint to the node's address",
            ["service"], registry=self.registry)
        self.ports = PromGauge(
            "kubeproxy_snat_ports", "SNAT ports per endpoint and node address (MASQUERADE's 1024-65535)",
            registry=self.registry)
        self.duration = PromGauge(
            "kubeproxy_snat_watch_sample_duration_seconds", "How long the last SNAT sample took", registry=self.registry)
        self.entries = PromGauge(
            "kubeproxy_snat_watch_sampled_entries", "Conntrack entries the last SNAT sample read", registry=self.registry)
        self.ports.set(SNAT_PORTS)


ViewSource = Callable[[], list[NodeView]]  # per family, the views the kernel last accepted


@dataclass
class SnatWatch:
    """Samples every `interval` s until cancelled. `views()` gives the views the kernel last accepted
    (one per IP family: both families' endpoints are counted in the same dump)."""

    views: ViewSource
    registry: CollectorRegistry
    interval: float = 10.0
    threshold: float = DEFAULT_THRESHOLD
    max_entries: int = 20_000
    masquerade_all: bool = False
    run_cmd: Runner = local_run
    dump: Callable[..., ctnetlink.Dump] = ctnetlink.dump
    clock: Callable[[], float] = time.perf_counter
    samples: int = field(default=0, init=False)
    above: set[str] = field(default_factory=set, init=False)  # services past the threshold
    _exported: set[str] = field(default_factory=set, init=False)
    metrics: WatchMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = WatchMetrics(self.registry)

    async def run(self) -> None:
        last_error = ""
        while True:
            try:
                await asyncio.to_thread(self.sample_once)
                last_error = ""
            except Exception as exc:
                # The gauge is advice: a failed sample must never stop the proxy (it runs in the
                # proxy's task group). Said once per distinct error, not every interval.
                if str(exc) != last_error:
                    log.warning(kv("SNAT sample failed", err=str(exc)))
                last_error = str(exc)
            await asyncio.sleep(self.interval)

    def sample_once(self) -> list[Gauge]:
        targets: dict[str, list[ServicePortName]] = {}
        for view in self.views():
            for address, names in masqueraded_endpoints(view, self.masquerade_all).items():
                targets.setdefault(address, []).extend(names)
        started = self.clock()
        if targets:
            node_ips = node_addresses(self.run_cmd)
            d = self.dump(node_ips, ("udp",), max_entries=self.max_entries, total=read_ct_count())
            gauges = sample_dump(d, targets, node_ips)
            self.metrics.entries.set(d.entries)
        else:
            gauges = []
        self.metrics.duration.set(self.clock() - started)
        self.samples += 1
        self._export(gauges, targets)
        return gauges

    def _export(self, gauges: list[Gauge], targets: Mapping[str, list[ServicePortName]]) -> None:
        worst: dict[str, Gauge] = {}
        for g in gauges:  # sorted worst first
            for svc in g.services:
                worst.setdefault(svc, g)
        current = {str(n) for names in targets.values() for n in names}
        for svc in self.above - current:
            self.above.discard(svc)
        for svc in self._exported - set(worst):  # Services gone, or no longer masqueraded
            self.metrics.utilization.remove(svc)
            self.metrics.in_use.remove(svc)
        self._exported = set(worst)
        for svc, g in sorted(worst.items()):
            self.metrics.utilization.labels(service=svc).set(g.utilisation)
            self.metrics.in_use.labels(service=svc).set(g.in_use)
            if g.utilisation >= self.threshold and svc not in self.above:
                self.above.add(svc)
                log.warning(kv(
                    "SNAT ports nearly exhausted: new masqueraded flows to this endpoint will be dropped",
                    service=svc, endpoint=g.endpoint, inUse=g.in_use, ports=SNAT_PORTS,
                    utilization=round(g.utilisation, 3), threshold=self.threshold,
                    healthChecksFailFrom=HEALTHY_FRACTION))
            elif g.utilisation < self.threshold and svc in self.above:
                self.above.discard(svc)
                log.info(kv("SNAT port use back below the threshold", service=svc, endpoint=g.endpoint,
                            inUse=g.in_use, utilization=round(g.utilisation, 3)))
