"""Random valid clusters plus one hostile-but-valid Service, in both modes, loaded in a real kernel.

The hostile Service is one the API server accepts but that pushes a limit: source ranges that
cover everything, overlap, contain the node or number in the thousands; the longest names and
port names; a hundred ports; every feature at once. For each seeded cluster and each mode:
the rules load into a fresh namespace, and the other Services' rules are exactly those of the
cluster without the hostile one (nothing of theirs removed or changed; everything added
belongs to the hostile Service). Addresses are never shared with another Service: a Service
claiming another's address is upstream's documented CVE-2020-8554 and behaves as upstream.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.backends.iptables.apply import restore
from kubeproxy.backends.iptables.render import render as render_iptables
from kubeproxy.backends.nftables.render import render as render_nft
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.lab import netns as L
from tests.backends.nftables.helpers import NODE, endpoint, options, port, service, slice_, view
from tests.backends.nftables.test_incremental import random_service

pytestmark = pytest.mark.root
NS63, NAME63, PORT15 = "n" + "-x" * 31, "s" + "-y" * 31, "p" + "-q" * 7  # the longest valid names


def _lb(
    name: str, ns: str = "evil", *, ports: list[dict[str, Any]] | None = None, eps: int = 1, **spec: Any
) -> list[dict[str, Any]]:
    ports = ports or [port("p", 80, nodePort=32100)]
    spec.setdefault("type", "LoadBalancer")
    spec.setdefault("status", {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}})
    objs = [service(ns, name, "172.31.0.9", *ports, **spec)]
    endpoints = [endpoint(f"10.99.0.{i + 1}", NODE if i % 2 else "node2") for i in range(eps)]
    objs.append(slice_(ns, name, endpoints, *[(p["name"], p["port"], p["protocol"]) for p in ports]))
    return objs


HOSTILE: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "everyone": lambda: _lb("everyone", loadBalancerSourceRanges=["0.0.0.0/0"]),
    "overlapping": lambda: _lb("overlap", loadBalancerSourceRanges=["10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32"]),
    "contains-node-and-vip": lambda: _lb("mine", loadBalancerSourceRanges=["192.168.0.0/16", "198.51.100.0/24"]),
    "longest-names-no-endpoints": lambda: _lb(
        NAME63, NS63, ports=[port(PORT15, 80, nodePort=32100)], eps=0, externalTrafficPolicy="Local",
        healthCheckNodePort=32101, sessionAffinity="ClientIP", loadBalancerSourceRanges=["10.0.0.0/8"],
    ),
    "longest-names-remote-endpoints": lambda: _lb(
        NAME63, NS63, ports=[port(PORT15, 80, nodePort=32100)], externalTrafficPolicy="Local", healthCheckNodePort=32101,
    ),
    "two-thousand-ranges": lambda: _lb(
        "ranges", loadBalancerSourceRanges=[str(ipaddress.ip_network((0x0B000000 + 4 * i, 31))) for i in range(2000)]
    ),
    "a-hundred-ports": lambda: _lb(
        "ports",
        ports=[port(f"p{i}", 1000 + i, "UDP" if i % 2 else "TCP", nodePort=32200 + i) for i in range(100)],
        sessionAffinity="ClientIP",
        eps=5,
    ),
    "everything": lambda: _lb(
        "all", externalIPs=["192.0.2.9"], sessionAffinity="ClientIP", internalTrafficPolicy="Local",
        externalTrafficPolicy="Local", healthCheckNodePort=32102, loadBalancerSourceRanges=["0.0.0.0/0", "10.0.0.0/8"],
        ports=[port("dns", 53, "UDP", nodePort=32100), port("dns-tcp", 53, nodePort=32103)], eps=3,
        annotations={"kubeproxy.io/udp-conntrack-timeout": "5s"},
    ),
}  # fmt: skip


def _cluster(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [obj for i in range(rng.randrange(3, 9)) for obj in random_service(rng, i)]


def _iptables_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line and not line.startswith(("#", "*", "COMMIT"))}


def _nft_elements(r: NftRendering) -> set[tuple[str, str, str | None]]:
    return {(name, key, e.value) for name, elements in r.elements.items() for key, e in elements.items()}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("seed", range(3))
def test_hostile_service_loads_and_leaves_the_others_alone(seed: int, hostile: str) -> None:
    others = _cluster(seed)
    bad = HOSTILE[hostile]()
    ns, name = bad[0]["metadata"]["namespace"], bad[0]["metadata"]["name"]
    opts = options()
    with_view, without_view = view([*others, *bad]), view(others)

    # iptables mode: every line the hostile Service adds names it (comments) or declares its chains
    with_text = render_iptables(with_view, opts).text
    without = _iptables_lines(render_iptables(without_view, opts).text)
    added = _iptables_lines(with_text) - without
    assert without <= _iptables_lines(with_text), "another service's rules changed"
    new_chains = {line[1:].split()[0] for line in added if line.startswith(":")}
    for line in added:
        assert line.startswith(":") or f"{ns}/{name}" in line or line.split()[1] in new_chains, line
    with L.netns("kph") as netns:
        restore(with_text, netns)
        assert f"{ns}/{name}" in netns.run(["iptables-save"]).stdout

    # nftables mode: the others' elements and chains are all there, unchanged
    with_nft, without_nft = render_nft(with_view, opts), render_nft(without_view, opts)
    assert _nft_elements(without_nft) <= _nft_elements(with_nft)
    assert all(with_nft.chains[c] == chain for c, chain in without_nft.chains.items())
    with L.netns("kph") as netns:
        netns.run(["nft", "-f", "-"], input=with_nft.text())
        listed = netns.run(["nft", "list", "table", "ip", "kube-proxy"]).stdout
        assert "198.51.100.9" in listed
