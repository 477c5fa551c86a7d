"""The hostile-API campaign against the real `kube-proxy` process, bounded and seeded (see
tests/sources/api_campaign.py): it never exits, never loses a programmed rule, its memory stays
bounded, and its rules become exactly the server's Services once the server is sane again.

The iptables and nftables campaigns run at the same time, each in its own namespace with its
own server and process: a campaign spends its minutes waiting out the proxy's back-offs (up to
60 s at the cap), not on the CPU, so side by side they take the time of the longer one.

A longer campaign: `.venv/bin/python bench/fuzz_api.py --cases 20`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.sources.api_campaign import Case, run_case

CAMPAIGNS = {"iptables": 11, "nftables": 12}  # mode -> seed
# Both campaigns are set up under the first test: each may wait out a back-off at its cap (up
# to 60 s with full jitter, as client-go) before converging.
pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]
FAULTS = 20
# The proxy's own peak is ~60 MiB; a watch line is cut at 16 MiB and the largest hostile
# answer is 20 MiB, so a peak past this means something was buffered without a bound.
PEAK_RSS_MIB = 160


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[Case]]:
    """Every mode's campaign, run at once; each test reads its own mode's outcome or failure."""
    folder = tmp_path_factory.mktemp("hostile-api")
    with ThreadPoolExecutor(max_workers=len(CAMPAIGNS)) as pool:
        futures = {
            mode: pool.submit(run_case, seed, mode, faults=FAULTS, log=folder / f"kube-proxy-{mode}.log")
            for mode, seed in CAMPAIGNS.items()
        }
    return futures


@pytest.mark.parametrize("mode", CAMPAIGNS)
def test_kube_proxy_survives_a_hostile_api_server_and_converges(campaigns: dict[str, Future[Case]], mode: str) -> None:
    case = campaigns[mode].result()  # re-raises the campaign's own AssertionError
    assert case.faults >= FAULTS and len(case.served) >= 4, case.served
    assert case.samples >= 10  # the rules were checked all along, not only at the end
    assert case.peak_rss_mib < PEAK_RSS_MIB, case
