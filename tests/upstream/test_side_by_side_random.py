"""Upstream's kube-proxy and ours in iptables mode on random clusters (tests/upstream/random_cluster.py):
`iptables-save` and `ip6tables-save` of both nodes equal after the first sync and after every
step of the churn (kubeproxy/lab/side_by_side.py)."""

from __future__ import annotations

import random

import pytest

from kubeproxy.lab.side_by_side import OURS_NODE, UPSTREAM_NODE, SideBySide
from tests.upstream.random_cluster import FAMILIES, Model

pytestmark = pytest.mark.root

SEEDS = (1, 2, 3)
CHURN_STEPS = 14


def check(model: Model, step: str, changed: set[str]) -> None:
    bed = model.bed
    diffs = bed.await_step(model.expected(), families=FAMILIES, node_local=model.node_local(), changed=changed)
    logs = {n: "\n".join(bed.proxy_log(n).splitlines()[-40:]) for n in (UPSTREAM_NODE, OURS_NODE)} if diffs else {}
    assert not diffs, f"after {step}:\n" + "\n".join(diffs) + "".join(f"\n{n}'s log:\n{t}" for n, t in logs.items())


@pytest.mark.parametrize("seed", SEEDS)
def test_random_cluster_and_churn_equal_to_upstream(side_by_side: SideBySide, seed: int) -> None:
    bed = side_by_side
    model = Model(random.Random(seed), bed)
    model.populate()
    bed.start_proxies()
    check(model, f"seed {seed}: the first sync", set(FAMILIES))
    for step in range(CHURN_STEPS):
        what, touched = model.churn()
        check(model, f"seed {seed} step {step}: {what}", touched)
