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
