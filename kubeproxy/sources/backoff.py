"""Exponential back-off with jitter, capped, as clients of the API server should retry.

Randomness is injected so that tests can pin the delays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap or self.factor < 1 or self.jitter < 0:
            raise ValueError(
                f"back-off needs 0 < initial ({self.initial}) <= cap ({self.cap}), "
                f"factor ({self.factor}) >= 1 and jitter ({self.jitter}) >= 0"
            )

    def next(self) -> float:
        """The delay before the next attempt."""
        base = min(self.cap, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return min(self.cap, base * (1 + self.jitter * self.rand.random()))

    def reset(self) -> None:
        self.attempts = 0
