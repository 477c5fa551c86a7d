"""Manifest files as a source: the objects of YAML/JSON files and folders, re-read when they change.

`kubeproxy run --manifests PATH...` takes its Services, EndpointSlices and Nodes from files
instead of an API server. This source has the shape of `ApiSource`, so the proxy treats both
alike::

    source = FileSource(["cluster/"], sink=on_event)    # ManifestError now if a path does not exist
    task = asyncio.create_task(source.run())
    await source.wait_synced()      # every object of every file has been delivered as ADDED

What it promises:

- Events carry the object as parsed, the same plain dict the API source delivers: `kind` from
  the document (or its `ServiceList`-style list), `apiVersion` filled in for the kinds kube-proxy
  reads when the file leaves it out, and a Service or EndpointSlice without a namespace is put in
  "default", as `kubectl apply` would. Objects are keyed by (kind, namespace, name). Only `kinds`
  are delivered (kube-proxy's three, by default): a folder may hold Deployments too.
- After the first pass it polls: one stat of every file (device, inode, size, mtime, ctime)
  every `interval` seconds, or at once after `poke()`; a folder's new files count. Only changed
  files are read; a file whose text did not change (a `touch`) is not parsed again; and each
  object is compared with the one last delivered, so a one-line edit in a 10k-object file is
  one MODIFIED event. Between reads an object is kept as its JSON encoding where that decodes
  to an equal dict (`Stored`), zlib-compressed: a fortieth of the memory of the dicts.
- A file that cannot be read or parsed (a half-written save, invalid YAML, too big, nested too
  deep, a YAML alias bomb) gets one warning naming it, and the objects it last gave stay in place:
  a bad save never drops rules. Once it is fixed, the events are the difference against those
  objects. A file already unusable at the first pass gives nothing until it is fixed (synced is
  still set).
- One bad document does not make the whole file unusable: a document without kind, or whose
  name or namespace cannot key an object, is skipped with one warning naming it (`path#3`), and
  the file's other objects are delivered. Because the skipped document may be the new text of an
  object the file gave before, objects it no longer lists stay in place until the file has no
  unusable document (the file is listed in `broken` meanwhile). Whether an object is valid beyond
  that (a name the API server would refuse, a port out of range) is the sink's business: the
  cluster state rejects it with a warning and keeps the rest, as it does for the API source.
- If the files cannot even be listed (a folder on the way became unreadable), nothing changes
  and `connected` is False until they can, as `ApiSource.connected` is during an API outage.
- A removed file deletes its objects. A folder that becomes empty is just empty; a PATH that
  disappears later is treated the same way, and read again when it comes back.
- The same object twice: the later one wins, deterministically. Files are ordered as the PATHs
  were given, and by path within a folder (`manifest_files`); a warning names both places.
- A PATH that does not exist when the source is built is an error: the constructor raises
  ManifestError naming it, so `kubeproxy run` stops before it touches the kernel. `-` (standard
  input) cannot be watched and is refused the same way.

Why some file is read again although its stat did not change: file times tick with the kernel's
coarse clock (milliseconds; seconds on some filesystems), so two saves of the same size within
one tick leave identical stats. As git does for its index, a file modified less than `RACY_NS`
before we read it stays suspect: later polls read it again and compare a digest of its text
(cheap; only a real difference is parsed) until its mtime is safely in the past.

Reading and parsing run in a worker thread: parsing 10k objects takes seconds, and the event
loop is shared with the sync loop and the health server. State changes and sink calls happen on
the event loop only, in order; the sink must not mutate the dicts it is given (an object whose
JSON encoding is not faithful is kept as its dict and compared with the next version of the file).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ManifestError, ObjectError
from kubeproxy.cluster.fields import object_ref
from kubeproxy.cluster.manifests import manifest_files, parse_documents, read_text
from kubeproxy.sources.events import BatchSink, Sink, WatchEvent, deliver

log = logging.getLogger("kubeproxy.sources.files")

KINDS: tuple[str, ...] = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
_API_VERSIONS = {"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1", "Node": "v1", "ServiceCIDR": "networking.k8s.io/v1"}
_CLUSTER_SCOPED = frozenset({"Node", "ServiceCIDR"})  # the cluster-scoped kinds kube-proxy reads
RACY_NS = 2_000_000_000  # covers coarse kernel clocks and 1-2 s filesystem timestamps

ObjectKey = tuple[str, str, str]  # (kind, namespace, name); namespace "" for cluster-scoped kinds
Objects = dict[ObjectKey, dict[str, Any]]
# An object as we keep it between reads: its JSON encoding when that decodes to an equal dict,
# compressed (10k Services and their slices are ~70 MiB as dicts, ~10 MiB as JSON, ~2 MiB so),
# else the dict itself (a YAML timestamp, a NaN, an integer key).
Stored = dict[str, Any] | bytes
StoredObjects = dict[ObjectKey, Stored]


@dataclass(frozen=True)
class _Stat:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> _Stat:
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_NO_STAT = _Stat(0, 0, -1, 0, 0)  # a file we could not stat: any real stat differs


@dataclass(frozen=True)
class _File:
    """What we know of one file: its stat and text digest when last read, and its last good objects."""

    stat: _Stat
    digest: bytes
    objects: StoredObjects
    error: str | None  # why its current text is unusable; `objects` are then from an earlier text
    racy: bool


@dataclass(frozen=True)
class _Read:
    """One file read in the worker thread. `objects` is None when the text is the known one or unusable."""

    stat: _Stat
    digest: bytes
    racy: bool
    objects: StoredObjects | None = None
    fresh: Objects = field(default_factory=dict)  # the same objects as parsed, for this round's events
    error: str | None = None
    warnings: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # why documents of a usable text were skipped


class _Unsettled:
    """The file changed while we read it: look again at the next poll."""


_UNSETTLED = _Unsettled()


@dataclass(frozen=True)
class _Scan:
    present: list[Path]  # every manifest file now, in order
    reads: dict[Path, _Read] = field(default_factory=dict)  # the ones that were read
    error: str | None = None  # the listing failed: change nothing


class FileSource:
    """Objects from manifest files and folders, as `WatchEvent`s to a sink. See the module doc."""

    def __init__(
        self,
        paths: Iterable[str | Path],
        sink: Sink,
        *,
        interval: float = 0.2,
        kinds: Collection[str] | None = KINDS,
        batch_sink: BatchSink | None = None,
    ) -> None:
        """Raises ManifestError naming the first PATH that does not exist (or is `-`).

        `batch_sink`, if given, receives the events of each round at once (see events.py)."""
        self.roots: tuple[Path, ...] = tuple(Path(p) for p in paths)
        for root in self.roots:
            if str(root) == "-":
                raise ManifestError("-", None, "standard input cannot be watched; give a file or folder")
        manifest_files(self.roots)  # raises for a missing path
        self.sink = sink
        self.batch_sink = batch_sink
        self.interval = interval
        self.kinds: frozenset[str] | None = None if kinds is None else frozenset(kinds)
        self._files: dict[Path, _File] = {}
        self._view: StoredObjects = {}  # what the sink has been given
        self._duplicates: set[tuple[ObjectKey, tuple[Path, ...]]] = set()
        self._scan_error: str | None = None
        self._synced = asyncio.Event()
        self._poked = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    @property
    def connected(self) -> bool:
        """False while the files cannot even be listed: what we deliver may then be going stale.

        An unusable file does not count: its last good objects stay in effect and `broken` names it.
        """
        return self._scan_error is None

    @property
    def broken(self) -> dict[str, str]:
        """Files whose current text is unusable (path -> error); their earlier objects are still in effect."""
        return {str(path): f.error for path, f in self._files.items() if f.error}

    def poke(self) -> None:
        """Ask a running `run()` to look at the files now instead of at the next interval."""
        self._poked.set()

    async def run(self) -> None:
        """Deliver every object, mark synced, then follow the files until cancelled. Never raises for file trouble."""
        await self.check()
        self._synced.set()
        log.info("read %d objects from %d manifest files (%d unusable)", len(self._view), len(self._files), len(self.broken))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), self.interval)
            self._poked.clear()
            await self.check()

    async def check(self) -> list[WatchEvent]:
        """Look at every file once, now; deliver the changes to the sink and return them too."""
        async with self._lock:
            scan = await asyncio.to_thread(_scan, self.roots, dict(self._files), self.kinds)
            events = self._apply(scan)
            # The first round turns 10k+ objects into the consumer's: see cluster.bulk.
            with paused_gc():
                deliver(self.sink, self.batch_sink, events, self._consumer_failed)
            return events

    # -- on the event loop

    def _apply(self, scan: _Scan) -> list[WatchEvent]:
        if scan.error is not None:
            if scan.error != self._scan_error:
                log.warning("cannot list the manifest files, keeping every object as it is: %s", scan.error)
            self._scan_error = scan.error
            return []
        self._scan_error = None
        changed = list(self._files) != scan.present
        present = set(scan.present)
        for path in (p for p in self._files if p not in present):
            log.info("%s is gone: deleting its %d objects", path, len(self._files[path].objects))
        files: dict[Path, _File] = {}
        for path in scan.present:
            known, read = self._files.get(path), scan.reads.get(path)
            if read is None:
                assert known is not None  # _scan reads every file it has not seen before
                files[path] = known
            elif read.objects is not None and read.skipped:
                for warning in read.warnings:
                    log.warning("%s", warning)
                # A skipped document may be the new text of any object the file gave before: keep
                # those until the file is whole again, as a rejected update keeps the old object.
                objects = dict(read.objects)
                if known is not None:
                    objects.update((key, obj) for key, obj in known.objects.items() if key not in objects)
                    kept = f"keeping the {len(objects)} objects it gave before, updated from its other documents"
                else:
                    kept = f"using its other {len(objects)} objects"
                error = "; ".join(read.skipped)
                log.warning("%s (%s)", error, kept)
                files[path] = _File(read.stat, read.digest, objects, error, read.racy)
                changed = True
            elif read.objects is not None:
                for warning in read.warnings:
                    log.warning("%s", warning)
                if known is not None and known.error:
                    log.info("%s is usable again", path)
                files[path] = _File(read.stat, read.digest, read.objects, None, read.racy)
                changed = True
            elif read.error is not None:
                kept_objects = known.objects if known is not None else {}
                if known is None or known.error != read.error or known.digest != read.digest:
                    log.warning("%s (keeping the %d objects it gave before)", read.error, len(kept_objects))
                files[path] = _File(read.stat, read.digest, kept_objects, read.error, read.racy)
            else:  # the text we already know
                assert known is not None
                files[path] = replace(known, stat=read.stat, racy=read.racy)
        self._files = files
        if not changed:
            return []
        view = self._merge()
        # The dicts parsed this round, for the events (no decoding back): each only where the view
        # holds the very value made from it (a duplicate in a file not read now may win).
        fresh: Objects = {}
        for read in scan.reads.values():
            for key, obj in read.fresh.items():
                if read.objects is not None and view.get(key) is read.objects.get(key):
                    fresh[key] = obj
        events = _diff(self._view, view, fresh)
        self._view = view
        return events

    def _merge(self) -> StoredObjects:
        """Every file's objects, later files winning; warns once about each new duplicate."""
        view: StoredObjects = {}
        holders: dict[ObjectKey, list[Path]] = {}
        for path, f in self._files.items():
            for key, obj in f.objects.items():
                view[key] = obj
                holders.setdefault(key, []).append(path)
        duplicates = {(key, tuple(paths)) for key, paths in holders.items() if len(paths) > 1}
        for key, paths in sorted(duplicates - self._duplicates):
            places = ", ".join(str(p) for p in paths)
            log.warning("%s is in %s; using the one in %s", _describe(key), places, paths[-1])
        self._duplicates = duplicates
        return view

    def _consumer_failed(self, what: str, e: Exception) -> None:
        # A consumer bug must not stop the source for every other object.
        log.error("manifest files: the consumer failed on %s: %s", what, e or type(e).__name__)


