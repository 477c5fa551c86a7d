"""A nodePortAddresses CIDR in a real kernel, live proxy: the node holds two addresses its Node
object does not list, the CIDR covers one, and real traffic to the NodePort is proxied on that one
only, in iptables and nftables modes (upstream matches the CIDRs against the interfaces' addresses,
not the Node's). IPVS mode takes the same addresses (tests/proxy/test_nodeport_interfaces.py, on the
fake node): this machine's kernel has no IPVS.

The node runs its own listener on the NodePort too: a packet the rules do not take reaches it,
so both outcomes are positive answers (no waiting to show that nothing happened).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source
from tests.netfilter.kernel_bed import bed
from tests.proxy.test_dualstack import CFG, endpoints, node, run_proxy, service

pytestmark = pytest.mark.root

NODE_IP, BACKEND = "172.16.0.1", "10.244.1.10"
SELECTED, UNSELECTED = "10.77.0.5", "10.78.0.5"  # on the node's eth0, not in the Node object
NODE_PORT = 30080


def _objects() -> list[dict[str, Any]]:
    web = service("web", ["10.96.0.10"], type="NodePort")
    web["spec"]["ports"][0]["nodePort"] = NODE_PORT
    return [node(NODE_IP), web, endpoints("web", "IPv4", BACKEND)]


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_nodeport_answers_on_the_interface_address_the_cidr_covers(mode: str) -> None:
    got: dict[str, list[object]] = {}
    cfg = replace(CFG, cluster_cidr=("10.244.0.0/16",), nodeport_addresses=("10.77.0.0/24",))
    with bed("172.16.0.2/24", ("eth0", f"{NODE_IP}/24"), ("eth1", "10.244.0.1/16"), [f"{BACKEND}/16"]) as b:
        for ip in (SELECTED, UNSELECTED):
            b.node.run(["ip", "addr", "add", f"{ip}/32", "dev", "eth0"])
        b.serve(b.backend, "tcp", [f"{BACKEND}:8080"])
        b.serve(b.node, "tcp", [f"0.0.0.0:{NODE_PORT}"])

        async def body(proxy: LiveProxy, source: Source) -> None:
            assert proxy.failed_syncs == 0
            for ip in (SELECTED, UNSELECTED, NODE_IP):
                got[ip] = await asyncio.to_thread(b.send, "tcp", f"{ip}:{NODE_PORT}", 3)

        run_proxy(mode, b.node, _objects(), body, cfg=cfg)
    assert [r["dst"] for r in got[SELECTED]] == [f"{BACKEND}:8080"] * 3  # type: ignore[index]
    # Neither the other interface address nor the Node's own address is in the CIDR.
    assert [r["dst"] for r in got[UNSELECTED]] == [f"{UNSELECTED}:{NODE_PORT}"] * 3  # type: ignore[index]
    assert [r["dst"] for r in got[NODE_IP]] == [f"{NODE_IP}:{NODE_PORT}"] * 3  # type: ignore[index]
