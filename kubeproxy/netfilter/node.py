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
    """An address on an interface. `scope` as `ip addr` shows it ("" = from the address: host for
    127/8 and ::1, link for fe80::/10, else global)."""

    ip: int
    plen: int
    v6: bool = False
    scope: str = ""

    @property
    def mask(self) -> int:
        bits = 128 if self.v6 else 32
        full = A.ALL6 if self.v6 else A.ALL4
        return (full << (bits - self.plen)) & full

    def contains(self, ip: int) -> bool:
        return (ip & self.mask) == (self.ip & self.mask)

    @property
    def kind(self) -> str:
        """host, link or global."""
        if self.scope:
            return "global" if self.scope == "universe" else self.scope
        if self.v6:
            if self.ip == 1:
                return "host"
            return "link" if (self.ip >> 118) == 0x3FA else "global"
        return "host" if (self.ip & LOOPBACK_MASK) == LOOPBACK_NET else "global"


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
    # set name -> type (`hash:ip,port`, `bitmap:port`, ...) from an `ipset save` dump: says what
    # each dimension of a member is (kubeproxy/netfilter/ipvs.py loads it)
    ipset_types: dict[str, str] = field(default_factory=dict)

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
        node.interfaces["lo"] = [IfAddr(A.ip4_to_int("127.0.0.1"), 8), IfAddr(1, 128, True)]
        # NAME=VALUE flags split at the last "=": a name (an interface, an ipset, a recent list) may
        # hold "=" (weave-npc's hashed set names do), an address or set member never does.
        for spec in ifaces:
            name, eq, cidr = spec.rpartition("=")
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
            # The gateway is what follows the last "@" when that is an address: an interface name
            # may hold "@" itself.
            name, at, gw = dev.rpartition("@")
            if at and _is_ip(gw):
                dev = name
            else:
                gw = ""
            # `default` without a gateway is a default route of each family; with one, of its family
            nets = [cidr] if cidr != "default" else (
                ["::/0"] if ":" in gw else ["0.0.0.0/0"] if gw else ["0.0.0.0/0", "::/0"])
            for c in nets:
                try:
                    net, mask, v6 = A.parse_cidr(c)
                    via = A.parse_ip(gw)[0] if gw else None
                except ValueError as e:
                    raise NodeError(f"--route {spec!r}: {e}") from None
                node.routes.append(Route(net, mask, dev, via, v6))
            node.interfaces.setdefault(dev, [])
        for spec in ipsets:
            name, eq, member = spec.rpartition("=")
            if not eq or not name or not member:
                raise NodeError(f"--ipset {spec!r}: expected NAME=MEMBER")
            node.ipsets.setdefault(name, []).append(member)
        for spec in affinity:
            name, eq, ip_s = spec.rpartition("=")
            if not eq or not name:
                raise NodeError(f"--affinity {spec!r}: expected NAME=IP")
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
        routes = [
            (r, fam == "-6")
            for fam in ("-4", "-6")
            for r in json.loads(subprocess.run([*prefix, "ip", "-j", fam, "route"], capture_output=True,
                                               text=True, check=False).stdout or "[]")
        ]
        node = cls()
        for link in addrs:
            lst = node.interfaces.setdefault(link["ifname"], [])
            for a in link.get("addr_info", []):
                if a.get("family") not in ("inet", "inet6"):
                    continue
                if a.get("tentative") or a.get("dadfailed"):
                    continue  # an IPv6 address the kernel does not use yet (or at all)
                ip, v6 = A.parse_ip(a["local"])
                lst.append(IfAddr(ip, int(a["prefixlen"]), v6, str(a.get("scope", ""))))
        for r, is6 in routes:
            dst = r.get("dst", "")
            if not r.get("dev") or r.get("type", "unicast") != "unicast":
                continue
            if dst == "default":
                dst = "::/0" if is6 else "0.0.0.0/0"
            net, mask, v6 = A.parse_cidr(dst)
            via = A.parse_ip(r["gateway"])[0] if r.get("gateway") else None
            node.routes.append(Route(net, mask, r["dev"], via, v6))
        return node

    # ------------------------------------------------------------------ questions
    def is_local(self, ip: int, v6: bool | None = None) -> bool:
        v6 = ip > A.ALL4 if v6 is None else v6
        if ip in self.local_ips:
            return True
        if v6:
            if ip == 1:  # ::1
                return True
        elif (ip & LOOPBACK_MASK) == LOOPBACK_NET:
            return True
        return any(a.ip == ip and a.v6 == v6 for addrs in self.interfaces.values() for a in addrs)

    def addr_type(self, ip: int, v6: bool | None = None) -> str:
        """The kernel's route type of an address, as `-m addrtype` and `fib ... type` see it."""
        v6 = ip > A.ALL4 if v6 is None else v6
        if self.is_local(ip, v6):
            return "LOCAL"
        if v6:
            return "MULTICAST" if (ip >> 120) == 0xFF else "UNICAST"
        if (ip & MULTICAST_MASK) == MULTICAST_NET:
            return "MULTICAST"
        if ip == A.ALL4:
            return "BROADCAST"
        for addrs in self.interfaces.values():
            for a in addrs:
                if not a.v6 and a.plen < 31 and a.contains(ip) and (ip | a.mask) == A.ALL4:
                    return "BROADCAST"
        return "UNICAST"

    def route(self, ip: int, v6: bool | None = None) -> tuple[str, int | None] | None:
        """(output interface, gateway) by longest prefix over given routes and connected subnets
        of the address's family."""
        v6 = ip > A.ALL4 if v6 is None else v6
        if self.is_local(ip, v6):
            return "lo", None
        best: tuple[int, str, int | None] | None = None
        for name, addrs in self.interfaces.items():
            for a in addrs:
                if a.v6 == v6 and a.contains(ip) and (best is None or a.plen > best[0]):
                    best = (a.plen, name, None)
        for r in self.routes:
            if r.v6 == v6 and (ip & r.mask) == r.net:
                plen = bin(r.mask).count("1")
                if best is None or plen > best[0]:
                    best = (plen, r.iface, r.via)
        return (best[1], best[2]) if best else None

    def _primaries(self, iface: str, v6: bool) -> list[IfAddr]:
        """The interface's addresses of a family without its secondaries (an address in a subnet
        an earlier address of the same prefix length already covers is secondary in IPv4)."""
        out: list[IfAddr] = []
        for a in self.interfaces.get(iface, []):
            if a.v6 != v6:
                continue
            if not v6 and any(p.plen == a.plen and p.contains(a.ip) for p in out):
                continue
            out.append(a)
        return out

    def iface_addr(self, iface: str | None, toward: int, v6: bool | None = None) -> int | None:
        """An address of `iface` for `toward`: one sharing its subnet if any, else the first (the
        address REDIRECT uses on the input interface)."""
        v6 = toward > A.ALL4 if v6 is None else v6
        addrs = [a for a in self.interfaces.get(iface or "", []) if a.v6 == v6]
        for a in addrs:
            if a.contains(toward):
                return a.ip
        return addrs[0].ip if addrs else None

    def masquerade_source(self, out_iface: str | None, toward: int, v6: bool) -> int | None:
        """The source address MASQUERADE writes, as the kernel picks it.

        IPv4 (nf_nat_masquerade_ipv4 → inet_select_addr(out, next hop, RT_SCOPE_UNIVERSE)): the
        first primary global address of the output interface in the next hop's subnet, else its
        first primary global address; when it has none (lo with only 127.0.0.1, an address-less
        veth), the first global address of the interfaces in order, lo first. None: no global
        address anywhere (the kernel drops the packet).

        IPv6 (ipv6_dev_get_saddr, RFC 6724 in short): a global address, preferring the output
        interface, then the longest prefix shared with the destination."""
        if not v6:
            own = [a for a in self._primaries(out_iface or "", False) if a.kind == "global"]
            for a in own:
                if a.contains(toward):
                    return a.ip
            if own:
                return own[0].ip
            for name in self.interfaces:
                for a in self._primaries(name, False):
                    if a.kind == "global":
                        return a.ip
            return None
        if any(a.v6 and a.ip == toward for addrs in self.interfaces.values() for a in addrs):
            return toward  # rule 1: the destination itself, when it is ours
        want = "link" if (toward >> 118) == 0x3FA else "global"
        best: tuple[int, int, int] | None = None
        for name, addrs in self.interfaces.items():
            for a in addrs:
                if not a.v6 or a.kind != want or (want == "link" and name != out_iface):
                    continue
                common = 128 - (a.ip ^ toward).bit_length()
                key = (1 if name == out_iface else 0, common, a.ip)
                if best is None or key[:2] > best[:2]:
                    best = key
        return best[2] if best else None

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
                if isinstance(v, int) or (":" in part and "/" in part):  # an address: IPv4, IPv6, a CIDR
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


def _is_ip(text: str) -> bool:
    try:
        A.parse_ip(text)
    except ValueError:
        return False
    return True
