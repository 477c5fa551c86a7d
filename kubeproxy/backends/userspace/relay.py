"""Moving bytes between a client and an endpoint: TCP streams (splice or copy) and UDP flows.

Everything here runs on the relay loop's thread and is driven by readiness callbacks
(`loop.add_reader` / `add_writer`): no coroutine, future or Python object per chunk of data.

TCP: each direction of a connection is a `Stream`. With splice (Linux), bytes go from the
source socket into a pipe and from the pipe into the destination socket without ever being
copied into Python (`os.splice`, two system calls per up to PIPE_SIZE bytes); otherwise through
one bounded bytearray (`recv_into` / `send`). Either way a direction holds at most one buffer:
when the destination does not take more, the source is not read (back-pressure reaches the
sender through TCP's window). End of stream on one side becomes `shutdown(SHUT_WR)` on the
other once the buffer is drained (half-close), and the connection closes when both directions
have ended. An error on either socket resets both.

UDP: one connected socket per client (`UdpFlow`) towards the endpoint chosen for it, so replies
find their client; a flow idle for the UDP timeout (upstream's --udp-timeout, 250 ms by default)
is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kubeproxy.userspace")

PIPE_SIZE = 1 << 20  # bytes a splice direction holds at most (F_SETPIPE_SZ; the kernel may give less)
COPY_BUFFER = 1 << 17  # bytes a copying direction holds at most
UDP_BUFFER = 65535
READS_PER_WAKEUP = 4  # source reads per readiness callback of a TCP direction
UDP_BATCH = 64  # datagrams handled per readiness callback before yielding to other sockets
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
HAVE_SPLICE = hasattr(os, "splice")
# File descriptors one relayed TCP connection holds: two sockets, and two pipes with splice.
FDS_SPLICE, FDS_COPY = 6, 2
_LINGER_RESET = struct.pack("ii", 1, 0)
# Errors that end a connection (the peer went away), as opposed to "try again later".
_AGAIN = (BlockingIOError, InterruptedError)


def reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN: the client learns at once that nothing answers."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


class PipePool:
    """Empty pipes of finished connections, kept for the next ones: a new connection then costs
    no pipe2/fcntl calls. Only pipes known to be empty come back; at most `size` are kept."""

    __slots__ = ("free", "size")

    def __init__(self, size: int = 64) -> None:
        self.free: list[tuple[int, int]] = []
        self.size = size

    def get(self) -> tuple[int, int]:
        if self.free:
            return self.free.pop()
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a smaller pipe still works, with more system calls
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
        return r, w

    def put(self, pipe: tuple[int, int], empty: bool) -> None:
        if empty and len(self.free) < self.size:
            self.free.append(pipe)
        else:
            os.close(pipe[0])
            os.close(pipe[1])

    def close(self) -> None:
        for r, w in self.free:
            os.close(r)
            os.close(w)
        self.free.clear()


class Stream:
    """One direction of a relayed TCP connection: `src` → buffer (pipe or bytearray) → `dst`."""

    __slots__ = (
        "buf",
        "conn",
        "done",
        "dst",
        "dst_fd",
        "eof",
        "moved",
        "pending",
        "pipe",
        "pipes",
        "reading",
        "src",
        "src_fd",
        "start",
        "view",
        "writing",
    )  # fmt: skip

    def __init__(self, conn: TcpConnection, src: socket.socket, dst: socket.socket, pipes: PipePool | None) -> None:
        """`pipes` None: copy through a buffer instead of splicing."""
        self.conn, self.src, self.dst = conn, src, dst
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()
        self.pipes = pipes
        self.pipe = pipes.get() if pipes is not None else None
        self.buf = None if pipes is not None else bytearray(COPY_BUFFER)
        self.view = memoryview(self.buf) if self.buf is not None else None
        self.start = self.pending = 0  # copy: buffer[start:start+pending] is still to be sent
        self.reading = self.writing = self.eof = self.done = False
        self.moved = 0  # bytes relayed, for tests and the bench

    def begin(self) -> None:
        self._read_on()

    def _read_on(self) -> None:
        if not self.reading:
            self.reading = True
            self.conn.loop.add_reader(self.src_fd, self.on_readable)

    def _read_off(self) -> None:
        if self.reading:
            self.reading = False
            self.conn.loop.remove_reader(self.src_fd)

    def on_readable(self) -> None:
        # A few rounds per wake-up while data keeps coming and the destination keeps taking it:
        # one trip through the event loop per chunk would cost more than the chunk's system calls.
        for _ in range(READS_PER_WAKEUP):
            try:
                if self.pipe is not None:
                    n = os.splice(self.src_fd, self.pipe[1], PIPE_SIZE, flags=SPLICE_FLAGS)
                else:
                    assert self.view is not None
                    n = self.src.recv_into(self.view)
                    self.start = 0
            except _AGAIN:
                return
            except OSError:
                self.conn.abort()
                return
            if n == 0:
                self.eof = True
                self._read_off()
            self.pending += n
            self.flush()
            if self.pending or not self.reading:
                return  # the destination is full, the source ended, or the connection closed

    def on_writable(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Send what the buffer holds; read again once it is empty, or pass the end of stream on."""
        while self.pending:
            try:
                if self.pipe is not None:
                    n = os.splice(self.pipe[0], self.dst_fd, self.pending, flags=SPLICE_FLAGS)
                else:
                    assert self.view is not None
                    n = self.dst.send(self.view[self.start : self.start + self.pending])
                    self.start += n
            except _AGAIN:
                # The destination is full: stop reading until it drains (bounded buffer).
                self._read_off()
                if not self.writing:
                    self.writing = True
                    self.conn.loop.add_writer(self.dst_fd, self.on_writable)
                return
            except OSError:
                self.conn.abort()
                return
            self.pending -= n
            self.moved += n
        if self.writing:
            self.writing = False
            self.conn.loop.remove_writer(self.dst_fd)
        if self.eof:
            if not self.done:
                self.done = True
                with contextlib.suppress(OSError):
                    self.dst.shutdown(socket.SHUT_WR)  # half-close: the other direction goes on
                self.conn.stream_done()
        else:
            self._read_on()

    def stop(self) -> None:
        self._read_off()
        if self.writing:
            self.writing = False
            self.conn.loop.remove_writer(self.dst_fd)
        if self.pipe is not None and self.pipes is not None:
            self.pipes.put(self.pipe, empty=self.pending == 0)
            self.pipe = None


