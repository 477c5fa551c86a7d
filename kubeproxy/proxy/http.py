"""A tiny asyncio HTTP/1.1 server for the proxy's health, health-check and metrics endpoints.

Only what probes and scrapers need: GET and HEAD, one request per connection (every response
says `Connection: close`), a bounded request head read within a deadline, and no request
bodies. A handler maps `(method, path, headers)` to a `Response` (or an awaitable of one);
`routes()` builds one from a path table and answers 404 for other paths, as Go's ServeMux does.

These ports face the network (healthz on 0.0.0.0:10256, health-check node ports on every node
address), so a client must not be able to take the proxy's file descriptors: with them gone,
iptables-restore cannot even open its pipes and the node stops being programmed. Hence:

- Every connection holds a slot of a `ConnectionBudget`, which the servers of one proxy share
  and which is sized from RLIMIT_NOFILE so that a reserve of descriptors always stays free for
  the syncer (restore processes, conntrack, the API connections). Each server also has its own
  cap (`Limits.max_connections`).
- When a new connection would exceed either bound, the oldest *idle* connection (one that has
  not yet sent its whole request head: a slow or silent client) is closed to make room. A probe
  sends its request at once, so it is answered even while idle connections flood the port.
  When every slot is busy answering, the server stops accepting until one frees (the kernel's
  backlog holds the newcomers); answering is bounded by the write timeout.
- A client gets `head_timeout` to send its request head (slowloris) and `write_timeout` to take
  the answer.
- Accepting may still fail (EMFILE when something else took the descriptors). That is logged
  once, then as a count ("repeated N times") at most every `ErrorLog.interval`, never as a
  traceback per attempt (asyncio's own accept loop logs one per listener per second: with a
  listener per health-check node port, thousands); the server frees an idle connection if it
  has one, else retries after `ACCEPT_RETRY` or as soon as a connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import inspect
import ipaddress
import logging
import resource
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8192  # bytes of request line + headers; probes send a few hundred
HEAD_TIMEOUT = 10.0  # seconds a client may take to send its request head
WRITE_TIMEOUT = 10.0  # seconds a client may take to take our answer
MAX_CONNECTIONS = 64  # per server: probes come a few a second, scrapers one at a time
ACCEPT_RETRY = 1.0  # seconds before retrying an accept that failed for lack of resources
BACKLOG = 100
# Of RLIMIT_NOFILE, what the HTTP servers may never use: half of it, and at least this many.
FD_RESERVE_MIN = 128
MAX_BUDGET = 4096  # connections all servers together; more is no use to probes
# After refusing a request whose bytes we did not all read, keep reading (and dropping) them a
# moment: closing with unread input resets the connection, which can destroy our answer.
LINGER = 0.5
LINGER_BYTES = 1 << 20
TEXT = "text/plain; charset=utf-8"
ALLOWED_METHODS = ("GET", "HEAD")
# accept() failures that mean "no descriptors or memory now": the connection waits in the backlog.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


Handler = Callable[[str, str, Mapping[str, str]], Response | Awaitable[Response]]


def text(status: int, body: str, **headers: str) -> Response:
    """A plain-text response with Go's default content headers."""
    return Response(status, {"Content-Type": TEXT, "X-Content-Type-Options": "nosniff", **headers}, body.encode())


NOT_FOUND = text(404, "404 page not found\n")


def routes(table: Mapping[str, Handler]) -> Handler:
    """A handler dispatching on the exact path; anything else is 404."""

    def handle(method: str, path: str, headers: Mapping[str, str]) -> Response | Awaitable[Response]:
        route = table.get(path)
        return NOT_FOUND if route is None else route(method, path, headers)

    return handle


def parse_bind(bind: str) -> tuple[str | None, int]:
    """`"ip:port"`, `"[ipv6]:port"` or `":port"` (every address) → (host, port). Port 0 picks a free one."""
    host, sep, port_text = bind.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"bind address {bind!r}: want IP:PORT (IPv6 as [IP]:PORT) with a port 0-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not host:
        return None, int(port_text)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is None or ip.version != (6 if bracketed else 4):
        raise ValueError(f"bind address {bind!r}: {host!r} is not an IP address (IPv6 goes in brackets)")
    return str(ip), int(port_text)


