"""`ApiServer`: the test API server's lifecycle (start, stop, restart with a fresh store), its
fault injection, and direct object access for Python tests."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kubeproxy.lab.apiserver.handler import Handler, HttpServer
from kubeproxy.lab.apiserver.hostile import Hostility
from kubeproxy.lab.apiserver.resources import DEFAULT_RESOURCES, NAMESPACE, SYSTEM_NAMESPACES, ResourceType
from kubeproxy.lab.apiserver.status_errors import BLOCK_TIMEOUT, JSON, ApiError
from kubeproxy.lab.apiserver.store import Store

log = logging.getLogger("kubeproxy.lab.apiserver")


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
    # Where to listen: loopback by default; the multi-node lab binds its control-plane namespace's
    # address so that every node namespace reaches one server.
    host: str = "127.0.0.1"
    # The server's WatchList feature: without it a watch-list request (sendInitialEvents) is
    # refused with 422, as a kube-apiserver with the feature gate off refuses it.
    watch_list: bool = True
    # Seeded hostile answers in place of some real ones (hostile.py); None: a sane server.
    hostility: Hostility | None = None
    _server: HttpServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _connections: set[socket.socket] = field(default_factory=set, init=False, repr=False)
    _dropped: set[socket.socket] = field(default_factory=set, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)
    _failing: int | None = field(default=None, init=False, repr=False)
    _failing_retry_after: int | None = field(default=None, init=False, repr=False)
    # (method, path with query) of the latest requests, oldest first: what clients asked for,
    # e.g. to derive the RBAC rules a client needs.
    requests: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=10_000), init=False, repr=False)
    # Requests by User-Agent: how the real server's logs and audit tell clients apart.
    user_agents: Counter[str] = field(default_factory=Counter, init=False, repr=False)

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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> str:
        """Listen on `host` (a free port the first time, the same port after a `stop()`)."""
        if self._server is not None:
            return self.url
        self._closing = False
        server = HttpServer((self.host, self.port), Handler)
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

    def fail_with(self, code: int | None, retry_after: int | None = None) -> None:
        """Answer every resource request with this HTTP status (e.g. 503) until called with None;
        with `retry_after`, a Status asking to retry after that many seconds (and `Retry-After`)."""
        self._failing = code
        self._failing_retry_after = retry_after

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

    def wait_for_watches(self, count: int = 1, timeout: float = 30) -> None:
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
            # Plain HTTP: there is no TLS to verify, and saying so spares every client that loads
            # this file building a CA-bundle SSL context it never uses (lightkube/httpx: 0.16 s of
            # a proxy's start-up); a real cluster's kubeconfig names its CA instead.
            "clusters": [{"name": "lab", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
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
