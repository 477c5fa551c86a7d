"""Quarantine in a real kernel: a Service whose rules are refused is set aside, the rest stays in sync.

The live proxy runs in-process against the test API server, in both modes, programming a
namespace. Valid objects that are easy to render into rules the kernel refuses (`loadBalancerSourceRanges:
[0.0.0.0/0]`, overlapping ranges, 63-character names) must simply work; to prove the
quarantine itself, the kernel tools are wrapped so that they refuse any transaction (applied or
only checked) that mentions one endpoint address, as a kernel refusing one Service's rules would.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.kernel.exec import Runner
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.netns import NetNS
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live import test_live
from tests.live.test_live import _dnats_to, _get, _port, _rules, _service, _until, _with_proxy

mode, server = test_live.mode, test_live.server  # the same fixtures: both modes, the demo in the API server

pytestmark = pytest.mark.root
REFUSED = "10.244.66.66"  # an endpoint address whose rules the wrapped kernel tools refuse


def _refusing(netns: NetNS) -> Runner:
    def run(
        argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        if input and REFUSED in input and (argv[0] == "nft" or "-restore" in argv[0]):
            return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: Error: Could not process rule (injected, {REFUSED})")
        return netns.run(argv, input=input, check=check, timeout=timeout)

    return run


def _healthz(proxy: LiveProxy) -> tuple[int, dict[str, Any]]:
    status, body = _get(f"http://127.0.0.1:{_port(proxy, 'healthz')}/healthz")
    return status, json.loads(body)


def test_a_refused_service_is_quarantined_and_the_others_keep_syncing(
    netns: NetNS, server: ApiServer, tmp_path: Path, mode: str
) -> None:
    async def body(proxy: LiveProxy) -> None:
        # A Service the kernel takes, then a version of it that it refuses: the old rules stay.
        for obj in _service("moody", "10.96.6.1", ["10.244.1.61"]):
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.61"), "moody's first version")
        failures_before = proxy.failed_syncs
        refused = _service("moody", "10.96.6.1", ["10.244.1.61", REFUSED])
        bystander = _service("bystander", "10.96.6.2", ["10.244.1.62"])
        for obj in [*refused, *bystander]:
            server.apply(obj)
        await _until(proxy, lambda: ("default", "moody") in proxy.lanes[0].quarantine, "moody's quarantine")
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.62"), "the bystander, in the same sync")
        assert _dnats_to(netns, mode, "10.244.1.61")  # moody's last accepted rules are still there
        assert REFUSED not in _rules(netns, mode)
        assert proxy.failed_syncs == failures_before  # the sync went through without moody's change
        assert proxy.metrics._quarantined_services.labels(ip_family="IPv4")._value.get() == 1
        status, doc = await asyncio.to_thread(_healthz, proxy)
        assert status == 200 and doc["quarantinedServices"] == ["default/moody"]

        # A Service that never had accepted rules has none; others keep changing meanwhile. Its
        # slice reaches the proxy first: Services and slices come on separate watches, and a
        # Service seen alone for one sync gets accepted no-endpoint rules, which the quarantine
        # then rightly keeps (CI saw that order).
        newcomer_service, newcomer_slice = _service("newcomer", "10.96.6.3", [REFUSED])
        server.apply(newcomer_slice)
        await _until(proxy, lambda: ("default", "newcomer-1") in proxy.state.slices, "newcomer's slice in the proxy")
        for obj in [newcomer_service, *_service("late", "10.96.6.4", ["10.244.1.64"])]:
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.64"), "a change after the quarantine")
        await _until(proxy, lambda: ("default", "newcomer") in proxy.lanes[0].quarantine, "newcomer's quarantine")
        assert "10.96.6.3" not in _rules(netns, mode)
        assert _dnats_to(netns, mode, "10.244.1.62") and _dnats_to(netns, mode, "10.244.1.61")

        # Fixing one and deleting the other ends their quarantine.
        for obj in _service("moody", "10.96.6.1", ["10.244.1.65"]):
            server.apply(obj)
        server.delete("Service", "default", "newcomer")
        server.delete("EndpointSlice", "default", "newcomer-1")
        await _until(proxy, lambda: len(proxy.lanes[0].quarantine) == 0, "the end of the quarantine")
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.65"), "moody's fixed version")
        assert proxy.metrics._quarantined_services.labels(ip_family="IPv4")._value.get() == 0
        status, doc = await asyncio.to_thread(_healthz, proxy)
        assert status == 200 and "quarantinedServices" not in doc

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body, run_cmd=_refusing(netns)))


def _lb(name: str, cluster_ip: str, lb_ip: str, ranges: list[str], endpoints: list[str], **meta: str) -> list[dict[str, Any]]:
    svc, slice_ = _service(name, cluster_ip, endpoints)
    svc["metadata"].update(meta)
    slice_["metadata"].update(meta)
    svc["spec"].update(type="LoadBalancer", loadBalancerSourceRanges=ranges)
    svc["spec"]["ports"][0]["nodePort"] = 30000 + int(cluster_ip.rsplit(".", 1)[1])
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": lb_ip}]}}
    return [svc, slice_]


HOSTILE_BUT_VALID: dict[str, tuple[list[str], dict[str, Any]]] = {
    "everyone": (["0.0.0.0/0"], {}),
    "overlapping": (["10.0.0.0/8", "10.1.0.0/16"], {}),
    "contains-the-node": (["192.168.0.0/16", "203.0.113.0/24"], {}),
    "no-endpoints": (["0.0.0.0/0"], {}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BUT_VALID))
def test_valid_objects_that_used_to_take_the_node_down(
    netns: NetNS, server: ApiServer, tmp_path: Path, mode: str, case: str
) -> None:
    """Issue 11, items 1 and 2: each is programmed like any other Service, with no failed sync."""
    ranges, _ = HOSTILE_BUT_VALID[case]
    long_ns, long_name = "n" * 63, "s" * 63  # the longest names: the comment would exceed nft's 128 bytes

    async def body(proxy: LiveProxy) -> None:
        before = proxy.failed_syncs
        eps = [] if case == "no-endpoints" else ["10.244.1.71"]
        hostile = _lb(case, "10.96.7.1", "198.51.100.7", ranges, eps)
        long_named = _lb(long_name, "10.96.7.2", "198.51.100.8", ["10.0.0.0/8", "10.0.0.0/16"], [], namespace=long_ns)
        long_named[0]["spec"]["ports"][0]["name"] = "p" * 15
        long_named[1]["ports"][0]["name"] = "p" * 15
        for obj in [*hostile, *long_named, *_service("after", "10.96.7.3", ["10.244.1.73"])]:
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.73"), "the service after the hostile ones")
        # every table: without endpoints, iptables mode's rules for an LB are in filter
        rules = _rules(netns, mode) if mode == "nftables" else netns.run(["iptables-save"]).stdout
        assert "198.51.100.7" in rules and "198.51.100.8" in rules
        if eps:
            assert _dnats_to(netns, mode, "10.244.1.71")
        assert _dnats_to(netns, mode, "10.244.1.3", 53)  # the demo's services are all still there
        assert proxy.failed_syncs == before and len(proxy.lanes[0].quarantine) == 0

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))
