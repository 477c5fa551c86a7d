"""Render the node model into our nftables table: `ip kube-proxy` (or `ip6 kube-proxy`).

A pure function: no kernel, no clock. The frame is upstream's nftables mode (same table, base
chains and priorities, `services`, `service-ips`, `service-nodeports`, `cluster-ips`,
`no-endpoint-services`, `no-endpoint-nodeports`, `firewall-ips`, `reject-chain`, mark-based
masquerading, the same endpoint decisions through `categorize`):

  nat-prerouting/-output → services ─┬ ip daddr . proto . port  vmap @service-ips
                                     └ (local address) proto . port vmap @service-nodeports
  filter, before DNAT (-110) → firewall-check (LB source ranges)
  filter, after DNAT (0) → service-/nodeport-endpoints-check (reject or drop what no service
                 rule DNATed: no endpoints), cluster-ips-check (unknown ports of cluster IPs)
  nat-postrouting → masquerading (marked packets, and hairpin)

Endpoint selection is where we differ, for scale. Upstream gives every service port a chain
that picks an endpoint with an anonymous `numgen random mod N vmap { 0 : goto endpoint-…, … }`
and every endpoint a chain of its own, a shape nft loads in super-linear time: the kernel names
each anonymous set by scanning every set of the table, every lookup of a named set walks the
table's set list, an element added to a map is validated against every rule that uses the map,
and each chain and rule has a cost of its own. The shapes' load times are in
docs/modes/nftables.md (`bench/nftables.py --shapes`).

So endpoints are map *elements*, keyed by packet fields, in maps that one rule each uses:

  service-ips: 172.30.0.41 . tcp . 80 : goto cluster-endpoints-3
  chain cluster-endpoints-3 {
      dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @cluster-endpoints-3 }
  map cluster-endpoints-3: 172.30.0.41 . tcp . 80 . 0 : 10.180.0.1 . 80, ... . 1 : ..., ... . 2 : ...

There is one selector chain and map per (policy, endpoint count, address-or-NodePort key), shared
by every service port with that many endpoints; external traffic goes through shared
`external-cluster-N` / `external-local-N-M` chains (masquerade, or upstream's short-circuits for
externalTrafficPolicy Local) to the same selectors. A service port without ClientIP affinity
therefore costs no chain and no rule, only elements: its cluster IP, its service-ips entry and
one element per endpoint (per address it is reachable at). Every map is used by at most two
rules, nothing is anonymous, and a change of endpoints is a few element additions and deletions
(bench/nftables.py times the whole table; docs/benchmarks.md has its numbers).

Hairpin (a pod reaching itself through a service must be masqueraded, or it would answer itself
directly): upstream has a rule in every endpoint chain; we have one rule in `masquerading` for
DNATed packets whose `saddr . daddr` is in the set `hairpin` of `ip . ip` pairs (nft cannot compare
two fields). Only endpoints that can be the source of a packet this node DNATs go in it: the
node's own endpoints, and every endpoint of externalTrafficPolicy Local services, whose NodePorts
and external IPs short-circuit pod traffic from other nodes to Cluster endpoints without
masquerading. A remote pod's traffic to a cluster IP is DNATed by its own node, so its IP is
left out: in a large cluster most endpoints are remote, and each element costs load time.

Services with ClientIP affinity keep upstream's per-service and per-endpoint chains (the
affinity check needs to know the endpoint before the DNAT); instead of one anonymous vmap
they pick with chained `numgen random mod (n-i) 0 goto …` rules, and instead of one named set
per endpoint they share one dynamic set keyed `client . endpoint id` (the id a constant
written as `numgen random mod 1 offset ID`), so they too grow linearly.

The masquerade mark for off-cluster traffic to cluster IPs (upstream: a rule in each service
chain) is one rule in `services` matching `@cluster-ips`; LoadBalancer source ranges keep
upstream's per-service `firewall-…` chain, its rule matching a named interval set of the
ranges made disjoint (`firewall-allow-…`), which loads in linear time.
The Service annotation kubeproxy.io/udp-conntrack-timeout adds `ct timeout` objects, set at
the first packet of a flow through the maps `udp-timeouts` / `udp-timeout-nodeports`, in base
chains at mangle priority (-150): `ct timeout set` acts on the conntrack entry that is being
created, so the rule must run after conntrack (-200) has made it (at raw priority, -300, it
silently does nothing) and before DNAT (-100) rewrites the service address (annotations.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from sys import intern

from kubeproxy.backends.nftables import naming
from kubeproxy.backends.nftables.annotations import udp_conntrack_timeout
from kubeproxy.backends.nftables.rendered_table import (
    Builder,
    Fragment,
    FragmentSource,
    IncrementalState,
    NftRendering,
    SharedObjects,
    index_ports,
    new_fragment,
)
from kubeproxy.backends.nftables.table_objects import BaseHook, Chain, CtTimeout, Element, NftCounter, NftSet, Packed, Rule, pack
from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions
from kubeproxy.model.topology import categorize

# Base chains: upstream's names, types and priorities since kubernetes PR #132456 (1.34, also
# in 1.33). Only the source-range check sees the address a packet was sent to (before DNAT); the
# no-endpoint checks run after DNAT, so they catch only what no service rule rewrote. Before,
# they ran first and dropped the node's own connections to an externalTrafficPolicy: Local
# address with no local endpoint, which the external chain short-circuits to every endpoint
# (kubernetes issue #131765; iptables mode always did so).
DSTNAT, SRCNAT, MANGLE, FILTER = -100, 100, -150, 0
BASE_CHAINS = {
    "filter-prerouting-pre-dnat": BaseHook("filter", "prerouting", DSTNAT - 10),
    "filter-output-pre-dnat": BaseHook("filter", "output", DSTNAT - 10),
    "filter-input": BaseHook("filter", "input", FILTER),
    "filter-forward": BaseHook("filter", "forward", FILTER),
    "filter-output": BaseHook("filter", "output", FILTER),
    "nat-prerouting": BaseHook("nat", "prerouting", DSTNAT),
    "nat-output": BaseHook("nat", "output", DSTNAT),
    "nat-postrouting": BaseHook("nat", "postrouting", SRCNAT),
}
# Ours, only while some Service has its own UDP conntrack timeout.
CONNTRACK_CHAINS = {
    "conntrack-prerouting": BaseHook("filter", "prerouting", MANGLE),
    "conntrack-output": BaseHook("filter", "output", MANGLE),
}

SERVICES = "services"
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
NODEPORT_IPS = "nodeport-ips"
CLUSTER_IPS = "cluster-ips"
SERVICE_ENDPOINTS_CHECK = "service-endpoints-check"
NODEPORT_ENDPOINTS_CHECK = "nodeport-endpoints-check"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
REJECT_CHAIN = "reject-chain"
CLUSTER_IPS_CHECK = "cluster-ips-check"
FIREWALL_IPS = "firewall-ips"
FIREWALL_CHECK = "firewall-check"
MARK_MASQ = "mark-for-masquerade"
MASQUERADING = "masquerading"
# Ours:
HAIRPIN = "hairpin"  # set: endpoint . endpoint
AFFINITY = "affinity"  # dynamic set: client . endpoint id
AFFINITY_SET_SIZE = 1 << 20  # client/endpoint pairs remembered at once, all services together
UDP_TIMEOUTS = "udp-timeouts"
UDP_TIMEOUT_NODEPORTS = "udp-timeout-nodeports"

# KubeProxyNFTablesLocalhostNodePorts: NodePorts on loopback that no listener serves.
LOCALHOST_NODEPORT_REJECTS = "localhost-nodeport-reject-ports"


def localhost_reject_chain(protocol: str) -> str:
    return f"localhost-nodeport-reject-{protocol.lower()}"


def localhost_rejected_counter(protocol: str) -> str:
    """The named counter behind kubeproxy_nftables_localhost_nodeport_rejected_packets_total."""
    return f"localhost-nodeport-rejected-{protocol.lower()}"


REJECT = f"goto {REJECT_CHAIN}"
DROP = "drop"


@dataclass(frozen=True)
class _Options:
    """Everything besides the view that the rendering depends on (compared between renders)."""

    opts: NodeOptions
    service_cidrs: tuple[str, ...]


class _FamilyWords:
    """Family-specific words and option-derived matches, computed once per render."""

    def __init__(self, o: _Options) -> None:
        opts = o.opts
        self.o = o
        self.opts = opts
        self.v6 = opts.family.ipv6
        self.family = opts.family.nft
        self.ipx = opts.family.nft  # the address match keyword: `ip daddr`, `ip6 daddr`
        self.addr_type = "ipv6_addr" if self.v6 else "ipv4_addr"
        self.no_localhost = "ip6 daddr != ::1" if self.v6 else "ip daddr != 127.0.0.0/8"
        self.node_ip = ipaddress.ip_address(opts.node_ip) if opts.node_ip else None
        self.match_all = opts.nodeport_match_all
        self.mark = opts.masquerade_mark
        d = opts.local_detector
        self.is_local: str | None = None
        self.not_local: str | None = None
        if d.mode in ("ClusterCIDR", "NodeCIDR") and d.cidrs:
            self.is_local, self.not_local = f"{self.ipx} saddr {d.cidrs[0]}", f"{self.ipx} saddr != {d.cidrs[0]}"
        elif d.mode == "BridgeInterface":
            self.is_local, self.not_local = f'iifname "{d.interface}"', f'iifname != "{d.interface}"'
        elif d.mode == "InterfaceNamePrefix":
            self.is_local, self.not_local = f'iifname "{d.interface}*"', f'iifname != "{d.interface}*"'

    def nodeport_match(self) -> str:
        """Which destinations are NodePorts: any local address, or --nodeport-addresses'."""
        if self.match_all:
            return f"fib daddr type local {self.no_localhost}"
        return f"{self.ipx} daddr @{NODEPORT_IPS}"


