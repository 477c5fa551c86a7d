"""ServiceCIDR objects: validated as the API server does, watched by both sources, and in nftables
mode the drop of unallocated addresses in them (upstream v1.37.2 pkg/proxy/nftables/proxier_test.go:
`cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"`,
and TestProxier_OnServiceCIDRsChanged for the split by family)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.servicecidr import parse_service_cidr
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.model.options import Family, node_options
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.files import KINDS
from tests.live.served import Source, serve_with
from tests.live.test_live import _service
from tests.live.test_live_fake import CFG

DROP_COMMENT = 'comment "Drop traffic to unallocated ClusterIPs"'


def service_cidr(name: str, *cidrs: Any, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name, **meta},
        "spec": {"cidrs": list(cidrs)},
    }


# ------------------------------------------------------------------ the object


@pytest.mark.parametrize(
    "cidrs",
    [["10.96.0.0/12"], ["fd00:10:96::/112"], ["10.96.0.0/12", "fd00:10:96::/112"], ["fd00::/108", "192.168.0.0/24"]],
)
def test_valid_service_cidrs(cidrs: list[str]) -> None:
    parsed = parse_service_cidr(service_cidr("kubernetes", *cidrs))
    assert [str(c) for c in parsed.cidrs] == cidrs and parsed.name == "kubernetes"


@pytest.mark.parametrize(
    ("obj", "field", "problem"),
    [
        (service_cidr("a"), "spec.cidrs", "at least one CIDR required"),
        (service_cidr("a", "10.0.0.0/24", "fd00::/64", "10.1.0.0/24"), "spec.cidrs", "may only hold up to 2 values"),
        (service_cidr("a", "10.0.0.0/24", "10.1.0.0/24"), "spec.cidrs", "no more than one IP for each IP family"),
        (service_cidr("a", "fd00::/64", "fd01::/64"), "spec.cidrs", "no more than one IP for each IP family"),
        (service_cidr("a", "10.96.0.1/12"), "spec.cidrs[0]", 'must be in canonical form ("10.96.0.0/12")'),
        (service_cidr("a", "FD00::/64"), "spec.cidrs[0]", "must be in canonical form"),
        (service_cidr("a", "010.96.0.0/12"), "spec.cidrs[0]", "must be a valid CIDR value"),
        (service_cidr("a", "10.96.0.0"), "spec.cidrs[0]", "must be in canonical form"),
        (service_cidr("a", "::ffff:10.96.0.0/108"), "spec.cidrs[0]", "IPv4-mapped"),
        (service_cidr("a", "nonsense"), "spec.cidrs[0]", "must be a valid CIDR value"),
        (service_cidr("a", 7), "spec.cidrs[0]", "expected a string"),
        (service_cidr("Bad_Name", "10.0.0.0/24"), "metadata.name", ""),
        (service_cidr("a", "10.0.0.0/24", namespace="default"), "metadata.namespace", "not allowed on this type"),
    ],
)
def test_what_the_api_server_refuses_is_refused_naming_the_field(obj: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ObjectError) as err:
        parse_service_cidr(obj)
    assert err.value.kind == "ServiceCIDR" and err.value.field == field and problem in err.value.problem


def test_the_state_keeps_every_cidr_while_some_object_lists_it() -> None:
    state = ClusterState()
    assert state.apply(service_cidr("kubernetes", "10.96.0.0/16", "fd00:10:96::/112")) is None
    assert state.apply(service_cidr("extra", "10.97.0.0/16")) is None
    assert state.apply(service_cidr("same", "10.96.0.0/16")) is None
    assert state.service_cidr_list() == ("10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112")
    assert state.apply(service_cidr("same", "10.96.0.0/16"), deleted=True) is None
    assert "10.96.0.0/16" in state.service_cidr_list()  # "kubernetes" still lists it
    warning = state.apply(service_cidr("extra", "10.97.0.1/16"))
    assert warning is not None and "ServiceCIDR extra: spec.cidrs[0]" in warning
    assert "10.97.0.0/16" in state.service_cidr_list()  # a refused update keeps the last good one


def test_both_sources_read_service_cidrs(tmp_path: Path) -> None:
    assert "ServiceCIDR" in KINDS
    path = tmp_path / "cidrs.yaml"
    path.write_text("kind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16]}\n")
    state, warnings = build_state(r.obj for r in load_manifests([path]))
    assert not warnings and state.service_cidr_list() == ("10.96.0.0/16",)
    source = ApiSource(None, "node-1", lambda event: None)  # type: ignore[arg-type]
    paths = [r.spec.path for r in source.reflectors]
    assert "/apis/networking.k8s.io/v1/servicecidrs" in paths


# ------------------------------------------------------------------ the rules


def test_options_take_their_family_of_the_cidrs() -> None:
    cidrs = ["172.30.0.0/16", "172.50.0.0/16", "fd00:10:96::/112", "fd00:172:30::/112"]
    cfg = ProxyConfig(mode="nftables", hostname_override="node-1")
    v4 = node_options(cfg, family=Family.IPV4, hostname="node-1", node=None, service_cidrs=cidrs)
    v6 = node_options(cfg, family=Family.IPV6, hostname="node-1", node=None, service_cidrs=cidrs)
    assert v4.service_cidrs == ("172.30.0.0/16", "172.50.0.0/16")
    assert v6.service_cidrs == ("fd00:10:96::/112", "fd00:172:30::/112")


def test_render_drops_unallocated_addresses_of_the_manifests_service_cidrs(tmp_path: Path) -> None:
    state = ClusterState()
    state.apply(service_cidr("kubernetes", "172.30.0.0/16", "fd00:10:96::/112"))
    cfg = ProxyConfig(mode="nftables", hostname_override="node-1", node_ip="192.168.0.2")
    text = render_nftables(state, cfg).rendering.text()
    assert f"add rule ip kube-proxy cluster-ips-check ip daddr {{ 172.30.0.0/16 }} drop {DROP_COMMENT}" in text
    v6 = render_nftables(state, cfg, family=Family.IPV6).rendering.text()
    assert f"add rule ip6 kube-proxy cluster-ips-check ip6 daddr {{ fd00:10:96::/112 }} drop {DROP_COMMENT}" in v6
    assert "drop" not in render_nftables(ClusterState(), cfg).rendering.text().split("cluster-ips-check", 2)[-1].split("\n")[0]


def _cluster_check(node: FakeNode) -> tuple[str, ...]:
    table = node.nft.table()
    assert table is not None
    return tuple(table.chains["cluster-ips-check"].rules)


def test_a_new_service_cidr_takes_effect_at_the_next_sync_without_a_restart() -> None:
    node = FakeNode()

    async def body(proxy: LiveProxy, source: Source) -> None:
        rules = _cluster_check(node)
        assert any("10.96.0.0/16" in r and "drop" in r for r in rules), rules
        assert not any("10.100.0.0/16" in r for r in rules)
        synced = proxy.syncs
        source.publish(service_cidr("more", "10.100.0.0/16"), kind="ADDED")
        await asyncio.wait_for(proxy.wait_for_syncs(synced + 1), 10)
        rules = _cluster_check(node)
        assert any("10.96.0.0/16" in r and "10.100.0.0/16" in r and "drop" in r for r in rules), rules
        synced = proxy.syncs
        source.publish(service_cidr("more", "10.100.0.0/16"), kind="DELETED")
        await asyncio.wait_for(proxy.wait_for_syncs(synced + 1), 10)
        rules = _cluster_check(node)
        assert not any("10.100.0.0/16" in r for r in rules) and any("10.96.0.0/16" in r for r in rules), rules
        assert "10.244.1.61" in repr(node.nft.table())  # the Service's rules stay throughout

    serve_with(lambda: LiveProxy(replace(CFG, mode="nftables"), "node-1", run_cmd=node),
               [*_service("web", "10.96.6.1", ["10.244.1.61"]), service_cidr("kubernetes", "10.96.0.0/16")], body)  # fmt: skip
