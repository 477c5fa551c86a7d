"""Read Kubernetes objects from YAML/JSON files and folders.

Accepts what people actually have: multi-document YAML, JSON, and `kind: List` (what
`kubectl get svc,endpointslices -A -o yaml` prints). Returns plain dicts (`parse_objects`: or
the typed decoder's structs, where it takes the file); `cluster.state` turns them into typed objects.

A file is refused whole, with a ManifestError naming it, when reading it could take the process
down: bigger than `MAX_FILE_BYTES`, nested deeper than `MAX_DEPTH`, or a YAML alias bomb (a
1 KB file whose aliases expand to a billion values once anything walks it: a comparison, a
message, a copy). The checks run once at load time, in time linear in the file's size.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import msgspec
from msgspec import UNSET

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.schema import RELEASED, Document, Item, decode_typed, iter_plain, split_list

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

# `kubectl get svc,endpointslices -A -o yaml` of 20k objects, managedFields and all, is ~100 MB.
MAX_FILE_BYTES = 128 * 2**20
# Kubernetes objects nest ~10 levels (a CRD's schema in the same folder a few dozen): 100 is far
# above any real object and far below Python's recursion limit, which comparisons and copies hit.
MAX_DEPTH = 100
# Without aliases a document cannot hold more values than its text has characters; aliases may
# repeat a few values (shared labels), never multiply them: a file gets this many values at least.
MIN_VALUE_BUDGET = 100_000
_UNSEEN = (-1, -1)


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


def read_text(path: Path, max_bytes: int | None = None, *, regular_only: bool = False) -> str:
    """The file's text; ManifestError if it is unreadable, not UTF-8 or bigger than `max_bytes` (MAX_FILE_BYTES).

    `regular_only` refuses anything but a regular file (a FIFO, a device, a socket), for readers
    that must never block: a FIFO swapped in for a manifest would hold the reading thread until
    some writer came. Offline tools leave it off, so `<(command)` works as a file name.
    """
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    try:
        if str(path) == "-" and not regular_only:
            import sys

            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with _open_for_reading(path, regular_only) as f:
                # Read at most one byte past the limit: the size is known without reading a huge file.
                # `read(n)` allocates n bytes up front (128 MiB for the limit, on every re-read of a
                # watched folder), so ask for the size the file has, and read on only if it grew.
                size = min(os.fstat(f.fileno()).st_size, max_bytes)
                data = f.read(size + 1)
                if len(data) > size:
                    data += f.read(max_bytes + 1 - len(data))
    except OSError as exc:
        raise ManifestError(str(path), None, exc.strerror or str(exc)) from None
    if len(data) > max_bytes:
        raise ManifestError(str(path), None, f"bigger than {max_bytes:,} bytes, the limit for one manifest file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(str(path), None, f"not UTF-8 text ({exc.reason})") from None


def _open_for_reading(path: Path, regular_only: bool) -> BinaryIO:
    """`path` opened for reading; with `regular_only`, without blocking and only if it is a regular file."""
    if not regular_only:
        return path.open("rb")
    # A stat first keeps devices from being opened at all (opening one may act: a tape rewinds);
    # the fstat of what was opened covers a swap between the two. The open must not block, as it
    # does on a FIFO without a writer. Symlinks are followed: a mounted ConfigMap is made of them.
    _require_regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _require_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _require_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise ManifestError(str(path), None, f"not a regular file ({_file_type(mode)})")


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):  # fmt: skip
        if test(mode):
            return name
    return f"mode {stat.S_IFMT(mode):o}"


def parse_documents(text: str, source: str) -> Iterator[RawObject]:
    """Objects of one file's text; `kind: List` items are flattened."""
    # A JSON document within cluster/schema.py's types: decoded without the general path's depth
    # walk (its depth is bounded by the types), item by item. Anything else goes the general way.
    typed = _decode_typed(text)
    if typed is not None:
        yield from _typed_objects(typed, source)
        return
    yield from _general_documents(text, source)


def parse_objects(text: str, source: str) -> Iterator[dict[str, Any] | Item]:
    """The objects `parse_documents` gives, with a List's items as the typed decoder's structs
    when it takes the file: `ClusterState.apply` reads those without making dicts (cluster/typed.py)."""
    typed = _decode_typed(text)
    if typed is None:
        for raw in _general_documents(text, source):
            yield raw.obj
        return
    with paused_gc():
        head, items = split_list(typed)
    if items is None:
        yield head
        return
    list_kind = head["kind"]
    for index, item in enumerate(items):
        items[index] = RELEASED  # each struct is freed once applied, not at the end of the file
        if item.kind is UNSET and list_kind != "List":  # as `_with_kind`
            item.kind = list_kind.removesuffix("List")
        yield item


def _decode_typed(text: str) -> Document | None:
    with paused_gc():
        return decode_typed(text) if text.lstrip().startswith("{") else None


