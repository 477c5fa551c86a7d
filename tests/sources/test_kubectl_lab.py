"""The real kubectl against the test API server, and a reflector watching what kubectl does.

This keeps the test server honest: if kubectl can apply, read and delete through it, the
protocol it speaks is the real one, at least as far as our resources go.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import Reflector, endpoint_slices, services
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (CI installs it)"),
]

MANIFEST = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: ["10.1.0.5"]
  conditions: {ready: true}
"""


class Kubectl:
    def __init__(self, server: ApiServer, tmp_path: Path) -> None:
        self.kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        self.cache = tmp_path / "kube-cache"
        # An empty HOME: nothing from the developer's own ~/.kube leaks into the test.
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def argv(self, *args: str) -> list[str]:
        return ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache), *args]

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env, timeout=30)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "web.yaml"
    path.write_text(MANIFEST)
    return path


def test_kubectl_apply_get_delete(apiserver: ApiServer, tmp_path: Path, manifest: Path) -> None:
    kubectl = Kubectl(apiserver, tmp_path)
    out = kubectl("apply", "-f", str(manifest)).stdout
    assert "service/web created" in out
    assert "endpointslice.discovery.k8s.io/web-1 created" in out

    listed = kubectl.json("get", "svc")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["web"]
    assert listed["items"][0]["spec"]["ports"][0]["targetPort"] == 8080
    slice_ = kubectl.json("get", "endpointslices", "web-1")
    assert slice_["endpoints"][0]["addresses"] == ["10.1.0.5"]

    # A second apply is a client-side strategic merge patch: the port is replaced, not appended.
    manifest.write_text(MANIFEST.replace("port: 80,", "port: 81,"))
    assert "service/web configured" in kubectl("apply", "-f", str(manifest)).stdout
    assert [p["port"] for p in apiserver.get("Service", "default", "web")["spec"]["ports"]] == [81]

    out = kubectl("delete", "-f", str(manifest)).stdout
    assert 'service "web" deleted' in out
    assert kubectl.json("get", "svc,endpointslices", "-A")["items"] == []
    missing = kubectl("get", "svc", "web", check=False)
    assert missing.returncode == 1 and "NotFound" in missing.stderr


def test_kubectl_create_conflicts_and_server_side_apply(apiserver: ApiServer, tmp_path: Path, manifest: Path) -> None:
    kubectl = Kubectl(apiserver, tmp_path)
    kubectl("create", "-f", str(manifest))
    again = kubectl("create", "-f", str(manifest), check=False)
    assert again.returncode == 1 and 'services "web" already exists' in again.stderr
    manifest.write_text(MANIFEST.replace("10.1.0.5", "10.1.0.6"))
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", str(manifest)).stdout
    assert apiserver.get("EndpointSlice", "default", "web-1")["endpoints"][0]["addresses"] == ["10.1.0.6"]


def test_reflectors_see_what_kubectl_does(apiserver: ApiServer, tmp_path: Path, manifest: Path) -> None:
    kubectl = Kubectl(apiserver, tmp_path)

    async def run_kubectl(*args: str) -> None:
        proc = await asyncio.to_thread(kubectl, *args)
        assert proc.returncode == 0

    async def main() -> None:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        client = connect(load_config(kubectl.kubeconfig), trust_env=False)
        reflectors = [Reflector(client, spec, queue.put_nowait) for spec in (services(), endpoint_slices())]
        tasks = [asyncio.create_task(r.run()) for r in reflectors]
        try:
            for r in reflectors:
                await r.wait_synced()
            await asyncio.to_thread(apiserver.wait_for_watches, 2)
            await run_kubectl("apply", "-f", str(manifest))
            added = {(e.type, e.kind, e.name) for e in [await queue.get() for _ in range(2)]}
            assert added == {("ADDED", "Service", "web"), ("ADDED", "EndpointSlice", "web-1")}
            await run_kubectl("delete", "-f", str(manifest))
            deleted = {(e.type, e.kind, e.name) for e in [await queue.get() for _ in range(2)]}
            assert deleted == {("DELETED", "Service", "web"), ("DELETED", "EndpointSlice", "web-1")}
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 45))
