"""Every string field of a Service, EndpointSlice and Node, fed hostile values (item 3).

Each value is either refused, with a warning naming the object and the field (and the other
objects kept), or accepted harmlessly: the rules of both modes are exactly those rendered with an
ordinary value in its place. Never a traceback. The kernel side (that nothing else is loaded) is
the backends' test; this one proves no hostile string gets past the parser into rule text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.cluster.validation import options_for
from kubeproxy.model.proxy_config import ProxyConfig

HOSTILE = [
    '"', 'a"b', "'", "a\nb", "web\n-A INPUT -j ACCEPT\nCOMMIT", "a\r", "a\tb", "#", "a#b", ";", "a;b", "}", "a}b", "{",
    "a b", " a", "a ", "-A", "COMMIT", "\x00", "a\x00b", "é", "名前", "a\u202eb", "$(reboot)", "`x`", "a\\b", "a/b",
    "*", "a" * 65536,
]  # not "": an empty namespace is "default" and an empty field is unset, as kubectl has it

JSON = dict[str, Any]


def cluster() -> list[JSON]:
    """A node with one Service using every feature whose strings reach rules, and a bystander Service."""
    web: JSON = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "labels": {"app": "web"},
            "annotations": {"kubeproxy.io/udp-conntrack-timeout": "5s", "note": "x"},
        },
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "externalIPs": ["192.0.2.10"],
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
            "sessionAffinity": "ClientIP",
            "trafficDistribution": "PreferClose",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
            ],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10", "hostname": "lb.example.com"}]}},
    }
    web_slice: JSON = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.1.5"], "nodeName": "node-1", "zone": "zone-a", "hints": {"forZones": [{"name": "zone-a"}]}},
            {"addresses": ["10.244.2.5"], "nodeName": "node-2", "zone": "zone-b", "hints": {"forZones": [{"name": "zone-b"}]}},
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
    }
    node: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
    }
    bystander: JSON = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "bystander", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 443}]},
    }
    return [web, web_slice, node, bystander]


Setter = Callable[[list[JSON], str], None]


def at(index: int, *path: Any) -> Setter:
    def set_value(objs: list[JSON], value: str) -> None:
        target = objs[index]
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return set_value


def key_of(index: int, *path: Any) -> Setter:
    """Replace the map at `path` by {value: "x"}: the value is a key."""

    def set_key(objs: list[JSON], value: str) -> None:
        at(index, *path)(objs, {value: "x"})  # type: ignore[arg-type]

    return set_key


# (field as messages name it, how to set it, an ordinary value: None if every hostile value must be refused)
FIELDS: list[tuple[str, Setter, str | None]] = [
    ("metadata.namespace", at(0, "metadata", "namespace"), "other-ns"),
    ("metadata.name", at(0, "metadata", "name"), "other-name"),
    ("metadata.labels", key_of(0, "metadata", "labels"), "x"),
    ("metadata.labels[app]", at(0, "metadata", "labels", "app"), "x"),
    ("metadata.annotations", key_of(0, "metadata", "annotations"), "x"),
    # Annotation values are free text upstream; ours is read by the renderer, which ignores an invalid one.
    ("annotation udp-conntrack-timeout", at(0, "metadata", "annotations", "kubeproxy.io/udp-conntrack-timeout"), "bogus"),
    ("annotation note", at(0, "metadata", "annotations", "note"), "y"),
    ("spec.type", at(0, "spec", "type"), None),
    ("spec.clusterIP", at(0, "spec", "clusterIP"), None),
    ("spec.externalIPs[0]", at(0, "spec", "externalIPs", 0), None),
    ("spec.loadBalancerSourceRanges[0]", at(0, "spec", "loadBalancerSourceRanges", 0), None),
    ("spec.externalTrafficPolicy", at(0, "spec", "externalTrafficPolicy"), None),
    ("spec.sessionAffinity", at(0, "spec", "sessionAffinity"), None),
    ("spec.trafficDistribution", at(0, "spec", "trafficDistribution"), "SomethingElse"),
    ("spec.ports[0].name", at(0, "spec", "ports", 0, "name"), "other"),
    ("spec.ports[0].protocol", at(0, "spec", "ports", 0, "protocol"), None),
    ("status.loadBalancer.ingress[0].ip", at(0, "status", "loadBalancer", "ingress", 0, "ip"), None),
    ("status.loadBalancer.ingress[0].hostname", at(0, "status", "loadBalancer", "ingress", 0, "hostname"), "other.example.com"),
    ("EndpointSlice metadata.namespace", at(1, "metadata", "namespace"), "other-ns"),
    ("EndpointSlice metadata.name", at(1, "metadata", "name"), "web-2"),
    ("metadata.labels[kubernetes.io/service-name]", at(1, "metadata", "labels", "kubernetes.io/service-name"), "nothing"),
    ("addressType", at(1, "addressType"), None),
    ("endpoints[0].addresses[0]", at(1, "endpoints", 0, "addresses", 0), None),
    ("endpoints[0].nodeName", at(1, "endpoints", 0, "nodeName"), "node-9"),
    ("endpoints[0].zone", at(1, "endpoints", 0, "zone"), "zone-z"),
    ("endpoints[0].hints.forZones[0].name", at(1, "endpoints", 0, "hints", "forZones", 0, "name"), "zone-z"),
    ("EndpointSlice ports[0].name", at(1, "ports", 0, "name"), "other"),
    ("ports[0].protocol", at(1, "ports", 0, "protocol"), None),
    ("Node metadata.name", at(2, "metadata", "name"), "node-9"),
    ("metadata.labels[topology.kubernetes.io/zone]", at(2, "metadata", "labels", "topology.kubernetes.io/zone"), "zone-z"),
    ("status.addresses[0].address", at(2, "status", "addresses", 0, "address"), None),
    ("spec.podCIDR", at(2, "spec", "podCIDR"), None),
    ("spec.taints[0].key", at(2, "spec", "taints", 0, "key"), "other-taint"),
]

IPTABLES = ProxyConfig(hostname_override="node-1", cluster_cidr=("10.244.0.0/16",))
NFTABLES = ProxyConfig(mode="nftables", hostname_override="node-1", cluster_cidr=("10.244.0.0/16",))


def load(objs: list[JSON]) -> tuple[ClusterState, list[str]]:
    return build_state(objs, options_for(from_api_server=False))


def rules(state: ClusterState) -> tuple[str, str]:
    return render_iptables(state, IPTABLES).rendered.text, render_nftables(state, NFTABLES).rendering.text()


def test_the_cluster_is_valid_and_uses_every_field() -> None:
    state, warnings = load(cluster())
    assert warnings == []
    ipt, nft = rules(state)
    for needle in ("10.244.1.5", "198.51.100.10", "192.0.2.10", "203.0.113.0/24", "bystander", "udp-timeout-5s"):
        assert needle in ipt + nft
    assert "shop/web:http" in ipt and "shop/web:dns" in ipt
    assert "shop/web/tcp/http" in nft and "shop/web/udp/dns" in nft


@pytest.mark.parametrize(("field", "set_value", "ordinary"), FIELDS, ids=[f[0] for f in FIELDS])
def test_hostile_values_are_refused_by_name_or_harmless(field: str, set_value: Setter, ordinary: str | None) -> None:
    baseline: tuple[str, str] | None = None
    if ordinary is not None:
        objs = cluster()
        set_value(objs, ordinary)
        state, _ = load(objs)
        baseline = rules(state)
    field_name = field.removeprefix("EndpointSlice ").removeprefix("Node ")
    accepted = []
    for value in HOSTILE:
        objs = cluster()
        set_value(objs, value)
        state, warnings = load(objs)  # any exception here is a failure: never a traceback
        assert ("default", "bystander") in state.services  # the rest of the cluster is untouched
        assert all(len(w) < 1000 and "\n" not in w for w in warnings), warnings  # short, one line each
        if warnings:
            assert len(warnings) == 1, warnings
            if not field.startswith("annotation "):
                assert f": {field_name}" in warnings[0] or f"{field_name}: " in warnings[0], (value, warnings)
            continue
        accepted.append(value)
        assert ordinary is not None, f"{field}: {value!r} was accepted"
        assert rules(state) == baseline, f"{field}: {value!r} changed the rules"
    if ordinary is None:
        assert accepted == []
