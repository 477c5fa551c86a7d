"""Keep the node model up to date between syncs without rebuilding it.

`build_view` over 10k Services and their slices takes seconds; between two syncs usually a
handful of Services changed. `ViewBuilder.update` recomputes only the Services it is told were
touched (the change tracker's pending set) and takes every other entry over from the previous
view: the very same objects, so that later stages (the change tracker, the render cache) can
recognise unchanged services by identity. A recomputed entry equal to the old one is replaced by
the old object too.

The result always equals `build_view` over the same state, as long as every change to the state
between two updates is among `touched` (ChangeTracker.apply guarantees this for what it applies).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TypeVar

from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.node_model import NodeView, ServiceKey, ServicePortName, build_view, endpoints_map, ports_of_service, renamed
from kubeproxy.model.options import Family

V = TypeVar("V")


class ViewBuilder:
    """The node view of one proxy, updated in place of being rebuilt; see the module docstring."""

    def __init__(self) -> None:
        self._view: NodeView | None = None
        self._line = ("", "")  # the family and node name of `_view`

    def update(self, state: ClusterState, touched: Collection[ServiceKey] | None, *, family: Family, node_name: str) -> NodeView:
        """The view of `state` for this family and node.

        touched: the Services whose objects (the Service, or any slice labelled for it before or
            after the change) may have changed since the previous update; None rebuilds all.
            A new family or node name rebuilds all too.
        """
        previous, line = self._view, (family, node_name)
        if previous is None or line != self._line:
            view = build_view(state.services.values(), state.slices.values(), family, node_name)
        elif touched is None:
            view = _reuse_equal(previous, build_view(state.services.values(), state.slices.values(), family, node_name))
        else:
            view = _patched(previous, state, touched, family, node_name)
        self._view, self._line = view, line
        return view

    def warm(self) -> None:
        """Build the current view's per-Service index now if it is not built yet.

        The first sync's change tracking does without it (changes._first); the next update
        needs it. The live proxy calls this once the first sync is reported, so that neither
        the cold start nor the first change after it waits for it (~20k names at 10k Services).
        """
        if self._view is not None:
            self._view.by_service  # noqa: B018 (a cached_property: computed and kept)


def _patched(
    previous: NodeView, state: ClusterState, touched: Collection[ServiceKey], family: Family, node_name: str
) -> NodeView:
    services = dict(previous.services)
    endpoints = dict(previous.endpoints)
    index = dict(previous.by_service)
    for key in set(touched):
        old_names = index.pop(key, frozenset())
        # The maps hold these name objects already: new entries reuse them (see `renamed`).
        known = {name: name for name in old_names}
        svc = state.services.get(key)
        ports = renamed(known, ports_of_service(svc, family) if svc is not None else {})
        eps = renamed(known, endpoints_map(state.slices_of(key), family, node_name))
        for name in old_names - ports.keys():
            services.pop(name, None)
        for name in old_names - eps.keys():
            endpoints.pop(name, None)
        # Assigning over an existing key keeps its place: the view's order stays stable.
        services.update(_kept_if_equal(previous.services, ports))
        endpoints.update(_kept_if_equal(previous.endpoints, eps))
        names = frozenset(ports) | frozenset(eps)
        if names:
            index[key] = names
    return NodeView.with_index(services, endpoints, index)


def _reuse_equal(previous: NodeView, fresh: NodeView) -> NodeView:
    """`fresh` with every name and entry equal to one of `previous` replaced by that older object."""
    known = {name: name for name in previous.services}
    known.update((name, name) for name in previous.endpoints if name not in known)
    services = _kept_if_equal(previous.services, renamed(known, fresh.services))
    endpoints = _kept_if_equal(previous.endpoints, renamed(known, fresh.endpoints))
    return NodeView(services, endpoints)


def _kept_if_equal(old: Mapping[ServicePortName, V], new: Mapping[ServicePortName, V]) -> dict[ServicePortName, V]:
    out: dict[ServicePortName, V] = {}
    for name, value in new.items():
        before = old.get(name)
        out[name] = before if before is not None and before == value else value
    return out
