"""SNAT capacity: how many new flows per second a masqueraded service address can take.

Masqueraded flows from the node's address to one endpoint ip:port differ only in the source port
the node picks, and each holds its port until its conntrack entry expires. So (docs/labs.md, "The SNAT
problem", measured by `kubeproxy lab dns --ramp`):

    new flows/s per endpoint  <=  SNAT ports / timeout

and the seed's health check (100 queries, all answered within 1 s) starts failing once about 86%
(HEALTHY_FRACTION) of an endpoint's ports are in use, because the kernel's port search gives up
before the last port is taken. Every masqueraded flow to the endpoint holds a port, not only the
load being predicted: other flows (a health check, other clients) come off the onset, spread over
the endpoints as the Service's traffic is. The rules cannot show them; the caller gives their rate
(`doctor --snat-other-flows`, 0 unless given) and the finding says what it assumed. Fitted on three
ramps at 64,512 ports, the rule was checked on nine it never saw (docs/labs.md, "The prediction on
runs it was not fitted on").
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.backends import registry
from kubeproxy.backends.nftables.annotations import UDP_CONNTRACK_TIMEOUT, udp_conntrack_timeout
from kubeproxy.doctor.address_probe import Frontend, Probe, hostport, is_masquerade, masquerade_ports, random_fully
from kubeproxy.doctor.facts import TCP_TIME_WAIT, UDP_TIMEOUT, NodeFacts
from kubeproxy.doctor.findings import Finding
from kubeproxy.model.node_model import NodeView, ServicePortName
from kubeproxy.model.options import Family
from kubeproxy.proxy.snat_watch import DEFAULT_SNAT_PORTS, HEALTHY_FRACTION  # shared with the live gauge

# A per-Service UDP timeout worth suggesting: the lab's nft-ct-timeout world (every check passed up to 10,000/s).
SUGGESTED_UDP_TIMEOUT = 5


@dataclass
class EndpointUse:
    address: str
    probability: float
    in_use: int | None = None


def _fmt_rate(r: float) -> str:
    return f"{r:,.0f}/s"


def snat_findings(probes: list[Probe], view: NodeView, facts: NodeFacts, mode: str,
                  family: Family = Family.IPV4, other_flows: float = 0.0) -> list[Finding]:
    """`other_flows`: new masqueraded flows/s to each Service's endpoints besides the load being
    predicted (a health check, other clients), spread over them as the Service's traffic is."""
    by_name: dict[ServicePortName, list[Probe]] = {}
    for p in probes:
        by_name.setdefault(p.name, []).append(p)
    return [f for name, ps in sorted(by_name.items())
            if (f := _finding(name, ps, view, facts, mode, family, other_flows)) is not None]


