"""The lab's API server (kubeproxy/lab/apiserver) against upstream's kube-apiserver v1.37.2: the
requests our API source makes and the live tests rely on, asked of both, and what a client reads
from the answers compared. Every test runs once per server (the `server` fixture) and asserts the
same expectations, so a pass on both means both answer alike; the expectations were read off the
real server.

Covered: lists (at "0", in pages with `limit`/`continue`, consistent), watches with bookmarks
(the event sequence of an add, a modify and a delete, the bookmark before the timeout),
watch-lists (initial events, the `k8s.io/initial-events-end` bookmark; without bookmarks none),
410 Expired, 504 "Too large resource version" (list and watch-list, `Retry-After`), field
selectors (`metadata.name` on Nodes, `spec.clusterIP!=None` on Services, an unsupported field),
the proxy's label selector, 422 for invalid watch options, 404 for a missing object, 400 for a bad
continue token, what a DELETE answers, and the Status objects and content types of all of them.

Differences that remain, none read by our client or relied on by a test:
- objects are stored as given: the real server defaults and allocates fields (clusterIP,
  ipFamilies, type, ...), adds managedFields and `status: {}` to every object, and refuses invalid
  ones (the proxy's kinds are not validated by ours, so that its consumers' tests can feed them
  malformed objects);
- a BOOKMARK's object is the kind's empty object on the real server (`spec: {}`, `status: ...`),
  only kind, apiVersion and metadata on ours;
- the real server sends the timeout bookmark once or twice (its timer ticks each second), ours once;
  its periodic bookmark (each minute) also only once its version moved past the watch's, where
  ours, given a `bookmark_interval` (a test's knob), sends them on a quiet store too;
- the real server gzips a response (watches too) when the client accepts it; ours never does
  (our client asks for identity);
- resourceVersions are etcd's (shared by every kind, starting in the hundreds after the server's
  own writes); ours start at 1;
- a continued page of ours holds the objects as they are now (no snapshots), under the version of
  the first page, where the real one serves the snapshot of that version;
- a watch from a version older than the real server's watch cache gets 410 there only once the
  cache lost events (compaction of its history, or a restart); ours when its history was trimmed
  (`expire_history()`), which is how each is driven here;
- a label selector that does not parse is 400 on the real server, matches nothing on ours.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kubeproxy.lab import netns as L
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.control_plane import ControlPlane
from tests.upstream.conftest import require_upstream_binaries

JSON = dict[str, Any]
NS = "conformance"
SERVICES = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
NODES = "/api/v1/nodes"
PROXY_LABEL_SELECTOR = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
# As our API source asks: a gzipped watch holds its last events in the compressor.
IDENTITY = {"Accept-Encoding": "identity"}


@dataclass
class Server:
    name: str
    api: httpx2.Client
    ours: ApiServer | None = None
    cp: ControlPlane | None = None

    def create(self, path: str, obj: JSON) -> JSON:
        answer = self.api.post(path, json=obj)
        assert answer.status_code == 201, answer.text
        created: JSON = answer.json()
        return created

    def resource_version(self) -> int:
        """The server's current version, as a consistent list reports it."""
        return int(self.api.get(SERVICES).json()["metadata"]["resourceVersion"])

    def expire_history(self) -> None:
        """Make every version before now too old for a watch: ours trims its history; the real
        server's watch cache is restarted (it starts again at the current version)."""
        if self.ours is not None:
            self.ours.expire_history()
            return
        assert self.cp is not None
        restart_apiserver(self.cp)


