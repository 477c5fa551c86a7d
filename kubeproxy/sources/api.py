"""The Kubernetes API as a source: one reflector per resource, list then watch, with asyncio.

Why asyncio: the live proxy runs the sync loop (bounded-frequency runner) and the health and
metrics servers next to three long-lived watches; one event loop does that without threads or
locks around the cluster model. Each `Reflector.run()` is a task; cancel it to stop.

How a consumer uses it::

    client = connect(load_config(kubeconfig))
    source = ApiSource(client, node_name="node-1", sink=on_event)   # on_event(WatchEvent) -> None
    task = asyncio.create_task(source.run())
    await source.wait_synced()     # every reflector has delivered its first list

Events go to a callback (`Sink`), called synchronously and in order from the event loop, so the
consumer can update its model and mark itself dirty without another queue in between; pass
`queue.put_nowait` to receive them through an `asyncio.Queue` instead. A consumer that also
gives a `BatchSink` receives the events of each list in one call (at a cold start 20k of them:
its per-change bookkeeping is then done once), and with `typed_lists` it receives listed objects
as the typed decoder's structs (`schema.Item`) when the list fits that schema, plain dicts
otherwise (see `events.py`). A reflector is synced once the events of its first list have all
been delivered.

What a reflector does, following client-go's reflector (v0.37.2, tools/cache/reflector.go):

- it gets the state by a watch-list where `watch_list` is on (client-go's WatchListClient gate,
  on by default; `ApiSource` turns it on): a watch with `sendInitialEvents=true`,
  `resourceVersionMatch=NotOlderThan` and the last version seen (none the first time), whose
  ADDED events up to the BOOKMARK annotated `k8s.io/initial-events-end` are the state; the
  same stream then goes on as the watch. Where the server refuses that (no WatchList feature:
  422), fails it otherwise, or ends the stream before that bookmark, it lists instead;
- a list is at `resourceVersion=0` the first time (the API server's watch cache answers, not
  etcd) and at the last version seen after that (the cache again); only when the server says it
  no longer has that version (410 Expired) or does not have it ("Too large resource version")
  is it listed again at once as a consistent read (no resourceVersion, from etcd). Paging as
  client-go's pager: `limit=500` at "0" and at none, no limit at a set version;
- then it WATCHes from the list's resourceVersion with `allowWatchBookmarks=true`; BOOKMARK
  events advance the resourceVersion silently;
- when the watch ends (server timeout) it watches again from the last resourceVersion it saw, so
  nothing is replayed and nothing is lost; so too, at once, when a watch that carried an event
  or lasted a second is cut (shorter ones are backed off, as client-go's "very short watch");
- on 410 Gone (an HTTP 410 or an ERROR event with code 410) it lists again, after a wait drawn
  from the back-off schedule (client-go's loop waits before every relist: a fleet told at once
  does not come back at once), and emits only the difference against what it had delivered:
  ADDED, MODIFIED (resourceVersion changed), DELETED (the object is gone from the list; the
  event carries a stub with its kind, namespace, name and last resourceVersion, all that a
  deletion needs: the reflector keeps only the key and resourceVersion of what it delivered,
  not the objects, ~67 MiB of dicts at 10k services);
- it relists the same way when the server shows it no longer has the history the reflector
  follows (its etcd was replaced or restored from an old backup: same objects, versions starting
  low again), because a watch from a version newer than anything the server has is accepted and
  stays silent for ever:
  - "Too large resource version" (a 504 Timeout with cause ResourceVersionTooLarge, as an HTTP
    answer or a watch ERROR event): a consistent list;
  - after a failure that may hide a restart of the server (a cut or refused connection, a 5xx
    answer), it watches again from the last version at once, as client-go does, and takes the
    resumed watch's first event or bookmark as the proof that the server has that version (the
    server sends a watch nothing older than the version it started from), or the proof another
    reflector of the source got meanwhile (`ResumeProof`). Only when none has come within
    `proof_wait` (75 s: the API server's bookmark period plus 15 s, its own
    DefaultEventFreshDuration, so a healthy server has sent a bookmark by then) does it ask, with
    the watch still open, for one object at `resourceVersion=<last>&resourceVersionMatch=NotOlderThan`:
    a server that lost its history answers "Too large resource version" and the watch gives way
    to a relist. client-go has no such check (its resumed watch would stay silent for ever); a
    restarted server that kept its history costs no request more than it does. Not after a 429,
    an ERROR event or a malformed answer: the server that sent them is alive and keeps its history;
  - a list, bookmark or event whose resourceVersion is older than the last one seen (compared
    as integers when both are, as etcd-backed servers make them; otherwise not compared): a
    consistent list;
  - no event and no bookmark for `max_silence` seconds across watches: a healthy server sends a
    bookmark at least once per watch to a client that allows them;
  while it knows its data may be stale and until that relist succeeds, `connected` is False;
- on errors (connection refused, 5xx, a broken stream) it backs off as client-go's reflector
  (800 ms doubling to 30 s, full jitter, see `backoff.py`), or as long as the server asks with
  `Retry-After` on a 429 or 5xx;
- a watch refused (401, 403: a restarted server before its RBAC bootstrap has run, a role taken
  away) is followed, after the back-off, by a watch-list from the last version, as client-go's
  (it ends its ListAndWatch); a refused watch-list is asked again, not followed by a list;
- while the server as a whole seems to fail (a cut or refused connection, 401, 403, 429, 5xx),
  the reflectors of one source take turns (`RetryTurns`): one asks per back-off round, and the
  others take its failure as theirs without asking, or ask at once once it was answered;
- every answer is decoded into typed structures first (`wire.py`): a Status, list or watch
  event of the wrong shape, another kind's list, a list item that cannot be keyed, or an answer
  past the size bounds is an error like any other (logged, retried with back-off; a watch
  resumes from the last version seen, so the event a bad line stood for is not lost), never an
  exception out of `run()`; an event of another kind is skipped, as client-go's reflector does;
- objects themselves are never validated here: a malformed one is delivered as it is, for the
  cluster model to reject by name.

lightkube supplies configuration, authentication and the resource catalogue (see
`connection.py`); list and watch are spoken here over lightkube's HTTP client because the
reflector needs what lightkube's own `watch()` hides: bookmarks, the exact resourceVersion to
resume from, 410 handling that diffs instead of replaying, and objects as the raw JSON the
server sent (its typed decoding would reject a malformed object and with it the whole list).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import msgspec
from lightkube.core.resource import Resource, api_info
from lightkube.resources.core_v1 import Node, Service
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.networking_v1 import ServiceCIDR

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.proto_schema import KINDS, PLAIN_KINDS
from kubeproxy.cluster.schema import Item, Metadata, as_plain, decode_list
from kubeproxy.sources import protobuf, wire
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.events import BatchSink, EventType, Sink, WatchEvent, deliver
from kubeproxy.sources.retry_log import failed_to_watch

log = logging.getLogger("kubeproxy.sources.api")

Key = tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped kinds
Raw = dict[str, Any] | Item  # an object as decoded: plain dicts, or the typed decoder's struct
Sleep = Callable[[float], Awaitable[None]]

# Other reflectors' failures a reflector takes as its own in a row before it asks again itself
# (`RetryTurns`): a resource the server refuses alone cannot keep another from asking for long.
MAX_ADOPTED = 3
# client-go's pager's page size (tools/pager), for the lists a reflector pages.
LIST_PAGE_SIZE = 500
# The annotation of the BOOKMARK that ends a watch-list's initial events (metav1.InitialEventsAnnotationKey).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# The API server sends every watch a bookmark about once a minute; it counts an event 15 s older
# than that as stale (apiserver v0.37.2, storage/cacher/cacher.go DefaultEventFreshDuration): a
# resumed watch quiet that long is asked whether the server still has its version.
RESUME_PROOF_WAIT = 75.0


@dataclass(frozen=True)
class ResourceSpec:
    """What a reflector lists and watches: one kind, cluster-wide, optionally filtered."""

    kind: str
    api_version: str
    path: str  # the collection URL path, e.g. /apis/discovery.k8s.io/v1/endpointslices
    field_selector: str = ""
    label_selector: str = ""

    @classmethod
    def of(cls, resource: type[Resource], *, field_selector: str = "", label_selector: str = "") -> ResourceSpec:
        """The spec of a lightkube resource class (its group, version and plural)."""
        info = api_info(resource)
        rd = info.resource
        prefix = f"/apis/{rd.group}/{rd.version}" if rd.group else f"/api/{rd.version}"
        return cls(rd.kind, rd.api_version, f"{prefix}/{info.plural}", field_selector, label_selector)

    def __str__(self) -> str:
        filters = ",".join(f for f in (self.field_selector, self.label_selector) if f)
        plural = self.path.rsplit("/", 1)[-1]
        return f"{plural}({filters})" if filters else plural


def services(label_selector: str = "", field_selector: str = "") -> ResourceSpec:
    return ResourceSpec.of(Service, field_selector=field_selector, label_selector=label_selector)


def endpoint_slices(label_selector: str = "") -> ResourceSpec:
    return ResourceSpec.of(EndpointSlice, label_selector=label_selector)


def node(name: str) -> ResourceSpec:
    """Only this node: kube-proxy needs its own labels (topology) and addresses, nobody else's."""
    return ResourceSpec.of(Node, field_selector=f"metadata.name={name}")


