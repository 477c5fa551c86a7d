"""IPVS mode, rendered: pure functions from a NodeView to the three things upstream programs.

Upstream's IPVS proxier (pkg/proxy/ipvs/proxier.go, syncProxyRules and writeIptablesRules) keeps
  1. one IPVS virtual server per ClusterIP, external IP, load-balancer VIP and NodePort address, with
     a real server per endpoint (masquerade forwarding, weight 1), persistence for ClientIP affinity;
  2. ipsets of those addresses (KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP, ...), so that
  3. a fixed, small iptables ruleset (KUBE-SERVICES, KUBE-POSTROUTING, ...) matches sets, not services;
plus every ClusterIP, external IP and LB VIP bound to the `kube-ipvs0` dummy interface (except
addresses the node already holds), and those addresses in KUBE-IPVS-IPS.

The ruleset's size does not grow with the number of services: only the sets and the IPVS table do.
Names, comments, set types and rule order follow upstream; the text forms are those the tools read
(`ipset restore`, `iptables-restore`, `ipvsadm-restore`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NewType

from kubeproxy.backends.iptables.render import local_detector_args
from kubeproxy.cluster.addresses import AddressText, CheckedNet, ip_text
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.topology import Categorized, categorize

DUMMY_DEVICE = "kube-ipvs0"
DEFAULT_SCHEDULER = "rr"
SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos")
# Kernel modules IPVS mode needs (upstream loads ip_vs plus the scheduler's module).
MODULES = ("ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack")

# An address of the node itself (its interfaces, --nodeport-addresses), where NodePorts listen.
# Object addresses are `AddressText`, made only by cluster/addresses.py's gate; the helpers below
# that write an address into ipset, ipvsadm or ip input take one of the two, so mypy holds every
# address that comes from a cluster object to the gate.
NodeAddress = NewType("NodeAddress", str)
# An ipset entry (`IP,PROTO:PORT`, `IP,PROTO:PORT,IP|NET`, or a port), made only by the `_entry*` helpers.
SetEntry = NewType("SetEntry", str)


@dataclass(frozen=True, slots=True)
class SetSpec:
    name: str
    type: str  # ipset type (hash:ip,port, bitmap:port, ...)
    comment: str


# Upstream's ipsetInfo, in its order.
SETS: tuple[SetSpec, ...] = (
    SetSpec("KUBE-LOOP-BACK", "hash:ip,port,ip", "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    SetSpec("KUBE-CLUSTER-IP", "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose"),
    SetSpec("KUBE-EXTERNAL-IP", "hash:ip,port", "Kubernetes service external ip + port for masquerade and filter purpose"),
    SetSpec("KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port", "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    SetSpec("KUBE-LOAD-BALANCER", "hash:ip,port", "Kubernetes service lb portal"),
    SetSpec("KUBE-LOAD-BALANCER-FW",
            "hash:ip,port", "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    SetSpec("KUBE-LOAD-BALANCER-LOCAL",
            "hash:ip,port", "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    SetSpec("KUBE-LOAD-BALANCER-SOURCE-IP",
            "hash:ip,port,ip", "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    SetSpec("KUBE-LOAD-BALANCER-SOURCE-CIDR",
            "hash:ip,port,net", "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    SetSpec("KUBE-NODE-PORT-TCP", "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    SetSpec("KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port", "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    SetSpec("KUBE-NODE-PORT-UDP", "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    SetSpec("KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port", "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    SetSpec("KUBE-NODE-PORT-SCTP-HASH",
            "hash:ip,port", "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    SetSpec("KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            "hash:ip,port", "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"),
    SetSpec("KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port", "Kubernetes health check node port"),
    SetSpec("KUBE-IPVS-IPS", "hash:ip", "Addresses on the ipvs interface"),
)
SET_BY_NAME: Mapping[str, SetSpec] = {s.name: s for s in SETS}

# Upstream's NewIPSet: on a dual-stack node both families' sets live in one kernel namespace of
# set names, so an IPv6 set's "KUBE-" prefix becomes "KUBE-6-" (IPv4 names are left as they were,
# for upgrades), cut to ipset's 31-character limit (KUBE-6-NODE-PORT-LOCAL-SCTP-HAS).
IPV6_SET_PREFIX = "KUBE-6-"
MAX_SET_NAME = 31


def set_name(name: str, family: Family) -> str:
    """The kernel's name of set `name` (as in SETS) for `family`.

    Rendered entries stay keyed by the names in SETS (upstream's tests read them so, its fake
    proxier never renames); only the text handed to ipset and iptables carries this name.
    """
    if family.ipv6 and name.startswith("KUBE-"):
        return (IPV6_SET_PREFIX + name[len("KUBE-"):])[:MAX_SET_NAME]
    return name


# Upstream's ipsetWithIptablesChain: (set, table, from chain, target, match type, protocol).
# The local NodePort sets come before the plain ones so that Local traffic RETURNs un-masqueraded.
_SET_RULES: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("KUBE-LOOP-BACK", "nat", "KUBE-POSTROUTING", "MASQUERADE", "dst,dst,src", ""),
    ("KUBE-LOAD-BALANCER", "nat", "KUBE-SERVICES", "KUBE-LOAD-BALANCER", "dst,dst", ""),
    ("KUBE-LOAD-BALANCER-LOCAL", "nat", "KUBE-LOAD-BALANCER", "RETURN", "dst,dst", ""),
    ("KUBE-NODE-PORT-LOCAL-TCP", "nat", "KUBE-NODE-PORT", "RETURN", "dst", "tcp"),
    ("KUBE-NODE-PORT-TCP", "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst", "tcp"),
    ("KUBE-NODE-PORT-LOCAL-UDP", "nat", "KUBE-NODE-PORT", "RETURN", "dst", "udp"),
    ("KUBE-NODE-PORT-UDP", "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst", "udp"),
    ("KUBE-NODE-PORT-LOCAL-SCTP-HASH", "nat", "KUBE-NODE-PORT", "RETURN", "dst,dst", "sctp"),
    ("KUBE-NODE-PORT-SCTP-HASH", "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst,dst", "sctp"),
    ("KUBE-LOAD-BALANCER-FW", "filter", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL", "dst,dst", ""),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "filter", "KUBE-SOURCE-RANGES-FIREWALL", "RETURN", "dst,dst,src", ""),
    ("KUBE-LOAD-BALANCER-SOURCE-IP", "filter", "KUBE-SOURCE-RANGES-FIREWALL", "RETURN", "dst,dst,src", ""),
)

NAT_CHAINS = ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ")
FILTER_CHAINS = ("KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL",
                 "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER")


@dataclass(frozen=True, slots=True)
class Jump:
    """A rule upstream prepends to a built-in chain (iptablesJumpChain), ensured one by one."""

    table: str
    builtin: str
    target: str
    comment: str

    def rule(self) -> str:
        return f'-A {self.builtin} -m comment --comment "{self.comment}" -j {self.target}'


JUMPS: tuple[Jump, ...] = (
    Jump("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules"),
    Jump("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules"),
    Jump("filter", "INPUT", "KUBE-NODE-PORT", "kubernetes health check rules"),
    Jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "INPUT", "KUBE-IPVS-FILTER", "kubernetes ipvs access filter"),
    Jump("filter", "OUTPUT", "KUBE-IPVS-OUT-FILTER", "kubernetes ipvs access filter"),
)


@dataclass(frozen=True)
class IpvsOptions:
    """The ipvs section of the configuration (upstream's KubeProxyIPVSConfiguration)."""

    scheduler: str = DEFAULT_SCHEDULER
    strict_arp: bool = False
    exclude_cidrs: tuple[str, ...] = ()
    tcp_timeout: float = 0.0
    tcpfin_timeout: float = 0.0
    udp_timeout: float = 0.0
    # The node's addresses (all but kube-ipvs0's) NodePorts listen on; the caller reads interfaces.
    node_addresses: tuple[str, ...] = ()


@dataclass(frozen=True, order=True, slots=True)
class RealServer:
    address: str
    port: int
    weight: int = 1


@dataclass(frozen=True, order=True, slots=True)
class VirtualServer:
    protocol: str  # TCP, UDP, SCTP
    address: str
    port: int
    scheduler: str = DEFAULT_SCHEDULER
    persistent: int = 0  # seconds; 0: no persistence
    flags: tuple[str, ...] = ()  # scheduler flags: flag-2 (mh-port) for mh, as upstream

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.protocol, self.address, self.port)

    def service_arg(self) -> str:
        """ipvsadm's -t/-u/--sctp-service ADDRESS:PORT form."""
        opt = {"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}[self.protocol]
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{opt} {host}:{self.port}"


@dataclass(frozen=True)
class IpvsRendered:
    sets: Mapping[str, frozenset[SetEntry]]  # every set in SETS, with its entries
    iptables: str  # iptables-restore --noflush input (nat then filter)
    services: Mapping[VirtualServer, tuple[RealServer, ...]]
    bind_addresses: frozenset[AddressText]  # on kube-ipvs0
    no_local_endpoints_internal: int = 0
    no_local_endpoints_external: int = 0
    # Rules in the iptables text per table (upstream's sync_proxy_rules_iptables_total).
    rule_counts: Mapping[str, int] = field(default_factory=dict)


def _entry_ip(ip: AddressText) -> SetEntry:
    return SetEntry(ip)


def _entry_ip_port(ip: AddressText | NodeAddress, proto: str, port: int) -> SetEntry:
    return SetEntry(f"{ip},{proto}:{port}")


def _entry_ip_port_ip(ip: AddressText, proto: str, port: int, source: AddressText) -> SetEntry:
    return SetEntry(f"{ip},{proto}:{port},{source}")


def _entry_ip_port_net(ip: AddressText, proto: str, port: int, source: CheckedNet) -> SetEntry:
    return SetEntry(f"{ip},{proto}:{port},{source}")


def _entry_port(port: int) -> SetEntry:
    return SetEntry(str(port))


def render(view: NodeView, opts: NodeOptions, ipvs: IpvsOptions = IpvsOptions()) -> IpvsRendered:
    """Everything IPVS mode programs for `view`. Deterministic: same input, same output."""
    entries: dict[str, set[SetEntry]] = {s.name: set() for s in SETS}
    services: dict[VirtualServer, tuple[RealServer, ...]] = {}
    bind: set[AddressText] = set()
    lb_no_node_access: list[tuple[AddressText, str, int]] = []
    no_local_int: set[tuple[str, str]] = set()
    no_local_ext: set[tuple[str, str]] = set()
    node_addrs = set(ipvs.node_addresses)
    node_ip = ipaddress.ip_address(opts.node_ip) if opts.node_ip else None
    # Upstream sets FlagSourceHash (IP_VS_SVC_F_SCHED2: mh hashes the source port too) for mh.
    flags = ("flag-2",) if ipvs.scheduler == "mh" else ()
    nodeport_addresses = [NodeAddress(a) for a in (ipvs.node_addresses if opts.nodeport_match_all else opts.nodeport_ips)]

    for name in sorted(view.services, key=lambda n: (n.namespace, n.name, n.port, n.protocol)):
        svc = view.services[name]
        endpoints = view.endpoints.get(name, [])
        proto = svc.protocol.lower()
        for ep in endpoints:
            if ep.is_local:
                entries["KUBE-LOOP-BACK"].add(_entry_ip_port_ip(ep.ip, proto, ep.port, ep.ip))
        cat = categorize(endpoints, svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)

        def real_servers(only_local: bool, cat: Categorized = cat, svc: ServicePortInfo = svc,
                         name: ServicePortName = name) -> tuple[RealServer, ...]:
            # Upstream's syncEndpoint: Local policy uses local endpoints when there are any and
            # otherwise falls back to the cluster's (pods on this node may still reach the service).
            chosen: list[EndpointInfo]
            if only_local:
                chosen = cat.local if cat.local else cat.cluster
                if not cat.local and cat.has_any:
                    if svc.internal_policy_local:
                        no_local_int.add((name.namespace, name.name))
                    if svc.external_policy_local:
                        no_local_ext.add((name.namespace, name.name))
            else:
                chosen = cat.cluster
            return tuple(sorted({RealServer(e.ip, e.port) for e in chosen}))

        def virtual(address: AddressText | NodeAddress, port: int, svc: ServicePortInfo = svc) -> VirtualServer:
            persistent = svc.sticky_max_age_seconds if svc.client_ip_affinity else 0
            return VirtualServer(svc.protocol.upper(), address, port, ipvs.scheduler, persistent, flags)

        cip = ip_text(svc.cluster_ip)
        entries["KUBE-CLUSTER-IP"].add(_entry_ip_port(cip, proto, svc.port))
        services[virtual(cip, svc.port)] = real_servers(svc.internal_policy_local)
        bind.add(cip)

        for ext in map(ip_text, svc.external_ips):
            e = _entry_ip_port(ext, proto, svc.port)
            entries["KUBE-EXTERNAL-IP-LOCAL" if svc.external_policy_local else "KUBE-EXTERNAL-IP"].add(e)
            services[virtual(ext, svc.port)] = real_servers(svc.external_policy_local)
            if ext not in node_addrs:
                bind.add(ext)

        for vip in map(ip_text, svc.load_balancer_vips):
            e = _entry_ip_port(vip, proto, svc.port)
            entries["KUBE-LOAD-BALANCER"].add(e)
            if svc.external_policy_local:
                entries["KUBE-LOAD-BALANCER-LOCAL"].add(e)
            if svc.load_balancer_source_ranges:
                entries["KUBE-LOAD-BALANCER-FW"].add(e)
                allow_from_node = False
                for cidr in svc.load_balancer_source_ranges:
                    entries["KUBE-LOAD-BALANCER-SOURCE-CIDR"].add(_entry_ip_port_net(vip, proto, svc.port, cidr))
                    if node_ip is not None and node_ip.version == cidr.version and node_ip in cidr:
                        allow_from_node = True
                if allow_from_node:
                    entries["KUBE-LOAD-BALANCER-SOURCE-IP"].add(_entry_ip_port_ip(vip, proto, svc.port, vip))
                else:
                    lb_no_node_access.append((vip, proto, svc.port))
            services[virtual(vip, svc.port)] = real_servers(svc.external_policy_local)
            if vip not in node_addrs:
                bind.add(vip)

        if svc.node_port and nodeport_addresses:
            if proto in ("tcp", "udp"):
                np_entries = [_entry_port(svc.node_port)]
                np_set, local_set = f"KUBE-NODE-PORT-{proto.upper()}", f"KUBE-NODE-PORT-LOCAL-{proto.upper()}"
            else:
                np_entries = [_entry_ip_port(ip, proto, svc.node_port) for ip in nodeport_addresses]
                np_set, local_set = "KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
            entries[np_set].update(np_entries)
            if svc.external_policy_local:
                entries[local_set].update(np_entries)
            for ip in nodeport_addresses:
                services[virtual(ip, svc.node_port)] = real_servers(svc.external_policy_local)

        if svc.health_check_node_port:
            entries["KUBE-HEALTH-CHECK-NODE-PORT"].add(_entry_port(svc.health_check_node_port))

    entries["KUBE-IPVS-IPS"] = {_entry_ip(ip) for ip in bind}
    text, counts = _iptables(entries, opts, sorted(set(lb_no_node_access)))
    return IpvsRendered(
        sets={k: frozenset(v) for k, v in entries.items()},
        iptables=text,
        services=services,
        bind_addresses=frozenset(bind),
        no_local_endpoints_internal=len(no_local_int),
        no_local_endpoints_external=len(no_local_ext),
        rule_counts=counts,
    )


def _match(name: str, kind: str, family: Family) -> str:
    return f"-m set --match-set {set_name(name, family)} {kind}"


def _comment(name: str) -> str:
    return f'-m comment --comment "{SET_BY_NAME[name].comment}"'


def _iptables(
    entries: Mapping[str, set[SetEntry]], opts: NodeOptions, lb_no_node: Iterable[tuple[AddressText, str, int]]
) -> tuple[str, dict[str, int]]:
    """Upstream's writeIptablesRules: the same rules, in the same order, for the same sets."""
    nat: list[str] = []
    flt: list[str] = []
    fam = opts.family
    lo = "::1/128" if fam.ipv6 else "127.0.0.0/8"
    nat.append(f"-A KUBE-SERVICES -s {lo} -j RETURN")
    for name, table, src, target, kind, proto in _SET_RULES:
        if not entries[name]:
            continue
        p = f"-p {proto} " if proto else ""
        (flt if table == "filter" else nat).append(f"-A {src} {p}{_comment(name)} {_match(name, kind, fam)} -j {target}")
    if entries["KUBE-CLUSTER-IP"]:
        head = f"-A KUBE-SERVICES {_comment('KUBE-CLUSTER-IP')} -m set --match-set {set_name('KUBE-CLUSTER-IP', fam)}"
        if opts.masquerade_all:
            nat.append(f"{head} dst,dst -j KUBE-MARK-MASQ")
        elif opts.local_detector.mode:
            nat.append(f"{head} dst,dst {local_detector_args(opts.local_detector, local=False)} -j KUBE-MARK-MASQ")
        else:
            # No way to tell pod traffic from the rest: masquerade what the node itself sends from
            # a VIP (kube-ipvs0 holds them all, so the kernel may pick one as the source).
            nat.append(f"{head} src,dst -j KUBE-MARK-MASQ")

    def external_ip_rules(args: str) -> None:
        nat.append(f"{args} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
        nat.append(f"{args} -m addrtype --dst-type LOCAL -j ACCEPT")

    if entries["KUBE-EXTERNAL-IP"]:
        args = f"-A KUBE-SERVICES {_comment('KUBE-EXTERNAL-IP')} {_match('KUBE-EXTERNAL-IP', 'dst,dst', fam)}"
        nat.append(f"{args} -j KUBE-MARK-MASQ")
        external_ip_rules(args)
    if entries["KUBE-EXTERNAL-IP-LOCAL"]:
        local = _match("KUBE-EXTERNAL-IP-LOCAL", "dst,dst", fam)
        external_ip_rules(f"-A KUBE-SERVICES {_comment('KUBE-EXTERNAL-IP-LOCAL')} {local}")
    nat.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    nat.append("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")
    flt.append("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP")
    for ip, proto, port in lb_no_node:
        flt.append(f"-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {proto} --vport {port} -j DROP")
    for name in ("KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"):
        if entries[name]:
            nat.append(f"-A KUBE-SERVICES {_match(name, 'dst,dst', fam)} -j ACCEPT")
    mark = opts.masquerade_mark
    flt.append(f'-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark {mark}/{mark} -j ACCEPT')
    flt.append('-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
               "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    flt.append(f"-A KUBE-NODE-PORT {_comment('KUBE-HEALTH-CHECK-NODE-PORT')} "
               f"{_match('KUBE-HEALTH-CHECK-NODE-PORT', 'dst', fam)} -j ACCEPT")
    for name in ("KUBE-LOAD-BALANCER", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL"):
        flt.append(f"-A KUBE-IPVS-FILTER {_match(name, 'dst,dst', fam)} -j RETURN")
    flt.append(f"-A KUBE-IPVS-FILTER {_match('KUBE-HEALTH-CHECK-NODE-PORT', 'dst', fam)} -j RETURN")
    flt.append(f"-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW {_match('KUBE-IPVS-IPS', 'dst', fam)} -j REJECT")
    nat.append(f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN")
    nat.append(f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}")
    masq = '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
    nat.append(masq + (" --random-fully" if opts.random_fully else ""))
    nat.append(f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}")
    lines = ["*nat", *(f":{c} - [0:0]" for c in NAT_CHAINS), *nat, "COMMIT",
             "*filter", *(f":{c} - [0:0]" for c in FILTER_CHAINS), *flt, "COMMIT"]
    return "\n".join(lines) + "\n", {"nat": len(nat), "filter": len(flt)}


def ipset_family(family: Family) -> str:
    """ipset's word for the family of a hash set (`family inet6`)."""
    return "inet6" if family.ipv6 else "inet"


def create_line(spec: SetSpec, family: Family, name: str | None = None) -> str:
    """upstream's createSet arguments (hashsize 1024, maxelem 65536; bitmaps cover every port;
    no `comment` extension: upstream's entries carry none).

    `name` defaults to the set's kernel name for `family` (set_name)."""
    name = name or set_name(spec.name, family)
    if spec.type.startswith("bitmap:"):
        return f"create {name} {spec.type} range 0-65535"
    return f"create {name} {spec.type} family {ipset_family(family)} hashsize 1024 maxelem 65536"


def ipset_restore_text(rendered: IpvsRendered, opts: NodeOptions) -> str:
    """A self-contained `ipset restore -exist` input: every set, then its entries."""
    fam = opts.family
    out = [create_line(spec, fam) for spec in SETS]
    for spec in SETS:
        name = set_name(spec.name, fam)
        out.extend(f"add {name} {e}" for e in sorted(rendered.sets[spec.name], key=_entry_sort))
    return "\n".join(out) + "\n"


def _entry_sort(entry: str) -> tuple[int, str]:
    return (int(entry), "") if entry.isdigit() else (0, entry)


def ipvsadm_save_text(services: Mapping[VirtualServer, tuple[RealServer, ...]]) -> str:
    """The IPVS table as `ipvsadm-save -n` prints it (and `ipvsadm-restore` reads it)."""
    out: list[str] = []
    for vs in sorted(services, key=_vs_sort):
        line = f"-A {vs.service_arg()} -s {vs.scheduler}"
        if vs.flags:
            line += f" -b {','.join(vs.flags)}"
        if vs.persistent:
            line += f" -p {vs.persistent}"
        out.append(line)
        for rs in services[vs]:
            host = f"[{rs.address}]" if ":" in rs.address else rs.address
            out.append(f"-a {vs.service_arg()} -r {host}:{rs.port} -m -w {rs.weight}")
    return "\n".join(out) + ("\n" if out else "")


def _vs_sort(vs: VirtualServer) -> tuple[str, int, bytes, int]:
    ip = ipaddress.ip_address(vs.address)
    return (vs.protocol, ip.version, ip.packed, vs.port)


def render_text(rendered: IpvsRendered, opts: NodeOptions) -> str:
    """The three parts, each under a header a person can cut out and load."""
    return (
        "# ipset restore -exist\n" + ipset_restore_text(rendered, opts)
        + "# iptables-restore --noflush\n" + rendered.iptables
        + "# ipvsadm-restore (ipvsadm-save -n)\n" + ipvsadm_save_text(rendered.services)
        + f"# ip addr add ADDRESS dev {DUMMY_DEVICE}\n"
        + "".join(f"# {a}\n" for a in sorted(rendered.bind_addresses, key=lambda a: ipaddress.ip_address(a).packed))
    )


def validate_scheduler(name: str) -> str | None:
    if name and name not in SCHEDULERS:
        return f"ipvs.scheduler: {name!r} is not an IPVS scheduler; use one of {', '.join(SCHEDULERS)}"
    return None
