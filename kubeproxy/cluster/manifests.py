"""Read Kubernetes objects from YAML/JSON files and folders.

Accepts what people actually have: multi-document YAML, JSON, and `kind: List` (what
`kubectl get svc,endpointslices -A -o yaml` prints). Returns plain dicts; `cluster.state`
turns them into typed objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.cluster.errors import ManifestError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class RawObject:
    obj: dict[str, Any]
    source: str  # "path" or "path#doc" for multi-document files


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named by `paths`; folders contribute their *.yaml/*.yml/*.json files, sorted."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Hidden entries are skipped: a mounted ConfigMap keeps every file twice, under
            # `..data/` and a `..<timestamp>/` folder, next to the visible symlinks.
            files.extend(
                sorted(
                    p
                    for p in path.rglob("*")
                    if p.suffix in MANIFEST_SUFFIXES
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                    and p.is_file()
                )
            )
        elif path.exists() or str(raw) == "-":
            files.append(path)
        else:
            raise ManifestError(str(path), None, "no such file or folder")
    return files


def read_text(path: Path) -> str:
    if str(path) == "-":
        import sys

        return sys.stdin.read()
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(str(path), None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ManifestError(str(path), None, exc.strerror or str(exc)) from None


def parse_documents(text: str, source: str) -> Iterator[RawObject]:
    """Objects of one file's text; `kind: List` items are flattened."""
    docs = _json_documents(text)
    try:
        docs = docs if docs is not None else list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(source, line, f"not valid YAML or JSON: {problem}") from None
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        where = source if len(docs) == 1 else f"{source}#{index + 1}"
        if not isinstance(doc, dict):
            raise ManifestError(where, None, f"expected a Kubernetes object, got {type(doc).__name__}")
        if doc.get("kind") == "List" or (isinstance(doc.get("kind"), str) and doc["kind"].endswith("List")):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ManifestError(where, None, "List.items is not a list")
            for item in items:
                if isinstance(item, dict):
                    yield RawObject(_with_kind(item, doc["kind"]), where)
                else:
                    raise ManifestError(where, None, f"List item is not an object: {item!r}")
        else:
            yield RawObject(doc, where)


def _json_documents(text: str) -> list[Any] | None:
    """A JSON file's one document, parsed by the JSON parser (50x faster than YAML's); None if not JSON."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return [json.loads(text)]
    except ValueError:
        return None  # YAML flow style also starts with "{": let the YAML parser decide


def _with_kind(item: dict[str, Any], list_kind: str) -> dict[str, Any]:
    # `kubectl get services -o json` prints ServiceList items without their own kind.
    if "kind" not in item and list_kind != "List":
        return {**item, "kind": list_kind.removesuffix("List")}
    return item


def load_manifests(paths: Iterable[str | Path]) -> list[RawObject]:
    """All objects under `paths`; the first unreadable file raises ManifestError."""
    out: list[RawObject] = []
    for path in manifest_files(paths):
        out.extend(parse_documents(read_text(path), str(path)))
    return out
