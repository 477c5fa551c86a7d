"""The decode fast paths give exactly what the general paths give, and refuse exactly as much.

`addresses.canonical_ipv4` and `objects.read_endpoints` accept a subset of their input and hand everything
else to the general code; msgspec decodes JSON where it agrees with the json module. Each is
checked here against the general path on the inputs where they could differ.
"""

from __future__ import annotations

import copy
import gc
import ipaddress
import json
from typing import Any

import pytest

from kubeproxy.cluster import objects
from kubeproxy.cluster.addresses import AddressText, canonical_ipv4, sloppy_ip, valid_ip
from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.manifests import parse_documents
from kubeproxy.sources.api import decode_body

ADDRESSES = [
    "10.0.0.1", "0.0.0.0", "255.255.255.255", "256.0.0.1", "010.0.0.1", "10.0.0.01", "10.0.0.00",
    " 10.0.0.1", "10.0.0.1 ", "10.0.0", "10.0.0.1.5", "10..0.1", "0x1.2.3.4", "1.2.3.4\x00", "\ud800",
    "\u0661.2.3.4", "", "::1", "fe80::1%eth0", "::ffff:1.2.3.4", "2001:db8::1", "1e1.2.3.4", "+1.2.3.4",
]


def general_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return sloppy_ip(text)
    except ValueError:
        return None


@pytest.mark.parametrize("text", ADDRESSES)
def test_canonical_ipv4_is_a_subset_of_the_general_parse(text: str) -> None:
    fast = canonical_ipv4(text)
    if fast is not None:
        assert fast == general_ip(text) and str(fast) == text  # canonical text only
    sloppy: Any
    try:
        sloppy = valid_ip(text)
    except ValueError:
        sloppy = None
    assert sloppy == general_ip(text)


def slice_with(endpoint: Any) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.9"], "nodeName": "node-a"}, endpoint],
        "ports": [{"name": "http", "port": 80}],
    }


ENDPOINTS: list[Any] = [
    {"addresses": ["10.0.0.1"]},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": False, "serving": True, "terminating": True}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": None}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": 1}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": "false"}},
    {"addresses": ["10.0.0.1"], "conditions": None},
    {"addresses": ["10.0.0.1"], "conditions": []},
    {"addresses": ["10.0.0.1"], "conditions": {}},
    {"addresses": ["10.0.0.1"], "nodeName": "node-a", "zone": "z1"},
    {"addresses": ["10.0.0.1"], "nodeName": "Node_A"},
    {"addresses": ["10.0.0.1"], "nodeName": 0},
    {"addresses": ["10.0.0.1"], "nodeName": ""},
    {"addresses": ["10.0.0.1"], "nodeName": None, "zone": None},
    {"addresses": ["10.0.0.1"], "zone": False},
    {"addresses": ["10.0.0.1"], "zone": []},
    {"addresses": ["010.0.0.1"]},
    {"addresses": [" 10.0.0.1"]},
    {"addresses": ["10.0.0.1", "10.0.0.2"]},
    {"addresses": ["2001:db8::1"]},
    {"addresses": ["2001:DB8:0::0:1"]},
    {"addresses": ["nonsense"]},
    {"addresses": [1]},
    {"addresses": []},
    {"addresses": None},
    {"addresses": "10.0.0.1"},
    {"addresses": ["10.0.0.1"] * 101},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z1"}]}},
    {"addresses": ["10.0.0.1"], "hints": None},
    {"addresses": ("10.0.0.1",)},
    {"addresses": ["10.0.0.1"], "deprecatedTopology": {"a": "b"}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True, "unknown": 1}},
    {"addresses": ["10.0.0.1"], "targetRef": 5},
    {"addresses": ["10.0.0.1"], "hints": {"forNodes": [{"name": "node-a"}] * 9}},
    {"nodeName": "node-a"},
    "not an object",
]
# The endpoints `read_endpoints` reads itself (every other one is read field by field).
COMMON: list[Any] = [
    {"addresses": ["10.0.0.1"]},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": False, "serving": True, "terminating": True}},
    {"addresses": ["10.0.0.1"], "conditions": None},
    {"addresses": ["10.0.0.1", "10.0.0.2"], "nodeName": "node-a", "zone": "z1"},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z1"}]}},
    {"addresses": ["10.0.0.1"], "deprecatedTopology": {"a": "b"}},
]


def outcome(obj: dict[str, Any]) -> objects.EndpointSlice | str:
    try:
        return objects.parse_endpoint_slice(copy.deepcopy(obj))
    except ObjectError as exc:
        return str(exc)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[repr(e)[:50] for e in ENDPOINTS])
