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

Each service port's rules are computed on their own (`_render_service` → `ServiceRules`: its
lines in the shared chains, its own chains and their rules) and joined in name order.

Partial syncs (`changed_services`): the shared chains (KUBE-SERVICES, KUBE-NODEPORTS, the filter
table) are always rewritten whole, but a service whose objects did not change keeps the
SVC/SVL/EXT/FW/SEP chains already in the kernel. Its rules still count, so that the active-chain
set and the rule-count metrics are those of a full sync.
Stale chains (`existing_nat_chains`): our service chains that the kernel has and this rendering
does not use are flushed (chain line) and deleted (`-X`).

A `RenderCache` remembers each service port's `ServiceRules` from one render to the next and
hands them back while the port, its endpoints and the options are unchanged: with it a sync
after a small change costs the few changed services plus the joining, not a whole render.
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import operator
from bisect import insort
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kubeproxy.backends.iptables import names
from kubeproxy.backends.kernel_text import word
from kubeproxy.proxy.config import LocalDetector
from kubeproxy.proxy.model import IPV6, EndpointInfo, NodeView, ServicePortInfo, ServicePortName
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


@dataclass(frozen=True, slots=True)
class ServiceRules:
    """What one service port adds to the ruleset. `render` joins these in name order."""

    filter_rules: tuple[str, ...]  # in the shared filter chains (REJECT, DROP, firewall, health check)
    shared_nat_rules: tuple[str, ...]  # its entries in the nat KUBE-SERVICES and KUBE-NODEPORTS
    chains: tuple[str, ...]  # its own nat chains (EXT, FW, SVC, SVL, SEP), in declaration order
    chain_rules: tuple[str, ...]  # the rules of those chains
    no_local_endpoints_internal: int  # 1 if Local internal traffic has nowhere to go
    no_local_endpoints_external: int


class _Writer:
    """The four buffers upstream writes into: chain declarations and rules, per table."""

    def __init__(self) -> None:
        self.filter_chains: list[str] = []
        self.filter_rules: list[str] = []
        self.nat_chains: list[str] = []
        self.nat_rules: list[str] = []

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


_SERVICE_OF = operator.attrgetter("service")


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
    cache: RenderCache | None = None,
) -> Rendered:
    """The restore input for one sync.

    changed_services: (namespace, name) of the services whose own chains must be rewritten;
        None for a full sync (every chain written).
    existing_nat_chains: the nat chains the kernel has now (from iptables-save); None when
        unknown, in which case no stale chain is deleted.
    stale_cleanup_due: in large-cluster mode upstream deletes stale chains at most once per
        syncPeriod (iptables-save is slow on big rulesets); the caller says whether that period
        has passed. Ignored outside large-cluster mode, where stale chains go on every sync.
    cache: per-service rules of earlier renders to reuse where nothing changed (memoisation
        only: the result is the same with or without it).
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

    def render_one(svc: ServicePortInfo, endpoints: list[EndpointInfo]) -> ServiceRules:
        return _render_service(svc, endpoints, opts, large, node_ip)

    if cache is None:
        ports = sorted(view.services)
        per_port = [render_one(view.services[name], view.endpoints.get(name, [])) for name in ports]
    else:
        ports, per_port = cache.rules(view, (opts, large), render_one)

    # A partial sync leaves the own chains of unchanged services as they are in the kernel.
    writes = [True] * len(ports) if changed is None else list(map(changed.__contains__, map(_SERVICE_OF, ports)))
    written = list(itertools.compress(per_port, writes))
    w.filter_rules.extend(itertools.chain.from_iterable(rules.filter_rules for rules in per_port))
    w.nat_chains.extend(f":{chain} - [0:0]" for rules in written for chain in rules.chains)
    w.nat_rules.extend(_nat_service_rules(per_port, writes))
    # Chains left as they are still count, and are in use: not to be mistaken for stale ones.
    active_nat_chains = frozenset(itertools.chain.from_iterable(rules.chains for rules in per_port))
    skipped_rules = sum(len(rules.chain_rules) for rules in per_port) - sum(len(rules.chain_rules) for rules in written)
    skipped_chains = sum(len(rules.chains) for rules in per_port) - sum(len(rules.chains) for rules in written)

    deleted: list[str] = []
    cleanup = existing_nat_chains is not None and (not large or stale_cleanup_due)
    if cleanup and existing_nat_chains is not None:
        stale = set(existing_nat_chains) - active_nat_chains
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
        nat_chains=active_nat_chains,
        no_local_endpoints_internal=sum(rules.no_local_endpoints_internal for rules in per_port),
        no_local_endpoints_external=sum(rules.no_local_endpoints_external for rules in per_port),
        large_cluster_mode=large,
        full_sync=changed is None,
        skipped_nat_rules=skipped_rules,
        skipped_nat_chains=skipped_chains,
        deleted_chains=tuple(deleted),
        stale_cleanup_done=cleanup,
    )


def _nat_service_rules(per_port: list[ServiceRules], writes: list[bool]) -> Iterator[str]:
    """The services' nat rules in order: each one's shared-chain entries, then its own chains' rules."""
    for rules, write in zip(per_port, writes, strict=True):
        yield from rules.shared_nat_rules
        if write:
            yield from rules.chain_rules


