"""nodePortAddresses as upstream v1.37.2 has it: keywords, validation, each mode's default, and
the node IP that `primary` (and `render`) take, as `run` takes it.

Fixtures are upstream's test cases: pkg/proxy/apis/config/validation/validation_test.go
(TestValidateKubeProxyNodePortAddress), cmd/kube-proxy/app/server_test.go
(Test_expandNodePortAddressKeywords) and pkg/proxy/nftables/proxier_test.go (the expected
nodeport-ips lines of the fake proxier, whose nodePortAddresses are the node IPs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.backends import registry
from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cli import main
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.model.options import (
    Family,
    expand_nodeport_keywords,
    node_ip_by_family,
    node_options,
    nodeport_addresses,
)
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy.config import validate
from kubeproxy.proxy.flags import parse, resolve
from kubeproxy.proxy.startup import NO_NODE_IP, NODEPORT_ADDRESSES_UNSET, config_warnings, node_facts

MUST = "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"

# TestValidateKubeProxyNodePortAddress: (addresses, first refused index and upstream's detail, or None).
VALIDATION: list[tuple[list[str], tuple[int, str] | None]] = [
    ([], None),
    (["127.0.0.0/8"], None),
    (["0.0.0.0/0"], None),
    (["::/0"], None),
    (["127.0.0.1/32", "1.2.3.0/24"], None),
    (["127.0.0.1/32"], None),
    (["::1/128"], None),
    (["1.2.3.4/32"], None),
    (["10.20.30.0/24"], None),
    (["10.20.0.0/16", "100.200.0.0/16"], None),
    (["10.0.0.0/8"], None),
    (["2001:db8::/32"], None),
    (["primary"], None),
    (["localhost"], None),
    (["all"], None),
    (["primary", "localhost"], None),
    (["primary", "localhost", "all"], None),
    (["localhost", "localhost"], (1, 'Duplicate value: "localhost"')),
    (["primary", "10.0.0.0/8", "primary"], (2, 'Duplicate value: "primary"')),
    (["10.0.0.0/8", "10.0.0.0/8", "localhost"], None),
    (["all", "primary", "192.168.0.0/16", "localhost"], None),
    (["primary", "127.0.0.1/32"], None),
    (["Localhost"], (0, f'Invalid value: "Localhost": {MUST}')),
    (["primary", "locahost"], (1, f'Invalid value: "locahost": {MUST}')),
    (["foo"], (0, f'Invalid value: "foo": {MUST}')),
    (["10.0.0.0/0", "1.2.3"], (1, f'Invalid value: "1.2.3": {MUST}')),
    (["127.0.0.1/32", "0", "1.2.3.0/24"], (1, f'Invalid value: "0": {MUST}')),
    (["127.0.0.1/32", "10.20.30.40", "1.2.3.0/24"], (1, f'Invalid value: "10.20.30.40": {MUST}')),
    (["::0", "::1", "2001:db8::/32"], (0, f'Invalid value: "::0": {MUST}')),
    (["::1/128", "2001:db8::/32", "2001:db8:xyz/64"], (2, f'Invalid value: "2001:db8:xyz/64": {MUST}')),
]


@pytest.mark.parametrize(("addresses", "refused"), VALIDATION, ids=[",".join(a) or "none" for a, _ in VALIDATION])
def test_validation_is_upstreams(addresses: list[str], refused: tuple[int, str] | None) -> None:
    cfg = ProxyConfig(nodeport_addresses=tuple(addresses))
    if refused is None:
        validate(cfg)
        return
    index, detail = refused
    message = f"--nodeport-addresses (nodePortAddresses[{index}]): {detail}"
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        validate(cfg)


def test_the_flag_takes_keywords_and_cidrs_together() -> None:
    cfg = resolve(parse(["--nodeport-addresses=primary,localhost,10.0.0.0/8", "--proxy-mode=nftables"])).cfg
    assert cfg.nodeport_addresses == ("primary", "localhost", "10.0.0.0/8")
    with pytest.raises(ConfigError, match=re.escape('(nodePortAddresses[1]): Duplicate value: "all"')):
        resolve(parse(["--nodeport-addresses=all,all"]))


V4, V6 = "192.168.1.1", "fd00::1"
DUAL = {Family.IPV4: V4, Family.IPV6: V6}
IPV4_ONLY = {Family.IPV4: V4, Family.IPV6: "::1"}  # upstream's "no IPv6 node IP" is loopback
IPV6_ONLY = {Family.IPV4: "127.0.0.1", Family.IPV6: V6}

# Test_expandNodePortAddressKeywords
EXPANSION = [
    (["10.0.0.0/8", "fd01::/64"], DUAL, ["10.0.0.0/8", "fd01::/64"]),
    (["primary"], DUAL, ["192.168.1.1/32", "fd00::1/128"]),
    (["primary"], IPV4_ONLY, ["192.168.1.1/32"]),
    (["localhost"], DUAL, ["127.0.0.0/8", "::1/128"]),
    (["localhost"], IPV6_ONLY, ["127.0.0.0/8", "::1/128"]),
    (["all"], DUAL, ["0.0.0.0/0", "::/0"]),
    (["primary", "localhost"], DUAL, ["192.168.1.1/32", "fd00::1/128", "127.0.0.0/8", "::1/128"]),
    (["localhost", "10.0.0.0/8"], IPV4_ONLY, ["127.0.0.0/8", "::1/128", "10.0.0.0/8"]),
]


@pytest.mark.parametrize(("addresses", "node_ip", "expected"), EXPANSION)
def test_keywords_expand_as_upstreams(addresses: list[str], node_ip: dict[Family, str], expected: list[str]) -> None:
    assert expand_nodeport_keywords(addresses, node_ip) == expected
    assert expand_nodeport_keywords(addresses, {f: ip for f, ip in node_ip.items() if ip not in ("::1", "127.0.0.1")}) == expected


def test_each_modes_default_is_upstreams() -> None:
    # cmd/kube-proxy/app/server_linux.go platformApplyDefaults: nftables only.
    assert nodeport_addresses(ProxyConfig(mode="nftables"), registry.nodeport_traits("nftables")) == ("primary",)
    assert nodeport_addresses(ProxyConfig(mode="iptables"), registry.nodeport_traits("iptables")) == ()
    assert nodeport_addresses(ProxyConfig(mode="ipvs"), registry.nodeport_traits("ipvs")) == ()
    configured = ProxyConfig(mode="nftables", nodeport_addresses=("all",))
    assert nodeport_addresses(configured, registry.nodeport_traits("nftables")) == ("all",)
    # Upstream's "unset" warning follows the default: nftables mode has no such warning.
    unset = f"Kube-proxy configuration may be incomplete or incorrect: {NODEPORT_ADDRESSES_UNSET}"
    assert unset in config_warnings(ProxyConfig(mode="iptables"))
    assert unset not in config_warnings(ProxyConfig(mode="nftables"))


NODE = """
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 192.168.0.2}
  - {type: ExternalIP, address: 203.0.113.9}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns1}
