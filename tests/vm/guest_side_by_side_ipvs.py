"""Upstream's kube-proxy and ours side by side in IPVS mode, inside the VM (the guest, as root).

The host's kernel has no IPVS, so tests/vm/test_side_by_side_ipvs.py boots Debian's kernel
(kubeproxy/lab/vm.py) and runs this there, from the repository root:

    python -m tests.vm.guest_side_by_side_ipvs OUT.json [every]

It builds the side-by-side bed (kubeproxy/lab/side_by_side.py: upstream's control plane, upstream's
kube-proxy --proxy-mode=ipvs on node-a, ours on node-b) and, with both proxies started once, runs
three scenarios one after the other:

- the e2e walk every mode shares (kubeproxy/lab/side_by_side_walk.py) over Services that reach
  IPVS's own paths (affinity as persistence, NodePort TCP and UDP, LoadBalancer source ranges,
  external IPs, externalTrafficPolicy Local with its health check node port, internalTrafficPolicy
  Local);
- the hostile-but-valid objects (tests/upstream/hostile_objects.py) and a port and affinity
  change of a walk Service, all in one apply, then every Service deleted (their virtual servers,
  set members and kube-ipvs0 addresses go);
- a seeded random cluster (tests/upstream/random_cluster.py) and its churn.

After each checked step, once both proxies have synced it, the two nodes' `ipvsadm-save -n`,
`ipset save`, kube-ipvs0 addresses, `iptables-save` and `ip6tables-save` are compared, each
node's own addresses named by role (lab/ipvs_compare.py). Under TCG a step costs tens of seconds,
so by default the walk is checked at CHECKED_WALK_STEPS only (the other steps' changes are still
made, and the next checked step sees them together); `every` checks each of its steps. A step
that differs is recorded and the run goes on, so one boot shows every difference. OUT.json is
rewritten after every step: {"startup_seconds", "control_plane_seconds", "steps": [{"step",
"what", "differences", "seconds"}], "error", "dumps", "logs"}.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from kubeproxy.lab import builders
from kubeproxy.lab.control_plane import upstream_bin
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, BedPod, SideBySide
from kubeproxy.lab.side_by_side_walk import FAMILIES, Walk, walk
from kubeproxy.lab.side_by_side_walk import STEPS as WALK_STEPS
from tests.upstream.hostile_objects import MANAGER, hostiles
from tests.upstream.random_cluster import Model

STARTUP_TIMEOUT = 900.0  # the control plane under TCG on a loaded machine: measured 2-9 min
PROBE_TIMEOUT = 180.0  # a pod's probe server starting (a Python import under TCG)
STEP_TIMEOUT = 240.0  # a step's syncs and dumps under TCG (measured 67-144 s); a step that differs waits all of it
# The hostile objects' hundreds of set members come and go one `ipset add`/`del` process each in
# upstream's proxier (pkg/proxy/ipvs/ipset/ipset.go:324-340): minutes under TCG.
HEAVY_STEP_TIMEOUT = 900.0
API_TIMEOUT = 60.0  # the lab kubelet's requests: a loaded API server under TCG answers a POST in over 10 s
# The first step waits for both proxies' start and first sync of each family (upstream's IPv6
# proxier syncs only once its IPv4 one has: measured 2 min apart under TCG).
FIRST_STEP_TIMEOUT = 600.0
NODE_LOCAL = ("lweb-itp",)  # internalTrafficPolicy Local: a node's ClusterIP reaches its own pods only
SEED = 1
CHURN_STEPS = 2
# The walk's steps whose paths are IPVS's own: everything programmed at once, a node's own pods
# among them (KUBE-LOOP-BACK members, the Local Services' real servers); a terminating endpoint
# (graceful termination: its real server kept at weight 0); a Local Service whose only local
# endpoints are terminating. The other steps' real-server changes are made all the same and
# seen at the next checked step; the hostile and random steps add and delete virtual servers.
CHECKED_WALK_STEPS = (WALK_STEPS[0], WALK_STEPS[4], WALK_STEPS[6])
AFTER_WALK = ("a Service's port and affinity changed, and the hostile objects", "every Service deleted")
RANDOM_STEPS = (f"seed {SEED}: the first sync", *(f"seed {SEED}: churn step {i}" for i in range(CHURN_STEPS)))


def steps(every: bool = False, random_cluster: bool = False) -> tuple[str, ...]:
    """The steps a boot checks, in order (`every`: each of the walk's; `random_cluster`: the
    seeded random cluster's too, which CI leaves out: under TCG its wired pods and churn add
    tens of minutes)."""
    random_steps = RANDOM_STEPS if random_cluster else ()
    return (*(WALK_STEPS if every else CHECKED_WALK_STEPS), *AFTER_WALK, *random_steps)


@dataclass
class Run:
    bed: SideBySide
    out: Path
    checked: Collection[str]
    report: dict[str, Any] = field(default_factory=lambda: {"steps": [], "error": None})

    def check(
        self,
        step: str,
        expected: Mapping[str, set[tuple[str, bool, bool, bool]]],
        node_local: Collection[str],
        changed: Collection[str] = ("IPv4",),
        what: str = "",
    ) -> None:
        if step not in self.checked:
            return
        began = time.monotonic()
        timeout = FIRST_STEP_TIMEOUT if not self.report["steps"] else HEAVY_STEP_TIMEOUT if step in AFTER_WALK else STEP_TIMEOUT
        diffs = self.bed.await_step(expected, node_local=node_local, changed=changed, timeout=timeout)
        seconds = round(time.monotonic() - began, 1)
        self.report["steps"].append({"step": step, "what": what, "differences": diffs, "seconds": seconds})
        print(f"{step}: {len(diffs)} differences in {seconds:.0f} s", flush=True)
        self.save()

    def save(self) -> None:
        self.out.write_text(json.dumps(self.report, indent=1))


def add_pod(bed: SideBySide) -> Callable[[str, str, Mapping[str, str]], BedPod]:
    """How the scenarios make a pod here: a node's own pod is wired (IPVS takes a real server only
    on a route to it); another node's is known to the API only (the nodes route its range to it)."""

    def add(name: str, node: str, labels: Mapping[str, str]) -> BedPod:
        return bed.add_pod(name, node, labels, wired=node != POD_HOST_NODE)

    return add


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


