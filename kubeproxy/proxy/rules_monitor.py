"""Between quiet syncs, look every syncPeriod whether the rules are still in the kernel.

Modes whose runner syncs without a change only every FULL_SYNC_PERIOD (iptables and nftables,
as upstream's) would leave a firewall reload's damage in place for up to an hour. Upstream's
iptables mode runs a Monitor for this (pkg/util/iptables: the canary chain in mangle, every
syncPeriod, then a forced full sync); here every such mode's backend answers `rules_intact`
(contract.py), and the live loop asks for a full sync of a family whose answer is False.

A family is only asked once it has synced successfully: before that there is nothing to lose,
and a failed sync has its own retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kubeproxy.model.contract import Backend
from kubeproxy.model.options import Family
from kubeproxy.proxy.runner import Clock, LoopClock
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.proxy")


@dataclass(frozen=True)
class Watched:
    """One family's backend, as the monitor sees it."""

    family: Family
    backend: Backend
    synced: bool  # it has had a successful sync


@dataclass
class RulesMonitor:
    watched: Callable[[], Sequence[Watched]]
    lost: Callable[[Family], None]  # asks for that family's full sync
    interval: float
    clock: Clock = field(default_factory=LoopClock)
    rounds: int = field(default=0, init=False)  # rounds done
    _progress: asyncio.Condition | None = field(default=None, init=False)  # bound to the loop that first waits

    async def run(self) -> None:
        """Until cancelled: a round every `interval`, the first one `interval` after the start."""
        never = asyncio.Event()
        while True:
            await self.clock.wait(self.clock.now() + self.interval, never)
            await self.check()

    async def check(self) -> None:
        for w in self.watched():
            # A subprocess (iptables -S, nft -t list ruleset): off the loop, as syncs are.
            if w.synced and not await asyncio.to_thread(w.backend.rules_intact):
                log.info(kv("The rules were removed behind the proxy's back, doing a full sync", ipFamily=w.family))
                self.lost(w.family)
        self.rounds += 1
        if self._progress is not None:
            async with self._progress:
                self._progress.notify_all()

    async def wait_rounds(self, count: int) -> None:
        """Until `count` rounds are done: for tests."""
        if self._progress is None:
            self._progress = asyncio.Condition()
        async with self._progress:
            await self._progress.wait_for(lambda: self.rounds >= count)
