"""The test API server shares its stored dicts with lists, watch-lists and the event history
instead of deep-copying them (a 10k list is an encoding, not 10k copies). These tests
hold that up: nothing a client or a Python caller does with an answer reaches the store, a list
still answers without each item's kind/apiVersion, a watch from a version gets exactly the newer
events (found by bisection), and the msgspec encoding says what `json.dumps` says."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from kubeproxy.lab.apiserver import SERVICE, ApiServer, Selector
from kubeproxy.lab.apiserver.handler import encode

pytestmark = pytest.mark.timeout(60)


def service(name: str, port: int = 80) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": port, "protocol": "TCP"}]},
    }


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def test_answers_given_to_python_callers_are_copies() -> None:
    server = ApiServer()
    created = server.apply(service("a"))
    created["spec"]["ports"][0]["port"] = 1
    got = server.get("Service", "default", "a")
    assert got["spec"]["ports"][0]["port"] == 80
    got["metadata"]["labels"]["app"] = "changed"
    updated = server.apply(service("a", port=81))
    updated["spec"]["ports"].clear()
    listed, _ = server.store.list(SERVICE, None, Selector.parse("", ""))
    listed[0]["metadata"]["name"] = "changed"
    gone = server.delete("Service", "default", "a")
    gone["metadata"]["name"] = "changed"
    # The history's events are the stored dicts: none of the edits above reached them.
    events = [(ev.type, ev.obj["metadata"]["name"], ev.obj["metadata"]["labels"]["app"], ev.obj["spec"]["ports"])
              for ev in server.store.history if ev.rt == SERVICE]  # fmt: skip
    assert events == [
        ("ADDED", "a", "a", [{"port": 80, "protocol": "TCP"}]),
        ("MODIFIED", "a", "a", [{"port": 81, "protocol": "TCP"}]),
        ("DELETED", "a", "a", [{"port": 81, "protocol": "TCP"}]),
    ]
    assert server.store.history[-1].old is server.store.history[-2].obj


def test_a_list_answers_without_item_types_and_leaves_the_store_as_it_was() -> None:
    with ApiServer() as server:
        for name in ("b", "a"):
            server.apply(service(name))
        body = get_json(f"{server.url}/api/v1/namespaces/default/services")
        assert body["kind"] == "ServiceList" and body["metadata"]["resourceVersion"] == str(server.resource_version)
        assert [item["metadata"]["name"] for item in body["items"]] == ["a", "b"]
        assert all("kind" not in item and "apiVersion" not in item for item in body["items"])
        # The stored objects keep their type: the list stripped it from copies.
        stored = server.store.objects[("services", "default", "a")]
        assert stored["kind"] == "Service" and stored["apiVersion"] == "v1"
        assert server.get("Service", "default", "a") == {k: v for k, v in stored.items()}


def test_events_after_a_version_are_the_newer_ones_also_after_compaction() -> None:
    server = ApiServer(history_size=5)
    for i in range(12):
        server.apply(service(f"s{i % 4}", port=80 + i))
    history = list(server.store.history)
    assert len(history) == 5
    for rv in range(0, server.resource_version + 2):
        assert server.store.events_after(rv) == [ev for ev in history if ev.rv > rv], rv


def test_a_watch_from_a_version_gets_only_the_newer_events() -> None:
    with ApiServer() as server:
        server.apply(service("a"))
        since = server.resource_version
        server.apply(service("b"))
        server.apply(service("a", port=81))
        url = f"{server.url}/api/v1/services?watch=true&resourceVersion={since}&timeoutSeconds=1"
        with urllib.request.urlopen(url, timeout=10) as answer:
            events = [json.loads(line) for line in answer.read().splitlines() if line.strip()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("MODIFIED", "a")]
        assert events[1]["object"]["spec"]["ports"][0]["port"] == 81


@pytest.mark.parametrize(
    "body",
    [
        service("a"),
        {"text": 'ünïcødé "quoted" \\ back\nslash \u2028', "n": [1, -2, 3.5, 2**70], "t": True, "z": None},
        {"nested": {"deep": [[{}], []]}},
    ],
)
def test_the_encoding_is_the_same_json_as_json_dumps(body: Any) -> None:
    assert json.loads(encode(body)) == json.loads(json.dumps(body))


def test_what_msgspec_refuses_is_encoded_the_general_way() -> None:
    # A non-string key json.dumps turns into a string; msgspec refuses it.
    assert encode({True: 1}) == json.dumps({True: 1}).encode()
    with pytest.raises(TypeError):
        encode({"a": object()})
