"""The hostile-API campaign against the real `kube-proxy` process, bounded and seeded (see
tests/sources/api_campaign.py): it never exits, never loses a programmed rule, its memory stays
bounded, and its rules become exactly the server's Services once the server is sane again.

A longer campaign: `.venv/bin/python bench/fuzz_api.py --cases 20`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sources.api_campaign import run_case

# Converging may wait out a back-off at its cap (up to 60 s with full jitter, as client-go).
pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]
FAULTS = 20
# The proxy's own peak is ~60 MiB; a watch line is cut at 16 MiB and the largest hostile
# answer is 20 MiB, so a peak past this means something was buffered without a bound.
PEAK_RSS_MIB = 160


@pytest.mark.parametrize(("mode", "seed"), [("iptables", 11), ("nftables", 12)])
def test_kube_proxy_survives_a_hostile_api_server_and_converges(mode: str, seed: int, tmp_path: Path) -> None:
    case = run_case(seed, mode, faults=FAULTS, log=tmp_path / "kube-proxy.log")
    assert case.faults >= FAULTS and len(case.served) >= 4, case.served
    assert case.samples >= 10  # the rules were checked all along, not only at the end
    assert case.peak_rss_mib < PEAK_RSS_MIB, case
