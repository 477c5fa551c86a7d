"""The tracer follows packets through our nftables table (`nft -j list ruleset`) and agrees with the kernel.

The table is applied by NftApplier into the node of a client -- node -- pods bed, dumped with
`nft -j list ruleset`, parsed by kubeproxy.netfilter.nft_json and walked by
kubeproxy.netfilter.simulate; real packets then check every predicted outcome and its frequency.

Our selector maps have a concatenated *data* type (`: ipv4_addr . inet_service`), which nft 1.0.6
prints as one string where it prints a concatenated key type as a list; the tracer reads both.
"""

from __future__ import annotations

import pytest

from kubeproxy.backends.nftables.apply import NftApplier
from kubeproxy.backends.nftables.render import render
from kubeproxy.netfilter import nft_json
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace
from tests.backends.nftables.helpers import options, view
from tests.backends.nftables.test_kernel import NODE_OPTIONS, NODE_VIEW
from tests.netfilter.kernel_bed import assert_kernel_agrees, bed

pytestmark = pytest.mark.root

BED = {
    "client_ip": "172.16.0.2/24",
    "node_front": ("eth0", "172.16.0.1/24"),
    "node_back": ("eth1", "10.244.0.1/16"),
    "backends": ["10.244.1.10/16", "10.244.2.10/16", "10.244.1.3/16"],
}


@pytest.mark.parametrize(
    ("proto", "dst", "count", "from_node"),
    [
        ("tcp", "10.96.10.10:80", 300, False),  # ClusterIP, two endpoints, off-cluster client: masqueraded
        ("tcp", "172.16.0.1:30080", 100, False),  # NodePort
        ("tcp", "10.96.10.10:80", 100, True),  # from the node itself (nat-output)
        ("tcp", "10.96.40.40:80", 5, False),  # no endpoints: rejected
        ("udp", "10.96.0.10:53", 20, False),  # UDP ClusterIP (with its own conntrack timeout)
    ],
    ids=["cluster-ip", "nodeport", "cluster-ip-from-node", "no-endpoints", "udp"],
)
def test_tracer_agrees_with_the_kernel_on_our_table(proto: str, dst: str, count: int, from_node: bool) -> None:
    with bed(**BED) as b:  # type: ignore[arg-type]
        NftApplier("ip", b.node).apply(render(view(NODE_VIEW, node="node"), options(**NODE_OPTIONS)))
        b.serve(b.backend, "tcp", ["10.244.1.10:8080", "10.244.2.10:8080"])
        b.serve(b.backend, "udp", ["10.244.1.3:53"])
        rs = nft_json.parse(b.node.run(["nft", "-j", "list", "ruleset"]).stdout)
        src = "172.16.0.1" if from_node else b.client_ip
        res = trace(rs, b.model, make_packet(proto, src, dst, in_iface=None if from_node else "eth0"))
        observed = b.send(proto, dst, count, timeout=0.5, from_node=from_node)
    assert_kernel_agrees(res.outcomes, observed)
    if dst == "10.96.10.10:80" and not from_node:
        assert {o.dnat for o in res.outcomes} == {(0x0AF4010A, 8080), (0x0AF4020A, 8080)}
        assert all(o.masquerade for o in res.outcomes)
        hops = [h.chain for h in res.outcomes[0].path]
        assert list(dict.fromkeys(c for c in hops if c in ("services", "cluster-endpoints-2"))) == [
            "services",
            "cluster-endpoints-2",
        ]


def test_tracer_reads_concatenated_map_data_types(netns) -> None:  # type: ignore[no-untyped-def]
    netns.run(["nft", "-f", "-"], input=render(view(NODE_VIEW, node="node"), options(**NODE_OPTIONS)).text())
    rs = nft_json.parse(netns.run(["nft", "-j", "list", "ruleset"]).stdout)
    table = rs.table("kube-proxy", "ip")
    assert table is not None
    selector = table.sets["cluster-endpoints-2"]
    assert selector.data_type == ("ipv4_addr", "inet_service")
    assert sorted(selector.mapping.values()) == [(0x0AF4010A, 8080), (0x0AF4020A, 8080)]
