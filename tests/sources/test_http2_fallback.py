"""An https API server that does not offer HTTP/2 (ALPN) is spoken to over HTTP/1.1, by the same
client `connect()` builds; the HTTP/2 side is tested against upstream's kube-apiserver
(tests/upstream/test_api_http2_real_server.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kubeproxy.lab.control_plane import Pki, kubeconfig
from kubeproxy.sources.connection import connect, load_config

pytestmark = pytest.mark.timeout(60)


class Version(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"gitVersion": "v1.37.2", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http11_server(tmp_path: Path) -> Iterator[tuple[str, Pki]]:
    pki = Pki.make(tmp_path / "pki", ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.path("apiserver.crt"), pki.path("apiserver.key"))
    context.set_alpn_protocols(["http/1.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Version)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", pki
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_server_without_http2_is_spoken_to_over_http11(http11_server: tuple[str, Pki], tmp_path: Path) -> None:
    url, pki = http11_server
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(url, pki.data("ca.crt"), {"token": "t"}))

    async def main() -> list[tuple[int, str, str]]:
        client = connect(load_config(path), trust_env=False)
        try:
            answers = [await client.get(f"/version?n={n}") for n in range(2)]
            return [(a.status_code, a.http_version, a.json()["path"]) for a in answers]
        finally:
            await client.aclose()

    assert asyncio.run(main()) == [(200, "HTTP/1.1", "/version?n=0"), (200, "HTTP/1.1", "/version?n=1")]