def restart_apiserver(cp: ControlPlane) -> None:
    old = cp.processes["kube-apiserver"]
    L.stop_process(old, 10)
    with open(cp.workdir / "kube-apiserver.log", "a") as log:
        cp.processes["kube-apiserver"] = subprocess.Popen(old.args, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        cp.check_alive()
        try:
            if cp.api.get("/readyz").status_code == 200:
                return
        except httpx2.TransportError:
            pass
        assert time.monotonic() < deadline, "kube-apiserver did not come back"
        time.sleep(0.1)


def service(name: str, *, headless: bool = False, labels: dict[str, str] | None = None) -> JSON:
    # No selector: upstream's controllers leave it alone (no EndpointSlices of theirs appear).
    spec: JSON = {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def endpoint_slice(name: str) -> JSON:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "a"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.10"], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def populate(server: Server) -> None:
    server.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server.create(SERVICES, service("a"))
    server.create(SERVICES, service("b", labels={"service.kubernetes.io/service-proxy-name": "other"}))
    server.create(SERVICES, service("h", headless=True, labels={"service.kubernetes.io/headless": ""}))
    for name in ("node-a", "node-b"):
        server.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


@pytest.fixture(scope="module", params=["ours", "upstream"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with ExitStack() as stack:
        if request.param == "ours":
            ours = ApiServer()
            url = ours.start()
            stack.callback(ours.stop)
            target = Server("ours", stack.enter_context(httpx2.Client(base_url=url, timeout=15)), ours=ours)
        else:
            bin_dir = require_upstream_binaries()
            ns = stack.enter_context(L.netns("kpconf"))
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kp-conformance-")))
            cp = stack.enter_context(ControlPlane.start(bin_dir, workdir, ns=ns))
            target = Server("upstream", cp.api, cp=cp)
        populate(target)
        yield target


def names(items: list[JSON]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


def watch(
    server: Server, path: str, params: dict[str, str], *, until: int = 0, timeout: float = 15
) -> tuple[httpx2.Response, list[JSON]]:
    """The events of a watch until the server ends it, or until `until` events (0: the end)."""
    events: list[JSON] = []
    with server.api.stream("GET", path, params={"watch": "true", **params}, headers=IDENTITY, timeout=timeout) as answer:
        if answer.status_code != 200:
            answer.read()
            return answer, events
        for line in answer.iter_lines():
            if line.strip():
                events.append(json.loads(line))
                if until and len(events) >= until:
                    break
    return answer, events


def status_shape(body: JSON) -> JSON:
    """A Status as a client reads it, the numbers in its message masked (versions differ)."""
    return {**body, "message": re.sub(r"\d+", "N", body.get("message", ""))}


# ---- lists --------------------------------------------------------------------------------------


def test_list_at_any_version_is_whole_whatever_the_limit(server: Server) -> None:
    answer = server.api.get(SERVICES, params={"resourceVersion": "0", "limit": "1"})
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/json"
    body = answer.json()
    assert (body["kind"], body["apiVersion"]) == ("ServiceList", "v1")
    assert set(body["metadata"]) == {"resourceVersion"}
    assert names(body["items"]) == ["a", "b", "h"]
    # The items carry no kind of their own: the list's kind says it.
    assert all("kind" not in item and "apiVersion" not in item for item in body["items"])


@pytest.mark.parametrize("version", ["", "at-current"])
def test_list_with_a_limit_comes_in_pages(server: Server, version: str) -> None:
    params = {"limit": "1"}
    if version:
        params |= {"resourceVersion": str(server.resource_version()), "resourceVersionMatch": "NotOlderThan"}
    pages: list[tuple[list[str], int | None]] = []
    versions = set()
    while True:
        body = server.api.get(SERVICES, params=params).json()
        meta = body["metadata"]
        pages.append((names(body["items"]), meta.get("remainingItemCount")))
        versions.add(meta["resourceVersion"])
        if not meta.get("continue"):
            break
        params = {"limit": "1", "continue": meta["continue"]}
    assert pages == [(["a"], 2), (["b"], 1), (["h"], None)]
    assert len(versions) == 1, "every page is at the first page's version"


def test_a_selected_page_has_no_remaining_count(server: Server) -> None:
    body = server.api.get(SERVICES, params={"limit": "1", "labelSelector": "!service.kubernetes.io/headless"}).json()
    assert names(body["items"]) == ["a"]
    assert body["metadata"]["continue"]
    assert "remainingItemCount" not in body["metadata"]


def test_a_bad_continue_token_is_a_bad_request(server: Server) -> None:
    answer = server.api.get(SERVICES, params={"limit": "1", "continue": "garbage"})
    assert answer.status_code == 400
    body = answer.json()
    assert (body["reason"], body["code"], "details" in body) == ("BadRequest", 400, False)
    assert body["message"].startswith("invalid continue token: ")


def test_consistent_list_sees_the_latest_write(server: Server) -> None:
    created = server.create(SERVICES, service("fresh"))
    body = server.api.get(SERVICES).json()
    assert int(body["metadata"]["resourceVersion"]) >= int(created["metadata"]["resourceVersion"])
    assert "fresh" in names(body["items"])
    assert server.api.delete(f"{SERVICES}/fresh").status_code == 200


# ---- selectors ----------------------------------------------------------------------------------


def test_node_by_name(server: Server) -> None:
    body = server.api.get(NODES, params={"fieldSelector": "metadata.name=node-a"}).json()
    assert (body["kind"], names(body["items"])) == ("NodeList", ["node-a"])
    assert server.api.get(NODES, params={"fieldSelector": "metadata.name=node-x"}).json()["items"] == []


def test_services_with_a_cluster_ip(server: Server) -> None:
    body = server.api.get(SERVICES, params={"fieldSelector": "spec.clusterIP!=None"}).json()
    assert names(body["items"]) == ["a", "b"]


def test_unsupported_field_label(server: Server) -> None:
    answer = server.api.get(SERVICES, params={"fieldSelector": "spec.foo=x"})
    assert answer.status_code == 400
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "field label not supported: spec.foo",
        "reason": "BadRequest",
        "code": 400,
    }


def test_the_proxys_label_selector(server: Server) -> None:
    body = server.api.get(SERVICES, params={"labelSelector": PROXY_LABEL_SELECTOR}).json()
    assert names(body["items"]) == ["a"]
    body = server.api.get(SERVICES, params={"labelSelector": "service.kubernetes.io/headless"}).json()
    assert names(body["items"]) == ["h"]


def test_a_filtered_watch_list_sends_only_the_selected(server: Server) -> None:
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true",
              "labelSelector": PROXY_LABEL_SELECTOR, "fieldSelector": "spec.clusterIP!=None"}  # fmt: skip
    _, events = watch(server, SERVICES, params, until=2)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [("ADDED", "a"), ("BOOKMARK", None)]


# ---- watches ------------------------------------------------------------------------------------


def test_add_modify_delete_then_a_bookmark_before_the_timeout(server: Server) -> None:
    params = {"resourceVersion": str(server.resource_version()), "allowWatchBookmarks": "true", "timeoutSeconds": "4",
              "fieldSelector": "metadata.name=churn"}  # fmt: skip
    events: list[JSON] = []
    with server.api.stream("GET", SERVICES, params={"watch": "true", **params}, headers=IDENTITY, timeout=15) as answer:
        assert answer.status_code == 200
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.headers["Transfer-Encoding"] == "chunked"
        # The changes come after the watch's version, so it is owed them however soon it reads.
        created = server.create(SERVICES, service("churn"))
        changed = {**created, "metadata": {**created["metadata"], "labels": {"changed": "yes"}}}
        assert server.api.put(f"{SERVICES}/churn", json=changed).status_code == 200
        deleted = server.api.delete(f"{SERVICES}/churn")
        events = [json.loads(line) for line in answer.iter_lines() if line.strip()]
    # A Service's DELETE answers with the object as deleted (its registry returns it).
    assert (deleted.status_code, deleted.json()["kind"]) == (200, "Service")
    changes = [e for e in events if e["type"] != "BOOKMARK"]
    assert [(e["type"], e["object"]["kind"], e["object"]["metadata"].get("labels", {})) for e in changes] == [
        ("ADDED", "Service", {}),
        ("MODIFIED", "Service", {"changed": "yes"}),
        ("DELETED", "Service", {"changed": "yes"}),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in changes]
    assert rvs == sorted(rvs) and rvs[0] == int(created["metadata"]["resourceVersion"])
    assert rvs[2] == int(deleted.json()["metadata"]["resourceVersion"])
    bookmarks = events[len(changes) :]
    assert bookmarks and all(e["type"] == "BOOKMARK" for e in bookmarks), "bookmarks end the watch"
    assert all(int(e["object"]["metadata"]["resourceVersion"]) >= rvs[2] for e in bookmarks)
    assert {(e["object"]["kind"], e["object"]["apiVersion"]) for e in bookmarks} == {("Service", "v1")}


def test_a_quiet_watch_ends_without_a_bookmark(server: Server) -> None:
    """Nothing newer than the watch's version: the timeout bookmark would tell the client
    nothing, and neither server sends it."""
    params = {"resourceVersion": str(server.resource_version()), "allowWatchBookmarks": "true", "timeoutSeconds": "3"}
    answer, events = watch(server, SERVICES, params)
    assert (answer.status_code, events) == (200, [])


def test_an_endpoint_slice_delete_answers_a_status(server: Server) -> None:
    created = server.create(SLICES, endpoint_slice("gone"))
    answer = server.api.delete(f"{SLICES}/gone")
    assert answer.status_code == 200
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "gone", "group": "discovery.k8s.io", "kind": "endpointslices", "uid": created["metadata"]["uid"]},
    }


def test_watch_list_ends_its_initial_events_with_an_annotated_bookmark(server: Server) -> None:
    listed = server.resource_version()
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}
    answer, events = watch(server, SERVICES, params, until=4)
    assert answer.headers["Content-Type"] == "application/json"
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "h"), ("BOOKMARK", None)
    ]  # fmt: skip
    assert all(e["object"]["kind"] == "Service" for e in events)
    end = events[-1]["object"]["metadata"]
    assert end["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(end["resourceVersion"]) >= listed


def test_watch_list_without_bookmarks_sends_no_end_marker(server: Server) -> None:
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "1"}
    _, events = watch(server, SERVICES, params)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "h")]


