"""The multi-node lab's control plane when it is upstream's (`build(control_plane="upstream")`):
etcd, kube-apiserver and kube-controller-manager in the control-plane namespace (lab/control_plane.py),
Nodes and pods reported by the lab kubelet (lab/kubelet.py), so upstream's EndpointSlice
controller makes the slices of every Service with a selector.

`UpstreamControl` answers the calls the bed makes of the test API server (`apply`, `delete`,
`get`, `write_kubeconfig`, `url`), over the real API: the bed's code is the same for both. Each
node's proxy runs as deployed: deploy/00-rbac.yaml applied with upstream's kubectl, a kubeconfig
with a TokenRequest token for that ServiceAccount and the cluster's CA (TLS verified), as
lab/side_by_side.py runs its proxies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import ClusterError
from kubeproxy.lab.control_plane import ControlPlane, upstream_bin
from kubeproxy.lab.kubelet import LabKubelet
from kubeproxy.lab.side_by_side import RBAC_MANIFEST

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
PROXY_NAMESPACE = "kube-system"
PROXY_SERVICE_ACCOUNT = "kubeproxy"  # deploy/00-rbac.yaml's
# Where each kind lives in the API (the kinds the bed publishes).
_COLLECTIONS = {
    "Service": ("/api/v1", "services", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "Node": ("/api/v1", "nodes", False),
}
# Kinds whose status the API server keeps apart (written through /status only).
_STATUS_KINDS = ("Service", "Node")


@dataclass
class UpstreamControl:
    cp: ControlPlane
    kubelet: LabKubelet

    @classmethod
    @contextmanager
    def start(cls, workdir: Path, ns: L.NetNS, address: str, service_cidr: str) -> Iterator[UpstreamControl]:
        """Upstream's control plane listening on `address` in `ns`, with deploy/'s RBAC applied."""
        bin_dir = upstream_bin()
        if bin_dir is None:
            raise ClusterError("--control-plane upstream needs upstream's binaries: run scripts/upstream first")
        with ControlPlane.start(bin_dir, workdir, ns=ns, address=address, service_cidr=service_cidr) as cp:
            cp.run_kubectl("apply", "-f", str(RBAC_MANIFEST))
            yield cls(cp, LabKubelet(cp.api))

    @property
    def url(self) -> str:
        return self.cp.server

    def _path(self, kind: str, namespace: str, name: str = "") -> str:
        try:
            prefix, plural, namespaced = _COLLECTIONS[kind]
        except KeyError:
            raise ClusterError(f"the lab does not publish {kind} objects to upstream's API server") from None
        base = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
        return f"{base}/{name}" if name else base

    def _call(self, method: str, path: str, body: JSON | None = None, *, merge: bool = False) -> JSON:
        headers = {"Content-Type": MERGE_PATCH} if merge else {}
        answer = self.cp.api.request(method, path, json=body, headers=headers)
        if answer.status_code >= 300:
            raise ClusterError(f"{method} {path}: {answer.status_code} {answer.text[:500]}")
        result: JSON = answer.json()
        return result

    def apply(self, obj: JSON) -> JSON:
        """Create `obj`, or replace what has its name (spec and metadata; its status, if it has
        one, through /status as a controller or kubelet writes it)."""
        meta = obj.get("metadata") or {}
        kind, name = str(obj.get("kind")), str(meta.get("name"))
        namespace = meta.get("namespace", "default")
        path = self._path(kind, namespace, name)
        current = self.cp.api.get(path)
        if current.status_code == 404:
            stored = self._call("POST", self._path(kind, namespace), obj)
        elif current.status_code == 200:
            body = {**obj, "metadata": {**meta, "resourceVersion": current.json()["metadata"]["resourceVersion"]}}
            stored = self._call("PUT", path, body)
        else:
            raise ClusterError(f"GET {path}: {current.status_code} {current.text[:300]}")
        if kind in _STATUS_KINDS and obj.get("status"):
            stored = self._call("PATCH", f"{path}/status", {"status": obj["status"]}, merge=True)
        return stored

    def delete(self, kind: str, namespace: str, name: str) -> JSON:
        return self._call("DELETE", self._path(kind, namespace, name))

    def get(self, kind: str, namespace: str, name: str) -> JSON:
        return self._call("GET", self._path(kind, namespace, name))

    def write_kubeconfig(self, path: Path | str) -> Path:
        """A proxy's kubeconfig as deployed: deploy/'s ServiceAccount token and the cluster's CA."""
        return self.cp.token_kubeconfig(Path(path), PROXY_NAMESPACE, PROXY_SERVICE_ACCOUNT)
