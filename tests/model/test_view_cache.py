"""The incremental node view: `ViewBuilder.update` must always equal `build_view`.

Random edit sequences (Services and EndpointSlices added, changed, relabelled, deleted, ignored
by label or rejected as invalid; Node changes; syncs for either family and node) go through a
ChangeTracker into one ClusterState; at every sync the builder's view, fed the tracker's pending
set, is compared with a fresh `build_view`, and the tracker's changes with those of a tracker
fed fresh views. The strategies are shared with tests/backends/iptables/test_render_cache.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeproxy.cluster.objects import LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.changes import ChangeTracker
from kubeproxy.model.node_model import NodeView, build_view
from kubeproxy.model.options import Family
from kubeproxy.model.view import ViewBuilder

# Small pools, weighted so that slices usually match a Service's namespace, name and ports.
NAMESPACES = ("a", "a", "a", "b")
SERVICES = ("s1", "s2", "s3")
SERVICE_NAMES = st.sampled_from(("s1", "s1", "s2", "s2", "s3"))
PORT_NAMES = st.sampled_from((("p",), ("p",), ("p", "q"), ("",)))
PROTOCOLS = st.sampled_from(("TCP", "TCP", "TCP", "UDP"))
SLICES = ("e1", "e2", "e3", "e4")
NODES = ("n1", "n2")
CLUSTER_IPS = ("10.96.0.1", "10.96.0.2", "fd00::1", "None")
POD_IPS = {"IPv4": ("10.1.0.1", "10.1.0.2", "10.1.0.3"), "IPv6": ("fd00:1::1", "fd00:1::2")}
ZONES = ("z1", "z2")

Obj = dict[str, Any]


@st.composite
def services(draw: st.DrawFn) -> Obj:
    svc_type = draw(st.sampled_from(("ClusterIP", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName")))
    names = draw(PORT_NAMES)
    ports = []
    for i, name in enumerate(names):
        port: Obj = {"name": name, "port": draw(st.sampled_from((53, 80))), "protocol": draw(PROTOCOLS)}
        if svc_type in ("NodePort", "LoadBalancer"):
            port["nodePort"] = 30000 + i + draw(st.integers(0, 1)) * 10
        ports.append(port)
    spec: Obj = {"type": svc_type, "ports": ports}
    if svc_type == "ExternalName":
        spec["externalName"] = "example.org"
    else:
        spec["clusterIP"] = draw(st.sampled_from(CLUSTER_IPS))
    if draw(st.booleans()):
        spec["externalIPs"] = draw(st.sampled_from((["192.0.2.1"], ["192.0.2.1", "2001:db8::1"])))
    status: Obj = {}
    if svc_type == "LoadBalancer":
        ip_mode = draw(st.sampled_from(("VIP", "Proxy")))
        status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.1", "ipMode": ip_mode}]}}
        if draw(st.booleans()):
            spec["loadBalancerSourceRanges"] = ["198.51.100.0/24"]
    if svc_type in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = draw(st.sampled_from(("Cluster", "Local")))
        if spec["externalTrafficPolicy"] == "Local":
            spec["healthCheckNodePort"] = 32000
    spec["internalTrafficPolicy"] = draw(st.sampled_from(("Cluster", "Local")))
    if draw(st.booleans()):
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": draw(st.sampled_from((60, 300)))}}
    if draw(st.integers(0, 9)) == 9:
        spec["clusterIP"] = "not-an-ip"  # rejected: the previous version stays
    labels = {LABEL_SERVICE_PROXY_NAME: "other"} if draw(st.integers(0, 9)) == 9 else {}
    metadata = {"namespace": draw(st.sampled_from(NAMESPACES)), "name": draw(SERVICE_NAMES), "labels": labels}
    if draw(st.booleans()):
        metadata["annotations"] = {"note": draw(st.sampled_from(("x", "y")))}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec, "status": status}


@st.composite
def endpoint_slices(draw: st.DrawFn) -> Obj:
    family = draw(st.sampled_from(("IPv4", "IPv4", "IPv6")))
    endpoints = []
    for ip in draw(st.lists(st.sampled_from(POD_IPS[family]), min_size=draw(st.sampled_from((1, 1, 0))), max_size=3)):
        ep: Obj = {"addresses": [ip], "nodeName": draw(st.sampled_from(NODES))}
        ready = draw(st.booleans())
        ep["conditions"] = {"ready": ready, "serving": ready or draw(st.booleans()), "terminating": not ready}
        hint = draw(st.sampled_from(("", "zone", "node")))
        if hint == "zone":
            ep["hints"] = {"forZones": [{"name": draw(st.sampled_from(ZONES))}]}
        elif hint == "node":
            ep["hints"] = {"forNodes": [{"name": draw(st.sampled_from(NODES))}]}
        endpoints.append(ep)
    numbers = st.sampled_from((5353, 8080))
    ports = [{"name": n, "port": draw(numbers), "protocol": draw(PROTOCOLS)} for n in draw(PORT_NAMES)]
    labels = {LABEL_SERVICE_NAME: draw(SERVICE_NAMES)}
    if draw(st.integers(0, 9)) == 9:
        labels[LABEL_SERVICE_PROXY_NAME] = "other"
    metadata = {"namespace": draw(st.sampled_from(NAMESPACES)), "name": draw(st.sampled_from(SLICES)), "labels": labels}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports,
    }


@st.composite
def nodes(draw: st.DrawFn) -> Obj:
    labels = {"topology.kubernetes.io/zone": draw(st.sampled_from(ZONES))}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": draw(st.sampled_from(NODES)), "labels": labels}}


SYNC_TARGETS = ((Family.IPV4, "n1"), (Family.IPV4, "n1"), (Family.IPV4, "n1"), (Family.IPV6, "n1"), (Family.IPV4, "n2"))


@st.composite
def steps(draw: st.DrawFn) -> tuple[str, Any]:
    """("apply" | "delete", object), ("sync", (family, node)) or ("fail", None): mostly edits."""
    kind = draw(st.sampled_from(("apply", "apply", "apply", "apply", "delete", "sync", "sync", "fail")))
    if kind == "apply":
        return kind, draw(st.one_of(services(), endpoint_slices(), endpoint_slices(), nodes()))
    if kind == "delete":
        return kind, draw(st.one_of(services(), endpoint_slices()))
    return kind, draw(st.sampled_from(SYNC_TARGETS)) if kind == "sync" else None


scenarios = st.lists(steps(), min_size=8, max_size=40)


def seed_objects() -> list[Obj]:
    """A cluster every scenario starts from: Services of each kind with matching slices."""
    s1, s2, s3 = service_obj("s1", "10.96.0.1"), service_obj("s2", "10.96.0.2"), service_obj("s3", "10.96.0.3")
    s2["spec"].update(type="NodePort", externalTrafficPolicy="Local", healthCheckNodePort=32000)
    s2["spec"]["ports"][0]["nodePort"] = 30080
    s3["spec"].update(type="LoadBalancer", loadBalancerSourceRanges=["198.51.100.0/24"])
    s3["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}}
    slices = [slice_obj(f"e{i}", f"s{i}", ["10.1.0.1", "10.1.0.2"], node=("n1", "n2", "n2")[i - 1]) for i in (1, 2, 3)]
    return [s1, s2, s3, *slices]


def apply_step(state: ClusterState, tracker: ChangeTracker, kind: str, obj: Mapping[str, Any]) -> None:
    tracker.apply(state, copy.deepcopy(obj), deleted=kind == "delete")


def fresh_view(state: ClusterState, family: Family, node_name: str) -> NodeView:
    return build_view(state.services.values(), state.slices.values(), family, node_name)


def assert_same_objects_where_equal(previous: NodeView, view: NodeView) -> None:
    """Unchanged entries are the previous view's objects, which is what downstream caches key on."""
    for old, new in ((previous.services, view.services), (previous.endpoints, view.endpoints)):
        for name, value in new.items():
            if name in old and old[name] == value:
                assert old[name] is value, name


