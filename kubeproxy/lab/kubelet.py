"""The lab's kubelet: it tells the API server about Nodes and about pods that run as processes in
network namespaces, so that upstream's controllers, not the test, make the EndpointSlices.

It does what a kubelet does to the API and nothing else: register its Node with addresses, podCIDR,
zone and a Ready condition; report a pod bound to a node as Running with its IPs and readiness;
and finish a pod's graceful deletion (the API server keeps a pod with a deletionTimestamp until
its kubelet deletes it with grace period 0). Pods are created bound (spec.nodeName), as the
scheduler would have left them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from kubeproxy.cluster.objects import LABEL_ZONE

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
POD_IMAGE = "kubeproxy.lab/probe"  # never pulled: the lab runs the probe itself
# Set on every reported pod: the API server orders conditions, a kubelet reports all four.
_POD_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


ETCD_TIMEOUT_TRIES = 3


def _etcd_timed_out(answer: httpx2.Response) -> bool:
    """kube-apiserver's 500 when etcd did not answer in time (a loaded machine's slow disk)."""
    return answer.status_code == 500 and "etcdserver: request timed out" in answer.text


class KubeletError(RuntimeError):
    """The API server refused what the lab kubelet sent; the message has its answer."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    addresses: tuple[str, ...]  # InternalIPs, first family first
    pod_cidrs: tuple[str, ...]
    zone: str = ""


@dataclass(frozen=True)
class PodInfo:
    name: str
    node_name: str
    ips: tuple[str, ...]
    labels: Mapping[str, str]
    ports: Sequence[tuple[str, int, str]] = ()  # (name, containerPort, protocol)
    namespace: str = "default"


@dataclass
class LabKubelet:
    api: httpx2.Client  # allowed to write Nodes, Pods and their status (the lab's admin)

    def _call(self, method: str, path: str, body: JSON | None = None, *, patch: bool = False) -> JSON:
        """The request, sent again (up to ETCD_TIMEOUT_TRIES times in all) while the API server
        answers that etcd timed out, as a kubelet's next status sync would: the write may have
        been made all the same, so on a second try a POST's 409 and a DELETE's 404 are success."""
        headers = {"Content-Type": MERGE_PATCH} if patch else {}
        for attempt in range(1, ETCD_TIMEOUT_TRIES + 1):
            answer = self.api.request(method, path, json=body, headers=headers)
            if attempt > 1 and (method, answer.status_code) in (("POST", 409), ("DELETE", 404)):
                return {}
            if answer.status_code >= 300 and attempt < ETCD_TIMEOUT_TRIES and _etcd_timed_out(answer):
                continue
            if answer.status_code >= 300:
                raise KubeletError(f"{method} {path}: {answer.status_code} {answer.text[:500]}")
            result: JSON = answer.json()
            return result
        raise AssertionError("unreachable: the last try returns or raises")

    def register_node(self, node: NodeInfo) -> None:
        labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux"}
        if node.zone:
            labels[LABEL_ZONE] = node.zone
        meta = {"name": node.name, "labels": labels}
        spec = {"podCIDR": node.pod_cidrs[0], "podCIDRs": list(node.pod_cidrs)} if node.pod_cidrs else {}
        self._call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec})
        status = {
            "addresses": [{"type": "InternalIP", "address": a} for a in node.addresses]
            + [{"type": "Hostname", "address": node.name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "lab kubelet"}],
        }
        self._call("PATCH", f"/api/v1/nodes/{node.name}/status", {"status": status}, patch=True)

    def report_pod(self, pod: PodInfo, *, ready: bool = True) -> None:
        """Create `pod` bound to its node, then report it Running with its IPs."""
        container: JSON = {"name": "probe", "image": POD_IMAGE}
        if pod.ports:
            container["ports"] = [{"name": n, "containerPort": p, "protocol": proto} for n, p, proto in pod.ports]
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": dict(pod.labels)},
            "spec": {
                "nodeName": pod.node_name,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 30,
                "containers": [container],
            },
        }
        self._call("POST", f"/api/v1/namespaces/{pod.namespace}/pods", body)
        self._report_status(pod, ready)

    def set_ready(self, pod: PodInfo, ready: bool) -> None:
        self._report_status(pod, ready)

    def _report_status(self, pod: PodInfo, ready: bool) -> None:
        flag = "True" if ready else "False"
        status: JSON = {
            "phase": "Running",
            "podIP": pod.ips[0],
            "podIPs": [{"ip": ip} for ip in pod.ips],
            "conditions": [{"type": t, "status": flag if t in ("ContainersReady", "Ready") else "True"} for t in _POD_CONDITIONS],
        }
        self._call("PATCH", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status", {"status": status}, patch=True)

    def start_termination(self, pod: PodInfo) -> None:
        """What `kubectl delete pod` does: the pod stays, with a deletionTimestamp, until `finish_termination`."""
        self._call("DELETE", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", {"gracePeriodSeconds": 30})

    def finish_termination(self, pod: PodInfo) -> None:
        """The kubelet's last word on a pod whose processes are gone: delete it for good."""
        self._call("DELETE", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", {"gracePeriodSeconds": 0})
