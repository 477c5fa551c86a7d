"""Which UDP conntrack entries are stale, given what the node model says now.

Upstream's reconciler (pkg/proxy/conntrack, CleanStaleEntries), rule for rule:

- Only UDP service ports count, and only those with at least one *serving* endpoint: a service
  without endpoints has nowhere better to send a flow, so its entries are left alone.
- A service port's frontends are `clusterIP:port`, every `externalIP:port` and every LB
  `VIP:port`, plus `nodeIP:nodePort` for every address where this node accepts NodePort
  traffic (`NodePortDestinations`).
- An entry is stale when its original destination is such a frontend and its reply source
  (`ip:port`, where it was DNATed to) is not a serving endpoint of that service port. That covers
  endpoints that went away or stopped serving, an endpoint that kept its IP but changed its port,
  and entries that were never DNATed (reply source = the frontend itself), made while the
  service had no endpoints.
- Not deleted: entries of other protocols, entries to frontends of services that no longer
  exist (the reconciler only looks at current services), entries of services with no serving
  endpoints, and entries still DNATed to a serving endpoint even when it is terminating or no
  longer chosen by topology or traffic policy: existing flows are not disturbed, as with TCP.

Two deliberate differences:
- When two UDP service ports share a frontend (the same external IP and port), upstream keeps
  whichever it visits last in Go's random map order; we take the union of their serving
  endpoints, so a live flow is never deleted because of the visiting order.
- Upstream's NodePort filter matches any destination address (`--orig-port-dst` only). Then a
  UDP NodePort on a port the node itself uses (nodePort 53 from a manifest) deletes the node's
  own flows to *any* address on that port, its DNS queries to the outside included: none of them
  were DNATed, so their reply source is "not a serving endpoint". We only touch flows whose
  original destination is one of the node's NodePort addresses, exactly those the NodePort rules
  match: the addresses --nodeport-addresses selects, or every local address of the family
  (iptables' `addrtype LOCAL`, nftables' `fib daddr type local`) when it selects all, loopback
  only where the rules accept NodePorts on it (iptables' localhost NodePorts, IPv4).

Entries are deleted by `Filter`: the frontend plus the stale backend, which is exactly the
staleness condition. So one `conntrack -D` per distinct (frontend, stale backend) removes every
client's entry at once, and also one created between listing and deleting, which is just as
stale. A NodePort frontend is one node address and the port, like any other.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubeproxy.backends.conntrack.flows import Flow
from kubeproxy.model.changes import Changes
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family, NodeOptions

log = logging.getLogger("kubeproxy.conntrack")

UDP = "UDP"
Backend = tuple[str, int]  # endpoint ip, port
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class NodePortDestinations:
    """The addresses where this node accepts NodePort traffic, resolved: single addresses and
    (for the local routing table's `127.0.0.0/8`) whole local prefixes."""

    addresses: frozenset[str] = frozenset()  # normalised, as `Flow` holds them
    networks: tuple[Network, ...] = ()

    def __contains__(self, ip: object) -> bool:
        if not isinstance(ip, str):
            return False
        if ip in self.addresses:
            return True
        if not self.networks:
            return False
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)


@dataclass(frozen=True)
class NodePorts:
    """Where the node's NodePort rules match, before the kernel is asked: `ips` (what
    --nodeport-addresses selected) or, with `all_local`, every local address of the family.
    `loopback`: whether loopback destinations count (iptables' localhost NodePorts).

    The default, every local address but loopback, is what the default configuration does in
    both modes, minus localhost NodePorts: a caller that does not know the options misses only
    the cleanup of flows to 127.0.0.1:nodePort, and never touches a flow that is not a NodePort's.
    """

    ips: tuple[str, ...] = ()
    all_local: bool = True
    loopback: bool = False

    @classmethod
    def of(cls, opts: NodeOptions, *, loopback_nodeports: bool) -> NodePorts:
        """The NodePort addresses of this sync's options. `loopback_nodeports`: the mode takes
        NodePorts on 127.0.0.0/8 when localhost NodePorts are on (iptables, by route_localnet;
        opts says so only for IPv4); nftables never does (the mode's record says which)."""
        return cls(tuple(opts.nodeport_ips), opts.nodeport_match_all, loopback_nodeports and opts.localhost_nodeports)

    def resolve(self, local_routes: Iterable[str] = ()) -> NodePortDestinations:
        """The destinations, given the `dst` of each route in the kernel's local table of type
        local (`ip route show table local type local`): used only when `all_local`."""
        addresses: set[str] = set()
        networks: list[Network] = []
        for text in local_routes if self.all_local else self.ips:
            try:
                net = ipaddress.ip_network(text, strict=False)
            except ValueError:
                log.debug("ignoring local address %r: not an address or prefix", text)
                continue
            if net.network_address.is_loopback and not self.loopback:
                continue
            if net.num_addresses == 1:
                addresses.add(str(net.network_address))
            else:
                networks.append(net)
        return NodePortDestinations(frozenset(addresses), tuple(networks))


