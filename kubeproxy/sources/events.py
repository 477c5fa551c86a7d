"""The change events every source delivers: one object added, modified or deleted.

Events carry the object as the source decoded it, not a checked value: the plain JSON dict
Kubernetes serialises (camelCase keys, `kind` and `apiVersion` always filled in), or, for an API
list that fits the typed decoder's schema, its `schema.Item` struct (the same fields, without the
dicts: `ClusterState.apply` and the functions it uses take both). Turning either into checked
objects is the cluster model's job, so that a malformed object is reported there, by name, and
never stops a source.

Sources deliver the events of one list (or one round of file reads) as a batch when the consumer
gives a `BatchSink`: the consumer then does its per-change bookkeeping (metrics, health, asking
for a sync) once per batch instead of 20k times at a cold start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubeproxy.cluster.schema import Item, Metadata
from kubeproxy.cluster.validation import display

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class WatchEvent:
    """One change. For DELETED, `obj` is the last state the source knew, or (an object that a
    relist no longer shows) a stub with its kind, name and namespace: all a deletion needs."""

    type: EventType
    kind: str
    obj: dict[str, Any] | Item

    @property
    def namespace(self) -> str:
        return str(self._metadata().get("namespace") or "")

    @property
    def name(self) -> str:
        return str(self._metadata().get("name") or "")

    @property
    def annotations(self) -> Mapping[str, Any]:
        annotations = self._metadata().get("annotations")
        return annotations if isinstance(annotations, Mapping) else {}

    def _metadata(self) -> Mapping[str, Any]:
        obj = self.obj
        if isinstance(obj, Item):
            meta = obj.metadata
            if not isinstance(meta, Metadata):
                return {}
            # Only the fields read above; UNSET and None read as absent, as in a dict.
            return {"namespace": meta.namespace or None, "name": meta.name or None, "annotations": meta.annotations or None}
        meta = obj.get("metadata")
        return meta if isinstance(meta, dict) else {}

    def __str__(self) -> str:
        # Logged before the object is validated: a hostile name is shown quoted, on one line.
        name = display(self.name) if self.name else ""
        namespace = display(self.namespace) if self.namespace else ""
        ref = f"{namespace}/{name}" if namespace else name
        return f"{self.type} {self.kind} {ref}"


# Called synchronously, in order, from the source's event loop; it must not block.
# `asyncio.Queue.put_nowait` is a valid sink for consumers that prefer a queue.
Sink = Callable[[WatchEvent], None]
# Optional: takes the events of one list or one round at once, in order; must not block either,
# and must handle a failure of one event itself (the source cannot tell which ones went in).
BatchSink = Callable[[Sequence[WatchEvent]], None]


def deliver(
    sink: Sink, batch_sink: BatchSink | None, events: Sequence[WatchEvent], failed: Callable[[str, Exception], None]
) -> None:
    """The events to the batch sink if there is one, else one by one to the sink. A sink's
    exception goes to `failed(what, exception)` and does not stop the source: a consumer bug
    must not stop the stream for everything else."""
    if not events:
        return
    if batch_sink is not None:
        try:
            batch_sink(events)
        except Exception as e:
            failed(str(events[0]) if len(events) == 1 else f"a batch of {len(events)} events", e)
        return
    for event in events:
        try:
            sink(event)
        except Exception as e:
            failed(str(event), e)
