"""The store: objects as plain JSON dicts under one global, monotonically increasing
resourceVersion (like etcd behind the real server), and a bounded event history for watches.

A stored object is never changed in place: a write stores a new dict (every write path works on
its own deep copy) and callers get copies. So lists, watch-lists and the history's events share
the stored dicts read-only (`list_shared`, `Event`), and are only encoded, never copied: a 10k
list is then an encoding, not 10k deep copies."""

from __future__ import annotations

import bisect
import copy
import itertools
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kubeproxy.lab.apiserver.resources import ResourceType
from kubeproxy.lab.apiserver.selectors import Selector
from kubeproxy.lab.apiserver.status_errors import JSON, ApiError, too_large_resource_version


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.plural} "{name}" not found', {"name": name, "kind": rt.plural})


@dataclass(frozen=True)
class Event:
    """One change in the history: `obj` is the new state (last state for DELETED), `old` the previous.

    Both are shared with the store (never mutated: see the module doc); encode them, do not edit."""

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
    # The same objects by resource, (namespace, name) -> object: a list reads one resource's
    # objects, as the real server's per-resource watch cache does, not every object stored.
    by_resource: dict[str, dict[tuple[str, str], JSON]] = field(default_factory=dict)
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

    def _put(self, key: tuple[str, str, str], obj: JSON) -> None:
        self.objects[key] = obj
        self.by_resource.setdefault(key[0], {})[key[1:]] = obj

    def _drop(self, key: tuple[str, str, str]) -> None:
        del self.objects[key]
        del self.by_resource[key[0]][key[1:]]

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get(self, rt: ResourceType, namespace: str, name: str) -> JSON:
        with self.cond:
            obj = self.objects.get((rt.plural, namespace, name))
            if obj is None:
                raise not_found(rt, name)
            return copy.deepcopy(obj)

    def list_shared(self, rt: ResourceType, namespace: str | None, selector: Selector) -> tuple[list[JSON], int]:
        """As `list`, but the stored dicts themselves: read-only, to encode (see the module doc)."""
        with self.cond:
            stored = self.by_resource.get(rt.plural, {})
            keys = sorted(stored) if namespace is None else sorted(k for k in stored if k[0] == namespace)
            items = [stored[key] for key in keys if selector.matches(stored[key])]
            return items, self.rv

    def list_page(
        self, rt: ResourceType, namespace: str | None, selector: Selector, after: tuple[str, str] | None, limit: int | None
    ) -> tuple[list[JSON], int, tuple[str, str] | None, int]:
        """One page of `list_shared`: up to `limit` objects after the key `after`; with the key of
        the page's last object when more match beyond it (else None), and how many do."""
        with self.cond:
            stored = self.by_resource.get(rt.plural, {})
            keys = sorted(k for k in stored if (namespace is None or k[0] == namespace) and (after is None or k > after))
            matched = [(key, stored[key]) for key in keys if selector.matches(stored[key])]
            end = len(matched) if limit is None else min(len(matched), limit)
            last = matched[end - 1][0] if 0 < end < len(matched) else None
            return [obj for _, obj in matched[:end]], self.rv, last, len(matched) - end

    def events_after(self, rv: int) -> list[Event]:
        """The history's events newer than `rv`, oldest first. The history is in version order, so
        a watch finds where it stands by bisection instead of scanning every event on every write."""
        history = self.history
        start = bisect.bisect_right(history, rv, key=lambda ev: ev.rv)
        return list(itertools.islice(history, start, None))

    def list(self, rt: ResourceType, namespace: str | None, selector: Selector) -> tuple[list[JSON], int]:
        """The matching objects (copies the caller may change), by key, and the store's version."""
        items, rv = self.list_shared(rt, namespace, selector)
        return [copy.deepcopy(obj) for obj in items], rv

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
            self._put(key, obj)
            self._record("ADDED", rt, obj, None)
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
                raise not_found(rt, name)
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
            self._put(key, obj)
            self._record("MODIFIED", rt, obj, old)
            return copy.deepcopy(obj)

    def delete(self, rt: ResourceType, namespace: str, name: str, *, dry_run: bool = False) -> JSON:
        with self.cond:
            old = self.objects.get((rt.plural, namespace, name))
            if old is None:
                raise not_found(rt, name)
            if dry_run:
                return copy.deepcopy(old)
            self._drop((rt.plural, namespace, name))
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = self._next_rv()
            self._record("DELETED", rt, gone, old)
            return copy.deepcopy(gone)

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
                fresh._put(key, copied)
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