def format_bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Limits:
    """Per-server bounds; see the module docstring."""

    max_connections: int = MAX_CONNECTIONS
    head_timeout: float = HEAD_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT
    accept_retry: float = ACCEPT_RETRY

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections {self.max_connections}: must be at least 1")


class ErrorLog:
    """An error that may repeat many times a second, logged once, then as a count.

    `report(key, message)` logs `message` the first time `key` is seen. Later reports are
    counted, and the count is logged ("... (repeated N times in 5.0s)") at most once per
    `interval`: when a report comes after it, or, on an event loop, when the interval ends, so
    that the count of a burst that stopped is not lost. A key quiet for a whole interval is
    forgotten: if it comes back it is logged in full again.
    """

    def __init__(
        self, logger: logging.Logger = log, *, interval: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self.interval = interval
        self._clock = clock
        self._open: dict[Hashable, _Repeats] = {}

    def report(self, key: Hashable, message: str, level: int = logging.ERROR, *, exc_info: bool = False) -> None:
        """Log `message` if `key` is new (with the traceback if `exc_info`), else count it."""
        now = self._clock()
        seen = self._open.get(key)
        if seen is None:
            self._open[key] = _Repeats(message, level, now)
            self._log.log(level, "%s", message, exc_info=exc_info)
            self._schedule(key)
            return
        seen.count += 1
        seen.message = message
        if now - seen.since >= self.interval:
            self._summary(seen, now)

    def pending(self, key: Hashable) -> int:
        """How many reports of `key` are counted and not yet logged."""
        seen = self._open.get(key)
        return seen.count if seen else 0

    def _schedule(self, key: Hashable) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: counts are logged by the next report after the interval
        loop.call_later(self.interval, self._flush, key)

    def _flush(self, key: Hashable) -> None:
        seen = self._open.get(key)
        if seen is None:
            return
        now = self._clock()
        if seen.count:
            self._summary(seen, now)
        elif now - seen.since >= self.interval:
            del self._open[key]  # quiet for a whole interval: the condition is over
            return
        self._schedule(key)

    def _summary(self, seen: _Repeats, now: float) -> None:
        self._log.log(seen.level, "%s (repeated %d times in %.1fs)", seen.message, seen.count, now - seen.since)
        seen.count, seen.since = 0, now


@dataclass
class _Repeats:
    message: str
    level: int
    since: float  # first report, or the last summary
    count: int = 0


class ConnectionBudget:
    """The connections that the HTTP servers sharing it may hold at once, together.

    One per proxy (no process-wide state): pass the same budget to every server it runs. It also
    keeps their idle connections, oldest first, so that a server needing room closes those.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"connection budget {limit}: must be at least 1")
        self.limit = limit
        self.active = 0
        self._idle: dict[_Connection, None] = {}  # insertion order: oldest first
        self._waiters: list[asyncio.Future[None]] = []

    @classmethod
    def from_rlimit(cls, soft: int | None = None) -> ConnectionBudget:
        """Sized from the open-file limit (`soft`, default RLIMIT_NOFILE's soft limit), keeping
        half of it, and at least FD_RESERVE_MIN descriptors, for everything else."""
        if soft is None:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft < 0:
            soft = 1 << 20
        reserve = max(FD_RESERVE_MIN, soft // 2)
        # With a tiny limit the reserve wins; a few slots still let probes in.
        return cls(max(4, min(MAX_BUDGET, soft - reserve)))

    def oldest_idle(self, server: HttpServer | None = None) -> _Connection | None:
        """The longest-waiting connection without a whole request (of `server`, or of any)."""
        for conn in self._idle:
            if server is None or conn.server is server:
                return conn
        return None

    def _changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait(self, timeout: float | None = None) -> None:
        """Until a connection closes or becomes idle (or `timeout` passes)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)


@dataclass(eq=False)
class _Connection:
    """One accepted connection's slot: counted from accept to close."""

    server: HttpServer
    writer: asyncio.StreamWriter | None = None  # once its transport exists
    released: bool = False

    def close(self) -> None:
        """Close it now and give its slot back (the handler's own cleanup then does nothing)."""
        self.server._release(self)
        if self.writer is None:
            return
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            # A reset: an idle client is owed nothing, and the kernel keeps no state for it.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


@dataclass(eq=False)
class HttpServer(asyncio.AbstractServer):
    """The listening sockets of one `serve` call and their connections. `close()` stops
    listening at once; connections already accepted finish within their timeouts."""

    name: str
    handler: Handler
    limits: Limits
    budget: ConnectionBudget
    errors: ErrorLog
    sockets: list[socket.socket]
    loop: asyncio.AbstractEventLoop
    active: int = 0  # connections of this server, accepted and not yet closed
    _accepting: list[asyncio.Task[None]] = field(default_factory=list)
    _connections: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in self.sockets:
            self.loop.remove_reader(sock.fileno())  # before close: the fd number may be reused at once
            sock.close()
        for task in self._accepting:
            task.cancel()

    def is_serving(self) -> bool:
        return not self._closed

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.loop

    async def start_serving(self) -> None:
        return None  # serving from the start

    async def serve_forever(self) -> None:
        await asyncio.gather(*self._accepting, return_exceptions=True)

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, return_exceptions=True)

    def _start(self) -> None:
        for sock in self.sockets:
            self._accepting.append(self.loop.create_task(self._accept_loop(sock), name=f"{self.name} accept"))

    def _has_room(self) -> bool:
        """Whether a new connection fits, if need be by closing idle ones."""
        if self.active >= self.limits.max_connections and self.budget.oldest_idle(self) is None:
            return False
        return self.budget.active < self.budget.limit or self.budget.oldest_idle() is not None

    def _make_room(self) -> bool:
        """Close idle connections until one more fits; False if it cannot."""
        for scope in (self, None):
            while (self.active >= self.limits.max_connections) if scope else (self.budget.active >= self.budget.limit):
                victim = self.budget.oldest_idle(scope)
                if victim is None:
                    return False
                self.errors.report(
                    (self.name, "full"),
                    f'"Closing an idle connection to make room" server="{self.name}" connections={self.active} '
                    f"limit={self.limits.max_connections} allServers={self.budget.active} budget={self.budget.limit}",
                    logging.WARNING,
                )
                victim.close()
        return True

    async def _accept_loop(self, sock: socket.socket) -> None:
        where = _sockname(sock)
        while not self._closed:
            if not self._has_room():
                # Every slot is answering a request: let the kernel's backlog hold newcomers.
                await self.budget._wait()
                continue
            try:
                conn, _ = await self.loop.sock_accept(sock)
            except OSError as exc:
                if self._closed:
                    return
                # Keyed by the error alone: EMFILE hits every listener sharing `errors` at once.
                self.errors.report(
                    ("accept", exc.errno),
                    f'"Failed to accept a connection" server="{self.name}" address="{where}" err="{exc}"',
                )
                if exc.errno in _RESOURCE_ERRNOS:
                    await self._free_descriptors()
                continue
            # Room was there when we started to wait; if requests being answered took it
            # meanwhile, this one connection waits in our hands until a slot frees.
            try:
                while not self._make_room():
                    await self.budget._wait()
            except BaseException:  # closed (cancelled) meanwhile
                conn.close()
                raise
            slot = _Connection(self)
            self.active += 1
            self.budget.active += 1
            task = self.loop.create_task(self._serve_connection(conn, slot))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _free_descriptors(self) -> None:
        """Out of descriptors: close the oldest idle connection and retry once it is gone, or
        wait until one of ours closes (or `accept_retry`: someone else may free some)."""
        victim = self.budget.oldest_idle()
        if victim is None or victim.writer is None:
            await self.budget._wait(self.limits.accept_retry)
            return
        victim.close()
        with contextlib.suppress(ConnectionError):
            await victim.writer.wait_closed()

    async def _serve_connection(self, sock: socket.socket, slot: _Connection) -> None:
        try:
            reader = asyncio.StreamReader(limit=MAX_REQUEST_HEAD)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await self.loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            self._release(slot)
            sock.close()
            return
        writer = slot.writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        if not slot.released:
            self.budget._idle[slot] = None
            self.budget._changed()
        try:
            response, method = await _answer(reader, self.handler, self.name, self.limits.head_timeout, self.errors, slot)
            if response is not None and not slot.released:
                writer.write(_encode(response, head_only=method == "HEAD"))
                await asyncio.wait_for(writer.drain(), self.limits.write_timeout)
                if response.status in (400, 431):
                    writer.write_eof()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(_discard(reader), LINGER)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or is too slow to take the answer
        finally:
            self._release(slot)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _release(self, slot: _Connection) -> None:
        if slot.released:
            return
        slot.released = True
        self.active -= 1
        self.budget.active -= 1
        self.budget._idle.pop(slot, None)
        self.budget._changed()


