"""Upstream's kube-proxy (node-a) and ours (node-b) in nftables mode against upstream's control
plane, with packets as the oracle: our table's layout differs from upstream's by design, so after
every step of the scenario the equivalence probes (kubeproxy/lab/packet_equivalence.py: TCP and
UDP flows from a pod on the node, from the node and from an outside client, to every kind of
service address, and GETs of the health-check node port) must give the same outcomes on both
nodes: answered or not, which endpoints by role, and the source each endpoint saw. The Services
are RequireDualStack and every probe that has an IPv6 twin (all but the 127.0.0.1 NodePorts) runs
over IPv6 too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.packet_equivalence import CLIENT_IPS, CLIENT_IPS6, Outcome, Probe, ProbeBed, await_same_packets
from kubeproxy.lab.side_by_side import SideBySide
from kubeproxy.lab.side_by_side_walk import FAMILIES, STEPS, PodState, Walk, walk

pytestmark = pytest.mark.root


# The LoadBalancer with source ranges admits each proxy node's client by its first address only.
SOURCE_RANGES = [f"{first}/32" for first, _ in CLIENT_IPS.values()] + [f"{first}/128" for first, _ in CLIENT_IPS6.values()]
WEB_LB, WEB_LB_RANGES, LWEB_LB, WEB_EXTERNAL = "203.0.113.24", "203.0.113.25", "203.0.113.27", "198.51.100.26"
WEB_LB6, WEB_LB_RANGES6, LWEB_LB6, WEB_EXTERNAL6 = "2001:db8:1::24", "2001:db8:1::25", "2001:db8:1::27", "2001:db8:2::26"
# The probes whose endpoints must be exactly the Service's ready pods once a node took the change in.
WITNESSES = {"pod → web ClusterIP tcp": "web", "pod → lweb ClusterIP tcp": "lweb",
             "pod → web ClusterIP tcp (IPv6)": "web", "pod → lweb ClusterIP tcp (IPv6)": "lweb"}  # fmt: skip


def _services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]

    def dual(app: str, ip: str) -> dict[str, object]:
        v6 = "fd00:10:96::" + ip.rsplit(".", 1)[1]
        return {"selector": {"app": app}, "ipFamilyPolicy": "RequireDualStack", "ipFamilies": list(FAMILIES),
                "clusterIPs": [ip, v6]}  # fmt: skip

    return [
        builders.service("web", "10.96.0.20", [*http, builders.Port("dns", 53, 8080, "UDP")], spec=dual("web", "10.96.0.20")),
        builders.service("web-aff", "10.96.0.21", http, affinity_timeout=300, spec=dual("web", "10.96.0.21")),
        builders.service("web-np", "10.96.0.22", [builders.Port("http", 80, 8080, node_port=30022),
                        builders.Port("dns", 53, 8080, "UDP", node_port=30023)], type="NodePort",
                        spec=dual("web", "10.96.0.22")),
        builders.service("web-lb", "10.96.0.24", [builders.Port("http", 80, 8080, node_port=30024)], type="LoadBalancer",
                        load_balancer_ips=[WEB_LB, WEB_LB6], spec=dual("web", "10.96.0.24")),
        builders.service("web-lbsr", "10.96.0.25", [builders.Port("http", 80, 8080, node_port=30025)], type="LoadBalancer",
                        load_balancer_ips=[WEB_LB_RANGES, WEB_LB_RANGES6], source_ranges=SOURCE_RANGES,
                        spec=dual("web", "10.96.0.25")),
        builders.service("web-ext", "10.96.0.26", http, external_ips=[WEB_EXTERNAL, WEB_EXTERNAL6],
                        spec=dual("web", "10.96.0.26")),
        builders.service("lweb-local", "10.96.0.27", [builders.Port("http", 80, 8080, node_port=30027)], type="LoadBalancer",
                        load_balancer_ips=[LWEB_LB, LWEB_LB6], external_traffic_policy="Local", health_check_node_port=32027,
                        spec=dual("lweb", "10.96.0.27")),
        builders.service("lweb-itp", "10.96.0.28", http, internal_traffic_policy="Local", spec=dual("lweb", "10.96.0.28")),
        builders.service("lweb", "10.96.0.29", http, spec=dual("lweb", "10.96.0.29")),
        # The client pods' own Service, node-local: a pod reaching itself through it (hairpin).
        builders.service("cli-itp", "10.96.0.30", http, internal_traffic_policy="Local", spec=dual("cli", "10.96.0.30")),
    ]  # fmt: skip


def _probes() -> list[Probe]:
    # (name, protocol, IPv4 destination, its IPv6 twin)
    both = [
        ("web ClusterIP tcp", "tcp", "10.96.0.20:80", "[fd00:10:96::20]:80"),
        ("web ClusterIP udp", "udp", "10.96.0.20:53", "[fd00:10:96::20]:53"),
        ("web NodePort tcp", "tcp", "{node}:30022", "[{node6}]:30022"),
        ("web NodePort udp", "udp", "{node}:30023", "[{node6}]:30023"),
        ("web NodePort on the second address", "tcp", "{node2}:30022", "[{node6_2}]:30022"),
        ("web LoadBalancer IP", "tcp", f"{WEB_LB}:80", f"[{WEB_LB6}]:80"),
        ("web LoadBalancer IP with source ranges", "tcp", f"{WEB_LB_RANGES}:80", f"[{WEB_LB_RANGES6}]:80"),
        ("web external IP", "tcp", f"{WEB_EXTERNAL}:80", f"[{WEB_EXTERNAL6}]:80"),
        ("lweb eTP=Local LoadBalancer IP", "tcp", f"{LWEB_LB}:80", f"[{LWEB_LB6}]:80"),
        ("lweb eTP=Local NodePort", "tcp", "{node}:30027", "[{node6}]:30027"),
        ("lweb eTP=Local health check", "http", "{node}:32027", "[{node6}]:32027"),
    ]
    inside = [
        ("web affinity ClusterIP", "tcp", "10.96.0.21:80", "[fd00:10:96::21]:80"),
        ("lweb iTP=Local ClusterIP", "tcp", "10.96.0.28:80", "[fd00:10:96::28]:80"),
        ("lweb ClusterIP tcp", "tcp", "10.96.0.29:80", "[fd00:10:96::29]:80"),
        ("the client pod's own iTP=Local ClusterIP", "tcp", "10.96.0.30:80", "[fd00:10:96::30]:80"),
    ]
    second = [
        ("web LoadBalancer IP with source ranges", "tcp", f"{WEB_LB_RANGES}:80", f"[{WEB_LB_RANGES6}]:80"),
        ("web-lbsr NodePort", "tcp", "{node}:30025", "[{node6}]:30025"),
        ("web LoadBalancer IP", "tcp", f"{WEB_LB}:80", f"[{WEB_LB6}]:80"),
    ]
    out = [
        Probe("node → web NodePort on 127.0.0.1", "node", "tcp", "127.0.0.1:30022"),
        Probe("node → lweb eTP=Local NodePort on 127.0.0.1", "node", "tcp", "127.0.0.1:30027"),
    ]
    for suffix, pick in (("", 2), (" (IPv6)", 3)):
        out += [Probe(f"{origin} → {p[0]}{suffix}", origin, p[1], p[pick], affinity="affinity" in p[0])
                for origin in ("pod", "node") for p in both + inside]  # fmt: skip
        out += [Probe(f"client → {p[0]}{suffix}", "client", p[1], p[pick]) for p in both]
        out += [Probe(f"client-2 → {p[0]}{suffix}", "client", p[1], p[pick], second_source=True) for p in second]
    return out


@dataclass
class Oracle:
    """The same packets on both nodes after a step, the witnesses showing the step taken in."""

    w: Walk
    probes: ProbeBed
    probe_set: list[Probe]
    steps: int = 0

    def fresh(self, node: str, got: Mapping[str, Outcome]) -> bool:
        return all(
            set(got[probe].endpoints) == {self.probes.role(p.ips[0], node) for p in self.w.serving(app)}
            for probe, app in WITNESSES.items()
        )

    def check(self, step: str) -> None:
        got, diffs = await_same_packets(self.probes, self.probe_set, self.w.expected(), self.fresh, families=FAMILIES)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)
        print(f"after {step}:", *(f"  {name}: {outcome}" for name, outcome in got.items()), sep="\n")
        self.steps += 1


# Eleven steps of 90 probes on both nodes: minutes on two shared cores, more than the suite's default bound.
@pytest.mark.timeout(1200)
def test_nftables_packets_same_as_upstream_at_every_step(side_by_side: SideBySide) -> None:
    bed = side_by_side
    bed.mode = "nftables"
    with ProbeBed.attach(bed) as probes:
        w = Walk.of(bed, _services(), probes.add_pod)
        w.pods.update({name: PodState(pod.info.ips, "cli") for name, pod in bed.pods.items()})
        oracle = Oracle(w, probes, _probes())
        walk(w, _services(), oracle.check)
        assert oracle.steps == len(STEPS)
        assert len({p.name for p in oracle.probe_set}) == len(oracle.probe_set), "probe names are unique"
        print(f"same packets as upstream: {len(oracle.probe_set)} probes × {oracle.steps} steps = "
              f"{len(oracle.probe_set) * oracle.steps}")  # fmt: skip
