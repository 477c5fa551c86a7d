"""The struct path (cluster/typed.py) gives exactly what the dict parsers give, and refuses the same way.

Every object goes three ways and must come out the same (objects, their order, the warnings word
for word): as the typed decoder's struct (`schema.Item`, what `render.load` and `decode_list`
give), as a plain dict (which `ClusterState.apply` converts to a struct when the schema allows),
and through the dict parsers alone (the struct path switched off). Over valid worlds the struct
path must actually be taken; over the hostile cases of test_validation_hostile_strings.py and
tests/cluster/hostile.py the results and messages must match.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kubeproxy.cluster import state as state_module
from kubeproxy.cluster import typed
from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.errors import ManifestError, ObjectError
from kubeproxy.cluster.fields import object_ref
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.objects import Endpoint, EndpointPort, EndpointSlice, Service, ServicePort, kind_of, read_endpoints
from kubeproxy.cluster.schema import Endpoint as SchemaEndpoint
from kubeproxy.cluster.schema import Item, as_plain, decode_list, decode_typed
from kubeproxy.cluster.state import ClusterState, build_state
from kubeproxy.cluster.twins import maker
from kubeproxy.cluster.validation import ParseOptions, dns1123_label, options_for
from kubeproxy.lab import builders as lab
from tests.cluster import hostile
from tests.cluster.test_validation_hostile_strings import FIELDS, HOSTILE
from tests.cluster.test_validation_hostile_strings import cluster as hostile_cluster

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from render import cluster as bench_cluster  # noqa: E402  (bench/render.py)

JSON = dict[str, Any]
_ITEM = msgspec.json.Decoder(Item)
FILE_OPTIONS = options_for(from_api_server=False)


def as_struct(obj: Any) -> Any:
    """`obj` as the typed decoder gives it from its JSON text, or `obj` itself if it refuses the
    text or `obj` is not what its JSON text holds (a tuple, a set)."""
    try:
        text = json.dumps(obj)
        return _ITEM.decode(text) if json.loads(text) == obj else obj
    except (msgspec.DecodeError, TypeError, ValueError, RecursionError):
        return obj


def outcome(objs: list[Any], options: ParseOptions) -> tuple[list[Any], list[Any], list[Any], list[str]]:
    state, warnings = build_state(objs, options)
    return list(state.services.items()), list(state.slices.items()), list(state.nodes.items()), warnings


def three_ways(objs: list[JSON], options: ParseOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    structs = outcome([as_struct(o) for o in copy.deepcopy(objs)], options)
    dicts = outcome(copy.deepcopy(objs), options)
    with monkeypatch.context() as patch:
        patch.setattr(state_module, "parse_item", lambda *args: None)
        general = outcome(copy.deepcopy(objs), options)
    assert structs == general
    assert dicts == general


def valid_worlds() -> dict[str, list[JSON]]:
    p, q = lab.Port("http", 80, 8080), lab.Port("dns", 53, 5353, protocol="UDP", node_port=30053)
    backends = [lab.Backend(f"10.244.{i}.5", f"node-{i % 2}", ready=i != 2, terminating=i == 2) for i in range(4)]
    lab_world = [
        lab.service("web", "10.96.0.10", [p], namespace="shop", labels={"app": "web"}),
        lab.endpoint_slice("web", backends, [p], namespace="shop"),
        lab.service("dns", "10.96.0.11", [p, q], type="NodePort", external_ips=["192.0.2.1"],
                    external_traffic_policy="Local", health_check_node_port=32000, affinity_timeout=60),
        lab.endpoint_slice("dns", backends[:2], [p, q]),
        lab.service("lb", "10.96.0.12", [p], type="LoadBalancer", load_balancer_ips=["198.51.100.1"],
                    source_ranges=["203.0.113.0/24", " 10.0.0.0/8 "], internal_traffic_policy="Local"),
        lab.service("v6", "fd00::10", [p], spec={"clusterIPs": ["fd00::10", "10.96.0.13"]}),
        lab.endpoint_slice("v6", [lab.Backend("fd00:244::5", "node-0")], [p], address_type="IPv6"),
        lab.service("headless", "None", [p]),
        lab.service("external", "", [], type="ExternalName", spec={"externalName": "example.com"}),
        lab.node("node-0", "192.168.0.2", "10.244.0.0/24"),
        lab.node("node-1", "192.168.0.3", "10.244.1.0/24"),
    ]
    objects: dict[str, list[JSON]] = {"lab objects": lab_world, "bench generator": bench_cluster(40, 4)}
    objects["hostile-strings cluster"] = hostile_cluster()
    fixtures = ROOT / "tests" / "fixtures" / "upstream"
    for case in sorted(fixtures.iterdir())[:40]:
        if (case / "objects.yaml").exists():
            objects[f"upstream {case.name}"] = [r.obj for r in load_manifests([case / "objects.yaml"])]
    return objects


VALID = valid_worlds()


@pytest.mark.parametrize("name", VALID)
def test_valid_worlds_take_the_struct_path_and_give_what_the_dict_path_gives(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = VALID[name]
    three_ways(objs, ParseOptions(), monkeypatch)
    three_ways(objs, FILE_OPTIONS, monkeypatch)
    # The struct path is taken (not only fallen back from) for every Service, slice and Node
    # within the schema.
    checks, taken = CheckCache(), 0
    for obj in objs:
        item = typed.as_item(obj)
        if item is not None and obj.get("kind") in ("Service", "EndpointSlice", "Node"):
            state = ClusterState()
            if state.apply(obj) is None and (state.services or state.slices or state.nodes):
                assert typed.parse_item(item, ParseOptions(), checks) is not None, obj
                taken += 1
    if name in ("lab objects", "bench generator", "hostile-strings cluster"):
        assert taken == len([o for o in objs if o["kind"] != "Deployment"])


@pytest.mark.parametrize(("field", "set_value", "ordinary"), FIELDS, ids=[f[0] for f in FIELDS])
def test_hostile_strings_give_the_same_objects_and_messages_on_both_paths(
    field: str, set_value: Any, ordinary: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for value in [*HOSTILE, *([ordinary] if ordinary else [])]:
        objs = hostile_cluster()
        set_value(objs, value)
        three_ways(objs, FILE_OPTIONS, monkeypatch)


@pytest.mark.parametrize("seed", range(0, 400, 4))
def test_fuzzed_hostile_clusters_give_the_same_objects_and_messages_on_both_paths(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for s in range(seed, seed + 4):
        three_ways(hostile.case(s).objects, ParseOptions(), monkeypatch)


MISTYPED: list[tuple[str, Any]] = [
    ("metadata", None), ("metadata", {}), ("metadata", {"name": ""}), ("metadata", {"name": "Web"}),
    ("metadata", {"name": "web", "namespace": "Shop"}), ("metadata", {"name": "web", "labels": {"a": "-x"}}),
    ("metadata", {"name": "web", "annotations": {"A/b/c": "x"}}),
    ("metadata", {"name": "web", "annotations": {"big": "x" * (256 * 1024)}}),
    ("spec", None), ("spec", {"type": "Other"}), ("spec", {"clusterIP": "10.0.0.1", "ports": [{"port": 0}]}),
    ("spec", {"clusterIP": "10.0.0.1", "ports": [{"port": 80, "nodePort": 30000}]}),
    ("spec", {"type": "NodePort", "ports": [{"port": 80, "nodePort": 1}]}),
    ("spec", {"clusterIP": "010.0.0.01", "ports": [{"port": 80}]}),
    ("spec", {"clusterIPs": ["10.0.0.1", "None"], "ports": [{"port": 80}]}),
    ("spec", {"clusterIP": "10.0.0.1", "ports": [{"port": 80}, {"port": 80}]}),
    ("spec", {"clusterIP": "10.0.0.1", "ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}),
    ("spec", {"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}),
    ("spec", {"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": None}}),
    ("spec", {"loadBalancerSourceRanges": ["10.0.0.0"]}), ("spec", {"externalIPs": ["x"]}),
    ("status", {"loadBalancer": {"ingress": [{"ip": "", "hostname": "h", "ipMode": "Proxy"}]}}),
    ("status", {"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "ipMode": "Other"}]}}),
    ("status", {"loadBalancer": None}),
]
SLICE_MISTYPED: list[tuple[str, Any]] = [
    ("addressType", None), ("addressType", "FQDN"), ("addressType", "IPv5"),
    ("endpoints", [{"addresses": []}]), ("endpoints", [{"addresses": ["10.0.0.1"] * 101}]),
    ("endpoints", [{"addresses": ["10.0.0.1", "010.0.0.2", "::1"]}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "hints": None}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": ""}], "forNodes": [{"name": "n"}]}}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z"}] * 9}}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "hints": {"forNodes": [{"name": "N"}]}}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "conditions": {"ready": None, "terminating": False}, "zone": ""}]),
    ("endpoints", [{"addresses": ["10.0.0.1"], "nodeName": "Node"}]),
    ("endpoints", [{"addresses": ["10.0.0.1"]}] * 1001),
    ("ports", [{"port": 0}]), ("ports", [{"name": "a"}, {"name": "a"}]), ("ports", [{"protocol": "XDP"}]),
    ("ports", [{"port": 80, "protocol": "XDP"}]), ("ports", [{"name": "A", "port": 80}]), ("ports", None),
    ("ports", [{"name": f"p{i}", "port": 80} for i in range(20001)]),
]
NODE_MISTYPED: list[tuple[str, Any]] = [
    ("status", {"addresses": [{"type": "", "address": "1.2.3.4"}]}),
    ("status", {"addresses": [{"type": "InternalIP"}]}),
    ("status", {"addresses": [{"type": "Hostname", "address": ""}, {"type": "ExternalIP", "address": "::1"}]}),
    ("spec", {"podCIDRs": ["10.0.0.0/24", "x"]}), ("spec", {"podCIDR": "10.0.0.1/24"}),
    ("spec", {"taints": [{"key": ""}]}), ("spec", {"taints": [{"key": "a b"}]}),
    ("metadata", {"name": "n", "namespace": "ignored", "deletionTimestamp": "2024-01-01T00:00:00Z"}),
]


def base_objects() -> tuple[JSON, JSON, JSON]:
    svc = lab.service("web", "10.96.0.10", [lab.Port("http", 80, 8080)])
    eps = lab.endpoint_slice("web", [lab.Backend("10.0.0.5", "node-a")], [lab.Port("http", 80, 8080)])
    node = lab.node("node-a", "192.168.0.2", "10.244.0.0/24")
    return svc, eps, node


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [("Service", k, v) for k, v in MISTYPED] + [("EndpointSlice", k, v) for k, v in SLICE_MISTYPED]
    + [("Node", k, v) for k, v in NODE_MISTYPED],
    ids=lambda v: json.dumps(v)[:40] if not isinstance(v, str) else v,
)
def test_each_check_words_the_same_problem_on_both_paths(
    kind: str, key: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, eps, node = base_objects()
    target = {"Service": svc, "EndpointSlice": eps, "Node": node}[kind]
    target[key] = value
    three_ways([svc, eps, node], FILE_OPTIONS, monkeypatch)
    three_ways([svc, eps, node], ParseOptions(node_port_range=None, relaxed_service_names=True), monkeypatch)


PYTHON_ONLY: list[tuple[str, Any]] = [
    ("ports", ({"port": 80},)),  # a tuple for a list: msgspec.convert would take it
    ("externalIPs", {"192.0.2.1"}),  # a YAML !!set
    ("externalIPs", frozenset({"192.0.2.1"})),
    ("clusterIP", b"10.96.0.1"),  # YAML !!binary
]


@pytest.mark.parametrize(("key", "value"), PYTHON_ONLY, ids=[repr(v)[:30] for _, v in PYTHON_ONLY])
def test_containers_json_cannot_hold_are_left_to_the_dict_path(key: str, value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, eps, node = base_objects()
    svc["spec"][key] = value
    assert typed.as_item(svc) is None
    three_ways([svc, eps, node], FILE_OPTIONS, monkeypatch)
    _, warnings = build_state([svc])
    assert len(warnings) == 1 and f"spec.{key}: expected " in warnings[0]


def test_kind_and_ref_of_a_struct_are_those_of_its_dicts() -> None:
    cases: list[JSON] = [
        {"kind": "Service", "metadata": {"name": "web", "namespace": "shop"}},
        {"kind": "Service", "metadata": {"name": "web"}},
        {"kind": "Service", "metadata": {"name": "a b", "namespace": "x\ny"}},
        {"kind": "Service", "metadata": {"name": ""}},
        {"kind": "Service", "metadata": None},
        {"kind": "Service"},
        {"kind": "", "metadata": {"name": "web"}},
        {"kind": None},
        {"metadata": {"name": "n\n"}},
    ]
    for obj in cases:
        item = typed.as_item(obj)
        assert item is not None and as_plain(item) == obj

        def results(raw: Any) -> list[Any]:
            out: list[Any] = []
            for call in (lambda: kind_of(raw), lambda: object_ref("Service", raw),
                         lambda: object_ref("Node", raw, namespaced=False)):
                try:
                    out.append(call())
                except ObjectError as exc:
                    out.append(str(exc))
            return out

        assert results(item) == results(obj), obj


def test_deleting_by_struct_or_dict_removes_the_same_object() -> None:
    svc, eps, node = base_objects()
    for obj in (svc, eps, node):
        for raw in (obj, as_struct(obj)):
            state, warnings = build_state([copy.deepcopy(o) for o in (svc, eps, node)])
            assert not warnings
            assert state.apply(raw, deleted=True) is None
            assert len(state.services) + len(state.slices) + len(state.nodes) == 2


def test_decode_list_gives_the_items_as_structs_or_leaves_the_body_to_the_general_decoder() -> None:
    items = [{k: v for k, v in o.items() if k != "kind"} for o in bench_cluster(3, 2) if o["kind"] == "Service"]
    body = json.dumps({"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items})
    decoded = decode_list(body.encode())
    assert decoded is not None
    head, structs = decoded
    assert head == {"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}}
    assert [as_plain(s) for s in structs] == items and all(s.kind is msgspec.UNSET for s in structs)
    odd = copy.deepcopy(items)
    odd[0]["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": "x"}}]
    for other in (
        json.dumps({"kind": "ServiceList", "items": odd}),  # a value outside the schema
        json.dumps(items[0]),  # not a List
        "{not json",
        json.dumps({"kind": "ServiceList", "items": [{"spec": {"ports": [{"port": "80"}]}}]}),  # another type
    ):
        assert decode_list(other.encode()) is None


def test_render_load_gives_the_dict_path_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeproxy.cluster.manifest_load import load

    objs = [*bench_cluster(30, 3), *hostile_cluster()]
    objs[3]["metadata"]["name"] = "Bad_Name"  # one refused object among them
    path = tmp_path / "all.json"
    path.write_text(json.dumps({"kind": "List", "items": objs}))
    fast = load([path])
    with monkeypatch.context() as patch:
        patch.setattr(state_module, "parse_item", lambda *args: None)
        slow = load([path])
    assert fast.warnings == slow.warnings and len(fast.warnings) == 1 and "Bad_Name" in fast.warnings[0]
    assert fast.objects == slow.objects == len(objs)
    for attr in ("services", "slices", "nodes"):
        assert list(getattr(fast.state, attr).items()) == list(getattr(slow.state, attr).items())


SAMPLES: list[tuple[type[Any], dict[str, Any]]] = [
    (Service, {"namespace": "a", "name": "b", "labels": {"x": "y"}, "type": "NodePort", "cluster_ips": (),
               "ports": (ServicePort("http", "TCP", 80, 30080),), "annotations": {"k": "v"}}),
    (ServicePort, {"name": "http", "protocol": "UDP", "port": 53}),
    (EndpointSlice, {"namespace": "a", "name": "b-1", "service_name": "b", "labels": {}, "address_type": "IPv4",
                     "endpoints": (Endpoint(AddressText("")),), "ports": (EndpointPort("", "TCP", 1),)}),
    (EndpointPort, {"name": "", "protocol": "SCTP", "port": 9}),
]


@pytest.mark.parametrize(("cls", "args"), SAMPLES, ids=[c.__name__ for c, _ in SAMPLES])
def test_a_twin_makes_the_very_object_its_class_makes(cls: type[Any], args: dict[str, Any]) -> None:
    make = maker(cls, args)
    for kwargs in (args, {k: v for k, v in args.items() if k in ("name", "protocol", "port")} if cls in (
            ServicePort, EndpointPort) else args):
        fast, made = make(**kwargs), cls(**kwargs)
        assert type(fast) is cls and fast == made and repr(fast) == repr(made)
        assert pickle.loads(pickle.dumps(fast)) == made and dataclasses.replace(fast) == made
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.name = "other"
        if cls in (ServicePort, EndpointPort):
            assert hash(fast) == hash(made)


def test_the_fast_endpoint_is_the_constructed_one() -> None:
    raw = {"addresses": ["10.0.0.1"], "conditions": {"ready": False, "terminating": True}, "nodeName": "node-a", "zone": "zone-a"}
    (fast,) = read_endpoints([msgspec.convert(raw, SchemaEndpoint)], "IPv4", CheckCache())
    made = Endpoint(AddressText("10.0.0.1"), ready=False, serving=True, terminating=True, node_name="node-a", zone="zone-a")
    assert type(fast) is Endpoint and fast == made and repr(fast) == repr(made) and hash(fast) == hash(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.zone = "other"  # type: ignore[misc]  # frozen: the assignment must raise


def test_the_check_cache_remembers_passes_only_and_stays_bounded() -> None:
    cache = CheckCache(limit=3)
    calls: list[str] = []

    def check(value: str) -> str | None:
        calls.append(value)
        return dns1123_label(value)

    value = "".join(["na", "me"])  # not the interned literal
    assert cache.canonical(check, value) == "name" and cache.canonical(check, "name") is sys.intern("name")
    assert not cache.passes(check, "Bad") and not cache.passes(check, "Bad")
    assert calls == ["name", "Bad", "Bad"]  # a pass is checked once, a problem every time
    for i in range(10):
        assert cache.passes(check, f"n{i}")
    assert len(cache.passed(check)) <= 3


def test_repeated_strings_are_shared_across_objects() -> None:
    # Built from JSON text, as a file or an API list gives them: each string a separate object.
    text = json.dumps({"kind": "List", "items": bench_cluster(20, 5)})
    document = decode_typed(text)
    assert document is not None and isinstance(document.items, list)
    state, warnings = build_state(document.items)
    assert not warnings
    endpoints = [ep for eps in state.slices.values() for ep in eps.endpoints]
    assert len({id(ep.node_name) for ep in endpoints}) == len({ep.node_name for ep in endpoints}) == 5
    objects: list[Service | EndpointSlice] = [*state.services.values(), *state.slices.values()]
    assert len({id(o.namespace) for o in objects}) == 1
    ports = [p for eps in state.slices.values() for p in eps.ports]
    assert len({id(p.name) for p in ports}) == len({id(p.protocol) for p in ports}) == 1


def managed(obj: JSON, fields: Any) -> JSON:
    """`obj` as an API server sends it: with `metadata.managedFields` (`fields` as the fieldsV1)."""
    out = copy.deepcopy(obj)
    out["metadata"]["managedFields"] = [
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
         "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields},
        {"manager": "kube-apiserver", "operation": "Update", "subresource": "status", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:status": {"f:loadBalancer": {}}}},
    ]
    return out


def decode_api(body: bytes) -> tuple[ClusterState, list[str]]:
    """What the API source does with a list body: the typed items, or else the general decoder's dicts."""
    typed_list = decode_list(body)
    if typed_list is not None:
        head, items = typed_list
        for item in items:
            if item.kind is msgspec.UNSET:
                item.kind = head["kind"].removesuffix("List")
        return build_state(items)
    decoded = msgspec.json.decode(body)
    for plain in decoded["items"]:
        plain.setdefault("kind", decoded["kind"].removesuffix("List"))
    return build_state(decoded["items"])


