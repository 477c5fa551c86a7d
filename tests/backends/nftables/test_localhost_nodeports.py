"""KubeProxyNFTablesLocalhostNodePorts in the rendered table, against upstream v1.37.2's
pkg/proxy/nftables/proxier_test.go expectations (lines 515-528: the reject map, the named
counters, one reject chain per protocol, the loopback rule in nodeport-endpoints-check)."""

from __future__ import annotations

import pytest

from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.state import ClusterState
from kubeproxy.lab.builders import Port, service
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import validate

GATE = "KubeProxyNFTablesLocalhostNodePorts"
UPSTREAM_BASE = [
    'add map {f} kube-proxy localhost-nodeport-reject-ports { type inet_proto . inet_service : verdict ; comment "localhost NodePorts rejected by kube-proxy" ; }',  # noqa: E501
    "add rule {f} kube-proxy nodeport-endpoints-check {loopback} meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
]


def _text(gate: bool, addresses: tuple[str, ...], family: Family = Family.IPV4) -> str:
    state = ClusterState()
    ports = [Port("http", 80, 8080, node_port=3001), Port("dns", 53, 53, "UDP", node_port=3002)]
    assert state.apply(service("web", "172.30.0.41", ports, type="NodePort")) is None
    cfg = validate(ProxyConfig(mode="nftables", hostname_override="node-1", node_ip="192.168.0.2,fd00::2",
                               nodeport_addresses=addresses, feature_gates={GATE: gate}))  # fmt: skip
    return render_nftables(state, cfg, family=family).rendering.text()


def _expected(family: Family, protocols: tuple[str, ...]) -> list[str]:
    f = family.nft
    loopback = "ip6 daddr ::1" if family.ipv6 else "ip daddr 127.0.0.0/8"
    lines = [line.replace("{f}", f).replace("{loopback}", loopback) for line in UPSTREAM_BASE]
    for p in protocols:
        lines += [
            f"add counter {f} kube-proxy localhost-nodeport-rejected-{p}",
            f"add chain {f} kube-proxy localhost-nodeport-reject-{p}",
            f'add rule {f} kube-proxy localhost-nodeport-reject-{p} counter name "localhost-nodeport-rejected-{p}" reject',
        ]
    return lines


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
def test_without_loopback_in_nodeport_addresses_every_protocol_is_rejected(family: Family) -> None:
    text = _text(True, ("primary",), family)
    for line in _expected(family, ("tcp", "udp", "sctp")):
        assert line in text
    if not family.ipv6:  # the Service is IPv4: its NodePorts are elements of the IPv4 table only
        assert "tcp . 3001 : goto localhost-nodeport-reject-tcp" in text
        assert "udp . 3002 : goto localhost-nodeport-reject-udp" in text


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
def test_with_loopback_tcp_is_left_to_the_listener(family: Family) -> None:
    text = _text(True, ("localhost", "primary"), family)
    for line in _expected(family, ("udp", "sctp")):
        assert line in text
    assert "localhost-nodeport-reject-tcp" not in text and "localhost-nodeport-rejected-tcp" not in text
    if not family.ipv6:
        assert "udp . 3002 : goto localhost-nodeport-reject-udp" in text


def test_gate_off_renders_nothing_of_it() -> None:
    assert "localhost-nodeport" not in _text(False, ("localhost", "primary"))
