"""Addresses, prefixes, protocols and service names as the dumps spell them.

Addresses are ints (IPv4 < 2**32); parsing is hand-rolled for IPv4 because a 300k-rule dump
calls it hundreds of thousands of times and `ipaddress` is several times slower.
"""

from __future__ import annotations

import ipaddress
import socket

ALL4 = 0xFFFFFFFF
ALL6 = (1 << 128) - 1

PROTOCOLS: dict[str, int] = {
    "all": 0, "icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
    "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136, "dccp": 33,
}
PROTO_NAMES: dict[int, str] = {v: k for k, v in PROTOCOLS.items() if k not in ("ipv6-icmp",)}

# Names `iptables -L` (without -n) prints for ports; /etc/services is consulted after these.
SERVICES: dict[str, int] = {
    "domain": 53, "http": 80, "https": 443, "ssh": 22, "ntp": 123, "bootps": 67, "bootpc": 68,
    "smtp": 25, "tcpmux": 1, "echo": 7, "ftp": 21, "telnet": 23, "snmp": 161, "ldap": 389,
    "http-alt": 8080, "webcache": 8080, "mysql": 3306, "postgresql": 5432, "domain-s": 853,
    "kubelet": 10250, "etcd-client": 2379, "etcd-server": 2380, "vxlan": 4789, "bgp": 179,
    "microsoft-ds": 445, "sunrpc": 111, "nfs": 2049, "syslog": 514, "imap": 143, "pop3": 110,
}


def ip4_to_int(s: str) -> int:
    a, b, c, d = s.split(".")
    ia, ib, ic, id_ = int(a), int(b), int(c), int(d)
    if not (0 <= ia < 256 and 0 <= ib < 256 and 0 <= ic < 256 and 0 <= id_ < 256):
        raise ValueError(f"bad IPv4 address {s!r}")
    return (ia << 24) | (ib << 16) | (ic << 8) | id_


def parse_ip(s: str) -> tuple[int, bool]:
    """`10.0.0.1` -> (int, is_v6)."""
    if ":" in s:
        return int(ipaddress.IPv6Address(s)), True
    try:
        return ip4_to_int(s), False
    except ValueError:
        raise ValueError(f"bad IP address {s!r}") from None


def parse_cidr(s: str) -> tuple[int, int, bool]:
    """`10.0.0.0/8`, `10.0.0.1`, `10.0.0.0/255.0.0.0`, `fd00::/64` -> (net, mask, is_v6)."""
    addr, sep, plen = s.partition("/")
    ip, v6 = parse_ip(addr)
    bits = 128 if v6 else 32
    full = ALL6 if v6 else ALL4
    if not sep:
        mask = full
    elif "." in plen:
        mask = ip4_to_int(plen)
    else:
        n = int(plen)
        if not 0 <= n <= bits:
            raise ValueError(f"bad prefix length in {s!r}")
        mask = (full << (bits - n)) & full
    return ip & mask, mask, v6


def fmt_ip(ip: int, v6: bool = False) -> str:
    if v6 or ip > ALL4:
        return str(ipaddress.IPv6Address(ip))
    return f"{ip >> 24}.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}"


def fmt_cidr(net: int, mask: int, v6: bool = False) -> str:
    full = ALL6 if v6 else ALL4
    if mask == full:
        return fmt_ip(net, v6)
    return f"{fmt_ip(net, v6)}/{bin(mask).count('1')}"


def parse_proto(s: str) -> int:
    s = s.lower()
    if s in PROTOCOLS:
        return PROTOCOLS[s]
    if s.isdigit():
        return int(s)
    try:
        # nft and iptables -L print any name of the system's /etc/protocols (vrrp, ospf, ...)
        return socket.getprotobyname(s)
    except OSError:
        raise ValueError(f"unknown protocol {s!r}") from None


def parse_port(s: str) -> int:
    if s.isdigit():
        n = int(s)
        if n > 65535:
            raise ValueError(f"port {s} out of range")
        return n
    if s in SERVICES:
        return SERVICES[s]
    try:
        return socket.getservbyname(s)
    except OSError:
        raise ValueError(f"unknown port or service name {s!r}") from None


def parse_port_ranges(s: str, sep: str = ":") -> tuple[tuple[int, int], ...]:
    """`80`, `80:90`, `1,2:5` (multiport) -> ((lo, hi), ...)."""
    out = []
    for part in s.split(","):
        lo, dash, hi = part.partition(sep)
        a = parse_port(lo) if lo else 0
        b = (parse_port(hi) if hi else 65535) if dash else a
        out.append((a, b))
    return tuple(out)


def parse_int(s: str) -> int:
    return int(s, 0)
