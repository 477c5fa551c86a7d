"""Durations read as Go's time.ParseDuration reads them, by every reader (flags, config file, annotations)."""

from __future__ import annotations

import pytest

from kubeproxy.backends.ipvs.config_section import ipvs_options
from kubeproxy.backends.nftables.annotations import UDP_CONNTRACK_TIMEOUT, udp_conntrack_timeout
from kubeproxy.cluster.duration import DurationError, format_go_duration, parse_go_duration_ns
from kubeproxy.model.proxy_config import ConfigError, parse_duration
from kubeproxy.proxy.flags import go_duration

# (text, nanoseconds) as Go's time.ParseDuration gives them (its own test table's cases among them).
ACCEPTED = [
    ("0", 0), ("-0", 0), ("+0", 0), ("5s", 5 * 10**9), ("30s", 30 * 10**9), ("1478s", 1478 * 10**9),
    ("-5s", -5 * 10**9), ("+5s", 5 * 10**9), ("-0s", 0), ("5.0s", 5 * 10**9), ("5.6s", 5_600_000_000),
    ("5.s", 5 * 10**9), (".5s", 500_000_000), ("1.0s", 10**9), ("1.004s", 1_004_000_000), ("100.00100s", 100_001_000_000),
    ("10ns", 10), ("11us", 11_000), ("12µs", 12_000), ("12μs", 12_000), ("13ms", 13_000_000), ("14s", 14 * 10**9),
    ("15m", 15 * 60 * 10**9), ("16h", 16 * 3600 * 10**9), ("3h30m", 12_600 * 10**9), ("10.5s4m", 250_500_000_000),
    ("-2m3.4s", -123_400_000_000), ("1h2m3s4ms5us6ns", 3_723_004_005_006), ("39h9m14.425s", 140_954_425_000_000),
    ("52763797000ns", 52_763_797_000), ("0.3333333333333333333h", 1_200_000_000_000),
    ("9007199254740993ns", 9_007_199_254_740_993),
    ("9223372036854775807ns", 2**63 - 1), ("-9223372036854775808ns", -(2**63)), ("1.5ns", 1),
]  # fmt: skip

REFUSED = [
    ("", 'time: invalid duration ""'), ("3", 'time: missing unit in duration "3"'), ("-", 'time: invalid duration "-"'),
    ("s", 'time: invalid duration "s"'), (".", 'time: invalid duration "."'), ("-.", 'time: invalid duration "-."'),
    (".s", 'time: invalid duration ".s"'), ("+.s", 'time: invalid duration "+.s"'),
    ("1d", 'time: unknown unit "d" in duration "1d"'),
    ("\u0661\u0660s", 'time: invalid duration "\u0661\u0660s"'),  # Arabic-Indic digits: Go reads ASCII digits only
    ("1\u0660s", 'time: unknown unit "\u0660s" in duration "1\u0660s"'), (" 1s", 'time: invalid duration " 1s"'),
    ("1e3s", 'time: unknown unit "e" in duration "1e3s"'), ("9223372036854775808ns", "time: invalid duration"),
    ("3000000h", "time: invalid duration"), ("1" + "0" * 5000 + "s", "time: invalid duration"),
    ("--1s", "time: invalid duration"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "ns"), ACCEPTED)
def test_accepted_as_go_reads_them(text: str, ns: int) -> None:
    assert parse_go_duration_ns(text) == ns
    assert go_duration(text) == parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_with_gos_message(text: str, message: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_go_duration_ns(text)
    assert str(caught.value).startswith(message)
    with pytest.raises(ValueError, match="time: "):
        go_duration(text)
    with pytest.raises(ConfigError, match="is not a duration"):
        parse_duration(text)


def test_every_reader_refuses_non_ascii_digits() -> None:
    text = "\u0661\u0660s"
    with pytest.raises(ConfigError, match=r"ipvs: .* is not a duration"):
        ipvs_options({"tcpTimeout": text})
    seconds, warning = udp_conntrack_timeout({UDP_CONNTRACK_TIMEOUT: text}, "default/dns")
    assert seconds is None and warning is not None and "invalid duration" in warning


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (1e-9, "1ns"), (1.5e-6, "1.5µs"), (0.5, "500ms"), (1, "1s"), (90, "1m30s"), (3600, "1h0m0s"),
     (1.5, "1.5s"), (-30, "-30s"), (3723.25, "1h2m3.25s")],
)  # fmt: skip
def test_formatted_as_gos_duration_string(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text
    assert parse_go_duration_ns(text) == round(seconds * 1e9)
