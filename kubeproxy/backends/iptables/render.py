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
It keeps them without their own chains' text (cache.py), which only the ports this render
writes need: those come back whole.
"""

from __future__ import annotations

import ipaddress
import itertools
import operator
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from socket import inet_ntoa
from typing import NamedTuple

from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables.cache import RenderCache
from kubeproxy.cluster.addresses import CheckedIP
from kubeproxy.kernel.kernel_text import word
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo
from kubeproxy.model.options import NFACCT_CT_INVALID, NFACCT_LOCALHOST_NODEPORT, Family, NodeOptions
from kubeproxy.model.proxy_config import LocalDetector
from kubeproxy.model.topology import Categorized, categorize

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_FIREWALL = "KUBE-FIREWALL"  # kubelet's chain; kube-proxy keeps a copy of its one rule
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"

# Above this many endpoints upstream drops per-endpoint comments to keep the ruleset small.
LARGE_CLUSTER_ENDPOINTS = 1000


@dataclass(frozen=True)
class Rendered:
    text: str
    filter_rules: int
    nat_rules: int  # rules written to the kernel (not counting -X lines)
    # Each service port's own nat chains, in order; their union is `nat_chains`. Kept per port
    # so that a partial sync at 10k services builds no set of 110k names nobody asks for.
    service_chains: tuple[tuple[str, ...], ...] = field(repr=False)
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

    @cached_property
    def nat_chains(self) -> frozenset[str]:
        """The service/endpoint chains this rendering uses, written or left as they are."""
        return frozenset(itertools.chain.from_iterable(self.service_chains))

    @property
    def nat_rules_total(self) -> int:
        """Upstream's sync_proxy_rules_iptables_total{table="nat"}: the rules the kernel holds."""
        return self.nat_rules + self.skipped_nat_rules


@dataclass(frozen=True)
class TableText:
    """One table's part of the restore input: `*name`, the `chunks` in order, `COMMIT`.

    Every chunk is whole lines (each ending in a newline), or "".
    """

    name: str
    shared_chains: tuple[str, ...]  # the chains it declares that are not service chains
    chunks: list[str] = field(repr=False)

    def pieces(self) -> Iterator[str]:
        yield f"*{self.name}\n"
        yield from self.chunks
        yield "COMMIT\n"


def restore_chunks(tables: Iterable[TableText]) -> Iterator[str]:
    """The restore input of `tables`, piece by piece."""
    return itertools.chain.from_iterable(t.pieces() for t in tables)


def restore_text(tables: Iterable[TableText]) -> str:
    """The restore input of `tables` as one text."""
    return "".join(restore_chunks(tables))


def _probability(n: int) -> str:
    return f"{1.0 / n:0.10f}"


# The statistic match of dispatch rule i out of n is that of 1/(n-i): precomputed for the usual
# endpoint counts (90k formats at 10k services x 10 endpoints otherwise). Index k: 1/k.
_STATISTIC = tuple(f" -m statistic --mode random --probability {_probability(k)}" if k else "" for k in range(257))


def _statistic_args(n: int) -> tuple[str, ...]:
    """The statistic match of each of n dispatch rules: 1/n, 1/(n-1), ..., 1/2, and none for the last."""
    if n < len(_STATISTIC):
        return (*_STATISTIC[n:1:-1], "")
    return (*(f" -m statistic --mode random --probability {_probability(k)}" for k in range(n, 1, -1)), "")


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


class ServiceRules(NamedTuple):
    """What one service port adds to the ruleset. `render` joins these in name order.

    Kept as text blocks (each line ending in a newline, "" for none) with their line counts,
    not as tuples of lines: the final text is then a join of a few pieces per service, and
    320k small strings do not all stay alive next to it (10k services x 10 endpoints).
    Immutable, as RenderCache needs; a NamedTuple because a frozen dataclass costs a
    setattr call per field and one is built per service port.
    """

    filter_text: str  # in the shared filter chains (REJECT, DROP, firewall, health check)
    filter_rules: int
    entry_text: str  # its entries in the nat KUBE-SERVICES and KUBE-NODEPORTS
    entry_rules: int
    chains: tuple[str, ...]  # its own nat chains (EXT, FW, SVC, SVL, SEP), in declaration order
    chain_decls: str  # their `:chain - [0:0]` lines
    chain_text: str  # the rules of those chains
    chain_rules: int
    no_local_endpoints_internal: int  # 1 if Local internal traffic has nowhere to go
    no_local_endpoints_external: int


