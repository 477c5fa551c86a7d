"""Health as upstream kube-proxy reports it: /healthz and /livez, the per-service health-check
node ports, and the metrics server's endpoints.

Proxy health (upstream's ProxyHealthServer):
- `queued_update()` when a change arrives that needs a sync; only the oldest pending one counts.
- `updated()` when a sync succeeded: the pending change is done. Call it once when the sync loop
  starts too, as upstream's SyncLoop does: a family that never called it is not judged at all,
  so without that call a proxy whose first sync keeps failing would look healthy forever.
- A family is unhealthy once its oldest pending change is `health_timeout` old (upstream uses
  2 × syncPeriod). /livez is the proxy's health; /healthz also fails while the node is being
  deleted (deletionTimestamp set, or the cluster autoscaler's ToBeDeleted taint), so load
  balancers drain the node before it goes.
- Whether the source reaches the API server is not part of it: an outage queues no update, so
  a node whose rules are fine stays healthy; proxy/source_watch.py shows the outage instead.

Service health (upstream's ServiceHealthServer): one listener per Service with
externalTrafficPolicy Local on its healthCheckNodePort, answering 200 while the service has
endpoints on this node and the proxy is healthy, else 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import Counter

from kubeproxy.model.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from kubeproxy.model.metrics import ProxyMetrics
from kubeproxy.proxy.http import ConnectionBudget, ErrorLog, Handler, HttpServer, Response, format_bind, routes, serve, text

log = logging.getLogger(__name__)

TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
DEFAULT_FAMILY = "IPv4"
JSON_HEADERS = {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}

ServiceKey = tuple[str, str]  # (namespace, name)


def rfc3339(ts: float | None) -> str:
    """A wall-clock time as Go's encoding/json writes a time.Time (RFC 3339, UTC, trimmed fraction)."""
    if ts is None:
        return "0001-01-01T00:00:00Z"  # Go's zero time
    dt = datetime.fromtimestamp(ts, UTC)
    fraction = f"{dt.microsecond:06d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


@dataclass(frozen=True)
class FamilyHealth:
    last_updated: float
    healthy: bool


@dataclass(frozen=True)
class HealthStatus:
    """One reading of the proxy's health (upstream's ProxyHealth, without the node)."""

    healthy: bool
    last_updated: float | None  # the most recent successful sync of any family
    current_time: float
    families: Mapping[str, FamilyHealth] = field(default_factory=dict)


class ProxyHealth:
    """The sync-freshness state behind /healthz, /livez and the service health checks."""

    def __init__(self, health_timeout: float, clock: Callable[[], float] = time.time) -> None:
        if health_timeout <= 0:
            raise ValueError(f"health timeout {health_timeout}s: must be positive")
        self.health_timeout = health_timeout
        self._clock = clock
        self._lock = threading.Lock()  # the proxy may report from its sync worker thread
        self._last_updated: dict[str, float] = {}
        self._oldest_pending: dict[str, float] = {}
        # Eligible until a Node event says otherwise: a proxy that has not seen its Node yet
        # (manifest mode, or before the first watch event) must not fail /healthz for it.
        self._node_eligible = True
        # Services whose rules the kernel refused (proxy/quarantine.py): shown, not unhealthy,
        # because every other Service is in sync.
        self.quarantined: tuple[str, ...] = ()
        # More to show, read at each request (the userspace relay's state): key -> reader.
        self.details: dict[str, Callable[[], object]] = {}

    def queued_update(self, family: str = DEFAULT_FAMILY) -> None:
        with self._lock:
            self._oldest_pending.setdefault(family, self._clock())

    def updated(self, family: str = DEFAULT_FAMILY) -> None:
        with self._lock:
            self._oldest_pending.pop(family, None)
            self._last_updated[family] = self._clock()

    def sync_node(self, *, deleting: bool = False, taints: Iterable[str] = ()) -> None:
        """Record this node's state: `deleting` is a set deletionTimestamp, `taints` the taint keys."""
        eligible = not deleting and TO_BE_DELETED_TAINT not in set(taints)
        with self._lock:
            self._node_eligible = eligible

    @property
    def node_eligible(self) -> bool:
        return self._node_eligible

    def status(self) -> HealthStatus:
        with self._lock:
            now = self._clock()
            families = {}
            for family, last in sorted(self._last_updated.items()):
                pending = self._oldest_pending.get(family)
                families[family] = FamilyHealth(last, pending is None or now - pending < self.health_timeout)
        return HealthStatus(
            healthy=all(f.healthy for f in families.values()),
            last_updated=max((f.last_updated for f in families.values()), default=None),
            current_time=now,
            families=families,
        )

    @property
    def healthy(self) -> bool:
        return self.status().healthy

    def healthz(self) -> Response:
        """/healthz: the proxy is healthy and the node is not going away."""
        status, eligible = self.status(), self.node_eligible
        return _health_response(status, status.healthy and eligible, node_eligible=eligible, quarantined=self.quarantined,
                                details=self._details())

    def livez(self) -> Response:
        """/livez: the proxy is healthy, whatever happens to the node."""
        status = self.status()
        return _health_response(status, status.healthy, node_eligible=None, quarantined=self.quarantined,
                                details=self._details())

    def _details(self) -> dict[str, object]:
        return {key: read() for key, read in self.details.items()}