# ------------------------------------------------------------------------------------------
# The public function


def render(
    view: NodeView,
    opts: NodeOptions,
    *,
    service_cidrs: Sequence[str] = (),
    previous: NftRendering | None = None,
    changed_services: Collection[tuple[str, str]] | None = None,
) -> NftRendering:
    """The complete table for this node and IP family.

    opts: the same options the iptables mode takes (kubeproxy.backends.iptables.options);
        `nfacct_counters`, `localhost_nodeports`, `random_fully` and `conntrack_tcp_liberal`
        have no nftables counterpart (upstream always masquerades fully-random).
    service_cidrs: service CIDRs besides `opts.service_cidrs` (the ServiceCIDR objects'):
        addresses in them that no Service holds are dropped.
    previous, changed_services: render incrementally: only the (namespace, name) services in
        `changed_services` are computed again, the rest is taken from `previous`. The result
        equals a full render of `view` provided `previous` rendered the same view for every other
        service. Falls back to a full render when `previous` is None, the options differ, or
        `previous` is not the newest rendering made from its line.
    """
    with paused_gc():
        cidrs = tuple(dict.fromkeys((*opts.service_cidrs, *service_cidrs)))
        return _render(view, _Options(opts, cidrs), previous, changed_services)


def _render(
    view: NodeView, o: _Options, previous: NftRendering | None, changed_services: Collection[tuple[str, str]] | None
) -> NftRendering:
    ctx = _FamilyWords(o)
    expand = partial(_expand, ctx)
    # Incremental renders take place only between equal options: the same ctx, so the same fragments.
    remake = partial(_remade, ctx)
    book = previous.book if previous is not None else None
    incremental = (
        previous is not None
        and changed_services is not None
        and book is not None
        and book.owner is previous.token
        and book.options == o
    )
    if not incremental:
        builder = Builder(ctx.family, IncrementalState(options=o), None, expand, remake)
        for c in _base_chains(ctx):
            builder.put_chain(c)
        for s in _base_sets(ctx):
            builder.put_set(s)
        for protocol in ctx.opts.localhost_nodeport_rejects:
            builder.put_object(NftCounter(localhost_rejected_counter(protocol)))
        for ip in _nodeport_ips(ctx):
            builder.set_element(NODEPORT_IPS, ip, Element(ip))
        names = sorted(view.services)
        for name in names:
            source = (view.services[name], view.endpoints.get(name, _NO_ENDPOINTS))
            builder.add_fragment(name, fragment(ctx, *source), source)
        # Made here (milliseconds of a full render) rather than by the first change after it.
        builder.book.ports = index_ports(names)
        return builder.build()

    assert previous is not None and book is not None and changed_services is not None
    changed = frozenset(changed_services)
    builder = Builder(ctx.family, book, previous, expand, remake)
    book.owner = None  # from here on `previous` no longer owns the bookkeeping
    # Only the changed Services' ports, found through indexes rather than by walking all of them.
    stale = [spn for key in changed for spn in book.ports_of(previous.sources, key)]
    for spn in stale:
        builder.remove_fragment(spn)
    for spn in sorted(_ports_in(view, changed)):
        source = (view.services[spn], view.endpoints.get(spn, _NO_ENDPOINTS))
        builder.add_fragment(spn, fragment(ctx, *source), source)
    return builder.build()


