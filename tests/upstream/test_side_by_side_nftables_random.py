"""Upstream's kube-proxy (node-a) and ours (node-b) in nftables mode on random clusters
(tests/upstream/random_cluster.py), with packets as the oracle: after the first sync and after
every step of the churn, the equivalence probes (kubeproxy/lab/packet_equivalence.py) to every
address of every Service (its ClusterIPs from a pod, its external and LoadBalancer IPs and
NodePorts from the client, both families) give the same outcomes on both nodes. Every pod is
real here, answering TCP and UDP on its container ports."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from kubeproxy.lab.packet_equivalence import Outcome, Probe, ProbeBed, await_same_packets, service_probes
from kubeproxy.lab.side_by_side import SideBySide
from tests.upstream.random_cluster import FAMILIES, Model

pytestmark = pytest.mark.root

SEEDS = (1,)
CHURN_STEPS = 8


@dataclass
class Oracle:
    model: Model
    probes: ProbeBed
    probed: int = 0

    def probe_set(self) -> list[Probe]:
        out: list[Probe] = []
        for name in sorted(self.model.services):
            if self.model.families(name):
                answer = self.model.bed.cp.api.get(f"/api/v1/namespaces/default/services/{name}")
                assert answer.status_code == 200, f"GET Service {name}: {answer.status_code} {answer.text[:300]}"
                out += service_probes(answer.json())
        return out

    def witnesses(self) -> dict[str, tuple[str, int]]:
        """The TCP ClusterIP probes of Services whose every client reaches every serving endpoint
        (no affinity, internalTrafficPolicy Cluster): probe name -> (app, family index)."""
        out: dict[str, tuple[str, int]] = {}
        for name, svc in self.model.services.items():
            spec, app = svc["spec"], self.model.app_of(name)
            if not self.model.families(name) or app is None or spec.get("sessionAffinity") or spec.get("internalTrafficPolicy"):
                continue
            if spec["ports"][0]["protocol"] != "TCP":
                continue
            answer = self.model.bed.cp.api.get(f"/api/v1/namespaces/default/services/{name}")
            for ip in answer.json()["spec"].get("clusterIPs", []):
                out[f"pod → {name} ClusterIP {ip}"] = (app, 1 if ":" in ip else 0)
        return out

    def check(self, step: str, changed: set[str]) -> None:
        witnesses = self.witnesses()

        def fresh(node: str, got: Mapping[str, Outcome]) -> bool:
            for probe, (app, index) in witnesses.items():
                serving = {self.probes.role(ips[index], node) for g in self.model.groups.values()
                           if g.app == app and g.ready and not g.terminating for ips in g.ips.values()}  # fmt: skip
                if serving and probe in got and set(got[probe].endpoints) != serving:
                    return False
            return True

        probe_set = self.probe_set()
        families = tuple(f for f in FAMILIES if f in changed)
        got, diffs = await_same_packets(self.probes, probe_set, self.model.expected(), fresh, families=families)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)
        print(f"after {step}:", *(f"  {name}: {outcome}" for name, outcome in got.items()), sep="\n")
        self.probed += len(probe_set)


# The first sync and the churn, each step with tens of probes on both nodes: minutes on two shared cores.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_cluster_same_packets_as_upstream_in_nftables_mode(side_by_side: SideBySide, seed: int) -> None:
    bed = side_by_side
    bed.mode = "nftables"
    with ProbeBed.attach(bed) as probes:
        model = Model(random.Random(seed), bed, add_pod=probes.add_pod)
        oracle = Oracle(model, probes)
        model.populate()
        bed.start_proxies()
        oracle.check(f"seed {seed}: the first sync", set(FAMILIES))
        for step in range(CHURN_STEPS):
            what, touched = model.churn()
            oracle.check(f"seed {seed} step {step}: {what}", touched)
        assert oracle.probed >= 100, oracle.probed  # the Services' addresses were probed, not an empty set
        print(f"same packets as upstream: {oracle.probed} probes over {CHURN_STEPS + 1} steps")
