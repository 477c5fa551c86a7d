"""Upstream's kube-proxy (node-a) and ours (node-b) in iptables mode against upstream's control
plane: after every step of a scenario, each node's `iptables-save` and `ip6tables-save` equal to
the other's, the node's own endpoints named by role (kubeproxy/lab/side_by_side.py,
lab/rules_compare.py). One scenario has IPv4 Services only, one every IP family policy."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide

pytestmark = pytest.mark.root

Expected = dict[str, set[tuple[str, bool, bool, bool]]]
FAMILIES = ("IPv4", "IPv6")


@dataclass
class PodState:
    ips: tuple[str, ...]  # IPv4, IPv6
    app: str
    ready: bool = True
    terminating: bool = False


@dataclass
class Scenario:
    bed: SideBySide
    pods: dict[str, PodState]
    selectors: dict[str, str]  # Service name -> the app its selector picks
    families: dict[str, tuple[str, ...]] = field(default_factory=dict)  # Service name -> its ipFamilies (IPv4 if absent)
    node_local: tuple[str, ...] = ("lweb-itp",)

    def add(self, name: str, node: str, app: str) -> None:
        pod = self.bed.add_pod(name, node, {"app": app})
        self.pods[name] = PodState(pod.info.ips, app)

    def add_mirrored(self, base: str, app: str) -> None:
        for node in (UPSTREAM_NODE, OURS_NODE):
            self.add(f"{base}-{node}", node, app)

    def expected(self) -> Expected:
        out: Expected = {}
        for service, app in self.selectors.items():
            indexes = [FAMILIES.index(f) for f in self.families.get(service, ("IPv4",))]
            out[service] = {
                (p.ips[i], p.ready and not p.terminating, p.ready, p.terminating)
                for p in self.pods.values()
                if p.app == app
                for i in indexes
            }
        return out

    def check(self, step: str, changed: Collection[str] = ("IPv4",)) -> None:
        diffs = self.bed.await_step(self.expected(), families=FAMILIES, node_local=self.node_local, changed=changed)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)


def _services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]

    def port(node_port: int) -> list[builders.Port]:
        return [builders.Port("http", 80, 8080, node_port=node_port)]

    web = {"selector": {"app": "web"}}
    return [
        builders.service("web", "10.96.0.10", http, affinity_timeout=300, spec=web),
        builders.service("web-np", "10.96.0.11", port(30011), type="NodePort", spec=web),
        builders.service("web-lb", "10.96.0.12", port(30012), type="LoadBalancer", load_balancer_ips=["203.0.113.12"], spec=web),
        builders.service("web-ext", "10.96.0.13", http, external_ips=["198.51.100.13"], spec=web),
        builders.service("lweb-local", "10.96.0.14", port(30014), type="LoadBalancer", load_balancer_ips=["203.0.113.14"],
                        external_traffic_policy="Local", health_check_node_port=32014, spec={"selector": {"app": "lweb"}}),
        builders.service("lweb-itp", "10.96.0.15", http, internal_traffic_policy="Local", spec={"selector": {"app": "lweb"}}),
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


def _dual_stack_services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]
    v6 = {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}

    def dual(policy: str, ips: list[str], app: str, families: tuple[str, ...] = ("IPv4", "IPv6")) -> dict[str, object]:
        return {"ipFamilyPolicy": policy, "ipFamilies": list(families), "clusterIPs": ips, "selector": {"app": app}}

    def port(node_port: int) -> list[builders.Port]:
        return [builders.Port("http", 80, 8080, node_port=node_port)]

    return [
        builders.service("six", "fd00:10:96::10", http, affinity_timeout=600, spec={**v6, "selector": {"app": "six"}}),
        builders.service("six-lb", "fd00:10:96::11", port(30111), type="LoadBalancer", load_balancer_ips=["2001:db8:1::11"],
                        source_ranges=["2001:db8:2::/64"], external_ips=["2001:db8:3::11"],
                        spec={**v6, "selector": {"app": "six"}}),
        builders.service("prefer", "10.96.1.20", port(30120), type="NodePort",
                        spec=dual("PreferDualStack", ["10.96.1.20", "fd00:10:96::20"], "dual")),
        builders.service("prefer-six-first", "fd00:10:96::21", http,
                        spec=dual("PreferDualStack", ["fd00:10:96::21", "10.96.1.21"], "dual", ("IPv6", "IPv4"))),
        builders.service("require-lb", "10.96.1.22", port(30122), type="LoadBalancer",
                        load_balancer_ips=["203.0.113.22", "2001:db8:1::22"], external_traffic_policy="Local",
                        health_check_node_port=32122, spec=dual("RequireDualStack", ["10.96.1.22", "fd00:10:96::22"], "ldual")),
        builders.service("require-itp", "10.96.1.23", http, internal_traffic_policy="Local", affinity_timeout=60,
                        spec=dual("RequireDualStack", ["10.96.1.23", "fd00:10:96::23"], "ldual")),
    ]  # fmt: skip


def test_dual_stack_rules_equal_to_upstream_at_every_step(upstream_binaries: Path) -> None:
    both = ("IPv4", "IPv6")
    with SideBySide.build(upstream_binaries) as bed:
        selectors = {"six": "six", "six-lb": "six", "prefer": "dual", "prefer-six-first": "dual", "require-lb": "ldual",
                     "require-itp": "ldual"}  # fmt: skip
        families = {"six": ("IPv6",), "six-lb": ("IPv6",), "prefer": both, "prefer-six-first": both, "require-lb": both,
                    "require-itp": both}  # fmt: skip
        s = Scenario(bed, {}, selectors, families, node_local=("require-itp",))
        s.add("six-0", POD_HOST_NODE, "six")
        s.add_mirrored("six-1", "six")
        s.add("dual-0", POD_HOST_NODE, "dual")
        s.add("dual-1", POD_HOST_NODE, "dual")
        s.add_mirrored("ldual-0", "ldual")
        s.add("ldual-remote", POD_HOST_NODE, "ldual")
        bed.apply(*_dual_stack_services())
        bed.start_proxies()
        s.check("the first sync", both)

        s.add("six-2", POD_HOST_NODE, "six")
        s.check("an IPv6 pod added", ("IPv6",))
        s.add_mirrored("ldual-1", "ldual")
        s.check("a local dual-stack pod added on each node", both)

        bed.set_ready("dual-0", False)
        s.pods["dual-0"].ready = False
        s.check("a dual-stack pod turned not ready", both)

        for node in (UPSTREAM_NODE, OURS_NODE):
            bed.start_termination(f"ldual-0-{node}")
            s.pods[f"ldual-0-{node}"].terminating = True
        s.check("a local dual-stack pod terminating on each node", both)
        for node in (UPSTREAM_NODE, OURS_NODE):
            bed.finish_termination(f"ldual-0-{node}")
            del s.pods[f"ldual-0-{node}"]
        s.check("terminated pods gone", both)

        bed.delete("service", "six-lb")
        del s.selectors["six-lb"]
        s.check("an IPv6 LoadBalancer deleted", ("IPv6",))
        bed.delete("service", "require-lb")
        del s.selectors["require-lb"]
        s.check("a RequireDualStack LoadBalancer deleted", both)
