"""Shared fixtures. Kernel tests are marked `root`: they skip, saying why, when not run as root."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from hypothesis import settings

from kubeproxy.lab import netns as netns_mod

# A property test fails on what it finds, never on how long an example took: CI shares its
# cores, and a 200 ms deadline missed under load is chance, not a defect of the code.
settings.register_profile("kubeproxy", deadline=None)
settings.load_profile("kubeproxy")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if netns_mod.have_root() and shutil.which("ip"):
        return
    skip = pytest.mark.skip(reason="needs root and iproute2: kernel tests run in CI as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def netns() -> Iterator[netns_mod.NetNS]:
    """A fresh network namespace, removed after the test."""
    with netns_mod.netns("kpt") as ns:
        yield ns
