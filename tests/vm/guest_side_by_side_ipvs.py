"""Upstream's kube-proxy and ours side by side in IPVS mode, inside the VM (the guest, as root).

The host's kernel has no IPVS, so tests/vm/test_side_by_side_ipvs.py boots Debian's kernel
(kubeproxy/lab/vm.py) and runs this there, from the repository root:

    python -m tests.vm.guest_side_by_side_ipvs OUT.json

It builds the side-by-side bed (kubeproxy/lab/side_by_side.py: upstream's control plane, upstream's
kube-proxy --proxy-mode=ipvs on node-a, ours on node-b) and walks STEPS. After each, once both
proxies have synced it, the two nodes' `ipvsadm-save -n`, `ipset save`, kube-ipvs0 addresses,
`iptables-save` and `ip6tables-save` are compared, each node's own addresses named by role
(lab/ipvs_compare.py). A step that differs is recorded and the walk goes on, so one boot shows
every difference. OUT.json is rewritten after every step: {"startup_seconds", "steps": [{"step",
"differences", "seconds"}], "error", "dumps"}, the last the final dumps of both nodes.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeproxy.lab import builders
from kubeproxy.lab.control_plane import upstream_bin
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide

STARTUP_TIMEOUT = 900.0  # the control plane under TCG on a loaded machine: measured 2-5 min
PROBE_TIMEOUT = 180.0  # a pod's probe server starting (a Python import under TCG)
STEP_TIMEOUT = 180.0  # a step's syncs and dumps under TCG; a step that differs waits all of it
# The first step waits for both proxies' start and first sync of each family (upstream's IPv6
# proxier syncs only once its IPv4 one has: measured 2 min apart under TCG).
FIRST_STEP_TIMEOUT = 600.0
NODE_LOCAL = ("lweb-itp",)  # internalTrafficPolicy Local: a node's ClusterIP reaches its own pods only

STEPS = (
    "the first sync",
    "a pod added",
    "a local pod added on each node",
    "a pod turned not ready",
    "a pod terminating",
    "a local pod terminating on each node",
    "terminated pods gone",
    "a pod ready again",
    "a Service's port and affinity changed",
    "a Service deleted",
    "the Local LoadBalancer deleted",
)


@dataclass
class PodState:
    ip: str
    app: str
    ready: bool = True
    terminating: bool = False


@dataclass
class Walk:
    bed: SideBySide
    out: Path
    selectors: dict[str, str]  # Service name -> the app its selector picks
    pods: dict[str, PodState] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=lambda: {"steps": [], "error": None})

    def add(self, name: str, node: str, app: str) -> None:
        # Rules need no packets: a remote pod is known to the API only (the nodes route its range
        # to node-c). A node's own pod is wired, as IPVS takes a real server only on a route to it.
        pod = self.bed.add_pod(name, node, {"app": app}, wired=node != POD_HOST_NODE)
        self.pods[name] = PodState(pod.info.ips[0], app)

    def add_mirrored(self, base: str, app: str) -> None:
        for node in (UPSTREAM_NODE, OURS_NODE):
            self.add(f"{base}-{node}", node, app)

    def expected(self) -> dict[str, set[tuple[str, bool, bool, bool]]]:
        return {
            service: {(p.ip, p.ready and not p.terminating, p.ready, p.terminating) for p in self.pods.values() if p.app == app}
            for service, app in self.selectors.items()
        }

    def check(self, step: str) -> None:
        assert step in STEPS, step
        began = time.monotonic()
        timeout = FIRST_STEP_TIMEOUT if step == STEPS[0] else STEP_TIMEOUT
        diffs = self.bed.await_step(self.expected(), node_local=NODE_LOCAL, timeout=timeout)
        self.report["steps"].append({"step": step, "differences": diffs, "seconds": round(time.monotonic() - began, 1)})
        print(f"{step}: {len(diffs)} differences in {time.monotonic() - began:.0f} s", flush=True)
        self.save()

    def save(self) -> None:
        self.out.write_text(json.dumps(self.report, indent=1))


def services(*, web_port: int = 80, affinity: int = 300) -> list[builders.JSON]:
    def port(node_port: int = 0, name: str = "http", number: int = 80) -> list[builders.Port]:
        return [builders.Port(name, number, 8080, node_port=node_port)]

    web = {"selector": {"app": "web"}}
    lweb = {"selector": {"app": "lweb"}}
    return [
        builders.service("web", "10.96.0.10", port(number=web_port), affinity_timeout=affinity, spec=web),
        builders.service("web-np", "10.96.0.11", port(30011), type="NodePort", spec=web),
        builders.service("web-lb", "10.96.0.12", port(30012), type="LoadBalancer", load_balancer_ips=["203.0.113.12"],
                        source_ranges=["198.51.100.0/24"], spec=web),
        builders.service("web-ext", "10.96.0.13", port(), external_ips=["198.51.100.13"], spec=web),
        builders.service("web-dns", "10.96.0.16", [builders.Port("dns", 53, 5353, "UDP", node_port=30016)], type="NodePort",
                        spec=web),
        builders.service("lweb-local", "10.96.0.14", port(30014), type="LoadBalancer", load_balancer_ips=["203.0.113.14"],
                        external_traffic_policy="Local", health_check_node_port=32014, external_ips=["198.51.100.14"],
                        spec=lweb),
        builders.service("lweb-itp", "10.96.0.15", port(), internal_traffic_policy="Local", spec=lweb),
    ]  # fmt: skip


def walk(w: Walk) -> None:
    bed = w.bed
    w.add("web-0", POD_HOST_NODE, "web")
    w.add("web-1", POD_HOST_NODE, "web")
    w.add_mirrored("lweb-0", "lweb")
    w.add("lweb-remote", POD_HOST_NODE, "lweb")
    bed.apply(*services())
    bed.start_proxies()
    w.check("the first sync")

    w.add("web-2", POD_HOST_NODE, "web")
    w.check("a pod added")
    w.add_mirrored("lweb-1", "lweb")
    w.check("a local pod added on each node")

    def pod_change(step: str, names: list[str], act: Callable[[str], None], state: Callable[[PodState], None]) -> None:
        for name in names:
            act(name)
            state(w.pods[name])
        w.check(step)

    def not_ready(p: PodState) -> None:
        p.ready = False

    def ready(p: PodState) -> None:
        p.ready = True

    def terminating(p: PodState) -> None:
        p.terminating = True

    pod_change("a pod turned not ready", ["web-0"], lambda n: bed.set_ready(n, False), not_ready)
    pod_change("a pod terminating", ["web-1"], bed.start_termination, terminating)
    mirrored = [f"lweb-0-{node}" for node in (UPSTREAM_NODE, OURS_NODE)]
    pod_change("a local pod terminating on each node", mirrored, bed.start_termination, terminating)
    for name in ["web-1", *mirrored]:
        bed.finish_termination(name)
        del w.pods[name]
    w.check("terminated pods gone")
    pod_change("a pod ready again", ["web-0"], lambda n: bed.set_ready(n, True), ready)

    bed.apply(services(web_port=81, affinity=60)[0])
    w.check("a Service's port and affinity changed")
    bed.delete("service", "web-ext")
    del w.selectors["web-ext"]
    w.check("a Service deleted")
    bed.delete("service", "lweb-local")
    del w.selectors["lweb-local"]
    w.check("the Local LoadBalancer deleted")


def main(out: Path) -> int:
    bin_dir = upstream_bin()
    if bin_dir is None:
        out.write_text(json.dumps({"steps": [], "error": "upstream's binaries are not there (KUBEPROXY_UPSTREAM_BIN)"}))
        return 1
    selectors = {name: ("lweb" if name.startswith("lweb") else "web") for name in (s["metadata"]["name"] for s in services())}
    began = time.monotonic()
    with SideBySide.build(bin_dir, mode="ipvs", startup_timeout=STARTUP_TIMEOUT) as bed:
        bed.probe_timeout = PROBE_TIMEOUT
        w = Walk(bed, out, selectors)
        w.report["startup_seconds"] = round(time.monotonic() - began, 1)
        w.report["control_plane_seconds"] = round(bed.cp.startup_seconds, 1)
        try:
            walk(w)
        except Exception:  # the report carries it to the host, which fails the test with it
            w.report["error"] = traceback.format_exc()
        w.report["dumps"] = {node: bed.dump(node) for node in (UPSTREAM_NODE, OURS_NODE)}
        w.report["logs"] = {node: bed.proxy_log(node)[-6000:] for node in (UPSTREAM_NODE, OURS_NODE)}
        w.save()
    return 0 if w.report["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
