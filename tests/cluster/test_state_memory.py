"""What ClusterState keeps compactly (memory at 10k services) still answers as before.

- `slices_of`, whose index is a tuple of (slice key, insertion number) per Service: after any
  sequence of adds, relabels (a slice moving to another Service) and deletes it lists exactly
  the slices `slices` holds for that Service, in `slices`' order.
- Endpoints without hints share one empty frozenset, on both parse paths, and equal endpoints
  with `frozenset()` hints; objects without labels or annotations share one empty mapping and
  equal the dict path's objects.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.objects import LABEL_SERVICE_NAME, NO_HINTS, Endpoint, parse_endpoint_slice, parse_service
from kubeproxy.cluster.schema import decode_list
from kubeproxy.cluster.state import ClusterState, build_state

NAMESPACES = ("a", "b")
SERVICES = ("s1", "s2", "s3")
SLICES = ("e1", "e2", "e3", "e4", "e5")


def _slice(namespace: str, name: str, service: str, ip: str = "10.1.0.1") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": namespace, "name": name, "labels": {LABEL_SERVICE_NAME: service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": "p", "port": 80, "protocol": "TCP"}],
    }


OPS = st.lists(
    st.tuples(st.booleans(), st.sampled_from(NAMESPACES), st.sampled_from(SLICES), st.sampled_from(SERVICES)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_slices_of_lists_each_services_slices_in_state_order(ops: list[tuple[bool, str, str, str]]) -> None:
    state = ClusterState()
    for delete, namespace, name, service in ops:
        assert state.apply(_slice(namespace, name, service), deleted=delete) is None
        for ns in NAMESPACES:
            for svc in SERVICES:
                expected = [eps for eps in state.slices.values() if (eps.namespace, eps.service_name) == (ns, svc)]
                assert state.slices_of((ns, svc)) == expected


def test_a_relabelled_slice_keeps_its_place() -> None:
    state = ClusterState()
    for name in ("e1", "e2", "e3"):
        state.apply(_slice("a", name, "s1", ip=f"10.1.0.{name[1]}"))
    state.apply(_slice("a", "e1", "s2"))  # e1 moves to s2 and back: still first among s1's
    state.apply(_slice("a", "e1", "s1", ip="10.1.0.9"))
    assert [eps.name for eps in state.slices_of(("a", "s1"))] == ["e1", "e2", "e3"]
    assert state.slices_of(("a", "s2")) == []
    state.apply(_slice("a", "e2", "s1"), deleted=True)
    assert [eps.name for eps in state.slices_of(("a", "s1"))] == ["e1", "e3"]


def test_endpoints_without_hints_share_one_empty_set_on_both_paths() -> None:
    raw = _slice("a", "e1", "s1")
    raw["endpoints"].append({"addresses": ["10.1.0.2"], "hints": {"forZones": []}})
    from_dicts = parse_endpoint_slice(raw)
    listed = decode_list(
        b'{"kind": "EndpointSliceList", "metadata": {"resourceVersion": "1"}, "items": ['
        b'{"metadata": {"namespace": "a", "name": "e1", "labels": {"kubernetes.io/service-name": "s1"}},'
        b' "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.1"]},'
        b' {"addresses": ["10.1.0.2"], "hints": {"forZones": []}}],'
        b' "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}]}'
    )
    assert listed is not None
    _, items = listed
    items[0].kind = "EndpointSlice"
    items[0].apiVersion = "discovery.k8s.io/v1"
    state, warnings = build_state(items)
    assert warnings == []
    (typed,) = state.slices.values()
    assert typed == from_dicts
    for eps in (typed, from_dicts):
        for ep in eps.endpoints:
            assert ep.zone_hints is NO_HINTS and ep.node_hints is NO_HINTS
    assert Endpoint(AddressText("")).zone_hints is NO_HINTS
    assert not NO_HINTS and isinstance(NO_HINTS, frozenset)


def test_objects_without_labels_or_annotations_equal_the_dict_paths() -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "a", "name": "s1"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "p", "port": 80}]},
    }
    other = {**svc, "metadata": {"namespace": "a", "name": "s2"}}
    state, warnings = build_state([svc, other])
    assert warnings == []
    a, b = state.services[("a", "s1")], state.services[("a", "s2")]
    assert a == parse_service(svc)
    assert a.labels == {} and a.annotations == {} and b.labels == {}
