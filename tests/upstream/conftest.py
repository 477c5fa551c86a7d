"""Upstream's binaries for the side-by-side tests: found through scripts/upstream's cache (or
$KUBEPROXY_UPSTREAM_BIN); missing, they skip the test, except in CI where they fail it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeproxy.lab.control_plane import UPSTREAM_BIN_ENV, UPSTREAM_VERSION, upstream_bin
from kubeproxy.lab.netns import have_root


@pytest.fixture
def upstream_binaries() -> Path:
    return require_upstream_binaries()


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
