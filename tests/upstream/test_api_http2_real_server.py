"""Against upstream's kube-apiserver (v1.37.2): an API source's lists and its four watches share one
HTTP/2 connection, as client-go's; a change reaches the watch while the other watches are idle
(httpcore2's HTTP/2 held such an event until the server next wrote to the other streams, the
next bookmarks about a minute later); a GOAWAY (the server's answer to a request it could not
authenticate) lets the open watches finish and sends the next request to a new connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from kubeproxy.lab.control_plane import ControlPlane
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.upstream.conftest import require_upstream_binaries

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

# Far below the server's bookmark period (about a minute): an event waiting for other streams'
# bookmarks misses it; one read when it arrives makes it with room to spare on a loaded machine.
PROMPT = 20.0


def our_connections(server: str) -> int:
    """Established TCP connections of this process to the API server's port."""
    port = server.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sum(1 for line in out.splitlines() if f"pid={os.getpid()}," in line)


class Seen:
    """Services by name as the source delivers them, awaitable."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.changed = asyncio.Condition()
        self.versions: set[bytes] = set()

    def on_event(self, event: WatchEvent) -> None:
        if event.kind == "Service" and event.type != "DELETED":
            self.names.add(event.name)
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, name: str, timeout: float) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: name in self.names)

    async def on_response(self, response: httpx2.Response) -> None:
        self.versions.add(response.extensions.get("http_version", b"?"))


@contextlib.asynccontextmanager
async def running(source: ApiSource) -> AsyncIterator[None]:
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.wait_synced(), 60)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await source.client.aclose()


def create_service(cp: ControlPlane, name: str) -> None:
    cp.run_kubectl("create", "service", "clusterip", name, "--tcp=80:80")


def test_one_http2_connection_and_prompt_events(tmp_path: Path) -> None:
    with ControlPlane.start(require_upstream_binaries(), tmp_path / "cp") as cp:
        seen = Seen()

        async def main() -> None:
            client = connect(load_config(cp.admin_kubeconfig), trust_env=False)
            client.event_hooks["response"].append(seen.on_response)
            async with running(ApiSource(client, "node-a", seen.on_event)):
                assert our_connections(cp.server) == 1
                # One after another: each must arrive while the other watches stay idle.
                for i in range(5):
                    await asyncio.to_thread(create_service, cp, f"web-{i}")
                    await seen.wait_for(f"web-{i}", PROMPT)
                # One stream's read timeout ends that stream only, not the connection under it.
                with pytest.raises(httpx2.ReadTimeout):
                    quiet = {"watch": "true", "timeoutSeconds": "60"}
                    async with client.stream("GET", "/api/v1/namespaces/empty/configmaps", params=quiet,
                                             timeout=httpx2.Timeout(10, read=0.5)) as resp:  # fmt: skip
                        async for _ in resp.aiter_bytes():
                            pass
                await asyncio.to_thread(create_service, cp, "after-timeout")
                await seen.wait_for("after-timeout", PROMPT)
                assert our_connections(cp.server) == 1

        asyncio.run(main())
    assert seen.versions == {b"HTTP/2"}


def test_goaway_lets_open_watches_finish_and_moves_on(tmp_path: Path) -> None:
    """kube-apiserver answers a request it cannot authenticate over HTTP/2 with a GOAWAY
    (apiserver v0.37.2 pkg/endpoints/filters/authentication.go, `Unauthorized`, feature
    UnauthenticatedHTTP2DOSMitigation, on by default): the watches already open go on, and the
    next request opens a second connection."""
    with ControlPlane.start(require_upstream_binaries(), tmp_path / "cp") as cp:
        cp.run_kubectl("create", "clusterrolebinding", "proxier", "--clusterrole=system:node-proxier",
                       "--serviceaccount=default:default")  # fmt: skip
        kubeconfig = cp.token_kubeconfig(tmp_path / "token.kubeconfig", "default", "default")
        seen = Seen()

        async def main() -> None:
            client = connect(load_config(kubeconfig), trust_env=False)
            async with running(ApiSource(client, "node-a", seen.on_event)):
                assert our_connections(cp.server) == 1
                denied = await client.get("/api/v1/namespaces/default/services", auth=bad_token)
                assert denied.status_code == 401, denied.text[:200]
                await asyncio.to_thread(create_service, cp, "after-goaway")
                await seen.wait_for("after-goaway", PROMPT)
                assert (await client.get("/version")).status_code == 200
                assert our_connections(cp.server) == 2

        asyncio.run(main())


def bad_token(request: httpx2.Request) -> httpx2.Request:
    request.headers["Authorization"] = "Bearer not-a-token"
    return request