INVALID_WATCHES = {
    "match without initial events": (
        {"resourceVersionMatch": "NotOlderThan"},
        "resourceVersionMatch",
        "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
    ),
    "initial events without match": (
        {"sendInitialEvents": "true"},
        "resourceVersionMatch",
        "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
    ),
}


@pytest.mark.parametrize("case", INVALID_WATCHES)
def test_invalid_watch_options_are_422(server: Server, case: str) -> None:
    params, field, message = INVALID_WATCHES[case]
    answer, _ = watch(server, SERVICES, params)
    assert (answer.status_code, answer.headers["Content-Type"]) == (422, "application/json")
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'ListOptions.meta.k8s.io "" is invalid: {field}: {message}',
        "reason": "Invalid",
        "details": {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": "FieldValueForbidden", "message": message, "field": field}],
        },
        "code": 422,
    }


# ---- errors -------------------------------------------------------------------------------------


def test_missing_object_is_404(server: Server) -> None:
    answer = server.api.get(f"{SERVICES}/missing")
    assert (answer.status_code, answer.headers["Content-Type"]) == (404, "application/json")
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'services "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "services"},
        "code": 404,
    }


TOO_LARGE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Timeout: Too large resource version: N, current: N",
    "reason": "Timeout",
    "details": {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    },
    "code": 504,
}