def service_cidrs() -> ResourceSpec:
    """The cluster's service ranges (nftables mode drops unallocated addresses in them)."""
    return ResourceSpec.of(ServiceCIDR)


class SourceError(Exception):
    """The API server answered with an error (an HTTP status or a watch ERROR event), or with
    something that is not an answer it gives (a malformed Status, list or frame, one too large).

    `retry_after` is the delay in seconds the server asked for (`Retry-After`), if any."""

    def __init__(self, url: str, code: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{url}: {code} {reason}: {message}".rstrip(": "))
        self.url = url
        self.code = code
        self.reason = reason
        self.retry_after = retry_after


class Stale(SourceError):
    """What the reflector holds no longer follows the server's history: list again from scratch."""


class Gone(Stale):
    """410: the resourceVersion asked for is older than the server keeps; list again."""


class TooLargeResourceVersion(Stale):
    """504 "Too large resource version": the server has nothing as new as the version asked for,
    so it lost (or never had) the history the reflector follows; list again from scratch."""


def _status_error(url: str, code: int, body: Any, retry_after: float | None = None) -> SourceError:
    """The error an answer with HTTP status `code` (500 for a watch ERROR event) and this body
    (decoded JSON, or text) stands for. A body that is not a Status leaves the HTTP status to speak;
    one that claims to be a Status and is malformed (a `code` that is a list, `1e400`) says so."""
    if not isinstance(body, dict):
        return SourceError(url, code, "", str(body)[:300], retry_after)
    try:
        status = wire.status_of(body)
    except wire.WireError as e:
        return SourceError(url, code, "MalformedStatus", str(e)[:300], retry_after)
    code = status.code or code
    reason = (status.reason or "")[:100]
    message = (status.message or "")[:300]
    if code == 410:
        return Gone(url, code, reason, message, retry_after)
    if _too_large(status, code, reason, message):
        return TooLargeResourceVersion(url, code, reason, message, retry_after)
    return SourceError(url, code, reason, message, retry_after)


def _too_large(status: wire.Status, code: int, reason: str, message: str) -> bool:
    """client-go's isTooLargeResourceVersionError: the cause type, or on servers before 1.19 the
    cause message or the Status message of a Timeout."""
    causes = (status.details.causes if status.details else None) or []
    if any(c.reason == "ResourceVersionTooLarge" for c in causes):
        return True
    if code != 504 and reason != "Timeout":
        return False
    return any(c.message == "Too large resource version" for c in causes) or "Too large resource version" in message


def _older(rv: str, than: str | None) -> bool:
    """Whether `rv` is older than `than`. resourceVersions are opaque, but etcd-backed servers make
    them increasing integers: compare when both parse as integers, else never call one older."""
    if than is None:
        return False
    try:
        return int(rv) < int(than)
    except ValueError:
        return False


@dataclass
class ResumeProof:
    """The newest resourceVersion the API server showed it has reached (a resumed watch's event or
    bookmark, or a resume check's answer), and when it did (loop time), shared by the reflectors
    of one source. resourceVersions are one etcd revision across resources, so a server at or past
    `version` is at or past every older version of any resource: a reflector whose version is no
    newer and whose failure was noticed before that proof came needs none of its own (after a
    restart: one event on any resource proves the server kept its history for all). Versions that
    are not integers are never covered."""

    version: int = -1
    at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # one resume check at a time
    changed: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False)  # a proof came

    async def prove(self, resource_version: str, at: float) -> None:
        """Record a proof and wake the reflectors waiting for one."""
        self.record(resource_version, at)
        async with self.changed:
            self.changed.notify_all()

    async def wait_covers(self, resource_version: Callable[[], str], failed_at: float) -> None:
        """Until a proof covers the version `resource_version()` gives (it moves with events)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.covers(resource_version(), failed_at))

    def covers(self, resource_version: str, failed_at: float) -> bool:
        try:
            return failed_at < self.at and int(resource_version) <= self.version
        except ValueError:
            return False

    def record(self, resource_version: str, at: float) -> None:
        with contextlib.suppress(ValueError):
            self.version, self.at = int(resource_version), at


def _server_wide(error: Exception) -> bool:
    """Whether a failure may be the API server's as a whole (down, restarting, overloaded, not yet
    authorizing anyone while its RBAC bootstrap runs), not one resource's: a cut or refused
    connection, or an answer 401, 403, 429 or 5xx to the request itself."""
    if isinstance(error, Stale):
        return False
    if isinstance(error, SourceError):
        return error.code in (401, 403, 429) or (error.code >= 500 and error.reason != "MalformedEvent")
    return isinstance(error, httpx2.TransportError | OSError)


@dataclass
class RetryTurns:
    """The retries of one source's reflectors while the API server as a whole seems to fail (see
    `_server_wide`). A reflector about to retry waits for another's retry in flight; where the
    last one met such a failure after the reflector's own, it takes that failure as its own and
    backs off on its own schedule without asking; where the server answered, it asks at once. A
    restarted server still bootstrapping its RBAC refuses every resource (403): a node then asks
    about once per back-off round, not once per resource."""

    turn: asyncio.Future[None] | None = None  # the retry in flight, done once it is answered or failed
    failure: Exception | None = None  # the last outcome: a server-wide failure, or None (answered)
    at: float = float("-inf")  # loop time of the last outcome

    async def wait(self) -> None:
        """Until the retry in flight, if any, is over."""
        turn = self.turn
        if turn is not None and not turn.done():
            await asyncio.shield(turn)

    def in_flight(self) -> bool:
        return self.turn is not None and not self.turn.done()

    def take(self) -> asyncio.Future[None]:
        self.turn = asyncio.get_running_loop().create_future()
        return self.turn

    def record(self, failure: Exception | None, at: float) -> None:
        self.failure, self.at = failure, at


def _rv(obj: Raw) -> str | None:
    if isinstance(obj, Item):
        item_meta = obj.metadata
        item_rv = item_meta.resourceVersion if isinstance(item_meta, Metadata) else None
        return item_rv if item_rv else None
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return str(rv) if rv else None


def _fill_type(obj: Raw, spec: ResourceSpec) -> None:
    """List items carry no kind or apiVersion (the list does); events always do."""
    if isinstance(obj, Item):
        if obj.kind is msgspec.UNSET:
            obj.kind = spec.kind
        if obj.apiVersion is msgspec.UNSET:
            obj.apiVersion = spec.api_version
    else:
        obj.setdefault("kind", spec.kind)
        obj.setdefault("apiVersion", spec.api_version)


def _stub(spec: ResourceSpec, key: Key, rv: str) -> dict[str, Any]:
    """What a DELETED event from a relist carries: the object's kind and key (and the last
    resourceVersion delivered), which is all a deletion reads."""
    namespace, name = key
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if rv:
        meta["resourceVersion"] = rv
    return {"kind": spec.kind, "apiVersion": spec.api_version, "metadata": meta}


@dataclass
class Reflector:
    """Mirrors one resource from the API server into a sink of `WatchEvent`s. See the module doc.

    `watch_timeout` is the server-side timeout of one watch request, stretched by a random
    factor in [1, 2) so that a fleet of proxies does not reconnect in lockstep (as client-go).
    `max_silence` bounds the time without an event or a bookmark (across watch requests) before
    the reflector stops trusting its watch and relists; None means 3 x `watch_timeout`: a healthy
    server sends a bookmark within about a minute of each watch start (upstream's bookmark
    frequency), so even an idle one is heard from at least once per watch (up to 2 x
    `watch_timeout` long).
    """

    client: httpx2.AsyncClient
    spec: ResourceSpec
    sink: Sink
    backoff: Backoff = field(default_factory=Backoff)
    sleep: Sleep = asyncio.sleep
    rand: random.Random = field(default_factory=random.Random)
    watch_timeout: float = 300.0
    max_silence: float | None = None
    batch_sink: BatchSink | None = None  # see the module doc
    typed_lists: bool = False  # listed objects as `schema.Item` when the list fits the schema
    # Get the state by a watch-list where the server offers it (client-go's WatchListClient: a
    # watch that streams the state, then the changes); a plain list otherwise, or when False.
    watch_list: bool = False
    # The media type asked for (clientConnection.contentType): protobuf is asked for, with JSON
    # as the fallback, for the kinds `proto_schema` decodes; JSON for the others.
    content_type: str = "application/json"
    # clientConnection.acceptContentTypes: the Accept header as given, when set (see `accept_header`).
    accept_content_types: str = ""
    # Bounds on what one answer may hold (see wire.py for why these values) and on how long a
    # list or check may take: twice the API server's own request timeout (60 s).
    max_frame_bytes: int = wire.MAX_FRAME_BYTES
    max_list_bytes: int = wire.MAX_LIST_BYTES
    max_list_pages: int = wire.MAX_LIST_PAGES
    request_deadline: float = 120.0
    resume_proof: ResumeProof | None = None  # shared with the source's other reflectors
    retry_turns: RetryTurns | None = None  # shared with the source's other reflectors
    # How long a watch resumed after a failure that may hide a restart waits for an event or a
    # bookmark (or another reflector's proof) before it asks the server for our version.
    proof_wait: float = RESUME_PROOF_WAIT
    resource_version: str | None = field(default=None, init=False)
    # The key and resourceVersion ("" if none) of every object delivered and not deleted: what a
    # relist diffs against. Not the objects: they are the consumer's once delivered.
    versions: dict[Key, str] = field(default_factory=dict, init=False)
    synced: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    # Loop time of the first error since the API server last answered, or since the reflector
    # learnt its data may be stale; None while it answers and follows the server's history.
    failing_since: float | None = field(default=None, init=False)
    # Completed lists (the first one and every relist), for tests and logs.
    lists: int = field(default=0, init=False)
    # The error the last retry was for (its "err" as logged): the same error again is logged at
    # debug level only, so a lasting state (RBAC forbids a resource, the server is down) says
    # itself once, and again only when it changes or after the server has answered.
    _failure: str | None = field(default=None, init=False, repr=False)
    # What makes two errors "the same": an HTTP error's status, whichever request met it (a
    # resumed watch and the relist after it are both forbidden by one RBAC rule); else the text.
    _failure_kind: str | None = field(default=None, init=False, repr=False)
    _must_list: bool = field(default=True, init=False, repr=False)
    # Set by a failure that may hide a restart of the API server (a cut or refused connection, a
    # 5xx answer): the version watched from is unproven until the server shows it has it.
    _check: bool = field(default=False, init=False, repr=False)
    # Loop time by which an unproven resumed watch must have had its proof, else a check is made.
    _proof_due: float | None = field(default=None, init=False, repr=False)
    # What the check made for an unproven watch met (Stale: relist; else back off), ending it.
    _proof_failure: Exception | None = field(default=None, init=False, repr=False)
    _proof: ResumeProof = field(init=False, repr=False)
    _turns: RetryTurns = field(init=False, repr=False)
    # The last failure may be the server's as a whole (`_server_wide`): the next attempt is a
    # retry that waits for another reflector's retry in flight (`RetryTurns`).
    _server_failing: bool = field(default=False, init=False, repr=False)
    # The retry turn this reflector took, until the server's answer (or failure) settles it.
    _turn: asyncio.Future[None] | None = field(default=None, init=False, repr=False)
    # Loop time of the last server-wide failure met here or taken from another reflector.
    _failed_at: float = field(default=float("-inf"), init=False, repr=False)
    # Other reflectors' failures taken as this one's in a row; after MAX_ADOPTED it asks itself.
    _adopted: int = field(default=0, init=False, repr=False)
    # The server said it no longer has (410) or does not have yet ("Too large resource version")
    # the version listed at: the next list is a consistent read.
    _version_unavailable: bool = field(default=False, init=False, repr=False)
    # A list at "0" came in pages: no watch cache, so later lists are paged too (client-go's).
    _paged: bool = field(default=False, init=False, repr=False)
    # The server refused a watch-list request itself (400, 422): it does not offer them.
    _watch_list_refused: bool = field(default=False, init=False, repr=False)
    # What a watch-list has streamed until its end bookmark; None while not in one.
    _initial: dict[Key, Raw] | None = field(default=None, init=False, repr=False)
    # Loop time of the last sign that the server follows our version: a list, an event, a
    # bookmark or a successful resume check. None until the first list.
    _heard_at: float | None = field(default=None, init=False, repr=False)
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.watch_timeout <= 0 or (self.max_silence is not None and self.max_silence <= 0):
            raise ValueError(f"watch timeout ({self.watch_timeout}s) and max silence ({self.max_silence}s) must be positive")
        self._accept = accept_header(self.content_type, self.accept_content_types, self.spec.kind)
        # Objects delivered as the schema's structs: with `typed_lists`, of a kind the schema holds.
        self._structs = self.typed_lists and self.spec.kind not in PLAIN_KINDS
        self._proof = self.resume_proof if self.resume_proof is not None else ResumeProof()
        self._turns = self.retry_turns if self.retry_turns is not None else RetryTurns()

    @property
    def accept(self) -> str:
        """The Accept header this reflector's requests carry."""
        return self._accept

    @property
    def silence_bound(self) -> float:
        return self.max_silence if self.max_silence is not None else 3 * self.watch_timeout

    async def wait_synced(self) -> None:
        await self.synced.wait()

    async def wait_for_version(self, resource_version: str) -> None:
        """Wait until the reflector has seen (by event or bookmark) exactly this resourceVersion."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.resource_version == resource_version)

    async def wait_listed(self, count: int) -> None:
        """Wait until the reflector has completed `count` lists (the first one counts)."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.lists >= count)

    async def run(self) -> None:
        """List and watch until cancelled. Never raises for server or network trouble."""
        while True:
            try:
                if await self._took_another_failure():
                    continue
                if self._must_list:
                    if not await self._watch_list():
                        await self._list()
                        await self._watch()
                    continue
                await self._watch()
            except Stale as e:
                listing = self._must_list
                self._must_list = True
                # The server showed it lacks our version: list with a consistent read, where after
                # 410 Expired or silence the version stays worth a list from the watch cache.
                if isinstance(e, TooLargeResourceVersion) or e.reason == "ResourceVersionWentBack":
                    self._version_unavailable = True
                self._mark_stale()
                if listing:
                    await self._back_off(e)
                    continue
                if isinstance(e, Gone):
                    log.warning("%s: resourceVersion %s is gone (410), relisting: %s", self.spec, self.resource_version, e)
                else:
                    log.warning("%s: relisting, the watch no longer follows the API server's history: %s", self.spec, e)
                # As client-go's reflector loop: a jittered wait from the back-off schedule before
                # every relist, so that a fleet told at once to relist does not come back at once.
                await self.sleep(self.backoff.next())
            except (SourceError, httpx2.HTTPError, httpx2.StreamError, ValueError, OSError) as e:
                await self._back_off(e)
            except Exception as e:
                # Every answer is decoded into typed structures first (wire.py), so this is a
                # defect here, not the server's doing: said loudly, and still only retried, so
                # that no answer can end the proxy.
                log.error("%s: unexpected %s reading the API server (a defect):", self.spec, type(e).__name__, exc_info=True)
                await self._back_off(e)
            finally:
                self._settle_turn()

    @property
    def connected(self) -> bool:
        return self.failing_since is None

    def _mark_stale(self) -> None:
        if self.failing_since is None:
            self.failing_since = asyncio.get_running_loop().time()

    async def _took_another_failure(self) -> bool:
        """Before a retry after a server-wide failure: wait for another reflector's retry in flight;
        where the last one failed so after this reflector's own failure, back off with that failure
        instead of asking (True); else ask, taking the turn when none is in flight (False)."""
        if not self._server_failing:
            return False
        turns = self._turns
        if self._adopted < MAX_ADOPTED:
            await turns.wait()
            failure = turns.failure
            if failure is not None and turns.at > self._failed_at:
                self._adopted += 1
                self._failed_at = turns.at
                self._refused(failure)  # as if refused here
                self._mark_stale()
                delay = self.backoff.next(failure.retry_after if isinstance(failure, SourceError) else None)
                log.debug("%s: another resource's request met %s; retrying in %.1fs", self.spec, _describe(failure), delay)
                await self.sleep(delay)
                return True
        self._adopted = 0
        if not turns.in_flight():
            self._turn = turns.take()
        return False

    def _settle_turn(self) -> None:
        """The retry turn this reflector took is over: the server answered it, or it failed."""
        turn, self._turn = self._turn, None
        if turn is not None and not turn.done():
            turn.set_result(None)

    def _server_answered(self) -> None:
        """A request answered 200: the server as a whole works; the reflectors waiting ask now."""
        self._server_failing = False
        self._turns.record(None, asyncio.get_running_loop().time())
        self._settle_turn()

    def _refused(self, error: Exception) -> None:
        """A watch refused by authentication or authorization (401, 403) is not asked again: as
        client-go's reflector (any watch error but a refused connection or a 429 ends its
        ListAndWatch), the next attempt gets the state by a watch-list from the last version.
        After an API server restart it is what the new server's watch cache serves, where a
        resumed watch would meet 410 (the cache begins at the etcd revision it started at)."""
        if isinstance(error, SourceError) and error.code in (401, 403):
            self._must_list = True

    async def _back_off(self, error: Exception) -> None:
        self._server_failing = _server_wide(error)
        if self._server_failing:
            self._failed_at = asyncio.get_running_loop().time()
            self._turns.record(error, self._failed_at)
        self._settle_turn()
        self._refused(error)
        self._mark_stale()
        asked = error.retry_after if isinstance(error, SourceError) else None
        obeyed = self.backoff.server_delays
        delay = self.backoff.next(asked)
        server_asked = asked if self.backoff.server_delays > obeyed else None
        line = failed_to_watch(self.spec.kind, self.spec.api_version, error, delay, server_asked)
        failure = str(line.fields["err"])
        kind = f"{error.code} {error.reason}" if isinstance(error, SourceError) and error.code >= 400 else failure
        log.log(logging.DEBUG if kind == self._failure_kind else logging.WARNING, line)
        self._failure, self._failure_kind = failure, kind
        await self.sleep(delay)

    def _answered(self) -> None:
        """The server answers and follows our version: the end of a failing state, said once."""
        self.failing_since = None
        if self._failure is not None:
            log.info("%s: the API server answers again (the last error: %s)", self.spec, self._failure)
            self._failure = self._failure_kind = None

    # -- list

    async def _list(self) -> None:
        listed, rv = await self._list_all()
        fresh: dict[Key, Raw] = {}
        for key, item in listed:
            _fill_type(item, self.spec)
            fresh[key] = item
        del listed
        await self._replace(fresh, rv, "listed")

    async def _replace(self, fresh: dict[Key, Raw], rv: str, how: str) -> None:
        """The whole state at `rv` is `fresh` (a list, or a watch-list's initial events): deliver
        what differs from what was delivered before."""
        first = not self.synced.is_set()
        if _older(rv, self.resource_version):
            # A consistent list is the truth, older or not: the diff below brings us back to it.
            log.warning(
                "%s: the API server went back from resourceVersion %s to %s: it lost its state (restored or replaced)",
                self.spec,
                self.resource_version,
                rv,
            )
        changes = self._diff(fresh)
        self.versions = {key: _rv(obj) or "" for key, obj in fresh.items()}
        count = len(fresh)
        del fresh  # the events hold what is still to be delivered
        self.lists += 1
        self._must_list = self._check = self._version_unavailable = False
        self._proof_due = None
        self._heard()
        await self._advance(rv)
        self.backoff.succeeded()
        self._answered()
        log.info("%s %d %s at resourceVersion %s (%d changes)", how, count, self.spec, rv, len(changes))
        # The consumer turns 10k+ objects into its own: a million allocations, none of them
        # garbage, which the cyclic collector would otherwise walk again and again (cluster.bulk).
        with paused_gc():
            self._deliver(changes)
        if first:
            self.synced.set()
            log.info("%s synced", self.spec)

    def _diff(self, fresh: dict[Key, Raw]) -> list[WatchEvent]:
        kind, known = self.spec.kind, self.versions
        events = [WatchEvent("DELETED", kind, _stub(self.spec, key, rv)) for key, rv in known.items() if key not in fresh]
        for key, obj in fresh.items():
            old = known.get(key)
            if old is None:
                events.append(WatchEvent("ADDED", kind, obj))
            elif old != (_rv(obj) or ""):
                events.append(WatchEvent("MODIFIED", kind, obj))
        return events

    async def _prove_resumed(self, watch: asyncio.Timeout) -> None:
        """A watch resumed after a failure that may hide a restart was accepted: is the server
        still at or past our version? Its first event or bookmark says so (see `_on_event`), or
        another reflector's proof; without either within `proof_wait`, one object at
        `resourceVersion=<ours>&resourceVersionMatch=NotOlderThan` is asked for, the watch still
        open. A server that lost its history answers "Too large resource version" (or, if it does
        not enforce the match, a list older than ours): `Stale`, and `watch` is ended for the
        caller to relist; another failure of the check ends it too, to be backed off."""
        loop = asyncio.get_running_loop()
        failed_at = self.failing_since if self.failing_since is not None else loop.time()
        resumed_at = self.resource_version
        if self._proof_due is None:
            self._proof_due = loop.time() + self.proof_wait
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(self._proof_due):
                await self._proof.wait_covers(lambda: self.resource_version or "", failed_at)
        if self._check:
            try:
                await self._check_resume(failed_at)
            except (SourceError, httpx2.HTTPError, httpx2.StreamError, ValueError, OSError) as e:
                self._proof_failure = e
                watch.reschedule(loop.time())
                return
        self._check, self._proof_due = False, None
        # The watch of this resource was accepted: the server answers it (RBAC lets us read it).
        self._answered()
        log.info("watch of %s restarted from resourceVersion %s: the API server kept that history (it is at %s)",
                 self.spec, resumed_at, self._proof.version if self._proof.version >= 0 else self.resource_version)  # fmt: skip

    async def _check_resume(self, failed_at: float) -> None:
        """Is the server still at or past our version? Asked unless a proof covers it by now."""
        if self.resource_version is None:
            return
        proof = self._proof
        # A source's checks go one at a time, so that those waiting are covered by the first.
        async with proof.lock:
            if not proof.covers(self.resource_version, failed_at):
                await self._ask_resume(proof)
        self._heard()
        self._check = False

    async def _ask_resume(self, proof: ResumeProof) -> None:
        params = {
            **self._selectors(),
            "resourceVersion": self.resource_version or "",
            "resourceVersionMatch": "NotOlderThan",
            "limit": "1",
        }
        url, content = await self._get(params, wire.MAX_FRAME_BYTES)
        head = self._list_head(url, self._proto_list(url, content)[0] if protobuf.is_protobuf(content) else _decode(url, content))
        rv = head.metadata.resourceVersion if head.metadata else None
        if not rv:
            raise SourceError(url, 200, "BadList", "the list has no resourceVersion")
        if _older(rv, self.resource_version):
            raise Stale(url, 200, "ResourceVersionWentBack", f"asked for {self.resource_version} or newer, got {rv}")
        await proof.prove(rv, asyncio.get_running_loop().time())

    def _list_version(self) -> str:
        """The resourceVersion to list at, as client-go's reflector picks it: "0" the first time
        (any version: the API server's watch cache answers, not etcd), the last one seen after
        that (the cache again, at least that new), "" (a consistent read from etcd) only after the
        server said it no longer has or does not yet have that version."""
        if self._version_unavailable:
            return ""
        return self.resource_version or "0"

    async def _list_all(self) -> tuple[list[tuple[Key, Raw]], str]:
        """The list at `_list_version()`, and if the server has no such version any more (410
        Expired) or not yet ("Too large resource version"), at once again as a consistent read."""
        version = self._list_version()
        try:
            return await self._list_pages(version)
        except (Gone, TooLargeResourceVersion) as e:
            if not version:
                raise
            log.info("%s: listing at resourceVersion %s failed, a consistent list instead: %s", self.spec, version, e)
            self._version_unavailable = True
            return await self._list_pages("")

    async def _list_pages(self, version: str) -> tuple[list[tuple[Key, Raw]], str]:
        """Every page of the list at `version`, each object with its key; SourceError for
        anything that is not a list of this resource's objects, or one past the bounds of `wire`.

        Pages as client-go's pager asks for them from a reflector: `limit=500` at "0" and "" (the
        watch cache ignores it at "0"), none at a set version (paging would send the list to etcd:
        "to avoid thundering herd on etcd") unless a list at "0" came back in pages (no watch
        cache); continue pages without a version; a continue token that expired (410) gets the
        whole list at the version asked for, in one answer."""
        listed: list[tuple[Key, Raw]] = []
        first = {**self._selectors(), **({"resourceVersion": version} if version else {})}
        limit = {"limit": str(LIST_PAGE_SIZE)} if version in ("", "0") or self._paged else {}
        params = {**first, **limit}
        budget = self.max_list_bytes
        url = self.spec.path
        for _ in range(self.max_list_pages):
            try:
                url, content = await self._get(params, budget)
            except Gone:
                if "continue" not in params:
                    raise
                listed, params, budget = [], first, self.max_list_bytes
                continue
            budget -= len(content)
            # A list within the typed schema decodes straight into structs (no dicts at all);
            # anything else (an unknown field, a value of another type) the general way.
            typed = decode_list(content) if self.typed_lists and not protobuf.is_protobuf(content) else None
            page: list[Any]
            if protobuf.is_protobuf(content):
                body, page = self._proto_list(url, content)
            elif typed is not None:
                body, page = typed
            else:
                body = _decode(url, content)
                page_items = body.get("items") if isinstance(body, dict) else None
                if page_items is not None and not isinstance(page_items, list):
                    raise SourceError(url, 200, "BadList", "the list's items are not a JSON list")
                page = page_items or []
            del content
            head = self._list_head(url, body)
            if len(listed) + len(page) > wire.MAX_LIST_ITEMS:
                raise SourceError(url, 200, "TooLarge", f"the list has over {wire.MAX_LIST_ITEMS} objects, the most taken")
            for item in page:
                listed.append((self._item_key(url, item, len(listed)), item))
            meta = head.metadata or wire.ListMeta()
            if not meta.continue_:
                if not meta.resourceVersion:
                    raise SourceError(url, 200, "BadList", "the list has no resourceVersion")
                return listed, meta.resourceVersion
            if version == "0":
                self._paged = True
            params = {**self._selectors(), **limit, "continue": meta.continue_}
        raise SourceError(
            url, 200, "TooManyPages", f"the list did not end within {self.max_list_pages} pages (its continue token never ends)"
        )

    def _proto_list(self, url: str, content: bytes) -> tuple[dict[str, Any], list[Any]]:
        """A protobuf list answer as (its head, as JSON's dicts; its items, as structs with
        `typed_lists`, else as JSON's dicts); SourceError naming the object that is malformed."""
        try:
            with paused_gc():
                head, items = protobuf.decode_list(content, self.spec.kind)
        except wire.WireError as e:
            raise SourceError(url, 200, "BadList", str(e)[:300]) from None
        return head, items if self._structs else [as_plain(item) for item in items]

    def _list_head(self, url: str, body: Any) -> wire.ListHead:
        """A list answer's typed envelope, of this resource's kind; SourceError otherwise."""
        try:
            head = wire.list_head(body)
        except wire.WireError as e:
            raise SourceError(url, 200, "BadList", str(e)[:300]) from None
        if head.kind and head.kind != f"{self.spec.kind}List":
            raise SourceError(url, 200, "BadList", f"a {head.kind[:60]} is not a list of {self.spec.kind} objects")
        if head.apiVersion and head.apiVersion != self.spec.api_version:
            raise SourceError(url, 200, "BadList", f"a list of {head.apiVersion[:60]} is not one of {self.spec.api_version}")
        return head

    def _item_key(self, url: str, item: Any, index: int) -> Key:
        """A listed object's key. An item that cannot be keyed, or another kind's, makes the whole
        list untrustworthy (a Go client's typed decoding refuses such a list too): refusing it
        keeps what was delivered, where skipping it would delete the object from the consumer."""
        what = f"item {index} of the list"
        if isinstance(item, Item):
            meta = item.metadata
            name = meta.name if isinstance(meta, Metadata) else None
            if not isinstance(name, str) or not name:
                raise SourceError(url, 200, "BadList", f"{what} has no metadata.name")
            kind = item.kind if isinstance(item.kind, str) else ""
            namespace = meta.namespace if isinstance(meta, Metadata) and isinstance(meta.namespace, str) else ""
            key = wire.ObjectKey(kind, "", namespace, name, "")
        else:
            try:
                key = wire.object_key(item, what)
            except wire.WireError as e:
                raise SourceError(url, 200, "BadList", str(e)[:300]) from None
        if key.kind and key.kind != self.spec.kind:
            raise SourceError(url, 200, "BadList", f"{what} is a {key.kind[:60]}, not a {self.spec.kind}")
        return (key.namespace, key.name)

    async def _get(self, params: dict[str, str], limit: int) -> tuple[str, bytes]:
        """(URL, body) of a GET of the collection that answered 200, at most `limit` bytes read
        and within `request_deadline`; SourceError (with the server's Retry-After) otherwise."""
        url = self.spec.path
        try:
            # The client's own read timeout is for short requests; a list the server is still
            # preparing (a large one, or one queued by the server's priority and fairness) is
            # waited for up to the deadline, never abandoned and sent again.
            timeout = httpx2.Timeout(10.0, read=self.request_deadline)
            async with asyncio.timeout(self.request_deadline):
                headers = {"Accept": self._accept}
                async with self.client.stream("GET", self.spec.path, params=params, timeout=timeout, headers=headers) as resp:
                    url = str(resp.url)
                    if resp.status_code != 200:
                        raise await _error_of(url, resp)
                    self._server_answered()
                    self._decodable(url, resp)
                    return url, await _read(url, resp, limit, "the list")
        except TimeoutError:
            raise SourceError(url, 0, "Timeout", f"no complete answer within {self.request_deadline:g}s") from None

    # -- watch

    async def _watch_list(self) -> bool:
        """The state by a watch-list, then the watch goes on in the same stream until it ends;
        False, with nothing delivered, where the server does not offer watch-lists: list then.

        As client-go's reflector: from the last version seen (none the first time: the current
        state), again at once without a version after 410 Expired or "Too large resource
        version"; a 429 or a transport failure is backed off and the watch-list tried again
        (raised to `run`); any other error, or a stream that ends before the bookmark that ends
        the initial events, falls back to a list. A server that refuses the request itself
        (400, 422: it has no WatchList feature) is not asked again.
        """
        if not self.watch_list or self._watch_list_refused:
            return False
        while True:
            try:
                await self._watch(initial=True)
            except (Gone, TooLargeResourceVersion) as e:
                if self._initial is None or self._version_unavailable:
                    raise
                log.info("%s: watch-list at resourceVersion %s failed, again from the current state: %s",
                         self.spec, self.resource_version, e)  # fmt: skip
                self._version_unavailable = True
                continue
            except SourceError as e:
                # Refused by authentication or authorization (a new server's RBAC bootstrap, a
                # role taken away): the list would be refused too; backed off and asked again.
                if self._initial is None or e.code in (401, 403, 429):
                    raise
                self._initial = None
                self._watch_list_refused = e.code in (400, 422)
                # In a failing state (a 403 that lasts) the list's own error is what gets said.
                level = logging.DEBUG if self._failure is not None else logging.INFO
                log.log(level, "%s: no watch-list (%s), listing instead", self.spec, e)
                return False
            if self._initial is not None:
                self._initial = None
                log.info("%s: the watch-list ended before its initial events did, listing instead", self.spec)
                return False
            return True

    async def _watch(self, *, initial: bool = False) -> None:
        """Watch from the last version seen until the server ends the watch; with `initial`, a
        watch-list: the state first (see `_watch_list`)."""
        timeout_seconds = max(1, int(self.watch_timeout * (1 + self.rand.random())))
        params = {**self._selectors(), "watch": "true"}
        if initial:
            params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
            if self.resource_version and not self._version_unavailable:
                params["resourceVersion"] = self.resource_version
        else:
            params["resourceVersion"] = self.resource_version or ""
        params |= {"allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        # No bytes for longer than the server's own timeout means the connection is dead.
        timeout = httpx2.Timeout(10.0, read=timeout_seconds + 30.0)
        self._initial = {} if initial else None
        if initial or self._heard_at is None:
            # The silence of a stream of the state counts from its request.
            self._heard_at = asyncio.get_running_loop().time()
        url = self.spec.path
        loop = asyncio.get_running_loop()
        answered: float | None = None  # loop time of the 200
        lines = 0
        prover: asyncio.Task[None] | None = None
        self._proof_failure = None
        try:
            # Silence is counted from the last sign of progress, not from this request: a server
            # that accepts our version but never reaches it ends watch after silent watch.
            async with asyncio.timeout_at(self._heard_at + self.silence_bound) as silence:
                # Uncompressed: kube-apiserver v1.37 gzips a watch over HTTP/1.1 and keeps the
                # bookmark that ends a watch-list's initial events in its compressor until the
                # next event, which may never come (seen against upstream's binary: the ADDED
                # events arrive, the bookmark does not).
                headers = {"Accept-Encoding": "identity", "Accept": self._accept}
                async with self.client.stream("GET", self.spec.path, params=params, timeout=timeout, headers=headers) as resp:
                    url = str(resp.url)
                    if resp.status_code != 200:
                        error = await _error_of(url, resp)
                        self._check = self._check or resp.status_code >= 500
                        raise error
                    self._server_answered()
                    self._decodable(url, resp)
                    answered = loop.time()
                    if not initial and self._check:
                        prover = asyncio.create_task(self._prove_resumed(silence), name=f"proof:{self.spec}")
                    elif not initial:
                        self._answered()
                    if resp.headers.get("content-type", "").startswith(protobuf.MEDIA_TYPE):
                        async for frame in _frames(url, resp, self.max_frame_bytes):
                            lines += 1
                            await self._on_frame(url, frame)
                            self._keep_listening(silence)
                    else:
                        async for line in _lines(url, resp, self.max_frame_bytes):
                            if line.strip():
                                lines += 1
                                await self._on_line(url, line)
                                self._keep_listening(silence)
        except TimeoutError:
            if self._proof_failure is not None:
                failure, self._proof_failure = self._proof_failure, None
                raise failure from None
            if not silence.expired():
                self._check = True
                raise
            raise Stale(
                url,
                0,
                "Silent",
                f"no event or bookmark for {self.silence_bound:g}s since resourceVersion {self.resource_version}",
            ) from None
        except (httpx2.TransportError, httpx2.StreamError, OSError) as e:
            self._check = True
            # As client-go's: a watch cut after it carried an event or lasted a second is watched
            # again at once (the server may be gone: the check before it meets that and backs
            # off); a watch cut sooner, or before its initial events ended, is backed off.
            if answered is None or self._initial is not None or (not lines and loop.time() - answered < 1.0):
                raise
            log.info("watch of %s cut at resourceVersion %s: %s", self.spec, self.resource_version, _describe(e))
            self._mark_stale()  # until the server shows it still has our version
            return
        finally:
            if prover is not None:
                prover.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prover
        if self._initial is None and not lines and answered is not None and loop.time() - answered < 1.0:
            # client-go's VeryShortWatchError: a server that ends every watch at once would
            # otherwise be asked again and again without a pause.
            raise SourceError(url, 200, "VeryShortWatch", "the watch ended within a second, with no event")
        log.debug("watch of %s ended by the server at resourceVersion %s", self.spec, self.resource_version)

    def _decodable(self, url: str, resp: httpx2.Response) -> None:
        """SourceError for an answer in a media type not decoded here (one that
        `clientConnection.acceptContentTypes` let the server choose, YAML or CBOR)."""
        media = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media and media not in DECODED_MEDIA_TYPES:
            raise SourceError(url, 200, "UnsupportedMediaType",
                              f"the API server answered {media[:80]}, which kubeproxy does not decode "
                              f"(asked for {self._accept[:200]}; it decodes {' and '.join(DECODED_MEDIA_TYPES)})")  # fmt: skip

    def _keep_listening(self, watch: asyncio.Timeout) -> None:
        """Silence counts from the last sign of progress; a failed proof ends the watch at once."""
        if self._proof_failure is None:
            watch.reschedule(self._heard_at + self.silence_bound if self._heard_at is not None else None)

    async def _on_line(self, url: str, line: bytes) -> None:
        if self._initial is not None and self.typed_lists:
            taken = self._typed_initial(self._initial, line)
            if taken is not None:
                if taken:  # the bookmark that ends the initial events, at this resourceVersion
                    state, self._initial = self._initial, None
                    await self._replace(state, taken, "streamed")
                return
        # Anything that is not a watch event ends the watch as an error, as in client-go (its
        # stream decoder reports it and the reflector watches again, after a back-off, from the
        # last version it saw): skipping it would lose the event it should have been.
        try:
            frame = wire.frame_of(line)
            if frame.type == "ERROR":
                raise _status_error(url, 500, frame.object)
            key = wire.object_key(frame.object, f"the {frame.type} event's object", named=frame.type != "BOOKMARK")
        except wire.WireError as e:
            raise SourceError(url, 500, "MalformedEvent", f"{e}: {line[:200]!r}") from None
        await self._on_event(url, frame.type, frame.object, key)

    async def _on_frame(self, url: str, frame: bytes) -> None:
        """One protobuf watch frame, read as `_on_line` reads a JSON line: the object as the
        typed decoder's struct (plain dicts without `typed_lists`; a bookmark's always)."""
        try:
            event = protobuf.watch_event(frame)
            if event.type not in wire.EVENT_TYPES:
                raise wire.WireError(
                    f"the watch event's type {event.type[:40]!r} is not one of {', '.join(sorted(wire.EVENT_TYPES))}"
                )
            if event.type == "ERROR":
                raise _status_error(url, 500, protobuf.event_status(event))
            obj: Raw
            if not event.kind:
                raise wire.WireError(f"the {event.type} event's object names no kind")
            if event.kind != self.spec.kind:
                obj, key = {}, wire.ObjectKey(event.kind, event.api_version, "", "", "")
            else:
                item = protobuf.event_object(event)
                meta = item.metadata if isinstance(item.metadata, Metadata) else Metadata()
                name, namespace, rv = (
                    value if isinstance(value, str) else "" for value in (meta.name, meta.namespace, meta.resourceVersion)
                )
                if not name and event.type != "BOOKMARK":
                    raise wire.WireError(f"the {event.type} event's object has no metadata.name")
                key = wire.ObjectKey(event.kind, event.api_version, namespace, name, rv)
                obj = item if self._structs and event.type != "BOOKMARK" else as_plain(item)
        except wire.WireError as e:
            raise SourceError(url, 500, "MalformedEvent", str(e)[:300]) from None
        await self._on_event(url, event.type, obj, key)

    async def _on_event(self, url: str, type_: str, obj: Raw, key: wire.ObjectKey) -> None:
        """A watch event, decoded and keyed: kept (in a watch-list's initial events), applied or skipped."""
        rv = key.resource_version
        if key.kind and key.kind != self.spec.kind:
            # client-go's reflector skips an event of another kind than it watches, with an error.
            log.warning("%s: skipping a %s event for a %.60s, not a %s", self.spec, type_, key.kind, self.spec.kind)
            return
        if self._initial is not None:
            await self._on_initial(type_, obj, key)
            return
        if rv and _older(rv, self.resource_version):
            # A watch from version N only ever carries newer ones: this server is not the one
            # whose history we followed (restored, replaced, or it forgot) and nothing it sends
            # now can be applied on top of what we hold.
            raise Stale(url, 200, "ResourceVersionWentBack", f"{type_} at {rv} on a watch from {self.resource_version}")
        if type_ == "BOOKMARK":
            if rv:
                self._heard()
                await self._advance(rv)
                await self._proved(rv)
            return
        _fill_type(obj, self.spec)
        if type_ == "DELETED":
            self.versions.pop((key.namespace, key.name), None)
        else:
            self.versions[(key.namespace, key.name)] = rv
        self._deliver([WatchEvent(_event_type(type_), self.spec.kind, obj)])
        self.backoff.succeeded()
        if rv:
            self._heard()
            await self._advance(rv)
            await self._proved(rv)

    async def _proved(self, rv: str) -> None:
        """An event or bookmark on a resumed watch: the server is at `rv`, past our last version
        (a watch carries nothing older), which proves it kept the history for every reflector."""
        if self._check:
            await self._proof.prove(rv, asyncio.get_running_loop().time())

    async def _on_initial(self, type_: str, obj: Raw, key: wire.ObjectKey) -> None:
        """An event of a watch-list's initial state: kept until the bookmark that ends them."""
        state = self._initial
        assert state is not None
        if type_ == "BOOKMARK":
            if key.resource_version and isinstance(obj, dict) and _ends_initial_events(obj):
                self._initial = None
                await self._replace(state, key.resource_version, "streamed")
            return
        if type_ == "DELETED":
            state.pop((key.namespace, key.name), None)
        else:
            _fill_type(obj, self.spec)
            state[(key.namespace, key.name)] = obj

    def _typed_initial(self, state: dict[Key, Raw], line: bytes) -> str | None:
        """An initial event by the typed decoder, as a list's items are (its object kept as the
        schema's struct, which the consumer reads without dicts: at a cold start 20k of them).
        "" when taken, the resourceVersion of the bookmark that ends the initial events, or None
        for a line this path leaves to `_on_line`'s general one: outside the schema, an ERROR,
        a key field `object_key` would refuse, another kind's object. That path then does what
        it does with any line, so both read every line the same way (tests/sources/test_api_watch_list_typed.py)."""
        event = wire.typed_event(line)
        if event is None:
            return None
        type_, item = event.type, event.object
        meta = item.metadata
        if not isinstance(meta, Metadata) or type_ not in _STATE_EVENTS or (item.kind and item.kind != self.spec.kind):
            return None
        name, namespace, rv = meta.name, meta.namespace, meta.resourceVersion
        if type_ == "BOOKMARK":
            annotations = meta.annotations
            if isinstance(rv, str) and rv and isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true":
                return rv
            return ""
        if not isinstance(name, str) or not name:
            return None
        key = (namespace if isinstance(namespace, str) else "", name)
        if type_ == "DELETED":
            state.pop(key, None)
        else:
            _fill_type(item, self.spec)
            state[key] = item
        return ""

    # -- helpers

    def _selectors(self) -> dict[str, str]:
        params = {}
        if self.spec.field_selector:
            params["fieldSelector"] = self.spec.field_selector
        if self.spec.label_selector:
            params["labelSelector"] = self.spec.label_selector
        return params

    def _deliver(self, events: list[WatchEvent]) -> None:
        deliver(self.sink, self.batch_sink, events, self._consumer_failed)

    def _consumer_failed(self, what: str, e: Exception) -> None:
        log.error("%s: the consumer failed on %s: %s", self.spec, what, _describe(e))

    def _heard(self) -> None:
        """The server showed it is at or past our version: restart the silence count."""
        self._heard_at = asyncio.get_running_loop().time()

    async def _advance(self, rv: str) -> None:
        async with self._progress:
            self.resource_version = rv
            self._progress.notify_all()


ACCEPT_JSON = "application/json"
# As client-go asks when protobuf is the content type, JSON named (not */*) so that no other
# encoding (YAML, CBOR) can come back.
ACCEPT_PROTOBUF = f"{protobuf.MEDIA_TYPE}, application/json"
DECODED_MEDIA_TYPES = (protobuf.MEDIA_TYPE, "application/json")
_CBOR = "application/cbor"


def accept_header(content_type: str, accept_content_types: str, kind: str) -> str:
    """The Accept header of the requests for `kind`, as client-go sets it (rest/request.go
    setAcceptHeader, v0.37.2): `clientConnection.acceptContentTypes` as given when set, except that
    application/cbor is asked as application/json (rest/client.go scrubCBORContentConfigIfDisabled:
    its ClientsAllowCBOR gate is off by default); else protobuf with JSON as the fallback when
    `clientConnection.contentType` is protobuf, else JSON. A kind whose protobuf `proto_schema`
    does not decode is asked for as JSON whatever the configuration."""
    if kind not in KINDS:
        return ACCEPT_JSON
    if accept_content_types.strip():
        clauses = []
        for clause in accept_content_types.split(","):
            media, sep, params = clause.partition(";")
            if media.strip().lower() == _CBOR:
                media = media.lower().replace(_CBOR, "application/json")
            clauses.append(media + sep + params)
        return ",".join(clauses)
    return ACCEPT_PROTOBUF if content_type == protobuf.MEDIA_TYPE else ACCEPT_JSON


# The events a watch-list's initial state is made of, and its end (an ERROR is not).
_STATE_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


def _ends_initial_events(bookmark: dict[str, Any]) -> bool:
    """Whether a BOOKMARK is the one that ends a watch-list's initial events (its annotation)."""
    meta = bookmark.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true"


def _event_type(type_: str) -> EventType:
    if type_ == "ADDED":
        return "ADDED"
    return "MODIFIED" if type_ == "MODIFIED" else "DELETED"


def decode_body(content: bytes) -> Any:
    """A response body's JSON; ValueError if it is not JSON.

    msgspec decodes a 10k-object list 2-3x faster than the json module, and the collector is
    paused meanwhile (see `cluster.bulk`); where msgspec refuses what the json module takes
    (NaN, 1e400, a lone surrogate escape) the json module decides, so the result is the same.
    """
    with paused_gc():
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError:
            return json.loads(content)


def _decode(url: str, content: bytes) -> Any:
    """A 200 answer's JSON; SourceError if it is not JSON."""
    try:
        with paused_gc():
            return wire.decode_json(content)
    except wire.WireError as e:
        raise SourceError(url, 200, "BadList", str(e)) from None


async def _read(url: str, resp: httpx2.Response, limit: int, what: str) -> bytes:
    """The whole body, or SourceError once it passes `limit` bytes (nothing more is read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise SourceError(url, resp.status_code, "TooLarge", f"{what} is over {limit} bytes, the most this client reads")
        chunks.append(chunk)
    return b"".join(chunks)


# Of an error answer only the Status matters, whose message is cut to 300 characters.
MAX_ERROR_BYTES = 64 * 1024


async def _error_of(url: str, resp: httpx2.Response) -> SourceError:
    """The error a non-200 answer stands for, read from at most MAX_ERROR_BYTES of its body."""
    retry_after = wire.retry_after(resp.status_code, resp.headers.get("Retry-After"))
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ERROR_BYTES:
            break
    content = b"".join(chunks)
    if size > MAX_ERROR_BYTES:
        return SourceError(url, resp.status_code, "", f"(an error body over {MAX_ERROR_BYTES} bytes)", retry_after)
    try:
        body: Any = protobuf.status(content) if protobuf.is_protobuf(content) else wire.decode_json(content)
    except wire.WireError:
        body = content[:300].decode("utf-8", "replace")
    return _status_error(url, resp.status_code, body, retry_after)


async def _lines(url: str, resp: httpx2.Response, limit: int) -> AsyncIterator[bytes]:
    """The body's lines (one watch event each); SourceError once a line passes `limit` bytes
    without its newline, so a server that never ends a line cannot fill the memory."""
    pending = bytearray()
    async for chunk in resp.aiter_bytes():
        pending += chunk
        if b"\n" in chunk:
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                if len(line) > limit:
                    raise _frame_too_large(url, limit)
                yield bytes(line)
        if len(pending) > limit:
            raise _frame_too_large(url, limit)
    if pending.strip():
        yield bytes(pending)  # the last event, if the server ended without its newline


async def _frames(url: str, resp: httpx2.Response, limit: int) -> AsyncIterator[bytes]:
    """The body's length-delimited frames (one protobuf watch event each); SourceError for a
    frame over `limit` bytes (before any of it is read) or a stream that ends inside a frame."""
    pending = bytearray()
    size: int | None = None
    async for chunk in resp.aiter_bytes():
        pending += chunk
        while True:
            if size is None:
                if len(pending) < protobuf.FRAME_HEADER:
                    break
                size = protobuf.frame_length(pending)
                if size > limit:
                    raise SourceError(url, 200, "FrameTooLarge", f"a watch frame of {size} bytes is over {limit}, the most read")
                del pending[: protobuf.FRAME_HEADER]
            if len(pending) < size:
                break
            frame = bytes(pending[:size])
            del pending[:size]
            size = None
            yield frame
    if pending or size is not None:
        raise SourceError(url, 500, "MalformedEvent", "the watch stream ended inside a protobuf frame")


def _frame_too_large(url: str, limit: int) -> SourceError:
    return SourceError(url, 200, "FrameTooLarge", f"a watch event is over {limit} bytes without a newline, the most read")


def _describe(e: BaseException) -> str:
    """One line for the log: the exception type, its message and the URL when there is one."""
    text = str(e) or type(e).__name__
    if isinstance(e, httpx2.RequestError):
        try:
            text = f"{type(e).__name__} for {e.request.method} {e.request.url}: {text}"
        except RuntimeError:  # no request attached
            text = f"{type(e).__name__}: {text}"
    return text


UPSTREAM_LABEL_SELECTOR = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
# Headless Services are never proxied: the server leaves them out (as upstream's informer asks).
NOT_HEADLESS = "spec.clusterIP!=None"


@dataclass
class ApiSource:
    """The three reflectors kube-proxy needs: Services, EndpointSlices and this Node.

    The label selector is upstream's, for both Services and EndpointSlices: objects labelled
    for another service proxy (`service.kubernetes.io/service-proxy-name`) are not ours, and
    headless ones (`service.kubernetes.io/headless`) are never proxied; headless Services are
    also left out by the field selector `spec.clusterIP!=None`, as upstream's Service informer.
    `watch_list` is client-go's WatchListClient gate (on by default at v1.37).
    """

    client: httpx2.AsyncClient
    node_name: str
    sink: Sink
    backoff_factory: Callable[[], Backoff] = Backoff
    sleep: Sleep = asyncio.sleep
    watch_timeout: float = 300.0
    max_silence: float | None = None  # see Reflector
    batch_sink: BatchSink | None = None  # see Reflector
    typed_lists: bool = False  # see Reflector
    watch_list: bool = True  # see Reflector
    content_type: str = "application/json"  # see Reflector
    accept_content_types: str = ""  # see Reflector
    proof_wait: float = RESUME_PROOF_WAIT  # see Reflector
    reflectors: list[Reflector] = field(default_factory=list, init=False)
    resume_proof: ResumeProof = field(default_factory=ResumeProof, init=False)
    retry_turns: RetryTurns = field(default_factory=RetryTurns, init=False)

    def __post_init__(self) -> None:
        specs = (services(UPSTREAM_LABEL_SELECTOR, NOT_HEADLESS), endpoint_slices(UPSTREAM_LABEL_SELECTOR), node(self.node_name),
                 service_cidrs())  # fmt: skip
        self.reflectors = [
            Reflector(
                self.client,
                spec,
                self.sink,
                backoff=self.backoff_factory(),
                sleep=self.sleep,
                watch_timeout=self.watch_timeout,
                max_silence=self.max_silence,
                batch_sink=self.batch_sink,
                typed_lists=self.typed_lists,
                watch_list=self.watch_list,
                content_type=self.content_type,
                accept_content_types=self.accept_content_types,
                resume_proof=self.resume_proof,
                retry_turns=self.retry_turns,
                proof_wait=self.proof_wait,
            )
            for spec in specs
        ]

    @property
    def _awaited(self) -> list[Reflector]:
        # As upstream's proxier, the first sync waits for Services, EndpointSlices and the Node,
        # not for ServiceCIDRs: an API server without them must not hold the rules back.
        return [r for r in self.reflectors if r.spec.kind != ServiceCIDR.__name__]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self._awaited)

    @property
    def connected(self) -> bool:
        """False while any reflector is backing off or knows its data is stale and has not
        relisted yet: what we know may not be what the cluster is."""
        return all(r.connected for r in self.reflectors)

    async def wait_synced(self) -> None:
        for r in self._awaited:
            await r.wait_synced()

    async def run(self) -> None:
        """Run every reflector until cancelled."""
        async with asyncio.TaskGroup() as group:
            for r in self.reflectors:
                group.create_task(r.run(), name=f"reflector:{r.spec}")
