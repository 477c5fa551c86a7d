"""The node a packet crosses: its interfaces and addresses, which addresses are local, its routes.

Built from flags (`--local-ip`, `--iface NAME=IP/PREFIX`, `--route CIDR=IFACE[@GATEWAY]`) or read
from the live host (`ip -j addr`, `ip -j route`: read-only). Also carries the facts a dump cannot
hold: ipset contents and `recent` (session affinity) entries.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubeproxy.netfilter import addr as A

LOOPBACK_NET, LOOPBACK_MASK = A.ip4_to_int("127.0.0.0"), A.ip4_to_int("255.0.0.0")
MULTICAST_NET, MULTICAST_MASK = A.ip4_to_int("224.0.0.0"), A.ip4_to_int("240.0.0.0")


class NodeError(ValueError):
    """A node-model flag could not be read."""


@dataclass(slots=True)
class IfAddr:
    ip: int
    plen: int
    v6: bool = False

    @property
    def mask(self) -> int:
        bits = 128 if self.v6 else 32
        full = A.ALL6 if self.v6 else A.ALL4
        return (full << (bits - self.plen)) & full

    def contains(self, ip: int) -> bool:
        return (ip & self.mask) == (self.ip & self.mask)


@dataclass(slots=True)
class Route:
    net: int
    mask: int
    iface: str
    via: int | None = None
    v6: bool = False


@dataclass
class Node:
    """Interfaces with their addresses, extra local addresses, routes; ipsets and recent lists."""

    interfaces: dict[str, list[IfAddr]] = field(default_factory=dict)
    local_ips: set[int] = field(default_factory=set)
    routes: list[Route] = field(default_factory=list)
    ipsets: dict[str, list[str]] = field(default_factory=dict)
    recent: dict[str, set[int]] = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_flags(
        cls,
        local_ips: Sequence[str] = (),
        ifaces: Sequence[str] = (),
        routes: Sequence[str] = (),
        ipsets: Sequence[str] = (),
        affinity: Sequence[str] = (),
    ) -> Node:
        node = cls()
        node.interfaces["lo"] = [IfAddr(A.ip4_to_int("127.0.0.1"), 8)]
        for spec in ifaces:
            name, eq, cidr = spec.partition("=")
            if not eq or not name:
                raise NodeError(f"--iface {spec!r}: expected NAME=IP/PREFIX")
            ip_s, _, plen = cidr.partition("/")
            try:
                ip, v6 = A.parse_ip(ip_s)
                node.interfaces.setdefault(name, []).append(IfAddr(ip, int(plen or (128 if v6 else 32)), v6))
            except ValueError as e:
                raise NodeError(f"--iface {spec!r}: {e}") from None
        for s in local_ips:
            try:
                node.local_ips.add(A.parse_ip(s)[0])
            except ValueError as e:
                raise NodeError(f"--local-ip {s!r}: {e}") from None
        for spec in routes:
            cidr, eq, dev = spec.partition("=")
            if not eq or not dev:
                raise NodeError(f"--route {spec!r}: expected CIDR=IFACE[@GATEWAY]")
            dev, _, gw = dev.partition("@")
            try:
                net, mask, v6 = A.parse_cidr("0.0.0.0/0" if cidr == "default" else cidr)
                via = A.parse_ip(gw)[0] if gw else None
            except ValueError as e:
                raise NodeError(f"--route {spec!r}: {e}") from None
            node.routes.append(Route(net, mask, dev, via, v6))
            node.interfaces.setdefault(dev, [])
        for spec in ipsets:
            name, eq, member = spec.partition("=")
            if not eq:
                raise NodeError(f"--ipset {spec!r}: expected NAME=MEMBER")
            node.ipsets.setdefault(name, []).append(member)
        for spec in affinity:
            name, eq, ip_s = spec.partition("=")
            try:
                node.recent.setdefault(name, set()).add(A.parse_ip(ip_s)[0])
            except ValueError as e:
                raise NodeError(f"--affinity {spec!r}: {e}") from None
        return node

    @classmethod
    def from_live(cls, netns: str | None = None) -> Node:
        """Read interfaces and routes of this host (read-only: `ip -j addr`, `ip -j route`)."""
        prefix = ["ip", "netns", "exec", netns] if netns else []
        addrs = json.loads(subprocess.run([*prefix, "ip", "-j", "addr"], capture_output=True,
                                          text=True, check=True).stdout or "[]")
        routes = json.loads(subprocess.run([*prefix, "ip", "-j", "-4", "route"], capture_output=True,
                                           text=True, check=True).stdout or "[]")
        node = cls()
        for link in addrs:
            lst = node.interfaces.setdefault(link["ifname"], [])
            for a in link.get("addr_info", []):
                if a.get("family") not in ("inet", "inet6"):
                    continue
                ip, v6 = A.parse_ip(a["local"])
                lst.append(IfAddr(ip, int(a["prefixlen"]), v6))
        for r in routes:
            dst = r.get("dst", "")
            if not r.get("dev") or r.get("type", "unicast") != "unicast":
                continue
            net, mask, v6 = A.parse_cidr("0.0.0.0/0" if dst == "default" else dst)
            via = A.parse_ip(r["gateway"])[0] if r.get("gateway") else None
            node.routes.append(Route(net, mask, r["dev"], via, v6))
        return node

    # ------------------------------------------------------------------ questions
    def is_local(self, ip: int) -> bool:
        if ip in self.local_ips or (ip <= A.ALL4 and (ip & LOOPBACK_MASK) == LOOPBACK_NET):
            return True
        return any(a.ip == ip for addrs in self.interfaces.values() for a in addrs)

    def addr_type(self, ip: int) -> str:
        """The kernel's route type of an address, as `-m addrtype` and `fib ... type` see it."""
        if self.is_local(ip):
            return "LOCAL"
        if ip <= A.ALL4:
            if (ip & MULTICAST_MASK) == MULTICAST_NET:
                return "MULTICAST"
            if ip == A.ALL4:
                return "BROADCAST"
            for addrs in self.interfaces.values():
                for a in addrs:
                    if not a.v6 and a.plen < 31 and a.contains(ip) and (ip | a.mask) == A.ALL4:
                        return "BROADCAST"
        return "UNICAST"

    def route(self, ip: int) -> tuple[str, int | None] | None:
        """(output interface, gateway) by longest prefix over given routes and connected subnets."""
        if self.is_local(ip):
            return "lo", None
        best: tuple[int, str, int | None] | None = None
        for name, addrs in self.interfaces.items():
            for a in addrs:
                if a.contains(ip) and (best is None or a.plen > best[0]):
                    best = (a.plen, name, None)
        for r in self.routes:
            if (ip & r.mask) == r.net:
                plen = bin(r.mask).count("1")
                if best is None or plen > best[0]:
                    best = (plen, r.iface, r.via)
        return (best[1], best[2]) if best else None

    def iface_addr(self, iface: str | None, toward: int) -> int | None:
        """The source address MASQUERADE picks on `iface`: the one sharing a subnet with the next
        hop if any, else the first (as inet_select_addr does)."""
        addrs = [a for a in self.interfaces.get(iface or "", []) if (a.v6 == (toward > A.ALL4))]
        for a in addrs:
            if a.contains(toward):
                return a.ip
        return addrs[0].ip if addrs else None

    def in_ipset(self, name: str, values: list[int | str]) -> bool | None:
        """Is (values...) a member of ipset `name`? None when its contents were not given."""
        members = self.ipsets.get(name)
        if members is None:
            return None
        for m in members:
            parts = m.split(",")
            if len(parts) < len(values):
                continue
            ok = True
            for part, v in zip(parts, values, strict=False):
                if (isinstance(v, int) and "." in part) or (":" in part and "/" in part):
                    try:
                        net, mask, _ = A.parse_cidr(part)
                    except ValueError:
                        ok = False
                        break
                    if not isinstance(v, int) or (v & mask) != net:  # a port member never equals an address
                        ok = False
                        break
                elif isinstance(v, str):
                    proto_port = part.split(":")[-1]
                    if proto_port != v and part != v:
                        ok = False
                        break
                else:
                    ok = False
                    break
            if ok:
                return True
        return False
