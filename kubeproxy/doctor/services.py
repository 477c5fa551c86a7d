"""Services that cannot work as configured on this node (upstream's endpoint selection,
kubeproxy.model.topology), and services whose addresses the rules do not translate."""

from __future__ import annotations

from collections.abc import Mapping

from kubeproxy.cluster.objects import LABEL_ZONE
from kubeproxy.doctor.address_probe import Probe
from kubeproxy.doctor.findings import Finding
from kubeproxy.model.node_model import NodeView, ServicePortName
from kubeproxy.model.topology import categorize
from kubeproxy.netfilter.ruleset import Ruleset


def _subject(name: ServicePortName) -> str:
    return f"Service {name.namespace}/{name.name}" + (f":{name.port}" if name.port else "") + f" ({name.protocol})"


def service_findings(view: NodeView, node_name: str, node_labels: Mapping[str, str]) -> list[Finding]:
    out: list[Finding] = []
    zone = node_labels.get(LABEL_ZONE, "")
    for name, svc in sorted(view.services.items()):
        eps = view.endpoints.get(name, [])
        subj = _subject(name)
        if not eps:
            out.append(Finding("warning", "no-endpoints", subj, "no endpoints: new connections are rejected",
                               ["no EndpointSlice lists an address for this port"],
                               ["check the Service's selector and targetPort, and that its pods exist"]))
            continue
        cat = categorize(eps, svc, node_name, node_labels)
        if not cat.has_any:
            out.append(Finding("warning", "no-ready-endpoints", subj,
                               f"none of its {len(eps)} endpoint(s) is ready or serving: new connections are rejected",
                               [f"{e.address}: ready={e.ready} serving={e.serving} terminating={e.terminating}"
                                for e in eps[:10]],
                               ["check the pods' readiness probes"]))
            continue
        if cat.cluster and all(e.terminating for e in cat.cluster):
            out.append(Finding("warning", "only-terminating", subj,
                               "served only by terminating endpoints (upstream's fallback): it stops when they are gone",
                               [f"{e.address}: terminating, serving" for e in cat.cluster[:10]],
                               ["scale the workload up or check why new pods are not ready"]))
        if svc.external_policy_local and svc.externally_accessible and not cat.local:
            out.append(Finding("warning", "no-local-endpoint", subj,
                               "externalTrafficPolicy: Local with no endpoint on this node: "
                               "external traffic arriving here is dropped",
                               [f"{len(eps)} endpoint(s), none on node {node_name or '(unknown)'}"]
                               + ([f"health check node port {svc.health_check_node_port} answers 503 so load balancers "
                                   "skip this node"] if svc.health_check_node_port else []),
                               ["send external traffic only to nodes with an endpoint (a LoadBalancer's health check "
                                "does this), or use externalTrafficPolicy: Cluster (masqueraded: see SNAT capacity)"]))
        if svc.internal_policy_local and not cat.local:
            out.append(Finding("warning", "no-local-endpoint", subj,
                               "internalTrafficPolicy: Local with no endpoint on this node: "
                               "pods on this node cannot reach it",
                               [f"{len(eps)} endpoint(s), none on node {node_name or '(unknown)'}"],
                               ["run an endpoint on every node (a DaemonSet) or use internalTrafficPolicy: Cluster"]))
        ready = [e for e in eps if e.ready]
        if zone and ready and all(e.zone_hints for e in ready) and not any(zone in e.zone_hints for e in ready):
            out.append(Finding("info", "topology-excludes-zone", subj,
                               f"topology hints name no endpoint for zone {zone}: the hints are ignored on this node "
                               "and traffic goes to every zone",
                               [f"{e.address}: hints {sorted(e.zone_hints)}" for e in ready[:10]],
                               ["check the EndpointSlice controller's zone allocation (too few endpoints for the zones?)"]))
    return out


def unprogrammed_findings(probes: list[Probe], view: NodeView, node_name: str,
                          node_labels: Mapping[str, str], ruleset: Ruleset | None = None) -> list[Finding]:
    """A frontend of a service with usable endpoints whose new flows the rules do not translate."""
    out: list[Finding] = []
    missed: dict[ServicePortName, list[str]] = {}
    why: dict[ServicePortName, list[str]] = {}
    for p in probes:
        if p.error or not p.outcomes:
            continue
        svc = view.services[p.name]
        cat = categorize(view.endpoints.get(p.name, []), svc, node_name, node_labels)
        usable = cat.local if (p.frontend.external and svc.external_policy_local) else cat.cluster
        if not usable:
            continue
        if all(o.dnat is None and o.verdict not in ("DROP", "REJECT") for o in p.outcomes):
            missed.setdefault(p.name, []).append(str(p.frontend))
            why.setdefault(p.name, []).extend(_where_it_stopped(p, ruleset))
    for name, fronts in sorted(missed.items()):
        out.append(Finding("critical", "not-translated", _subject(name),
                           "new flows to its addresses are not translated by the rules (the proxy's rules are missing)",
                           [*(f"a new flow from outside to {f} leaves the rules unchanged" for f in fronts),
                            *dict.fromkeys(why.get(name, []))],
                           ["check that the proxy runs and syncs (`kubeproxy run` logs, its /healthz), "
                            "and the missing-jump findings"],
                           {"frontends": fronts}))
    return out


def _where_it_stopped(p: Probe, ruleset: Ruleset | None) -> list[str]:
    """The last jump the flow took in the nat table, and whether that chain is empty."""
    out: list[str] = []
    for o in p.outcomes:
        jumps = [h for h in o.path if h.table in ("nat", "kube-proxy") and h.hook in ("prerouting", "output")]
        if not jumps:
            out.append("no nat rule acted on it at all")
            continue
        last = jumps[-1]
        line = f"last nat rule that acted: {last.text}" + (f" (line {last.line})" if last.line else "")
        table = ruleset.table(last.table) if ruleset is not None else None
        if table is not None and last.target in table.chains and not table.chains[last.target].rules:
            line += f"; {last.target} has no rules"
        out.append(line)
    return out