def test_the_struct_route_gives_what_the_field_by_field_route_gives(endpoint: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = slice_with(endpoint)
    fast = outcome(obj)

    def refuse(raw: list[Any]) -> list[Any]:
        raise objects.EndpointRefused("test")

    monkeypatch.setattr(objects, "_endpoint_structs", refuse)  # every endpoint checked field by field
    assert fast == outcome(obj)


@pytest.mark.parametrize("endpoint", COMMON, ids=[repr(e)[:50] for e in COMMON])
def test_the_common_endpoint_is_read_by_the_shared_reader(endpoint: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def unused(*args: object) -> tuple[objects.Endpoint, ...]:
        raise AssertionError("read field by field")

    monkeypatch.setattr(objects, "_endpoints_by_field", unused)
    assert isinstance(outcome(slice_with(endpoint)), objects.EndpointSlice)


JSON_TEXTS = [
    '{"kind": "List", "items": [{"a": 1}]}',
    '{"a": 123456789012345678901234567890}',
    '{"a": NaN}',
    '{"a": 1e400}',
    '{"a": "\\ud800"}',
    '{"a": 1, "a": 2}',
    '{"a": -0.0, "b": 1E5}',
    '\ufeff{"a": 1}',
    '{"a": 1} trailing',
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_decoding_matches_the_json_module(text: str) -> None:
    import json

    def json_module() -> Any:
        try:
            return json.loads(text.encode())
        except ValueError as exc:
            return type(exc)

    def ours() -> Any:
        try:
            return decode_body(text.encode())
        except ValueError as exc:
            return type(exc)

    expected, got = json_module(), ours()
    # NaN is never equal to itself: compare the text of the results.
    assert repr(got) == repr(expected)


def test_a_json_file_with_nan_decodes_as_the_json_module_does() -> None:
    (doc,) = parse_documents('{"kind": "Service", "metadata": {"name": "a"}, "spec": {"x": NaN}}', "f.json")
    assert repr(doc.obj["spec"]["x"]) == "nan"


def test_paused_gc_restores_the_collector() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block did not disable it, so it does not enable it
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError
    assert gc.isenabled()


def test_file_source_keeps_objects_as_json_only_where_that_is_exact() -> None:
    from kubeproxy.sources.files import _diff, _same, _stored

    plain = {"kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}}
    assert isinstance(_stored(plain), bytes)
    # Encodings that would lose the difference keep the dict: NaN and infinity encode as null,
    # an integer key as a string.
    for odd in ({"x": float("nan")}, {"x": float("inf")}, {1: "a"}, {"x": {1, 2}}):
        assert _stored(odd) is odd  # type: ignore[arg-type]  # keys and values JSON cannot hold, on purpose
    assert not _same(_stored({"x": None}), _stored({"x": float("nan")}))
    assert not _same(_stored({"x": 1}), _stored({"x": 2}))
    # The same dict with its keys in another order is the same object: no event.
    assert _same(_stored({"a": 1, "b": 2}), _stored({"b": 2, "a": 1}))
    key = ("Service", "default", "a")
    events = _diff({key: _stored({"a": 1})}, {key: _stored({"a": 2})}, {})
    assert [(e.type, e.obj) for e in events] == [("MODIFIED", {"a": 2})]
    gone = _diff({key: _stored({"a": 1})}, {}, {})
    assert [(e.type, e.obj) for e in gone] == [("DELETED", {"a": 1})]


# --- The typed decoder of JSON manifests (cluster/schema.py) -----------------------------------

RICH_SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {
        "name": "web", "namespace": "default", "labels": {"app": "web"}, "annotations": {"a": "b"},
        "uid": "u", "resourceVersion": "7", "generation": 2, "creationTimestamp": "2024-01-01T00:00:00Z",
        "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u", "controller": True}],
    },
    "spec": {
        "type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080, "protocol": "TCP"}],
        "selector": {"app": "web"}, "externalTrafficPolicy": "Local", "healthCheckNodePort": 30999,
        "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "allocateLoadBalancerNodePorts": True,
        "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalIPs": ["1.2.3.4"], "trafficDistribution": None,
    },
    "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8", "ipMode": "VIP", "ports": [{"port": 80, "protocol": "TCP"}]}]}},
}
RICH_SLICE: dict[str, Any] = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
    "addressType": "IPv4",
    "endpoints": [
        {"addresses": ["10.0.0.9"], "conditions": {"ready": True, "serving": None}, "nodeName": "n", "zone": "z",
         "hints": {"forZones": [{"name": "z"}], "forNodes": [{"name": "n"}]}, "hostname": "h",
         "targetRef": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "u"}},
    ],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}],
}
RICH_NODE: dict[str, Any] = {
    "kind": "Node",
    "metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "n"}, "deletionTimestamp": "2024-01-01T00:00:00Z"},
    "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"], "taints": [{"key": "k", "effect": "NoSchedule"}]},
    "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
}
# A real entry (kubectl get svc -o json, trimmed): fieldsV1 is a tree of maps ending in {}.
MANAGED_ENTRY: dict[str, Any] = {
    "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
    "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1",
    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                 "f:spec": {"f:ports": {".": {}, 'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:port": {}}}}},
}
TYPED_DOCUMENTS: dict[str, Any] = {
    "service": RICH_SERVICE,
    "slice": RICH_SLICE,
    "node": RICH_NODE,
    "list": {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "9", "continue": ""},
             "items": [RICH_SERVICE, RICH_SLICE, RICH_NODE]},
    "empty list": {"kind": "ServiceList", "items": None},
    # What an API server sends with every object (kubectl get -o json shows it).
    "managed fields": {**RICH_SERVICE, "metadata": {**RICH_SERVICE["metadata"], "managedFields": [MANAGED_ENTRY]}},
    "deepest managed fields": {"kind": "Service", "metadata": {"managedFields": [
        {"fieldsV1": json.loads('{"f:a": ' * 12 + "{}" + "}" * 12)}, {"fieldsV1": None}, {}]}},
    # Out of range, but the same integer either way: the general path names the field.
    "huge port": {"kind": "Service", "spec": {"ports": [{"port": 123456789012345678901234567890}]}},
}


@pytest.mark.parametrize("doc", TYPED_DOCUMENTS.values(), ids=TYPED_DOCUMENTS.keys())
def test_the_typed_decoder_gives_what_the_general_decoder_gives(doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kubeproxy.cluster import manifests
    from kubeproxy.cluster.schema import decode_typed

    text = json.dumps(doc)
    assert decode_typed(text) is not None, "these documents are within the schema: the fast path must take them"
    typed = list(parse_documents(text, "f.json"))
    monkeypatch.setattr(manifests, "decode_typed", lambda text: None)
    general = list(parse_documents(text, "f.json"))
    assert typed == general


# Outside the schema (an unknown field, a value of another type, a duplicated field, not JSON):
# None, so that the general decoder reads it and words any error, exactly as before.
OUTSIDE_SCHEMA = [
    '{"kind": "Service", "metadata": {"name": "a", "managedFields": [{"fieldsV1": {"f:x": 5}}]}}',
    '{"kind": "Service", "metadata": {"managedFields": [{"fieldsV1": {"f:x": {}}, "extra": 1}]}}',
    # A fieldsV1 deeper than the schema types: the general path decides (and accepts it: < MAX_DEPTH).
    '{"kind": "Service", "metadata": {"managedFields": [{"fieldsV1": ' + '{"f:a": ' * 14 + "{}" + "}" * 14 + "}]}}",
    '{"kind": "Service", "spec": {"ports": [{"port": "80"}]}}',
    '{"kind": "Service", "spec": {"ports": [{"port": 80.0}]}}',
    '{"kind": "Service", "spec": {"ports": [{"port": true}]}}',
    '{"kind": "Service", "metadata": {"labels": {"a": 5}}}',
    '{"kind": "Service", "spec": {"x": ' + "[" * 500 + "]" * 500 + "}}",
    '{"kind": "List", "items": [{"kind": "List", "items": []}]}',
    '{"kind": "Service", "metadata": {"name": "\\ud800"}}',
    '{"kind": "Service"} trailing',
    "[]",
]


@pytest.mark.parametrize("text", OUTSIDE_SCHEMA, ids=[t[:40] for t in OUTSIDE_SCHEMA])
def test_the_typed_decoder_leaves_everything_else_to_the_general_path(text: str) -> None:
    from kubeproxy.cluster.schema import decode_typed

    assert decode_typed(text) is None


def test_a_wrong_type_in_one_object_still_names_that_object_and_keeps_the_others() -> None:
    import json

    from kubeproxy.cluster.state import build_state

    bad = copy.deepcopy(RICH_SERVICE)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["ports"][0]["port"] = "80"
    text = json.dumps({"kind": "List", "items": [bad, RICH_SERVICE]})
    state, warnings = build_state(r.obj for r in parse_documents(text, "f.json"))
    assert list(state.services) == [("default", "web")]
    assert warnings == ["skipping Service default/bad: spec.ports[0].port: expected an integer, got str '80'"]


def _depth(kind: Any) -> int:
    """How many maps and lists deep a value of msgspec type `kind` can be (recursion: a RecursionError)."""
    import msgspec.inspect as mi

    if isinstance(kind, mi.UnionType):
        return max(_depth(t) for t in kind.types)
    if isinstance(kind, (mi.ListType, mi.DictType)):
        return 1 + _depth(kind.item_type if isinstance(kind, mi.ListType) else kind.value_type)
    if isinstance(kind, mi.StructType):
        return 1 + max((_depth(f.type) for f in kind.fields), default=0)
    return 0


def test_the_schema_bounds_the_depth_by_construction() -> None:
    import msgspec.inspect as mi

    from kubeproxy.cluster.manifests import MAX_DEPTH
    from kubeproxy.cluster.schema import SCHEMA_DEPTH, Document

    # The deepest value the typed decoder can return (a leaf inside SCHEMA_DEPTH containers),
    # computed from the types: far below the limit the general path checks for.
    assert _depth(mi.type_info(Document)) == SCHEMA_DEPTH < MAX_DEPTH


@pytest.mark.parametrize(
    ("given", "canonical"),
    [(["10.0.0.1"], ("10.0.0.1",)), (["010.000.0.01"], ("10.0.0.1",)), (["::ffff:10.0.0.3"], ("10.0.0.3",)),
     (["10.0.0.1", "10.0.0.010"], ("10.0.0.1", "10.0.0.10"))],
)
def test_an_endpoint_keeps_its_addresses_as_canonical_text_on_every_path(given: list[str], canonical: tuple[str, ...]) -> None:
    # Every backend, the node view and the stale-flow cleanup read this text as the address.
    from kubeproxy.cluster import typed
    from kubeproxy.cluster.checks import CheckCache
    from kubeproxy.cluster.validation import ParseOptions

    obj = slice_with({"addresses": given})
    item = typed.as_item(copy.deepcopy(obj))
    assert item is not None
    fast = typed.parse_item(item, ParseOptions(), CheckCache())
    assert fast is not None  # the typed path takes sloppy addresses too (cluster/typed.py `_ip`)
    for made in (objects.parse_endpoint_slice(copy.deepcopy(obj)), fast):
        assert isinstance(made, objects.EndpointSlice)
        assert made.endpoints[1].addresses == canonical
        assert all(type(a) is str for a in made.endpoints[1].addresses)


def test_the_fast_endpoint_info_is_the_constructed_one() -> None:
    from kubeproxy.model.node_model import EndpointInfo, _new_endpoint_info

    hints = objects.Endpoint(AddressText("10.0.0.1"), ready=False, serving=True, terminating=True,
                             zone_hints=frozenset({"z"}), node_hints=frozenset({"n"}))
    for ip in ("10.0.0.1", "2001:db8::1"):
        fast = _new_endpoint_info(AddressText(ip), 8080, True, hints)
        made = EndpointInfo(ip=AddressText(ip), port=8080, is_local=True, ready=False, serving=True, terminating=True,
                            zone_hints=frozenset({"z"}), node_hints=frozenset({"n"}))
        assert fast == made and fast.address == made.address and hash(fast) == hash(made)


def test_render_leaves_the_collector_as_it_was(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from kubeproxy.cli import main

    path = tmp_path / "objs.json"
    path.write_text(json.dumps({"kind": "List", "items": [RICH_SERVICE, RICH_SLICE]}))
    assert gc.isenabled()
    result = CliRunner().invoke(main, ["render", "--manifests", str(path), "--hostname-override", "n"])
    assert result.exit_code == 0, result.output
    assert "10.96.0.1" in result.output
    assert gc.isenabled()


@pytest.mark.parametrize("text", ["0.0.0.0", "10.0.0.1", "255.255.255.255", "192.168.1.20"])
def test_the_fast_ipv4_is_an_ordinary_ipv4_address(text: str) -> None:
    import pickle
    from socket import AF_INET, inet_pton

    fast, made = objects._ipv4(inet_pton(AF_INET, text)), ipaddress.IPv4Address(text)
    assert type(fast) is type(made) and fast == made and hash(fast) == hash(made)
    assert (str(fast), repr(fast), fast.packed, fast.version) == (str(made), repr(made), made.packed, made.version)
    assert pickle.loads(pickle.dumps(fast)) == made and fast in ipaddress.ip_network(f"{text}/32")
