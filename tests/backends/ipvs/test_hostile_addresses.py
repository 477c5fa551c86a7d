"""IPVS mode and hostile addresses, on the package's fake node (the host kernel has no IPVS).

The live proxy in ipvs mode, dual-stack, syncs tests/e2e/test_hostile_addresses_kernel.py's world
twice: alone, and with its hostile objects (the zone injection as externalIP, endpoint and Node
address; externalIPs and endpoint addresses that are unspecified, loopback, link-local or
link-local multicast). `ipset restore` is not atomic (the lines before a bad one stay applied), so
the proof is on the input itself: every command and every stdin the backend hands to ipset,
ipvsadm, ip and iptables is recorded, and the hostile run's must be exactly the plain run's, and
contain none of the hostile text. The kernel-side check of the IPVS tools is tests/vm's.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.model.options import Family
from kubeproxy.proxy.live_loop import LiveProxy
from tests.e2e.test_dualstack import ADDR
from tests.e2e.test_hostile_addresses_kernel import FAMILIES, foreign_text, hostile, injected_node, world
from tests.live.served import Source
from tests.proxy.test_dualstack import nothing, run_proxy


@dataclass
class Recording:
    """The fake node, and every command (with its stdin) the proxy ran on it, in order."""

    fake: FakeNode = field(default_factory=FakeNode)
    calls: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the node's addresses in both families, as `ip -o addr show` lists them
        self.fake.ipvs.local_addresses = [("lo", "127.0.0.1"), *(("eth0", str(ADDR[f]["node"])) for f in FAMILIES)]

    def run(self, argv: Sequence[str], *, input: str | None = None, check: bool = True,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        self.calls.append((tuple(argv), input or ""))
        return self.fake.run(argv, input=input, check=check, timeout=timeout)

    def fed(self, *tools: str) -> str:
        """Everything handed to `tools`: their arguments and their stdin."""
        return "\n".join(" ".join(argv) + "\n" + stdin for argv, stdin in self.calls if argv[0] in tools)


IPVS_TOOLS = ("ipset", "ipvsadm", "ipvsadm-restore", "ip")
IPTABLES_TOOLS = ("iptables-restore", "ip6tables-restore", "iptables", "ip6tables")


def sync(objects: list[dict[str, Any]]) -> tuple[Recording, LiveProxy]:
    node = Recording()
    proxy = run_proxy("ipvs", node.run, objects, nothing)
    return node, proxy


def test_hostile_addresses_give_ipset_ipvsadm_and_ip_nothing(caplog: pytest.LogCaptureFixture) -> None:
    plain, plain_proxy = sync(world())
    objs, expected = hostile()
    caplog.set_level(logging.WARNING)
    spiked, proxy = sync([injected_node(), *world()[1:], *objs])

    assert [lane.family for lane in proxy.lanes] == list(FAMILIES)
    assert proxy.failed_syncs == 0 and plain_proxy.failed_syncs == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for kind, ref, field_ in [*expected, ("Node", "node-1", "status.addresses[2].address")]:
        assert any(f"{kind} {ref}:" in w and field_ in w for w in warnings), (kind, ref, field_, warnings)

    # The world is programmed in both families: the comparison below is not of two empty runs.
    ipvs = spiked.fed(*IPVS_TOOLS)
    for family in FAMILIES:
        assert f"[{ADDR[family]['a']}]" in ipvs or f"{ADDR[family]['a']}:" in ipvs, family
        assert str(ADDR[family]["ext"]) in ipvs, family

    # Exactly what the world alone gives, to every tool, in the same order; none of the hostile text.
    assert spiked.calls == plain.calls
    assert foreign_text(ipvs) == []
    assert foreign_text(spiked.fed(*IPTABLES_TOOLS)) == []
    assert spiked.fake.ipvs.sets == plain.fake.ipvs.sets
    assert spiked.fake.ipvs.table() == plain.fake.ipvs.table() and spiked.fake.ipvs.dummy == plain.fake.ipvs.dummy


def test_a_hostile_object_arriving_later_changes_nothing_the_ipvs_tools_get() -> None:
    node = Recording()
    objs, _ = hostile()

    async def body(proxy: LiveProxy, source: Source) -> None:
        done = proxy.syncs
        calls = len(node.calls)
        for obj in [*objs, injected_node()]:
            source.publish(obj, kind="ADDED" if obj["kind"] != "Node" else "MODIFIED")
        # a valid change after them, so that a sync is known to have run past them
        late = world()[-1]
        late["endpoints"][0]["addresses"] = [str(ADDR[Family.IPV6]["b"])]
        source.publish(late)
        await proxy.wait_for_syncs(done + 1)
        fed = "\n".join(" ".join(argv) + "\n" + stdin for argv, stdin in node.calls[calls:])
        assert str(ADDR[Family.IPV6]["b"]) in fed  # the valid change went through
        assert foreign_text(fed) == []
        assert proxy.failed_syncs == 0

    run_proxy("ipvs", node.run, world(), body)