def _render_service(
    svc: ServicePortInfo,
    endpoints: list[EndpointInfo],
    opts: IptablesOptions,
    large: bool,
    node_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> ServiceRules:
    """Rules for one service port: a pure function of its arguments (RenderCache relies on it)."""
    filter_rules: list[str] = []
    shared_nat_rules: list[str] = []
    chains: list[str] = []
    chain_rules: list[str] = []
    # Chain hashes and comments both use it, so it is made safe once (kernel_text.word: valid
    # names are unchanged, and the text stays upstream's).
    spn = word(str(svc.name))
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
        shared_nat_rules.append(
            f'-A {KUBE_SERVICES} -m comment --comment "{spn} cluster IP" {match} -d {cluster_ip} {dport} -j {internal_chain}'
        )
    else:
        filter_rules.append(
            f"-A {KUBE_SERVICES} -m comment --comment {internal_comment} {match} -d {cluster_ip} {dport} -j {internal_target}"
        )

    for ip in svc.external_ips:
        if has_endpoints:
            shared_nat_rules.append(
                f'-A {KUBE_SERVICES} -m comment --comment "{spn} external IP" {match} -d {ip} {dport} -j {ext_chain}'
            )
        if not has_external:
            filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} "
                f"{match} -d {ip} {dport} -j {external_target}"
            )

    for ip in svc.load_balancer_vips:
        if has_endpoints:
            shared_nat_rules.append(
                f'-A {KUBE_SERVICES} -m comment --comment "{spn} loadbalancer IP" {match} -d {ip} {dport} -j {lb_chain}'
            )
        if uses_fw_chain:
            filter_rules.append(
                f'-A {KUBE_PROXY_FIREWALL} -m comment --comment "{spn} traffic not accepted by {fw_chain}" '
                f"{match} -d {ip} {dport} -j DROP"
            )
    if not has_external:
        for ip in svc.load_balancer_vips:
            filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} "
                f"{match} -d {ip} {dport} -j {external_target}"
            )

    if svc.node_port:
        if has_endpoints:
            if opts.localhost_nodeports_enabled and NFACCT_LOCALHOST_NODEPORT in opts.nfacct_counters:
                shared_nat_rules.append(
                    f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} -d 127.0.0.0/8 --dport {svc.node_port} "
                    f"-m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {ext_chain}"
                )
            shared_nat_rules.append(
                f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} --dport {svc.node_port} -j {ext_chain}"
            )
        if not has_external:
            filter_rules.append(
                f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} -m addrtype --dst-type LOCAL "
                f"{match} --dport {svc.node_port} -j {external_target}"
            )

    if svc.health_check_node_port:
        # Load balancers probe this port to find nodes with local endpoints: always accept.
        filter_rules.append(
            f'-A {KUBE_NODEPORTS} -m comment --comment "{spn} health check node port" '
            f"-m tcp -p tcp --dport {svc.health_check_node_port} -j ACCEPT"
        )

    # Below: the service's own chains.
    if has_internal:
        head = f'-A {internal_chain} -m comment --comment "{spn} cluster IP" {match} -d {cluster_ip} {dport}'
        if opts.masquerade_all:
            chain_rules.append(f"{head} -j {KUBE_MARK_MASQ}")
        elif opts.local_detector.implemented:
            # Off-cluster clients may route the service range to any node; masquerade them so
            # replies come back through this node.
            not_local = local_detector_args(opts.local_detector, local=False)
            chain_rules.append(f"{head} {not_local} -j {KUBE_MARK_MASQ}")

    if uses_ext_chain:
        chains.append(ext_chain)
        if not svc.external_policy_local:
            # Endpoints may be on another node: masquerade so the reply returns through us.
            chain_rules.append(
                f'-A {ext_chain} -m comment --comment "masquerade traffic for {spn} external destinations" -j {KUBE_MARK_MASQ}'
            )
        else:
            if opts.local_detector.implemented:
                # Pods reaching an external IP of their own cluster behave as if they went out to the
                # load balancer and came back: no traffic policy applies.
                local = local_detector_args(opts.local_detector, local=True)
                chain_rules.append(
                    f'-A {ext_chain} -m comment --comment "pod traffic for {spn} external destinations" '
                    f"{local} -j {cluster_chain}"
                )
            # The node itself would use the external IP as source address: masquerade it.
            chain_rules.append(
                f'-A {ext_chain} -m comment --comment "masquerade LOCAL traffic for {spn} external destinations" '
                f"-m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
            )
            chain_rules.append(
                f'-A {ext_chain} -m comment --comment "route LOCAL traffic for {spn} external destinations" '
                f"-m addrtype --src-type LOCAL -j {cluster_chain}"
            )
        if has_external:
            chain_rules.append(f"-A {ext_chain} -j {external_policy_chain}")

    if uses_fw_chain:
        chains.append(fw_chain)
        head = f'-A {fw_chain} -m comment --comment "{spn} loadbalancer IP"'
        allow_from_node = False
        for cidr in svc.load_balancer_source_ranges:
            chain_rules.append(f"{head} -s {cidr} -j {ext_chain}")
            allow_from_node = allow_from_node or (node_ip is not None and node_ip in cidr)
        if allow_from_node:
            # A VIP-like load balancer whose IP is also local: the node's own requests loop
            # back with the VIP as source and must be allowed too.
            for ip in svc.load_balancer_vips:
                chain_rules.append(f"{head} -s {ip} -j {ext_chain}")
        chain_rules.append(f'-A {fw_chain} -m comment --comment "other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"')

    if uses_cluster_chain:
        chains.append(cluster_chain)
        _render_dispatch(chain_rules, svc, spn, proto, cluster_chain, cat.cluster, large)
    if uses_local_chain:
        chains.append(local_chain)
        _render_dispatch(chain_rules, svc, spn, proto, local_chain, cat.local, large)

    for ep in cat.reachable:
        sep = names.endpoint_chain(spn, proto, ep.address)
        chains.append(sep)
        head = f"-A {sep}" if large else f"-A {sep} -m comment --comment {spn}"
        # Hairpin: a pod reaching itself through the service must be masqueraded, or it
        # would answer itself directly and the client would drop the unexpected reply.
        chain_rules.append(f"{head} -s {ep.ip} -j {KUBE_MARK_MASQ}")
        affinity = f" -m recent --name {sep} --set" if svc.client_ip_affinity else ""
        chain_rules.append(f"{head}{affinity} {match} -j DNAT --to-destination {ep.address}")

    return ServiceRules(
        tuple(filter_rules),
        tuple(shared_nat_rules),
        tuple(chains),
        tuple(chain_rules),
        missing_internal,
        missing_external,
    )