spec:
  type: NodePort
  clusterIP: 172.30.0.41
  ports: [{name: p80, port: 80, protocol: TCP, nodePort: 3001}]
"""


def _state(tmp_path: Path, text: str = NODE) -> ClusterState:
    path = tmp_path / "objects.yaml"
    path.write_text(text)
    state, warnings = build_state(r.obj for r in load_manifests([path]))
    assert not warnings
    return state


def test_nftables_default_writes_upstreams_nodeport_ips_rules(tmp_path: Path) -> None:
    state = _state(tmp_path)
    cfg = validate(ProxyConfig(mode="nftables", hostname_override="node-a", service_node_port_range="1-65535"))
    text = render_nftables(state, cfg).rendering.text()
    # proxier_test.go's expectations for a proxier whose nodePortAddresses are the node IP.
    for line in (
        'add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }',
        "add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport "
        "vmap @no-endpoint-nodeports",
        "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "add element ip kube-proxy nodeport-ips { 192.168.0.2 }",
    ):
        assert line in text.splitlines(), line
    assert "fib daddr type local" not in text
    # `all` (or iptables' default everywhere) is every local address: upstream's fib rule, no set.
    everywhere = render_nftables(state, ProxyConfig(mode="nftables", hostname_override="node-a",
                                                    nodeport_addresses=("all",), service_node_port_range="1-65535"))
    text = everywhere.rendering.text()
    assert "add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport " \
           "vmap @service-nodeports" in text.splitlines()
    assert "nodeport-ips" not in text


def test_primary_is_each_familys_node_ip_and_nothing_for_a_family_without_one(tmp_path: Path) -> None:
    state = _state(tmp_path)
    node = state.nodes["node-a"]
    cfg = ProxyConfig(mode="nftables")
    nft = registry.nodeport_traits("nftables")
    v4 = node_options(cfg, family=Family.IPV4, hostname="node-a", node=node, nodeports=nft)
    assert (v4.nodeport_match_all, v4.nodeport_ips) == (False, ("192.168.0.2",))  # not the ExternalIP
    v6 = node_options(cfg, family=Family.IPV6, hostname="node-a", node=node, nodeports=nft)
    assert v6.nodeport_match_all  # upstream: no CIDR of the family is the zero CIDR
    iptables = node_options(ProxyConfig(mode="iptables"), family=Family.IPV4, hostname="node-a", node=node)
    assert iptables.nodeport_match_all
    # No node IP at all: `primary` leaves nothing, which upstream takes as every address, and says so.
    lost = node_facts(cfg, None)
    assert NO_NODE_IP in lost.warnings and any(NODEPORT_ADDRESSES_UNSET in w for w in lost.warnings)
    assert node_options(cfg, family=Family.IPV4, hostname="x", node=None, nodeports=nft).nodeport_match_all


def test_localhost_and_cidrs_select_local_addresses_as_upstream(tmp_path: Path) -> None:
    node = _state(tmp_path).nodes["node-a"]
    opts = node_options(ProxyConfig(mode="iptables", nodeport_addresses=("localhost", "203.0.113.0/24")),
                        family=Family.IPV4, hostname="node-a", node=node)
    assert not opts.nodeport_match_all and set(opts.nodeport_ips) == {"127.0.0.1", "203.0.113.9"}
    assert opts.localhost_nodeports  # the list holds IPv4 loopback
    loopback_host = node_options(ProxyConfig(mode="iptables", nodeport_addresses=("127.0.0.5/32",)),
                                 family=Family.IPV4, hostname="node-a", node=node)
    assert loopback_host.localhost_nodeports  # upstream: a CIDR whose address is loopback counts


def test_render_and_run_take_the_same_node_ip(tmp_path: Path) -> None:
    state = _state(tmp_path)
    node = state.nodes["node-a"]
    config = tmp_path / "config.yaml"
    for bind, expected in (("0.0.0.0", "192.168.0.2"), ("10.9.9.9", "10.9.9.9")):
        config.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                          f"mode: nftables\nbindAddress: {bind}\nhostnameOverride: node-a\nclusterCIDR: 10.0.0.0/8\n")
        run_cfg = resolve(parse([f"--config={config}"])).cfg
        assert node_ip_by_family(run_cfg, node)[Family.IPV4] == expected
        assert node_facts(run_cfg, node).ips[0] == expected
        manifests = tmp_path / "objects.yaml"
        result = CliRunner().invoke(main, ["render", "--manifests", str(manifests), "--config", str(config),
                                           "--service-node-port-range", "1-65535"])
        assert result.exit_code == 0, result.output
        assert NO_NODE_IP not in result.output
        assert f"add element ip kube-proxy nodeport-ips {{ {expected} }}" in result.stdout.splitlines()


# Test_checkBadConfig: (clusterCIDRs, nodePortAddresses, node IP of the primary family, warned).
BAD_CONFIG = [
    (("10.0.0.0/8",), ("192.168.0.0/24",), "192.168.0.2", False),
    (("10.0.0.0/8", "fd09::/64"), ("192.168.0.0/24", "fd03::/64"), "192.168.0.2", False),
    (("10.0.0.0/8", "fd09::/64"), ("192.168.0.0/24",), "192.168.0.2", True),
    (("fd09::/64",), ("192.168.0.0/24",), "fd03::2", True),
]


@pytest.mark.parametrize(("cluster_cidr", "addresses", "node_ip", "warned"), BAD_CONFIG)
def test_families_left_out_are_warned_as_upstream(
    cluster_cidr: tuple[str, ...], addresses: tuple[str, ...], node_ip: str, warned: bool
) -> None:
    cfg = validate(ProxyConfig(cluster_cidr=cluster_cidr, nodeport_addresses=addresses, node_ip=node_ip))
    found = [w for w in node_facts(cfg, None).warnings if "nodePortAddresses contains only" in w]
    assert bool(found) is warned, found
    # nftables mode's default on a dual-stack node covers both families: nothing to say.
    dual = validate(ProxyConfig(mode="nftables", cluster_cidr=cluster_cidr, node_ip="192.168.0.2,fd03::2"))
    assert not [w for w in node_facts(dual, None).warnings if "nodePortAddresses" in w]