def _health_response(
    status: HealthStatus, ok: bool, *, node_eligible: bool | None, quarantined: tuple[str, ...] = (),
    details: Mapping[str, object] | None = None,
) -> Response:
    # Upstream reports lastUpdated as "now" while healthy, for compatibility with releases whose
    # lastUpdated was the last sync-loop run.
    doc: dict[str, object] = {
        "lastUpdated": rfc3339(status.current_time if ok else status.last_updated),
        "currentTime": rfc3339(status.current_time),
    }
    if node_eligible is not None:
        doc["nodeEligible"] = node_eligible
    doc["healthy"] = status.healthy
    if status.families:
        doc["status"] = {
            family: {"lastUpdated": rfc3339(f.last_updated), "healthy": f.healthy} for family, f in status.families.items()
        }
    if quarantined:
        doc["quarantinedServices"] = list(quarantined)
    doc.update(details or {})
    return Response(200 if ok else 503, JSON_HEADERS, json.dumps(doc, separators=(",", ":")).encode())


@dataclass
class _ServiceListener:
    port: int
    servers: list[HttpServer]
    endpoints: int = 0

    def close(self) -> None:
        for server in self.servers:
            server.close()


class ServiceHealthServers:
    """One health-check listener per service on its healthCheckNodePort, on each of `bind_ips`.

    Like upstream, a port that cannot be opened is logged (naming the service) and retried on the
    next `sync_services`; the other services keep working. `bind_ips` defaults to every IPv4
    address; an IPv6 node wants ("::",), a restricted --nodeport-addresses the node's IPs.

    Every listener draws its connections from `budget` and reports repeated errors through
    `errors` (both default to new ones, sized from RLIMIT_NOFILE): one per proxy, shared with its
    healthz and metrics servers, bounds the descriptors all of them hold together.
    """

    def __init__(
        self,
        proxy_health: ProxyHealth,
        bind_ips: Sequence[str] = ("0.0.0.0",),
        *,
        node_name: str = "",
        budget: ConnectionBudget | None = None,
        errors: ErrorLog | None = None,
        on_failure: Callable[[ServiceKey, str], None] | None = None,
    ) -> None:
        self.budget = budget or ConnectionBudget.from_rlimit()
        self.errors = errors or ErrorLog()
        # Told (service, upstream's message) of each port that cannot be opened: the proxy's Event.
        self.on_failure = on_failure
        self._health = proxy_health
        self._bind_ips = tuple(bind_ips)
        self._node_name = node_name
        self._services: dict[ServiceKey, _ServiceListener] = {}

    def set_bind_ips(self, bind_ips: Sequence[str]) -> None:
        """Listen on `bind_ips` from the next `sync_services` on. When they change (the node's
        addresses that --nodeport-addresses selects, or its family), open listeners are closed,
        to reopen there."""
        ips = tuple(bind_ips)
        if ips == self._bind_ips:
            return
        log.info('"Health-check node ports listen on" addresses="%s"', ",".join(ips) or "none")
        self._bind_ips = ips
        for listener in self._services.values():
            listener.close()
        self._services.clear()

    async def sync_services(self, ports: Mapping[ServiceKey, int]) -> None:
        """Make `ports` ((namespace, name) → healthCheckNodePort) the set of open listeners."""
        for key, listener in list(self._services.items()):
            if ports.get(key) != listener.port:
                log.info('"Closing healthcheck" service="%s" port=%d', _ref(key), listener.port)
                listener.close()
                del self._services[key]
        # Sorted, so that which of two services claiming one port wins does not vary between runs.
        for key, port in sorted(ports.items()):
            if key in self._services:
                continue
            log.info('"Opening healthcheck" service="%s" port=%d', _ref(key), port)
            try:
                servers = await self._listen(key, port)
            except (OSError, ValueError) as exc:
                log.error(
                    '"Failed to start healthcheck" node="%s" service="%s" port=%d err="%s"', self._node_name, _ref(key), port, exc
                )
                if self.on_failure is not None:
                    message = f'node {self._node_name} failed to start healthcheck "{_ref(key)}" on port {port}: {exc}'
                    self.on_failure(key, message)
                continue
            self._services[key] = _ServiceListener(port, servers)

    def sync_endpoints(self, local: Mapping[ServiceKey, int]) -> None:
        """Set each service's count of local endpoints; services missing from `local` have none."""
        for key, listener in self._services.items():
            listener.endpoints = local.get(key, 0)

    def ports(self) -> dict[ServiceKey, int]:
        """The services whose listeners are open, with their ports."""
        return {key: listener.port for key, listener in self._services.items()}

    async def close(self) -> None:
        for listener in self._services.values():
            listener.close()
        self._services.clear()

    async def _listen(self, key: ServiceKey, port: int) -> list[HttpServer]:
        servers: list[HttpServer] = []
        try:
            for ip in self._bind_ips:
                server = await serve(
                    format_bind(ip, port),
                    lambda *_: self._answer(key),
                    name=f"healthcheck {_ref(key)}",
                    budget=self.budget,
                    errors=self.errors,
                )
                servers.append(server)
        except BaseException:
            # Release what did open, so that a retry (or another service) can have the port.
            for server in servers:
                server.close()
            raise
        return servers

    def _answer(self, key: ServiceKey) -> Response:
        listener = self._services.get(key)
        if listener is None:
            # The service went away between accepting the connection and answering it.
            log.error('"Received request for closed healthcheck" service="%s"', _ref(key))
            return Response(503)
        count, healthy = listener.endpoints, self._health.healthy
        namespace, name = key
        # Upstream's exact layout: tab-indented, no trailing newline.
        body = (
            "{\n"
            '\t"service": {\n'
            f'\t\t"namespace": {json.dumps(namespace)},\n'
            f'\t\t"name": {json.dumps(name)}\n'
            "\t},\n"
            f'\t"localEndpoints": {count},\n'
            f'\t"serviceProxyHealthy": {json.dumps(healthy)}\n'
            "}"
        )
        headers = {**JSON_HEADERS, "X-Load-Balancing-Endpoint-Weight": str(count)}
        return Response(200 if count and healthy else 503, headers, body.encode())


