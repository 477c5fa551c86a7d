"""When to sync: upstream's BoundedFrequencyRunner, on asyncio.

- `run()` asks for a sync. Requests that arrive before the sync starts coalesce into one; a
  request during a sync causes one more sync afterwards.
- Syncs are at least `min_interval` apart (minSyncPeriod), with a burst allowance: a token
  bucket of `burst` tokens refilled at one per `min_interval`, as upstream (kube-proxy uses 2).
- A sync happens at least every `max_interval` even without requests (the periodic resync:
  syncPeriod in ipvs mode, an hour in iptables and nftables modes).
- `retry_after(delay)` (or the sync raising) brings the next sync forward to `delay` from now,
  sooner than the periodic one, still subject to `min_interval`.

`Schedule` is the pure decision ("when is the next sync due?") over times the caller passes in;
`BoundedFrequencyRunner` drives it with an injected `Clock`, so tests need no sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass
class Schedule:
    """The runner's state machine. Times are seconds on one monotonic clock."""

    min_interval: float
    max_interval: float
    burst: int = 2
    now: float = 0.0  # creation time: the first periodic sync is due max_interval after it
    pending: bool = False
    retry_at: float = math.inf
    last_start: float = field(init=False)
    tokens: float = field(init=False)
    tokens_at: float = field(init=False)

    def __post_init__(self) -> None:
        if self.min_interval < 0 or self.max_interval <= 0 or self.burst < 1:
            raise ValueError("need min_interval >= 0, max_interval > 0 and burst >= 1")
        if self.min_interval > self.max_interval:
            raise ValueError(f"min_interval {self.min_interval}s exceeds max_interval {self.max_interval}s")
        self.last_start = self.now
        self.tokens, self.tokens_at = float(self.burst), self.now

    def request(self) -> None:
        self.pending = True

    def retry_after(self, now: float, delay: float) -> None:
        self.retry_at = min(self.retry_at, now + delay)

    def _tokens(self, now: float) -> float:
        if self.min_interval == 0:
            return float(self.burst)
        return min(float(self.burst), self.tokens + (now - self.tokens_at) / self.min_interval)

    def _token_time(self, now: float) -> float:
        """The earliest time from `now` on when a sync may start."""
        have = self._tokens(now)
        return now if have >= 1 else now + (1 - have) * self.min_interval

    def next_due(self, now: float) -> float:
        """When the next sync should start (<= now: start it now)."""
        wanted = min(now if self.pending else math.inf, self.retry_at, self.last_start + self.max_interval)
        # Tokens only accumulate until the next start, so the first moment one is available,
        # computed from now, holds for any later `wanted` too.
        return max(wanted, self._token_time(now))

    def start(self, now: float) -> None:
        """Record that a sync starts now: it satisfies every request and retry so far."""
        self.tokens, self.tokens_at = self._tokens(now) - 1, now
        self.last_start = now
        self.pending = False
        self.retry_at = math.inf


class Clock(Protocol):
    def now(self) -> float: ...

    async def wait(self, deadline: float, wake: asyncio.Event) -> None:
        """Return at `deadline` or when `wake` is set, whichever is first."""
        ...


class LoopClock:
    """The event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def wait(self, deadline: float, wake: asyncio.Event) -> None:
        timeout = None if math.isinf(deadline) else max(0.0, deadline - self.now())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)


SyncFn = Callable[[], Awaitable[None]]


class BoundedFrequencyRunner:
    """Calls `fn` when asked, no more often than `min_interval`, at least every `max_interval`.

    `fn` raising is logged and retried after `retry_interval` (upstream's proxiers retry a
    failed sync after syncPeriod, sooner than the hourly periodic run).
    """

    def __init__(
        self,
        fn: SyncFn,
        *,
        min_interval: float = 1.0,
        max_interval: float = 3600.0,
        retry_interval: float = 30.0,
        burst: int = 2,
        clock: Clock | None = None,
        name: str = "sync-runner",
    ) -> None:
        self._fn = fn
        self._clock = clock or LoopClock()
        self._retry_interval = retry_interval
        self._name = name
        self._wake = asyncio.Event()
        self._schedule: Schedule | None = None
        self._limits = (min_interval, max_interval, burst)
        self.runs = 0  # completed calls of fn, for tests and metrics

    @property
    def max_interval(self) -> float:
        """How long it goes without a sync when nobody asks for one."""
        return self._limits[1]

    def run(self) -> None:
        """Ask for a sync (coalesced with other requests)."""
        self._require().request()
        self._wake.set()

    def retry_after(self, delay: float) -> None:
        self._require().retry_after(self._clock.now(), delay)
        self._wake.set()

    def _require(self) -> Schedule:
        if self._schedule is None:
            # Requests before loop() starts still count: create the schedule on first use.
            lo, hi, burst = self._limits
            self._schedule = Schedule(lo, hi, burst, now=self._clock.now())
        return self._schedule

    async def loop(self) -> None:
        """Run until cancelled."""
        schedule = self._require()
        while True:
            now = self._clock.now()
            due = schedule.next_due(now)
            if due > now:
                self._wake.clear()
                await self._clock.wait(due, self._wake)
                continue
            schedule.start(now)
            try:
                await self._fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: sync failed, retrying in %ss", self._name, self._retry_interval)
                schedule.retry_after(self._clock.now(), self._retry_interval)
            self.runs += 1
