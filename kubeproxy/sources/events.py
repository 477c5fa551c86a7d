"""The change events every source delivers: one object added, modified or deleted.

Events carry the object as the plain JSON dict Kubernetes serialises (camelCase keys, `kind` and
`apiVersion` always filled in), not a typed value: turning dicts into checked objects is the
cluster model's job, so that a malformed object is reported there, by name, and never stops a
source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kubeproxy.cluster.validation import display

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class WatchEvent:
    """One change. For DELETED, `obj` is the last state the source knew."""

    type: EventType
    kind: str
    obj: dict[str, Any]

    @property
    def namespace(self) -> str:
        return str((self.obj.get("metadata") or {}).get("namespace") or "")

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name") or "")

    def __str__(self) -> str:
        # Logged before the object is validated: a hostile name is shown quoted, on one line.
        name = display(self.name) if self.name else ""
        namespace = display(self.namespace) if self.namespace else ""
        ref = f"{namespace}/{name}" if namespace else name
        return f"{self.type} {self.kind} {ref}"


# Called synchronously, in order, from the source's event loop; it must not block.
# `asyncio.Queue.put_nowait` is a valid sink for consumers that prefer a queue.
Sink = Callable[[WatchEvent], None]
