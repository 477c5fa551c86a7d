"""The SNAT gauge: how full each masqueraded endpoint's port space is right now.

One sample lists the node's UDP conntrack entries once (`conntrack -L -p udp`), counts the
masqueraded ones per endpoint ip:port (reply tuple from the endpoint to one of the node's
addresses, which is not the flow's own source) and compares each count with the SNAT port space.
The highest utilisation is the gauge; an endpoint past `warn_at` of the point where the lab's
health checks start failing gets a warning naming its Service. The cost of a sample at 100k
entries is measured by bench/doctor_snat_watch.py. Not yet wired into `kubeproxy run`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubeproxy.backends.conntrack.flows import Flow
from kubeproxy.doctor.snat import DEFAULT_SNAT_PORTS, HEALTHY_FRACTION
from kubeproxy.proxy.model import NodeView, ServicePortName

SNAT_PORTS = DEFAULT_SNAT_PORTS[1] - DEFAULT_SNAT_PORTS[0] + 1


@dataclass(frozen=True)
class Gauge:
    endpoint: str
    services: tuple[str, ...]
    in_use: int
    utilisation: float  # in_use / SNAT ports


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


def sample(flows: Iterable[Flow], targets: Mapping[str, list[ServicePortName]], node_ips: set[str]) -> list[Gauge]:
    counts = dict.fromkeys(targets, 0)
    for f in flows:
        if f.protocol != "udp" or f.reply_dst not in node_ips or f.reply_dst == f.orig_src:
            continue
        key = f"{f.reply_src}:{f.reply_sport}"
        if key in counts:
            counts[key] += 1
    gauges = [Gauge(a, tuple(sorted(str(n) for n in targets[a])), c, c / SNAT_PORTS) for a, c in counts.items()]
    return sorted(gauges, key=lambda g: -g.utilisation)


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
        key = f"{reply[0][4:]}:{reply[2][6:]}"
        if key in counts:
            counts[key] += 1
    gauges = [Gauge(a, tuple(sorted(str(n) for n in targets[a])), c, c / SNAT_PORTS) for a, c in counts.items()]
    return sorted(gauges, key=lambda g: -g.utilisation)


def warnings(gauges: list[Gauge], warn_at: float = 0.8) -> list[str]:
    """A warning per endpoint past `warn_at` of the utilisation where health checks start to fail."""
    limit = warn_at * HEALTHY_FRACTION
    return [
        f"Service {', '.join(g.services)}: endpoint {g.endpoint} holds {g.in_use:,} SNAT ports "
        f"({g.utilisation:.0%} of {SNAT_PORTS:,}); the lab's health checks fail from {HEALTHY_FRACTION:.0%}"
        for g in gauges if g.utilisation >= limit
    ]
