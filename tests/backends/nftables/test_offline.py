"""`kubeproxy render --proxy-mode nftables` support: the same node, family and options as iptables mode."""

from __future__ import annotations

from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.manifest_load import load
from kubeproxy.model.proxy_config import ProxyConfig
from tests.paths import DEMO


def test_demo_renders() -> None:
    loaded = load([str(DEMO)])
    out = render_nftables(loaded.state, ProxyConfig(cluster_cidr=("10.244.0.0/16",)))
    text = out.rendering.text()
    assert text.startswith("add table ip kube-proxy")
    assert '10.96.10.10 . tcp . 80 comment "default/web:http" : goto cluster-endpoints-2' in text
    assert out.rendering.warnings == ()


def test_service_cidrs_are_passed_through() -> None:
    loaded = load([str(DEMO)])
    out = render_nftables(loaded.state, ProxyConfig(cluster_cidr=("10.244.0.0/16",)), service_cidrs=("10.96.0.0/12",))
    assert 'ip daddr { 10.96.0.0/12 } drop comment "Drop traffic to unallocated ClusterIPs"' in out.rendering.text()