def _diff(old: Mapping[ObjectKey, Stored], new: Mapping[ObjectKey, Stored], fresh: Objects) -> list[WatchEvent]:
    """Events from `old` to `new`; an event carries the dict just parsed (`fresh`) when there is one."""
    events = [WatchEvent("DELETED", key[0], _dict(obj)) for key, obj in old.items() if key not in new]
    for key, obj in new.items():
        before = old.get(key)
        if before is None:
            events.append(WatchEvent("ADDED", key[0], fresh[key] if key in fresh else _dict(obj)))
        elif not _same(before, obj):
            events.append(WatchEvent("MODIFIED", key[0], fresh[key] if key in fresh else _dict(obj)))
    return events


# What the JSON of Services and EndpointSlices repeats, as a preset dictionary: one object of
# ~500 bytes compresses 2x alone, 5x with it. A fixed dictionary and level make the compression
# deterministic: equal encodings are equal compressed bytes, which `_same` relies on.
_ZDICT = (
    b'{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"","namespace":"default",'
    b'"labels":{"kubernetes.io/service-name":"","endpointslice.kubernetes.io/managed-by":"endpointslice-controller'
    b'.k8s.io"},"ownerReferences":[]},"addressType":"IPv4","endpoints":[{"addresses":["10.'
    b'"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"node-","zone":"",'
    b'"targetRef":{"kind":"Pod","name":"","namespace":""}}],"ports":[{"name":"http","port":8080,"protocol":"TCP"}]}'
    b'{"apiVersion":"v1","kind":"Service","metadata":{"name":"","namespace":"default","labels":{},"annotations":{}},'
    b'"spec":{"type":"ClusterIP","clusterIP":"10.96.","clusterIPs":[],"ipFamilies":["IPv4"],"ipFamilyPolicy":'
    b'"SingleStack","internalTrafficPolicy":"Cluster","sessionAffinity":"None","selector":{"app":""},"ports":[{'
    b'"name":"http","port":80,"protocol":"TCP","targetPort":8080}]}}'
)


