"""Render the node model into `iptables-restore --noflush` input, as upstream kube-proxy writes it.

A pure function: no kernel, no clock. The layout is the one the seeds puzzle over:

  nat  PREROUTING/OUTPUT → KUBE-SERVICES ─┬ cluster IP      → KUBE-SVC-* (or KUBE-SVL-*)
                                          ├ external/LB IP  → KUBE-EXT-* (KUBE-FW-* with source ranges)
                                          └ local address   → KUBE-NODEPORTS → KUBE-EXT-*
       KUBE-SVC-* ─ statistic random 1/n, 1/(n-1), ... → KUBE-SEP-* ─ DNAT to the pod
       KUBE-MARK-MASQ marks, KUBE-POSTROUTING masquerades what was marked
  filter  REJECT services with no endpoints, DROP where only Local endpoints would do,
          KUBE-PROXY-FIREWALL for source ranges, KUBE-FORWARD for marked and established flows.

Upstream visits services in Go map order (random); we visit them sorted by name, so the output
is upstream's for one particular order and is stable from run to run.

Partial syncs (`changed_services`): the shared chains (KUBE-SERVICES, KUBE-NODEPORTS, the filter
table) are always rewritten whole, but a service whose objects did not change keeps the
SVC/SVL/EXT/FW/SEP chains already in the kernel. Its rules are still computed, into a discarded
buffer, so that the active-chain set and the rule-count metrics are those of a full sync.
Stale chains (`existing_nat_chains`): our service chains that the kernel has and this rendering
does not use are flushed (chain line) and deleted (`-X`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.iptables import names
from kubeproxy.proxy.config import LocalDetector
from kubeproxy.proxy.model import IPV6, EndpointInfo, NodeView, ServicePortInfo
from kubeproxy.proxy.topology import categorize

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_FIREWALL = "KUBE-FIREWALL"  # kubelet's chain; kube-proxy keeps a copy of its one rule
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"

# nfacct counters upstream attaches to two rules, when the kernel has them.
NFACCT_CT_INVALID = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORT = "localhost_nps_accepted_pkts"
NFACCT_COUNTERS = (NFACCT_CT_INVALID, NFACCT_LOCALHOST_NODEPORT)

# Above this many endpoints upstream drops per-endpoint comments to keep the ruleset small.
LARGE_CLUSTER_ENDPOINTS = 1000


@dataclass(frozen=True)
class IptablesOptions:
    """Everything about the node and configuration that changes the rules."""

    node_name: str = ""
    node_ip: str = ""
    node_labels: Mapping[str, str] = field(default_factory=dict)
    family: str = "IPv4"
    masquerade_all: bool = False
    masquerade_mark: str = "0x00004000"
    local_detector: LocalDetector = field(default_factory=LocalDetector)
    localhost_nodeports: bool = True
    # Empty: NodePorts on every local address. Otherwise the node's addresses that match
    # --nodeport-addresses, resolved by the caller (the renderer does not read interfaces).
    nodeport_ips: tuple[str, ...] = ()
    nodeport_match_all: bool = True
    random_fully: bool = False
    nfacct_counters: Collection[str] = NFACCT_COUNTERS
    conntrack_tcp_liberal: bool = False
    prefer_same_node: bool = True

    @property
    def localhost_nodeports_enabled(self) -> bool:
        # route_localnet, which localhost NodePorts rely on, exists for IPv4 only.
        return self.localhost_nodeports and self.family != IPV6


@dataclass(frozen=True)
class Rendered:
    text: str
    filter_rules: int
    nat_rules: int  # rules written to the kernel (not counting -X lines)
    nat_chains: frozenset[str]  # service/endpoint chains this rendering uses
    no_local_endpoints_internal: int
    no_local_endpoints_external: int
    large_cluster_mode: bool
    full_sync: bool = True
    # Rules and chain lines of unchanged services, computed but not written (partial sync).
    skipped_nat_rules: int = 0
    skipped_nat_chains: int = 0
    # Stale service chains flushed and deleted by this text.
    deleted_chains: tuple[str, ...] = ()
    # True when stale chains were looked for (the caller restarts its cleanup period).
    stale_cleanup_done: bool = False

    @property
    def nat_rules_total(self) -> int:
        """Upstream's sync_proxy_rules_iptables_total{table="nat"}: the rules the kernel holds."""
        return self.nat_rules + self.skipped_nat_rules


