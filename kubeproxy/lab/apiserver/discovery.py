"""Discovery: `/version`, `/api`, `/apis`, the group and resource lists, and the minimal OpenAPI
v3 documents kubectl reads before it patches."""

from __future__ import annotations

from collections.abc import Sequence

from kubeproxy.lab.apiserver.resources import ResourceType
from kubeproxy.lab.apiserver.status_errors import JSON

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-kubeproxy-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def answer(resources: Sequence[ResourceType], port: int, path: str, method: str) -> JSON | None:
    """The discovery document at `path` for a server serving `resources` on 127.0.0.1:`port`, or
    None when `path` is not a discovery path (then it may be a resource URL)."""
    if method != "GET":
        return None
    path = path.rstrip("/") or "/"
    groups = sorted({rt.group for rt in resources if rt.group})
    if path == "/version":
        return SERVER_VERSION
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}],
        }
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(resources, g) for g in groups]}
    for group in groups:
        if path == f"/apis/{group}":
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(resources, group)}
    for prefix in sorted({rt.prefix() for rt in resources}):
        if path == prefix:
            return _resource_list(resources, prefix)
    if path == "/openapi/v3":
        return {
            "paths": {
                prefix.lstrip("/"): {"serverRelativeURL": f"/openapi/v3{prefix}?hash=lab{port}"}
                for prefix in sorted({rt.prefix() for rt in resources})
            }
        }
    if path.startswith("/openapi/v3/"):
        prefix = path.removeprefix("/openapi/v3")
        if any(rt.prefix() == prefix for rt in resources):
            return _openapi_v3(resources, prefix)
    return None


def _group(resources: Sequence[ResourceType], group: str) -> JSON:
    versions = sorted({rt.version for rt in resources if rt.group == group})
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def _resource_list(resources: Sequence[ResourceType], prefix: str) -> JSON:
    types = [rt for rt in resources if rt.prefix() == prefix]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": types[0].api_version,
        "resources": [
            {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": _VERBS,
                **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
            }
            for rt in types
        ],
    }


def _openapi_v3(resources: Sequence[ResourceType], prefix: str) -> JSON:
    """Just enough for kubectl to see that PATCH takes `fieldValidation`: it then leaves
    validation to the server (which accepts everything) instead of wanting the full schema."""
    paths: JSON = {}
    for rt in (rt for rt in resources if rt.prefix() == prefix):
        item = f"{prefix}/namespaces/{{namespace}}/{rt.plural}/{{name}}" if rt.namespaced else f"{prefix}/{rt.plural}/{{name}}"
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[item] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]}, "paths": paths}
