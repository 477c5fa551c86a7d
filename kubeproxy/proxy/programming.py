"""Which EndpointSlice changes count toward `kubeproxy_network_programming_duration_seconds`.

The EndpointSlice controller stamps each slice it writes with the time of the change that caused
the write (the `endpoints.kubernetes.io/last-change-trigger-time` annotation). After a
successful sync the proxy observes `now - trigger` for every trigger the sync programmed: that
is the cluster's network-programming latency (pod change → rules in this node's kernel).

Upstream's rules (pkg/proxy/endpointschangetracker.go, EndpointSliceUpdate / checkoutTriggerTimes,
and the proxiers' syncProxyRules), followed here one for one:

- Only an event that changes what the proxy knows of the slice counts (upstream's
  `changeNeeded`): a resync or relist that delivers an unchanged slice would otherwise observe
  the age of a change programmed long ago.
- A deleted slice records nothing and drops the triggers still pending for its Service: a
  deleted object's annotation is the time of its last update, not of its deletion.
- A trigger that is missing, unparsable, or not strictly after the tracker started (the proxy's
  start) is ignored: after a restart every slice arrives with an old trigger time, and the delay
  since then is the proxy's downtime, not programming latency.
- Triggers are kept per Service (namespace, service label) and taken all at once by the sync
  that programs them. A sync that fails has taken them too: they are not observed (upstream
  checks them out before the restore and returns early on failure).
- The observation is `now - trigger`, whatever its sign: a controller clock ahead of this
  node's makes it negative, which upstream also observes (it lands in the first bucket).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import object_ref
from kubeproxy.cluster.objects import EndpointSlice
from kubeproxy.model.node_model import ServiceKey

log = logging.getLogger(__name__)

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"


def trigger_time(obj: Mapping[str, object]) -> float | None:
    """The slice's trigger time (seconds since the epoch), or None when absent or malformed."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(TRIGGER_TIME_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        log.error('"Error while parsing EndpointsLastChangeTriggerTimeAnnotation" value="%s"', raw[:64])
        return None
    if parsed.tzinfo is None:
        return None  # RFC 3339 requires an offset; Go's parser would reject this one too
    return parsed.timestamp()


@dataclass
class TriggerTimes:
    """Trigger times waiting for the sync that programs them. `start` is the tracker's
    creation time on the wall clock (upstream's trackerStartTime)."""

    start: float
    _pending: dict[ServiceKey, list[float]] = field(default_factory=dict, init=False)

    def slice_event(self, before: EndpointSlice | None, after: EndpointSlice | None, trigger: float | None) -> None:
        """Note one EndpointSlice event: `before`/`after` are the proxy's parsed slice before
        and after it (None: absent, deleted, or not ours), `trigger` the object's trigger time."""
        if before == after:
            return  # nothing changed for the proxy: no sync needed, nothing to measure
        if after is None:
            assert before is not None
            self._pending.pop((before.namespace, before.service_name), None)
            return
        if trigger is not None and trigger > self.start:
            self._pending.setdefault((after.namespace, after.service_name), []).append(trigger)

    def take(self) -> dict[ServiceKey, list[float]]:
        """The pending trigger times, per Service; starts a new period."""
        taken, self._pending = self._pending, {}
        return taken

    def __len__(self) -> int:
        return sum(len(times) for times in self._pending.values())


def latencies(taken: Mapping[ServiceKey, list[float]], now: float) -> list[float]:
    """What a successful sync at `now` observes for the triggers it took."""
    out = []
    for (namespace, name), times in taken.items():
        for trigger in times:
            out.append(now - trigger)
            log.debug('"Network programming" endpoint="%s/%s" elapsed=%.3f', namespace, name, now - trigger)
    return out


def slice_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (namespace, name) under which `ClusterState.slices` holds this raw slice, or None
    when its metadata is unusable (the state rejects such an object anyway)."""
    try:
        namespace, name, _ = object_ref("EndpointSlice", obj)
    except ObjectError:
        return None
    return namespace, name
