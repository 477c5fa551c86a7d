"""A server that lost its history, end to end: the live proxy, a kernel, an API server that lost its state.

The test API server comes back from a restart with the same objects under resourceVersions far
below the proxy's (etcd replaced or restored from an old backup), then an endpoint changes: the
proxy must notice (its resumed watch stays silent; after the proof wait the real server's "Too
large resource version"), relist, and program the change. /healthz stays healthy throughout
(upstream's rule: no update waits unsynced), and the body's `source` field says the source is in
sync again only once it has relisted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path

import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.netns import NetNS
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.api import ApiSource
from tests.live import test_live
from tests.live.test_live import _dnats_to, _get, _port, _service, _until, _with_proxy, mode, server  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.timeout(90)]


@pytest.fixture(autouse=True)
def short_proof_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy is wired as `kubeproxy run` wires it, with a resumed watch's wait for its proof
    short enough for a test (75 s otherwise)."""
    monkeypatch.setattr(test_live, "ApiSource", functools.partial(ApiSource, proof_wait=1.0))


def test_live_proxy_follows_an_api_server_that_lost_its_state(netns: NetNS, server: ApiServer, tmp_path: Path, mode: str) -> None:  # noqa: F811
    async def body(proxy: LiveProxy) -> None:
        for obj in _service("fresh", "10.96.7.7", ["10.244.1.77"]):
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.77"), "the endpoint's DNAT rule")
        # History the fresh store will not have, seen by the EndpointSlice reflector: its version
        # ends far above anything the server will have after the loss.
        server.apply(_service("other", "10.96.7.8", [])[0])
        for n in range(40):
            server.apply(_service("other", "10.96.7.8", [f"10.244.2.{n + 1}"])[1])
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.2.40"), "the last churned endpoint")
        healthz = f"http://127.0.0.1:{_port(proxy, 'healthz')}/healthz"
        assert (await asyncio.to_thread(_get, healthz))[0] == 200
        source = proxy.source
        assert isinstance(source, ApiSource)
        slices = next(r for r in source.reflectors if r.spec.kind == "EndpointSlice")
        followed = int(slices.resource_version or 0)

        started = time.monotonic()
        server.restart_with_fresh_store()
        assert server.resource_version + 10 < followed
        server.apply(_service("fresh", "10.96.7.7", ["10.244.1.78"])[1])
        # Sync by sync until the change is in: once the source saw the server go, it never
        # claims to be in sync again while the EndpointSlice reflector still follows the lost
        # history (it did before the fix: the watch reopened from the old version).
        samples: list[tuple[bool, int]] = []

        def programmed() -> bool:
            samples.append((source.connected, slices.lists))
            return _dnats_to(netns, mode, "10.244.1.78")

        await _until(proxy, programmed, "the change made after the state loss")
        # (The first sync may come before the reflector saw its connection cut.)
        noticed = next((n for n, (connected, _) in enumerate(samples) if not connected), None)
        assert noticed is not None, f"the source never said it was out of sync: {samples}"
        assert all(lists >= 2 for connected, lists in samples[noticed:] if connected), samples
        took = time.monotonic() - started
        assert not _dnats_to(netns, mode, "10.244.1.77")
        await _until(proxy, lambda: json.loads(_get(healthz)[1])["source"] == {"inSync": True}, "the source back in sync")
        assert (await asyncio.to_thread(_get, healthz))[0] == 200
        # The server waits 3 s (upstream's blockTimeout) before "Too large resource version".
        print(f"{mode}: change programmed {took:.1f}s after the API server lost its state")

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))
