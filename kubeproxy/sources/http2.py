"""Every request of a client on one HTTP/2 connection to the API server, read by one task.

client-go multiplexes a kube-proxy's lists, watches and Events over one HTTP/2 connection
(apimachinery v0.37.2 util/net/http.go `configureHTTP2Transport`). httpcore2's HTTP/2 cannot
carry several idle long-lived streams: no task owns the socket; a stream that needs bytes takes
a read lock and reads, and the lock passes first-come-first-served. A stream whose answer has
already been read for it by another stream still waits in that queue behind every watch ahead of
it, and each of those blocks in a read until the server next sends anything (against
kube-apiserver v1.37.2: a watch event or a POST's answer held 52-60 s, until the next bookmarks).
It also fails every open stream on a GOAWAY that lets them finish (kube-apiserver answers a 401
over HTTP/2 with one, x/net http2 server.go `startGracefulShutdown`), fails every stream when one
stream's read timeout expires, and sends no RST_STREAM for a response closed early, so the server
goes on streaming into a window that is never given back.

Here one reader task per connection reads the socket and hands each frame to its stream; a
stream waits only for its own data, with its own read timeout. As Go's transport (x/net http2
v0.57.0 transport.go; client-go's settings): stream and connection windows of 4 MiB and 1 GiB,
given back as the consumer reads; a PING after 30 s without a frame and the connection dropped
if 15 s more pass without one (`ReadIdleTimeout`, `PingTimeout`); after a GOAWAY the open
streams finish and new requests go to a new connection. A server that does not speak HTTP/2
(ALPN) is spoken to by the HTTP/1.1 `fallback` transport instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx2
from hyperframe.frame import Frame, GoAwayFrame

STREAM_WINDOW = 4 << 20
CONNECTION_WINDOW = 1 << 30
READ_IDLE_SECONDS = 30.0
PING_TIMEOUT_SECONDS = 15.0
# Request headers that mean something to one HTTP/1.1 hop only (RFC 9113 8.2.2).
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"host"})


class _GracefulH2(h2.connection.H2Connection):
    """h2 closes its whole state machine on any GOAWAY, refusing the frames of the streams the
    server goes on serving (up to the GOAWAY's last stream id, RFC 9113 6.8): here a GOAWAY only
    tells (ConnectionTerminated); `_Connection` opens no stream on it after that."""

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


@dataclass
class _Stream:
    id: int
    request: httpx2.Request
    headers: asyncio.Future[list[tuple[bytes, bytes]]]
    chunks: deque[tuple[bytes, int]] = field(default_factory=deque)  # (data, flow-controlled length)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    error: Exception | None = None

    def fail(self, error: Exception) -> None:
        """End the stream with `error`, for its consumer's next read (or its wait for headers)."""
        if self.error is None and not self.ended:
            self.error = error
        if not self.headers.done():
            self.headers.set_exception(error)
            self.headers.exception()  # a request cancelled meanwhile leaves it unread: not an error to log
        self.arrived.set()


class _Connection:
    """One HTTP/2 connection: its reader task, its streams, and whether it takes new ones."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, read_idle: float, ping_timeout: float) -> None:
        self.reader, self.writer = reader, writer
        self.read_idle, self.ping_timeout = read_idle, ping_timeout
        self.h2 = _GracefulH2(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.streams: dict[int, _Stream] = {}
        self.error: Exception | None = None
        self.going_away = False
        self.changed = asyncio.Condition()  # window updates, settings, streams closed
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 10 << 20,
            },
        )
        del self.h2.local_settings[h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL]
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.flush()
        self.task = asyncio.create_task(self._read_loop(), name="http2-reader")

    @property
    def usable(self) -> bool:
        return self.error is None and not self.going_away

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def drain(self, request: httpx2.Request) -> None:
        self.flush()
        try:
            await self.writer.drain()
        except (OSError, RuntimeError) as e:
            raise httpx2.WriteError(f"writing to the API server: {e}", request=request) from None

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    data = await asyncio.wait_for(self.reader.read(65536), self.read_idle)
                except TimeoutError:
                    self.h2.ping(b"kp-alive")
                    self.flush()
                    try:
                        data = await asyncio.wait_for(self.reader.read(65536), self.ping_timeout)
                    except TimeoutError:
                        raise httpx2.ReadError(f"no answer to a PING within {self.ping_timeout:g}s") from None
                if not data:
                    raise httpx2.RemoteProtocolError("the API server closed the connection")
                for event in self.h2.receive_data(data):
                    self._dispatch(event)
                self.flush()
                async with self.changed:
                    self.changed.notify_all()
        except Exception as e:  # every way the connection can end: each stream is told
            error = e if isinstance(e, httpx2.TransportError) else httpx2.RemoteProtocolError(f"HTTP/2: {e!r}")
            self._fail(error)
        finally:
            self.writer.close()

    def _fail(self, error: Exception) -> None:
        self.error = error
        for stream in self.streams.values():
            stream.fail(error)

    def _dispatch(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        stream = self.streams.get(sid) if sid is not None else None
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            if not stream.headers.done():
                stream.headers.set_result(list(event.headers or []))
        elif isinstance(event, h2.events.DataReceived):
            length = event.flow_controlled_length or 0
            if stream is None:  # a stream already closed here: give its window back at once
                self.h2.acknowledge_received_data(length, event.stream_id)
            else:
                stream.chunks.append((event.data or b"", length))
                stream.arrived.set()
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream.ended = True
            stream.arrived.set()
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.fail(httpx2.RemoteProtocolError(f"the API server reset the stream ({event.error_code!r})"))
        elif isinstance(event, h2.events.ConnectionTerminated):
            # A GOAWAY: streams up to its last id finish; later ones were never seen.
            self.going_away = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for s in self.streams.values():
                if s.id > last:
                    s.fail(httpx2.RemoteProtocolError("the API server went away before this request (GOAWAY)"))

    async def open(self, request: httpx2.Request, body: bytes) -> _Stream:
        async with self.changed:
            await self.changed.wait_for(
                lambda: not self.usable or self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams
            )
            if not self.usable:
                raise self.error or httpx2.RemoteProtocolError("the connection is going away")
            sid = self.h2.get_next_available_stream_id()
            stream = _Stream(sid, request, asyncio.get_running_loop().create_future())
            self.streams[sid] = stream
            headers = [
                (b":method", request.method.encode()),
                (b":authority", request.url.netloc),
                (b":scheme", request.url.scheme.encode()),
                (b":path", request.url.raw_path),
                *((k.lower(), v) for k, v in request.headers.raw if k.lower() not in HOP_HEADERS),
            ]
            self.h2.send_headers(sid, headers, end_stream=not body)
        try:
            await self.drain(request)
            await self._send_body(stream, memoryview(body))
        except BaseException:
            self.close_stream(stream)
            raise
        return stream

    async def _send_body(self, stream: _Stream, view: memoryview) -> None:
        while view:
            async with self.changed:
                await self.changed.wait_for(lambda: stream.error is not None or self.h2.local_flow_control_window(stream.id) > 0)
                if stream.error is not None:
                    raise stream.error
                size = min(self.h2.local_flow_control_window(stream.id), self.h2.max_outbound_frame_size, len(view))
                self.h2.send_data(stream.id, view[:size].tobytes(), end_stream=size == len(view))
                view = view[size:]
            await self.drain(stream.request)

    async def next_chunk(self, stream: _Stream, timeout: float | None) -> bytes | None:
        """The stream's next bytes (its window given back), None at its end."""
        while not stream.chunks:
            if stream.error is not None:
                raise stream.error
            if stream.ended:
                return None
            stream.arrived.clear()
            try:
                await asyncio.wait_for(stream.arrived.wait(), timeout)
            except TimeoutError:
                raise httpx2.ReadTimeout(f"no bytes from the API server for {timeout:g}s", request=stream.request) from None
        data, length = stream.chunks.popleft()
        if length:
            self.h2.acknowledge_received_data(length, stream.id)
            self.flush()
        return data

    def close_stream(self, stream: _Stream) -> None:
        """The consumer is done: a stream the server has not ended is reset, so it stops sending."""
        if self.streams.pop(stream.id, None) is None:
            return
        unread = sum(length for _, length in stream.chunks)
        stream.chunks.clear()
        if unread and self.error is None:
            self.h2.acknowledge_received_data(unread, stream.id)
        if self.error is None and not stream.ended and stream.error is None:
            with contextlib.suppress(h2.exceptions.H2Error):  # closed by both sides meanwhile
                self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
            self.flush()
        if self.going_away and not self.streams:
            self.writer.close()

    async def aclose(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self._fail(httpx2.ReadError("the client was closed"))


class _Body(httpx2.AsyncByteStream):
    def __init__(self, connection: _Connection, stream: _Stream, timeout: float | None) -> None:
        self.connection, self.stream, self.timeout = connection, stream, timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.connection.next_chunk(self.stream, self.timeout)) is not None:
            if chunk:
                yield chunk

    async def aclose(self) -> None:
        self.connection.close_stream(self.stream)


@dataclass
class Http2Transport(httpx2.AsyncBaseTransport):
    """HTTP/2 to one API server over TLS (`ssl_context`, which gets ALPN h2 and http/1.1), one
    connection for every request at a time; `fallback` where the server chooses HTTP/1.1."""

    ssl_context: ssl.SSLContext
    fallback: httpx2.AsyncBaseTransport
    read_idle: float = READ_IDLE_SECONDS
    ping_timeout: float = PING_TIMEOUT_SECONDS
    # Connections opened, in order (the last one takes new requests while usable).
    opened: list[_Connection] = field(default_factory=list, init=False)
    _http11: bool = field(default=False, init=False)
    _connecting: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def __post_init__(self) -> None:
        self.ssl_context.set_alpn_protocols(["h2", "http/1.1"])

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        connection = None if self._http11 else await self._connection(request, timeouts.get("connect"))
        if connection is None:
            return await self.fallback.handle_async_request(request)
        body = await request.aread()
        stream = await connection.open(request, body)
        read = timeouts.get("read")
        try:
            raw = await asyncio.wait_for(asyncio.shield(stream.headers), read)
        except TimeoutError:
            connection.close_stream(stream)
            raise httpx2.ReadTimeout(f"no answer from the API server within {read:g}s", request=request) from None
        except BaseException:
            connection.close_stream(stream)
            raise
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        for name, value in raw:
            if name == b":status":
                status = int(value)
            elif not name.startswith(b":"):
                headers.append((name, value))
        return httpx2.Response(status, headers=headers, stream=_Body(connection, stream, read),
                               extensions={"http_version": b"HTTP/2"})  # fmt: skip

    async def _connection(self, request: httpx2.Request, timeout: float | None) -> _Connection | None:
        async with self._connecting:
            if self.opened and self.opened[-1].usable:
                return self.opened[-1]
            self.opened = [c for c in self.opened if c.streams and c.error is None]
            host, port = request.url.host, request.url.port or 443
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.ssl_context, server_hostname=host), timeout
                )
            except TimeoutError:
                raise httpx2.ConnectTimeout(f"connecting to {host}:{port}", request=request) from None
            except (OSError, ssl.SSLError) as e:
                raise httpx2.ConnectError(f"connecting to {host}:{port}: {e}", request=request) from None
            tls = writer.get_extra_info("ssl_object")
            if tls is None or tls.selected_alpn_protocol() != "h2":
                writer.close()
                self._http11 = True
                return None
            connection = _Connection(reader, writer, self.read_idle, self.ping_timeout)
            self.opened.append(connection)
            return connection

    async def aclose(self) -> None:
        for connection in self.opened:
            await connection.aclose()
        self.opened = []
        await self.fallback.aclose()