def _compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(1, zdict=_ZDICT)
    return compressor.compress(data) + compressor.flush()


def _decompress(data: bytes) -> bytes:
    decompressor = zlib.decompressobj(zdict=_ZDICT)
    return decompressor.decompress(data) + decompressor.flush()


def _stored(obj: dict[str, Any]) -> Stored:
    """`obj` as kept between reads: its compressed JSON encoding if that decodes to an equal dict, else `obj`."""
    try:
        encoded = msgspec.json.encode(obj)
    except (TypeError, ValueError, RecursionError):  # a YAML date or set, a non-string key, ...
        return obj
    # NaN and infinities encode as null, integer keys as strings: only an exact round trip counts.
    return _compress(encoded) if msgspec.json.decode(encoded) == obj else obj


def _dict(stored: Stored) -> dict[str, Any]:
    if type(stored) is bytes:
        decoded: dict[str, Any] = msgspec.json.decode(_decompress(stored))
        return decoded
    assert isinstance(stored, dict)
    return stored


def _same(a: Stored, b: Stored) -> bool:
    """Whether the two objects are equal dicts (each `Stored` decodes to a dict equal to the one it was made from).

    Equal compressed bytes are equal encodings: the compression is deterministic and invertible."""
    if a is b or (type(a) is bytes and a == b):
        return True
    return _dict(a) == _dict(b)  # differing bytes may still be equal dicts: keys in another order


