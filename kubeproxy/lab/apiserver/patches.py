"""The three patch algorithms a PATCH request can name: JSON merge patch (RFC 7386), strategic
merge patch (for the list fields each kind declares merge keys for) and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubeproxy.lab.apiserver.resources import ResourceType
from kubeproxy.lab.apiserver.status_errors import JSON, ApiError


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
