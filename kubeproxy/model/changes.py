"""What changed since the last sync: which services need their chains rewritten, and what
conntrack state went stale.

Events go through `ChangeTracker.apply`, which applies them to the `ClusterState` and notes the
services they touch (a Service by its key, an EndpointSlice by its service label, old and new).
A sync then calls `take(view)` once: it returns the changes since the previous `take` and starts
a new period, in one synchronous call, so no event can fall between "read" and "reset" on the
asyncio loop. Touched services whose node-model projection did not change (an informer resync,
an edit of a label we ignore, an add followed by a delete) are dropped, as upstream drops
no-op changes.

Mirrors upstream's ServiceChangeTracker / EndpointsChangeTracker results: UpdatedServices,
DeletedUDPClusterIPs, DeletedUDPEndpoints and NewlyActiveUDPServices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import object_ref
from kubeproxy.cluster.objects import kind_of
from kubeproxy.cluster.schema import Item
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServiceKey, ServicePortInfo, ServicePortName

UDP = "UDP"


@dataclass(frozen=True, slots=True, order=True)
class StaleEndpoint:
    """A UDP endpoint that no longer serves `port`: its conntrack entries must go."""

    port: ServicePortName
    ip: str
    address: str  # ip:port, upstream's Endpoint.String()


@dataclass(frozen=True)
class Changes:
    """The result of one `take`: what a sync must do beyond the shared chains."""

    full: bool  # rewrite everything (first sync, after a failure, the node changed, ...)
    services: frozenset[ServiceKey] = frozenset()
    deleted_udp_cluster_ips: frozenset[str] = frozenset()
    deleted_udp_endpoints: frozenset[StaleEndpoint] = frozenset()
    newly_active_udp_services: frozenset[ServicePortName] = frozenset()

    @property
    def changed_services(self) -> frozenset[ServiceKey] | None:
        """What `render(changed_services=...)` takes: None means a full sync."""
        return None if self.full else self.services


@dataclass
class ChangeTracker:
    """Accumulates touched services between syncs; see the module docstring.

    node_name: this node. A change to its Node object (labels drive topology) forces a full
    sync; other nodes are ignored. Empty: any Node change forces one.
    """

    node_name: str = ""
    _pending: set[ServiceKey] = field(default_factory=set, init=False)
    _full: bool = field(default=True, init=False)  # nothing in the kernel yet: write everything
    _synced: NodeView | None = field(default=None, init=False)  # the view the last sync rendered

    def apply(self, state: ClusterState, obj: Mapping[str, Any] | Item, *, deleted: bool = False) -> str | None:
        """`state.apply` plus bookkeeping (plain dicts or a `schema.Item`). Returns its warning, if any."""
        try:
            kind = kind_of(obj)
            namespace, name, _ = object_ref(kind, obj, namespaced=kind != "Node")
        except ObjectError:
            return state.apply(obj, deleted=deleted)  # unusable: state rejects it, nothing changes
        key = (namespace, name)
        if kind == "Service":
            old_svc = state.services.get(key)
            warning = state.apply(obj, deleted=deleted)
            if state.services.get(key) != old_svc:
                self._pending.add(key)
            return warning
        if kind == "EndpointSlice":
            old_slice = state.slices.get(key)
            warning = state.apply(obj, deleted=deleted)
            new_slice = state.slices.get(key)
            if new_slice != old_slice:
                # A relabelled slice moves endpoints from one service to another: both change.
                for eps in (old_slice, new_slice):
                    if eps is not None:
                        self._pending.add((eps.namespace, eps.service_name))
            return warning
        if kind == "Node":
            old_node = state.nodes.get(name)
            warning = state.apply(obj, deleted=deleted)
            if state.nodes.get(name) != old_node and (not self.node_name or name == self.node_name):
                self._full = True
            return warning
        return state.apply(obj, deleted=deleted)

    def touch(self, services: Iterable[ServiceKey]) -> None:
        """Mark services changed by something other than an object event."""
        self._pending.update(services)

    def request_full_sync(self) -> None:
        """After a failed sync: the changes it consumed are lost, so rewrite everything next time."""
        self._full = True

    def pending(self) -> frozenset[ServiceKey] | None:
        """What the next `take` will look at, without starting a new period: the Services
        touched since the last take, or None when a full sync is due.

        `ViewBuilder.update` takes exactly this as `touched`: read it just before `take`.
        """
        return None if self._full else frozenset(self._pending)

    def take(self, view: NodeView) -> Changes:
        """The changes since the last take, given the view the coming sync will render."""
        touched, self._pending = self._pending, set()
        full, self._full = self._full, False
        if self._synced is None:
            self._synced = view
            return _first(full, touched, view)
        previous, self._synced = self._synced, view

        old_ports, old_eps = _project(previous, touched)
        new_ports, new_eps = _project(view, touched)
        services = frozenset(k for k in touched if old_ports.get(k) != new_ports.get(k) or old_eps.get(k) != new_eps.get(k))

        deleted_ips = {
            str(info.cluster_ip)
            for ports in old_ports.values()
            for name, info in ports.items()
            if name.protocol == UDP and name not in view.services
        }
        stale: set[StaleEndpoint] = set()
        newly_active: set[ServicePortName] = set()
        for key in services:
            before, after = old_eps.get(key, {}), new_eps.get(key, {})
            for port in set(before) | set(after):
                if port.protocol != UDP:
                    continue
                stale.update(_stale_endpoints(port, before.get(port, []), after.get(port, [])))
                if _serving(after.get(port, [])) and not _serving(before.get(port, [])):
                    # Packets sent while there were no endpoints left conntrack entries that
                    # blackhole the flow; they must be cleared now that there is somewhere to go.
                    newly_active.add(port)
        return Changes(full, services, frozenset(deleted_ips), frozenset(stale), frozenset(newly_active))


def _first(full: bool, touched: set[ServiceKey], view: NodeView) -> Changes:
    """`take` against an empty previous view (the first sync), without projecting both views.

    Nothing was synced before, so every touched Service with a port or endpoints in the view
    changed; no IP was deleted and no endpoint went stale; a UDP port is newly active when it
    has a serving endpoint. At 10k Services the general path built the view's per-Service index
    and two projections of it (~0.1 s of the cold start); the index is built later, when an
    incremental update first needs it. tests/model/test_changes.py checks both give the same.
    """
    present = {name.service for name in view.services}
    present.update(name.service for name in view.endpoints)
    services = frozenset(touched & present)
    newly_active = frozenset(
        name for name, eps in view.endpoints.items() if name.protocol == UDP and name.service in services and _serving(eps)
    )
    return Changes(full, services, frozenset(), frozenset(), newly_active)


def _project(
    view: NodeView, keys: set[ServiceKey]
) -> tuple[dict[ServiceKey, dict[ServicePortName, ServicePortInfo]], dict[ServiceKey, dict[ServicePortName, list[EndpointInfo]]]]:
    """The part of the view that belongs to each service in `keys`: its ports and endpoints."""
    ports: dict[ServiceKey, dict[ServicePortName, ServicePortInfo]] = {}
    eps: dict[ServiceKey, dict[ServicePortName, list[EndpointInfo]]] = {}
    if not keys:
        return ports, eps
    for key in keys:
        for name in view.ports_of(key):
            if (info := view.services.get(name)) is not None:
                ports.setdefault(key, {})[name] = info
            if (endpoints := view.endpoints.get(name)) is not None:
                eps.setdefault(key, {})[name] = endpoints
    return ports, eps


def _serving(endpoints: list[EndpointInfo]) -> int:
    return sum(1 for ep in endpoints if ep.serving)


def _stale_endpoints(port: ServicePortName, before: list[EndpointInfo], after: list[EndpointInfo]) -> set[StaleEndpoint]:
    # An endpoint that was not serving received no traffic, so it has no entries to clear; one
    # that stopped serving (or vanished) may still have flows pinned to it.
    still_serving = {ep.address for ep in after if ep.serving}
    return {StaleEndpoint(port, ep.ip, ep.address) for ep in before if ep.serving and ep.address not in still_serving}