def _describe(key: ObjectKey) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


# -- in the worker thread: no shared state, only arguments and results


def _scan(roots: Sequence[Path], known: Mapping[Path, _File], kinds: frozenset[str] | None) -> _Scan:
    try:
        listing = _list_files(roots)
    except OSError as e:
        return _Scan([], error=f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
    scan = _Scan([])
    for path in listing:
        before = known.get(path)
        try:
            read = _read_if_changed(path, before, kinds)
        except FileNotFoundError:
            continue  # removed since the listing
        except OSError as e:  # e.g. a folder on the way lost its x bit: unusable, like a bad save
            read = _Read(_NO_STAT, b"", False, error=f"{path}: {e.strerror or e}")
        if read is _UNSETTLED:
            if before is None:
                continue  # being written: it comes in at the next poll
            read = None
        scan.present.append(path)
        if isinstance(read, _Read):
            scan.reads[path] = read
    return scan


def _list_files(roots: Sequence[Path]) -> list[Path]:
    """The manifest files under `roots` now, in order, each once; a root that is gone has none."""
    files: dict[Path, None] = {}
    for root in roots:
        try:
            found = manifest_files([root])
        except ManifestError:
            continue
        files.update(dict.fromkeys(found))
    return list(files)


def _read_if_changed(path: Path, known: _File | None, kinds: frozenset[str] | None) -> _Read | _Unsettled | None:
    """Read `path` if its stat changed (or is racy); None if not. FileNotFoundError if it is gone."""
    stat = _Stat.of(path)
    if known is not None and stat == known.stat and not known.racy:
        return None
    started = time.time_ns()
    try:
        text: str | None = read_text(path, regular_only=True)
        problem = None
    except ManifestError as exc:
        text, problem = None, str(exc)
    if _Stat.of(path) != stat:
        return _UNSETTLED
    if text is None:
        return _Read(stat, b"", False, error=problem)
    racy = stat.mtime_ns >= started - RACY_NS
    digest = hashlib.sha256(text.encode()).digest()
    if known is not None and digest == known.digest:
        return _Read(stat, digest, racy)
    try:
        objects, warnings, skipped = _parse(path, text, kinds)
    except ManifestError as exc:
        return _Read(stat, digest, racy, error=str(exc))
    stored = {key: _stored(obj) for key, obj in objects.items()}
    return _Read(stat, digest, racy, objects=stored, fresh=objects, warnings=tuple(warnings), skipped=tuple(skipped))


def _parse(path: Path, text: str, kinds: frozenset[str] | None) -> tuple[Objects, list[str], list[str]]:
    """(objects by key, warnings, why documents were skipped) of one file's text.

    ManifestError if the text as a whole is unusable (not YAML, too big, too deep, an alias bomb).
    """
    objects: Objects = {}
    places: dict[ObjectKey, str] = {}
    warnings: list[str] = []
    skipped: list[str] = []
    for raw in parse_documents(text, str(path)):
        obj = raw.obj
        kind = obj.get("kind")
        if not isinstance(kind, str) or not kind:
            skipped.append(f"{raw.source}: skipping a document without kind")
            continue
        if kinds is not None and kind not in kinds:
            continue
        try:
            namespace, name, _ = object_ref(kind, obj, namespaced=kind not in _CLUSTER_SCOPED)
        except ObjectError as exc:
            skipped.append(f"{raw.source}: skipping {exc}")
            continue
        key = (kind, namespace, name)
        if key in objects:
            warnings.append(f"{_describe(key)} is in {places[key]} and {raw.source}; using the one in {raw.source}")
        if kind in _API_VERSIONS:  # filled in as the API server would, so both sources' events look alike
            obj.setdefault("apiVersion", _API_VERSIONS[kind])
            if namespace:
                obj["metadata"]["namespace"] = namespace
        objects[key] = obj
        places[key] = raw.source
    return objects, warnings, skipped
