"""Fixtures for the source tests: a running test API server and a plain HTTP watch reader."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from kubeproxy.lab.apiserver import ApiServer


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class RawWatch:
    """A watch request read line by line with the stdlib, to test the server without our client."""

    def __init__(self, server: ApiServer, path: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.conn.request("GET", path)
        self.response = self.conn.getresponse()

    def next(self) -> dict[str, Any]:
        line = self.response.readline()
        if not line:
            raise EOFError("watch stream ended")
        event: dict[str, Any] = json.loads(line)
        return event

    def close(self) -> None:
        self.conn.close()


def request(server: ApiServer, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()
