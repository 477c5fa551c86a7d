"""The end-to-end bed: one MiniCluster per test (about a second to build), removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubeproxy.lab.cluster import MiniCluster


@pytest.fixture
def cluster() -> Iterator[MiniCluster]:
    """Pods a and b serve, pod c is the calling pod; r is "on node-2" (its slice says so)."""
    with MiniCluster.build(pods=("a", "b", "c"), remote_pods=("r",)) as bed:
        yield bed