_NO_ENDPOINTS: tuple[EndpointInfo, ...] = ()


def _ports_in(view: NodeView, changed: frozenset[tuple[str, str]]) -> list[ServicePortName]:
    """The view's service ports of the `changed` Services."""
    if "by_service" in view.__dict__:
        # The index is there (the live proxy's ViewBuilder hands it over ready-made): no walk.
        return [n for key in changed for n in view.ports_of(key) if n in view.services]
    return [n for n in view.services if n.service in changed]


def _remade(ctx: _FamilyWords, source: FragmentSource) -> Fragment:
    return fragment(ctx, *source)


# ------------------------------------------------------------------------------------------
# Base objects: depend on the options only


def _base_sets(ctx: _FamilyWords) -> list[NftSet]:
    a = ctx.addr_type
    key3 = f"{a} . inet_proto . inet_service"
    sets = [
        NftSet(CLUSTER_IPS, "set", a, comment="Active ClusterIPs"),
        NftSet(FIREWALL_IPS, "map", f"{key3} : verdict", comment="destinations that are subject to LoadBalancerSourceRanges"),
        NftSet(
            NO_ENDPOINT_NODEPORTS,
            "map",
            "inet_proto . inet_service : verdict",
            comment="vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        NftSet(
            NO_ENDPOINT_SERVICES,
            "map",
            f"{key3} : verdict",
            comment="vmap to drop or reject packets to services with no endpoints",
        ),
        NftSet(SERVICE_IPS, "map", f"{key3} : verdict", comment="ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        NftSet(SERVICE_NODEPORTS, "map", "inet_proto . inet_service : verdict", comment="NodePort traffic"),
        NftSet(HAIRPIN, "set", f"{a} . {a}", comment="endpoint . endpoint: a pod that reached itself through a service"),
    ]
    if not ctx.match_all:
        sets.append(NftSet(NODEPORT_IPS, "set", a, comment="IPs that accept NodePort traffic"))
    if ctx.opts.localhost_nodeport_rejects:
        sets.append(
            NftSet(
                LOCALHOST_NODEPORT_REJECTS,
                "map",
                "inet_proto . inet_service : verdict",
                comment="localhost NodePorts rejected by kube-proxy",
            )
        )
    return sets


def _nodeport_ips(ctx: _FamilyWords) -> list[str]:
    if ctx.match_all:
        return []
    # Upstream's nftables mode has no localhost NodePorts (no route_localnet games).
    return [
        ip
        for ip in ctx.opts.nodeport_ips
        if not ipaddress.ip_address(ip).is_loopback and (ipaddress.ip_address(ip).version == 6) == ctx.v6
    ]


def _base_chains(ctx: _FamilyWords) -> list[Chain]:
    ipx, mark = ctx.ipx, ctx.mark
    tuple3 = f"{ipx} daddr . meta l4proto . th dport"
    new = "ct state new"
    chains = {name: Chain(name, base=hook) for name, hook in BASE_CHAINS.items()}

    def jumps(chain: str, *rules: str) -> None:
        chains[chain] = Chain(chain, tuple(Rule(r) for r in rules), base=BASE_CHAINS[chain])

    jumps("filter-prerouting-pre-dnat", f"{new} jump {FIREWALL_CHECK}")
    jumps("filter-output-pre-dnat", f"{new} jump {FIREWALL_CHECK}")
    jumps("filter-input", f"{new} jump {NODEPORT_ENDPOINTS_CHECK}", f"{new} jump {SERVICE_ENDPOINTS_CHECK}")
    jumps("filter-forward", f"{new} jump {SERVICE_ENDPOINTS_CHECK}", f"{new} jump {CLUSTER_IPS_CHECK}")
    jumps("filter-output", f"{new} jump {SERVICE_ENDPOINTS_CHECK}", f"{new} jump {CLUSTER_IPS_CHECK}")
    jumps("nat-prerouting", f"jump {SERVICES}")
    jumps("nat-output", f"jump {SERVICES}")
    jumps("nat-postrouting", f"jump {MASQUERADING}")

    def chain(name: str, *rules: Rule, comment: str | None = None) -> None:
        chains[name] = Chain(name, tuple(rules), comment=comment)

    chain(MARK_MASQ, Rule(f"mark set mark or {mark}"))
    chain(
        MASQUERADING,
        Rule(f"ct status dnat {ipx} saddr . {ipx} daddr @{HAIRPIN} jump {MARK_MASQ}", "hairpin"),
        Rule(f"mark and {mark} == 0 return"),
        Rule(f"mark set mark xor {mark}"),
        Rule("masquerade fully-random"),
    )
    cluster_check = [Rule(f"{ipx} daddr @{CLUSTER_IPS} reject", "Reject traffic to invalid ports of ClusterIPs")]
    cidrs = [c for c in ctx.o.service_cidrs if (ipaddress.ip_network(c, strict=False).version == 6) == ctx.v6]
    if cidrs:
        cluster_check.append(Rule(f"{ipx} daddr {{ {', '.join(cidrs)} }} drop", "Drop traffic to unallocated ClusterIPs"))
    chain(CLUSTER_IPS_CHECK, *cluster_check)
    nodeports_where = ctx.no_localhost if ctx.match_all else f"{ipx} daddr @{NODEPORT_IPS}"
    nodeport_checks = [Rule(f"{nodeports_where} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}")]
    if ctx.opts.localhost_nodeport_rejects:
        loopback = "ip6 daddr ::1" if ctx.v6 else "ip daddr 127.0.0.0/8"
        nodeport_checks.append(Rule(f"{loopback} meta l4proto . th dport vmap @{LOCALHOST_NODEPORT_REJECTS}"))
        for protocol in ctx.opts.localhost_nodeport_rejects:
            counter = localhost_rejected_counter(protocol)
            chain(localhost_reject_chain(protocol), Rule(f'counter name "{counter}" reject'))
    chain(NODEPORT_ENDPOINTS_CHECK, *nodeport_checks)
    chain(SERVICE_ENDPOINTS_CHECK, Rule(f"{tuple3} vmap @{NO_ENDPOINT_SERVICES}"))
    chain(REJECT_CHAIN, Rule("reject"), comment="helper for @no-endpoint-services / @no-endpoint-nodeports")
    chain(FIREWALL_CHECK, Rule(f"{tuple3} vmap @{FIREWALL_IPS}"))
    services = []
    if ctx.opts.masquerade_all:
        services.append(Rule(f"{ipx} daddr @{CLUSTER_IPS} jump {MARK_MASQ}", "masquerade all traffic to cluster IPs"))
    elif ctx.not_local:
        # Upstream's per-service rule: off-cluster clients may route the service range to any
        # node, so masquerade them for the reply to come back through this one.
        services.append(
            Rule(f"{ipx} daddr @{CLUSTER_IPS} {ctx.not_local} jump {MARK_MASQ}", "masquerade off-cluster traffic to cluster IPs")
        )
    services.append(Rule(f"{tuple3} vmap @{SERVICE_IPS}"))
    services.append(Rule(f"{ctx.nodeport_match()} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"))
    chain(SERVICES, *services)
    return list(chains.values())


# ------------------------------------------------------------------------------------------
# Shared objects: keyed, reference counted, created on first use


def selector_name(policy: str, nodeport: bool, n: int) -> str:
    """Chain and map that DNAT to one of n endpoints: `cluster-endpoints-3`, `nodeport-local-endpoints-1`."""
    return f"{'nodeport-' if nodeport else ''}{policy}-endpoints-{n}"


def external_name(nodeport: bool, n: int, m: int | None) -> str:
    """Entry for external traffic: `external-cluster-N` (masquerade) or `external-local-N-M`."""
    base = f"external-cluster-{n}" if m is None else f"external-local-{n}-{m}"
    return ("nodeport-" if nodeport else "") + base


def timeout_name(seconds: int) -> str:
    return f"udp-timeout-{seconds}s"


def _expand(ctx: _FamilyWords, key: Hashable) -> SharedObjects:
    assert isinstance(key, tuple)
    kind = key[0]
    ipx = ctx.ipx
    if kind == "select":
        _, policy, nodeport, n = key
        name = selector_name(policy, nodeport, n)
        fields = "meta l4proto . th dport" if nodeport else f"{ipx} daddr . meta l4proto . th dport"
        which = "NodePort" if nodeport else "service address"
        m = NftSet(
            name,
            "map",
            f"{fields} . numgen random mod 1 : {ipx} daddr . th dport",
            typeof=True,
            comment=f"{policy.capitalize()}-policy endpoints of services with {n}, by {which} . index",
        )
        rule = Rule(f"dnat {ipx} to {fields} . numgen random mod {n} map @{name}")
        return SharedObjects(chains=(Chain(name, (rule,)),), sets=(m,))
    if kind == "external":
        _, nodeport, n = key
        target = selector_name("cluster", nodeport, n)
        return SharedObjects(
            chains=(Chain(external_name(nodeport, n, None), (Rule(f"jump {MARK_MASQ}"), Rule(f"goto {target}"))),)
        )
    if kind == "external-local":
        _, nodeport, n, m = key
        rules = []
        if n:
            cluster = selector_name("cluster", nodeport, n)
            if ctx.is_local:
                # Pods reaching an external address of their own cluster behave as if they went
                # out to the load balancer and came back: no traffic policy applies.
                rules.append(Rule(f"{ctx.is_local} goto {cluster}", "short-circuit pod traffic"))
            rules.append(Rule(f"fib saddr type local jump {MARK_MASQ}", "masquerade local traffic"))
            rules.append(Rule(f"fib saddr type local goto {cluster}", "short-circuit local traffic"))
        if m:
            rules.append(Rule(f"goto {selector_name('local', nodeport, m)}"))
        return SharedObjects(chains=(Chain(external_name(nodeport, n, m), tuple(rules)),))
    if kind == "firewall":
        # Per service port, as upstream's firewall chains: one interval set of plain addresses
        # loads in linear time, where one shared set keyed by destination . source needs nft's
        # concatenated-interval backend, whose inserts grow with the set (bench/source_ranges.py).
        _, chain_name, set_name = key
        return SharedObjects(
            chains=(Chain(chain_name, (Rule(f"{ipx} saddr != @{set_name} drop"),)),),
            sets=(NftSet(set_name, "set", ctx.addr_type, flags=("interval",), comment="loadBalancerSourceRanges"),),
        )
    if kind == "affinity":
        return SharedObjects(
            sets=(
                NftSet(
                    AFFINITY,
                    "set",
                    f"{ipx} saddr . numgen random mod 1",
                    typeof=True,
                    flags=("dynamic", "timeout"),
                    size=AFFINITY_SET_SIZE,
                    comment="ClientIP affinity: client . endpoint id",
                ),
            )
        )
    if kind == "udp-timeouts":
        a = ctx.addr_type
        timeout_rules = (
            Rule(f"ct state new meta l4proto udp {ipx} daddr . meta l4proto . th dport vmap @{UDP_TIMEOUTS}"),
            Rule(f"ct state new meta l4proto udp {ctx.nodeport_match()} meta l4proto . th dport vmap @{UDP_TIMEOUT_NODEPORTS}"),
        )
        return SharedObjects(
            chains=tuple(Chain(name, timeout_rules, base=hook) for name, hook in CONNTRACK_CHAINS.items()),
            sets=(
                NftSet(
                    UDP_TIMEOUTS,
                    "map",
                    f"{a} . inet_proto . inet_service : verdict",
                    comment="service addresses with their own UDP conntrack timeout",
                ),
                NftSet(
                    UDP_TIMEOUT_NODEPORTS,
                    "map",
                    "inet_proto . inet_service : verdict",
                    comment="NodePorts with their own UDP conntrack timeout",
                ),
            ),
        )
    if kind == "udp-timeout":
        _, seconds = key
        name = timeout_name(seconds)
        return SharedObjects(
            chains=(Chain(name, (Rule(f'ct timeout set "{name}"'),)),),
            objects=(CtTimeout(name, "udp", ctx.ipx, (("unreplied", seconds), ("replied", seconds))),),
        )
    raise ValueError(f"unknown shared object {key!r}")


def _allowed_sources(ctx: _FamilyWords, svc: ServicePortInfo) -> list[str]:
    """A service port's loadBalancerSourceRanges as disjoint intervals.

    An interval set refuses overlapping elements ("File exists"), and valid Services overlap
    all the time: 0.0.0.0/0 plus the load balancer's own address, or 10.0.0.0/8 beside
    10.1.0.0/16. Collapsing also keeps the set as small as the ranges allow.
    """
    ranges: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [
        c for c in svc.load_balancer_source_ranges if c.version == (6 if ctx.v6 else 4)
    ]
    if ctx.node_ip is not None and any(ctx.node_ip in c for c in ranges):
        # A VIP-like load balancer whose IP is also local: the node's own requests loop
        # back with the VIP as source and must be allowed too.
        ranges += [ipaddress.ip_network(ip) for ip in svc.load_balancer_vips if ip.version == ctx.node_ip.version]
    # collapse_addresses takes one family at a time, which `ranges` is (filtered above).
    return [str(c) for c in ipaddress.collapse_addresses(ranges)]  # type: ignore[type-var]


# ------------------------------------------------------------------------------------------
# One service port


class _PortFragment:
    """Collects one service port's elements and needs."""

    def __init__(self) -> None:
        self.elements: dict[str, tuple[list[str], list[Packed]]] = {}  # per set: keys, packed elements
        self.shared: list[Hashable] = []
        self.chains: list[Chain] = []

    def bucket(self, set_name: str) -> tuple[list[str], list[Packed]]:
        got = self.elements.get(set_name)
        if got is None:
            got = self.elements[set_name] = ([], [])
        return got

    def elem(self, set_name: str, key: str, value: str | None = None, comment: str | None = None) -> None:
        keys, packed = self.bucket(set_name)
        keys.append(key)
        packed.append(pack(value, comment))

    def need(self, key: Hashable) -> None:
        if key not in self.shared:
            self.shared.append(key)


def fragment(ctx: _FamilyWords, svc: ServicePortInfo, endpoints: Sequence[EndpointInfo]) -> Fragment:
    """Everything one service port puts in the table."""
    opts = ctx.opts
    spn = svc.name
    spn_str = str(spn)
    proto = svc.protocol.lower()
    port = svc.port
    cat = categorize(endpoints, svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)
    cluster = cat.cluster if svc.uses_cluster_endpoints else []
    local = cat.local if svc.uses_local_endpoints else []
    has_endpoints = cat.has_any
    internal = local if svc.internal_policy_local else cluster
    has_internal = has_endpoints and bool(internal)
    has_external = has_endpoints and (bool(local) if svc.external_policy_local else True)
    uses_external = has_endpoints and svc.externally_accessible

    internal_verdict = external_verdict = REJECT
    if has_endpoints:
        internal_verdict = external_verdict = DROP  # Local policy without local endpoints

    f = _PortFragment()
    cip = str(svc.cluster_ip)
    external_addrs = [str(ip) for ip in (*svc.external_ips, *svc.load_balancer_vips)]

    if svc.client_ip_affinity:
        internal_target, external_target = _affinity_chains(
            ctx, f, svc, cluster, local, has_internal, has_external, uses_external, cat.reachable
        )
    else:
        internal_target, external_target = _selectors(ctx, f, svc, cluster, local, has_internal, uses_external, external_addrs)

    f.elem(CLUSTER_IPS, cip)
    if has_internal and internal_target:
        f.elem(SERVICE_IPS, f"{cip} . {proto} . {port}", internal_target, spn_str)
    else:
        f.elem(NO_ENDPOINT_SERVICES, f"{cip} . {proto} . {port}", internal_verdict, spn_str)
    for ip in svc.external_ips:
        if uses_external and external_target:
            f.elem(SERVICE_IPS, f"{ip} . {proto} . {port}", external_target[0], spn_str)
        if not has_external:
            f.elem(NO_ENDPOINT_SERVICES, f"{ip} . {proto} . {port}", external_verdict, spn_str)
    uses_firewall = bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges)
    # A sha256 per name: only for the few service ports that have one.
    firewall = naming.firewall_chain(spn) if uses_firewall else ""
    for ip in svc.load_balancer_vips:
        if uses_external and external_target:
            f.elem(SERVICE_IPS, f"{ip} . {proto} . {port}", external_target[0], spn_str)
        if uses_firewall:
            f.elem(FIREWALL_IPS, f"{ip} . {proto} . {port}", f"goto {firewall}", spn_str)
    if not has_external:
        for ip in svc.load_balancer_vips:
            f.elem(NO_ENDPOINT_SERVICES, f"{ip} . {proto} . {port}", external_verdict, spn_str)
    if uses_firewall:
        allowed = naming.firewall_set(spn)
        f.need(("firewall", firewall, allowed))
        for src in _allowed_sources(ctx, svc):
            f.elem(allowed, src)
    if svc.node_port:
        if svc.protocol in opts.localhost_nodeport_rejects:
            f.elem(LOCALHOST_NODEPORT_REJECTS, f"{proto} . {svc.node_port}", f"goto {localhost_reject_chain(proto)}")
        if uses_external and external_target:
            f.elem(SERVICE_NODEPORTS, f"{proto} . {svc.node_port}", external_target[1], spn_str)
        if not has_external:
            f.elem(NO_ENDPOINT_NODEPORTS, f"{proto} . {svc.node_port}", external_verdict, spn_str)

    seconds, warning = udp_conntrack_timeout(svc.annotations, f"{spn.namespace}/{spn.name}") if svc.annotations else (None, None)
    if seconds is not None and proto == "udp":
        f.need(("udp-timeouts",))
        f.need(("udp-timeout", seconds))
        verdict = f"goto {timeout_name(seconds)}"
        for addr in (cip, *external_addrs):
            f.elem(UDP_TIMEOUTS, f"{addr} . udp . {port}", verdict)
        if svc.node_port:
            f.elem(UDP_TIMEOUT_NODEPORTS, f"udp . {svc.node_port}", verdict)

    return new_fragment(  # Fragment(...), made faster (rendered_table.py)
        f"{spn.namespace}/{spn.name}",
        tuple([(name, tuple(keys), tuple(packed)) for name, (keys, packed) in f.elements.items()]),
        tuple(f.chains),
        tuple(f.shared),
        warning,
        has_endpoints and not has_internal,
        has_endpoints and not has_external,
    )


