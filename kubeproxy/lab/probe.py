"""Tiny UDP/TCP probes for kernel tests: a receiver that answers with what it saw, and a sender.

    python -m kubeproxy.lab.probe serve --proto udp --listen 10.2.0.2:53 [--listen ...]
        prints `ready` once every socket is bound, then answers each datagram / connection with
        JSON {"dst": "ip:port it arrived at", "src": "ip:port it came from"}.
    python -m kubeproxy.lab.probe send --proto udp --dst 10.96.0.10:53 [--dst ...] --count 100 [--src IP] [--sport N]
        one new socket (so one new connection) per probe; prints one JSON list: per probe either
        {"dst": ..., "src": ...} as the receiver saw it, "refused" (REJECT) or "timeout" (DROP).
        The sockets stay open until the batch ends, so the kernel never hands out a source port
        twice and N probes are N conntrack entries (closed at once, ports are reused: 40 queries
        shared a port about one run in 35). A fixed --sport makes every UDP probe the same flow
        to conntrack (for TCP it would collide with the previous connection's TIME_WAIT).

Traffic only ever goes to addresses the caller names (tests use their own namespaces).
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
from contextlib import ExitStack

import click


def _addr(s: str) -> tuple[str, int]:
    """`ip:port` or `[ipv6]:port`."""
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _hp(addr: tuple[str, int] | tuple[str, int, int, int]) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def serve(proto: str, listens: list[str]) -> None:
    sel = selectors.DefaultSelector()
    for spec in listens:
        host, port = _addr(spec)
        if proto == "udp":
            s = socket.socket(_family(host), socket.SOCK_DGRAM)
        else:
            s = socket.socket(_family(host), socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        if proto == "tcp":
            s.listen(128)
        sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            if proto == "udp":
                _data, peer = ready.recvfrom(2048)
                here = ready.getsockname()
                ready.sendto(json.dumps({"dst": _hp(here), "src": _hp(peer)}).encode(), peer)
            else:
                conn, peer = ready.accept()
                here = conn.getsockname()
                with conn:
                    conn.sendall(json.dumps({"dst": _hp(here), "src": _hp(peer)}).encode())


def _one(proto: str, dst: tuple[str, int], src: str | None, timeout: float, sport: int, held: ExitStack) -> object:
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    with ExitStack() as mine:
        s = mine.enter_context(socket.socket(_family(dst[0]), kind))
        if not sport:
            held.push(mine.pop_all())
        s.settimeout(timeout)
        if src or sport:
            s.bind((src or "", sport))
        try:
            s.connect(dst)
            if proto == "udp":
                s.send(b"probe")
            data = s.recv(2048)
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError as e:
            return f"error: {e.strerror}"
        try:
            return json.loads(data.decode())
        except ValueError:
            return "garbled"


def send(proto: str, dsts: list[str], count: int, src: str | None, timeout: float, sport: int = 0) -> None:
    """`count` probes to each destination in turn; one JSON list of results, in that order."""
    targets = [_addr(dst) for dst in dsts]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one open socket per probe
    with ExitStack() as held:
        got = [_one(proto, target, src, timeout, sport, held) for target in targets for _ in range(count)]
    print(json.dumps(got), flush=True)


PROTOS = click.Choice(["udp", "tcp"])


@click.group(name="probe")
def main() -> None:
    """UDP/TCP probes for kernel tests (see the module's docstring)."""


@main.command(name="serve")
@click.option("--proto", type=PROTOS, required=True)
@click.option("--listen", multiple=True, required=True, help="ip:port; repeatable")
def serve_command(proto: str, listen: tuple[str, ...]) -> None:
    serve(proto, list(listen))


@main.command(name="send")
@click.option("--proto", type=PROTOS, required=True)
@click.option("--dst", multiple=True, required=True, help="ip:port; repeat to probe several in turn")
@click.option("--count", type=int, default=1, show_default=True)
@click.option("--src", default=None)
@click.option("--timeout", type=float, default=1.0, show_default=True)
@click.option("--sport", type=int, default=0)
def send_command(proto: str, dst: tuple[str, ...], count: int, src: str | None, timeout: float, sport: int) -> None:
    send(proto, list(dst), count, src, timeout, sport)


if __name__ == "__main__":
    main()
