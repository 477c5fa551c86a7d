"""How often the live loop syncs without a change, and the monitor that watches between syncs.

Upstream v1.37's iptables and nftables proxiers build their runner with syncPeriod as the retry
interval and FullSyncPeriod (an hour) as the longest time without a sync
(pkg/proxy/iptables/proxier.go, pkg/proxy/nftables/proxier.go); iptables mode watches its
canary chain every syncPeriod instead (pkg/util/iptables Monitor). IPVS mode keeps syncPeriod
as its maximum (pkg/proxy/ipvs/proxier.go). On the fake node and a fake clock.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.model.contract import FULL_SYNC_PERIOD
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.proxy.rules_monitor import RulesMonitor, Watched
from tests.live.served import Source, serving
from tests.live.test_live import _service
from tests.proxy.test_runner import FakeClock, settle

SYNC_PERIOD = 30.0
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",), sync_period=SYNC_PERIOD, healthz_bind_address="",
                  metrics_bind_address="")  # fmt: skip
# What a firewall reload does to each mode's rules, on the fake node.
WIPES = {
    "iptables": [["iptables", "-w", "-t", t, flag] for t in ("nat", "filter", "mangle") for flag in ("-F", "-X")],
    "nftables": [["nft", "delete", "table", "ip", "kube-proxy"]],
}


@pytest.mark.parametrize(("mode", "longest", "monitored"), [
    ("iptables", FULL_SYNC_PERIOD, True),
    ("nftables", FULL_SYNC_PERIOD, True),
    ("ipvs", SYNC_PERIOD, False),
    ("userspace", SYNC_PERIOD, False),
])  # fmt: skip
def test_how_long_each_mode_goes_without_a_sync(mode: str, longest: float, monitored: bool) -> None:
    proxy = LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=FakeNode())
    assert proxy.runner.max_interval == longest
    assert (proxy.rules_monitor is not None) is monitored
    if proxy.rules_monitor is not None:
        assert proxy.rules_monitor.interval == SYNC_PERIOD


def test_the_monitor_asks_synced_families_only_once_an_interval() -> None:
    async def main() -> None:
        clock = FakeClock()
        node = FakeNode()
        v4, v6 = IptablesProxier(run=node, family=Family.IPV4), IptablesProxier(run=node, family=Family.IPV6)
        v4.ensure_canary()  # the IPv6 family has none: never synced, nothing to lose
        watched = [Watched(Family.IPV4, v4, synced=True), Watched(Family.IPV6, v6, synced=False)]
        lost: list[Family] = []
        monitor = RulesMonitor(lambda: watched, lost.append, SYNC_PERIOD, clock)
        task = asyncio.create_task(monitor.run())
        await settle()
        await clock.advance(SYNC_PERIOD - 0.5)
        assert monitor.rounds == 0
        await clock.advance(0.5)
        await monitor.wait_rounds(1)
        assert lost == []
        node.run(["iptables", "-w", "-t", "mangle", "-X", "KUBE-PROXY-CANARY"])
        await clock.advance(SYNC_PERIOD)
        await monitor.wait_rounds(2)
        assert lost == [Family.IPV4]
        task.cancel()

    asyncio.run(main())


@pytest.mark.parametrize("mode", sorted(WIPES))
def test_rules_wiped_between_quiet_syncs_come_back_at_the_next_round(mode: str) -> None:
    async def main() -> None:
        clock = FakeClock()
        node = FakeNode()
        proxy = LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=node, clock=clock, source_check_interval=3600.0)
        assert proxy.rules_monitor is not None
        source = Source(proxy, _service("web", "10.96.0.10", ["10.244.1.5"]))
        async with serving(proxy, source):
            backend = proxy.lanes[0].backend
            await clock.advance(SYNC_PERIOD)
            await asyncio.wait_for(proxy.rules_monitor.wait_rounds(1), 10)
            assert proxy.syncs == 1  # nothing changed, nothing lost: no sync
            for argv in WIPES[mode]:
                node.run(argv)
            assert not backend.rules_intact()
            await clock.advance(SYNC_PERIOD)
            await asyncio.wait_for(proxy.wait_for_syncs(2), 10)
            assert proxy.last_report is not None and proxy.last_report.full
            assert backend.rules_intact() and proxy.syncs == 2

    asyncio.run(main())
