"""Which UDP conntrack entries are stale, given what the node model says now.

Upstream's reconciler (pkg/proxy/conntrack, CleanStaleEntries), rule for rule:

- Only UDP service ports count, and only those with at least one *serving* endpoint: a service
  without endpoints has nowhere better to send a flow, so its entries are left alone.
- A service port's frontends are `clusterIP:port`, every `externalIP:port` and every LB
  `VIP:port`, plus `*:nodePort` (any destination address: the node has many).
- An entry is stale when its original destination is such a frontend and its reply source
  (`ip:port`, where it was DNATed to) is not a serving endpoint of that service port. That covers
  endpoints that went away or stopped serving, an endpoint that kept its IP but changed its port,
  and entries that were never DNATed (reply source = the frontend itself), made while the
  service had no endpoints.
- Not deleted: entries of other protocols, entries to frontends of services that no longer
  exist (the reconciler only looks at current services), entries of services with no serving
  endpoints, and entries still DNATed to a serving endpoint even when it is terminating or no
  longer chosen by topology or traffic policy: existing flows are not disturbed, as with TCP.

One deliberate difference: when two UDP service ports share a frontend (the same external IP and
port), upstream keeps whichever it visits last in Go's random map order; we take the union of
their serving endpoints, so a live flow is never deleted because of the visiting order.

Entries are deleted by `Filter`: the frontend plus the stale backend, which is exactly the
staleness condition. So one `conntrack -D` per distinct (frontend, stale backend) removes every
client's entry at once, and also one created between listing and deleting, which is just as
stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubeproxy.backends.conntrack.flows import Flow
from kubeproxy.proxy.changes import Changes
from kubeproxy.proxy.model import IPV6, NodeView

UDP = "UDP"
Backend = tuple[str, int]  # endpoint ip, port


@dataclass(frozen=True)
class Frontends:
    """Serving endpoints (ip, port) of every UDP frontend that has any."""

    by_address: Mapping[tuple[str, int], frozenset[Backend]]
    by_node_port: Mapping[int, frozenset[Backend]]


def frontends(view: NodeView) -> Frontends:
    by_address: dict[tuple[str, int], set[Backend]] = {}
    by_node_port: dict[int, set[Backend]] = {}
    for name, info in view.services.items():
        if info.protocol != UDP:
            continue
        serving = {(ep.ip, ep.port) for ep in view.endpoints.get(name, ()) if ep.serving}
        if not serving:
            continue
        for ip in (info.cluster_ip, *info.load_balancer_vips, *info.external_ips):
            by_address.setdefault((str(ip), info.port), set()).update(serving)
        if info.node_port:
            by_node_port.setdefault(info.node_port, set()).update(serving)
    return Frontends(
        {k: frozenset(v) for k, v in by_address.items()},
        {k: frozenset(v) for k, v in by_node_port.items()},
    )


@dataclass(frozen=True, slots=True, order=True)
class Filter:
    """A `conntrack -D` selection: UDP entries to a frontend whose reply comes from one backend.

    orig_dst empty: any destination address (a NodePort frontend).
    """

    orig_dport: int
    reply_src: str
    reply_sport: int
    orig_dst: str = ""

    def argv(self, family: str) -> list[str]:
        """The conntrack options (after `-D`) that select exactly these entries."""
        argv = ["-p", "udp", "-f", "ipv6" if family == IPV6 else "ipv4"]
        if self.orig_dst:
            argv += ["--orig-dst", self.orig_dst]
        argv += ["--orig-port-dst", str(self.orig_dport)]
        argv += ["--reply-src", self.reply_src, "--reply-port-src", str(self.reply_sport)]
        return argv

    def matches(self, flow: Flow) -> bool:
        return (
            flow.protocol == "udp"
            and flow.orig_dport == self.orig_dport
            and flow.reply_src == self.reply_src
            and flow.reply_sport == self.reply_sport
            and (not self.orig_dst or flow.orig_dst == self.orig_dst)
        )


def filters_for(flow: Flow, fe: Frontends) -> list[Filter]:
    """The filters (none, one or two) under which `flow` is stale."""
    if flow.protocol != "udp":
        return []
    out: list[Filter] = []
    backend = (flow.reply_src, flow.reply_sport)
    serving = fe.by_address.get((flow.orig_dst, flow.orig_dport))
    if serving is not None and backend not in serving:
        out.append(Filter(flow.orig_dport, flow.reply_src, flow.reply_sport, flow.orig_dst))
    serving = fe.by_node_port.get(flow.orig_dport)
    if serving is not None and backend not in serving:
        out.append(Filter(flow.orig_dport, flow.reply_src, flow.reply_sport))
    return out


def stale(flows: Iterable[Flow], view: NodeView) -> list[Flow]:
    """The flows that must go, in input order."""
    fe = frontends(view)
    return [flow for flow in flows if filters_for(flow, fe)]


def stale_filters(flows: Iterable[Flow], view: NodeView) -> list[Filter]:
    """The distinct filters that delete every stale flow, sorted; a frontend filter that a
    NodePort filter for the same port and backend already covers is left out."""
    fe = frontends(view)
    found: set[Filter] = set()
    for flow in flows:
        found.update(filters_for(flow, fe))
    any_dst = {(f.orig_dport, f.reply_src, f.reply_sport) for f in found if not f.orig_dst}
    return sorted(f for f in found if not f.orig_dst or (f.orig_dport, f.reply_src, f.reply_sport) not in any_dst)


def cleanup_required(changes: Changes) -> bool:
    """Whether a sync with these changes must run the reconciler.

    Upstream runs it when the endpoints of a service with a UDP port changed. Listing the table
    costs about half a second per 60k entries, so it is worth skipping when nothing UDP moved.
    The tracker's UDP results cover every change that can make an entry stale: an endpoint that
    went away, stopped serving or changed port (deleted_udp_endpoints), a service that got its
    first serving endpoint (entries made while it had none were never DNATed), and a deleted UDP
    service (upstream runs then too, though the deleted service's own entries are not among those
    it deletes). A full sync (the first one, or after a failure) always runs it. Adding an endpoint
    to a service that already had one makes nothing stale, so it is skipped where upstream would
    run a cleanup that deletes nothing.
    """
    return bool(
        changes.full or changes.deleted_udp_endpoints or changes.newly_active_udp_services or changes.deleted_udp_cluster_ips
    )
