"""The relay loop: one asyncio loop on its own thread that owns every listener and connection.

The sync thread never waits on traffic: it binds a listener (a plain system call), then hands
the loop the socket and an immutable table per service port (`call`, which returns once the
loop has adopted them). From then on the loop alone touches the listeners, the balancer and the
connections, so none of them needs a lock.

Limits: every relayed TCP connection holds FDS_SPLICE (or FDS_COPY) file descriptors and every
UDP flow one; the budget is RLIMIT_NOFILE minus a reserve for the rest of the proxy (the API
watches, health servers, iptables-restore pipes). When it is spent, the TCP listeners stop
accepting (clients wait in the listen backlog instead of being refused) and new UDP flows are
dropped, with one log line per episode; accepting resumes as connections finish.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import resource
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubeproxy.backends.userspace.balancer import DIAL_TIMEOUTS, Balancer, PortTable
from kubeproxy.backends.userspace.relay import (
    FDS_COPY,
    FDS_SPLICE,
    HAVE_SPLICE,
    UDP_BATCH,
    UDP_BUFFER,
    PipePool,
    TcpConnection,
    UdpFlow,
    reset,
)
from kubeproxy.model.node_model import ServicePortName
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.userspace")

T = TypeVar("T")
ACCEPT_BATCH = 64  # connections accepted per readiness callback
DEFAULT_UDP_TIMEOUT = 0.25  # upstream's --udp-timeout default
# Upstream raised RLIMIT_NOFILE to 64000 for the userspace mode (cmd/kube-proxy: rlimit.SetNumFiles).
WANTED_NOFILE = 64000


def raise_nofile(wanted: int = WANTED_NOFILE) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (up to the hard limit); the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_budget(nofile: int | None = None) -> int:
    """File descriptors the relay may hold: the soft limit minus a reserve (a tenth, at least 64)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if nofile is None else nofile
    return max(0, soft - max(64, soft // 10))


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (optional), else asyncio's."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


@dataclass(frozen=True)
class RelayStats:
    """What the relay is doing (gauges) and has done (counters since it started)."""

    running: bool
    listeners: int
    connections: int  # open TCP connections
    udp_flows: int
    fds: int  # file descriptors held for connections and flows
    fd_budget: int
    accepting: bool  # False while the fd budget is exhausted
    accepted: int
    failed_dials: int  # connects to an endpoint that failed (TCP: retried on the next endpoint)
    no_endpoint: int  # connections or datagrams with no endpoint to send to
    fd_limit_hits: int


@dataclass(eq=False)
class Listener:
    name: ServicePortName
    protocol: str  # "TCP" / "UDP"
    sock: socket.socket
    port: int
    paused: bool = False


@dataclass
class RelayServer:
    udp_timeout: float = DEFAULT_UDP_TIMEOUT
    splice: bool = HAVE_SPLICE
    max_fds: int = field(default_factory=fd_budget)
    loop: asyncio.AbstractEventLoop = field(default_factory=new_loop)
    balancer: Balancer = field(default_factory=Balancer)
    listeners: dict[ServicePortName, Listener] = field(default_factory=dict, init=False)
    connections: set[TcpConnection] = field(default_factory=set, init=False)
    flows: dict[tuple[ServicePortName, tuple[str, int]], UdpFlow] = field(default_factory=dict, init=False)
    fds_used: int = field(default=0, init=False)
    accepted: int = field(default=0, init=False)
    failed_dials: int = field(default=0, init=False)
    no_endpoint: int = field(default=0, init=False)
    fd_limit_hits: int = field(default=0, init=False)  # connections/flows refused for the fd budget
    _limited: bool = field(default=False, init=False)
    _dials: set[Dial] = field(default_factory=set, init=False)
    pipes: PipePool | None = field(default=None, init=False)  # splice mode's pipes, reused
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.splice:
            self.pipes = PipePool()

    # -- from other threads

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="userspace-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 30) -> T:
        """Run `fn(*args)` on the relay loop and return its result (or raise its exception)."""
        if self._thread is None:
            raise RuntimeError("the relay loop is not running")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller's thread, raised there
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout)

    def stop(self) -> None:
        """Close every listener, connection and flow, then stop the loop and its thread."""
        if self._thread is None:
            return
        self.call(self._close_all)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self._thread = None
        self.loop.close()

    def stats(self) -> RelayStats:
        """The counters, read from any thread without waiting for the loop (a scrape must not
        queue behind traffic): each value is read atomically, together they may be one event apart."""
        thread = self._thread
        return RelayStats(
            running=thread is not None and thread.is_alive(),
            listeners=len(self.listeners),
            connections=len(self.connections),
            udp_flows=len(self.flows),
            fds=self.fds_used,
            fd_budget=self.max_fds,
            accepting=not self._limited,
            accepted=self.accepted,
            failed_dials=self.failed_dials,
            no_endpoint=self.no_endpoint,
            fd_limit_hits=self.fd_limit_hits,
        )

    # -- on the loop

    def snapshot(self) -> dict[str, Any]:
        return {
            "listeners": {str(n): {"protocol": lst.protocol, "port": lst.port} for n, lst in self.listeners.items()},
            "connections": len(self.connections),
            "flows": len(self.flows),
            "fds": self.fds_used,
            "accepted": self.accepted,
        }

    def adopt(self, opened: list[Listener], tables: Mapping[ServicePortName, PortTable], closed: list[ServicePortName]) -> None:
        """A sync's outcome: start serving `opened`, balance with `tables`, stop `closed`."""
        for lst in opened:
            self.listeners[lst.name] = lst
            handler = self._on_accept if lst.protocol == "TCP" else self._on_datagram
            self.loop.add_reader(lst.sock.fileno(), handler, lst)
        self.balancer.update(tables)
        self.balancer.expire_pins()
        # A UDP flow to an endpoint that is gone would send the client's next datagrams into the
        # void until it idles out: end it, and the next datagram picks a live endpoint (what
        # the kernel modes get from deleting the flow's conntrack entry).
        for (name, _), flow in list(self.flows.items()):
            table = tables.get(name)
            if table is not None and flow.endpoint not in table.endpoints:
                flow.close()
        for name in closed:
            if name not in self.listeners:
                continue
            lst = self.listeners.pop(name)
            if not lst.paused:
                self.loop.remove_reader(lst.sock.fileno())
            lst.sock.close()
            # Established TCP connections go on (as upstream's); UDP flows belong to the socket.
            for key in [k for k in self.flows if k[0] == name]:
                self.flows[key].close()

    def _close_all(self) -> None:
        self.adopt([], {}, list(self.listeners))
        for conn in list(self.connections):
            conn.abort()
        for flow in list(self.flows.values()):
            flow.close()
        for dial in list(self._dials):
            dial.cancel()
        if self.pipes is not None:
            self.pipes.close()

    def _take(self, fds: int) -> bool:
        if self.fds_used + fds > self.max_fds:
            self.fd_limit_hits += 1
            if not self._limited:
                self._limited = True
                log.error(kv("Too many open files: the userspace relay stops accepting until connections finish",
                             limit=self.max_fds, connections=len(self.connections), flows=len(self.flows)))  # fmt: skip
            return False
        self.fds_used += fds
        return True

    def _give(self, fds: int) -> None:
        self.fds_used -= fds
        if self._limited and self.fds_used + self._conn_fds <= self.max_fds:
            self._limited = False
            log.info(kv("The userspace relay accepts connections again", connections=len(self.connections)))
            for lst in self.listeners.values():
                if lst.paused:
                    lst.paused = False
                    self.loop.add_reader(lst.sock.fileno(), self._on_accept, lst)

    @property
    def _conn_fds(self) -> int:
        return FDS_SPLICE if self.splice else FDS_COPY

    def _on_accept(self, lst: Listener) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self._take(self._conn_fds):
                lst.paused = True
                self.loop.remove_reader(lst.sock.fileno())
                return
            try:
                client, peer = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                self._give(self._conn_fds)
                return
            except OSError as exc:
                self._give(self._conn_fds)
                log.warning(kv("Accept failed", service=str(lst.name), err=exc))
                return
            self.accepted += 1
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            dial = Dial(self, lst, client, peer[0])
            self._dials.add(dial)
            dial.next()

    def _connected(self, lst: Listener, client: socket.socket, upstream: socket.socket) -> None:
        conn = TcpConnection(self.loop, client, upstream, self.pipes, self._closed)
        self.connections.add(conn)
        conn.begin()

    def _unreachable(self, dial: Dial) -> None:
        reset(dial.client)  # no endpoint answered: the client sees a reset, not a hang
        self._give(self._conn_fds)

    def _closed(self, conn: TcpConnection) -> None:
        self.connections.discard(conn)
        self._give(self._conn_fds)

    def _on_datagram(self, lst: Listener) -> None:
        for _ in range(UDP_BATCH):
            try:
                data, client = lst.sock.recvfrom(UDP_BUFFER)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # an ICMP error for an earlier reply: nothing to do for this socket
            key = (lst.name, (client[0], client[1]))
            flow = self.flows.get(key)
            if flow is None:
                flow = self._new_flow(lst, key)
                if flow is None:
                    continue  # dropped: no endpoint, or no file descriptor left
            flow.send(data)

    def _new_flow(self, lst: Listener, key: tuple[ServicePortName, tuple[str, int]]) -> UdpFlow | None:
        endpoint = self.balancer.next_endpoint(lst.name, key[1][0])
        if endpoint is None:
            self.no_endpoint += 1
            return None
        if not self._take(1):
            return None
        family = socket.AF_INET6 if ":" in endpoint[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.connect(endpoint)
        except OSError as exc:
            sock.close()
            self._give(1)
            self.failed_dials += 1
            log.info(kv("Dial failed", service=str(lst.name), endpoint=f"{endpoint[0]}:{endpoint[1]}", err=exc))
            return None

        def closed(flow: UdpFlow) -> None:
            if self.flows.get(key) is flow:
                del self.flows[key]
            self._give(1)

        flow = UdpFlow(self.loop, lst.sock, key[1], sock, endpoint, self.udp_timeout, closed)
        self.flows[key] = flow
        flow.begin()
        return flow


class Dial:
    """Connecting one accepted client to an endpoint: the next endpoint after each failure, each
    attempt bounded by its DIAL_TIMEOUTS entry (upstream's tryConnect). Callbacks on the loop
    (a non-blocking connect and a timer), no task or future per connection."""

    __slots__ = ("attempt", "client", "client_ip", "endpoint", "lst", "server", "sock", "timer")

    def __init__(self, server: RelayServer, lst: Listener, client: socket.socket, client_ip: str) -> None:
        self.server, self.lst, self.client, self.client_ip = server, lst, client, client_ip
        self.attempt = 0
        self.sock: socket.socket | None = None
        self.endpoint: tuple[str, int] = ("", 0)
        self.timer: asyncio.TimerHandle | None = None

    def next(self) -> None:
        srv = self.server
        while self.attempt < len(DIAL_TIMEOUTS):
            endpoint = srv.balancer.next_endpoint(self.lst.name, self.client_ip, reset_affinity=self.attempt > 0)
            if endpoint is None:
                srv.no_endpoint += 1
                log.debug(kv("Couldn't find an endpoint", service=str(self.lst.name)))
                break
            self.endpoint = endpoint
            sock = socket.socket(socket.AF_INET6 if ":" in endpoint[0] else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(endpoint)
            if err == 0:
                self._done(sock)
                return
            if err == errno.EINPROGRESS:
                self.sock = sock
                srv.loop.add_writer(sock.fileno(), self._writable)
                self.timer = srv.loop.call_later(DIAL_TIMEOUTS[self.attempt], self._timed_out)
                return
            sock.close()
            self._failed(os.strerror(err))
        srv._dials.discard(self)
        srv._unreachable(self)

    def _writable(self) -> None:
        sock = self._stop_waiting()
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == 0:
            self._done(sock)
            return
        sock.close()
        self._failed(os.strerror(err))
        self.next()

    def _timed_out(self) -> None:
        self.timer = None
        self._stop_waiting().close()
        self._failed("timeout")
        self.next()

    def _stop_waiting(self) -> socket.socket:
        sock, self.sock = self.sock, None
        assert sock is not None
        self.server.loop.remove_writer(sock.fileno())
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return sock

    def _failed(self, why: str) -> None:
        self.server.failed_dials += 1
        self.attempt += 1
        endpoint = f"{self.endpoint[0]}:{self.endpoint[1]}"
        log.info(kv("Dial failed", service=str(self.lst.name), endpoint=endpoint, err=why))

    def _done(self, sock: socket.socket) -> None:
        self.server._dials.discard(self)
        self.server._connected(self.lst, self.client, sock)

    def cancel(self) -> None:
        if self.sock is not None:
            self._stop_waiting().close()
        self.server._dials.discard(self)
        self.server._unreachable(self)