def _block(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def _lines(rendered: Iterable[ServiceRules], attribute: str) -> str:
    """One text of the given block of every service port, in order."""
    return "".join(map(operator.attrgetter(attribute), rendered))


def _count(rendered: Iterable[ServiceRules], attribute: str) -> int:
    return sum(map(operator.attrgetter(attribute), rendered))


_SERVICE_OF = operator.attrgetter("service")
_CHAINS_OF = operator.attrgetter("chains")


def is_large_cluster(view: NodeView) -> bool:
    """Upstream's large-cluster mode: no per-endpoint comments, stale chains cleaned up rarely.

    Callers use it to decide whether to run iptables-save for `existing_nat_chains` at all.
    """
    return view.total_endpoints > LARGE_CLUSTER_ENDPOINTS


def render(
    view: NodeView,
    opts: NodeOptions,
    *,
    changed_services: Collection[tuple[str, str]] | None = None,
    existing_nat_chains: Collection[str] | None = None,
    stale_cleanup_due: bool = True,
    cache: RenderCache | None = None,
) -> Rendered:
    """The restore input for one sync (`render_tables`' tables joined into `text`)."""
    rendered, tables = render_tables(
        view,
        opts,
        changed_services=changed_services,
        existing_nat_chains=existing_nat_chains,
        stale_cleanup_due=stale_cleanup_due,
        cache=cache,
    )
    whole = replace(rendered, text=restore_text(tables))
    if "nat_chains" in rendered.__dict__:
        whole.__dict__["nat_chains"] = rendered.__dict__["nat_chains"]  # where cached_property keeps its value
    return whole


def render_tables(
    view: NodeView,
    opts: NodeOptions,
    *,
    changed_services: Collection[tuple[str, str]] | None = None,
    existing_nat_chains: Collection[str] | None = None,
    stale_cleanup_due: bool = True,
    cache: RenderCache | None = None,
) -> tuple[Rendered, tuple[TableText, ...]]:
    """The restore input for one sync, as its tables' pieces; the `Rendered`'s text is "".

    The pieces are each service port's own strings: a full sync at 10k services is 32 MiB of
    text that need not be copied into one string to be written to iptables-restore.

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
    ipv6 = opts.family == Family.IPV6
    mark = opts.masquerade_mark
    localhost_nodeports = opts.localhost_nodeports_enabled

    filter_chains = [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL]
    filter_head: list[str] = []
    if localhost_nodeports:
        # route_localnet (needed for localhost NodePorts) would otherwise let remote hosts
        # reach 127.0.0.0/8 services (CVE-2020-8558).
        filter_chains.append(KUBE_FIREWALL)
        filter_head.append(
            f'-A {KUBE_FIREWALL} -m comment --comment "block incoming localnet connections" '
            "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        )
    nat_chains = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ]
    # Masquerade only what a service rule marked; clear the mark so a packet that loops
    # through the stack again is not masqueraded twice.
    masq = f'-A {KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
    nat_head = [
        f"-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}",
        masq + (" --random-fully" if opts.random_fully else ""),
        f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}",
    ]

    large = is_large_cluster(view)
    changed = None if changed_services is None else frozenset(changed_services)
    # A family the node has no address of takes the loopback address as node IP, as upstream's
    # detectNodeIPs (cmd/kube-proxy/app/server.go) gives its proxier.
    node_ip = ipaddress.ip_address(opts.node_ip or opts.family.loopback)

    def render_one(svc: ServicePortInfo, endpoints: list[EndpointInfo]) -> ServiceRules:
        return _render_service(svc, endpoints, opts, large, node_ip)

    if cache is None:
        ports = sorted(view.services)
        services, endpoints = view.services, view.endpoints
        per_port = [render_one(services[name], endpoints.get(name, [])) for name in ports]
    else:
        ports, per_port = cache.rules(view, (opts, large), render_one, changed)

    # A partial sync leaves the own chains of unchanged services as they are in the kernel.
    writes = None if changed is None else list(map(changed.__contains__, map(_SERVICE_OF, ports)))
    written = per_port if writes is None else list(itertools.compress(per_port, writes))
    service_chains = tuple(map(_CHAINS_OF, per_port))
    skipped_rules = _count(per_port, "chain_rules") - _count(written, "chain_rules")
    skipped_chains = sum(map(len, service_chains)) - sum(map(len, map(_CHAINS_OF, written)))

    deleted: list[str] = []
    active_nat_chains: frozenset[str] | None = None
    cleanup = existing_nat_chains is not None and (not large or stale_cleanup_due)
    if cleanup and existing_nat_chains is not None:
        # Chains left as they are still count, and are in use: not to be mistaken for stale ones.
        active_nat_chains = frozenset(itertools.chain.from_iterable(service_chains))
        stale = set(existing_nat_chains) - active_nat_chains
        deleted = sorted(c for c in stale if names.is_service_chain(c))  # never touch others' chains
    # iptables-restore needs a chain line before -X; it also flushes the chain, which drops the
    # chain's own jumps that would otherwise keep other stale chains busy.
    nat_chains += deleted
    nat_tail = [f"-X {chain}" for chain in deleted]
    nat_tail += _nodeports_jump(opts, ipv6, localhost_nodeports)

    filter_tail: list[str] = []
    if not opts.conntrack_tcp_liberal:
        # Out-of-window packets would otherwise reach the pod un-NATed and be answered with RST.
        nfacct = f" -m nfacct --nfacct-name {NFACCT_CT_INVALID}" if NFACCT_CT_INVALID in opts.nfacct_counters else ""
        filter_tail.append(f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP")
    filter_tail.append(
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules" -m mark --mark {mark}/{mark} -j ACCEPT'
    )
    filter_tail.append(
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    )

    # Each service port's shared-chain entries, then (when written) its own chains' rules.
    if writes is None:
        service_nat = list(itertools.chain.from_iterable((r.entry_text, r.chain_text) for r in per_port))
    else:
        service_nat = [r.entry_text + r.chain_text if w else r.entry_text for r, w in zip(per_port, writes, strict=True)]
    tables = (
        TableText(
            "filter",
            tuple(filter_chains),
            [_declarations(filter_chains), _block(filter_head), _lines(per_port, "filter_text"), _block(filter_tail)],
        ),
        TableText(
            "nat",
            tuple(nat_chains[:4]),
            [
                _declarations(nat_chains[:4]),
                _lines(written, "chain_decls"),
                _declarations(nat_chains[4:]),
                _block(nat_head),
                *service_nat,
                _block(nat_tail),
            ],
        ),
    )
    filter_rules = len(filter_head) + _count(per_port, "filter_rules") + len(filter_tail)
    nat_rules = len(nat_head) + _count(per_port, "entry_rules") + _count(written, "chain_rules") + len(nat_tail)
    rendered = Rendered(
        text="",
        filter_rules=filter_rules,
        nat_rules=nat_rules - len(deleted),
        service_chains=service_chains,
        no_local_endpoints_internal=_count(per_port, "no_local_endpoints_internal"),
        no_local_endpoints_external=_count(per_port, "no_local_endpoints_external"),
        large_cluster_mode=large,
        full_sync=changed is None,
        skipped_nat_rules=skipped_rules,
        skipped_nat_chains=skipped_chains,
        deleted_chains=tuple(deleted),
        stale_cleanup_done=cleanup,
    )
    if active_nat_chains is not None:
        rendered.__dict__["nat_chains"] = active_nat_chains  # where cached_property keeps its value
    return rendered, tables


def _declarations(chains: list[str]) -> str:
    """The `:chain - [0:0]` lines that create (or flush) `chains`."""
    return ":" + " - [0:0]\n:".join(chains) + " - [0:0]\n" if chains else ""


@dataclass(slots=True)
class _Plan:
    """One service port's decisions (which chains, which targets), shared by the chain families.

    Built once per service port (10k+ per render) and never changed: a plain slotted
    dataclass, since a frozen one's __init__ costs a setattr call per field.
    """

    svc: ServicePortInfo
    spn: str  # `namespace/name:port`, made safe once (kernel_text.word: valid names unchanged)
    proto: str
    match: str  # `-m tcp -p tcp`
    dport: str  # `--dport 80`
    cluster_ip: str
    cat: Categorized
    cluster_chain: str
    local_chain: str
    ext_chain: str
    fw_chain: str
    internal_chain: str
    external_policy_chain: str
    has_endpoints: bool
    has_internal: bool
    has_external: bool
    uses_ext_chain: bool
    uses_fw_chain: bool

    @property
    def lb_chain(self) -> str:
        return self.fw_chain if self.uses_fw_chain else self.ext_chain

    def missing(self, has: bool) -> tuple[str, str]:
        """Target and comment for traffic with no usable endpoint ("", "" when there is one)."""
        if not self.has_endpoints:
            return "REJECT", f'"{self.spn} has no endpoints"'
        return ("", "") if has else ("DROP", f'"{self.spn} has no local endpoints"')


def _plan(svc: ServicePortInfo, endpoints: list[EndpointInfo], opts: NodeOptions) -> _Plan:
    # Chain hashes and comments both use the name, so it is made safe once.
    spn = word(str(svc.name))
    proto = svc.protocol.lower()
    cat = categorize(endpoints, svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)
    cluster_chain, local_chain, ext_chain, fw_chain = names.chains_of(spn, proto)
    has_endpoints = cat.has_any
    return _Plan(
        svc=svc,
        spn=spn,
        proto=proto,
        match=f"-m {proto} -p {proto}",
        dport=f"--dport {svc.port}",
        cluster_ip=_ip_text(svc.cluster_ip),
        cat=cat,
        cluster_chain=cluster_chain,
        local_chain=local_chain,
        ext_chain=ext_chain,
        fw_chain=fw_chain,
        internal_chain=local_chain if svc.internal_policy_local else cluster_chain,
        external_policy_chain=local_chain if svc.external_policy_local else cluster_chain,
        has_endpoints=has_endpoints,
        has_internal=has_endpoints and (bool(cat.local) or not svc.internal_policy_local),
        has_external=has_endpoints and (bool(cat.local) or not svc.external_policy_local),
        # The EXT chain exists whenever there are endpoints anywhere, even if none is usable for
        # external traffic, because it also short-circuits traffic from pods and the node itself.
        uses_ext_chain=has_endpoints and svc.externally_accessible,
        uses_fw_chain=has_endpoints and bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges),
    )


def _ip_text(ip: CheckedIP) -> str:
    """str(ip): ipaddress formats an IPv4Address in Python (1 us, 10k times a render), inet_ntoa in C."""
    return inet_ntoa(ip.packed) if type(ip) is ipaddress.IPv4Address else str(ip)


def _render_service(
    svc: ServicePortInfo,
    endpoints: list[EndpointInfo],
    opts: NodeOptions,
    large: bool,
    node_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> ServiceRules:
    """Rules for one service port: a pure function of its arguments (RenderCache relies on it).

    The shared chains' entries first (KUBE-SERVICES and its filter companions), then the
    service's own chains in upstream's order: SVC masquerade, EXT, FW, SVC/SVL dispatch, SEPs.
    """
    p = _plan(svc, endpoints, opts)
    cat = p.cat
    reachable = cat.reachable
    # Each endpoint's KUBE-SEP- name is needed by the dispatch rules and by its own chain: one
    # sha256 per endpoint instead of two (200k at 10k services x 10 endpoints).
    sep_chains = names.endpoint_chains(p.spn, p.proto, [ep.address for ep in reachable])
    filter_rules, entry_rules = _entry_rules(p, opts)
    chains: list[str] = []
    chain_rules: list[str] = _cluster_ip_masquerade(p, opts)
    if p.uses_ext_chain:
        chains.append(p.ext_chain)
        chain_rules += _external_chain(p, opts)
    if p.uses_fw_chain:
        chains.append(p.fw_chain)
        chain_rules += _firewall_chain(p, node_ip)
    if cat.cluster and svc.uses_cluster_endpoints:
        chains.append(p.cluster_chain)
        chain_rules += _dispatch(p, p.cluster_chain, cat.cluster, large, reachable, sep_chains)
    if cat.local and svc.uses_local_endpoints:
        chains.append(p.local_chain)
        chain_rules += _dispatch(p, p.local_chain, cat.local, large, reachable, sep_chains)
    chains += sep_chains
    # Two rules per endpoint chain, each pair one string.
    chain_rules += _endpoint_chains(p, sep_chains, reachable, large)
    return ServiceRules(
        _block(filter_rules),
        len(filter_rules),
        _block(entry_rules),
        len(entry_rules),
        tuple(chains),
        _declarations(chains),
        _block(chain_rules),
        len(chain_rules) + len(reachable),  # an endpoint's pair is one string
        int(p.has_endpoints and not p.has_internal),
        int(p.has_endpoints and not p.has_external),
    )


def _entry_rules(p: _Plan, opts: NodeOptions) -> tuple[list[str], list[str]]:
    """(filter rules, nat rules) the service adds to the shared chains: KUBE-SERVICES, KUBE-NODEPORTS,
    KUBE-EXTERNAL-SERVICES and KUBE-PROXY-FIREWALL, in upstream's order."""
    svc, spn, match, dport = p.svc, p.spn, p.match, p.dport
    filter_rules: list[str] = []
    nat: list[str] = []
    internal_target, internal_comment = p.missing(p.has_internal)
    external_target, external_comment = p.missing(p.has_external)
    cluster_ip = p.cluster_ip

    no_external = f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} {match}"
    if p.has_internal:
        nat.append(
            f'-A {KUBE_SERVICES} -m comment --comment "{spn} cluster IP" {match} -d {cluster_ip} {dport} -j {p.internal_chain}'
        )
    else:
        filter_rules.append(
            f"-A {KUBE_SERVICES} -m comment --comment {internal_comment} {match} -d {cluster_ip} {dport} -j {internal_target}"
        )
    for ip in svc.external_ips:
        if p.has_endpoints:
            nat.append(f'-A {KUBE_SERVICES} -m comment --comment "{spn} external IP" {match} -d {ip} {dport} -j {p.ext_chain}')
        if not p.has_external:
            filter_rules.append(f"{no_external} -d {ip} {dport} -j {external_target}")
    for ip in svc.load_balancer_vips:
        if p.has_endpoints:
            nat.append(f'-A {KUBE_SERVICES} -m comment --comment "{spn} loadbalancer IP" {match} -d {ip} {dport} -j {p.lb_chain}')
        if p.uses_fw_chain:
            filter_rules.append(
                f'-A {KUBE_PROXY_FIREWALL} -m comment --comment "{spn} traffic not accepted by {p.fw_chain}" '
                f"{match} -d {ip} {dport} -j DROP"
            )
    if not p.has_external:
        for ip in svc.load_balancer_vips:
            filter_rules.append(f"{no_external} -d {ip} {dport} -j {external_target}")
    if svc.node_port:
        if p.has_endpoints:
            if opts.localhost_nodeports_enabled and NFACCT_LOCALHOST_NODEPORT in opts.nfacct_counters:
                nat.append(
                    f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} -d 127.0.0.0/8 --dport {svc.node_port} "
                    f"-m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {p.ext_chain}"
                )
            nat.append(f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {match} --dport {svc.node_port} -j {p.ext_chain}")
        if not p.has_external:
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
    return filter_rules, nat


def _cluster_ip_masquerade(p: _Plan, opts: NodeOptions) -> list[str]:
    """The first rule of the internal chain: masquerade what must come back through this node."""
    if not p.has_internal:
        return []
    head = f'-A {p.internal_chain} -m comment --comment "{p.spn} cluster IP" {p.match} -d {p.cluster_ip} {p.dport}'
    if opts.masquerade_all:
        return [f"{head} -j {KUBE_MARK_MASQ}"]
    if opts.local_detector.implemented:
        # Off-cluster clients may route the service range to any node; masquerade them so
        # replies come back through this node.
        return [f"{head} {local_detector_args(opts.local_detector, local=False)} -j {KUBE_MARK_MASQ}"]
    return []


def _external_chain(p: _Plan, opts: NodeOptions) -> list[str]:
    """KUBE-EXT-: external traffic's policy, with upstream's short-circuits for pods and the node."""
    ext, spn = p.ext_chain, p.spn
    rules = []
    if not p.svc.external_policy_local:
        # Endpoints may be on another node: masquerade so the reply returns through us.
        rules.append(f'-A {ext} -m comment --comment "masquerade traffic for {spn} external destinations" -j {KUBE_MARK_MASQ}')
    else:
        if opts.local_detector.implemented:
            # Pods reaching an external IP of their own cluster behave as if they went out to the
            # load balancer and came back: no traffic policy applies.
            local = local_detector_args(opts.local_detector, local=True)
            rules.append(
                f'-A {ext} -m comment --comment "pod traffic for {spn} external destinations" {local} -j {p.cluster_chain}'
            )
        # The node itself would use the external IP as source address: masquerade it.
        rules.append(
            f'-A {ext} -m comment --comment "masquerade LOCAL traffic for {spn} external destinations" '
            f"-m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
        )
        rules.append(
            f'-A {ext} -m comment --comment "route LOCAL traffic for {spn} external destinations" '
            f"-m addrtype --src-type LOCAL -j {p.cluster_chain}"
        )
    if p.has_external:
        rules.append(f"-A {ext} -j {p.external_policy_chain}")
    return rules


def _firewall_chain(p: _Plan, node_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> list[str]:
    """KUBE-FW-: loadBalancerSourceRanges; what no rule accepts KUBE-PROXY-FIREWALL drops."""
    svc = p.svc
    head = f'-A {p.fw_chain} -m comment --comment "{p.spn} loadbalancer IP"'
    rules = [f"{head} -s {cidr} -j {p.ext_chain}" for cidr in svc.load_balancer_source_ranges]
    if node_ip is not None and any(node_ip in cidr for cidr in svc.load_balancer_source_ranges):
        # A VIP-like load balancer whose IP is also local: the node's own requests loop
        # back with the VIP as source and must be allowed too.
        rules += [f"{head} -s {ip} -j {p.ext_chain}" for ip in svc.load_balancer_vips]
    rules.append(f'-A {p.fw_chain} -m comment --comment "other traffic to {p.spn} will be dropped by KUBE-PROXY-FIREWALL"')
    return rules


def _endpoint_chains(p: _Plan, seps: list[str], endpoints: list[EndpointInfo], large: bool) -> list[str]:
    """KUBE-SEP- of each endpoint: hairpin masquerade and the DNAT (with the affinity mark when sticky).

    Each endpoint's two rules come as one string (two lines): half the strings to join.
    """
    comment = "" if large else f" -m comment --comment {p.spn}"
    if p.svc.client_ip_affinity:
        return [
            f"-A {sep}{comment} -s {ep.ip} -j {KUBE_MARK_MASQ}\n"
            f"-A {sep}{comment} -m recent --name {sep} --set {p.match} -j DNAT --to-destination {ep.address}"
            for sep, ep in zip(seps, endpoints, strict=True)
        ]
    # Hairpin: a pod reaching itself through the service must be masqueraded, or it would
    # answer itself directly and the client would drop the unexpected reply.
    masquerade = f" -j {KUBE_MARK_MASQ}\n-A "
    dnat = f"{comment} {p.match} -j DNAT --to-destination "
    return [f"-A {sep}{comment} -s {ep.ip}{masquerade}{sep}{dnat}{ep.address}" for sep, ep in zip(seps, endpoints, strict=True)]


def _dispatch(
    p: _Plan,
    chain: str,
    endpoints: list[EndpointInfo],
    large: bool,
    reachable: list[EndpointInfo],
    reachable_seps: list[str],
) -> list[str]:
    """Spread new connections over `endpoints`: rule i matches with probability 1/(n-i).

    reachable_seps: the KUBE-SEP- names of `reachable`, of which `endpoints` is a part.
    """
    spn, svc = p.spn, p.svc
    if endpoints is reachable:  # the usual case: every endpoint the node may DNAT to
        seps = reachable_seps
    else:
        by_address = dict(zip([ep.address for ep in reachable], reachable_seps, strict=True))
        seps = [by_address.get(ep.address) or names.endpoint_chain(spn, p.proto, ep.address) for ep in endpoints]
    head = f"-A {chain}"
    out: list[str] = []
    if large:
        if svc.client_ip_affinity:
            seconds = svc.sticky_max_age_seconds
            out += [f"{head} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}" for sep in seps]
        out += [f"{head}{stat} -j {sep}" for stat, sep in zip(_statistic_args(len(seps)), seps, strict=True)]
        return out
    comments = [f'{head} -m comment --comment "{spn} -> {ep.address}"' for ep in endpoints]
    if svc.client_ip_affinity:
        seconds = svc.sticky_max_age_seconds
        out += [
            f"{comment} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
            for comment, sep in zip(comments, seps, strict=True)
        ]
    out += [f"{comment}{stat} -j {sep}" for comment, stat, sep in zip(comments, _statistic_args(len(seps)), seps, strict=True)]
    return out


def _nodeports_jump(opts: NodeOptions, ipv6: bool, localhost_nodeports: bool) -> list[str]:
    """KUBE-SERVICES ends with the jump to KUBE-NODEPORTS: after every more specific rule."""
    comment = '-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
    if opts.nodeport_match_all:
        dest = "-m addrtype --dst-type LOCAL"
        if ipv6:
            dest += " ! -d ::1/128"
        elif not localhost_nodeports:
            dest += " ! -d 127.0.0.0/8"
        return [f"-A {KUBE_SERVICES} {comment} {dest} -j {KUBE_NODEPORTS}"]
    return [
        f"-A {KUBE_SERVICES} {comment} -d {ip} -j {KUBE_NODEPORTS}"
        for ip in opts.nodeport_ips
        # localhost NodePorts are impossible on IPv6 and disabled here
        if not (ipaddress.ip_address(ip).is_loopback and (ipv6 or not localhost_nodeports))
    ]