def _sockname(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return format_bind(host, port)


def _listen(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets as asyncio.start_server makes them: every address when host is None
    (0.0.0.0 and, where IPv6 exists, :: with IPV6_V6ONLY), SO_REUSEADDR, non-blocking."""
    hosts = [host] if host is not None else ["0.0.0.0", *(["::"] if socket.has_ipv6 else [])]
    socks: list[socket.socket] = []
    try:
        for h in hosts:
            family = socket.AF_INET6 if ":" in h else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                if host is None and family == socket.AF_INET6:
                    continue  # no IPv6 on this host: 0.0.0.0 alone is "every address"
                raise
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((h, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


async def serve(
    bind: str,
    handler: Handler,
    *,
    name: str = "http",
    limits: Limits | None = None,
    budget: ConnectionBudget | None = None,
    errors: ErrorLog | None = None,
) -> HttpServer:
    """Listen on `bind` and answer each connection's one request with `handler`.

    `budget` is shared by the servers of one proxy (default: one of this server's own, sized
    from RLIMIT_NOFILE); `errors` too, so that one condition hitting many listeners (EMFILE on
    every health-check port) is still one log line and a count.

    Raises ValueError for a malformed address and OSError when the address cannot be bound.
    The caller owns the returned server (`close()` stops listening at once).
    """
    host, port = parse_bind(bind)
    server = HttpServer(
        name,
        handler,
        limits or Limits(),
        budget or ConnectionBudget.from_rlimit(),
        errors or ErrorLog(),
        _listen(host, port),
        asyncio.get_running_loop(),
    )
    server._start()
    return server


async def _answer(
    reader: asyncio.StreamReader,
    handler: Handler,
    name: str,
    head_timeout: float,
    errors: ErrorLog,
    conn: _Connection,
) -> tuple[Response | None, str]:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), head_timeout)
    except asyncio.LimitOverrunError:
        return text(431, "request head too large\n"), "GET"
    except (TimeoutError, asyncio.IncompleteReadError):
        return None, ""  # a silent or truncated client gets no answer, as Go's server does
    conn.server.budget._idle.pop(conn, None)  # a whole request: no longer a candidate for closing
    request = _parse_head(head)
    if request is None:
        return text(400, "malformed request\n"), "GET"
    method, path, headers = request
    if method not in ALLOWED_METHODS:
        return text(405, "method not allowed\n", Allow=", ".join(ALLOWED_METHODS)), method
    try:
        result = handler(method, path, headers)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        # One traceback per kind of failure, then counts: a broken handler under load must not
        # flood the log.
        errors.report((name, "handler", type(exc).__name__), f"{name}: handler failed for {method} {path}", exc_info=True)
        return text(500, "internal server error\n"), method
    return result, method


async def _discard(reader: asyncio.StreamReader) -> None:
    dropped = 0
    while dropped < LINGER_BYTES and (chunk := await reader.read(65536)):
        dropped += len(chunk)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    try:
        lines = head.decode("latin-1").split("\r\n")
    except UnicodeDecodeError:
        return None
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        return None
    method, target, _ = parts
    path = urlsplit(target).path or "/"
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep or not key or key != key.strip():
            return None
        headers[key.lower()] = value.strip()
    return method, path, headers


def _encode(response: Response, *, head_only: bool) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    headers = {
        **response.headers,
        "Content-Length": str(len(response.body)),
        "Date": email.utils.formatdate(usegmt=True),
        "Connection": "close",
    }
    lines = [f"HTTP/1.1 {response.status} {reason}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else response.body)
