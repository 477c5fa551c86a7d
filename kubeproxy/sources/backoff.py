"""Back-off between attempts to reach the API server, as client-go's reflector backs off.

client-go v0.37.2, tools/cache/reflector.go (`defaultBackoff*`) with apimachinery's
`wait.Backoff.DelayWithReset`: 800 ms doubling to a 30 s cap, each delay `d` stretched to
`d × [1, 2)` (jitter 1.0: [30, 60) s at the cap), and the schedule starting again from 800 ms
once more than 2 minutes have passed since it last did. That restart is by time alone (the
manager's `lastStart`), not by success: a server that answers a list and then fails again keeps
being backed off, and a long outage goes back to short delays every 2 minutes. The full jitter is
what spreads thousands of nodes that lost the API server at the same moment.

The clock and the randomness are injected so that tests can pin the delays.

A server that says how long to wait (`Retry-After` on a 429 or a 5xx) is obeyed instead, as
client-go's request retries obey it (rest/with_retry.go `checkWait`: a 429 or any status from 500,
the header read as whole seconds), and as there at most `MAX_SERVER_DELAYS` times in a row (its
`maxRetries`, 10); after that the schedule applies again, so a server answering `Retry-After: 0`
for ever cannot make the client spin. client-go sleeps whatever the server asks; here it is
capped at `cap`: no server makes a proxy wait longer than its own back-off cap.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SERVER_DELAYS = 10  # client-go's default maxRetries for Retry-After answers


@dataclass
class Backoff:
    """Delays of `initial × factor**n` up to `cap`, each times [1, 1 + `jitter`); the schedule
    starts again from `initial` when more than `reset_interval` seconds of `clock` have passed
    since it last did (see the module doc)."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 1.0
    reset_interval: float = 120.0
    rand: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    # Server-given delays obeyed since the last success (see the module doc).
    server_delays: int = 0
    _duration: float = field(init=False, repr=False)
    _started: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap or self.factor < 1 or self.jitter < 0 or self.reset_interval < 0:
            raise ValueError(
                f"back-off needs 0 < initial ({self.initial}) <= cap ({self.cap}), factor ({self.factor}) >= 1, "
                f"jitter ({self.jitter}) >= 0 and reset interval ({self.reset_interval}) >= 0"
            )
        self._duration = self.initial
        self._started = self.clock()

    def next(self, retry_after: float | None = None) -> float:
        """The delay before the next attempt: the server's `retry_after` (seconds) if it gave one
        and it has not been obeyed `MAX_SERVER_DELAYS` times in a row already, else the schedule's."""
        if retry_after is not None and self.server_delays < MAX_SERVER_DELAYS:
            self.server_delays += 1
            return min(self.cap, max(0.0, retry_after))
        now = self.clock()
        if now - self._started > self.reset_interval:
            self._duration, self._started = self.initial, now
        base = self._duration
        self._duration = min(self.cap, base * self.factor)
        return base * (1 + self.jitter * self.rand.random())

    def succeeded(self) -> None:
        """The server answered: its `Retry-After` delays count from zero again. The schedule
        itself is not restarted (see the module doc)."""
        self.server_delays = 0
