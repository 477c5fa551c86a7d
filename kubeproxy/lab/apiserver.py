"""A small in-memory Kubernetes API server for tests and demos.

It speaks enough of the real protocol that both our reflector and the real `kubectl` can use it:

- discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`) and a minimal
  `/openapi/v3` that tells `kubectl` the server validates fields itself (so `kubectl apply` does not
  need the full schema);
- list and watch for Services, EndpointSlices, Nodes and Namespaces, cluster-wide and per namespace,
  with `fieldSelector` (`metadata.name`, `metadata.namespace`) and simple `labelSelector`s; with
  `resources=DEPLOY_RESOURCES` also DaemonSets, ConfigMaps, ServiceAccounts, ClusterRoles and
  ClusterRoleBindings, so that `kubectl apply -f deploy/` works;
- watch streams are chunked JSON, one event per line, from a `resourceVersion`; a version older
  than the retained history gets an ERROR event carrying a 410 Status, as the real server does;
  BOOKMARKs are sent when the client asked for them (periodically, or on demand via `bookmark()`),
  never older than the version the watch started from; `sendInitialEvents=true` (watch-list)
  sends the state, then a BOOKMARK annotated `k8s.io/initial-events-end`;
- a version newer than the store's, as upstream's watch cache answers it after waiting
  `block_timeout` (3 s) for the store to catch up: a list gets a 504 Timeout "Too large resource
  version" Status (cause ResourceVersionTooLarge, `Retry-After: 1`), a watch-list gets it as an
  ERROR event, and a plain watch is accepted and stays silent until the store passes that version;
- create, update, patch (JSON merge, strategic merge for the fields our kinds use, JSON patch,
  server-side apply) and delete, with Status objects and the real 404/409 reasons; `dryRun=All`
  answers as the real write would and stores nothing.

Objects are stored as plain JSON dicts with one global, monotonically increasing resourceVersion,
like etcd behind the real server. The store outlives the HTTP listener, so `stop()` then `start()`
simulates the API server going down and coming back with the same state; `drop_watches()` cuts
every open watch mid-stream; `fail_with(503)` makes resource requests fail; `expire_history()`
compacts the event history so older watches get 410 Gone; `restart_with_fresh_store()` comes back
with the same objects under versions that start again near 1 (etcd replaced or restored from an
old backup); `end_watches_with(status)` ends open watches with an ERROR event; `bookmark(rv)`
sends a bookmark carrying any version, even an older one.

It binds 127.0.0.1 only and does no authentication. The proxy's own kinds are not validated: a
malformed Service is stored as given, which is what the tests of our consumers want. The deploy
kinds are validated as the real server does (schema from lightkube's models, `fieldValidation`,
the rules upstream enforces for what deploy/ uses), so a broken manifest fails here too; they
cannot be created in a namespace that does not exist (such a server starts with the system ones).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import itertools
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import yaml
from lightkube.resources import apps_v1 as lightkube_apps
from lightkube.resources import core_v1 as lightkube_core
from lightkube.resources import rbac_authorization_v1 as lightkube_rbac

log = logging.getLogger("kubeproxy.lab.apiserver")

JSON = dict[str, Any]

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


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives in the URL space and what discovery says about it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    # Strategic merge patch: list fields (path of map keys from the object root) merged by a key
    # instead of replaced; everything else is atomic, which is right for EndpointSlice lists.
    merge_keys: tuple[tuple[tuple[str, ...], str], ...] = ()
    # Validated kinds: the lightkube model whose schema decodes the object (unknown fields, types)
    # and a check of the rules the real server enforces on top. None: stored as given.
    schema: type | None = None
    check: Callable[[JSON, JSON | None], list[Cause]] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


_META_MERGE_KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("metadata", "ownerReferences"), "uid"),
    (("metadata", "managedFields"), "manager"),
)

SERVICE = ResourceType("", "v1", "Service", "services", True, ("svc",), (*_META_MERGE_KEYS, (("spec", "ports"), "port")))
ENDPOINT_SLICE = ResourceType("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, (), _META_MERGE_KEYS)
NODE = ResourceType(
    "",
    "v1",
    "Node",
    "nodes",
    False,
    ("no",),
    (*_META_MERGE_KEYS, (("status", "addresses"), "type"), (("status", "conditions"), "type")),
)
NAMESPACE = ResourceType("", "v1", "Namespace", "namespaces", False, ("ns",), _META_MERGE_KEYS)

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (SERVICE, ENDPOINT_SLICE, NODE, NAMESPACE)

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class ApiError(Exception):
    """An error the server answers with a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> JSON:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


# Upstream's watch cache waits this long for its resourceVersion to reach the one a request asks
# for before it answers "Too large resource version" (blockTimeout), and tells the client to retry
# after this many seconds (resourceVersionTooHighRetrySeconds).
BLOCK_TIMEOUT = 3.0
TOO_LARGE_RETRY_SECONDS = 1


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """What the real server answers for a read from a resourceVersion newer than anything it has
    (storage.NewTooLargeResourceVersionError): a 504 Timeout whose cause says why, with a retry hint.

    A list gets it as the HTTP answer; a watch-list (`sendInitialEvents=true`) gets it as an ERROR
    event inside a 200 stream. A plain watch from such a version gets no error at all: the server
    accepts it and stays silent until its own versions pass the one asked for, as upstream's does.
    """
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": TOO_LARGE_RETRY_SECONDS,
        },
    )


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.plural} "{name}" not found', {"name": name, "kind": rt.plural})


# ---------------------------------------------------------------------------------------------
# Selectors


@dataclass(frozen=True)
class Selector:
    """Field and label selectors as the real server parses them (the subset we need).

    Fields: `metadata.name`, `metadata.namespace` with `=`, `==`, `!=`.
    Labels: `key`, `!key`, `key=value`, `key==value`, `key!=value`, comma-separated (AND).
    """

    fields: tuple[tuple[str, str, str], ...] = ()
    labels: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def parse(cls, field_selector: str, label_selector: str) -> Selector:
        return cls(_parse_terms(field_selector, "field"), _parse_terms(label_selector, "label"))

    def matches(self, obj: JSON) -> bool:
        meta = obj.get("metadata") or {}
        for key, op, value in self.fields:
            have = str(meta.get(key.removeprefix("metadata."), "") or "")
            if (have == value) != (op == "="):
                return False
        labels = meta.get("labels") or {}
        for key, op, value in self.labels:
            if op == "exists" and key not in labels:
                return False
            if op == "!exists" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        return True


