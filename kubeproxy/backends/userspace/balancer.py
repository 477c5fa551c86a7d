"""Which endpoint a new connection goes to: round robin, ClientIP session affinity, retries.

Upstream's userspace LoadBalancerRR (pkg/proxy/userspace/roundrobin.go): one rotating index
per service port; with ClientIP affinity a client keeps its endpoint until it has been idle for
the affinity timeout; a retry after a failed connect (`reset_affinity`) moves on to the next
endpoint and re-pins the client there. Used from the relay loop's thread only, so there is no
lock; the sync thread hands over a new immutable `PortTable` and the balancer keeps its index
and the pins whose endpoint is still there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kubeproxy.model.node_model import ServicePortName

# Upstream's EndpointDialTimeouts: one connect attempt per entry, each on the next endpoint.
DIAL_TIMEOUTS = (0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True, slots=True)
class PortTable:
    """What the relay of one service port needs from a sync, never mutated afterwards."""

    name: ServicePortName
    protocol: str  # "TCP" / "UDP"
    endpoints: tuple[tuple[str, int], ...]  # (ip, port), in the order round robin visits them
    affinity: bool = False
    affinity_timeout: float = 10800.0  # seconds (sessionAffinityConfig.clientIP.timeoutSeconds)

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip, port in self.endpoints)


@dataclass(slots=True)
class _Pin:
    endpoint: tuple[str, int]
    last_used: float


@dataclass(slots=True)
class _PortState:
    table: PortTable
    index: int = 0
    pins: dict[str, _Pin] = field(default_factory=dict)


@dataclass
class Balancer:
    clock: Callable[[], float] = time.monotonic
    _ports: dict[ServicePortName, _PortState] = field(default_factory=dict)

    def update(self, tables: Mapping[ServicePortName, PortTable]) -> None:
        """Adopt a sync's tables: unchanged ports keep their state; dropped endpoints lose their pins."""
        now = self.clock()
        kept: dict[ServicePortName, _PortState] = {}
        for name, table in tables.items():
            state = self._ports.get(name)
            if state is None:
                kept[name] = _PortState(table)
                continue
            if state.table != table:
                alive = set(table.endpoints)
                timeout = table.affinity_timeout
                state.pins = (
                    {c: p for c, p in state.pins.items() if p.endpoint in alive and now - p.last_used <= timeout}
                    if table.affinity
                    else {}
                )
                if state.table.endpoints != table.endpoints:
                    state.index = 0
                state.table = table
            kept[name] = state
        self._ports = kept

    def table(self, name: ServicePortName) -> PortTable | None:
        state = self._ports.get(name)
        return state.table if state else None

    def next_endpoint(self, name: ServicePortName, client_ip: str, reset_affinity: bool = False) -> tuple[str, int] | None:
        """The endpoint for a new connection (or datagram flow) from `client_ip`; None without endpoints."""
        state = self._ports.get(name)
        if state is None or not state.table.endpoints:
            return None
        table, now = state.table, self.clock()
        if table.affinity and not reset_affinity:
            pin = state.pins.get(client_ip)
            if pin is not None and now - pin.last_used <= table.affinity_timeout:
                pin.last_used = now
                return pin.endpoint
        endpoint = table.endpoints[state.index % len(table.endpoints)]
        state.index = (state.index + 1) % len(table.endpoints)
        if table.affinity:
            state.pins[client_ip] = _Pin(endpoint, now)
        return endpoint

    def expire_pins(self) -> int:
        """Forget pins idle for longer than their timeout (upstream's CleanupStaleStickySessions)."""
        now, dropped = self.clock(), 0
        for state in self._ports.values():
            timeout = state.table.affinity_timeout
            stale = [c for c, p in state.pins.items() if now - p.last_used > timeout]
            for client in stale:
                del state.pins[client]
            dropped += len(stale)
        return dropped
