"""Upstream's kube-proxy (node-a) and ours (node-b) in nftables mode against upstream's control
plane, with packets as the oracle: our table's layout differs from upstream's by design, so after
every step of the scenario the equivalence probes (kubeproxy/lab/packet_equivalence.py: TCP and
UDP flows from a pod on the node, from the node and from an outside client, to every kind of
service address, and GETs of the health-check node port) must give the same outcomes on both
nodes: answered or not, which endpoints by role, and the source each endpoint saw."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.packet_equivalence import CLIENT_IPS, Outcome, Probe, ProbeBed, await_same_packets
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide

pytestmark = pytest.mark.root

Expected = dict[str, set[tuple[str, bool, bool, bool]]]

# The LoadBalancer with source ranges admits each proxy node's client by its first address only.
SOURCE_RANGES = [f"{first}/32" for first, _ in CLIENT_IPS.values()]
WEB_LB, WEB_LB_RANGES, LWEB_LB, WEB_EXTERNAL = "203.0.113.24", "203.0.113.25", "203.0.113.27", "198.51.100.26"
# The probes whose endpoints must be exactly the Service's ready pods once a node took the change in.
WITNESSES = {"pod → web ClusterIP tcp": "web", "pod → lweb ClusterIP tcp": "lweb"}


def _services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]
    web = {"selector": {"app": "web"}}
    lweb = {"selector": {"app": "lweb"}}
    return [
        builders.service("web", "10.96.0.20", [*http, builders.Port("dns", 53, 8080, "UDP")], spec=web),
        builders.service("web-aff", "10.96.0.21", http, affinity_timeout=300, spec=web),
        builders.service("web-np", "10.96.0.22", [builders.Port("http", 80, 8080, node_port=30022),
                        builders.Port("dns", 53, 8080, "UDP", node_port=30023)], type="NodePort", spec=web),
        builders.service("web-lb", "10.96.0.24", [builders.Port("http", 80, 8080, node_port=30024)], type="LoadBalancer",
                        load_balancer_ips=[WEB_LB], spec=web),
        builders.service("web-lbsr", "10.96.0.25", [builders.Port("http", 80, 8080, node_port=30025)], type="LoadBalancer",
                        load_balancer_ips=[WEB_LB_RANGES], source_ranges=SOURCE_RANGES, spec=web),
        builders.service("web-ext", "10.96.0.26", http, external_ips=[WEB_EXTERNAL], spec=web),
        builders.service("lweb-local", "10.96.0.27", [builders.Port("http", 80, 8080, node_port=30027)], type="LoadBalancer",
                        load_balancer_ips=[LWEB_LB], external_traffic_policy="Local", health_check_node_port=32027,
                        spec=lweb),
        builders.service("lweb-itp", "10.96.0.28", http, internal_traffic_policy="Local", spec=lweb),
        builders.service("lweb", "10.96.0.29", http, spec=lweb),
        # The client pods' own Service, node-local: a pod reaching itself through it (hairpin).
        builders.service("cli-itp", "10.96.0.30", http, internal_traffic_policy="Local", spec={"selector": {"app": "cli"}}),
    ]  # fmt: skip


def _probes() -> list[Probe]:
    both = [
        ("web ClusterIP tcp", "tcp", "10.96.0.20:80"),
        ("web ClusterIP udp", "udp", "10.96.0.20:53"),
        ("web NodePort tcp", "tcp", "{node}:30022"),
        ("web NodePort udp", "udp", "{node}:30023"),
        ("web NodePort on the second address", "tcp", "{node2}:30022"),
        ("web LoadBalancer IP", "tcp", f"{WEB_LB}:80"),
        ("web LoadBalancer IP with source ranges", "tcp", f"{WEB_LB_RANGES}:80"),
        ("web external IP", "tcp", f"{WEB_EXTERNAL}:80"),
        ("lweb eTP=Local LoadBalancer IP", "tcp", f"{LWEB_LB}:80"),
        ("lweb eTP=Local NodePort", "tcp", "{node}:30027"),
        ("lweb eTP=Local health check", "http", "{node}:32027"),
    ]
    inside = [
        ("web affinity ClusterIP", "tcp", "10.96.0.21:80"),
        ("lweb iTP=Local ClusterIP", "tcp", "10.96.0.28:80"),
        ("lweb ClusterIP tcp", "tcp", "10.96.0.29:80"),
        ("the client pod's own iTP=Local ClusterIP", "tcp", "10.96.0.30:80"),
    ]
    out = [Probe(f"{origin} → {name}", origin, proto, dst, affinity="affinity" in name)
           for origin in ("pod", "node") for name, proto, dst in both + inside]  # fmt: skip
    out += [Probe(f"client → {name}", "client", proto, dst) for name, proto, dst in both]
    out += [
        Probe("node → web NodePort on 127.0.0.1", "node", "tcp", "127.0.0.1:30022"),
        Probe("node → lweb eTP=Local NodePort on 127.0.0.1", "node", "tcp", "127.0.0.1:30027"),
        Probe("client-2 → web LoadBalancer IP with source ranges", "client", "tcp", f"{WEB_LB_RANGES}:80", second_source=True),
        Probe("client-2 → web-lbsr NodePort", "client", "tcp", "{node}:30025", second_source=True),
        Probe("client-2 → web LoadBalancer IP", "client", "tcp", f"{WEB_LB}:80", second_source=True),
    ]
    return out


@dataclass
class PodState:
    ip: str
    app: str
    ready: bool = True
    terminating: bool = False


@dataclass
class Scenario:
    probes: ProbeBed
    pods: dict[str, PodState]
    selectors: dict[str, str]  # Service name -> the app its selector picks
    probe_set: list[Probe]
    steps: int = 0

    def add(self, name: str, node: str, app: str) -> None:
        pod = self.probes.add_pod(name, node, {"app": app})
        self.pods[name] = PodState(pod.info.ips[0], app)

    def add_mirrored(self, base: str, app: str) -> None:
        for node in (UPSTREAM_NODE, OURS_NODE):
            self.add(f"{base}-{node}", node, app)

    def set_ready(self, names: list[str], ready: bool) -> None:
        for name in names:
            self.probes.bed.set_ready(name, ready)
            self.pods[name].ready = ready

    def terminate(self, names: list[str]) -> None:
        for name in names:
            self.probes.bed.start_termination(name)
            self.pods[name].terminating = True

    def finish(self, names: list[str]) -> None:
        for name in names:
            self.probes.bed.finish_termination(name)
            del self.pods[name]

    def expected(self) -> Expected:
        return {
            service: {(p.ip, p.ready and not p.terminating, p.ready, p.terminating) for p in self.pods.values() if p.app == app}
            for service, app in self.selectors.items()
        }

    def fresh(self, node: str, got: Mapping[str, Outcome]) -> bool:
        for probe, app in WITNESSES.items():
            ready = {self.probes.role(p.ip, node) for p in self.pods.values() if p.app == app and p.ready and not p.terminating}
            if set(got[probe].endpoints) != ready:
                return False
        return True

    def check(self, step: str) -> None:
        got, diffs = await_same_packets(self.probes, self.probe_set, self.expected(), self.fresh)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)
        print(f"after {step}:", *(f"  {name}: {outcome}" for name, outcome in got.items()), sep="\n")
        self.steps += 1


# Eleven steps of 46 probes on both nodes: 3-5 minutes on two shared cores, more than the suite's default bound.
@pytest.mark.timeout(1200)
def test_nftables_packets_same_as_upstream_at_every_step(upstream_binaries: Path) -> None:
    with SideBySide.build(upstream_binaries, mode="nftables") as bed, ProbeBed.attach(bed) as probes:
        selectors = {s["metadata"]["name"]: s["spec"]["selector"]["app"] for s in _services()}
        s = Scenario(probes, {}, selectors, _probes())
        s.pods.update({name: PodState(pod.info.ips[0], "cli") for name, pod in bed.pods.items()})
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

        s.set_ready(["web-0"], False)
        s.check("a pod turned not ready")
        s.terminate(["web-1"])
        s.check("a pod terminating")
        s.terminate([f"lweb-0-{node}" for node in (UPSTREAM_NODE, OURS_NODE)])
        s.check("a local pod terminating on each node")
        s.set_ready([f"lweb-1-{node}" for node in (UPSTREAM_NODE, OURS_NODE)], False)
        s.check("the only local pods left serving are terminating")

        s.finish(["web-1", *(f"lweb-0-{node}" for node in (UPSTREAM_NODE, OURS_NODE))])
        s.check("terminated pods gone: no local endpoint serves")
        s.set_ready(["web-0", *(f"lweb-1-{node}" for node in (UPSTREAM_NODE, OURS_NODE))], True)
        s.check("pods ready again")

        bed.delete("service", "web-ext")
        del s.selectors["web-ext"]
        s.check("a Service deleted")
        bed.delete("service", "lweb-local")
        del s.selectors["lweb-local"]
        s.check("the Local LoadBalancer deleted")
        assert len({p.name for p in s.probe_set}) == len(s.probe_set), "probe names are unique"
        print(f"same packets as upstream: {len(s.probe_set)} probes × {s.steps} steps = {len(s.probe_set) * s.steps}")