def _finding(name: ServicePortName, probes: list[Probe], view: NodeView, facts: NodeFacts, mode: str,
             family: Family, other_flows: float) -> Finding | None:
    svc = view.services[name]
    masq_fronts: list[Frontend] = []
    endpoints: dict[str, EndpointUse] = {}
    ports: tuple[int, int] | None = None
    fully = False
    masq_rule = ""
    for p in probes:
        hit = False
        for o in p.outcomes:
            # A MASQUERADE hop counts even if the tracer could not pick the address (an output device
            # without one, as calico-style pod veths are: the kernel then takes another device's).
            if o.dnat is None or not (o.masquerade or any(is_masquerade(h) for h in o.path)):
                continue
            hit = True
            ip, port = o.dnat
            addr = hostport(ip, port if port is not None else p.frontend.port, p.frontend.v6)
            use = endpoints.setdefault(addr, EndpointUse(addr, 0.0))
            use.probability = max(use.probability, float(o.probability))
            for h in o.path:
                if is_masquerade(h):
                    ports = masquerade_ports(h) or ports
                    fully = fully or random_fully(h)
                    masq_rule = masq_rule or (f"{h.table} {h.chain} line {h.line}: {h.text}" if h.line else h.text)
        if hit:
            masq_fronts.append(p.frontend)
    if not masq_fronts:
        return None

    lo, hi = ports or DEFAULT_SNAT_PORTS
    n_ports = hi - lo + 1
    proto = svc.protocol
    evidence: list[str] = []
    notes: list[str] = []
    if proto == "UDP":
        seconds, warning = udp_conntrack_timeout(svc.annotations, f"{name.namespace}/{name.name}")
        if seconds is not None and _honours_udp_annotation(mode):
            timeout, timeout_source = seconds, f"annotation {UDP_CONNTRACK_TIMEOUT}"
        else:
            timeout, timeout_source = facts.int_sysctl(UDP_TIMEOUT) or 30, UDP_TIMEOUT
            if seconds is not None:
                notes.append(
                    f"annotation {UDP_CONNTRACK_TIMEOUT} is honoured in {_annotation_modes()} mode only; this node runs {mode}"
                )
            if warning:
                notes.append(warning)
    else:
        # A closed TCP connection keeps its entry (and its port) for TIME_WAIT; its lifetime adds to that.
        timeout = facts.int_sysctl(TCP_TIME_WAIT) or 120
        timeout_source = f"{TCP_TIME_WAIT} (a lower bound on a connection's hold)"
        notes.append("TCP: an estimate, not measured in the lab; kernels that reuse ports of connections in "
                     "TIME_WAIT for new ones raise it")
    bound_ep = n_ports / timeout
    fail_ep = HEALTHY_FRACTION * bound_ep
    # Traffic splits by the rules' probabilities: the endpoint with the largest share runs out first.
    top = max(u.probability for u in endpoints.values()) or 1.0
    bound_svc = bound_ep / top
    fail_svc = max(0.0, fail_ep / top - other_flows)

    if facts.flows is not None:
        node_ips = facts.node_ips
        counts: dict[str, int] = {a: 0 for a in endpoints}
        pr = proto.lower()
        for f in facts.flows:
            if f.protocol != pr or f.reply_dst not in node_ips or f.reply_dst == f.orig_src:
                continue
            key = f"[{f.reply_src}]:{f.reply_sport}" if ":" in f.reply_src else f"{f.reply_src}:{f.reply_sport}"
            if key in counts:
                counts[key] += 1
        for a, c in counts.items():
            endpoints[a].in_use = c

    subject = (f"Service {name.namespace}/{name.name}" + (f":{name.port}" if name.port else "")
               + (f" ({proto}, IPv6)" if family.ipv6 else f" ({proto})"))
    external = any(f.external for f in masq_fronts)
    evidence.append("masqueraded to the node's address: " + ", ".join(str(f) for f in masq_fronts))
    if masq_rule:
        evidence.append(f"SNAT by {masq_rule}")
    evidence.append(
        f"SNAT ports {lo}-{hi} ({n_ports:,})" + (", --random-fully" if fully else "")
        + ("" if ports else " (MASQUERADE's range for source ports >= 1024)")
    )
    evidence.append(f"conntrack timeout {timeout} s ({timeout_source})")
    evidence.append(
        f"bound {_fmt_rate(bound_ep)} new flows per endpoint ({n_ports:,} / {timeout} s), "
        f"{_fmt_rate(bound_svc)} for the service over {len(endpoints)} endpoint(s)"
    )
    evidence.append(
        f"health checks predicted to fail from {_fmt_rate(fail_svc)}: once {HEALTHY_FRACTION:.0%} of an endpoint's "
        f"ports are in use (the lab's measured share), "
        + (f"{_fmt_rate(other_flows)} of other masqueraded flows to these endpoints counted"
           if other_flows else "assuming no other masqueraded flows to these endpoints (give their rate: "
           "--snat-other-flows)")
    )
    worst_use = 0.0
    for u in sorted(endpoints.values(), key=lambda u: u.address):
        line = f"endpoint {u.address}: {u.probability:.0%} of new flows"
        if u.in_use is not None:
            util = u.in_use / n_ports
            worst_use = max(worst_use, util)
            line += f", {u.in_use:,} SNAT ports in use ({util:.0%}; ~{_fmt_rate(u.in_use / timeout)} now)"
        evidence.append(line)
    evidence.extend(notes)

    fixes: list[str] = []
    if external and svc.externally_accessible:
        fixes.append(
            "externalTrafficPolicy: Local: external traffic keeps its client address and is not masqueraded "
            "(needs a ready endpoint on every node that receives the traffic)"
        )
    if proto == "UDP" and timeout > SUGGESTED_UDP_TIMEOUT:
        gain = timeout / SUGGESTED_UDP_TIMEOUT
        how = (f"annotate the Service {UDP_CONNTRACK_TIMEOUT}: {SUGGESTED_UDP_TIMEOUT}s" if _honours_udp_annotation(mode) else
               f"run in {_annotation_modes()} mode and annotate the Service {UDP_CONNTRACK_TIMEOUT}: {SUGGESTED_UDP_TIMEOUT}s "
               f"(or lower {UDP_TIMEOUT} for the whole node)")
        fixes.append(f"{how}: the bound rises {gain:.0f}x, health checks fail from "
                     f"~{_fmt_rate(max(0.0, fail_ep * gain / top - other_flows))}")
    fixes.append(f"more endpoints: each one adds ~{_fmt_rate(fail_ep)} before health checks fail (linear)")
    if not external:
        fixes.insert(0, "traffic to the ClusterIP from outside the cluster's pod range is masqueraded: "
                        "check --cluster-cidr / --detect-local-mode, or send outside clients to an external address")

    if worst_use >= HEALTHY_FRACTION:
        severity = "critical"
        title = f"SNAT ports nearly exhausted now ({worst_use:.0%} in use): new flows are being dropped"
    elif external and proto == "UDP":
        severity = "warning"
        title = f"masqueraded: health checks will fail above ~{_fmt_rate(fail_svc)} (bound {_fmt_rate(bound_svc)})"
    elif external:
        severity = "info"
        title = f"masqueraded: at most ~{_fmt_rate(bound_svc)} new connections while each holds its port for {timeout} s"
    else:
        severity = "info"
        title = f"ClusterIP traffic from outside is masqueraded: bound {_fmt_rate(bound_svc)}"
    data = {
        "protocol": proto,
        "family": family.value,
        "frontends": [{"kind": f.kind, "address": f.address} for f in masq_fronts],
        "snat_ports": {"low": lo, "high": hi, "count": n_ports, "random_fully": fully, "from_rule": ports is not None},
        "timeout_seconds": timeout,
        "timeout_source": timeout_source,
        "bound_per_endpoint": round(bound_ep, 1),
        "bound_per_service": round(bound_svc, 1),
        "health_fail_per_endpoint": round(fail_ep, 1),
        "health_fail_per_service": round(fail_svc, 1),
        "healthy_fraction": HEALTHY_FRACTION,
        "other_flows_per_service": other_flows,
        "endpoints": [
            {"address": u.address, "share": round(u.probability, 4), "in_use": u.in_use,
             "utilisation": None if u.in_use is None else round(u.in_use / n_ports, 4)}
            for u in sorted(endpoints.values(), key=lambda u: u.address)
        ],
    }
    return Finding(severity, "snat-capacity", subject, title, evidence, fixes, data, score=fail_svc)


def _honours_udp_annotation(mode: str) -> bool:
    found = registry.MODES.get(mode)
    return found is not None and found.udp_timeout_annotation


def _annotation_modes() -> str:
    return " or ".join(m.name for m in registry.MODES.values() if m.udp_timeout_annotation)
