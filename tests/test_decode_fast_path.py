"""The decode fast paths (issue 17) give exactly what the general paths give, and refuse exactly as much.

`plain_ipv4` and `objects._plain_endpoint` accept a subset of their input and hand everything
else to the general code; msgspec decodes JSON where it agrees with the json module. Each is
checked here against the general path on the inputs where they could differ.
"""

from __future__ import annotations

import copy
import gc
import ipaddress
from typing import Any

import pytest

from kubeproxy.cluster import objects
from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import _strip_leading_zeros, parse_ip_sloppy, plain_ipv4
from kubeproxy.cluster.manifests import parse_documents
from kubeproxy.sources.api import decode_body

ADDRESSES = [
    "10.0.0.1", "0.0.0.0", "255.255.255.255", "256.0.0.1", "010.0.0.1", "10.0.0.01", "10.0.0.00",
    " 10.0.0.1", "10.0.0.1 ", "10.0.0", "10.0.0.1.5", "10..0.1", "0x1.2.3.4", "1.2.3.4\x00", "\ud800",
    "\u0661.2.3.4", "", "::1", "fe80::1%eth0", "::ffff:1.2.3.4", "2001:db8::1", "1e1.2.3.4", "+1.2.3.4",
]


def general_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(_strip_leading_zeros(text.strip()))
    except ValueError:
        return None


@pytest.mark.parametrize("text", ADDRESSES)
def test_plain_ipv4_is_a_subset_of_the_general_parse(text: str) -> None:
    fast = plain_ipv4(text)
    if fast is not None:
        assert fast == general_ip(text) and str(fast) == text  # canonical text only
    sloppy: Any
    try:
        sloppy = parse_ip_sloppy(text)
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
    {"addresses": ["nonsense"]},
    {"addresses": [1]},
    {"addresses": []},
    {"addresses": None},
    {"addresses": "10.0.0.1"},
    {"addresses": ["10.0.0.1"] * 101},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "z1"}]}},
    {"addresses": ["10.0.0.1"], "hints": None},
    {"nodeName": "node-a"},
    "not an object",
]


def outcome(obj: dict[str, Any]) -> objects.EndpointSlice | str:
    try:
        return objects.parse_endpoint_slice(copy.deepcopy(obj))
    except ObjectError as exc:
        return str(exc)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[repr(e)[:50] for e in ENDPOINTS])
def test_plain_endpoint_gives_what_the_general_path_gives(endpoint: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = slice_with(endpoint)
    fast = outcome(obj)
    monkeypatch.setattr(objects, "_plain_endpoint", lambda raw, node_names: None)
    assert fast == outcome(obj)


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
        assert _stored(odd) is odd  # type: ignore[arg-type]
    assert not _same(_stored({"x": None}), _stored({"x": float("nan")}))
    assert not _same(_stored({"x": 1}), _stored({"x": 2}))
    # The same dict with its keys in another order is the same object: no event.
    assert _same(_stored({"a": 1, "b": 2}), _stored({"b": 2, "a": 1}))
    key = ("Service", "default", "a")
    events = _diff({key: _stored({"a": 1})}, {key: _stored({"a": 2})}, {})
    assert [(e.type, e.obj) for e in events] == [("MODIFIED", {"a": 2})]
    gone = _diff({key: _stored({"a": 1})}, {}, {})
    assert [(e.type, e.obj) for e in gone] == [("DELETED", {"a": 1})]
