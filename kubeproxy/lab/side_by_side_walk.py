"""The e2e scenario walked side by side (lab/side_by_side.py: upstream's kube-proxy on node-a, ours
on node-b), one walk for every mode; each mode brings its own oracle, run after every step
(`iptables-save` equal, or the same packets).

The Services are the caller's, with two apps: `web` (pods on node-c) and `lweb` (pods mirrored
on both proxy nodes and one on node-c), and two of them named `web-ext` and `lweb-local`, deleted
at the end. The steps add pods, flip readiness, terminate pods (the Local Services' last serving
endpoints among them) and delete Services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, BedPod, SideBySide

FAMILIES = ("IPv4", "IPv6")
Expected = dict[str, set[tuple[str, bool, bool, bool]]]
STEPS = (
    "the first sync",
    "a pod added",
    "a local pod added on each node",
    "a pod turned not ready",
    "a pod terminating",
    "a local pod terminating on each node",
    "the only local pods left serving are terminating",
    "terminated pods gone: no local endpoint serves",
    "pods ready again",
    "a Service deleted",
    "the Local LoadBalancer deleted",
)
_MIRRORED = tuple(f"-{node}" for node in (UPSTREAM_NODE, OURS_NODE))


@dataclass
class PodState:
    ips: tuple[str, ...]  # IPv4, IPv6
    app: str
    ready: bool = True
    terminating: bool = False


@dataclass
class Walk:
    """The pods and Services the walk has made, as the EndpointSlices should show them."""

    bed: SideBySide
    selectors: dict[str, str]  # Service name -> the app its selector picks
    families: dict[str, tuple[str, ...]]  # Service name -> its ipFamilies
    add_pod: Callable[[str, str, Mapping[str, str]], BedPod]
    pods: dict[str, PodState] = field(default_factory=dict)

    @classmethod
    def of(cls, bed: SideBySide, services: Sequence[dict[str, Any]],
           add_pod: Callable[[str, str, Mapping[str, str]], BedPod] | None = None) -> Walk:  # fmt: skip
        """A walk over `services`; `add_pod` (default: the bed's) makes each pod."""
        selectors = {s["metadata"]["name"]: s["spec"]["selector"]["app"] for s in services}
        families = {s["metadata"]["name"]: tuple(s["spec"].get("ipFamilies", ("IPv4",))) for s in services}
        return cls(bed, selectors, families, add_pod or bed.add_pod)

    def add(self, name: str, node: str, app: str) -> None:
        self.pods[name] = PodState(self.add_pod(name, node, {"app": app}).info.ips, app)

    def add_mirrored(self, base: str, app: str) -> None:
        for suffix in _MIRRORED:
            self.add(base + suffix, suffix[1:], app)

    def set_ready(self, names: Sequence[str], ready: bool) -> None:
        for name in names:
            self.bed.set_ready(name, ready)
            self.pods[name].ready = ready

    def terminate(self, names: Sequence[str]) -> None:
        for name in names:
            self.bed.start_termination(name)
            self.pods[name].terminating = True

    def finish(self, names: Sequence[str]) -> None:
        for name in names:
            self.bed.finish_termination(name)
            del self.pods[name]

    def delete_service(self, name: str) -> None:
        self.bed.delete("service", name)
        del self.selectors[name]

    def expected(self) -> Expected:
        """Each Service's endpoints as (ip, ready, serving, terminating), over its families."""
        out: Expected = {}
        for service, app in self.selectors.items():
            indexes = [FAMILIES.index(f) for f in self.families[service]]
            out[service] = {
                (p.ips[i], p.ready and not p.terminating, p.ready, p.terminating)
                for p in self.pods.values()
                if p.app == app
                for i in indexes
            }
        return out

    def serving(self, app: str) -> list[PodState]:
        """The pods of `app` that take new connections."""
        return [p for p in self.pods.values() if p.app == app and p.ready and not p.terminating]


def mirrored(base: str) -> list[str]:
    """The names of a mirrored pair's pods."""
    return [base + suffix for suffix in _MIRRORED]


def walk(w: Walk, services: Sequence[dict[str, Any]], check: Callable[[str], None]) -> None:
    """Every step of STEPS on `w`'s bed, `check` after each (with the step's name)."""
    bed = w.bed
    w.add("web-0", POD_HOST_NODE, "web")
    w.add("web-1", POD_HOST_NODE, "web")
    w.add_mirrored("lweb-0", "lweb")
    w.add("lweb-remote", POD_HOST_NODE, "lweb")
    bed.apply(*services)
    bed.start_proxies()
    check(STEPS[0])

    w.add("web-2", POD_HOST_NODE, "web")
    check(STEPS[1])
    w.add_mirrored("lweb-1", "lweb")
    check(STEPS[2])

    w.set_ready(["web-0"], False)
    check(STEPS[3])
    w.terminate(["web-1"])
    check(STEPS[4])
    w.terminate(mirrored("lweb-0"))
    check(STEPS[5])
    w.set_ready(mirrored("lweb-1"), False)
    check(STEPS[6])

    w.finish(["web-1", *mirrored("lweb-0")])
    check(STEPS[7])
    w.set_ready(["web-0", *mirrored("lweb-1")], True)
    check(STEPS[8])

    w.delete_service("web-ext")
    check(STEPS[9])
    w.delete_service("lweb-local")
    check(STEPS[10])
