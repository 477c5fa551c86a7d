"""The bounded-frequency runner: the pure schedule, then the asyncio loop on a fake clock."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kubeproxy.proxy.runner import BoundedFrequencyRunner, Schedule

# --- the pure schedule -------------------------------------------------------------------


def test_nothing_due_before_the_period_without_requests() -> None:
    s = Schedule(min_interval=1, max_interval=60, now=0)
    assert s.next_due(0) == 60
    assert s.next_due(59.5) == 60


def test_request_is_due_at_once_then_throttled_after_the_burst() -> None:
    s = Schedule(min_interval=1, max_interval=60, burst=2, now=0)
    s.request()
    assert s.next_due(0) == 0
    s.start(0)
    s.request()
    assert s.next_due(0) == 0  # the second token of the burst
    s.start(0)
    s.request()
    assert s.next_due(0.25) == 1  # one token refills per min_interval
    s.start(1)
    s.request()
    assert s.next_due(1.5) == 2


def test_burst_one_keeps_min_interval_between_starts() -> None:
    s = Schedule(min_interval=1, max_interval=60, burst=1, now=0)
    s.request()
    s.start(0)
    s.request()
    assert s.next_due(0.1) == pytest.approx(1)


def test_periodic_run_counts_from_the_last_start() -> None:
    s = Schedule(min_interval=1, max_interval=60, now=0)
    s.request()
    s.start(10)
    assert s.next_due(11) == 70


def test_retry_comes_sooner_than_the_period_but_not_sooner_than_min_interval() -> None:
    s = Schedule(min_interval=2, max_interval=3600, burst=1, now=0)
    s.request()
    s.start(0)
    s.retry_after(0, 0.5)
    assert s.next_due(0) == pytest.approx(2)
    s.start(2)
    assert s.retry_at == math.inf  # a start satisfies the retry
    s.retry_after(2, 30)
    assert s.next_due(2) == 32


def test_zero_min_interval_never_throttles() -> None:
    s = Schedule(min_interval=0, max_interval=10, burst=1, now=0)
    for _ in range(5):
        s.request()
        assert s.next_due(0) == 0
        s.start(0)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        Schedule(min_interval=5, max_interval=1)
    with pytest.raises(ValueError):
        Schedule(min_interval=1, max_interval=5, burst=0)


# --- the asyncio loop on a fake clock ----------------------------------------------------


class FakeClock:
    """Time moves only in advance(); waiters wake at their deadline or when poked."""

    def __init__(self) -> None:
        self.t = 0.0
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def wait(self, deadline: float, wake: asyncio.Event) -> None:
        if deadline <= self.t:
            return
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (deadline, timer)
        self._waiters.append(entry)
        poke = asyncio.ensure_future(wake.wait())
        try:
            either: set[asyncio.Future[Any]] = {timer, poke}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            poke.cancel()
            self._waiters.remove(entry)

    async def advance(self, dt: float) -> None:
        """Move time forward, stopping at each deadline on the way so waiters see exact times."""
        target = self.t + dt
        while True:
            due = [w for w in self._waiters if w[0] <= target and not w[1].done()]
            if not due:
                break
            deadline, timer = min(due, key=lambda w: w[0])
            self.t = max(self.t, deadline)
            timer.set_result(None)
            await settle()
        self.t = target
        await settle()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def drive(test: Callable[[FakeClock, list[float], BoundedFrequencyRunner], Awaitable[None]], **kw: float) -> None:
    async def main() -> None:
        clock = FakeClock()
        starts: list[float] = []
        failures = kw.pop("fail_first", 0)

        async def sync() -> None:
            starts.append(clock.now())
            if len(starts) <= failures:
                raise RuntimeError("iptables-restore failed")

        runner = BoundedFrequencyRunner(sync, clock=clock, **kw)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.loop())
        await settle()
        try:
            await test(clock, starts, runner)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(main(), 10))


def test_requests_coalesce_into_one_sync() -> None:
    async def body(clock: FakeClock, starts: list[float], runner: BoundedFrequencyRunner) -> None:
        runner.run()
        runner.run()
        runner.run()
        await settle()
        assert starts == [0.0]
        await clock.advance(5)
        assert starts == [0.0]

    drive(body, min_interval=1, max_interval=60)


def test_requests_inside_min_interval_wait_for_it() -> None:
    async def body(clock: FakeClock, starts: list[float], runner: BoundedFrequencyRunner) -> None:
        runner.run()
        await settle()
        await clock.advance(0.2)
        runner.run()
        await settle()
        assert starts == [0.0]  # burst 1: must wait until 1.0
        await clock.advance(0.3)
        runner.run()  # coalesces with the waiting one
        await settle()
        assert starts == [0.0]
        await clock.advance(0.5)
        assert starts == [0.0, 1.0]

    drive(body, min_interval=1, max_interval=60, burst=1)


def test_periodic_sync_without_requests() -> None:
    async def body(clock: FakeClock, starts: list[float], runner: BoundedFrequencyRunner) -> None:
        for _ in range(3):
            await clock.advance(30)
        assert starts == [30.0, 60.0, 90.0]

    drive(body, min_interval=1, max_interval=30)


def test_failed_sync_is_retried_sooner_than_the_period() -> None:
    async def body(clock: FakeClock, starts: list[float], runner: BoundedFrequencyRunner) -> None:
        runner.run()
        await settle()
        assert starts == [0.0] and runner.runs == 1
        await clock.advance(5)
        assert starts == [0.0, 5.0]  # retry, long before max_interval
        await clock.advance(5)
        assert starts == [0.0, 5.0]  # the retry succeeded: back to the period
        await clock.advance(3600)
        assert starts == [0.0, 5.0, 3605.0]

    drive(body, min_interval=1, max_interval=3600, retry_interval=5, fail_first=1)


def test_explicit_retry_after() -> None:
    async def body(clock: FakeClock, starts: list[float], runner: BoundedFrequencyRunner) -> None:
        runner.retry_after(7)
        await clock.advance(6)
        assert starts == []
        await clock.advance(1)
        assert starts == [7.0]

    drive(body, min_interval=1, max_interval=3600)


def test_request_during_a_sync_runs_again_afterwards() -> None:
    async def main() -> None:
        clock = FakeClock()
        gate = asyncio.Event()
        starts: list[float] = []

        async def slow_sync() -> None:
            starts.append(clock.now())
            await gate.wait()

        runner = BoundedFrequencyRunner(slow_sync, clock=clock, min_interval=1, max_interval=60, burst=1)
        task = asyncio.create_task(runner.loop())
        runner.run()
        await settle()
        runner.run()  # arrives while the first sync is still running
        await clock.advance(2)
        gate.set()
        await settle()
        assert starts == [0.0, 2.0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 10))


def test_loop_clock_drives_the_runner_for_real() -> None:
    """The default clock: a short real run, to prove the wiring (the fake clock proves timing)."""

    async def main() -> None:
        runs: list[float] = []

        async def sync() -> None:
            runs.append(asyncio.get_running_loop().time())

        runner = BoundedFrequencyRunner(sync, min_interval=0.05, max_interval=60, burst=1)
        task = asyncio.create_task(runner.loop())
        runner.run()
        runner.run()
        await asyncio.sleep(0.01)
        runner.run()
        # Await the second sync rather than sleep past it: a loop stalled >0.1 s (a loaded CI
        # machine, a full GC late in a long suite) wakes a sleeper and the runner's timer together,
        # and the cancel below could then come before the sync it is meant to see.
        while len(runs) < 2:
            await asyncio.sleep(0.01)
        # The second sync answered both later requests: nothing is left pending, so no third
        # sync is due before max_interval (the coalescing in time: the fake-clock tests).
        schedule = runner._schedule
        assert schedule is not None and not schedule.pending and schedule.retry_at == math.inf
        assert schedule.next_due(schedule.last_start) == schedule.last_start + 60
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(runs) == 2 and runs[1] - runs[0] >= 0.049

    asyncio.run(asyncio.wait_for(main(), 10))
