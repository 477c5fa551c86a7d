"""A tiny asyncio HTTP/1.1 server for the proxy's health, health-check and metrics endpoints.

Only what probes and scrapers need: GET and HEAD, one request per connection (every response
says `Connection: close`), a bounded request head read within a deadline, and no request
bodies. A handler maps `(method, path, headers)` to a `Response` (or an awaitable of one);
`routes()` builds one from a path table and answers 404 for other paths, as Go's ServeMux does.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8192  # bytes of request line + headers; probes send a few hundred
HEAD_TIMEOUT = 10.0  # seconds a client may take to send its request head
# After refusing a request whose bytes we did not all read, keep reading (and dropping) them a
# moment: closing with unread input resets the connection, which can destroy our answer.
LINGER = 0.5
LINGER_BYTES = 1 << 20
TEXT = "text/plain; charset=utf-8"
ALLOWED_METHODS = ("GET", "HEAD")


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


async def serve(bind: str, handler: Handler, *, name: str = "http") -> asyncio.Server:
    """Listen on `bind` and answer each connection's one request with `handler`.

    Raises ValueError for a malformed address and OSError when the address cannot be bound.
    The caller owns the returned server (`close()` stops listening at once).
    """
    host, port = parse_bind(bind)

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response, method = await _answer(reader, handler, name)
            if response is not None:
                writer.write(_encode(response, head_only=method == "HEAD"))
                await writer.drain()
                if response.status in (400, 431):
                    writer.write_eof()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(_discard(reader), LINGER)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(on_connection, host, port, limit=MAX_REQUEST_HEAD)


async def _answer(reader: asyncio.StreamReader, handler: Handler, name: str) -> tuple[Response | None, str]:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
    except asyncio.LimitOverrunError:
        return text(431, "request head too large\n"), "GET"
    except (TimeoutError, asyncio.IncompleteReadError):
        return None, ""  # a silent or truncated client gets no answer, as Go's server does
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
    except Exception:
        log.exception("%s: handler failed for %s %s", name, method, path)
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
