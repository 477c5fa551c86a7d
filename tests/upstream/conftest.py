"""Upstream's binaries for the side-by-side tests: found through scripts/upstream's cache (or
$KUBEPROXY_UPSTREAM_BIN); missing, they skip the test, except in CI where they fail it. One
side-by-side bed (upstream's control plane, three nodes) serves every test that takes
`side_by_side`, cleared before each."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.lab.control_plane import UPSTREAM_BIN_ENV, UPSTREAM_VERSION, upstream_bin
from kubeproxy.lab.netns import have_root
from kubeproxy.lab.side_by_side import SideBySide


@pytest.fixture
def upstream_binaries() -> Path:
    return require_upstream_binaries()


@pytest.fixture(scope="session")
def shared_side_by_side() -> Iterator[SideBySide]:
    # Booting upstream's control plane and wiring the nodes is the costly part of a bed: once a run.
    with SideBySide.build(require_upstream_binaries()) as bed:
        yield bed


@pytest.fixture
def side_by_side(shared_side_by_side: SideBySide) -> SideBySide:
    """The shared bed as built: no pods, no Services but `kubernetes`, empty rulesets, iptables mode."""
    shared_side_by_side.clear()
    return shared_side_by_side


def require_upstream_binaries() -> Path:
    """The folder of upstream's binaries, or the calling test skipped (failed in CI) saying why."""
    if not have_root():
        pytest.skip("needs root: network namespaces and netfilter")
    found = upstream_bin()
    if found is None:
        message = (
            f"upstream's {UPSTREAM_VERSION} binaries are not built: run scripts/upstream {UPSTREAM_VERSION} "
            f"(or point ${UPSTREAM_BIN_ENV} at a folder holding etcd, kube-apiserver, kube-controller-manager, "
            "kube-proxy and kubectl)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found