def _probability(n: int) -> str:
    return f"{1.0 / n:0.10f}"


def local_detector_args(detector: LocalDetector, *, local: bool) -> str:
    """The match that says 'from a local pod' (local=True) or 'not from one'."""
    neg = "" if local else "! "
    if detector.mode in ("ClusterCIDR", "NodeCIDR"):
        return f"{neg}-s {detector.cidrs[0]}"
    if detector.mode == "BridgeInterface":
        return f"{neg}-i {detector.interface}"
    if detector.mode == "InterfaceNamePrefix":
        return f"{neg}-i {detector.interface}+"
    raise ValueError(f"no local traffic detector configured (mode {detector.mode!r})")


@dataclass
class _NatSink:
    """Where one service's own chains (SVC/SVL/EXT/FW/SEP) go: the output or the discard pile."""

    chains: list[str]
    rules: list[str]


class _Writer:
    """The four buffers upstream writes into: chain declarations and rules, per table."""

    def __init__(self) -> None:
        self.filter_chains: list[str] = []
        self.filter_rules: list[str] = []
        self.nat_chains: list[str] = []
        self.nat_rules: list[str] = []
        self.active_nat_chains: set[str] = set()
        self.written = _NatSink(self.nat_chains, self.nat_rules)
        self.skipped = _NatSink([], [])

    def nat_chain(self, name: str, sink: _NatSink) -> None:
        sink.chains.append(f":{name} - [0:0]")
        # A skipped chain is still in use: it must not be mistaken for a stale one.
        self.active_nat_chains.add(name)

    def text(self) -> str:
        return "\n".join(
            [
                "*filter",
                *self.filter_chains,
                *self.filter_rules,
                "COMMIT",
                "*nat",
                *self.nat_chains,
                *self.nat_rules,
                "COMMIT",
                "",
            ]
        )


def is_large_cluster(view: NodeView) -> bool:
    """Upstream's large-cluster mode: no per-endpoint comments, stale chains cleaned up rarely.

    Callers use it to decide whether to run iptables-save for `existing_nat_chains` at all.
    """
    return view.total_endpoints > LARGE_CLUSTER_ENDPOINTS