def assert_names_shared(view: NodeView) -> None:
    """One object per name across the view's maps: lookups then match by identity."""
    canonical = {name: name for name in view.services}
    for names in (view.endpoints, *view.by_service.values()):
        for name in names:
            assert canonical.setdefault(name, name) is name, name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_incremental_view_equals_full_build(scenario: list[tuple[str, Any]]) -> None:
    state, tracker = ClusterState(), ChangeTracker(node_name="n1")
    ref_state, ref_tracker = ClusterState(), ChangeTracker(node_name="n1")
    builder = ViewBuilder()
    previous: tuple[NodeView, str, str] | None = None
    seed = [("apply", obj) for obj in seed_objects()]
    for kind, arg in [*seed, ("sync", (Family.IPV4, "n1")), *scenario, ("sync", (Family.IPV4, "n1"))]:
        if kind in ("apply", "delete"):
            apply_step(state, tracker, kind, arg)
            apply_step(ref_state, ref_tracker, kind, arg)
        elif kind == "fail":
            tracker.request_full_sync()
            ref_tracker.request_full_sync()
        else:
            family, node_name = arg
            view = builder.update(state, tracker.pending(), family=family, node_name=node_name)
            expected = fresh_view(ref_state, family, node_name)
            assert view == expected
            assert view.by_service == NodeView(dict(view.services), dict(view.endpoints)).by_service
            assert_names_shared(view)
            assert_names_shared(expected)
            if previous is not None and previous[1:] == (family, node_name):
                assert_same_objects_where_equal(previous[0], view)
            assert tracker.take(view) == ref_tracker.take(expected)
            previous = (view, family, node_name)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("apply", "delete")), endpoint_slices()), max_size=30))
