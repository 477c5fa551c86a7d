"""The port a test's HTTP server listens on, for tests that bind port 0."""

from __future__ import annotations

import asyncio

from kubeproxy.proxy.http import HttpServer


def port_of(server: asyncio.AbstractServer) -> int:
    """The first listening socket's port; the live proxy keeps its servers as `AbstractServer`s."""
    assert isinstance(server, HttpServer), server
    port: int = server.sockets[0].getsockname()[1]
    return port
