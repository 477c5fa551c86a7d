"""Where the relay's listeners bind: `--proxy-port-range` (upstream's portRange) and the sockets.

Upstream's syntax (k8s.io/apimachinery/pkg/util/net.ParsePortRange): `begin-end`, `begin+offset`
or a single port, inclusive; empty, `0` or `0-0` means "any free port" (the kernel picks one).
Within a range, allocation starts at a random port and walks on, as upstream's
PortAllocator does, so that two proxies restarting do not fight over the first port.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass, field

from kubeproxy.model.options import Family

LISTEN_BACKLOG = 4096
# A UDP service port's socket takes every client's datagrams and sends every reply: a burst
# must not overflow it while the relay loop is busy elsewhere (the kernel default is ~200 KB).
UDP_SOCKET_BUFFER = 4 << 20


def _udp_buffers(sock: socket.socket) -> None:
    """Large buffers: past net.core.rmem_max/wmem_max where we may (root: the FORCE options)."""
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, UDP_SOCKET_BUFFER)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, UDP_SOCKET_BUFFER)


@dataclass(frozen=True)
class PortRange:
    base: int = 0
    size: int = 0  # 0: any free port

    def ports(self, rng: random.Random) -> list[int]:
        if not self.size:
            return [0]
        start = rng.randrange(self.size)
        return [self.base + (start + i) % self.size for i in range(self.size)]


def parse_port_range(text: str) -> PortRange:
    """ValueError, in upstream's words, for anything but the three forms."""
    text = text.strip()
    if text in ("", "0", "0-0"):
        return PortRange()
    try:
        if "+" in text:
            begin, offset = (int(p) for p in text.split("+", 1))
            end = begin + offset
        elif "-" in text:
            begin, end = (int(p) for p in text.split("-", 1))
        else:
            begin = end = int(text)
    except ValueError:
        raise ValueError(f'unable to parse port range "{text}"') from None
    if not (0 < begin <= end <= 65535):
        raise ValueError(f'"{text}": the range must be within 1-65535 with begin <= end')
    return PortRange(begin, end - begin + 1)


class PortsExhausted(OSError):
    """No port of the range is free."""


@dataclass
class Binder:
    """Opens listening sockets on the family's any address, in the configured range."""

    port_range: PortRange = field(default_factory=PortRange)
    rng: random.Random = field(default_factory=random.Random)

    def open(self, protocol: str, family: Family, address: str = "") -> tuple[socket.socket, int]:
        """A listener on `address` (the family's any address when "") in the range."""
        af = socket.AF_INET6 if family.ipv6 else socket.AF_INET
        kind = socket.SOCK_STREAM if protocol == "TCP" else socket.SOCK_DGRAM
        last: OSError | None = None
        for port in self.port_range.ports(self.rng):
            sock = socket.socket(af, kind)
            try:
                if family.ipv6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if kind == socket.SOCK_STREAM:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                else:
                    _udp_buffers(sock)
                sock.bind((address or family.any_address, port))
                if kind == socket.SOCK_STREAM:
                    sock.listen(LISTEN_BACKLOG)
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            return sock, sock.getsockname()[1]
        raise PortsExhausted(f"no free {protocol} port in the proxy port range: {last}")
