"""The end-to-end bed: one MiniCluster per test (about a second to build), removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubeproxy.lab.cluster import MiniCluster


@pytest.fixture
def proxy_mode() -> str:
    """The mode whose rules the bed reads. The offline bed loads iptables rules; the live
    modules override this fixture with one parametrised over every mode."""
    return "iptables"


@pytest.fixture
def cluster(proxy_mode: str) -> Iterator[MiniCluster]:
    """Pods a and b serve, pod c is the calling pod; r is "on node-2" (its slice says so)."""
    with MiniCluster.build(pods=("a", "b", "c"), remote_pods=("r",), proxy_mode=proxy_mode) as bed:
        yield bed