def render(
    view: NodeView,
    opts: IptablesOptions,
    *,
    changed_services: Collection[tuple[str, str]] | None = None,
    existing_nat_chains: Collection[str] | None = None,
    stale_cleanup_due: bool = True,
) -> Rendered:
    """The restore input for one sync.

    changed_services: (namespace, name) of the services whose own chains must be rewritten;
        None for a full sync (every chain written).
    existing_nat_chains: the nat chains the kernel has now (from iptables-save); None when
        unknown, in which case no stale chain is deleted.
    stale_cleanup_due: in large-cluster mode upstream deletes stale chains at most once per
        syncPeriod (iptables-save is slow on big rulesets); the caller says whether that period
        has passed. Ignored outside large-cluster mode, where stale chains go on every sync.
    """
    w = _Writer()
    ipv6 = opts.family == IPV6
    mark = opts.masquerade_mark
    localhost_nodeports = opts.localhost_nodeports_enabled

    for chain in (KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL):
        w.filter_chains.append(f":{chain} - [0:0]")
    for chain in (KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ):
        w.nat_chains.append(f":{chain} - [0:0]")

    # Masquerade only what a service rule marked; clear the mark so a packet that loops
    # through the stack again is not masqueraded twice.
    w.nat_rules.append(f"-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN")
    w.nat_rules.append(f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}")
    masq = f'-A {KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
    w.nat_rules.append(masq + (" --random-fully" if opts.random_fully else ""))
    w.nat_rules.append(f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}")

    if localhost_nodeports:
        # route_localnet (needed for localhost NodePorts) would otherwise let remote hosts
        # reach 127.0.0.0/8 services (CVE-2020-8558).
        w.filter_chains.append(f":{KUBE_FIREWALL} - [0:0]")
        w.filter_rules.append(
            f'-A {KUBE_FIREWALL} -m comment --comment "block incoming localnet connections" '
            "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        )

    large = is_large_cluster(view)
    changed = None if changed_services is None else frozenset(changed_services)
    node_ip = ipaddress.ip_address(opts.node_ip) if opts.node_ip else None
    no_local_internal = no_local_external = 0

    for name in sorted(view.services):
        svc = view.services[name]
        sink = w.written if changed is None or name.service in changed else w.skipped
        missing = _render_service(w, sink, svc, view.endpoints.get(name, []), opts, large, node_ip)
        no_local_internal += missing[0]
        no_local_external += missing[1]

    deleted: list[str] = []
    cleanup = existing_nat_chains is not None and (not large or stale_cleanup_due)
    if cleanup and existing_nat_chains is not None:
        stale = set(existing_nat_chains) - w.active_nat_chains
        deleted = sorted(c for c in stale if names.is_service_chain(c))  # never touch others' chains
        for chain in deleted:
            # iptables-restore needs a chain line before -X; it also flushes the chain, which
            # drops the chain's own jumps that would otherwise keep other stale chains busy.
            w.nat_chains.append(f":{chain} - [0:0]")
            w.nat_rules.append(f"-X {chain}")

    _render_nodeports_jump(w, opts, ipv6, localhost_nodeports)

    if not opts.conntrack_tcp_liberal:
        # Out-of-window packets would otherwise reach the pod un-NATed and be answered with RST.
        nfacct = f" -m nfacct --nfacct-name {NFACCT_CT_INVALID}" if NFACCT_CT_INVALID in opts.nfacct_counters else ""
        w.filter_rules.append(f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP")
    w.filter_rules.append(
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules" -m mark --mark {mark}/{mark} -j ACCEPT'
    )
    w.filter_rules.append(
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    )

    return Rendered(
        text=w.text(),
        filter_rules=len(w.filter_rules),
        nat_rules=len(w.nat_rules) - len(deleted),
        nat_chains=frozenset(w.active_nat_chains),
        no_local_endpoints_internal=no_local_internal,
        no_local_endpoints_external=no_local_external,
        large_cluster_mode=large,
        full_sync=changed is None,
        skipped_nat_rules=len(w.skipped.rules),
        skipped_nat_chains=len(w.skipped.chains),
        deleted_chains=tuple(deleted),
        stale_cleanup_done=cleanup,
    )


def _render_service(
    w: _Writer,
    sink: _NatSink,
    svc: ServicePortInfo,
    endpoints: list[EndpointInfo],
    opts: IptablesOptions,
    large: bool,
    node_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> tuple[int, int]:
    """Rules for one service port. Returns (no local endpoints internally, externally) counts."""
    spn = str(svc.name)
    proto = svc.protocol.lower()
    cat = categorize(endpoints, svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)

    cluster_chain = names.service_chain(spn, proto)
    local_chain = names.local_chain(spn, proto)
    ext_chain = names.external_chain(spn, proto)
    fw_chain = names.firewall_chain(spn, proto)

    uses_cluster_chain = bool(cat.cluster) and svc.uses_cluster_endpoints
    uses_local_chain = bool(cat.local) and svc.uses_local_endpoints
    has_endpoints = cat.has_any

    internal_chain, has_internal = cluster_chain, has_endpoints
    if svc.internal_policy_local:
        internal_chain = local_chain
        has_internal = has_internal and bool(cat.local)
    external_policy_chain, has_external = cluster_chain, has_endpoints
    if svc.external_policy_local:
        external_policy_chain = local_chain
        has_external = has_external and bool(cat.local)
    # The EXT chain exists whenever there are endpoints anywhere, even if none is usable for
    # external traffic, because it also short-circuits traffic from pods and the node itself.
    uses_ext_chain = has_endpoints and svc.externally_accessible
    uses_fw_chain = has_endpoints and bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges)
    lb_chain = fw_chain if uses_fw_chain else ext_chain

    missing_internal = missing_external = 0
    if not has_endpoints:
        internal_target = external_target = "REJECT"
        internal_comment = external_comment = f'"{spn} has no endpoints"'
    else:
        internal_target = external_target = internal_comment = external_comment = ""
        if not has_internal:
            internal_target, internal_comment = "DROP", f'"{spn} has no local endpoints"'
            missing_internal = 1
        if not has_external:
            external_target, external_comment = "DROP", f'"{spn} has no local endpoints"'
            missing_external = 1

    match = f"-m {proto} -p {proto}"
    dport = f"--dport {svc.port}"
    cluster_ip = str(svc.cluster_ip)

    if has_internal:
        w.nat_rules.append(
            f'-A {KUBE_SERVICES} -m comment --comment "{spn} cluster IP" {match} -d {cluster_ip} {dport} -j {internal_chain}'
        )
    else:
        w.filter_rules.append(
            f"-A {KUBE_SERVICES} -m comment --comment {internal_comment} {match} -d {cluster_ip} {dport} -j {internal_target}"
        )

    for ip in svc.external_ips:
        if has_endpoints:
            w.nat_rules.append(
                f'-A {KUBE_SERVICES} -m comment --comment "{spn} external IP" {match} -d {ip} {dport} -j {ext_chain}'
            )
        if not has_external:
            w.filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} "
                f"{match} -d {ip} {dport} -j {external_target}"
            )

    for ip in svc.load_balancer_vips:
        if has_endpoints:
            w.nat_rules.append(
                f'-A {KUBE_SERVICES} -m comment --comment "{spn} loadbalancer IP" {match} -d {ip} {dport} -j {lb_chain}'
            )
        if uses_fw_chain:
            w.filter_rules.append(
                f'-A {KUBE_PROXY_FIREWALL} -m comment --comment "{spn} traffic not accepted by {fw_chain}" '
                f"{match} -d {ip} {dport} -j DROP"
            )
    if not has_external:
        for ip in svc.load_balancer_vips:
            w.filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} "
                f"{match} -d {ip} {dport} -j {external_target}"
            )

    if svc.node_port:
        if has_endpoints:
            if opts.localhost_nodeports_enabled and NFACCT_LOCALHOST_NODEPORT in opts.nfacct_counters:
                w.nat_rules.append(
                    f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} -d 127.0.0.0/8 --dport {svc.node_port} "
                    f"-m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {ext_chain}"
                )
            w.nat_rules.append(f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} --dport {svc.node_port} -j {ext_chain}")
        if not has_external:
            w.filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} -m addrtype --dst-type LOCAL "
                f"{match} --dport {svc.node_port} -j {external_target}"
            )

    if svc.health_check_node_port:
        # Load balancers probe this port to find nodes with local endpoints: always accept.
        w.filter_rules.append(
            f'-A {KUBE_NODEPORTS} -m comment --comment "{spn} health check node port" '
            f"-m tcp -p tcp --dport {svc.health_check_node_port} -j ACCEPT"
        )

    # Below: the service's own chains. For an unchanged service they go to the discard sink.
    if has_internal:
        head = f'-A {internal_chain} -m comment --comment "{spn} cluster IP" {match} -d {cluster_ip} {dport}'
        if opts.masquerade_all:
            sink.rules.append(f"{head} -j {KUBE_MARK_MASQ}")
        elif opts.local_detector.implemented:
            # Off-cluster clients may route the service range to any node; masquerade them so
            # replies come back through this node.
            not_local = local_detector_args(opts.local_detector, local=False)
            sink.rules.append(f"{head} {not_local} -j {KUBE_MARK_MASQ}")

    if uses_ext_chain:
        w.nat_chain(ext_chain, sink)
        if not svc.external_policy_local:
            # Endpoints may be on another node: masquerade so the reply returns through us.
            sink.rules.append(
                f'-A {ext_chain} -m comment --comment "masquerade traffic for {spn} external destinations" -j {KUBE_MARK_MASQ}'
            )
        else:
            if opts.local_detector.implemented:
                # Pods reaching an external IP of their own cluster behave as if they went out to the
                # load balancer and came back: no traffic policy applies.
                local = local_detector_args(opts.local_detector, local=True)
                sink.rules.append(
                    f'-A {ext_chain} -m comment --comment "pod traffic for {spn} external destinations" '
                    f"{local} -j {cluster_chain}"
                )
            # The node itself would use the external IP as source address: masquerade it.
            sink.rules.append(
                f'-A {ext_chain} -m comment --comment "masquerade LOCAL traffic for {spn} external destinations" '
                f"-m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
            )
            sink.rules.append(
                f'-A {ext_chain} -m comment --comment "route LOCAL traffic for {spn} external destinations" '
                f"-m addrtype --src-type LOCAL -j {cluster_chain}"
            )
        if has_external:
            sink.rules.append(f"-A {ext_chain} -j {external_policy_chain}")

    if uses_fw_chain:
        w.nat_chain(fw_chain, sink)
        head = f'-A {fw_chain} -m comment --comment "{spn} loadbalancer IP"'
        allow_from_node = False
        for cidr in svc.load_balancer_source_ranges:
            sink.rules.append(f"{head} -s {cidr} -j {ext_chain}")
            allow_from_node = allow_from_node or (node_ip is not None and node_ip in cidr)
        if allow_from_node:
            # A VIP-like load balancer whose IP is also local: the node's own requests loop
            # back with the VIP as source and must be allowed too.
            for ip in svc.load_balancer_vips:
                sink.rules.append(f"{head} -s {ip} -j {ext_chain}")
        sink.rules.append(
            f'-A {fw_chain} -m comment --comment "other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"'
        )

    if uses_cluster_chain:
        w.nat_chain(cluster_chain, sink)
        _render_dispatch(sink, svc, spn, proto, cluster_chain, cat.cluster, large)
    if uses_local_chain:
        w.nat_chain(local_chain, sink)
        _render_dispatch(sink, svc, spn, proto, local_chain, cat.local, large)

    for ep in cat.reachable:
        sep = names.endpoint_chain(spn, proto, ep.address)
        w.nat_chain(sep, sink)
        head = f"-A {sep}" if large else f"-A {sep} -m comment --comment {spn}"
        # Hairpin: a pod reaching itself through the service must be masqueraded, or it
        # would answer itself directly and the client would drop the unexpected reply.
        sink.rules.append(f"{head} -s {ep.ip} -j {KUBE_MARK_MASQ}")
        affinity = f" -m recent --name {sep} --set" if svc.client_ip_affinity else ""
        sink.rules.append(f"{head}{affinity} {match} -j DNAT --to-destination {ep.address}")

    return missing_internal, missing_external