def walk_and_hostiles(run: Run) -> None:
    """The shared walk, a port and affinity change, the hostile objects over what the walk left,
    then every Service (and every hand-made slice) deleted."""
    bed = run.bed
    w = Walk.of(bed, services(), add_pod(bed))
    walk(w, services(), lambda step: run.check(step, w.expected(), NODE_LOCAL))

    every = hostiles()
    # A virtual server's port and persistence timeout changed in place, beside the new objects.
    bed.apply(services(web_port=81, affinity=60)[0])
    for hostile in every:  # one apply each: all at once outlasts kubectl's minute under TCG
        bed.apply(*hostile.objects)
    for hostile in every:
        for name, families in hostile.selecting.items():
            w.selectors[name] = "web"
            w.families[name] = families
    run.check(AFTER_WALK[0], w.expected(), NODE_LOCAL, FAMILIES, f"{len(every)} objects: " + "; ".join(h.what for h in every))

    bed.changed_at = time.time()
    not_kubernetes = ("--field-selector", "metadata.name!=kubernetes", "--wait=false")
    bed.cp.run_kubectl("delete", "services,endpoints", "-n", "default", *not_kubernetes)
    manager = ",".join(f"{k}={v}" for k, v in MANAGER.items())
    bed.cp.run_kubectl("delete", "endpointslices", "-n", "default", "-l", manager, "--wait=false")
    run.check(AFTER_WALK[1], {}, (), FAMILIES)


def random_cluster(run: Run) -> None:
    """A seeded random cluster beside the walk's pods (their Services gone), and its churn."""
    model = Model(random.Random(SEED), run.bed, add_pod=add_pod(run.bed))
    model.populate()
    run.check(RANDOM_STEPS[0], model.expected(), model.node_local(), FAMILIES, f"{sorted(model.services)}")
    for step in RANDOM_STEPS[1:]:
        what, touched = model.churn()
        run.check(step, model.expected(), model.node_local(), touched, what)


def main(out: Path, every: bool = False, random_steps: bool = False) -> int:
    bin_dir = upstream_bin()
    if bin_dir is None:
        out.write_text(json.dumps({"steps": [], "error": "upstream's binaries are not there (KUBEPROXY_UPSTREAM_BIN)"}))
        return 1
    began = time.monotonic()
    with SideBySide.build(bin_dir, mode="ipvs", startup_timeout=STARTUP_TIMEOUT) as bed:
        bed.probe_timeout = PROBE_TIMEOUT
        bed.cp.api.timeout = httpx2.Timeout(API_TIMEOUT)
        run = Run(bed, out, steps(every, random_steps))
        run.report["startup_seconds"] = round(time.monotonic() - began, 1)
        run.report["control_plane_seconds"] = round(bed.cp.startup_seconds, 1)
        try:
            walk_and_hostiles(run)
            if random_steps:
                random_cluster(run)
        except Exception:  # the report carries it to the host, which fails the test with it
            run.report["error"] = traceback.format_exc()
        run.report["dumps"] = {node: bed.dump(node) for node in (UPSTREAM_NODE, OURS_NODE)}
        run.report["logs"] = {node: bed.proxy_log(node)[-6000:] for node in (UPSTREAM_NODE, OURS_NODE)}
        run.save()
    return 0 if run.report["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), every="every" in sys.argv[2:], random_steps="random" in sys.argv[2:]))
