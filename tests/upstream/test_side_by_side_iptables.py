"""Upstream's kube-proxy (node-a) and ours (node-b) in iptables mode against upstream's control
plane: after every step of a scenario, each node's `iptables-save` equal to the other's, the
node's own endpoints named by role (kubeproxy/lab/side_by_side.py, lab/rules_compare.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeproxy.lab import objects
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide

pytestmark = pytest.mark.root

Expected = dict[str, set[tuple[str, bool, bool, bool]]]


@dataclass
class PodState:
    ip: str
    app: str
    ready: bool = True
    terminating: bool = False


@dataclass
class Scenario:
    bed: SideBySide
    pods: dict[str, PodState]
    selectors: dict[str, str]  # Service name -> the app its selector picks

    def add(self, name: str, node: str, app: str) -> None:
        pod = self.bed.add_pod(name, node, {"app": app})
        self.pods[name] = PodState(pod.info.ips[0], app)

    def add_mirrored(self, base: str, app: str) -> None:
        for node in (UPSTREAM_NODE, OURS_NODE):
            self.add(f"{base}-{node}", node, app)

    def expected(self) -> Expected:
        return {
            service: {(p.ip, p.ready and not p.terminating, p.ready, p.terminating) for p in self.pods.values() if p.app == app}
            for service, app in self.selectors.items()
        }

    def check(self, step: str) -> None:
        diffs = self.bed.await_step(self.expected(), families=("IPv4", "IPv6"), node_local=("lweb-itp",))
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)


def _services() -> list[objects.JSON]:
    http = [objects.Port("http", 80, 8080)]

    def port(node_port: int) -> list[objects.Port]:
        return [objects.Port("http", 80, 8080, node_port=node_port)]

    web = {"selector": {"app": "web"}}
    return [
        objects.service("web", "10.96.0.10", http, affinity_timeout=300, spec=web),
        objects.service("web-np", "10.96.0.11", port(30011), type="NodePort", spec=web),
        objects.service("web-lb", "10.96.0.12", port(30012), type="LoadBalancer", load_balancer_ips=["203.0.113.12"], spec=web),
        objects.service("web-ext", "10.96.0.13", http, external_ips=["198.51.100.13"], spec=web),
        objects.service("lweb-local", "10.96.0.14", port(30014), type="LoadBalancer", load_balancer_ips=["203.0.113.14"],
                        external_traffic_policy="Local", health_check_node_port=32014, spec={"selector": {"app": "lweb"}}),
        objects.service("lweb-itp", "10.96.0.15", http, internal_traffic_policy="Local", spec={"selector": {"app": "lweb"}}),
    ]  # fmt: skip


def test_iptables_rules_equal_to_upstream_at_every_step(upstream_binaries: Path) -> None:
    with SideBySide.build(upstream_binaries) as bed:
        selectors = {"web": "web", "web-np": "web", "web-lb": "web", "web-ext": "web", "lweb-local": "lweb", "lweb-itp": "lweb"}
        s = Scenario(bed, {}, selectors)
        s.add("web-0", POD_HOST_NODE, "web")
        s.add("web-1", POD_HOST_NODE, "web")
        s.add_mirrored("lweb-0", "lweb")
        s.add("lweb-remote", POD_HOST_NODE, "lweb")
        bed.apply(*_services())
        bed.start_proxies()
        s.check("the first sync")

        s.add("web-2", POD_HOST_NODE, "web")
        s.check("a pod added")
        s.add_mirrored("lweb-1", "lweb")
        s.check("a local pod added on each node")

        bed.set_ready("web-0", False)
        s.pods["web-0"].ready = False
        s.check("a pod turned not ready")

        bed.start_termination("web-1")
        s.pods["web-1"].terminating = True
        s.check("a pod terminating")
        for node in (UPSTREAM_NODE, OURS_NODE):
            bed.start_termination(f"lweb-0-{node}")
            s.pods[f"lweb-0-{node}"].terminating = True
        s.check("a local pod terminating on each node")

        bed.finish_termination("web-1")
        del s.pods["web-1"]
        for node in (UPSTREAM_NODE, OURS_NODE):
            bed.finish_termination(f"lweb-0-{node}")
            del s.pods[f"lweb-0-{node}"]
        s.check("terminated pods gone")

        bed.set_ready("web-0", True)
        s.pods["web-0"].ready = True
        s.check("a pod ready again")

        bed.delete("service", "web-ext")
        del s.selectors["web-ext"]
        s.check("a Service deleted")
        bed.delete("service", "lweb-local")
        del s.selectors["lweb-local"]
        s.check("the Local LoadBalancer deleted")
