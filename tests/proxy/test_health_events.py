"""A health-check node port that cannot be opened is upstream's Warning Event about the Service
(pkg/proxy/healthcheck/service_health.go: reason FailedToStartServiceHealthcheck, action Listen,
the note "node N failed to start healthcheck "ns/name" on port P: err"), written by kube-proxy's
recorder; a second failure of the same Service is the same Event's series."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.proxy import kube_proxy
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers
from kubeproxy.sources.event_recorder import EventRecorder


@dataclass
class _Answer:
    status_code: int = 201
    text: str = ""


@dataclass
class _Client:
    posted: list[tuple[str, Any]] = field(default_factory=list)

    async def post(self, url: str, *, json: Any) -> _Answer:
        self.posted.append((url, json))
        return _Answer()

    async def patch(self, url: str, *, content: bytes, headers: dict[str, str]) -> _Answer:
        self.posted.append((url, content))
        return _Answer(200)


def test_a_port_that_cannot_be_opened_is_an_event_about_the_service() -> None:
    client = _Client()
    recorder = EventRecorder(client, instance="kube-proxy-vm")
    servers = ServiceHealthServers(ProxyHealth(10.0), ("127.0.0.1",), node_name="node-1",
                                   on_failure=kube_proxy._health_check_events(recorder))  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def main() -> None:
            try:
                await servers.sync_services({("default", "web"): port})
                await servers.sync_services({("default", "web"): port})  # retried at the next sync, fails again
                writer = asyncio.create_task(recorder.run())
                await recorder.flush()
                writer.cancel()
            finally:
                await servers.close()

        asyncio.run(main())
    (url, body), (patch_url, _) = client.posted
    assert url == "/apis/events.k8s.io/v1/namespaces/default/events" and patch_url == f"{url}/{body['metadata']['name']}"
    assert body["regarding"] == {"kind": "Service", "name": "web", "namespace": "default", "apiVersion": "v1"}
    assert (body["type"], body["reason"], body["action"]) == ("Warning", "FailedToStartServiceHealthcheck", "Listen")
    assert body["note"].startswith(f'node node-1 failed to start healthcheck "default/web" on port {port}: ')
    assert "Address already in use" in body["note"]
