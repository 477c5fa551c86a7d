"""Property: hostile text in any address or string field of a Service, EndpointSlice or Node never
reaches the rule text of any proxy mode (iptables, nftables, ipvs, userspace offline renderers).

A valid dual-stack world is built, one field is replaced by a hostile value (a zone suffix, a
newline, a quote, a NUL, non-ASCII, 64 KB) carrying a marker, and every mode renders the state:
the marker must be nowhere in the text. Bounded examples, fixed seed (derandomize).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeproxy.backends.registry import MODES, offline_renderer
from kubeproxy.cluster.state import build_state
from kubeproxy.model.contract import OfflineOptions
from kubeproxy.model.proxy_config import ProxyConfig

NODE = "node-1"
MARKER = "ZqPWNq"
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16", "fd00:10:244::/48"), min_sync_period=0.0, sync_period=30.0,
                  healthz_bind_address="", metrics_bind_address="", hostname_override=NODE)  # fmt: skip


def world() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
         "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
         "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"},
                                  {"type": "InternalIP", "address": "fd00:192::2"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                                                             "annotations": {"note": "x"}},
         "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                  "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}],
                  "externalIPs": ["203.0.113.7", "2001:db8::7"],
                  "loadBalancerSourceRanges": ["198.51.100.0/24", "2001:db8:1::/48"],
                  "externalTrafficPolicy": "Cluster", "sessionAffinity": "None", "trafficDistribution": "PreferClose"},
         "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9", "hostname": "lb.example.com"},
                                                 {"ip": "2001:db8::9"}]}}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-v4", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": NODE, "zone": "z1", "conditions": {"ready": True},
                        "hints": {"forZones": [{"name": "z1"}]}}],
         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-v6", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv6",
         "endpoints": [{"addresses": ["fd00:10:244:1::5"], "nodeName": NODE}],
         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]},
    ]  # fmt: skip


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every string leaf of `obj`, and every map key (marked by a final None)."""
    if isinstance(obj, str):
        return [path]
    out: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if path and path[-1] in ("labels", "annotations"):
                out.append((*path, key, None))  # the key itself
            out += _paths(value, (*path, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            out += _paths(value, (*path, index))
    return out


FIELDS = [(index, path) for index, obj in enumerate(world()) for path in _paths(obj)
          if path not in (("kind",), ("apiVersion",))]  # fmt: skip

HOSTILE_PREFIXES = ["fd00::99", "10.0.0.7", "fd00:96::10", "web", "", "10.244.1.5", "198.51.100.0/24"]
HOSTILE_SEPARATORS = ["%1", "%eth0", "%1\n-I KUBE-SERVICES 1 -j RETURN\n", "\n", '"', "'", "\x00", "ü", ";", " ", "}", "\\"]


@st.composite
def hostile(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(HOSTILE_PREFIXES)) + draw(st.sampled_from(HOSTILE_SEPARATORS)) + MARKER
    if draw(st.booleans()):
        text += draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=8))
    if draw(st.integers(0, 9)) == 0:
        text += "a" * 65536  # 64 KB
    return text


def _set(objects: list[dict[str, Any]], index: int, path: tuple[Any, ...], value: str) -> None:
    target: Any = objects[index]
    if path[-1] is None:  # replace a map key by the hostile text
        *head, key, _ = path
        for step in head:
            target = target[step]
        target[value] = target.pop(key)
        return
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def render_all(objects: list[dict[str, Any]]) -> dict[str, str]:
    state, _ = build_state(copy.deepcopy(objects))
    return {mode: offline_renderer(mode)(state, CFG, OfflineOptions()).text for mode in MODES}


def test_the_valid_world_renders_its_addresses_in_every_mode() -> None:
    # The property below would hold trivially if nothing rendered: every mode shows the world.
    for mode, text in render_all(world()).items():
        assert "10.96.0.10" in text and "203.0.113.7" in text, mode
        if mode != "userspace":  # the relay, not the rules, holds the endpoints
            assert "10.244.1.5" in text and "fd00:10:244:1::5" in text, mode


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=hostile())
def test_no_hostile_field_text_reaches_any_rendered_rules(field: tuple[int, tuple[Any, ...]], value: str) -> None:
    objects = world()
    _set(objects, *field, value)
    for mode, text in render_all(objects).items():
        assert MARKER not in text, (mode, field)
        assert "\x00" not in text and "%1" not in text and "%eth0" not in text, (mode, field)


def test_every_address_field_is_among_the_fields_tried() -> None:
    wanted = {("spec", "externalIPs", 0), ("spec", "clusterIPs", 1), ("status", "loadBalancer", "ingress", 0, "ip"),
              ("spec", "loadBalancerSourceRanges", 0), ("endpoints", 0, "addresses", 0), ("status", "addresses", 1, "address"),
              ("spec", "podCIDRs", 1), ("metadata", "name"), ("metadata", "namespace")}  # fmt: skip
    assert wanted <= {path for _, path in FIELDS}

