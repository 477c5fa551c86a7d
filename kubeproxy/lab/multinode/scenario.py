"""What the lab does with its bed: a service behind the load balancer whose one pod moves round
the nodes as a rolling update moves it. Used by `kubeproxy lab cluster` and the e2e tests.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kubeproxy.lab import builders
from kubeproxy.lab.multinode.bed import DualPod, MultiNodeCluster
from kubeproxy.lab.multinode.lb_handle import LoadBalancer
from kubeproxy.model.options import Family


@dataclass(frozen=True)
class LocalService:
    """A LoadBalancer Service with externalTrafficPolicy Local: its NodePort and health-check
    node port are what the load balancer sends to and polls. Single-stack, of its cluster IP's
    family."""

    name: str
    cluster_ip: str
    node_port: int
    health_check_node_port: int
    target_port: int = 8080

    @property
    def family(self) -> Family:
        return Family.of(ipaddress.ip_address(self.cluster_ip))

    @property
    def port(self) -> builders.Port:
        return builders.Port("http", 80, self.target_port, node_port=self.node_port)

    @property
    def service_port(self) -> str:
        return f"default/{self.name}:http"

    @property
    def selector(self) -> dict[str, str]:
        return {"app": self.name}

    def service(self, *, selecting: bool = False) -> builders.JSON:
        """The Service; `selecting` its pods by `selector` (for upstream's EndpointSlice
        controller), else without a selector (the lab publishes its slices itself)."""
        spec: builders.JSON = {"ipFamilies": [self.family.value], "ipFamilyPolicy": "SingleStack"}
        if selecting:
            spec["selector"] = self.selector
        return builders.service(
            self.name,
            self.cluster_ip,
            [self.port],
            type="LoadBalancer",
            external_traffic_policy="Local",
            health_check_node_port=self.health_check_node_port,
            spec=spec,
        )

    def slice(self, *backends: builders.Backend) -> builders.JSON:
        return builders.endpoint_slice(self.name, backends, [self.port], address_type=self.family.value)


def move_endpoint(bed: MultiNodeCluster, lb: LoadBalancer, svc: LocalService, old: DualPod, new_name: str, node: str) -> DualPod:
    """Move `svc`'s one endpoint from `old` to a new pod on `node`, as a rolling update does:
    the new pod ready first, then the old one terminating (still serving), then gone. Each
    step waits for the balancer to see it before the next, as a cloud LB's drain lets it:
    the new node passes its health check before the old one stops passing, and the old pod
    goes only once the balancer has stopped sending to its node."""
    family = svc.family
    new = bed.add_pod(new_name, node)
    bed.apply(svc.slice(old.backend(family=family), new.backend(family=family)))
    lb.wait_health({old.node_name, node})
    lb.wait_requests(10)
    bed.apply(svc.slice(old.backend(ready=False, terminating=True, family=family), new.backend(family=family)))
    lb.wait_health({node})
    bed.apply(svc.slice(new.backend(family=family)))
    bed.wait_endpoints(svc.service_port, {n: [new.endpoint(svc.target_port, family)] for n in bed.nodes}, family=family)
    bed.remove_pod(old.name)
    lb.wait_requests(10)
    return new


def move_pod(bed: MultiNodeCluster, lb: LoadBalancer, svc: LocalService, old: DualPod, new_name: str, node: str) -> DualPod:
    """`move_endpoint` with upstream's control plane: the lab kubelet reports the pods (the new
    one ready, the old one terminating, then gone) and upstream's EndpointSlice controller
    changes the slice; the balancer is waited for between the steps as there."""
    new = bed.add_pod(new_name, node)
    bed.report_pod(new_name, svc.selector)
    lb.wait_health({old.node_name, node})
    lb.wait_requests(10)
    bed.terminate_pod(old.name)
    lb.wait_health({node})
    bed.remove_pod(old.name)
    bed.wait_endpoints(svc.service_port, {n: [new.endpoint(svc.target_port, svc.family)] for n in bed.nodes}, family=svc.family)
    lb.wait_requests(10)
    return new