def _parse_terms(text: str, what: str) -> tuple[tuple[str, str, str], ...]:
    terms = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in raw:
            key, value = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif what == "label":
            terms.append((raw.lstrip("!").strip(), "!exists" if raw.startswith("!") else "exists", ""))
        else:
            raise ApiError(400, "BadRequest", f"invalid {what} selector {raw!r}")
        if what == "field" and terms[-1][0] not in ("metadata.name", "metadata.namespace"):
            raise ApiError(400, "BadRequest", f'field label not supported: "{terms[-1][0]}"')
    return tuple(terms)


# ---------------------------------------------------------------------------------------------
# Patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, rt: ResourceType, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch for the list fields `rt.merge_keys` names; other lists are atomic.

    Understands the directives `kubectl apply` emits: `$patch` (replace/delete/merge),
    `$retainKeys`, `$setElementOrder/<list>` and `$deleteFromPrimitiveList/<list>`.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    merge_keys = dict(rt.merge_keys)
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and (*path, key) in merge_keys:
            result[key] = _merge_list(result.get(key) or [], value, merge_keys[(*path, key)], rt, (*path, key))
        else:
            merged = strategic_merge_patch(result.get(key), value, rt, (*path, key))
            if merged is None and isinstance(value, dict) and value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = merged
    for name, order in orders.items():
        if isinstance(result.get(name), list) and (*path, name) in merge_keys:
            result[name] = _order_list(result[name], order, merge_keys[(*path, name)])
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str, rt: ResourceType, path: tuple[str, ...]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    merged = [copy.deepcopy(i) for i in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            merged.append(copy.deepcopy(item))
            continue
        index = next((n for n, cur in enumerate(merged) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(strategic_merge_patch({}, item, rt, path))
        else:
            merged[index] = strategic_merge_patch(merged[index], item, rt, path)
    return merged


def _order_list(items: list[Any], order: list[Any], key: str) -> list[Any]:
    rank = {json.dumps(o.get(key) if isinstance(o, dict) else o): n for n, o in enumerate(order)}

    def position(item: Any) -> int:
        probe = item.get(key) if isinstance(item, dict) else item
        return rank.get(json.dumps(probe), len(rank))

    return sorted(items, key=position)


def json_patch(target: JSON, operations: list[JSON]) -> JSON:
    """RFC 6902 JSON patch: add, remove, replace, test."""
    doc = copy.deepcopy(target)
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]]
        if not parts:
            raise ApiError(422, "Invalid", f"json patch: cannot {op.get('op')} the whole document")
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        kind = op.get("op")
        if kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op.get("value"))
                else:
                    parent[index] = op.get("value")
            else:
                parent[last] = op.get("value")
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif kind == "test":
            have = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if have != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch test failed at {op.get('path')}")
        else:
            raise ApiError(422, "Invalid", f"json patch operation {kind!r} not supported")
    return doc


# ---------------------------------------------------------------------------------------------
# Validation of the workload and RBAC kinds
#
# The proxy's own kinds (Service, EndpointSlice, Node) are stored as given, so that consumer tests
# can feed malformed objects. The kinds served for `kubectl apply -f deploy/` are checked the way
# the real server checks them, so that a broken manifest fails here as it would on a cluster:
# decoding against the schema (lightkube's models of the Kubernetes OpenAPI: unknown fields are
# dropped, or refused with fieldValidation=Strict; a wrong type is a 400), then the rules
# upstream's validation enforces for what deploy/ uses (a 422 Invalid listing every cause).

FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


