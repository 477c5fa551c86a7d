"""nodePortAddresses CIDRs select among the node's interface addresses in the live proxy, as
upstream's proxiers do (NodePortAddresses.GetNodeIPs over net.InterfaceAddrs, at every sync):
addresses the Node object does not list take NodePorts when a CIDR covers them. On the package's
fake node (no root); tests/e2e/test_nodeport_interfaces_kernel.py sends real packets.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source
from tests.proxy.test_dualstack import CFG, endpoints, node, run_proxy, service

NODE_IP = "192.168.0.2"  # the Node object's only address, on eth0
SELECTED = ("10.20.0.5", "10.20.0.6")  # on eth1, inside the CIDR, not in the Node object
OTHER = "172.30.0.9"  # on eth2, outside it
CIDR = "10.20.0.0/16"
NODE_PORT = 30080
ADDR_SHOW = ["ip", "-o", "addr", "show"]


def _interfaces(fake: FakeNode, *extra: tuple[str, str]) -> None:
    fake.ipvs.local_addresses[:] = [
        ("lo", "127.0.0.1"), ("lo", "::1"), ("eth0", NODE_IP), ("eth0", "fe80::1"),
        ("eth1", SELECTED[0]), ("eth1", SELECTED[1]), ("eth2", OTHER), *extra,
    ]  # fmt: skip


def _objects() -> list[dict[str, Any]]:
    web = service("web", ["10.96.0.10"], type="NodePort")
    web["spec"]["ports"][0]["nodePort"] = NODE_PORT
    return [node(NODE_IP), web, endpoints("web", "IPv4", "10.244.1.5")]


def _opts(proxy: LiveProxy) -> NodeOptions:
    """The primary lane's options of the last sync."""
    opts = proxy.lanes[0].opts
    assert opts is not None
    return opts


def nodeport_addresses(fake: FakeNode, mode: str) -> set[str]:
    """The IPv4 addresses the programmed rules take NodePort traffic on."""
    if mode == "ipvs":
        return {vs.address for vs in fake.ipvs.table() if vs.port == NODE_PORT}
    if mode == "nftables":
        table = fake.nft.table(Family.IPV4.nft)
        assert table is not None
        return set(table.sets["nodeport-ips"].elements)
    text = fake.iptables.run(["iptables-save"]).stdout
    jumps = [line.split() for line in text.splitlines() if line.startswith("-A KUBE-SERVICES ")]
    return {words[words.index("-d") + 1].removesuffix("/32") for words in jumps
            if words[-1] == "KUBE-NODEPORTS" and "-d" in words}  # fmt: skip


@pytest.mark.parametrize("mode", ["iptables", "nftables", "ipvs"])
def test_a_cidr_selects_the_interface_addresses_it_covers_at_every_sync(mode: str) -> None:
    fake = FakeNode()
    _interfaces(fake)
    seen: dict[str, set[str]] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        seen["first"] = nodeport_addresses(fake, mode)
        assert set(_opts(proxy).nodeport_ips) == set(SELECTED)
        # An address added to an interface between syncs is taken at the next one.
        _interfaces(fake, ("eth3", "10.20.9.9"))
        source.publish(endpoints("web", "IPv4", "10.244.1.6"))
        await proxy.wait_for_syncs(2)
        seen["after"] = nodeport_addresses(fake, mode)

    run_proxy(mode, fake.run, _objects(), body, cfg=replace(CFG, nodeport_addresses=(CIDR,)))
    assert seen["first"] == set(SELECTED)  # not the Node's address, nor eth2's
    assert seen["after"] == {*SELECTED, "10.20.9.9"}


@pytest.mark.parametrize(
    ("mode", "keywords", "selected"),
    [
        ("nftables", (), {NODE_IP}),  # nftables' default, `primary`: the node IP's interface address
        ("nftables", ("primary", CIDR), {NODE_IP, *SELECTED}),
        ("iptables", ("localhost", CIDR), {"127.0.0.1", *SELECTED}),
    ],
    ids=["primary-default", "primary-and-cidr", "localhost-and-cidr"],
)
def test_keywords_select_as_before(mode: str, keywords: tuple[str, ...], selected: set[str]) -> None:
    fake = FakeNode()
    _interfaces(fake)
    got: dict[str, set[str]] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        got["opts"] = set(_opts(proxy).nodeport_ips)

    run_proxy(mode, fake.run, _objects(), body, cfg=replace(CFG, nodeport_addresses=keywords))
    assert got["opts"] == selected


@pytest.mark.parametrize(("mode", "keywords"), [("iptables", ()), ("nftables", ("all",))])
def test_every_address_needs_no_interface_list(mode: str, keywords: tuple[str, ...]) -> None:
    """Upstream reads the interfaces only when CIDRs select among them."""
    fake = FakeNode()
    _interfaces(fake)
    got: dict[str, object] = {}

    async def body(proxy: LiveProxy, source: Source) -> None:
        got["match_all"] = _opts(proxy).nodeport_match_all

    run_proxy(mode, fake.run, _objects(), body, cfg=replace(CFG, nodeport_addresses=keywords))
    assert got["match_all"] is True
    assert fake.ipvs.calls.count(ADDR_SHOW) == 0


def test_a_failed_read_keeps_the_addresses_last_read(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNode()
    _interfaces(fake)
    failing = {"on": False}

    def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if failing["on"] and list(argv) == ADDR_SHOW:
            raise subprocess.CalledProcessError(1, list(argv), "", "Cannot open netlink socket")
        return fake.run(argv, **kwargs)

    async def body(proxy: LiveProxy, source: Source) -> None:
        failing["on"] = True
        source.publish(endpoints("web", "IPv4", "10.244.1.6"))
        await proxy.wait_for_syncs(2)

    with caplog.at_level(logging.ERROR, logger="kubeproxy.proxy"):
        proxy = run_proxy("nftables", run, _objects(), body, cfg=replace(CFG, nodeport_addresses=(CIDR,)))
    assert proxy.failed_syncs == 0
    assert set(_opts(proxy).nodeport_ips) == set(SELECTED)
    assert nodeport_addresses(fake, "nftables") == set(SELECTED)
    assert any("Failed to get node ip address matching nodeport cidrs" in r.getMessage() for r in caplog.records)
