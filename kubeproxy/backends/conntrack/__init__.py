"""Conntrack cleanup of stale UDP entries after a sync, as upstream kube-proxy's reconciler.

UDP has no connection teardown: a conntrack entry that DNATs a client's flow to an endpoint
keeps doing so while the client keeps sending, even after the rules point elsewhere. After each
sync that changed UDP endpoints, the proxy lists the UDP entries and deletes those whose service
frontend no longer has their backend among its serving endpoints.

    flows.py   parse `conntrack -L` output into `Flow`s (pure)
    stale.py   which flows are stale for a `NodeView`, as deletion `Filter`s (pure); where the
               node's NodePorts are (`NodePorts`), the only addresses NodePort cleanup touches
    apply.py   run conntrack (list, delete) and `ip route` (local addresses): `clean_stale_entries`,
               `reconcile`, `Reconciler`
"""

from kubeproxy.backends.conntrack.apply import (
    ConntrackError,
    ConntrackMissing,
    Reconciler,
    clean_stale_entries,
    delete,
    list_flows,
    local_routes,
    node_port_destinations,
    reconcile,
)
from kubeproxy.backends.conntrack.flows import Flow, parse_flows
from kubeproxy.backends.conntrack.stale import (
    Filter,
    Frontends,
    NodePortDestinations,
    NodePorts,
    cleanup_required,
    filters_for,
    frontends,
    stale,
    stale_filters,
)

__all__ = [
    "ConntrackError",
    "ConntrackMissing",
    "Filter",
    "Flow",
    "Frontends",
    "NodePortDestinations",
    "NodePorts",
    "Reconciler",
    "clean_stale_entries",
    "cleanup_required",
    "delete",
    "filters_for",
    "frontends",
    "list_flows",
    "local_routes",
    "node_port_destinations",
    "parse_flows",
    "reconcile",
    "stale",
    "stale_filters",
]
