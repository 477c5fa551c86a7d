"""Which endpoints serve which traffic on this node: readiness, terminating fallback, traffic
policies and topology hints, with upstream's semantics (pkg/proxy/topology.go, v1.33+).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubeproxy.cluster.objects import LABEL_ZONE
from kubeproxy.model.node_model import EndpointInfo, ServicePortInfo

PREFER_SAME_NODE, PREFER_SAME_ZONE = "PreferSameNode", "PreferSameZone"


@dataclass(frozen=True, slots=True)
class Categorized:
    cluster: list[EndpointInfo]  # used with Cluster traffic policy
    local: list[EndpointInfo]  # used with Local traffic policy
    reachable: list[EndpointInfo]  # union: every endpoint this node may DNAT to
    has_any: bool  # usable endpoints exist somewhere in the cluster


def categorize(
    endpoints: Sequence[EndpointInfo],
    svc: ServicePortInfo,
    node_name: str,
    node_labels: Mapping[str, str],
    *,
    prefer_same_node: bool = True,
) -> Categorized:
    cluster: list[EndpointInfo] = []
    local: list[EndpointInfo] = []
    has_any = False
    mode = ""
    use_terminating_local = False

    if svc.uses_cluster_endpoints:
        zone = node_labels.get(LABEL_ZONE, "")
        mode = topology_mode(endpoints, node_name, zone, prefer_same_node=prefer_same_node)
        if mode:
            cluster = [e for e in endpoints if e.ready and _available(e, mode, node_name, zone)]
        else:  # without hints every ready endpoint is available: no call per endpoint (100k at 10k services)
            cluster = [e for e in endpoints if e.ready]
        if not cluster:
            # No ready endpoints anywhere (topology already fell back): keep connections
            # to pods that are terminating but still serving rather than dropping them.
            cluster = [e for e in endpoints if e.serving and e.terminating]
        has_any = bool(cluster)

    if not svc.uses_local_endpoints:
        return Categorized(cluster, [], cluster, has_any)

    has_local_ready = has_local_terminating = False
    for e in endpoints:
        if e.ready:
            has_any = True
            has_local_ready = has_local_ready or e.is_local
        elif e.serving and e.terminating:
            has_any = True
            has_local_terminating = has_local_terminating or e.is_local
    if has_local_ready:
        local = [e for e in endpoints if e.is_local and e.ready]
    elif has_local_terminating:
        use_terminating_local = True
        local = [e for e in endpoints if e.is_local and e.serving and e.terminating]

    if not svc.uses_cluster_endpoints:
        return Categorized(cluster, local, local, has_any)
    if mode == "" and not use_terminating_local:
        # cluster holds every ready endpoint, so it already contains the local ones.
        return Categorized(cluster, local, cluster, has_any)
    merged = {e.address: e for e in cluster} | {e.address: e for e in local}
    return Categorized(cluster, local, sorted(merged.values(), key=lambda e: e.address), has_any)


def topology_mode(endpoints: Sequence[EndpointInfo], node_name: str, zone: str, *, prefer_same_node: bool) -> str:
    """Hints apply only when every ready endpoint carries one and one of them is for us."""
    ready = [e for e in endpoints if e.ready]
    every_node_hinted = prefer_same_node and ready and all(e.node_hints for e in ready)
    if every_node_hinted and any(node_name in e.node_hints for e in ready):
        return PREFER_SAME_NODE
    if ready and all(e.zone_hints for e in ready) and any(zone in e.zone_hints for e in ready):
        return PREFER_SAME_ZONE
    return ""


def _available(e: EndpointInfo, mode: str, node_name: str, zone: str) -> bool:
    if mode == PREFER_SAME_NODE:
        return node_name in e.node_hints
    if mode == PREFER_SAME_ZONE:
        return zone in e.zone_hints
    return True
