"""The live proxy on the package's fake node: its logic in milliseconds, without root.

The same behaviours run in a real kernel in tests/live/test_live.py and tests/live/test_quarantine_live.py;
here the loop, the quarantine and the retries are driven against `FakeNode` in both modes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.model.contract import SyncError, SyncReport
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import NodeOptions
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Body, Source, serve_with
from tests.live.test_live import _service

CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",), min_sync_period=0.0, sync_period=30.0,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip
REFUSED = "10.244.66.66"


def _refusing(node: FakeNode) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if REFUSED in (kw.get("input") or "") and (argv[0] == "nft" or "-restore" in argv[0]):
            return subprocess.CompletedProcess(argv, 1, "", "refused (injected)")
        return node.run(argv, **kw)

    return run


def _programmed(node: FakeNode, mode: str) -> str:
    if mode == "nftables":
        table = node.nft.table()
        return repr(table) if table else ""
    return node.iptables.run(["iptables-save"]).stdout


@pytest.fixture(params=["iptables", "nftables"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _run(mode: str, node: FakeNode, initial: list[dict[str, Any]], body: Body) -> None:
    serve_with(lambda: LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=_refusing(node)), initial, body)


def _timed_syncs(proxy: LiveProxy, kind: str) -> float | None:
    name = f"kubeproxy_sync_{kind}_proxy_rules_duration_seconds_count"
    return proxy.metrics.registry.get_sample_value(name, {"ip_family": "IPv4"})


async def _next_sync(proxy: LiveProxy) -> None:
    await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)


def test_a_refused_service_is_quarantined_with_its_last_rules(mode: str) -> None:
    node = FakeNode()

    async def body(proxy: LiveProxy, source: Source) -> None:
        assert "10.244.1.61" in _programmed(node, mode) and proxy.failed_syncs == 0
        source.publish(*_service("moody", "10.96.6.1", ["10.244.1.61", REFUSED]), *_service("fine", "10.96.6.2", ["10.244.1.62"]))
        await _next_sync(proxy)
        rules = _programmed(node, mode)
        assert "10.244.1.62" in rules and "10.244.1.61" in rules and REFUSED not in rules
        assert proxy.lanes[0].quarantine.names() == ["default/moody"] and proxy.failed_syncs == 0
        assert proxy.health.quarantined == ("default/moody",)
        source.publish(*_service("moody", "10.96.6.1", ["10.244.1.63"]))
        await _next_sync(proxy)
        assert len(proxy.lanes[0].quarantine) == 0 and "10.244.1.63" in _programmed(node, mode)

    _run(mode, node, _service("moody", "10.96.6.1", ["10.244.1.61"]), body)


def test_a_refusal_no_service_explains_fails_the_sync_and_retries_in_full(mode: str) -> None:
    node = FakeNode()
    refuse = {"left": 0}

    async def body(proxy: LiveProxy, source: Source) -> None:
        real = proxy.lanes[0].backend.sync
        calls: list[bool] = []

        def sync(view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> SyncReport:
            calls.append(changed_services is None)
            if refuse["left"]:
                refuse["left"] -= 1
                raise SyncError("the kernel is busy (injected)")
            return real(view, opts, changed_services)

        proxy.lanes[0].backend.sync = sync  # type: ignore[method-assign]
        refuse["left"] = 1
        source.publish(*_service("late", "10.96.8.8", ["10.244.1.88"]))
        while "10.244.1.88" not in _programmed(node, mode):
            await _next_sync(proxy)
        assert proxy.failed_syncs == 1 and len(proxy.lanes[0].quarantine) == 0
        assert calls[:2] == [False, True]  # the partial sync failed, the retry was full
        # Timed whether it failed or not, as upstream's deferred observation: the failed partial
        # sync, the first full sync and the full retry (the rules may show before it is reported).
        await proxy.wait_for_syncs(3)
        assert (_timed_syncs(proxy, "partial"), _timed_syncs(proxy, "full")) == (1, 2)

    _run(mode, node, _service("web", "10.96.0.10", ["10.244.1.10"]), body)


def test_each_sync_is_timed_as_full_or_partial(mode: str) -> None:
    """Upstream's iptables and nftables modes both export the full and the partial sync latency."""
    node = FakeNode()
    count = _timed_syncs

    async def body(proxy: LiveProxy, source: Source) -> None:
        assert (count(proxy, "full"), count(proxy, "partial")) == (1, None)
        source.publish(*_service("web", "10.96.7.1", ["10.244.1.71", "10.244.1.72"]))
        await _next_sync(proxy)
        assert proxy.lanes[0].last_report is not None and not proxy.lanes[0].last_report.full
        assert (count(proxy, "full"), count(proxy, "partial")) == (1, 1)
        page = proxy.metrics.exposition().decode()
        assert 'kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1.0' in page

    _run(mode, node, _service("web", "10.96.7.1", ["10.244.1.71"]), body)