def _selectors(
    ctx: _FamilyWords,
    f: _PortFragment,
    svc: ServicePortInfo,
    cluster: list[EndpointInfo],
    local: list[EndpointInfo],
    has_internal: bool,
    uses_external: bool,
    external_addrs: list[str],
) -> tuple[str | None, tuple[str, str] | None]:
    """Shared-selector dispatch. Returns (internal verdict, (external verdict, NodePort verdict))."""
    proto, port = svc.protocol.lower(), svc.port
    spn_str = str(svc.name)
    hairpin: set[str] = set()
    every_endpoint_may_hairpin = uses_external and svc.external_policy_local

    targets: dict[int, list[str]] = {}  # id of an endpoint list: its `ip . port` map values

    def fill(policy: str, nodeport: bool, key: str, eps: list[EndpointInfo]) -> str:
        n = len(eps)
        name = selector_name(policy, nodeport, n)
        f.need(("select", policy, nodeport, n))
        keys, packed = f.bucket(name)
        # The same endpoints serve the cluster IP, each external address and the NodePort:
        # their values are written once. This loop runs once per element of the table.
        values = targets.get(id(eps))
        if values is None:
            values = targets[id(eps)] = [f"{ep.ip} . {ep.port}" for ep in eps]
            hairpin.update(ep.ip for ep in eps if ep.is_local or every_endpoint_may_hairpin)
        keys.extend([f"{key} . {i}" for i in range(n)])
        # The first element of a block names the Service (so a grep for it finds the block's key);
        # the others go without, packed as their bare values: a comment on every element would
        # cost an object and its text per endpoint.
        packed.append(pack(values[0], spn_str))
        packed.extend(values[1:])
        return name

    internal_target = None
    if has_internal:
        policy, eps = ("local", local) if svc.internal_policy_local else ("cluster", cluster)
        # Interned: the rendering keeps one per service port as a map value, and there are only a
        # few distinct ones ("goto cluster-endpoints-10" for most service ports).
        internal_target = intern("goto " + fill(policy, False, f"{svc.cluster_ip} . {proto} . {port}", eps))

    external_target = None
    if uses_external:
        keys = [(False, f"{a} . {proto} . {port}") for a in external_addrs]
        if svc.node_port:
            keys.append((True, f"{proto} . {svc.node_port}"))
        n, m = len(cluster), len(local)
        if not svc.external_policy_local:
            if n:
                for nodeport, key in keys:
                    fill("cluster", nodeport, key, cluster)
                for nodeport in (False, True):
                    if any(k[0] == nodeport for k in keys):
                        f.need(("external", nodeport, n))
                external_target = (
                    intern(f"goto {external_name(False, n, None)}"),
                    intern(f"goto {external_name(True, n, None)}"),
                )
        else:
            for nodeport, key in keys:
                if n:
                    fill("cluster", nodeport, key, cluster)
                if m:
                    fill("local", nodeport, key, local)
            for nodeport in (False, True):
                if any(k[0] == nodeport for k in keys):
                    f.need(("external-local", nodeport, n, m))
            external_target = (intern(f"goto {external_name(False, n, m)}"), intern(f"goto {external_name(True, n, m)}"))

    for ip in sorted(hairpin):
        f.elem(HAIRPIN, f"{ip} . {ip}")
    return internal_target, external_target


