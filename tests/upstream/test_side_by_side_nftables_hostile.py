"""The hostile but valid objects (tests/upstream/hostile_objects.py) given to upstream's kube-proxy
(node-a) and ours (node-b) in nftables mode, with packets as the oracle: after each object, the
equivalence probes (kubeproxy/lab/packet_equivalence.py) from a pod to the ordinary Services,
over both families, and to every address of the new object's own Services that select the web
pods, give the same outcomes on both nodes; at the end every probe runs once more (the ordinary
Services from the pod, the node and the client, every object's), so an object that broke another
Service later shows too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from kubeproxy.lab.control_plane import ControlPlaneError
from kubeproxy.lab.packet_equivalence import Outcome, Probe, ProbeBed, await_same_packets, service_probes
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide
from tests.upstream.hostile_objects import FAMILIES, JSON, WEB, hostiles, port, service

pytestmark = pytest.mark.root

WITNESS = "pod → web ClusterIP tcp"


def _ordinary() -> list[JSON]:
    return [
        service("web", [port("http", 80, nodePort=30040)], type="NodePort", clusterIP="10.96.0.40"),
        service("web-dual", [port("http", 80)], ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv6", "IPv4"],
                clusterIP="fd00:10:96::41", clusterIPs=["fd00:10:96::41", "10.96.0.41"]),
    ]  # fmt: skip


def _ordinary_probes() -> list[Probe]:
    out = [Probe(WITNESS, "pod", "tcp", "10.96.0.40:80")]
    out += [Probe(f"{origin} → web ClusterIP tcp", origin, "tcp", "10.96.0.40:80") for origin in ("node", "client")]
    out += [Probe(f"{origin} → web NodePort", origin, "tcp", "{node}:30040") for origin in ("pod", "node", "client")]
    out += [Probe(f"{origin} → web-dual ClusterIP{suffix}", origin, "tcp", dst)
            for origin in ("pod", "node", "client")
            for suffix, dst in (("", "10.96.0.41:80"), (" (IPv6)", "[fd00:10:96::41]:80"))]  # fmt: skip
    return out


@dataclass
class Run:
    probes: ProbeBed
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (IPv4, IPv6)
    selecting: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"web": ("IPv4",), "web-dual": FAMILIES})
    probed: int = 0

    def add_pod(self, name: str, node: str) -> None:
        ips = self.probes.add_pod(name, node, WEB).info.ips
        self.pods[name] = (ips[0], ips[1])

    def fresh(self, node: str, got: Mapping[str, Outcome]) -> bool:
        return set(got[WITNESS].endpoints) == {self.probes.role(ips[0], node) for ips in self.pods.values()}

    def check(self, step: str, probe_set: list[Probe], changed: tuple[str, ...]) -> None:
        expected = {
            svc: {(ips[FAMILIES.index(f)], True, True, False) for ips in self.pods.values() for f in families}
            for svc, families in self.selecting.items()
        }
        got, diffs = await_same_packets(self.probes, probe_set, expected, self.fresh, families=changed)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)
        print(f"after {step}:", *(f"  {name}: {outcome}" for name, outcome in got.items()), sep="\n")
        self.probed += len(probe_set)


def _applied(bed: SideBySide, objs: list[JSON]) -> str:
    """'' when the API server took every object, else its refusal."""
    try:
        bed.apply(*objs)
    except ControlPlaneError as refused:
        return str(refused)
    return ""


def _as_served(bed: SideBySide, name: str) -> JSON:
    answer = bed.cp.api.get(f"/api/v1/namespaces/default/services/{name}")
    assert answer.status_code == 200, f"GET Service {name}: {answer.status_code} {answer.text[:300]}"
    served: JSON = answer.json()
    return served


# 17 objects and their probes, then all of them: minutes on two shared cores.
@pytest.mark.timeout(1500)
def test_hostile_objects_same_packets_as_upstream_in_nftables_mode(side_by_side: SideBySide) -> None:
    refusals: dict[str, str] = {}
    bed = side_by_side
    bed.mode = "nftables"
    with ProbeBed.attach(bed) as probes:
        run = Run(probes)
        run.add_pod("web-0-remote", POD_HOST_NODE)
        for node in (UPSTREAM_NODE, OURS_NODE):
            run.add_pod(f"web-1-{node}", node)
        bed.apply(*_ordinary())
        bed.start_proxies()
        ordinary = _ordinary_probes()
        run.check("the first sync", ordinary, FAMILIES)
        # Between the first sync and the last step, which probe everything, the ordinary Services from a pod.
        each_step = [p for p in ordinary if p.origin == "pod"]
        every: list[Probe] = []
        for hostile in hostiles():
            refusal = _applied(bed, hostile.objects)
            if refusal:
                refusals[hostile.what] = refusal
                continue
            run.selecting.update(hostile.selecting)
            own = [p for name in hostile.selecting for p in service_probes(_as_served(bed, name))]
            every += own
            run.check(hostile.what, each_step + own, tuple(hostile.touched))
        for node in (UPSTREAM_NODE, OURS_NODE):
            run.add_pod(f"web-2-{node}", node)
        run.check("web pods added after every hostile object", ordinary + every, FAMILIES)
        assert len({p.name for p in ordinary + every}) == len(ordinary + every), "probe names are unique"
        assert len(every) >= 20, [p.name for p in every]  # the objects' own addresses were probed
        print(f"same packets as upstream over hostile objects: {run.probed} probes")
    assert refusals == {}, refusals
