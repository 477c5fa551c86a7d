"""What a killed iptables-restore leaves in the kernel, legacy and nft: a fact the proxy builds on.

A restore killed at its bound (kernel/exec.py) commits nothing of the table it was reading, but
both variants commit each table at its COMMIT line, not at the end of their input: a restore
of filter then nat (the proxy's order, as upstream's) killed while in nat leaves filter new and
nat as it was. Each table is whole, old or new; the proxy's retry after a failed sync is full
and brings both to the new rules.
"""

from __future__ import annotations

import time

import pytest

from kubeproxy.kernel.exec import FedProcess
from kubeproxy.lab.netns import NetNS

pytestmark = pytest.mark.root

FILTER = "*filter\n:KP-KILLED-F - [0:0]\n-A KP-KILLED-F -j ACCEPT\nCOMMIT\n"
NAT_UNFINISHED = "*nat\n:KP-KILLED-N - [0:0]\n-A KP-KILLED-N -j ACCEPT\n"  # no COMMIT yet


def _saved(ns: NetNS, variant: str) -> str:
    return ns.run([f"iptables-{variant}-save"]).stdout


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_killed_restore_keeps_the_tables_it_committed_and_commits_no_other(netns: NetNS, variant: str) -> None:
    fed = netns.spawn([f"iptables-{variant}-restore", "-w", "--noflush"], None)
    assert isinstance(fed, FedProcess) and fed.proc.stdin is not None
    try:
        assert fed.write(FILTER + NAT_UNFINISHED)
        fed.proc.stdin.flush()  # to the tool now, its input still open
        deadline = time.monotonic() + 30  # bounds a failure only: the commit is what the loop awaits
        while "KP-KILLED-F" not in _saved(netns, variant):
            assert time.monotonic() < deadline, "filter's COMMIT was never taken"
            time.sleep(0.01)
    finally:
        fed.abort()  # killed with its input open, as at its deadline
    saved = _saved(netns, variant)
    assert "KP-KILLED-F" in saved  # committed at its COMMIT line, before the end of the input
    assert "KP-KILLED-N" not in saved  # the table it was reading when killed: nothing of it
