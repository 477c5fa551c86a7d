"""The API client's own rate limit, as client-go's: a token bucket before every request but watches.

client-go v0.37.2: a rest.Config's QPS and Burst (kube-proxy's `clientConnection.qps`/`burst`,
`--kube-api-qps`/`--kube-api-burst`, defaults 5 and 10) become one
`flowcontrol.NewTokenBucketRateLimiter(qps, burst)` (golang.org/x/time/rate) shared by every
request of the clientset; `Request.request` and `Stream` wait for a token before each attempt
(`tryThrottle`), `Request.Watch` does not ("We specifically don't want to rate limit watches").
So lists, resume checks and Events are limited, watches and watch-lists are not. A QPS of 0 or
less means no limit (rest.RESTClientFor builds a limiter only for qps > 0).

The bucket holds up to `burst` tokens, refilled at `qps` per second; a request that finds none
takes one ahead of time and waits until it is due, as `rate.Limiter.Wait` does, so requests
waiting together go out in order, `1/qps` apart. A request cancelled while it waits gives its
token back, less what later requests reserved after it (`Reservation.CancelAt`, x/time v0.15.0
rate/rate.go), so that a cancelled request does not delay the ones queued behind it. Clock and
sleep are injected for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx2


@dataclass
class TokenBucket:
    """`qps` tokens a second, at most `burst` saved up."""

    qps: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    _tokens: float = field(init=False, repr=False)
    _last: float = field(init=False, repr=False)
    # When the latest reservation is due (x/time's lastEvent).
    _last_event: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.qps > 0 or self.burst < 1:
            raise ValueError(f"a rate limit needs qps ({self.qps}) > 0 and burst ({self.burst}) >= 1")
        self._tokens = float(self.burst)
        self._last = self.clock()
        self._last_event = self._last

    def _advance(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now

    def reserve(self) -> float:
        """Take a token, ahead of time if none is left: the seconds until it is due."""
        now = self.clock()
        self._advance(now)
        self._tokens -= 1.0
        delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
        self._last_event = now + delay
        return delay

    def cancel(self, due: float) -> None:
        """Give back the token of a reservation due at `due` that will not be used, less the
        tokens reserved after it; nothing once it is due."""
        now = self.clock()
        restore = 1.0 - (self._last_event - due) * self.qps
        if due < now or restore <= 0:
            return
        self._advance(now)
        self._tokens = min(float(self.burst), self._tokens + restore)
        if due == self._last_event:
            self._last_event = max(now, due - 1.0 / self.qps)

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            due = self._last_event  # this reservation's, until another is made
            try:
                await self.sleep(delay)
            except asyncio.CancelledError:
                self.cancel(due)
                raise

    def attach(self, client: httpx2.AsyncClient) -> None:
        """Limit `client`'s requests from now on, watches excepted (through its event hooks; first,
        so that what observes requests after it sees them when they are sent)."""
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "request": [self._before, *hooks.get("request", [])]}

    async def _before(self, request: httpx2.Request) -> None:
        if request.url.params.get("watch") not in ("true", "1"):
            await self.wait()
