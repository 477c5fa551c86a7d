"""The per-query UDP socket both senders use: non-blocking, and stamped by the kernel on receive."""

from __future__ import annotations

import _socket
import errno
import socket
import struct

SOCK_TYPE = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
SOL_SOCKET = socket.SOL_SOCKET
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # each datagram's arrival time, CLOCK_REALTIME
STAMP = struct.Struct("@qq")  # struct timespec
ANCILLARY = socket.CMSG_SPACE(STAMP.size)


def query_socket(family: int) -> _socket.socket:
    """A fresh socket whose datagrams carry their arrival time (read with `recv_stamped`).

    The C type, not socket.socket: its Python __init__ and close() cost microseconds per query.
    """
    sock = _socket.socket(family, SOCK_TYPE)
    sock.setsockopt(SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sock


def recv_stamped(sock: _socket.socket) -> tuple[bytes, float | None]:
    """One datagram and the wall-clock time (time.time()) the kernel received it, if it said."""
    data, ancillary, _flags, _peer = sock.recvmsg(4096, ANCILLARY)
    if ancillary:
        secs, nanos = STAMP.unpack(ancillary[0][2])
        return data, secs + nanos * 1e-9
    return data, None


def errno_name(exc: OSError) -> str:
    """`EAGAIN`, `ECONNREFUSED`, ... for counting failures by kind."""
    if exc.errno and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno]
    return str(exc)
