"""Watch events into the live proxy's cluster state: the change tracker's bookkeeping, upstream's
log lines for each, the slices' trigger times (network-programming latency), and this node's
labels and deletion for /healthz."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.changes import ChangeTracker
from kubeproxy.proxy.health import ProxyHealth
from kubeproxy.proxy.programming import TRIGGER_TIME_ANNOTATION, TriggerTimes, slice_key, trigger_time
from kubeproxy.runtime.logs import kv
from kubeproxy.sources.events import WatchEvent

log = logging.getLogger("kubeproxy.proxy")

_SERVICE_VERBS = {"ADDED": "Adding new service", "MODIFIED": "Updating existing service", "DELETED": "Removing service"}


@dataclass(frozen=True)
class Accepted:
    """How many events of a batch the state took, by kind."""

    services: int = 0
    endpoints: int = 0
    others: int = 0

    def __bool__(self) -> bool:
        return bool(self.services or self.endpoints or self.others)


@dataclass
class EventIntake:
    state: ClusterState
    node_name: str
    health: ProxyHealth
    triggers: TriggerTimes

    def apply(self, tracker: ChangeTracker, events: Sequence[WatchEvent]) -> Accepted:
        """Apply a batch in order (a source's whole list, or one watch event). One event that
        fails does not stop the others (it is logged, as the sources log a consumer failure)."""
        # The cold start delivers 20k events at 10k services: their log lines are only built
        # when INFO is on, since building them costs even when the level drops them.
        verbose = log.isEnabledFor(logging.INFO)
        services = endpoints = others = 0
        for event in events:
            try:
                kind = self._apply(tracker, event, verbose)
            except Exception as e:  # a bug for one object must not lose the rest of the list
                log.error("the proxy failed on %s: %s", event, str(e) or type(e).__name__)
                continue
            if kind == "Service":
                services += 1
            elif kind == "EndpointSlice":
                endpoints += 1
            elif kind is not None:
                others += 1
        return Accepted(services, endpoints, others)

    def _apply(self, tracker: ChangeTracker, event: WatchEvent, verbose: bool) -> str | None:
        """One event into the state: its kind, or None if the state rejected it (logged)."""
        slice_at = slice_key(event.obj) if event.kind == "EndpointSlice" else None  # type: ignore[arg-type]
        slice_before = self.state.slices.get(slice_at) if slice_at else None
        warning = tracker.apply(self.state, event.obj, deleted=event.type == "DELETED")
        if warning:
            log.warning("%s: %s", event, warning)
            return None
        ref = (f"{event.namespace}/{event.name}" if event.namespace else event.name) if verbose else ""
        if event.kind == "Service":
            if verbose:
                log.info(kv(_SERVICE_VERBS[event.type], service=ref))
        elif event.kind == "EndpointSlice":
            slice_after = self.state.slices.get(slice_at) if slice_at else None
            self.triggers.slice_event(slice_before, slice_after, _trigger_time(event))
            if verbose:
                count = sum(len(ep.addresses) for ep in slice_after.endpoints) if slice_after is not None else 0
                log.info(kv("Setting endpoints" if event.type != "DELETED" else "Removing endpoints", slice=ref, addresses=count))
        elif event.kind == "Node":
            self._node(event)
        return event.kind

    def _node(self, event: WatchEvent) -> None:
        # Manifests carry every Node; only this one's changes matter (labels, deletion).
        ours = event.name == self.node_name
        if log.isEnabledFor(logging.INFO if ours else logging.DEBUG):
            ref = f"{event.namespace}/{event.name}" if event.namespace else event.name
            (log.info if ours else log.debug)(kv("Node changed", node=ref, event=event.type, thisNode=ours))
        if ours:
            node = self.state.nodes.get(self.node_name)
            if event.type == "DELETED" or node is None:
                self.health.sync_node(deleting=True)
            else:
                self.health.sync_node(deleting=node.deleting, taints=node.taints)


def _trigger_time(event: WatchEvent) -> float | None:
    """The slice's trigger time annotation (see proxy/programming.py), plain dicts or a struct."""
    if isinstance(event.obj, dict):
        return trigger_time(event.obj)
    annotations = event.annotations
    if TRIGGER_TIME_ANNOTATION not in annotations:
        return None
    return trigger_time({"metadata": {"annotations": {TRIGGER_TIME_ANNOTATION: annotations[TRIGGER_TIME_ANNOTATION]}}})
