"""The live proxy in-process against the test API server, programming a namespace's kernel.

Faults as the issue lists them, in both proxy modes: the API server going away and coming back,
a failed iptables-restore / nft transaction, a malformed object, SIGTERM, and the rules wiped
behind the proxy's back (a firewall reload flushing tables).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.kernel.exec import Runner
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.netns import NetNS
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from tests.live.served import serving
from tests.paths import DEMO
from tests.proxy.servers import port_of

pytestmark = pytest.mark.root
POLL = 0.05  # seconds between looks at a condition no sync changes
CFG = ProxyConfig(
    cluster_cidr=("10.244.0.0/16",),
    min_sync_period=0.0,
    sync_period=1.0,  # health timeout 2 s: outages show quickly
    healthz_bind_address="127.0.0.1:0",
    metrics_bind_address="127.0.0.1:0",
)


def _service(name: str, ip: str, endpoints: list[str]) -> list[dict[str, Any]]:
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
    return port_of(proxy.servers[name])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _until(proxy: LiveProxy, cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait until `cond` holds, looking again after each sync (the kernel's rules change with
    one) or every POLL seconds (health, logs and metrics change without one)."""

    async def loop() -> None:
        while True:
            seen = proxy.syncs + proxy.failed_syncs  # before the look: a sync during it counts
            if await asyncio.to_thread(cond):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proxy.wait_for_syncs(seen + 1), POLL)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture(params=["iptables", "nftables"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _rules(netns: NetNS, mode: str) -> str:
    """The NAT rules the proxy in `mode` programs: iptables-save's nat table, or our nft table."""
    if mode == "nftables":
        return netns.run(["nft", "list", "table", "ip", "kube-proxy"], check=False).stdout
    text = netns.run(["iptables-save", "-t", "nat"]).stdout
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def _dnats_to(netns: NetNS, mode: str, ip: str, port: int = 8080) -> bool:
    """Whether the rules DNAT some service to `ip:port` (nftables keeps it as a map element `ip . port`)."""
    return (f"{ip} . {port}" if mode == "nftables" else f"{ip}:{port}") in _rules(netns, mode)


async def _with_proxy(
    netns: NetNS, server: ApiServer, tmp_path: Path, mode: str, body: Callable[[LiveProxy], Awaitable[None]],
    run_cmd: Runner | None = None,
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    proxy = LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=run_cmd or netns)
    client = connect(load_config(kubeconfig))
    fast = lambda: Backoff(initial=0.05, cap=0.2)  # noqa: E731
    # Wired as `kubeproxy run` wires it (proxy/kube_proxy.py): lists as one batch, typed where they fit.
    source = ApiSource(client, "node-1", proxy.on_event, backoff_factory=fast, batch_sink=proxy.on_events, typed_lists=True)
    try:
        async with serving(proxy, source, 30):
            await body(proxy)
    finally:
        await client.aclose()


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as api:
        for raw in load_manifests([DEMO]):
            api.apply(raw.obj)
        yield api


def test_changes_reach_the_kernel_and_an_outage_keeps_the_rules(
    netns: NetNS, server: ApiServer, tmp_path: Path, mode: str
) -> None:
    async def body(proxy: LiveProxy) -> None:
        assert _dnats_to(netns, mode, "10.244.1.3", 53)  # the demo's bind pod
        for obj in _service("fresh", "10.96.7.7", ["10.244.1.77"]):
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.77"), "the new endpoint's DNAT rule")

        healthz = f"http://127.0.0.1:{_port(proxy, 'healthz')}/healthz"
        assert (await asyncio.to_thread(_get, healthz))[0] == 200
        before = _rules(netns, mode)
        server.stop()
        # Health is upstream's (an outage queues no update): the body shows the lost source instead.
        await _until(proxy, lambda: json.loads(_get(healthz)[1])["source"]["inSync"] is False, "the body to show the outage")
        done = proxy.syncs + proxy.failed_syncs
        proxy.runner.run()  # a sync from what the proxy holds, while the source is away
        await proxy.wait_for_syncs(done + 1)
        status, text = await asyncio.to_thread(_get, healthz)
        assert status == 200 and json.loads(text)["healthy"] is True, text
        assert _rules(netns, mode) == before  # nothing removed while the API server is away

        server.start()
        server.apply(_service("fresh", "10.96.7.7", ["10.244.1.78"])[1])
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.78"), "the change made during the outage")
        await _until(proxy, lambda: json.loads(_get(healthz)[1])["source"] == {"inSync": True}, "the source back in sync")

        status, metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{_port(proxy, 'metrics')}/metrics")
        assert status == 200
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in metrics
        changes = [line for line in metrics.splitlines() if line.startswith("kubeproxy_sync_proxy_rules_endpoint_changes_total")]
        assert changes and float(changes[0].split()[-1]) >= 3

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))


def _record_syncs(proxy: LiveProxy) -> list[tuple[bool, bool]]:
    """From now on, (was full, failed) for each backend sync, in order: more syncs may come while
    a test waits, so `last_report` may already be a later one."""
    calls: list[tuple[bool, bool]] = []
    real_sync = proxy.lanes[0].backend.sync

    def recording(view, opts, changed):  # type: ignore[no-untyped-def]
        try:
            report = real_sync(view, opts, changed)
        except Exception:
            calls.append((changed is None, True))
            raise
        calls.append((changed is None or report.full, False))
        return report

    proxy.lanes[0].backend.sync = recording  # type: ignore[method-assign]
    return calls


def _is_ipv4_apply(argv: Sequence[str], stdin: str) -> bool:
    """An IPv4 rules apply: the proxy runs an IPv6 lane too (as upstream, whatever the node's
    addresses), and a failure injected there would be that lane's."""
    if argv[:3] == ["nft", "-f", "-"]:
        return " ip kube-proxy" in stdin
    return argv[0].startswith("iptables") and argv[0].endswith("-restore")


