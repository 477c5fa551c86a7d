"""Random clusters for the side-by-side tests (test_side_by_side_random.py in iptables mode,
test_side_by_side_nftables_random.py in nftables mode): a seeded generator of Services of every
type and option (IP family policies, affinity, traffic policies, source ranges, externalIPs,
several ports, named target ports, TCP/UDP/SCTP) over pods on the proxies' nodes and a third, and
a seeded churn of adds, moves between nodes, readiness flips, terminations and deletions. Pods on
the proxies' nodes come in mirrored pairs, one on each, so the two nodes stay comparable with
each node's own endpoints named by role."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, BedPod, SideBySide

FAMILIES = ("IPv4", "IPv6")
APPS = ("a0", "a1", "a2", "a3", "a4")
# (port name, number, protocol) as every bed pod declares them (side_by_side.POD_PORTS)
TARGETS = (("http", 8080, "TCP"), ("dns", 5353, "UDP"), ("sctp", 9132, "SCTP"))
EXTERNAL = {"IPv4": ("198.51.100.{}", "203.0.113.{}"), "IPv6": ("2001:db8:e::{:x}", "2001:db8:f::{:x}")}
SOURCE_RANGES = {"IPv4": ("203.0.113.0/25", "192.0.2.0/24"), "IPv6": ("2001:db8:5::/64",)}

Endpoint = tuple[str, bool, bool, bool]


@dataclass
class Group:
    """One pod on node-c, or a mirrored pair on node-a and node-b."""

    app: str
    mirrored: bool
    ips: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod name -> (IPv4, IPv6)
    ready: bool = True
    terminating: bool = False


@dataclass
class Model:
    rng: random.Random
    bed: SideBySide
    # How a pod is made (default: known to the API only, for an oracle that needs no packets).
    add_pod: Callable[[str, str, Mapping[str, str]], BedPod] | None = None
    groups: dict[str, Group] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    count: int = 0

    # ---- what the cluster should hold ------------------------------------------------------

    def families(self, name: str) -> tuple[str, ...]:
        spec = self.services[name]["spec"]
        if spec.get("type") == "ExternalName" or spec.get("clusterIP") == "None":
            return ()
        return tuple(spec["ipFamilies"])

    def app_of(self, name: str) -> str | None:
        app: str | None = self.services[name]["spec"].get("selector", {}).get("app")
        return app

    def expected(self) -> dict[str, set[Endpoint]]:
        out: dict[str, set[Endpoint]] = {}
        for name in self.services:
            if not self.families(name):
                continue
            out[name] = {
                (ips[FAMILIES.index(f)], g.ready and not g.terminating, g.ready, g.terminating)
                for g in self.groups.values()
                if g.app == self.app_of(name)
                for ips in g.ips.values()
                for f in self.families(name)
            }
        return out

    def node_local(self) -> list[str]:
        """Services whose every path picks local endpoints only (internalTrafficPolicy Local and
        no external path of policy Cluster)."""
        out = []
        for name, svc in self.services.items():
            spec = svc["spec"]
            external = spec["type"] in ("NodePort", "LoadBalancer") or bool(spec.get("externalIPs"))
            if spec.get("internalTrafficPolicy") == "Local" and (not external or spec.get("externalTrafficPolicy") == "Local"):
                out.append(name)
        return out

    def touched_by_app(self, app: str) -> set[str]:
        return {f for name in self.services if self.app_of(name) == app for f in self.families(name)}

    # ---- generating ------------------------------------------------------------------------

    def new_group(self, app: str, mirrored: bool) -> str:
        self.count += 1
        base = f"{app}-{self.count}"
        group = Group(app, mirrored)
        nodes = [(f"{base}-{n}", n) for n in (UPSTREAM_NODE, OURS_NODE)] if mirrored else [(f"{base}-remote", POD_HOST_NODE)]
        for pod_name, node in nodes:
            labels = {"app": app}
            pod = self.add_pod(pod_name, node, labels) if self.add_pod else self.bed.add_pod(pod_name, node, labels, wired=False)
            group.ips[pod_name] = pod.info.ips
        self.groups[base] = group
        return base

    def populate(self, groups: int = 8, services: int = 12) -> None:
        """The starting cluster: `groups` groups of pods, then `services` Services, all applied."""
        for _ in range(groups):
            self.new_group(self.rng.choice(APPS), self.rng.random() < 0.5)
        for _ in range(services):
            self.new_service()
        self.bed.apply(*self.services.values())

    def remove_group(self, base: str) -> None:
        for pod_name in self.groups.pop(base).ips:
            self.bed.finish_termination(pod_name)

    def new_service(self) -> str:
        rng = self.rng
        self.count += 1
        name = f"svc-{self.count}"
        kind = rng.choice(("ClusterIP", "ClusterIP", "NodePort", "LoadBalancer", "LoadBalancer", "ExternalName", "Headless"))
        policy = rng.choice(("v4", "v4", "v6", "prefer", "require", "require6"))
        families = {"v4": ["IPv4"], "v6": ["IPv6"], "prefer": ["IPv4", "IPv6"], "require": ["IPv4", "IPv6"],
                    "require6": ["IPv6", "IPv4"]}[policy]  # fmt: skip
        ports = []
        for index, (port_name, number, protocol) in enumerate(rng.sample(TARGETS, rng.randint(1, 3))):
            named = rng.random() < 0.5
            ports.append({"name": f"p{index}", "protocol": protocol, "port": rng.choice((80, 53, 443, 65533)) + index,
                          "targetPort": port_name if named else number})  # fmt: skip
        if rng.random() < 0.15:  # one unnamed port
            ports = ports[:1]
            del ports[0]["name"]
        spec: dict[str, Any] = {"type": kind, "ports": ports, "selector": {"app": rng.choice(APPS)}}
        if kind == "ExternalName":
            spec = {"type": kind, "externalName": f"{name}.example.com", "ports": ports}
        elif kind == "Headless":
            spec.update(type="ClusterIP", clusterIP="None")
        else:
            spec["ipFamilies"] = families
            spec["ipFamilyPolicy"] = {"v4": "SingleStack", "v6": "SingleStack", "prefer": "PreferDualStack"}.get(
                policy, "RequireDualStack"
            )
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}
        if kind in ("ExternalName", "Headless"):
            self.services[name] = obj
            return name
        if rng.random() < 0.3:
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": rng.choice((1, 60, 10800, 86400))}}
        if rng.random() < 0.3:
            spec["internalTrafficPolicy"] = "Local"
        if rng.random() < 0.3:
            spec["externalIPs"] = [rng.choice(EXTERNAL[f]).format(self.count) for f in families]
        if rng.random() < 0.2:
            spec["trafficDistribution"] = "PreferClose"
        if kind in ("NodePort", "LoadBalancer") and rng.random() < 0.4:
            spec["externalTrafficPolicy"] = "Local"
        if kind == "LoadBalancer":
            if rng.random() < 0.4:
                spec["loadBalancerSourceRanges"] = [r for f in families for r in SOURCE_RANGES[f][: rng.randint(1, 2)]]
            if rng.random() < 0.2:
                spec["allocateLoadBalancerNodePorts"] = False
            ingress: list[dict[str, Any]] = [{"ip": EXTERNAL[f][1].format(0x80 + self.count)} for f in families]
            if rng.random() < 0.2:
                ingress[0]["ipMode"] = "Proxy"
            obj["status"] = {"loadBalancer": {"ingress": ingress}}
        self.services[name] = obj
        return name

    # ---- stepping --------------------------------------------------------------------------

    def churn(self) -> tuple[str, set[str]]:
        """One random change through the API: what it was and the IP families it touched."""
        rng = self.rng
        live = [b for b, g in self.groups.items() if not g.terminating]
        terminating = [b for b, g in self.groups.items() if g.terminating]
        action = rng.choice(("add pods", "move", "ready flip", "terminate", "finish", "add service", "delete service"))
        if action == "add pods" or not live:
            base = self.new_group(rng.choice(APPS), rng.random() < 0.5)
            return f"pods {base} added", self.touched_by_app(self.groups[base].app)
        if action == "move":
            old = rng.choice(live)
            group = self.groups[old]
            self.remove_group(old)
            new = self.new_group(group.app, not group.mirrored)
            return f"pods {old} moved to {new}", self.touched_by_app(group.app)
        if action == "ready flip":
            base = rng.choice(live)
            group = self.groups[base]
            group.ready = not group.ready
            for pod_name in group.ips:
                self.bed.set_ready(pod_name, group.ready)
            return f"pods {base} ready={group.ready}", self.touched_by_app(group.app)
        if action == "terminate" or (action == "finish" and not terminating):
            base = rng.choice(live)
            self.groups[base].terminating = True
            for pod_name in self.groups[base].ips:
                self.bed.start_termination(pod_name)
            return f"pods {base} terminating", self.touched_by_app(self.groups[base].app)
        if action == "finish":
            base = rng.choice(terminating)
            app = self.groups[base].app
            self.remove_group(base)
            return f"pods {base} gone", self.touched_by_app(app)
        if action == "delete service" and self.services:
            name = rng.choice(sorted(self.services))
            touched = set(self.families(name))
            del self.services[name]
            self.bed.delete("service", name)
            return f"Service {name} deleted", touched
        name = self.new_service()
        self.bed.apply(self.services[name])
        return f"Service {name} added: {self.services[name]['spec']}", set(self.families(name))