@dataclass(frozen=True)
class Cause:
    """One reason an object is invalid, as a Status cause: `field: message`."""

    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...: upstream's CauseType
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _required(path: str, detail: str = "") -> Cause:
    return Cause(path, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def _invalid(path: str, value: Any, why: str) -> Cause:
    return Cause(path, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {why}")


def _duplicate(path: str, value: Any) -> Cause:
    return Cause(path, "FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}")


def _unsupported(path: str, value: Any, supported: tuple[str, ...]) -> Cause:
    listed = ", ".join(json.dumps(s) for s in supported)
    return Cause(path, "FieldValueNotSupported", f"Unsupported value: {json.dumps(value)}: supported values: {listed}")


def _qualified_kind(rt: ResourceType) -> str:
    return f"{rt.kind}.{rt.group}" if rt.group else rt.kind


def invalid_error(rt: ResourceType, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid, worded as the real server words it."""
    listed = str(causes[0]) if len(causes) == 1 else "[" + ", ".join(map(str, causes)) + "]"
    details = {
        "name": name,
        "group": rt.group,
        "kind": rt.kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    return ApiError(422, "Invalid", f'{_qualified_kind(rt)} "{name}" is invalid: {listed}', details)


@dataclass
class _Decoded:
    unknown: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    wrong_type: list[str] = field(default_factory=list)


_JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _decode(value: Any, t: msgspec.inspect.Type, path: str, out: _Decoded) -> Any:
    """`value` as the schema type `t` sees it: unknown fields dropped and noted, wrong types noted."""
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        if value is None and any(isinstance(x, mi.NoneType) for x in t.types):
            return None
        candidates = [x for x in t.types if not isinstance(x, mi.NoneType)]
        fitting = next((x for x in candidates if _fits(value, x)), None)
        if fitting is None:
            out.wrong_type.append(_type_problem(path, value, candidates))
            return value
        return _decode(value, fitting, path, out)
    if not _fits(value, t):
        out.wrong_type.append(_type_problem(path, value, [t]))
        return value
    if isinstance(t, mi.StructType):
        fields = {f.encode_name: f for f in t.fields}
        result = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key not in fields:
                out.unknown.append(where)
                continue
            result[key] = _decode(item, fields[key].type, where, out)
        for f in t.fields:
            if f.required and value.get(f.encode_name) is None:
                out.missing.append(f"{path}.{f.encode_name}" if path else f.encode_name)
        return result
    if isinstance(t, mi.ListType):
        return [_decode(item, t.item_type, f"{path}[{n}]", out) for n, item in enumerate(value)]
    if isinstance(t, mi.DictType):
        return {k: _decode(v, t.value_type, f"{path}[{k}]", out) for k, v in value.items()}
    return value


def _fits(value: Any, t: msgspec.inspect.Type) -> bool:
    mi = msgspec.inspect
    if isinstance(t, mi.AnyType):
        return True
    if isinstance(t, mi.StructType | mi.DictType):
        return isinstance(value, dict)
    if isinstance(t, mi.ListType):
        return isinstance(value, list)
    if isinstance(t, mi.StrType | mi.DateTimeType):
        return isinstance(value, str)
    if isinstance(t, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(t, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(t, mi.UnionType):
        return any(_fits(value, x) for x in t.types)
    return isinstance(t, mi.NoneType) and value is None


def _type_problem(path: str, value: Any, types: list[msgspec.inspect.Type]) -> str:
    mi = msgspec.inspect
    names = {
        mi.StructType: "object", mi.DictType: "object", mi.ListType: "array", mi.StrType: "string",
        mi.DateTimeType: "string", mi.BoolType: "boolean", mi.IntType: "integer", mi.FloatType: "number",
    }  # fmt: skip
    wanted = " or ".join(dict.fromkeys(names.get(type(x), type(x).__name__) for x in types))
    have = "null" if value is None else _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    return f"{path or 'the object'}: expected {wanted}, got {have}"


_schema = functools.cache(msgspec.inspect.type_info)


def admit(rt: ResourceType, obj: JSON, old: JSON | None, field_validation: str = "") -> tuple[JSON, list[str]]:
    """Decode and validate an object of a validated kind; returns it (unknown fields dropped) and
    the warnings to send. Raises ApiError as the real server would: 400 for an undecodable object
    or, with fieldValidation=Strict, an unknown field; 422 for an invalid one."""
    if rt.schema is None:
        return obj, []
    meta = obj.get("metadata")
    name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
    decoded = _Decoded()
    obj = _decode(obj, _schema(rt.schema), "", decoded)
    cannot = f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}'
    if decoded.wrong_type:
        raise ApiError(400, "BadRequest", f"{cannot}: {'; '.join(decoded.wrong_type)}")
    unknown = [f'unknown field "{path}"' for path in decoded.unknown]
    if unknown and field_validation == "Strict":
        raise ApiError(400, "BadRequest", f"{cannot}: strict decoding error: {', '.join(unknown)}")
    causes = [_required(path) for path in decoded.missing]
    causes += _check_metadata(rt, obj.get("metadata") or {}, "metadata")
    if rt.check is not None:
        causes += rt.check(obj, old)
    if causes:
        raise invalid_error(rt, name, causes)
    return obj, unknown if field_validation in ("", "Warn") else []


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_ALNUM_ENDS = "and must start and end with an alphanumeric character"
_SUBDOMAIN_RULE = f"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', {_ALNUM_ENDS}"
_LABEL_KEY_RULE = f"name part must consist of alphanumeric characters, '-', '_' or '.', {_ALNUM_ENDS}"
_LABEL_VALUE_RULE = f"a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', {_ALNUM_ENDS}"
_ENV_NAME_RULE = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', "
    "and must not start with a digit"
)
_CONFIG_KEY_RULE = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"


def _check_metadata(rt: ResourceType, meta: JSON, path: str) -> list[Cause]:
    causes: list[Cause] = []
    name = meta.get("name")
    if name:
        if rt.group == "rbac.authorization.k8s.io":
            # RBAC names are path segments (system:node-proxier is valid), not DNS names.
            if name in (".", "..") or "/" in name or "%" in name:
                causes.append(_invalid(f"{path}.name", name, "may not be '.' or '..' and may not contain '/' or '%'"))
        elif len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            causes.append(_invalid(f"{path}.name", name, _SUBDOMAIN_RULE))
    causes += _check_labels(meta.get("labels") or {}, f"{path}.labels")
    return causes


def _check_labels(labels: JSON, path: str) -> list[Cause]:
    causes = []
    for key, value in labels.items():
        prefix, _, label = str(key).rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)) or len(label) > 63 or not _LABEL_NAME.fullmatch(label):
            causes.append(_invalid(path, key, _LABEL_KEY_RULE))
        if not isinstance(value, str) or len(value) > 63 or (value and not _LABEL_NAME.fullmatch(value)):
            causes.append(_invalid(f"{path}[{key}]", value, _LABEL_VALUE_RULE))
    return causes


def selector_matches(selector: JSON, labels: JSON) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


# The downward API fields a container's env may reference (upstream's validEnvDownwardAPIFieldPathExpressions).
_ENV_FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)  # fmt: skip
_ENV_FIELD_MAP_KEY = re.compile(r"metadata\.(labels|annotations)\['[^']+'\]")


def _check_daemon_set(obj: JSON, old: JSON | None) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if selector is not None:
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            causes.append(_invalid("spec.selector", selector, "empty selector is invalid for daemonset"))
        elif not selector_matches(selector, labels):
            causes.append(_invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
        causes += _check_labels(selector.get("matchLabels") or {}, "spec.selector.matchLabels")
        operators = ("In", "NotIn", "Exists", "DoesNotExist")
        for n, expr in enumerate(selector.get("matchExpressions") or []):
            if expr.get("operator") not in operators:
                causes.append(_unsupported(f"spec.selector.matchExpressions[{n}].operator", expr.get("operator"), operators))
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        causes.append(_invalid("spec.selector", selector, "field is immutable"))
    causes += _check_labels(labels, "spec.template.metadata.labels")
    strategy = (spec.get("updateStrategy") or {}).get("type")
    if strategy is not None and strategy not in ("OnDelete", "RollingUpdate"):
        causes.append(_unsupported("spec.updateStrategy.type", strategy, ("OnDelete", "RollingUpdate")))
    if spec.get("template") is not None:
        causes += _check_pod_spec((spec["template"].get("spec") or {}), "spec.template.spec")
    return causes


def _check_pod_spec(pod: JSON, path: str) -> list[Cause]:
    causes: list[Cause] = []
    restart = pod.get("restartPolicy")
    if restart is not None and restart != "Always":
        causes.append(_unsupported(f"{path}.restartPolicy", restart, ("Always",)))
    volumes: set[str] = set()
    for n, volume in enumerate(pod.get("volumes") or []):
        if volume.get("name") in volumes:
            causes.append(_duplicate(f"{path}.volumes[{n}].name", volume.get("name")))
        volumes.add(volume.get("name"))
        sources = [k for k in volume if k != "name"]
        if not sources:
            causes.append(_required(f"{path}.volumes[{n}]", "must specify a volume type"))
        elif len(sources) > 1:
            causes.append(
                Cause(f"{path}.volumes[{n}]", "FieldValueForbidden", "Forbidden: may not specify more than 1 volume type")
            )
    if not pod.get("containers"):
        causes.append(_required(f"{path}.containers"))
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for n, container in enumerate(pod.get(group) or []):
            where = f"{path}.{group}[{n}]"
            if container.get("name") in names:
                causes.append(_duplicate(f"{where}.name", container.get("name")))
            names.add(container.get("name"))
            causes += _check_container(container, where, volumes)
    return causes


def _check_container(container: JSON, where: str, volumes: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    if not container.get("image"):
        causes.append(_required(f"{where}.image"))
    for m, mount in enumerate(container.get("volumeMounts") or []):
        if mount.get("name") not in volumes:
            causes.append(
                Cause(f"{where}.volumeMounts[{m}].name", "FieldValueNotFound", f"Not found: {json.dumps(mount.get('name'))}")
            )
    for m, env in enumerate(container.get("env") or []):
        if not _ENV_NAME.fullmatch(env.get("name") or ""):
            causes.append(_invalid(f"{where}.env[{m}].name", env.get("name"), _ENV_NAME_RULE))
        field_path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if field_path is not None and field_path not in _ENV_FIELD_PATHS and not _ENV_FIELD_MAP_KEY.fullmatch(field_path):
            causes.append(_unsupported(f"{where}.env[{m}].valueFrom.fieldRef.fieldPath", field_path, _ENV_FIELD_PATHS))
    return causes


def _check_policy_rules(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    for n, rule in enumerate(obj.get("rules") or []):
        where = f"rules[{n}]"
        if not rule.get("verbs"):
            causes.append(_required(f"{where}.verbs", "verbs must contain at least one value"))
        if rule.get("nonResourceURLs"):
            if rule.get("apiGroups") or rule.get("resources"):
                causes.append(
                    _invalid(
                        f"{where}.nonResourceURLs",
                        rule["nonResourceURLs"],
                        "rules cannot apply to both regular resources and non-resource URLs",
                    )
                )
            continue
        if not rule.get("apiGroups"):
            causes.append(_required(f"{where}.apiGroups", "resource rules must supply at least one api group"))
        if not rule.get("resources"):
            causes.append(_required(f"{where}.resources", "resource rules must supply at least one resource"))
    return causes


_RBAC_GROUP = "rbac.authorization.k8s.io"


def _check_cluster_role_binding(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    ref = obj.get("roleRef") or {}
    if ref.get("apiGroup") not in (None, _RBAC_GROUP):
        causes.append(_unsupported("roleRef.apiGroup", ref["apiGroup"], (_RBAC_GROUP,)))
    if ref.get("kind") not in (None, "ClusterRole"):
        causes.append(_unsupported("roleRef.kind", ref["kind"], ("ClusterRole",)))
    if old is not None and ref != old.get("roleRef"):
        causes.append(_invalid("roleRef", ref, "cannot change roleRef"))
    for n, subject in enumerate(obj.get("subjects") or []):
        where, kind, group = f"subjects[{n}]", subject.get("kind"), subject.get("apiGroup") or ""
        if kind == "ServiceAccount":
            if group:
                causes.append(_unsupported(f"{where}.apiGroup", group, ("",)))
            if not subject.get("namespace"):
                causes.append(_required(f"{where}.namespace"))
        elif kind in ("User", "Group"):
            if group != _RBAC_GROUP:
                causes.append(_unsupported(f"{where}.apiGroup", group, (_RBAC_GROUP,)))
        else:
            causes.append(_unsupported(f"{where}.kind", kind, ("ServiceAccount", "User", "Group")))
    return causes


def _check_config_map(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    for section, values in (("data", data), ("binaryData", binary)):
        for key in values:
            if len(key) > 253 or not _CONFIG_KEY.fullmatch(key) or key in (".", ".."):
                causes.append(_invalid(f"{section}[{key}]", key, _CONFIG_KEY_RULE))
            if section == "binaryData" and key in data:
                causes.append(_duplicate(f"binaryData[{key}]", key))
    return causes


_CONTAINER_LISTS = (("spec", "template", "spec", "containers"), ("spec", "template", "spec", "initContainers"))
DAEMON_SET = ResourceType(
    "apps",
    "v1",
    "DaemonSet",
    "daemonsets",
    True,
    ("ds",),
    (
        *_META_MERGE_KEYS,
        *((path, "name") for path in _CONTAINER_LISTS),
        *(((*path, "env"), "name") for path in _CONTAINER_LISTS),
        *(((*path, "volumeMounts"), "mountPath") for path in _CONTAINER_LISTS),
        *(((*path, "ports"), "containerPort") for path in _CONTAINER_LISTS),
        (("spec", "template", "spec", "volumes"), "name"),
        (("spec", "template", "spec", "imagePullSecrets"), "name"),
    ),
    schema=lightkube_apps.DaemonSet,
    check=_check_daemon_set,
)
SERVICE_ACCOUNT = ResourceType(
    "", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",), (*_META_MERGE_KEYS, (("secrets",), "name")),
    schema=lightkube_core.ServiceAccount,
)  # fmt: skip
CONFIG_MAP = ResourceType(
    "", "v1", "ConfigMap", "configmaps", True, ("cm",), _META_MERGE_KEYS, schema=lightkube_core.ConfigMap, check=_check_config_map
)
CLUSTER_ROLE = ResourceType(
    _RBAC_GROUP, "v1", "ClusterRole", "clusterroles", False, (), _META_MERGE_KEYS,
    schema=lightkube_rbac.ClusterRole, check=_check_policy_rules,
)  # fmt: skip
CLUSTER_ROLE_BINDING = ResourceType(
    _RBAC_GROUP, "v1", "ClusterRoleBinding", "clusterrolebindings", False, (), _META_MERGE_KEYS,
    schema=lightkube_rbac.ClusterRoleBinding, check=_check_cluster_role_binding,
)  # fmt: skip

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

# What `kubectl apply -f deploy/` needs on top of the proxy's own kinds.
DEPLOY_RESOURCES: tuple[ResourceType, ...] = (
    *DEFAULT_RESOURCES,
    DAEMON_SET,
    SERVICE_ACCOUNT,
    CONFIG_MAP,
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
)


# ---------------------------------------------------------------------------------------------
# Store


@dataclass(frozen=True)
class Event:
    """One change in the history: `obj` is the new state (last state for DELETED), `old` the previous."""

    rv: int
    type: str
    rt: ResourceType
    obj: JSON
    old: JSON | None


@dataclass
class Store:
    """Objects per resource, a global resourceVersion, and a bounded event history for watches.

    All access goes through `cond`; watchers wait on it for new events, bookmarks and shutdown.
    """

    history_size: int = 1000
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    cond: threading.Condition = field(default_factory=threading.Condition)
    rv: int = 1
    # Watches from a version below this cannot be served any more (the history was compacted).
    compacted_rv: int = 1
    objects: dict[tuple[str, str, str], JSON] = field(default_factory=dict)
    history: deque[Event] = field(default_factory=deque)
    bookmark_generation: int = 0
    # Fault injection: the resourceVersion the next BOOKMARK carries whatever it is (None: the
    # current one), and an ERROR event that ends every watch open when it was set.
    bookmark_rv: int | None = None
    error_generation: int = 0
    error_status: JSON | None = None
    # Open watch streams, so that tests can wait for a client to be watching instead of sleeping.
    watchers: int = 0
    _uids: Iterator[int] = field(default_factory=itertools.count)

    def _record(self, type_: str, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        self.history.append(Event(self.rv, type_, rt, obj, old))
        while len(self.history) > self.history_size:
            self.compacted_rv = self.history.popleft().rv
        self.cond.notify_all()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get(self, rt: ResourceType, namespace: str, name: str) -> JSON:
        with self.cond:
            obj = self.objects.get((rt.plural, namespace, name))
            if obj is None:
                raise _not_found(rt, name)
            return copy.deepcopy(obj)

    def list(self, rt: ResourceType, namespace: str | None, selector: Selector) -> tuple[list[JSON], int]:
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for (plural, ns, _), obj in sorted(self.objects.items(), key=lambda kv: kv[0])
                if plural == rt.plural and (namespace is None or ns == namespace) and selector.matches(obj)
            ]
            return items, self.rv

    def create(self, rt: ResourceType, namespace: str, obj: JSON, *, dry_run: bool = False) -> JSON:
        """Store a new object. `dry_run`: every check and the answer, but nothing stored (dryRun=All)."""
        obj = self._normalise(rt, namespace, obj)
        meta = obj["metadata"]
        with self.cond:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._uids):05d}"
            name = meta.get("name")
            if not name:
                raise ApiError(422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value")
            key = (rt.plural, namespace, name)
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{rt.plural} "{name}" already exists', {"name": name, "kind": rt.plural})
            meta.pop("resourceVersion", None)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))
            meta["generation"] = 1
            if dry_run:
                # As the real server: a dry-run create has no resourceVersion (nothing was written).
                return copy.deepcopy(obj)
            meta["resourceVersion"] = self._next_rv()
            self.objects[key] = obj
            self._record("ADDED", rt, copy.deepcopy(obj), None)
            return copy.deepcopy(obj)

    def update(
        self, rt: ResourceType, namespace: str, name: str, obj: JSON, *, check_rv: bool = True, dry_run: bool = False
    ) -> JSON:
        obj = self._normalise(rt, namespace, obj)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the URL ({name})")
        meta["name"] = name
        with self.cond:
            key = (rt.plural, namespace, name)
            old = self.objects.get(key)
            if old is None:
                raise _not_found(rt, name)
            if check_rv and meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {rt.plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    {"name": name, "kind": rt.plural},
                )
            for immutable in ("uid", "creationTimestamp"):
                meta[immutable] = old["metadata"].get(immutable)
            generation = old["metadata"].get("generation", 1)
            meta["generation"] = generation + (1 if obj.get("spec") != old.get("spec") else 0)
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if obj == old or dry_run:
                # The real server does not bump the version (or emit an event) for a no-op update.
                return copy.deepcopy(old)
            meta["resourceVersion"] = self._next_rv()
            self.objects[key] = obj
            self._record("MODIFIED", rt, copy.deepcopy(obj), copy.deepcopy(old))
            return copy.deepcopy(obj)

    def delete(self, rt: ResourceType, namespace: str, name: str, *, dry_run: bool = False) -> JSON:
        with self.cond:
            old = self.objects.get((rt.plural, namespace, name))
            if old is None:
                raise _not_found(rt, name)
            if dry_run:
                return copy.deepcopy(old)
            del self.objects[(rt.plural, namespace, name)]
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = self._next_rv()
            self._record("DELETED", rt, copy.deepcopy(gone), old)
            return gone

    def expire_history(self) -> None:
        with self.cond:
            self.history.clear()
            self.compacted_rv = self.rv
            self.cond.notify_all()

    def bookmark(self, resource_version: int | None = None) -> None:
        with self.cond:
            self.bookmark_generation += 1
            self.bookmark_rv = resource_version
            self.cond.notify_all()

    def end_watches_with(self, status: JSON) -> None:
        with self.cond:
            self.error_generation += 1
            self.error_status = copy.deepcopy(status)
            self.cond.notify_all()

    def wait_until_fresh(self, resource_version: int, timeout: float) -> None:
        """Wait (as upstream's watch cache, up to `timeout`) for the store to reach a version a
        request asks for; "Too large resource version" if it does not. Call with `cond` held."""
        if not self.cond.wait_for(lambda: self.rv >= resource_version, timeout=timeout):
            raise too_large_resource_version(resource_version, self.rv)

    def fresh_copy(self) -> Store:
        """The same objects in a new store whose resourceVersions start again from 1, with no
        history: what a server whose etcd was replaced or restored from an old backup serves."""
        with self.cond:
            fresh = Store(history_size=self.history_size, clock=self.clock)
            for key, obj in sorted(self.objects.items(), key=lambda kv: kv[0]):
                copied = copy.deepcopy(obj)
                copied["metadata"]["resourceVersion"] = fresh._next_rv()
                fresh.objects[key] = copied
            # A new watch cache serves nothing older than its first list.
            fresh.compacted_rv = fresh.rv
            return fresh

    @staticmethod
    def _normalise(rt: ResourceType, namespace: str, obj: JSON) -> JSON:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", f"the body of a {rt.kind} must be a JSON object")
        obj = copy.deepcopy(obj)
        if obj.get("kind", rt.kind) != rt.kind or obj.get("apiVersion", rt.api_version) != rt.api_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({obj.get('apiVersion')}, kind {obj.get('kind')}) does not match "
                f"the expected API version ({rt.api_version}, kind {rt.kind})",
            )
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", f"metadata of a {rt.kind} must be a JSON object")
        if rt.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    f"the namespace of the provided object ({meta['namespace']}) does not match the namespace "
                    f"sent on the request ({namespace})",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj


# ---------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class Route:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    _raw_body: bytes = b""
    server: _Server

    # -- plumbing

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.api._track(self.connection, add=False)
        with contextlib.suppress(OSError):  # the client or a test hook already closed the socket
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send_json(self, code: int, body: JSON, warnings: Sequence[str] = (), headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        for warning in warnings:
            # RFC 7234 warning, code 299 ("miscellaneous persistent warning"), as the real server sends.
            self.send_header("Warning", '299 - "' + warning.replace("\\", "\\\\").replace('"', '\\"') + '"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_openapi_v2(self) -> None:
        """An OpenAPI v2 document without definitions. kubectl reads it only to validate a kind the
        v3 document does not list (one the server does not serve): finding no schema, it leaves the
        object to the server, which then answers as a real one does for an unknown kind. The empty
        protobuf message is zero bytes."""
        self.send_response(200)
        self.send_header("Content-Type", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self) -> Any:
        raw = self._raw_body
        if not raw:
            return None
        ctype = self.headers.get("Content-Type", "")
        try:
            return yaml.safe_load(raw) if "yaml" in ctype else json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise ApiError(400, "BadRequest", f"cannot decode the request body: {e}") from e

    def _dispatch(self) -> None:
        api = self.server.api
        # Read the body first, whatever happens next, so that a keep-alive connection stays in step.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""
        with api.store.cond:
            api.requests.append((self.command, self.path))
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/openapi/v2" and self.command == "GET":
                self._send_openapi_v2()
                return
            discovery = api._discovery(url.path, self.command)
            if discovery is not None:
                self._send_json(200, discovery)
                return
            route = api._route(url.path)
            if route is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if api._failing is not None:
                code = api._failing
                raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}")
            self._resource(route, query)
        except ApiError as e:
            retry = e.details.get("retryAfterSeconds")
            # As upstream's ErrorNegotiated: a Status with a retry hint also sets Retry-After.
            headers = {"Retry-After": str(retry)} if isinstance(retry, int) and retry > 0 else {}
            self._send_json(e.code, e.status(), headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # -- resources

    def _resource(self, route: Route, query: dict[str, str]) -> None:
        api, rt = self.server.api, route.rt
        ns = route.namespace or ""
        method = self.command
        if route.name is None:
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._watch(route, query)
            elif method == "GET":
                selector = Selector.parse(query.get("fieldSelector", ""), query.get("labelSelector", ""))
                minimum = _minimum_rv(query)
                if minimum is not None:
                    with api.store.cond:
                        api.store.wait_until_fresh(minimum, api.block_timeout)
                items, rv = api.store.list(rt, route.namespace, selector)
                for item in items:
                    # The real server leaves the type to the list's own kind; clients must cope.
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                self._send_json(
                    200,
                    {
                        "kind": f"{rt.kind}List",
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(rv)},
                        "items": items,
                    },
                )
            elif method == "POST":
                body = self._body()
                obj, warnings = admit(rt, body, None, self._field_validation(query)) if isinstance(body, dict) else (body, [])
                self._check_namespace(rt, ns)
                self._send_json(201, api.store.create(rt, ns, obj, dry_run=self._dry_run(query)), warnings)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection of {rt.plural}")
            return
        name = route.name
        if method == "GET":
            self._send_json(200, api.store.get(rt, ns, name))
        elif method == "PUT":
            body = self._body()
            with api.store.cond:
                obj, warnings = self._admit(rt, body, ns, name, query)
                self._send_json(200, api.store.update(rt, ns, name, obj, dry_run=self._dry_run(query)), warnings)
        elif method == "PATCH":
            self._patch(route, ns, name, query)
        elif method == "DELETE":
            # DeleteOptions: propagation policy and grace period mean nothing here, but kubectl sends
            # a server-side dry run in them (dryRun: [All]) rather than in the query.
            options = self._body()
            in_body = options.get("dryRun") if isinstance(options, dict) else None
            dry_run = self._dry_run(query)
            if in_body is not None:
                dry_run = self._dry_run({"dryRun": ",".join(in_body) if isinstance(in_body, list) else str(in_body)}) or dry_run
            gone = api.store.delete(rt, ns, name, dry_run=dry_run)
            details = {"name": name, "kind": rt.plural, "uid": gone["metadata"].get("uid")}
            self._send_json(200, status_object(200, "", "", details))
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _patch(self, route: Route, ns: str, name: str, query: dict[str, str]) -> None:
        store, rt = self.server.api.store, route.rt
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        patch = self._body()
        dry_run = self._dry_run(query)
        with store.cond:
            try:
                current = store.get(rt, ns, name)
            except ApiError:
                if ctype != "application/apply-patch+yaml":
                    raise
                # Server-side apply creates what does not exist yet.
                obj, warnings = admit(rt, patch or {}, None, self._field_validation(query))
                self._check_namespace(rt, ns)
                self._send_json(201, store.create(rt, ns, obj, dry_run=dry_run), warnings)
                return
            if ctype == "application/merge-patch+json":
                patched = merge_patch(current, patch)
            elif ctype in ("application/strategic-merge-patch+json", "application/apply-patch+yaml"):
                patched = strategic_merge_patch(current, patch, rt)
            elif ctype == "application/json-patch+json":
                if not isinstance(patch, list):
                    raise ApiError(400, "BadRequest", "a json patch must be a list of operations")
                patched = json_patch(current, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
            obj, warnings = admit(rt, patched, current, self._field_validation(query))
            self._send_json(200, store.update(rt, ns, name, obj, dry_run=dry_run), warnings)

    def _admit(self, rt: ResourceType, body: Any, ns: str, name: str, query: dict[str, str]) -> tuple[Any, list[str]]:
        """A replacement (PUT) decoded and validated against the stored object it replaces."""
        if not isinstance(body, dict):
            return body, []  # Store.update reports the malformed body
        old = self.server.api.store.get(rt, ns, name) if rt.schema is not None else None
        return admit(rt, body, old, self._field_validation(query))

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        """The real server refuses to create in a namespace that does not exist. Checked for the
        validated kinds only: the proxy's own kinds are created freely by the consumer tests."""
        api = self.server.api
        if rt.schema is None or not rt.namespaced or NAMESPACE not in api.resources:
            return
        try:
            api.store.get(NAMESPACE, "", ns)
        except ApiError:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}) from None

    @staticmethod
    def _dry_run(query: dict[str, str]) -> bool:
        value = query.get("dryRun", "")
        if value not in ("", "All"):
            raise ApiError(400, "BadRequest", f'unsupported dryRun value "{value}": the only accepted value is "All"')
        return value == "All"

    @staticmethod
    def _field_validation(query: dict[str, str]) -> str:
        value = query.get("fieldValidation", "")
        if value not in ("", *FIELD_VALIDATION):
            supported = ", ".join(FIELD_VALIDATION)
            raise ApiError(400, "BadRequest", f'fieldValidation "{value}" is not one of {supported}')
        return value

    def _watch(self, route: Route, query: dict[str, str]) -> None:
        store = self.server.api.store
        selector = Selector.parse(query.get("fieldSelector", ""), query.get("labelSelector", ""))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        last_bookmark = time.monotonic()
        with store.cond:
            store.watchers += 1
            store.cond.notify_all()
        try:
            self._stream(route, query, selector, bookmarks, deadline, last_bookmark)
        finally:
            with store.cond:
                store.watchers -= 1
                store.cond.notify_all()

    def _stream(
        self,
        route: Route,
        query: dict[str, str],
        selector: Selector,
        bookmarks: bool,
        deadline: float | None,
        last_bookmark: float,
    ) -> None:
        api, store, rt = self.server.api, self.server.api.store, route.rt
        with store.cond:
            sent_generation = store.bookmark_generation
            error_generation = store.error_generation
            raw_rv = query.get("resourceVersion", "")
            if query.get("sendInitialEvents") in ("true", "1"):
                # A watch-list: the state at least as new as the version asked for, as ADDED events,
                # then a BOOKMARK marking the end of them. The only kind of watch the real server
                # answers with "Too large resource version" (an ERROR event: the stream is open).
                if raw_rv not in ("", "0"):
                    try:
                        store.wait_until_fresh(_minimum_rv({"resourceVersion": raw_rv}) or 0, api.block_timeout)
                    except ApiError as e:
                        self._chunk({"type": "ERROR", "object": e.status()})
                        self._end_chunks()
                        return
                items, since = store.list(rt, route.namespace, selector)
                pending = [{"type": "ADDED", "object": obj} for obj in items]
                if bookmarks:
                    end = {"resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}
                    pending.append(
                        {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": end}}
                    )
            elif raw_rv in ("", "0"):
                # "Any version": the current state as synthetic ADDED events, then changes.
                items, since = store.list(rt, route.namespace, selector)
                pending = [{"type": "ADDED", "object": obj} for obj in items]
            else:
                try:
                    since = int(raw_rv)
                except ValueError:
                    since = -1
                if since < store.compacted_rv:
                    message = f"too old resource version: {raw_rv} ({store.compacted_rv})"
                    gone = status_object(410, "Expired", message)
                    self._chunk({"type": "ERROR", "object": gone})
                    self._end_chunks()
                    return
                # A version newer than the store's is accepted, as upstream's watch cache does:
                # the watch stays silent until the store's versions pass it.
                pending = []
        # Upstream never sends a watch a BOOKMARK older than the version it started from.
        start = since
        while True:
            for event in pending:
                self._chunk(event)
            with store.cond:
                pending = []
                while not pending:
                    if api._closing or self.connection in api._dropped:
                        return  # cut mid-stream: no terminating chunk, like a dead server
                    if store.error_generation != error_generation and store.error_status is not None:
                        self._chunk({"type": "ERROR", "object": store.error_status})
                        self._end_chunks()
                        return
                    if since < store.compacted_rv:
                        # The history moved past this watch before it caught up: it must relist.
                        message = f"too old resource version: {since} ({store.compacted_rv})"
                        self._chunk({"type": "ERROR", "object": status_object(410, "Expired", message)})
                        self._end_chunks()
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        self._end_chunks()
                        return
                    for ev in store.history:
                        if ev.rv > since and ev.rt == rt:
                            translated = _translate(ev, route.namespace, selector)
                            if translated is not None:
                                pending.append(translated)
                    if store.history and store.history[-1].rv > since:
                        since = store.history[-1].rv
                    forced = store.bookmark_generation != sent_generation and store.bookmark_rv is not None
                    due = api.bookmark_interval is not None and time.monotonic() - last_bookmark >= api.bookmark_interval
                    wanted = store.bookmark_generation != sent_generation or due
                    if bookmarks and not pending and wanted and (forced or store.rv >= start):
                        rv = store.bookmark_rv if forced and store.bookmark_rv is not None else store.rv
                        since = max(since, rv)
                        bookmark = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}}
                        pending.append({"type": "BOOKMARK", "object": bookmark})
                    sent_generation = store.bookmark_generation
                    if pending:
                        last_bookmark = time.monotonic() if pending[-1]["type"] == "BOOKMARK" else last_bookmark
                        break
                    store.cond.wait(timeout=0.2)

    def _chunk(self, event: JSON) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _minimum_rv(query: dict[str, str]) -> int | None:
    """The resourceVersion a list must be at least as new as, or None for "any" (unset or "0").

    `resourceVersionMatch=NotOlderThan` (the default for a set version) and `Exact` both need the
    server to have reached that version; this server keeps no old snapshots, so for `Exact` it
    answers with its current state, which is what the proxy's consumers need of it.
    """
    raw, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if match not in ("", "NotOlderThan", "Exact"):
        raise ApiError(400, "BadRequest", f'unsupported resourceVersionMatch "{match}"')
    if match and not raw:
        raise ApiError(
            422,
            "Invalid",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        )
    if raw in ("", "0"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "BadRequest", f'invalid resource version "{raw}"') from None


def _translate(ev: Event, namespace: str | None, selector: Selector) -> JSON | None:
    """The event a filtered watch sees: an object leaving the filter is DELETED, entering it ADDED."""

    def visible(obj: JSON | None) -> bool:
        if obj is None:
            return False
        in_ns = namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace
        return in_ns and selector.matches(obj)

    was, now = visible(ev.old), visible(ev.obj)
    if ev.type == "DELETED":
        return {"type": "DELETED", "object": ev.obj} if was else None
    if was and now:
        return {"type": ev.type, "object": ev.obj}
    if now:
        return {"type": "ADDED", "object": ev.obj}
    if was:
        return {"type": "DELETED", "object": ev.obj}
    return None


@dataclass
class ApiServer:
    """The test API server. `start()` returns the base URL; the store survives `stop()`.

    `bookmark_interval` (seconds, or None for on-demand only via `bookmark()`) paces BOOKMARKs to
    watches that asked for them. `history_size` bounds the event history: a watch from a version
    older than what is retained gets 410 Gone.
    """

    bookmark_interval: float | None = None
    history_size: int = 1000
    resources: tuple[ResourceType, ...] = DEFAULT_RESOURCES
    # How long a read from a future resourceVersion waits before "Too large resource version".
    block_timeout: float = BLOCK_TIMEOUT
    store: Store = field(init=False)
    port: int = 0
    _server: _Server | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _connections: set[socket.socket] = field(default_factory=set, init=False, repr=False)
    _dropped: set[socket.socket] = field(default_factory=set, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)
    _failing: int | None = field(default=None, init=False, repr=False)
    # (method, path with query) of the latest requests, oldest first: what clients asked for,
    # e.g. to derive the RBAC rules a client needs.
    requests: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=10_000), init=False, repr=False)

    def __post_init__(self) -> None:
        self.store = Store(history_size=self.history_size)
        self._by_kind = {rt.kind: rt for rt in self.resources}
        if NAMESPACE in self.resources and any(rt.schema is not None for rt in self.resources):
            # A real cluster has these from the start; deploy/ puts its objects in kube-system.
            for name in SYSTEM_NAMESPACES:
                self.store.create(NAMESPACE, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        """Listen on 127.0.0.1 (a free port the first time, the same port after a `stop()`)."""
        if self._server is not None:
            return self.url
        self._closing = False
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.api = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=f"apiserver:{self.port}", daemon=True)
        self._thread.start()
        log.info("test API server listening on %s", self.url)
        return self.url

    def stop(self) -> None:
        """Stop listening and cut every connection (open watches end without a final chunk)."""
        server, self._server = self._server, None
        if server is None:
            return
        with self.store.cond:
            self._closing = True
            self.store.cond.notify_all()
        server.shutdown()
        server.server_close()
        self._kill(set(self._connections))
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- fault injection

    def drop_watches(self) -> None:
        """Cut every connection that is open now, mid-stream, as a crashing server would."""
        with self.store.cond:
            victims = set(self._connections)
            self._dropped |= victims
            self.store.cond.notify_all()
        self._kill(victims)

    def fail_with(self, code: int | None) -> None:
        """Answer every resource request with this HTTP status (e.g. 503) until called with None."""
        self._failing = code

    def expire_history(self) -> None:
        """Compact the history: watches from any version before now get 410 Gone."""
        self.store.expire_history()

    def bookmark(self, resource_version: int | None = None) -> None:
        """Send a BOOKMARK now to every open watch that allows them.

        `resource_version` forces the version it carries, even one older than the watch's own:
        what a server that lost its state and does not filter its bookmarks would send.
        """
        self.store.bookmark(resource_version)

    def end_watches_with(self, status: JSON) -> None:
        """End every open watch with an ERROR event carrying this Status (see `status_object`,
        `too_large_resource_version(...).status()`); watches opened later are not affected."""
        self.store.end_watches_with(status)

    def restart_with_fresh_store(self) -> None:
        """Stop, then come back serving the same objects from a store whose resourceVersions start
        again near 1: an API server whose etcd was replaced or restored from an old backup.

        Every client's resourceVersion is now newer than anything the server has: a list from it
        gets "Too large resource version", a plain watch from it is accepted and stays silent.
        """
        self.stop()
        self.store = self.store.fresh_copy()
        self.start()

    def wait_for_watches(self, count: int = 1, timeout: float = 10) -> None:
        """Block until at least `count` watch streams are open; TimeoutError if they never are."""
        with self.store.cond:
            if not self.store.cond.wait_for(lambda: self.store.watchers >= count, timeout=timeout):
                raise TimeoutError(f"{self.store.watchers} watches open on {self.url}, wanted {count}")

    # -- direct object access for Python tests

    def apply(self, obj: JSON) -> JSON:
        """Create or replace an object (no version check); returns the stored object."""
        rt = self._type_of(obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace", "default") if rt.namespaced else ""
        try:
            self.store.get(rt, ns, meta.get("name", ""))
        except ApiError:
            return self.store.create(rt, ns, obj)
        return self.store.update(rt, ns, meta["name"], obj, check_rv=False)

    def delete(self, kind: str, namespace: str, name: str) -> JSON:
        rt = self._kind(kind)
        return self.store.delete(rt, namespace if rt.namespaced else "", name)

    def get(self, kind: str, namespace: str, name: str) -> JSON:
        rt = self._kind(kind)
        return self.store.get(rt, namespace if rt.namespaced else "", name)

    @property
    def resource_version(self) -> int:
        return self.store.rv

    def write_kubeconfig(self, path: Path | str, namespace: str = "default") -> Path:
        """A kubeconfig pointing at this server, usable by lightkube and `kubectl --kubeconfig`."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "lab", "cluster": {"server": self.url}}],
            "users": [{"name": "lab", "user": {"token": "lab-token"}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab", "namespace": namespace}}],
            "current-context": "lab",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # -- internals

    def _type_of(self, obj: JSON) -> ResourceType:
        rt = self._kind(str(obj.get("kind")))
        if obj.get("apiVersion", rt.api_version) != rt.api_version:
            raise ApiError(400, "BadRequest", f"{obj.get('kind')} is served as {rt.api_version}, not {obj.get('apiVersion')}")
        return rt

    def _kind(self, kind: str) -> ResourceType:
        try:
            return self._by_kind[kind]
        except KeyError:
            raise ApiError(404, "NotFound", f"the test API server does not serve kind {kind!r}") from None

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self.store.cond:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
                self._dropped.discard(conn)

    @staticmethod
    def _kill(conns: set[socket.socket]) -> None:
        for conn in conns:
            with contextlib.suppress(OSError):  # already gone
                conn.shutdown(socket.SHUT_RDWR)

    def _route(self, path: str) -> Route | None:
        for rt in self.resources:
            prefix = rt.prefix()
            if not path.startswith(prefix + "/"):
                continue
            parts = path[len(prefix) + 1 :].strip("/").split("/")
            if rt.namespaced and len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == rt.plural:
                if len(parts) in (3, 4):
                    return Route(rt, parts[1], parts[3] if len(parts) == 4 else None)
            elif parts[0] == rt.plural and len(parts) in (1, 2):
                return Route(rt, None, parts[1] if len(parts) == 2 else None)
        return None

    def _discovery(self, path: str, method: str) -> JSON | None:
        if method != "GET":
            return None
        path = path.rstrip("/") or "/"
        groups = sorted({rt.group for rt in self.resources if rt.group})
        if path == "/version":
            return SERVER_VERSION
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}],
            }
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in groups]}
        for group in groups:
            if path == f"/apis/{group}":
                return {"kind": "APIGroup", "apiVersion": "v1", **self._group(group)}
        for prefix in sorted({rt.prefix() for rt in self.resources}):
            if path == prefix:
                return self._resource_list(prefix)
        if path == "/openapi/v3":
            return {
                "paths": {
                    prefix.lstrip("/"): {"serverRelativeURL": f"/openapi/v3{prefix}?hash=lab{self.port}"}
                    for prefix in sorted({rt.prefix() for rt in self.resources})
                }
            }
        if path.startswith("/openapi/v3/"):
            prefix = path.removeprefix("/openapi/v3")
            if any(rt.prefix() == prefix for rt in self.resources):
                return self._openapi_v3(prefix)
        return None

    def _group(self, group: str) -> JSON:
        versions = sorted({rt.version for rt in self.resources if rt.group == group})
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _resource_list(self, prefix: str) -> JSON:
        types = [rt for rt in self.resources if rt.prefix() == prefix]
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

    def _openapi_v3(self, prefix: str) -> JSON:
        """Just enough for kubectl to see that PATCH takes `fieldValidation`: it then leaves
        validation to the server (which accepts everything) instead of wanting the full schema."""
        paths: JSON = {}
        for rt in (rt for rt in self.resources if rt.prefix() == prefix):
            item = (
                f"{prefix}/namespaces/{{namespace}}/{rt.plural}/{{name}}" if rt.namespaced else f"{prefix}/{rt.plural}/{{name}}"
            )
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


def main(argv: list[str] | None = None) -> None:
    """Serve an empty cluster on 127.0.0.1 for demos: `python -m kubeproxy.lab.apiserver`."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig pointing at the server here")
    parser.add_argument("--bookmark-interval", type=float, default=30.0, help="seconds between BOOKMARKs")
    parser.add_argument(
        "--deploy-kinds", action="store_true", help="also serve what deploy/ holds (DaemonSet, ConfigMap, RBAC, ...)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    resources = DEPLOY_RESOURCES if args.deploy_kinds else DEFAULT_RESOURCES
    server = ApiServer(bookmark_interval=args.bookmark_interval, port=args.port, resources=resources)
    try:
        server.start()
    except OSError as e:
        raise SystemExit(f"cannot listen on 127.0.0.1:{args.port}: {e.strerror}") from None
    if args.kubeconfig:
        log.info("kubeconfig written to %s", server.write_kubeconfig(args.kubeconfig))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
