"""The test API server speaks the protocol our reflector and kubectl rely on."""

from __future__ import annotations

from typing import Any

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import SERVICE, ApiServer, strategic_merge_patch
from tests.sources.conftest import RawWatch, request

pytestmark = pytest.mark.timeout(30)


def svc(name: str, port: int = 80, ns: str = "default", **labels: str) -> dict[str, Any]:
    return builders.service(name, "", [builders.Port("", port, port)], namespace=ns, labels=labels)


def test_discovery_documents(apiserver: ApiServer) -> None:
    assert request(apiserver, "GET", "/version")[1]["major"] == "1"
    assert request(apiserver, "GET", "/api")[1]["versions"] == ["v1"]
    groups = request(apiserver, "GET", "/apis")[1]["groups"]
    assert {"discovery.k8s.io", "networking.k8s.io"} <= {g["name"] for g in groups}
    names = {r["name"] for r in request(apiserver, "GET", "/api/v1")[1]["resources"]}
    assert {"services", "nodes", "namespaces"} <= names
    es = request(apiserver, "GET", "/apis/discovery.k8s.io/v1")[1]["resources"]
    assert es[0]["kind"] == "EndpointSlice" and es[0]["namespaced"]


def test_create_get_list_delete_with_status_objects(apiserver: ApiServer) -> None:
    code, created = request(apiserver, "POST", "/api/v1/namespaces/default/services", svc("web"))
    assert code == 201 and created["metadata"]["resourceVersion"]
    code, status = request(apiserver, "POST", "/api/v1/namespaces/default/services", svc("web"))
    assert (code, status["reason"], status["code"]) == (409, "AlreadyExists", 409)
    code, listed = request(apiserver, "GET", "/api/v1/services")
    assert code == 200 and listed["kind"] == "ServiceList"
    assert [o["metadata"]["name"] for o in listed["items"]] == ["web"]
    assert listed["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # A Service's DELETE answers with the object as deleted, as upstream's service registry does.
    code, deleted = request(apiserver, "DELETE", "/api/v1/namespaces/default/services/web")
    assert code == 200 and (deleted["kind"], deleted["metadata"]["name"]) == ("Service", "web")
    assert int(deleted["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    code, status = request(apiserver, "GET", "/api/v1/namespaces/default/services/web")
    assert (code, status["reason"], status["message"]) == (404, "NotFound", 'services "web" not found')


def test_put_with_stale_resource_version_conflicts(apiserver: ApiServer) -> None:
    first = apiserver.apply(svc("web"))
    apiserver.apply(svc("web", port=81))
    code, status = request(apiserver, "PUT", "/api/v1/namespaces/default/services/web", first)
    assert (code, status["reason"]) == (409, "Conflict")


def test_field_selector_picks_one_node(apiserver: ApiServer) -> None:
    for name in ("a", "b"):
        apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    _, listed = request(apiserver, "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Db")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["b"]


def test_watch_streams_changes_after_the_version(apiserver: ApiServer) -> None:
    rv = apiserver.apply(svc("old"))["metadata"]["resourceVersion"]
    watch = RawWatch(apiserver, f"/api/v1/services?watch=true&resourceVersion={rv}")
    try:
        apiserver.apply(svc("web"))
        apiserver.apply(svc("web", port=81))
        apiserver.delete("Service", "default", "web")
        events = [watch.next() for _ in range(3)]
    finally:
        watch.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "web"),
        ("MODIFIED", "web"),
        ("DELETED", "web"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_watch_with_label_selector_sees_objects_leave_and_enter(apiserver: ApiServer) -> None:
    rv = apiserver.resource_version
    watch = RawWatch(apiserver, f"/api/v1/services?watch=1&resourceVersion={rv}&labelSelector=%21skip")
    try:
        apiserver.apply(svc("web"))
        apiserver.apply(svc("web", skip="yes"))
        apiserver.apply(svc("web"))
        events = [watch.next()["type"] for _ in range(3)]
    finally:
        watch.close()
    assert events == ["ADDED", "DELETED", "ADDED"]


def test_expired_version_gets_410_error_event(apiserver: ApiServer) -> None:
    rv = apiserver.apply(svc("web"))["metadata"]["resourceVersion"]
    apiserver.apply(svc("web", port=81))
    apiserver.expire_history()
    watch = RawWatch(apiserver, f"/api/v1/services?watch=true&resourceVersion={rv}")
    try:
        event = watch.next()
        with pytest.raises(EOFError):
            watch.next()
    finally:
        watch.close()
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_bookmarks_only_when_asked_and_carry_the_current_version(apiserver: ApiServer) -> None:
    rv = apiserver.resource_version
    watch = RawWatch(apiserver, f"/api/v1/services?watch=true&resourceVersion={rv}&allowWatchBookmarks=true")
    try:
        apiserver.wait_for_watches(1)
        apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        apiserver.bookmark()
        event = watch.next()
    finally:
        watch.close()
    assert event["type"] == "BOOKMARK"
    assert event["object"]["metadata"]["resourceVersion"] == str(apiserver.resource_version)


def test_dropped_watch_ends_without_final_chunk(apiserver: ApiServer) -> None:
    watch = RawWatch(apiserver, f"/api/v1/services?watch=true&resourceVersion={apiserver.resource_version}")
    apiserver.wait_for_watches(1)
    apiserver.drop_watches()
    try:
        with pytest.raises((EOFError, OSError, ValueError)):
            watch.next()
    finally:
        watch.close()


def test_store_survives_stop_and_start_on_the_same_port(apiserver: ApiServer) -> None:
    url = apiserver.url
    apiserver.apply(svc("web"))
    apiserver.stop()
    apiserver.apply(svc("db"))
    assert apiserver.start() == url
    _, listed = request(apiserver, "GET", "/api/v1/namespaces/default/services")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["db", "web"]


def test_fail_with_answers_resource_requests_with_status(apiserver: ApiServer) -> None:
    apiserver.fail_with(503)
    code, status = request(apiserver, "GET", "/api/v1/services")
    assert (code, status["code"]) == (503, 503)
    assert request(apiserver, "GET", "/api")[0] == 200  # discovery still answers
    apiserver.fail_with(None)
    assert request(apiserver, "GET", "/api/v1/services")[0] == 200


def test_patch_flavours(apiserver: ApiServer) -> None:
    apiserver.apply(svc("web"))
    path = "/api/v1/namespaces/default/services/web"
    code, obj = request(apiserver, "PATCH", path, {"metadata": {"labels": {"a": "1"}}}, "application/merge-patch+json")
    assert code == 200 and obj["metadata"]["labels"] == {"a": "1"}
    code, obj = request(
        apiserver, "PATCH", path, [{"op": "replace", "path": "/spec/ports/0/port", "value": 90}], "application/json-patch+json"
    )
    assert code == 200 and obj["spec"]["ports"][0]["port"] == 90
    code, _ = request(apiserver, "PATCH", path, {}, "text/plain")
    assert code == 415


def test_strategic_merge_patch_merges_ports_by_port() -> None:
    current = {"spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}], "selector": {"x": "1"}}}
    patch = {
        "spec": {
            "$setElementOrder/ports": [{"port": 82}, {"port": 80}],
            "ports": [{"port": 82, "name": "c"}, {"port": 81, "$patch": "delete"}, {"port": 80, "name": "A"}],
            "selector": None,
        }
    }
    assert strategic_merge_patch(current, patch, SERVICE) == {
        "spec": {"ports": [{"port": 82, "name": "c"}, {"port": 80, "name": "A"}]}
    }
