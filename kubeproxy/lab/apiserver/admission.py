"""Admission of the workload and RBAC kinds: decode against the schema, then the kind's rules.

The proxy's own kinds (Service, EndpointSlice, Node) are stored as given, so that consumer tests
can feed malformed objects. The kinds served for `kubectl apply -f deploy/` are checked the way
the real server checks them, so that a broken manifest fails here as it would on a cluster:
decoding against the schema (lightkube's models of the Kubernetes OpenAPI: unknown fields are
dropped, or refused with fieldValidation=Strict; a wrong type is a 400), then the rules
upstream's validation enforces for what deploy/ uses (a 422 Invalid listing every cause).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kubeproxy.lab.apiserver.resources import ResourceType
from kubeproxy.lab.apiserver.rules import Cause, check_metadata, required
from kubeproxy.lab.apiserver.status_errors import JSON, ApiError

FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


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
    causes = [required(path) for path in decoded.missing]
    causes += check_metadata(rt, obj.get("metadata") or {}, "metadata")
    if rt.check is not None:
        causes += rt.check(obj, old)
    if causes:
        raise invalid_error(rt, name, causes)
    return obj, unknown if field_validation in ("", "Warn") else []