def test_failed_apply_is_counted_and_retried_as_a_full_sync(netns: NetNS, server: ApiServer, tmp_path: Path, mode: str) -> None:
    failures = {"left": 0}
    recorded = {"on": False}

    def flaky(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        # only an apply of a recorded sync fails: a sync already running when the recorder went
        # in must not take the injected failure unseen
        if failures["left"] and recorded["on"] and _is_ipv4_apply(argv, kwargs.get("input") or ""):
            failures["left"] -= 1
            return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: line 7 failed (injected)")
        return netns.run(argv, **kwargs)

    async def body(proxy: LiveProxy) -> None:
        calls = _record_syncs(proxy)
        recording = proxy.lanes[0].backend.sync

        def marked(view, opts, changed):  # type: ignore[no-untyped-def]
            recorded["on"] = True
            try:
                return recording(view, opts, changed)
            finally:
                recorded["on"] = False

        proxy.lanes[0].backend.sync = marked  # type: ignore[method-assign]
        failures["left"] = 1
        before = proxy.failed_syncs
        for obj in _service("late", "10.96.8.8", ["10.244.1.88"]):
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.88"), "the change after the failed apply")
        assert failures["left"] == 0 and proxy.failed_syncs == before + 1
        failed_at = next(i for i, (_, failed) in enumerate(calls) if failed)
        assert calls[failed_at + 1] == (True, False)  # the retry rewrote everything
        vec = proxy.metrics._nftables_sync_failures_total if mode == "nftables" else proxy.metrics._restore_failures_total
        assert vec.labels(ip_family="IPv4")._value.get() == 1

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body, run_cmd=flaky))


def test_malformed_object_is_skipped_by_name_and_others_still_sync(
    netns: NetNS, server: ApiServer, tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)

    async def body(proxy: LiveProxy) -> None:
        bad, good = _service("broken", "10.96.300.1", ["10.244.1.90"]), _service("fine", "10.96.9.9", ["10.244.1.91"])
        for obj in [*bad, *good]:
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.91"), "the valid service")
        assert "default/broken" in caplog.text and "10.96.300.1" in caplog.text
        assert "10.244.1.90" not in _rules(netns, mode)

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))


# What a firewall reload does to the proxy's rules, per mode.
_WIPES = {
    "iptables": [["iptables", "-t", t, flag] for t in ("nat", "filter", "mangle") for flag in ("-F", "-X")],
    "nftables": [["nft", "delete", "table", "ip", "kube-proxy"]],
}


def test_rules_wiped_behind_its_back_are_restored(netns: NetNS, server: ApiServer, tmp_path: Path, mode: str) -> None:
    async def body(proxy: LiveProxy) -> None:
        calls = _record_syncs(proxy)
        # Syncs run in a worker thread: one writing between the wipe's `-F` and `-X` would make
        # a chain busy. The wipe and the check that it took hold the kernel to themselves.
        writing = threading.Lock()
        real_sync = proxy.lanes[0].backend.sync

        def exclusive(view, opts, changed):  # type: ignore[no-untyped-def]
            with writing:
                return real_sync(view, opts, changed)

        proxy.lanes[0].backend.sync = exclusive  # type: ignore[method-assign]
        with writing:
            before = _rules(netns, mode)
            for argv in _WIPES[mode]:
                netns.run(argv)
            assert not _dnats_to(netns, mode, "10.244.1.3", 53)
        # Nothing changed in the cluster: only the monitor (canary chain / table, every syncPeriod)
        # can notice.
        await _until(proxy, lambda: _rules(netns, mode) == before, "the wiped rules to be put back as they were")
        assert (True, False) in calls  # by a full sync

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))


def run_demo_until_sigterm(ns: NetNS, workdir: Path, mode: str) -> tuple[int, str]:
    """`kubeproxy run --manifests` of the demo in `ns` until its first sync, then SIGTERM: its exit
    status and what it logged after the sync."""
    manifests = workdir / f"manifests-{mode}"
    manifests.mkdir()
    (manifests / "demo.yaml").write_text(DEMO.read_text())
    argv = [str(Path(sys.executable).parent / "kubeproxy"), "-v", "2", "run", "--proxy-mode", mode,
            "--manifests", str(manifests), "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16",
            "--healthz-bind-address", "", "--metrics-bind-address", ""]  # fmt: skip
    proc = ns.popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    for line in proc.stderr:
        if "SyncProxyRules complete" in line:
            break
    else:
        raise AssertionError(f"kubeproxy run --proxy-mode {mode} exited with {proc.wait()} before its first sync")
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    return proc.wait(timeout=20), rest


def test_sigterm_exits_cleanly_and_leaves_the_rules(netns: NetNS, tmp_path: Path, mode: str) -> None:
    status, log = run_demo_until_sigterm(netns, tmp_path, mode)
    assert status == 0, log
    assert _dnats_to(netns, mode, "10.244.1.3", 53)


def test_node_being_deleted_fails_healthz_but_not_livez(netns: NetNS, server: ApiServer, tmp_path: Path, mode: str) -> None:
    async def body(proxy: LiveProxy) -> None:
        base = f"http://127.0.0.1:{_port(proxy, 'healthz')}"
        node = server.get("Node", "", "node-1")
        node["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
        server.apply(node)
        await _until(proxy, lambda: _get(f"{base}/healthz")[0] == 503, "healthz to fail for a node on its way out")
        _, text = await asyncio.to_thread(_get, f"{base}/healthz")
        assert json.loads(text)["nodeEligible"] is False
        assert (await asyncio.to_thread(_get, f"{base}/livez"))[0] == 200

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))
