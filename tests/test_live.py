"""The live proxy in-process against the test API server, programming a namespace's kernel.

Faults as the issue lists them: the API server going away and coming back, a failed
iptables-restore, a malformed object, SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.live import LiveProxy
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config

pytestmark = pytest.mark.root
DEMO = Path(__file__).parents[1] / "kubeproxy" / "examples" / "demo.yaml"
CFG = ProxyConfig(
    cluster_cidr=("10.244.0.0/16",),
    min_sync_period=0.0,
    sync_period=1.0,  # health timeout 2 s: outages show quickly
    healthz_bind_address="127.0.0.1:0",
    metrics_bind_address="127.0.0.1:0",
)


def _service(name: str, ip: str, endpoints: list[str]) -> list[dict]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-1", "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip_], "nodeName": "node-1"} for ip_ in endpoints],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        },
    ]


def _port(proxy: LiveProxy, name: str) -> int:
    return proxy.servers[name].sockets[0].getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _until(proxy: LiveProxy, cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait sync by sync until `cond` holds: every sync is a chance for the kernel to change."""

    async def loop() -> None:
        while not await asyncio.to_thread(cond):
            await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _nat(netns) -> str:
    text = netns.run(["iptables-save", "-t", "nat"]).stdout
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


async def _with_proxy(
    netns, server: ApiServer, tmp_path: Path, body: Callable[[LiveProxy], Awaitable[None]], run_cmd=None
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    proxy = LiveProxy(CFG, "node-1", run_cmd=run_cmd or netns.run)
    client = connect(load_config(kubeconfig))
    fast = lambda: Backoff(initial=0.05, cap=0.2)  # noqa: E731
    source = ApiSource(client, "node-1", proxy.on_event, backoff_factory=fast)
    task = asyncio.create_task(proxy.serve(source))
    try:
        await asyncio.wait_for(proxy.wait_for_syncs(1), 30)
        await body(proxy)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()


@pytest.fixture
def server():
    with ApiServer() as api:
        for raw in load_manifests([DEMO]):
            api.apply(raw.obj)
        yield api


def test_changes_reach_the_kernel_and_an_outage_keeps_the_rules(netns, server, tmp_path) -> None:
    async def body(proxy: LiveProxy) -> None:
        assert '"dns/bind:dns-udp cluster IP"' in _nat(netns)
        for obj in _service("fresh", "10.96.7.7", ["10.244.1.77"]):
            server.apply(obj)
        await _until(proxy, lambda: "10.244.1.77:8080" in _nat(netns), "the new endpoint's DNAT rule")

        healthz = f"http://127.0.0.1:{_port(proxy, 'healthz')}/healthz"
        assert (await asyncio.to_thread(_get, healthz))[0] == 200
        before = _nat(netns)
        server.stop()
        await _until(proxy, lambda: _get(healthz)[0] == 503, "healthz to report the stale rules")
        status, text = await asyncio.to_thread(_get, healthz)
        assert json.loads(text)["lastUpdated"]
        assert _nat(netns) == before  # nothing removed while the API server is away

        server.start()
        server.apply(_service("fresh", "10.96.7.7", ["10.244.1.78"])[1])
        await _until(proxy, lambda: "10.244.1.78:8080" in _nat(netns), "the change made during the outage")
        await _until(proxy, lambda: _get(healthz)[0] == 200, "healthz to recover")

        status, metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{_port(proxy, 'metrics')}/metrics")
        assert status == 200
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in metrics
        changes = [line for line in metrics.splitlines() if line.startswith("kubeproxy_sync_proxy_rules_endpoint_changes_total")]
        assert changes and float(changes[0].split()[-1]) >= 3

    asyncio.run(_with_proxy(netns, server, tmp_path, body))


def test_failed_restore_is_counted_and_retried_as_a_full_sync(netns, server, tmp_path) -> None:
    failures = {"left": 0}

    def flaky(argv, **kwargs):
        if failures["left"] and argv[0].endswith("-restore"):
            failures["left"] -= 1
            return subprocess.CompletedProcess(argv, 1, "", "iptables-restore: line 7 failed (injected)")
        return netns.run(argv, **kwargs)

    async def body(proxy: LiveProxy) -> None:
        failures["left"] = 1
        before = proxy.failed_syncs
        for obj in _service("late", "10.96.8.8", ["10.244.1.88"]):
            server.apply(obj)
        await _until(proxy, lambda: "10.244.1.88:8080" in _nat(netns), "the change after the failed restore")
        assert proxy.failed_syncs == before + 1
        assert proxy.last_report is not None and proxy.last_report.full
        assert proxy.metrics.restore_failures_total._value.get() == 1

    asyncio.run(_with_proxy(netns, server, tmp_path, body, run_cmd=flaky))


def test_malformed_object_is_skipped_by_name_and_others_still_sync(netns, server, tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING)

    async def body(proxy: LiveProxy) -> None:
        bad, good = _service("broken", "10.96.300.1", ["10.244.1.90"]), _service("fine", "10.96.9.9", ["10.244.1.91"])
        for obj in [*bad, *good]:
            server.apply(obj)
        await _until(proxy, lambda: "10.244.1.91:8080" in _nat(netns), "the valid service")
        assert "default/broken" in caplog.text and "10.96.300.1" in caplog.text
        assert "10.244.1.90" not in _nat(netns)

    asyncio.run(_with_proxy(netns, server, tmp_path, body))


def test_sigterm_exits_cleanly_and_leaves_the_rules(netns, tmp_path) -> None:
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "demo.yaml").write_text(DEMO.read_text())
    argv = [
        str(Path(sys.executable).parent / "kubeproxy"),
        "-v",
        "2",
        "run",
        "--manifests",
        str(manifests),
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
    ]
    proc = netns.popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    for line in proc.stderr:
        if "SyncProxyRules complete" in line:
            break
    else:
        raise AssertionError(f"the proxy exited with {proc.wait()} before its first sync")
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=20) == 0, rest
    assert "KUBE-SVC-" in _nat(netns)


def test_node_being_deleted_fails_healthz_but_not_livez(netns, server, tmp_path) -> None:
    async def body(proxy: LiveProxy) -> None:
        base = f"http://127.0.0.1:{_port(proxy, 'healthz')}"
        node = server.get("Node", "", "node-1")
        node["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
        server.apply(node)
        await _until(proxy, lambda: _get(f"{base}/healthz")[0] == 503, "healthz to fail for a node on its way out")
        _, text = await asyncio.to_thread(_get, f"{base}/healthz")
        assert json.loads(text)["nodeEligible"] is False
        assert (await asyncio.to_thread(_get, f"{base}/livez"))[0] == 200

    asyncio.run(_with_proxy(netns, server, tmp_path, body))