def _render_dispatch(
    out: list[str], svc: ServicePortInfo, spn: str, proto: str, chain: str, endpoints: list[EndpointInfo], large: bool
) -> None:
    """Spread new connections over `endpoints`: rule i matches with probability 1/(n-i)."""
    seps = [(ep, names.endpoint_chain(spn, proto, ep.address)) for ep in endpoints]
    if svc.client_ip_affinity:
        for ep, sep in seps:
            comment = "" if large else f' -m comment --comment "{spn} -> {ep.address}"'
            out.append(
                f"-A {chain}{comment} -m recent --name {sep} --rcheck --seconds {svc.sticky_max_age_seconds} --reap -j {sep}"
            )
    n = len(seps)
    for i, (ep, sep) in enumerate(seps):
        comment = "" if large else f' -m comment --comment "{spn} -> {ep.address}"'
        stat = f" -m statistic --mode random --probability {_probability(n - i)}" if i < n - 1 else ""
        out.append(f"-A {chain}{comment}{stat} -j {sep}")


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


class _Memo(NamedTuple):
    svc: ServicePortInfo | None
    endpoints: list[EndpointInfo] | None  # the view's own entry: None when it had none
    rules: ServiceRules | None


_NO_MEMO = _Memo(None, None, None)
_MEMO_SVC, _MEMO_ENDPOINTS, _MEMO_RULES = (operator.attrgetter(f) for f in ("svc", "endpoints", "rules"))


