"""Latency summaries: nearest-rank percentiles over exact samples (no histogram buckets)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def percentile(ordered: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (p in 0..100): a sample, never an interpolation."""
    if not ordered:
        raise ValueError("percentile of no samples")
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Summary:
    """Percentiles of a set of durations, in seconds."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Summary | None:
        ordered = sorted(samples)
        if not ordered:
            return None
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99), ordered[-1])

    def to_ms(self) -> dict[str, float]:
        return {k: round(getattr(self, k) * 1e3, 3) for k in ("p50", "p90", "p99", "max")}

    def line(self) -> str:
        ms = self.to_ms()
        return "  ".join(f"{k} {v:.3f}" for k, v in ms.items())


def format_duration(seconds: float) -> str:
    """Seconds as a short Go-style duration: 1s, 500ms, 1.5s, 250us."""
    if seconds <= 0:
        return "0s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            value = seconds / scale
            return f"{value:.3f}".rstrip("0").rstrip(".") + unit
    return f"{seconds}s"
