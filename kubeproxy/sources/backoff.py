"""Exponential back-off with jitter, capped, as clients of the API server should retry.

Randomness is injected so that tests can pin the delays.

A server that says how long to wait (`Retry-After` on a 429 or a 5xx) is obeyed instead, as
client-go's request retries obey it (rest/with_retry.go `checkWait`: a 429 or any status from 500,
the header read as whole seconds), and as there at most `MAX_SERVER_DELAYS` times in a row (its
`maxRetries`, 10); after that the schedule below applies again, so a server answering
`Retry-After: 0` for ever cannot make the client spin. client-go sleeps whatever the server asks;
here it is capped at `cap`: no server makes a proxy wait longer than its own longest back-off.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MAX_SERVER_DELAYS = 10  # client-go's default maxRetries for Retry-After answers


@dataclass
class Backoff:
    """Delays of `initial * factor**n`, each stretched by up to `jitter` (a fraction), at most `cap`.

    Jitter keeps many proxies that lost the API server at the same moment from all coming back
    at the same moment. `reset()` after a success starts again from `initial`.
    """

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rand: random.Random = field(default_factory=random.Random)
    attempts: int = 0
    # Server-given delays obeyed since the last success (see the module doc).
    server_delays: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap or self.factor < 1 or self.jitter < 0:
            raise ValueError(
                f"back-off needs 0 < initial ({self.initial}) <= cap ({self.cap}), "
                f"factor ({self.factor}) >= 1 and jitter ({self.jitter}) >= 0"
            )

    def next(self, retry_after: float | None = None) -> float:
        """The delay before the next attempt: the server's `retry_after` (seconds) if it gave one
        and it has not been obeyed `MAX_SERVER_DELAYS` times in a row already, else the schedule's."""
        if retry_after is not None and self.server_delays < MAX_SERVER_DELAYS:
            self.server_delays += 1
            return min(self.cap, max(0.0, retry_after))
        base = min(self.cap, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return min(self.cap, base * (1 + self.jitter * self.rand.random()))

    def reset(self) -> None:
        self.attempts = 0
        self.server_delays = 0
