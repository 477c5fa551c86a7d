"""Durations as Go's time.ParseDuration reads them: the one parser of flags, config files and annotations.

    [-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+   with units ns, us, µs (U+00B5), μs (U+03BC), ms, s, m, h

"0" alone needs no unit; digits are ASCII only ("١٠s" is refused, as Go refuses it); the value is
whole nanoseconds within int64 (a fraction below one nanosecond is dropped, as Go drops it).
Errors carry Go's messages (`time: invalid duration "x"`, `time: missing unit in duration "1"`,
`time: unknown unit "d" in duration "1d"`), which callers prefix with the flag or field.
"""

from __future__ import annotations

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60 * 1_000_000_000, "h": 3600 * 1_000_000_000}  # fmt: skip
_MAX_NS = 2**63 - 1
_DIGITS = "0123456789"


class DurationError(ValueError):
    """Not a Go duration; the message is Go's."""


def parse_go_duration_ns(text: str) -> int:
    """`text` in nanoseconds, as Go's time.ParseDuration; DurationError otherwise."""
    invalid = DurationError(f"time: invalid duration {_quote(text)}")
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    total = 0
    while s:
        if s[0] != "." and s[0] not in _DIGITS:
            raise invalid
        whole, s = _leading(s)
        fraction = ""
        if s[:1] == ".":
            fraction, s = _leading(s[1:])
        elif not whole:
            raise invalid
        if not whole and not fraction:
            raise invalid  # "." or ".s": no digit at all
        end = 0
        while end < len(s) and s[end] != "." and s[end] not in _DIGITS:
            end += 1
        if end == 0:
            raise DurationError(f"time: missing unit in duration {_quote(text)}")
        unit, s = s[:end], s[end:]
        if unit not in _UNIT_NS:
            raise DurationError(f"time: unknown unit {_quote(unit)} in duration {_quote(text)}")
        if len(whole.lstrip("0")) > 19:  # past int64 whatever the unit (and past int()'s digit limit)
            raise invalid
        scale = _UNIT_NS[unit]
        value = int(whole or "0") * scale
        if fraction:
            value += _fraction_ns(fraction, scale)
        total += value
        if total > _MAX_NS + 1:  # one past int64 only for "-9223372036854775808ns"
            raise invalid
    if not negative and total > _MAX_NS:
        raise invalid
    return -total if negative else total


def parse_go_duration(text: str) -> float:
    """`text` in seconds, as Go's time.ParseDuration reads it; DurationError otherwise."""
    return parse_go_duration_ns(text) / 1e9


def format_go_duration(seconds: float) -> str:
    """The text Go's Duration.String gives for whole units ("1h0m0s", "1m30s", "500ms", "0s")."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return f"{sign}{_decimal(ns, size)}{unit}"
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    text = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _decimal(value: int, unit: int) -> str:
    whole, part = divmod(value, unit)
    digits = len(str(unit)) - 1
    return f"{whole}.{part:0{digits}d}".rstrip("0").rstrip(".") if part else str(whole)


def _fraction_ns(digits: str, unit_ns: int) -> int:
    """What Go adds for a fraction: its digits taken while they fit in int64, then float arithmetic,
    truncated (so "0.3333333333333333333h" is exactly 20 minutes, as in Go)."""
    value, scale = 0, 1.0
    for digit in digits:
        if value > (2**63 - 1) // 10:
            break  # Go stops accumulating here; the remaining digits do not count
        candidate = value * 10 + int(digit)
        if candidate > 2**63 - 1:
            break
        value, scale = candidate, scale * 10
    return int(float(value) * (float(unit_ns) / scale))


def _leading(s: str) -> tuple[str, str]:
    """The ASCII digits at the start of `s`, and the rest."""
    end = 0
    while end < len(s) and s[end] in _DIGITS:
        end += 1
    return s[:end], s[end:]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