def test_slices_of_lists_a_services_slices_in_state_order(edits: list[tuple[str, Obj]]) -> None:
    state = ClusterState()
    for kind, obj in edits:
        state.apply(obj, deleted=kind == "delete")
    for ns in NAMESPACES:
        for svc in SERVICES:
            expected = [s for s in state.slices.values() if (s.namespace, s.service_name) == (ns, svc)]
            assert state.slices_of((ns, svc)) == expected


def slice_obj(name: str, service: str, ips: list[str], node: str = "n2", ns: str = "a") -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name, "labels": {LABEL_SERVICE_NAME: service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "nodeName": node} for ip in ips],
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
    }


def service_obj(name: str, ip: str, ns: str = "a") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]},
    }


def test_relabelled_slice_keeps_its_place_among_its_new_services_slices() -> None:
    # e1 comes first in `slices`; moved to s2 it must still be merged before e2, whose copy of
    # the endpoint (not local, not ready) would otherwise win.
    state = ClusterState()
    state.apply(slice_obj("e1", "s1", ["10.1.0.1"]))
    e2 = slice_obj("e2", "s2", ["10.1.0.1"])
    e2["endpoints"][0]["conditions"] = {"ready": False}
    state.apply(e2)
    state.apply(slice_obj("e1", "s2", ["10.1.0.1"]))
    assert [s.name for s in state.slices_of(("a", "s2"))] == ["e1", "e2"]
    assert state.slices_of(("a", "s1")) == []
    state.apply(slice_obj("e1", "s2", []), deleted=True)
    state.apply(slice_obj("e1", "s2", ["10.1.0.1"]))  # re-added: now last
    assert [s.name for s in state.slices_of(("a", "s2"))] == ["e2", "e1"]


def test_update_recomputes_only_touched_services_and_keeps_the_rest() -> None:
    state, tracker, builder = ClusterState(), ChangeTracker(node_name="n1"), ViewBuilder()
    for name, ip in (("s1", "10.96.0.1"), ("s2", "10.96.0.2")):
        tracker.apply(state, service_obj(name, ip))
        tracker.apply(state, slice_obj(f"{name}-1", name, ["10.1.0.1", "10.1.0.2"]))
    first = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
    assert tracker.pending() is None  # the first sync is a full one: nothing to reuse yet
    tracker.take(first)

    tracker.apply(state, slice_obj("s1-1", "s1", ["10.1.0.1", "10.1.0.3"]))
    assert tracker.pending() == frozenset({("a", "s1")})
    assert tracker.pending() == frozenset({("a", "s1")})  # a peek: nothing consumed
    second = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
    assert second == fresh_view(state, Family.IPV4, "n1")
    s1, s2 = (n for n in sorted(second.services) if n.name in ("s1", "s2"))
    assert second.endpoints[s2] is first.endpoints[s2] and second.services[s2] is first.services[s2]
    assert second.endpoints[s1] is not first.endpoints[s1]
    assert second.services[s1] is first.services[s1]  # recomputed, equal: the old object stays
    assert first.endpoints[s1] != second.endpoints[s1]  # the previous view was not changed in place
    assert tracker.take(second).services == {("a", "s1")}
    assert tracker.pending() == frozenset()


def test_family_or_node_change_rebuilds() -> None:
    state, builder = ClusterState(), ViewBuilder()
    state.apply(service_obj("s1", "10.96.0.1"))
    state.apply(slice_obj("s1-1", "s1", ["10.1.0.1"], node="n2"))
    assert builder.update(state, None, family=Family.IPV4, node_name="n1") == fresh_view(state, Family.IPV4, "n1")
    # Nothing touched, but the node name decides which endpoints are local.
    assert builder.update(state, frozenset(), family=Family.IPV4, node_name="n2") == fresh_view(state, Family.IPV4, "n2")
    assert builder.update(state, frozenset(), family=Family.IPV6, node_name="n2") == fresh_view(state, Family.IPV6, "n2")