# Every local address but loopback: see `NodePorts`. Frozen, so one shared default is safe.
ALL_LOCAL_NODE_PORTS = NodePorts()


@dataclass(frozen=True)
class Frontends:
    """Serving endpoints (ip, port) of every UDP service address and port (an empty set for a
    service without any) and of every UDP NodePort with some."""

    by_address: Mapping[tuple[str, int], frozenset[Backend]]
    by_node_port: Mapping[int, frozenset[Backend]]


def frontends(view: NodeView) -> Frontends:
    by_address: dict[tuple[str, int], set[Backend]] = {}
    by_node_port: dict[int, set[Backend]] = {}
    for name, info in view.services.items():
        if info.protocol != UDP:
            continue
        serving = {(ep.ip, ep.port) for ep in view.endpoints.get(name, ()) if ep.serving}
        # Without serving endpoints every flow to its addresses is stale: an established flow
        # stays DNATed to the endpoint that went, past the reject rule for the service's address.
        for ip in (info.cluster_ip, *info.load_balancer_vips, *info.external_ips):
            by_address.setdefault((str(ip), info.port), set()).update(serving)
        # NodePorts only with endpoints, as upstream: flows on that port are not all a NodePort's.
        if info.node_port and serving:
            by_node_port.setdefault(info.node_port, set()).update(serving)
    return Frontends(
        {k: frozenset(v) for k, v in by_address.items()},
        {k: frozenset(v) for k, v in by_node_port.items()},
    )


@dataclass(frozen=True, slots=True, order=True)
class Filter:
    """A `conntrack -D` selection: UDP entries to a frontend (`orig_dst:orig_dport`) whose reply
    comes from one backend. Always with a destination address: see the module's note on NodePorts."""

    orig_dport: int
    reply_src: str
    reply_sport: int
    orig_dst: str

    def argv(self, family: str) -> list[str]:
        """The conntrack options (after `-D`) that select exactly these entries."""
        argv = ["-p", "udp", "-f", "ipv6" if family == Family.IPV6 else "ipv4", "--orig-dst", self.orig_dst]
        argv += ["--orig-port-dst", str(self.orig_dport)]
        argv += ["--reply-src", self.reply_src, "--reply-port-src", str(self.reply_sport)]
        return argv

    def matches(self, flow: Flow) -> bool:
        return (
            flow.protocol == "udp"
            and flow.orig_dport == self.orig_dport
            and flow.reply_src == self.reply_src
            and flow.reply_sport == self.reply_sport
            and flow.orig_dst == self.orig_dst
        )


def filters_for(flow: Flow, fe: Frontends, node_ports: NodePortDestinations) -> list[Filter]:
    """The filter under which `flow` is stale, if any (a list: none or one).

    Stale as a service-IP frontend's flow or as a NodePort's (to one of `node_ports`): the
    filter is the same, the flow's destination and port and its backend.
    """
    if flow.protocol != "udp":
        return []
    backend = (flow.reply_src, flow.reply_sport)
    serving = fe.by_address.get((flow.orig_dst, flow.orig_dport))
    stale_here = serving is not None and backend not in serving
    if not stale_here:
        serving = fe.by_node_port.get(flow.orig_dport)
        # Only flows to the node's own NodePort addresses: the node's flows to anything else on
        # that port (its DNS queries, for nodePort 53) were never a NodePort's.
        stale_here = serving is not None and backend not in serving and flow.orig_dst in node_ports
    return [Filter(flow.orig_dport, flow.reply_src, flow.reply_sport, flow.orig_dst)] if stale_here else []


def stale(flows: Iterable[Flow], view: NodeView, node_ports: NodePortDestinations) -> list[Flow]:
    """The flows that must go, in input order."""
    fe = frontends(view)
    return [flow for flow in flows if filters_for(flow, fe, node_ports)]


def stale_filters(flows: Iterable[Flow], view: NodeView, node_ports: NodePortDestinations) -> list[Filter]:
    """The distinct filters that delete every stale flow, sorted."""
    fe = frontends(view)
    found: set[Filter] = set()
    for flow in flows:
        found.update(filters_for(flow, fe, node_ports))
    return sorted(found)


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