def _render_dispatch(
    sink: _NatSink, svc: ServicePortInfo, spn: str, proto: str, chain: str, endpoints: list[EndpointInfo], large: bool
) -> None:
    """Spread new connections over `endpoints`: rule i matches with probability 1/(n-i)."""
    seps = [(ep, names.endpoint_chain(spn, proto, ep.address)) for ep in endpoints]
    if svc.client_ip_affinity:
        for ep, sep in seps:
            comment = "" if large else f' -m comment --comment "{spn} -> {ep.address}"'
            sink.rules.append(
                f"-A {chain}{comment} -m recent --name {sep} --rcheck --seconds {svc.sticky_max_age_seconds} --reap -j {sep}"
            )
    n = len(seps)
    for i, (ep, sep) in enumerate(seps):
        comment = "" if large else f' -m comment --comment "{spn} -> {ep.address}"'
        stat = f" -m statistic --mode random --probability {_probability(n - i)}" if i < n - 1 else ""
        sink.rules.append(f"-A {chain}{comment}{stat} -j {sep}")


def _render_nodeports_jump(w: _Writer, opts: IptablesOptions, ipv6: bool, localhost_nodeports: bool) -> None:
    """KUBE-SERVICES ends with the jump to KUBE-NODEPORTS: after every more specific rule."""
    comment = '-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
    if opts.nodeport_match_all:
        dest = "-m addrtype --dst-type LOCAL"
        if ipv6:
            dest += " ! -d ::1/128"
        elif not localhost_nodeports:
            dest += " ! -d 127.0.0.0/8"
        w.nat_rules.append(f"-A {KUBE_SERVICES} {comment} {dest} -j {KUBE_NODEPORTS}")
        return
    for ip in opts.nodeport_ips:
        if ipaddress.ip_address(ip).is_loopback and (ipv6 or not localhost_nodeports):
            continue  # localhost NodePorts are impossible on IPv6 and disabled here
        w.nat_rules.append(f"-A {KUBE_SERVICES} {comment} -d {ip} -j {KUBE_NODEPORTS}")
