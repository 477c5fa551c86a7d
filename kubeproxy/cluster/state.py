"""The cluster as this node sees it: Services, EndpointSlices and Nodes by key.

Both sources (manifest files and the API) feed raw dicts through `ClusterState.apply`, so an
invalid object is rejected the same way wherever it came from: one warning naming the object and
the field, and every other object still in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.fields import object_ref
from kubeproxy.cluster.objects import (
    EndpointSlice,
    Node,
    Service,
    is_ignored_by_labels,
    kind_of,
    parse_endpoint_slice,
    parse_node,
    parse_service,
)

Key = tuple[str, str]  # (namespace, name)


@dataclass
class ClusterState:
    services: dict[Key, Service] = field(default_factory=dict)
    slices: dict[Key, EndpointSlice] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)

    def apply(self, obj: Mapping[str, Any], *, deleted: bool = False) -> str | None:
        """Add, replace or delete one raw object. Returns a warning, or None if all is well.

        A rejected update leaves the previous version of the object in place: a bad edit must
        not take down a working Service.
        """
        try:
            kind = kind_of(obj)
            if deleted:
                self._delete(kind, obj)
                return None
            if kind == "Service":
                svc = parse_service(obj)
                key = (svc.namespace, svc.name)
                if is_ignored_by_labels(svc.labels):
                    self.services.pop(key, None)
                else:
                    self.services[key] = svc
            elif kind == "EndpointSlice":
                eps = parse_endpoint_slice(obj)
                key = (eps.namespace, eps.name)
                if is_ignored_by_labels(eps.labels):
                    self.slices.pop(key, None)
                else:
                    self.slices[key] = eps
            elif kind == "Node":
                node = parse_node(obj)
                self.nodes[node.name] = node
            else:
                return None  # other kinds (Deployments, ...) share manifests; not ours
        except ObjectError as exc:
            return f"skipping {exc}"
        return None

    def _delete(self, kind: str, obj: Mapping[str, Any]) -> None:
        # Deletion needs only the key: a malformed last state must still be removable.
        if kind == "Node":
            _, name, _ = object_ref(kind, obj, namespaced=False)
            self.nodes.pop(name, None)
            return
        namespace, name, _ = object_ref(kind, obj)
        if kind == "Service":
            self.services.pop((namespace, name), None)
        elif kind == "EndpointSlice":
            self.slices.pop((namespace, name), None)


def build_state(objects: Iterable[Mapping[str, Any]]) -> tuple[ClusterState, list[str]]:
    state = ClusterState()
    warnings = [w for obj in objects if (w := state.apply(obj))]
    return state, warnings