def _ref(key: ServiceKey) -> str:
    return f"{key[0]}/{key[1]}"


async def serve_healthz(
    health: ProxyHealth,
    metrics: ProxyMetrics,
    bind: str,
    *,
    budget: ConnectionBudget | None = None,
    errors: ErrorLog | None = None,
) -> HttpServer:
    """The healthz server (healthzBindAddress, default 0.0.0.0:10256): /healthz and /livez.
    `budget` and `errors`: see `ServiceHealthServers`."""

    def counted(answer: Callable[[], Response], counter: Counter) -> Callable[..., Response]:
        def handle(*_: object) -> Response:
            response = answer()
            counter.labels(code=str(response.status)).inc()
            return response

        return handle

    server = await serve(
        bind,
        routes(
            {
                "/healthz": counted(health.healthz, metrics.proxy_healthz_total),
                "/livez": counted(health.livez, metrics.proxy_livez_total),
            }
        ),
        name="healthz",
        budget=budget,
        errors=errors,
    )
    log.info('"Starting healthz HTTP server" address="%s"', bind)
    return server


async def serve_metrics(
    metrics: ProxyMetrics,
    bind: str,
    proxy_mode: str,
    *,
    budget: ConnectionBudget | None = None,
    errors: ErrorLog | None = None,
    pages: Mapping[str, Handler] | None = None,
) -> HttpServer:
    """The metrics server (metricsBindAddress, default 127.0.0.1:10249): /metrics, /proxyMode and
    the generic /healthz ping, which (as upstream) says "ok" whatever the proxy's health, plus
    `pages` (proxy/zpages.py: /configz, /flagz, /statusz). `budget` and `errors`: see
    `ServiceHealthServers`."""

    async def metrics_page(*_: object) -> Response:
        # Collection may read kernel counters (nfacct): keep it off the event loop.
        body = await asyncio.to_thread(metrics.exposition)
        return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, body)

    ok = text(200, "ok")
    mode = text(200, proxy_mode)
    server = await serve(
        bind,
        routes(
            {
                "/metrics": metrics_page,
                "/healthz": lambda *_: ok,
                "/healthz/ping": lambda *_: ok,
                "/proxyMode": lambda *_: mode,
                **(pages or {}),
            }
        ),
        name="metrics",
        budget=budget,
        errors=errors,
    )
    log.info('"Starting metrics HTTP server" address="%s"', bind)
    return server
