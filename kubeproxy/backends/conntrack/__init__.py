"""Conntrack cleanup of stale UDP entries after a sync, as upstream kube-proxy's reconciler.

UDP has no connection teardown: a conntrack entry that DNATs a client's flow to an endpoint
keeps doing so while the client keeps sending, even after the rules point elsewhere. After each
sync that changed UDP endpoints, the proxy lists the UDP entries and deletes those whose service
frontend no longer has their backend among its serving endpoints.

    flows.py   parse `conntrack -L` output into `Flow`s (pure)
    stale.py   which flows are stale for a `NodeView`, as deletion `Filter`s (pure); where the
               node's NodePorts are (`NodePorts`), the only addresses NodePort cleanup touches
    netlink.py the table over ctnetlink (list one family's UDP entries, delete chosen ones), as
               upstream since 1.32: no conntrack program; `table_for` a runner's table
    apply.py   the reconciler (`clean_stale_entries`, `reconcile`, `Reconciler`), `ip route`
               (local addresses); `list_flows`/`delete` run the conntrack program for operators
"""

from kubeproxy.backends.conntrack.apply import (
    Reconciler,
    clean_stale_entries,
    delete,
    list_flows,
    local_routes,
    node_port_destinations,
    reconcile,
)
from kubeproxy.backends.conntrack.flows import Flow, parse_flows
from kubeproxy.backends.conntrack.netlink import (
    ConntrackError,
    ConntrackMissing,
    ConntrackTable,
    Deleted,
    NetlinkTable,
    table_for,
)
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
    "ConntrackTable",
    "Deleted",
    "Filter",
    "Flow",
    "Frontends",
    "NetlinkTable",
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
    "table_for",
]