def _affinity_chains(
    ctx: _FamilyWords,
    f: _PortFragment,
    svc: ServicePortInfo,
    cluster: list[EndpointInfo],
    local: list[EndpointInfo],
    has_internal: bool,
    has_external: bool,
    uses_external: bool,
    reachable: list[EndpointInfo],
) -> tuple[str | None, tuple[str, str] | None]:
    """ClientIP affinity: upstream's per-service and per-endpoint chains, linear to load."""
    spn: ServicePortName = svc.name
    ipx = ctx.ipx
    proto = svc.protocol.lower()
    f.need(("affinity",))
    cluster_chain = naming.cluster_chain(spn) if cluster else None
    local_chain = naming.local_chain(spn) if local else None

    def endpoint(ep: EndpointInfo) -> tuple[str, int]:
        name = naming.endpoint_chain(spn, ep.ip, ep.port)
        return name, naming.affinity_id(name)

    def dispatch(chain: str, eps: list[EndpointInfo]) -> Chain:
        rules = []
        targets = [endpoint(ep) for ep in eps]
        for name, ident in targets:
            rules.append(Rule(f"{ipx} saddr . numgen random mod 1 offset {ident} @{AFFINITY} goto {name}"))
        n = len(targets)
        for i, (name, _) in enumerate(targets):
            # Rule i takes 1/(n-i) of what is left: each endpoint gets 1/n, as with one vmap.
            rules.append(Rule(f"numgen random mod {n - i} 0 goto {name}" if i < n - 1 else f"goto {name}"))
        return Chain(chain, tuple(rules))

    if cluster_chain:
        f.chains.append(dispatch(cluster_chain, cluster))
    if local_chain:
        f.chains.append(dispatch(local_chain, local))
    timeout = svc.sticky_max_age_seconds
    for ep in reachable:
        name, ident = endpoint(ep)
        dnat = f"[{ep.ip}]:{ep.port}" if ctx.v6 else f"{ep.ip}:{ep.port}"
        f.chains.append(
            Chain(
                name,
                (
                    Rule(f"{ipx} saddr {ep.ip} jump {MARK_MASQ}"),
                    Rule(f"update @{AFFINITY} {{ {ipx} saddr . numgen random mod 1 offset {ident} timeout {timeout}s }}"),
                    Rule(f"meta l4proto {proto} dnat to {dnat}"),
                ),
            )
        )

    internal_chain = local_chain if svc.internal_policy_local else cluster_chain
    internal_target = f"goto {internal_chain}" if has_internal and internal_chain else None
    external_target = None
    if uses_external:
        ext = naming.external_chain(spn)
        rules: list[Rule] = []
        if not svc.external_policy_local:
            rules.append(Rule(f"jump {MARK_MASQ}"))
            if has_external and cluster_chain:
                rules.append(Rule(f"goto {cluster_chain}"))
        else:
            if cluster_chain:
                if ctx.is_local:
                    rules.append(Rule(f"{ctx.is_local} goto {cluster_chain}", "short-circuit pod traffic"))
                rules.append(Rule(f"fib saddr type local jump {MARK_MASQ}", "masquerade local traffic"))
                rules.append(Rule(f"fib saddr type local goto {cluster_chain}", "short-circuit local traffic"))
            if has_external and local_chain:
                rules.append(Rule(f"goto {local_chain}"))
        f.chains.append(Chain(ext, tuple(rules)))
        external_target = (f"goto {ext}", f"goto {ext}")
    return internal_target, external_target
