"""The lab reads a node's rules with the reader its mode's record names (lab/node_rules.py):
no root, a recording `run` in place of the node."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from kubeproxy.backends import registry
from kubeproxy.lab import node_rules
from kubeproxy.lab.builders import Port, service

WEB = service("web", "10.96.0.10", [Port("http", 80, 8080)])


@dataclass
class Recording:
    """A node whose every command answers `out`, and the commands it was asked."""

    out: str = ""
    argvs: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        self.argvs.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, self.out, "")


def test_the_lab_reads_every_mode_whose_record_names_a_reader() -> None:
    assert set(node_rules.KNOWN_MODES) == {"iptables", "nftables", "ipvs", "userspace"}
    # The host's beds: not ipvs (a kernel module the host lacks), not the relaying userspace mode.
    assert node_rules.MODES == ("iptables", "nftables")


@pytest.mark.parametrize(
    ("mode", "first"),
    [
        ("iptables", ["iptables-save", "-t", "nat"]),
        ("nftables", ["nft", "-j", "list", "table", "ip", "kube-proxy"]),
        ("ipvs", ["ipvsadm-save", "-n"]),
        ("userspace", ["readlink", "/proc/self/ns/net"]),
    ],
)
def test_each_mode_is_read_with_its_own_dump(mode: str, first: list[str]) -> None:
    run = Recording()
    rules = node_rules.read(mode, run, [WEB])
    assert rules.endpoints("default/web:http") == set()
    assert run.argvs[0] == first


def test_a_mode_without_a_reader_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    toy = registry.Mode("toy", registry.MODES["iptables"].create, "toy.offline", lambda run, family: [], lambda variant: ())
    monkeypatch.setitem(registry.MODES, "toy", toy)
    with pytest.raises(ValueError, match="proxy mode 'toy': the lab reads back only iptables, nftables"):
        node_rules.read("toy", Recording())