class TcpConnection:
    """A client socket and an endpoint socket, relayed both ways until both ends have finished."""

    __slots__ = ("client", "closed", "down", "loop", "on_close", "up", "upstream")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: socket.socket,
        upstream: socket.socket,
        pipes: PipePool | None,
        on_close: Callable[[TcpConnection], None],
    ) -> None:
        self.loop, self.client, self.upstream, self.on_close = loop, client, upstream, on_close
        self.closed = False
        self.up = Stream(self, client, upstream, pipes)
        self.down = Stream(self, upstream, client, pipes)

    def begin(self) -> None:
        self.up.begin()
        self.down.begin()

    @property
    def moved(self) -> tuple[int, int]:
        return self.up.moved, self.down.moved

    def stream_done(self) -> None:
        if self.up.done and self.down.done:
            self._close(abort=False)

    def abort(self) -> None:
        self._close(abort=True)

    def _close(self, *, abort: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.up.stop()
        self.down.stop()
        for sock in (self.client, self.upstream):
            if abort:
                reset(sock)
            else:
                sock.close()
        self.on_close(self)


@dataclass(eq=False)
class UdpFlow:
    """One client's datagrams to its endpoint over a connected socket, and the replies back."""

    loop: asyncio.AbstractEventLoop
    listener: socket.socket  # the service port's socket, where replies leave from
    client: tuple[str, int]
    sock: socket.socket  # connected to the endpoint
    endpoint: tuple[str, int]
    timeout: float
    on_close: Callable[[UdpFlow], None]
    last_used: float = 0.0
    closed: bool = False
    _timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        self.last_used = self.loop.time()
        self.loop.add_reader(self.sock.fileno(), self.on_reply)
        self._timer = self.loop.call_later(self.timeout, self._check_idle)

    def send(self, data: bytes) -> None:
        self.last_used = self.loop.time()
        try:
            self.sock.send(data)
        except _AGAIN:
            pass  # a full socket buffer drops the datagram, as the network would
        except OSError as exc:
            if exc.errno != errno.ECONNREFUSED:  # refused: an ICMP from an earlier datagram; keep going
                self.close()

    def on_reply(self) -> None:
        for _ in range(UDP_BATCH):
            try:
                data = self.sock.recv(UDP_BUFFER)
            except _AGAIN:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNREFUSED:
                    continue  # the endpoint's port is closed; the client's retry may find another
                self.close()
                return
            self.last_used = self.loop.time()
            with contextlib.suppress(OSError):
                self.listener.sendto(data, self.client)

    def _check_idle(self) -> None:
        idle = self.loop.time() - self.last_used
        if idle >= self.timeout:
            self.close()
        else:
            self._timer = self.loop.call_later(self.timeout - idle, self._check_idle)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.on_close(self)
