"""Where queries go to and come from: the server's IP[:PORT] and the sender's local source addresses."""

from __future__ import annotations

import errno
import ipaddress
import socket

DNS_PORT = 53
# Binding one socket per address is the check that an address is local; past this many it is slow
# and the caller surely meant something else.
MAX_SOURCE_ADDRESSES = 65536


class AddressError(ValueError):
    """A server or source address that cannot be used; the message names the flag and the value."""


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def parse_server(text: str, default_port: int = DNS_PORT) -> tuple[str, int]:
    """`10.0.0.10`, `10.0.0.10:5353`, `::1`, `[::1]:5353` -> (ip, port)."""
    raw = text.strip()
    host, port_text = raw, ""
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise AddressError(f"{text!r}: expected IP, IP:PORT or [IPv6]:PORT")
        port_text = rest[1:]
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"{text!r}: {host!r} is not an IP address") from None
    port = default_port
    if port_text or raw.endswith(":"):
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise AddressError(f"{text!r}: port {port_text!r} is not in 1-65535")
        port = int(port_text)
    return str(ip), port


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def source_addresses(cidr: str, family: socket.AddressFamily) -> tuple[str, ...]:
    """The host addresses of `cidr`, each checked to be assigned locally (bindable), in order.

    A /32 (/128) is its one address; wider networks leave out the network and broadcast addresses
    as `ipaddress.hosts()` does.
    """
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=False)
    except ValueError as exc:
        raise AddressError(f"{cidr!r}: {exc}") from None
    want = 6 if family == socket.AF_INET6 else 4
    if net.version != want:
        raise AddressError(f"{cidr}: IPv{net.version} sources for an IPv{want} server")
    if net.num_addresses > MAX_SOURCE_ADDRESSES + 2:
        raise AddressError(f"{cidr}: {net.num_addresses} addresses; at most {MAX_SOURCE_ADDRESSES} are supported")
    hosts = [str(ip) for ip in net.hosts()] or [str(net.network_address)]
    missing = [ip for ip in hosts if not _is_local(ip, family)]
    if missing:
        raise AddressError(
            f"{cidr}: {len(missing)} of {len(hosts)} addresses are not assigned to a local interface"
            f" (first: {missing[0]}); add them (ip addr add {missing[0]}/{net.prefixlen} dev ...) or pick a local range"
        )
    return tuple(hosts)


def _is_local(ip: str, family: socket.AddressFamily) -> bool:
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True
