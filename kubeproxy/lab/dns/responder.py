"""A small authoritative UDP DNS responder for the lab, until BIND is wired in.

In a test (a thread in the test process, recording who asked):

    with Responder(zone=Zone("lab.test."), drop_every=50, record_sources=True) as r:
        ...  # query r.address; r.sources lists (ip, port) per query, r.dropped counts drops

As a process (inside a namespace, for benchmarks), with SO_REUSEPORT sockets in N processes:

    python -m kubeproxy.lab.dns.responder --listen 127.0.0.1:53 [--processes 2] [--zone lab.test.]
        [--address 192.0.2.53] [--drop-every N]

prints `ready` once the sockets are bound. Answers come from `wire.answer`, cached per distinct
query (everything after the ID), so a flood of the same question costs a dict lookup per packet.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import click

from kubeproxy.lab.dns.dns_message import Zone, answer

_RCVBUF = 4 << 20
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python < 3.12 lacks the name
_CACHE_LIMIT = 4096


@dataclass
class Counters:
    queries: int = 0
    dropped: int = 0
    sources: list[tuple[str, int]] = field(default_factory=list)


def open_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # A deep receive queue absorbs the sender's bursts; as root, past net.core.rmem_max.
    opt = _SO_RCVBUFFORCE if os.geteuid() == 0 else socket.SO_RCVBUF
    try:
        sock.setsockopt(socket.SOL_SOCKET, opt, _RCVBUF)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.bind((host, port))
    return sock


def serve(
    sock: socket.socket,
    zone: Zone,
    *,
    drop_every: int = 0,
    counters: Counters | None = None,
    record_sources: bool = False,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Answer datagrams on `sock` until `stopping()` is true when a datagram arrives.

    `drop_every=N` silently drops the Nth, 2Nth, ... query (a lossy server, deterministic).
    """
    counts = counters if counters is not None else Counters()
    cache: dict[bytes, bytes | None] = {}
    recvfrom, sendto = sock.recvfrom, sock.sendto
    while True:
        data, peer = recvfrom(4096)
        if stopping():
            return
        counts.queries += 1
        if record_sources:
            counts.sources.append((peer[0], peer[1]))
        if drop_every and counts.queries % drop_every == 0:
            counts.dropped += 1
            continue
        key = data[2:]
        if key in cache:
            tail = cache[key]
        else:
            response = answer(data, zone)
            tail = None if response is None else response[2:]
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[key] = tail
        if tail is not None:
            # The asker may be gone (its port unreachable error surfaces here); keep serving.
            with contextlib.suppress(OSError):
                sendto(data[:2] + tail, peer)


class Responder:
    """A responder thread on a loopback UDP port (port 0: the kernel picks one)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        zone: Zone | None = None,
        drop_every: int = 0,
        record_sources: bool = False,
    ) -> None:
        self.zone = zone or Zone()
        self.counters = Counters()
        self._drop_every = drop_every
        self._record = record_sources
        self._sock = open_socket(host, port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dns-responder", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def sources(self) -> list[tuple[str, int]]:
        return list(self.counters.sources)

    @property
    def queries(self) -> int:
        return self.counters.queries

    @property
    def dropped(self) -> int:
        return self.counters.dropped

    def start(self) -> Responder:
        self._thread.start()
        return self

    def _run(self) -> None:
        serve(
            self._sock,
            self.zone,
            drop_every=self._drop_every,
            counters=self.counters,
            record_sources=self._record,
            stopping=self._stop.is_set,
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            # One datagram wakes the blocked recvfrom, which then sees the flag.
            family = self._sock.family
            with socket.socket(family, socket.SOCK_DGRAM) as poke:
                poke.sendto(b"", self.address)
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> Responder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    # Children must not outlive a parent killed with SIGKILL (namespace teardown does that).
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _parse_listen(_ctx: click.Context, _param: click.Parameter, text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{text!r}: expected IP:PORT")
    return host.strip("[]"), int(port)


@click.command(name="python -m kubeproxy.lab.dns.responder", help=__doc__.split("\n")[0])
@click.option("--listen", callback=_parse_listen, default="127.0.0.1:53", show_default=True, help="IP:PORT")
@click.option("--processes", type=int, default=1, show_default=True, help="SO_REUSEPORT sockets, one process each")
@click.option("--zone", "origin", default="lab.test.", show_default=True, help="names under this origin get an A record")
@click.option("--address", default="192.0.2.53", show_default=True, help="the A record's address")
@click.option("--drop-every", type=int, default=0, help="drop every Nth query (0: none)")
def main(listen: tuple[str, int], processes: int, origin: str, address: str, drop_every: int) -> None:
    try:
        zone = Zone(origin, address)
    except ValueError as exc:
        print(f"responder: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(respond(listen, processes, zone, drop_every))


def respond(listen: tuple[str, int], processes: int, zone: Zone, drop_every: int) -> int:
    """Serve until SIGTERM/SIGINT; 2 when a socket cannot be set up."""
    try:
        host, port = listen
        socks = [open_socket(host, port, reuse_port=processes > 1)]
        if processes > 1:
            port = socks[0].getsockname()[1]
            socks += [open_socket(host, port, reuse_port=True) for _ in range(processes - 1)]
    except (OSError, ValueError) as exc:
        print(f"responder: {exc}", file=sys.stderr)
        return 2
    children: list[int] = []
    for sock in socks[1:]:
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            serve(sock, zone, drop_every=drop_every)
            os._exit(0)
        children.append(pid)
    print(f"ready {host}:{socks[0].getsockname()[1]}", flush=True)

    def _stop(signum: int, _frame: object) -> None:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    serve(socks[0], zone, drop_every=drop_every)
    return 0


if __name__ == "__main__":
    main()
