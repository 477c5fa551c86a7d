"""The packet to trace: the first packet of a connection unless told otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.netfilter import addr as A

CT_STATES = ("NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED")


class PacketError(ValueError):
    """A packet flag could not be read."""


@dataclass(frozen=True, slots=True)
class Packet:
    """`in_iface=None` means the packet is sent by a process on the node itself."""

    proto: int
    src: int
    dst: int
    sport: int = 40000
    dport: int = 0
    in_iface: str | None = None
    v6: bool = False
    ct_state: str = "NEW"
    mark: int = 0
    physdev_in: str | None = None
    # both physdev ports given: the packet is bridged between them (in and out on the bridge
    # `in_iface`), not routed
    physdev_out: str | None = None

    @property
    def from_host(self) -> bool:
        return self.in_iface is None


def _hostport(s: str, what: str, need_port: bool) -> tuple[int, int | None, bool]:
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif s.count(":") == 1:
        host, _, port = s.partition(":")
    else:
        host, port = s, ""
    try:
        ip, v6 = A.parse_ip(host)
        p = A.parse_port(port) if port else None
    except ValueError as e:
        raise PacketError(f"{what} {s!r}: {e}") from None
    if need_port and p is None:
        raise PacketError(f"{what} {s!r}: a port is needed (IP:PORT)")
    return ip, p, v6


def make_packet(
    proto: str,
    src: str,
    dst: str,
    in_iface: str | None = None,
    ct_state: str = "NEW",
    mark: int = 0,
    physdev_in: str | None = None,
    physdev_out: str | None = None,
) -> Packet:
    """Build a packet from CLI-style strings: `--src 10.0.0.1[:PORT] --dst 10.96.0.10:53`."""
    try:
        p = A.parse_proto(proto)
    except ValueError as e:
        raise PacketError(str(e)) from None
    has_ports = p in (6, 17, 132, 136, 33)
    s_ip, s_port, v6a = _hostport(src, "--src", False)
    d_ip, d_port, v6b = _hostport(dst, "--dst", has_ports)
    if v6a != v6b:
        raise PacketError("--src and --dst are of different address families")
    if physdev_out and not (physdev_in and in_iface):
        raise PacketError("--physdev-out needs --physdev-in and --in-iface (the bridge): a bridged packet")
    state = ct_state.upper()
    if state not in CT_STATES:
        raise PacketError(f"--state {ct_state!r}: one of {', '.join(CT_STATES)}")
    return Packet(p, s_ip, d_ip, s_port if s_port is not None else 40000, d_port or 0, in_iface,
                  v6a, state, mark, physdev_in, physdev_out)
