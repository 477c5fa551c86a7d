"""Faults of the real kube-apiserver and etcd, given to upstream's kube-proxy (node-a) and ours
(node-b) in the same cluster (kubeproxy/lab/server_faults.py): in each, no Service or endpoint
gone from either node's rules while the server was away, the change made around the fault taken
in by both, their rules equal afterwards, and what shows the fault really happened. The times
are bench/faults_vs_upstream.py's to print, not asserted here."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from kubeproxy.lab.server_faults import FaultBed, FaultResult
from kubeproxy.lab.side_by_side import OURS_NODE, UPSTREAM_NODE, SideBySide

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def faults(shared_side_by_side: SideBySide) -> Iterator[FaultBed]:
    # The session's bed (its control plane booted once for every side-by-side test): the faults
    # run in order, each leaving the cluster as it found it.
    with FaultBed.on(shared_side_by_side) as bed:
        yield bed


def check(result: FaultResult) -> None:
    print(result)  # the times and the evidence, for a reader of `pytest -s`
    assert result.lost == [], f"{result.name}: rules lost during the fault"
    missing = [node for node in (UPSTREAM_NODE, OURS_NODE) if result.seconds[node] is None]
    assert missing == [], f"{result.name}: never took in the change: {missing}"
    assert result.differences == [], f"{result.name}: ours differs from upstream's afterwards:\n" + "\n".join(result.differences)


def test_apiserver_restarted(faults: FaultBed) -> None:
    result = faults.run("apiserver-restart")
    check(result)


def test_etcd_compacted_past_our_version_relists_after_410(faults: FaultBed) -> None:
    result = faults.run("etcd-compacted")
    check(result)
    assert result.counts["etcd refuses a read below the compaction"] == 1
    assert any("is gone (410), relisting" in line for line in result.evidence), result.evidence


def test_priority_and_fairness_429_with_retry_after(faults: FaultBed) -> None:
    result = faults.run("apf-429")
    check(result)
    assert any("429" in line and "retryAfter=" in line for line in result.evidence), result.evidence


def test_rbac_denying_endpointslices_said_once_rules_kept(faults: FaultBed) -> None:
    result = faults.run("rbac-denied")
    check(result)
    [said] = [line for line in result.evidence if "forbidden" in line]
    # The denied verb is the request the reflector was making: a watch resumed at its version
    # (the server kept its history across the restart) or a relist.
    assert re.search(r'cannot (list|watch) resource \\"endpointslices\\"', said) and 'type="*v1.EndpointSlice"' in said, said
    # Retried at least three times while denied, said once.
    assert result.counts["ours 403 answers"] >= 3, result.counts
    assert result.counts["ours 403 log lines"] == 1, result.counts


def test_service_account_token_rotated(faults: FaultBed) -> None:
    result = faults.run("token-rotated")
    check(result)
    assert any(line.startswith("the old token:") and "Unauthorized" in line for line in result.evidence), result.evidence


@pytest.mark.parametrize("fault", ["watch-list-off", "watch-list-on"])
def test_streaming_lists_off_and_on(faults: FaultBed, fault: str) -> None:
    result = faults.run(fault)
    check(result)
