"""`kubeproxy cleanup` after a real `kubeproxy run` in each mode: ours goes, someone else's stays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubeproxy.lab.netns import NetNS
from tests.live.test_live import run_demo_until_sigterm

pytestmark = pytest.mark.root
KUBEPROXY = str(Path(sys.executable).parent / "kubeproxy")

# A firewall of someone else's, in both iptables and nftables, with names close to ours.
FOREIGN_IPTABLES = """*nat
:KUBE-HOSTPORTS - [0:0]
-A PREROUTING -j KUBE-HOSTPORTS
-A KUBE-HOSTPORTS -p tcp --dport 8443 -j DNAT --to-destination 10.9.9.9:443
COMMIT
"""
FOREIGN_NFT = """table ip kube-proxy-other {
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr 192.0.2.9 dnat to 10.9.9.9
    }
}
"""


NODEPORTS_JUMP = (
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
    " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
)
BUILTIN = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")


def _snapshot(ns: NetNS) -> tuple[list[str], list[str]]:
    """iptables rules and user chains (sorted), and nft tables other than iptables-nft's own."""
    lines = ns.run(["iptables-save"]).stdout.splitlines()
    iptables = sorted(
        line for line in lines
        if (line.startswith("-A ") or (line.startswith(":") and line[1:].split()[0] not in BUILTIN)) and "CANARY" not in line
    )  # fmt: skip
    # the canary chains stay, as upstream's do: kubelet may own them too
    tables = [t for t in ns.run(["nft", "list", "tables"]).stdout.splitlines() if "kube-proxy" in t]
    return iptables, tables


def test_cleanup_removes_both_modes_rules_and_keeps_foreign_ones(netns: NetNS, tmp_path: Path) -> None:
    netns.run(["iptables-restore", "--noflush"], input=FOREIGN_IPTABLES)
    netns.run(["nft", "-f", "-"], input=FOREIGN_NFT)
    foreign_iptables, foreign_tables = _snapshot(netns)

    for mode in ("iptables", "nftables"):
        assert run_demo_until_sigterm(netns, tmp_path, mode)[0] == 0
    iptables, tables = _snapshot(netns)
    assert NODEPORTS_JUMP in iptables
    assert "table ip kube-proxy" in tables

    said = netns.run([KUBEPROXY, "cleanup"]).stdout
    assert "removed nftables table ip kube-proxy" in said and "KUBE-SERVICES" in said
    iptables, tables = _snapshot(netns)
    assert (iptables, tables) == (foreign_iptables, foreign_tables)

    assert netns.run([KUBEPROXY, "cleanup"]).stdout.strip() == "nothing to remove"