def test_list_from_the_future_is_too_large(server: Server) -> None:
    future = server.resource_version() + 1000
    answer = server.api.get(SERVICES, params={"resourceVersion": str(future)})
    assert (answer.status_code, answer.headers["Retry-After"]) == (504, "1")
    assert status_shape(answer.json()) == TOO_LARGE
    assert answer.json()["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")


def test_watch_list_from_the_future_ends_with_too_large(server: Server) -> None:
    future = server.resource_version() + 1000
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true",
              "resourceVersion": str(future)}  # fmt: skip
    answer, events = watch(server, SERVICES, params)
    assert answer.status_code == 200
    assert [e["type"] for e in events] == ["ERROR"]
    assert status_shape(events[0]["object"]) == TOO_LARGE


def test_watch_from_an_expired_version_is_410(server: Server) -> None:
    """Last in the module: it restarts the real server."""
    old = server.resource_version()
    server.create(SERVICES, service("later"))
    server.expire_history()
    for _ in range(100):  # a watch cache still starting answers 429 with Retry-After: ask again
        answer, events = watch(server, SERVICES, {"resourceVersion": str(old), "allowWatchBookmarks": "true"})
        if answer.status_code != 429:
            break
        time.sleep(float(answer.headers.get("Retry-After", "1")))
    assert answer.status_code == 200
    assert [e["type"] for e in events] == ["ERROR"]
    gone = events[0]["object"]
    assert status_shape(gone) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: N (N)",
        "reason": "Expired",
        "code": 410,
    }
    assert gone["message"].startswith(f"too old resource version: {old} (")
