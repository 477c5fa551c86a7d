"""bench/vs_upstream.py's own parsing and retries: the metrics page, the phase marks, the API calls.

The numbers it measures are the script's to print; here only that it reads what the proxies
write as it says it does.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2 as httpx
import pytest

from tests.paths import REPO


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("vs_upstream")
    finally:
        sys.path.remove(str(REPO / "bench"))


class _Namespace:
    """Answers `curl` with a fixed metrics page, as a proxy's namespace would."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.asked: list[list[str]] = []

    def run(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, self.page, "")


PAGE = """# HELP kubeproxy_sync_full_proxy_rules_duration_seconds SyncProxyRules latency in seconds for full resyncs
# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 3.5
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 9
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 5
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 7.25
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 9
"""


def test_the_full_sync_histogram_is_read_for_ipv4_only(bench: ModuleType) -> None:
    ns = _Namespace(PAGE)
    assert bench.full_sync_metric(ns) == (3.5, 2)
    assert ns.asked[0][-1] == f"http://{bench.METRICS}/metrics"


def test_a_page_without_the_histogram_counts_no_full_sync(bench: ModuleType) -> None:
    total, count = bench.full_sync_metric(_Namespace("kubeproxy_sync_proxy_rules_duration_seconds_count 3\n"))
    assert count == 0 and total != total  # nan


def test_the_first_sync_s_phases_are_its_first_start_and_the_first_end_after_it(bench: ModuleType, tmp_path: Path) -> None:
    marks = tmp_path / "phases.log"
    marks.write_text(
        "100.5 start view\n"
        "100.75 end view\n"
        "101.0 start view\n"  # a second sync: not the first's
        "101.5 end view\n"
        "100.25 end deliver Service\n"  # an end before any start is ignored
        "102.0 start deliver Service\n"
        "103.0 start render + kernel\n"  # after `synced`: left out
    )
    found = bench.first_phases(marks, fork=100.0, synced=2.5)
    assert found == {"phase:view:start": 0.5, "phase:view:end": 0.75, "phase:deliver Service:start": 2.0}


def test_an_api_call_is_retried_after_a_5xx_and_a_transport_error(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.time, "sleep", lambda _s: None)  # the back-off, not a wait for an event
    answers: list[httpx.Response | Exception] = [
        httpx.Response(503),
        httpx.ConnectError("refused"),
        httpx.Response(201, json={"ok": True}),
    ]

    def send() -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert bench.call(send, "POST x").status_code == 201
    assert not answers


def test_an_api_call_that_keeps_failing_ends_naming_the_request(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.time, "sleep", lambda _s: None)

    def send() -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(SystemExit, match="POST /api/v1/namespaces/bench/services"):
        bench.call(send, "POST /api/v1/namespaces/bench/services", tries=3)


def test_a_client_error_is_not_retried(bench: ModuleType) -> None:
    sent: list[int] = []

    def send() -> httpx.Response:
        sent.append(1)
        return httpx.Response(422)

    assert bench.call(send, "POST x").status_code == 422
    assert len(sent) == 1


def _round(bench: ModuleType, cold: float, wall: float, cpu: float) -> Any:
    """A cold-only round's result: its cold start and a first restore of `wall` and `cpu` seconds,
    begun `cold - wall - 2` s after the fork."""
    began = cold - wall - 2.0
    return bench.Result(cold=cold, restores=[(began, began + 0.1, began + 0.1 + wall, 32_330_000, 430_000, cpu)])


def test_repeated_cold_starts_are_shown_as_median_and_range_with_the_ratio_of_medians(bench: ModuleType) -> None:
    theirs, ours = bench.Result(cold=10.0), bench.Result(cold=14.0)
    for cold, wall, cpu in ((10.0, 8.0, 7.5), (12.0, 9.0, 8.5), (9.0, 7.0, 6.5)):
        theirs.add_round(_round(bench, cold, wall, cpu))
    for cold, wall, cpu in ((14.0, 10.0, 9.5), (11.0, 8.0, 7.5), (10.5, 8.5, 8.0)):
        ours.add_round(_round(bench, cold, wall, cpu))
    rows = {line.split("|")[3].strip(): [c.strip() for c in line.split("|")[4:7]]
            for line in bench.spread_lines("iptables-legacy", 10_000, theirs, ours)}  # fmt: skip
    assert rows["cold start med (3/3)"] == ["10.00", "11.00", "1.10"]
    assert rows["cold start range"] == ["9.00-12.00", "10.50-14.00", "-"]
    assert rows["1st restore from med (3/3)"] == ["0.00", "1.00", "-"]
    assert rows["1st restore run med (3/3)"] == ["8.00", "8.50", "1.06"]
    assert rows["1st restore CPU med (3/3)"] == ["7.50", "8.00", "1.07"]
    assert rows["1st restore CPU range"] == ["6.50-8.50", "7.50-9.50", "-"]
    nftables = [line.split("|")[3].strip() for line in bench.spread_lines("nftables", 10_000, theirs, ours)]
    assert nftables == ["cold start med (3/3)", "cold start range"]  # upstream's restores only clean up


def test_one_cold_start_per_proxy_adds_no_spread_rows(bench: ModuleType) -> None:
    theirs, ours = bench.Result(cold=10.0), bench.Result(cold=11.0)
    theirs.add_round(theirs)
    ours.add_round(ours)
    assert bench.spread_lines("nftables", 1_000, theirs, ours) == []
    table = "\n".join(bench.table({(1_000, "nftables", "upstream"): theirs, (1_000, "nftables", "ours"): ours},
                                  [1_000], ["nftables"]))  # fmt: skip
    assert "cold start s" in table and " med " not in table


def test_a_round_whose_proxy_exits_early_is_run_once_more_in_a_fresh_namespace(bench: ModuleType) -> None:
    indices: list[int] = []

    def run(index: int) -> Any:
        indices.append(index)
        if len(indices) == 1:
            raise bench.EarlyExit("the proxy exited with status 1")
        return bench.Result(cold=float(index))

    result = bench.attempt(run, iter(range(7, 10)), "  iptables-legacy ours")
    assert indices == [7, 8] and result.cold == 8.0


def test_a_failed_round_is_none_and_the_others_still_run(bench: ModuleType) -> None:
    def run(index: int) -> Any:
        raise SystemExit(f"the proxy did not converge in namespace {index}")

    assert bench.attempt(run, iter(range(3)), "  nftables upstream") is None


def test_the_plotted_cold_start_is_the_median_of_the_rounds_or_the_one_cold_start(bench: ModuleType) -> None:
    repeated, single = bench.Result(cold=14.0), bench.Result(cold=9.0)
    for cold in (14.0, 11.0, 12.0, 30.0):
        repeated.add_round(bench.Result(cold=cold))
    single.add_round(single)
    assert bench.cold_median(repeated) == 13.0 and bench.cold_median(single) == 9.0
