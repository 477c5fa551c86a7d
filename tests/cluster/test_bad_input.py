"""Bad input gets one clear message naming the object (or file and line) and never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.cli import main
from kubeproxy.cluster.manifests import RawObject, load_manifests, parse_documents
from kubeproxy.cluster.state import ClusterState, build_state

GOOD = """
apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns}
spec:
  clusterIP: 10.96.0.1
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-1, namespace: ns, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.1]}]
ports: [{port: 80}]
"""


def service(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad", "namespace": "ns"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        ({"clusterIP": "10.96.0.300", "ports": [{"port": 80}]}, "spec.clusterIP", "not a valid IP address"),
        ({"clusterIP": "10.96.0.2", "ports": [{"port": 70000}]}, "spec.ports[0].port", "out of range"),
        ({"clusterIP": "10.96.0.2", "ports": [{"name": "x"}]}, "spec.ports[0].port", "required field is missing"),
        ({"clusterIP": "10.96.0.2", "ports": [{"port": "80"}]}, "spec.ports[0].port", "expected an integer"),
        ({"clusterIP": "10.96.0.2", "ports": "80"}, "spec.ports", "expected a list"),
        ({"clusterIP": "10.96.0.2", "ports": [{"port": 80, "protocol": "ICMP"}]}, "spec.ports[0].protocol", "not one of"),
        ({"clusterIP": "10.96.0.2", "externalIPs": ["nope"], "ports": [{"port": 80}]}, "spec.externalIPs[0]", "not a valid IP"),
        (
            {"clusterIP": "10.96.0.2", "loadBalancerSourceRanges": ["10.0.0.0/33"], "ports": [{"port": 80}]},
            "spec.loadBalancerSourceRanges[0]",
            "not a valid CIDR",
        ),
        ({"clusterIP": "10.96.0.2", "ports": [{"port": True}]}, "spec.ports[0].port", "expected an integer"),
    ],
)
def test_invalid_service_is_skipped_with_one_warning(spec: dict[str, Any], field: str, problem: str) -> None:
    good = [r.obj for r in _parse(GOOD)]
    state, warnings = build_state([*good, service(spec)])
    assert len(warnings) == 1
    assert "Service ns/bad" in warnings[0] and field in warnings[0] and problem in warnings[0]
    assert ("ns", "good") in state.services and ("ns", "bad") not in state.services


def test_invalid_slice_and_missing_metadata() -> None:
    objs: list[dict[str, Any]] = [
        {"kind": "EndpointSlice", "metadata": {"name": "s", "namespace": "ns"}, "addressType": "IPv4"},
        {"kind": "Service", "spec": {}},
        {
            "kind": "EndpointSlice",
            "metadata": {"name": "t", "namespace": "ns", "labels": {"kubernetes.io/service-name": "x"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}}],
        },
    ]
    _, warnings = build_state(objs)
    assert "EndpointSlice ns/s: metadata.labels[kubernetes.io/service-name]: required label is missing" in warnings[0]
    assert "Service <unnamed>: metadata: required field is missing" in warnings[1]
    assert "EndpointSlice ns/t: endpoints[0].conditions.ready: expected true or false" in warnings[2]


def test_bad_update_keeps_previous_version() -> None:
    state = ClusterState()
    assert state.apply(service({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]})) is None
    warning = state.apply(service({"clusterIP": "10.96.0.2", "ports": [{"port": 0}]}))
    assert warning and "spec.ports[0].port" in warning
    assert state.services[("ns", "bad")].ports[0].port == 80
    assert state.apply({"kind": "Service", "metadata": {"name": "bad", "namespace": "ns"}, "spec": 5}, deleted=True) is None
    assert ("ns", "bad") not in state.services


def _parse(text: str) -> list[RawObject]:
    return list(parse_documents(text, "inline.yaml"))


def test_list_and_json_and_multidoc(tmp_path: Path) -> None:
    good = [r.obj for r in _parse(GOOD)]
    (tmp_path / "a.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": good}))
    (tmp_path / "b.yaml").write_text(GOOD.replace("good", "other"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yml").write_text(
        json.dumps({"kind": "ServiceList", "items": [{**good[0], "kind": None, "metadata": {"name": "x", "namespace": "ns"}}]})
    )
    (tmp_path / "notes.txt").write_text("ignored: not a manifest suffix")
    objs = load_manifests([tmp_path])
    names = sorted(o.obj["metadata"]["name"] for o in objs)
    assert names == ["good", "good-1", "other", "other-1", "x"]


def test_broken_file_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    result = CliRunner().invoke(main, ["render", "--manifests", str(bad), "--manifests", str(good)])
    assert result.exit_code == 0
    assert f"{bad}:4: not valid YAML or JSON" in result.stderr
    assert "ns/good cluster IP" in result.stdout
    only_bad = CliRunner().invoke(main, ["render", "--manifests", str(bad)])
    assert only_bad.exit_code == 1 and "no objects could be read" in only_bad.stderr
    assert "Traceback" not in only_bad.output


def test_missing_file_is_an_error_not_a_traceback() -> None:
    result = CliRunner().invoke(main, ["render", "--manifests", "/nonexistent/x.yaml"])
    assert result.exit_code == 1
    assert "/nonexistent/x.yaml: no such file or folder" in result.stderr


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8) | st.sampled_from(["10.0.0.1", "::1", "1.2.3.4/8"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(
        ["ports", "port", "name", "clusterIP", "protocol", "spec", "metadata", "namespace", "endpoints", "addresses",
         "addressType", "conditions", "ready", "labels", "externalIPs", "status", "loadBalancer", "ingress", "ip"]
    ), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["Service", "EndpointSlice", "Node"]), body=st.dictionaries(st.sampled_from(
    ["metadata", "spec", "status", "endpoints", "ports", "addressType"]), json_values, max_size=4))
def test_arbitrary_objects_never_raise(kind: str, body: dict[str, Any]) -> None:
    state = ClusterState()
    warning = state.apply({"kind": kind, **body})
    assert warning is None or warning.startswith(f"skipping {kind} ")