class RenderCache:
    """Each service port's `ServiceRules` from the previous render, to reuse in the next one.

    Memoisation of `_render_service` and nothing else: an entry is reused only for a service
    port whose ServicePortInfo and endpoints are the same objects as last time, or equal to
    them, under equal options and large-cluster mode (a change of either empties the cache).
    Identity is checked first because it is cheap and, for views from a `ViewBuilder`, holds
    for every unchanged port; views are immutable, so the same objects mean the same rules.
    Use one cache per rule set (IP family).

    At 10k service ports a Python loop touching every port costs more than the few renders a
    small change needs, so the bookkeeping works on whole lists, kept in name order.
    """

    # Beyond this many new service ports a fresh sort beats inserting each into the order.
    _INSERTS = 256

    def __init__(self) -> None:
        self._key: tuple[IptablesOptions, bool] | None = None
        self._ports: list[ServicePortName] = []  # the last render's service ports, sorted
        self._memos: list[_Memo] = []  # their memos, in the same order
        self.reused = 0  # service ports taken from the cache by the last render
        self.rendered = 0  # service ports the last render computed

    def rules(
        self,
        view: NodeView,
        key: tuple[IptablesOptions, bool],
        render_one: Callable[[ServicePortInfo, list[EndpointInfo]], ServiceRules],
    ) -> tuple[list[ServicePortName], list[ServiceRules]]:
        """Every service port of `view` in name order, and its rules, rendered where needed.

        key: everything besides the port and its endpoints that the rules depend on.
        """
        if key != self._key:
            # A private copy, so that options changed in place still invalidate the cache.
            self._key, self._ports, self._memos = copy.deepcopy(key), [], []
        try:
            return self._rules(view, render_one)
        except BaseException:
            # Half-updated bookkeeping must not outlive the failure: start afresh next time.
            self._key, self._ports, self._memos = None, [], []
            raise

    def _rules(
        self, view: NodeView, render_one: Callable[[ServicePortInfo, list[EndpointInfo]], ServiceRules]
    ) -> tuple[list[ServicePortName], list[ServiceRules]]:
        services, endpoints = view.services, view.endpoints
        ports, memos = self._ports, self._memos
        svcs = list(map(services.get, ports))
        # Not the same service ports as last time? (`None in svcs` would call each one's __eq__.)
        if len(ports) != len(services) or not all(svcs):
            ports, memos = self._realigned(services)
            svcs = list(map(services.__getitem__, ports))
        eps = list(map(endpoints.get, ports))
        memos = list(memos)
        suspects = itertools.compress(
            itertools.count(),
            map(
                operator.or_,
                map(operator.is_not, svcs, map(_MEMO_SVC, memos)),
                map(operator.is_not, eps, map(_MEMO_ENDPOINTS, memos)),
            ),
        )
        rendered = 0
        for i in suspects:
            old, svc, e = memos[i], svcs[i], eps[i]
            if old is not _NO_MEMO and old.svc == svc and (old.endpoints or []) == (e or []):
                memos[i] = _Memo(svc, e, old.rules)  # equal values: remember the new objects
            else:
                memos[i] = _Memo(svc, e, render_one(svc, e or []))  # type: ignore[arg-type]  # every port has its svc
                rendered += 1
        self._ports, self._memos = ports, memos
        self.reused, self.rendered = len(ports) - rendered, rendered
        return ports, [m.rules for m in memos if m.rules is not None]

    def _realigned(self, services: Mapping[ServicePortName, ServicePortInfo]) -> tuple[list[ServicePortName], list[_Memo]]:
        """The keys of `services` in order, with the memos of those seen last time (_NO_MEMO for new ones)."""
        known = dict(zip(self._ports, self._memos, strict=True))
        added = services.keys() - known.keys()
        if len(added) > self._INSERTS:
            ports = sorted(services)
        else:
            removed = known.keys() - services.keys()
            ports = [p for p in self._ports if p not in removed] if removed else list(self._ports)
            for port in added:
                insort(ports, port)
        return ports, list(map(known.get, ports, itertools.repeat(_NO_MEMO)))
