"""What an IPVS-mode proxy was told, read back from `ipvsadm-save -n` and `ipset save`, for
`doctor --rules --ipvs --ipset-file` without the objects.

Upstream's IPVS proxier names no Service in its virtual servers or ipsets (pkg/proxy/ipvs/ipset.go
and proxier.go at v1.37.2), so a reconstructed Service is named by its cluster IP (`ipvs/ip-10-96-0-10`)
and its ports by protocol and port (`tcp-53`). The sets say what each virtual server is for:
KUBE-CLUSTER-IP holds `clusterIP,proto:port`; KUBE-EXTERNAL-IP(-LOCAL) and
KUBE-LOAD-BALANCER(-LOCAL) the external and load-balancer addresses (-LOCAL: externalTrafficPolicy
Local); KUBE-NODE-PORT-{TCP,UDP} (bitmaps of ports) and KUBE-NODE-PORT-SCTP-HASH the NodePorts, with
-LOCAL- for Local; KUBE-LOOP-BACK one `ip,proto:port,ip` per endpoint on this node;
KUBE-LOAD-BALANCER-FW and KUBE-LOAD-BALANCER-SOURCE-CIDR the loadBalancerSourceRanges. A virtual
server's real servers are the endpoints (weight 0: quiesced, not ready). An external or NodePort
virtual server belongs to the cluster-IP port of the same protocol whose real servers include all
of its own (a Local one holds only this node's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeproxy.doctor.reconstruct import Reconstructed, _add, _objects, _PortRec
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ipvs import IpvsState, VirtualService
from kubeproxy.netfilter.node import Node

NAMESPACE = "ipvs"
_EXTERNAL = {"KUBE-EXTERNAL-IP": "external", "KUBE-EXTERNAL-IP-LOCAL": "external",
             "KUBE-LOAD-BALANCER": "lb", "KUBE-LOAD-BALANCER-LOCAL": "lb"}
_LOCAL_SETS = ("KUBE-EXTERNAL-IP-LOCAL", "KUBE-LOAD-BALANCER-LOCAL")


def service_name(cluster_ip: str) -> str:
    """A DNS-1035 label for the Service at `cluster_ip` (a label must start with a letter)."""
    return "ip-" + cluster_ip.replace(".", "-").replace(":", "-").strip("-")


def _entry(member: str) -> tuple[str, str, int, str] | None:
    """`ip,proto:port[,ip2|net]` -> (normalised ip, PROTO, port, third part)."""
    parts = member.split(",")
    if len(parts) < 2 or ":" not in parts[1]:
        return None
    proto, _, port = parts[1].partition(":")
    try:
        ip, v6 = A.parse_ip(parts[0])
        return A.fmt_ip(ip, v6), proto.upper(), int(port), parts[2] if len(parts) > 2 else ""
    except ValueError:
        return None


# ipset names are at most 31 characters (upstream's ipset.go truncates the IPv6 ones)
_IPSET_NAME_MAX = 31


@dataclass
class _Sets:
    """The proxy's ipsets of both families, read as (ip, PROTO, port) keys."""

    node: Node

    def members(self, name: str) -> list[str]:
        """An IPv4 set's members and those of its IPv6 twin (`KUBE-6-...`, cut to 31 characters)."""
        v6 = name.replace("KUBE-", "KUBE-6-", 1)[:_IPSET_NAME_MAX]
        return self.node.ipsets.get(name, []) + self.node.ipsets.get(v6, [])

    def keys(self, name: str) -> set[tuple[str, str, int]]:
        return {e[:3] for m in self.members(name) if (e := _entry(m)) is not None}

    def node_ports(self, local: bool) -> set[tuple[str, int]]:
        infix = "-LOCAL" if local else ""
        out = {(proto, int(m)) for proto in ("TCP", "UDP")
               for m in self.members(f"KUBE-NODE-PORT{infix}-{proto}") if m.isdigit()}
        return out | {(p, port) for _, p, port in self.keys(f"KUBE-NODE-PORT{infix}-SCTP-HASH")}

    def source_ranges(self) -> dict[tuple[str, str, int], list[str]]:
        out: dict[tuple[str, str, int], list[str]] = {}
        for m in self.members("KUBE-LOAD-BALANCER-SOURCE-CIDR"):
            e = _entry(m)
            if e is not None and e[3]:
                out.setdefault(e[:3], []).append(e[3])
        return out


def _reals(vs: VirtualService) -> dict[str, int]:
    return {A.fmt_ip(r.address, r.v6): r.port for r in vs.reals if r.weight > 0}


def _key(vs: VirtualService) -> tuple[str, str, int]:
    return A.fmt_ip(vs.address, vs.v6), vs.protocol, vs.port


def _owner(recs: dict[tuple[str, str, str], _PortRec], reals_of: dict[tuple[str, str, str], dict[str, int]],
           vs: VirtualService, same_port: bool) -> _PortRec | None:
    """The cluster-IP port this external or NodePort virtual server serves: same protocol (and
    port for an external address), real servers a subset of its own; exact match first."""
    reals = set(_reals(vs).items())
    fits = [k for k, r in recs.items() if r.protocol == vs.protocol and (not same_port or r.port == vs.port)
            and reals <= set(reals_of[k].items())]
    exact = [k for k in fits if set(reals_of[k].items()) == reals]
    chosen = exact if len(exact) == 1 else fits
    return recs[chosen[0]] if len(chosen) == 1 else None