def _general_documents(text: str, source: str) -> Iterator[RawObject]:
    # Decoding makes up to a million containers, none of them garbage: the collector would walk
    # them again and again. (Not around the yields below: it would stay off while the caller works.)
    with paused_gc():
        docs = _decode(text, source)
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


def _typed_objects(document: Document, source: str) -> Iterator[RawObject]:
    """What the general path below yields for the same document (one JSON document: `source`)."""
    with paused_gc():
        head, items = split_list(document)
    if items is None:
        yield RawObject(head, source)
        return
    for item in iter_plain(items):
        yield RawObject(_with_kind(item, head["kind"]), source)


def _decode(text: str, source: str) -> list[Any]:
    """The documents of one file's text, checked for depth and (YAML) alias expansion."""
    docs = _json_documents(text, source)
    is_yaml = docs is None
    # Imported here: JSON manifests (and `kubeproxy run` against an API server) never need YAML.
    import yaml

    try:
        docs = docs if docs is not None else list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(source, line, f"not valid YAML or JSON: {problem}") from None
    except RecursionError:
        raise ManifestError(source, None, f"nested more than {MAX_DEPTH} levels deep") from None
    budget = max(MIN_VALUE_BUDGET, len(text))
    for index, doc in enumerate(docs):
        where = source if len(docs) == 1 else f"{source}#{index + 1}"
        if isinstance(doc, (dict, list)):
            budget -= _check_shape(doc, where, budget) if is_yaml else _check_depth(doc, where)
    return docs


def _json_documents(text: str, source: str) -> list[Any] | None:
    """A JSON file's one document, parsed by the JSON parser (50x faster than YAML's); None if not JSON."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        try:
            # msgspec decodes 2-3x faster; where it refuses what the json module takes (NaN,
            # 1e400, a lone surrogate escape) the json module decides, so the result is the same.
            return [msgspec.json.decode(text)]
        except msgspec.DecodeError:
            return [json.loads(text)]
    except ValueError:
        return None  # YAML flow style also starts with "{": let the YAML parser decide
    except RecursionError:  # both parsers recurse per level: ~1000 levels exhaust the stack
        raise ManifestError(source, None, f"nested more than {MAX_DEPTH} levels deep") from None


def _is_container(value: Any) -> TypeGuard[dict[str, Any] | list[Any]]:
    return type(value) is dict or type(value) is list


def _check_depth(doc: dict[str, Any] | list[Any], where: str) -> int:
    """The number of maps and lists in a tree (a JSON document); ManifestError if deeper than MAX_DEPTH."""
    # Level by level, without recursion (the point is not to recurse): a 10 MB file takes ~0.05 s.
    level: list[Any] = [doc]
    depth, count = 1, 0
    while level:
        if depth > MAX_DEPTH:
            raise ManifestError(where, None, f"nested more than {MAX_DEPTH} levels deep")
        count += len(level)
        below: list[Any] = []
        for node in level:
            below += [c for c in (node.values() if type(node) is dict else node) if type(c) is dict or type(c) is list]
        level, depth = below, depth + 1
    return count


def _check_shape(doc: dict[str, Any] | list[Any], where: str, budget: int) -> int:
    """The number of values `doc` has once its YAML aliases are expanded, computed without expanding them.

    An alias is the same Python object in several places, so each distinct list or map is visited
    once and its expanded size is summed from its children's. ManifestError when the size exceeds
    `budget`, the nesting MAX_DEPTH, or an alias refers to a map or list that contains it.
    """
    sizes: dict[int, tuple[int, int] | None] = {}  # id -> (expanded size, height); None: on the current path
    stack: list[tuple[dict[str, Any] | list[Any], bool]] = [(doc, False)]
    while stack:
        node, finished = stack.pop()
        children = node.values() if type(node) is dict else node
        if finished:
            size, height = 1, 0
            for child in children:
                if _is_container(child):
                    child_size, child_height = sizes[id(child)]  # type: ignore[misc]  # finished before its parent
                    size += child_size
                    height = max(height, child_height)
                else:
                    size += 1
            if height + 1 > MAX_DEPTH:
                raise ManifestError(where, None, f"nested more than {MAX_DEPTH} levels deep")
            if size > budget:
                raise ManifestError(
                    where, None, f"YAML aliases expand it to more than {budget:,} values, the most its size allows"
                )
            sizes[id(node)] = (size, height + 1)
            continue
        known = sizes.get(id(node), _UNSEEN)
        if known is None:
            # Met again while still on the path from the root (the depth-first walk finishes a
            # node's children before the node): it contains itself.
            raise ManifestError(where, None, "a YAML alias refers to a map or list that contains it")
        if known is not _UNSEEN:
            continue  # an alias of a finished node: its size is known
        sizes[id(node)] = None
        stack.append((node, True))
        stack.extend((child, False) for child in children if _is_container(child))
    result = sizes[id(doc)]
    assert result is not None
    return result[0]


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