def test_list_bodies_with_managed_fields_take_the_typed_path_and_give_the_same_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
              "f:spec": {"f:ports": {'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:port": {}}}}}
    objs = [managed(o, fields) for o in [*bench_cluster(20, 3), *hostile_cluster()]]
    for kind in ("Service", "EndpointSlice"):
        items = [{k: v for k, v in o.items() if k != "kind"} for o in objs if o["kind"] == kind]
        body = json.dumps({"kind": f"{kind}List", "metadata": {"resourceVersion": "5"}, "items": items}).encode()
        decoded = decode_list(body)
        assert decoded is not None, "a real body (managedFields and all) must take the typed path"
        assert [as_plain(s) for s in decoded[1]] == items
        typed_state, typed_warnings = decode_api(body)
        with monkeypatch.context() as patch:
            patch.setattr(sys.modules[__name__], "decode_list", lambda body: None)
            general_state, general_warnings = decode_api(body)
        assert typed_warnings == general_warnings
        for attr in ("services", "slices", "nodes"):
            assert list(getattr(typed_state, attr).items()) == list(getattr(general_state, attr).items())


def nested(depth: int) -> str:
    return '{"f:a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize("depth", [14, 96, 97, 5000])
def test_a_hostile_fields_v1_behaves_as_on_the_dict_path(depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeproxy.cluster import manifests
    from kubeproxy.sources.api import decode_body

    svc = json.dumps(managed(bench_cluster(1, 1)[0], {})).replace('"fieldsV1": {}', '"fieldsV1": ' + nested(depth), 1)
    body = ('{"kind": "ServiceList", "items": [' + svc + "]}").encode()
    assert decode_list(body) is None  # deeper than the schema types: the general decoder reads it
    try:
        general: Any = decode_body(body)["items"][0]["metadata"]["managedFields"][0]["fieldsV1"]
    except RecursionError:  # msgspec's own limit, on the dict path as before
        general = RecursionError
    assert general is RecursionError or json.dumps(general) == nested(depth)
    # A file: refused past MAX_DEPTH (the object, metadata, managedFields, an entry, then fieldsV1)
    # with the general path's message, whichever decoder reads it first.
    outcomes: list[tuple[list[dict[str, Any]], str | None]] = []
    for typed_decoder in (decode_typed, lambda text: None):
        with monkeypatch.context() as patch:
            patch.setattr(manifests, "decode_typed", typed_decoder)
            try:
                outcomes.append(([o.obj for o in manifests.parse_documents(svc, "svc.json")], None))
            except ManifestError as exc:
                outcomes.append(([], str(exc)))
    assert outcomes[0] == outcomes[1]
    refused = depth + 4 > manifests.MAX_DEPTH
    assert outcomes[0][1] == ("svc.json: nested more than 100 levels deep" if refused else None)