def from_ipvs(ipvs: IpvsState, node: Node, node_name: str) -> Reconstructed:
    """The Services behind an IPVS node's virtual servers, one per cluster IP."""
    sets = _Sets(node)
    have_sets = bool(node.ipsets)
    cluster = sets.keys("KUBE-CLUSTER-IP")
    external = {k: kind for name, kind in _EXTERNAL.items() for k in sets.keys(name)}
    local_ext = {k for name in _LOCAL_SETS for k in sets.keys(name)}
    node_ports, local_node_ports = sets.node_ports(False), sets.node_ports(True)
    loop_back = sets.keys("KUBE-LOOP-BACK")
    own = {a.ip for addrs in node.interfaces.values() for a in addrs}
    recs: dict[tuple[str, str, str], _PortRec] = {}
    reals_of: dict[tuple[str, str, str], dict[str, int]] = {}
    notes: list[str] = []
    rest: list[VirtualService] = []
    for vs in sorted(ipvs.services.values(), key=_key):
        key = _key(vs)
        is_cluster = key in cluster if have_sets else vs.address not in own
        if not is_cluster:
            rest.append(vs)
            continue
        rec = _PortRec(protocol=vs.protocol, port=vs.port, affinity=vs.persistent)
        _add(rec.cluster_ips, key[0])
        name = (NAMESPACE, service_name(key[0]), f"{vs.protocol.lower()}-{vs.port}")
        recs[name], reals_of[name] = rec, _reals(vs)
    for vs in rest:
        key = _key(vs)
        kind = external.get(key) if have_sets else None
        nodeport = (vs.protocol, vs.port) in node_ports or (not have_sets and vs.address in own)
        owner = _owner(recs, reals_of, vs, same_port=kind is not None) if kind is not None or nodeport else None
        if owner is None:
            notes.append(f"virtual server {vs.label()}: "
                         + ("no cluster-IP virtual server holds its real servers" if kind or nodeport
                            else "in none of the proxy's sets") + ": not read as part of a Service")
            continue
        local = key in local_ext if kind is not None else (vs.protocol, vs.port) in local_node_ports
        owner.external_local |= local
        if kind is not None:
            _add(owner.external_ips if kind == "external" else owner.lb_ips, key[0])
        else:
            owner.node_port = vs.port
        if local:
            loop_back |= {(address, vs.protocol, port) for address, port in _reals(vs).items()}
    for name, rec in recs.items():
        for address, port in reals_of[name].items():
            rec.endpoints[address] = (port, (address, rec.protocol, port) in loop_back)
    _health_check_port(recs, sets.members("KUBE-HEALTH-CHECK-NODE-PORT"), notes)
    found = _objects(recs, notes, node_name)
    _source_ranges(found.objects, sets.source_ranges(), sets.keys("KUBE-LOAD-BALANCER-FW"))
    if found.services:
        found.notes.insert(1, "IPVS virtual servers and ipsets name no Service: each is named by its cluster IP "
                              f"({NAMESPACE}/ip-A-B-C-D) and its ports by protocol and port; internalTrafficPolicy "
                              "cannot be told from them (a Local one shows as its local endpoints only)")
        if not have_sets:
            found.notes.insert(2, "no --ipset-file: virtual servers on the node's addresses read as NodePorts, all "
                                  "others as cluster IPs (external and load-balancer addresses need the ipsets)")
    return found


def _health_check_port(recs: dict[tuple[str, str, str], _PortRec], members: list[str], notes: list[str]) -> None:
    """KUBE-HEALTH-CHECK-NODE-PORT holds bare ports: one is told to its Service only when a single
    Service has externalTrafficPolicy Local."""
    ports = sorted({int(m) for m in members if m.isdigit()})
    local = {(ns, name) for (ns, name, _), r in recs.items() if r.external_local}
    if len(ports) == 1 and len(local) == 1:
        for (ns, name, _), r in recs.items():
            if (ns, name) in local:
                r.health_check_node_port = ports[0]
    elif ports:
        notes.append(f"health check node port(s) {', '.join(map(str, ports))}: not told to a Service "
                     f"({len(local)} with externalTrafficPolicy Local)")


def _source_ranges(objects: list[dict[str, Any]], ranges: dict[tuple[str, str, int], list[str]],
                   firewalled: set[tuple[str, str, int]]) -> None:
    for svc in (o for o in objects if o["kind"] == "Service"):
        ingress = [i["ip"] for i in svc.get("status", {}).get("loadBalancer", {}).get("ingress", [])]
        got = [c for ip in ingress for p in svc["spec"]["ports"] if (ip, p["protocol"], p["port"]) in firewalled
               for c in ranges.get((ip, p["protocol"], p["port"]), [])]
        if got:
            svc["spec"]["loadBalancerSourceRanges"] = list(dict.fromkeys(got))
