#!/usr/bin/env python3
"""Ours against upstream's kube-proxy v1.37.2, side by side in one run, same API server, same mode.

Usage: .venv/bin/python bench/vs_upstream.py [--sizes 1000,10000] [--endpoints 10]
                                             [--modes iptables-legacy,iptables-nft,nftables]
                                             [--changes 20] [--idle 20] [--churn 20] [--plot docs/vs_upstream.png]
                                             [--json FILE] [--phases] [--tree DIR] [--timeout 600]
                                             [--repeat K]

Needs root and upstream's binaries (scripts/upstream; $KUBEPROXY_UPSTREAM_BIN). For each size:
1. upstream's control plane (etcd, kube-apiserver, kube-controller-manager: lab/control_plane.py)
   starts in a network namespace of its own and is loaded with N Services x --endpoints endpoints
   (bench/render.py's objects, in namespace `bench`, ClusterIPs moved to 10.97.x.y off the
   `kubernetes` Service's 10.96.0.1), one EndpointSlice each, plus a Node `node-0` and the slices
   of the --changes Services created later; the clock does not run yet;
2. for each mode, upstream's kube-proxy and ours (`.venv/bin/kube-proxy`, the same flags,
   alternating) each run in a fresh network namespace wired to the control plane's by a veth
   pair, with the admin kubeconfig; the iptables variant is chosen for both the same way, by
   the `iptables*` on PATH (symlinks to xtables-legacy-multi or xtables-nft-multi), as
   upstream's image does. Nothing runs in the host's namespace; each namespace is removed with
   its processes at the end of its run, and every wait is bounded by --timeout.

What is measured, per proxy:
- cold start: from the fork until the last Service's rule is committed to the namespace's kernel,
  as bench/kernel_watch.py in that namespace sees it (nftables: the element `IP . tcp . 80` of
  the service-ips map both use, from nf_tables' netlink events; iptables: the KUBE-SVC- chain both
  give it, iptables-legacy by the nat table's size polled every 2 ms without the xtables lock,
  iptables-nft from the events); then one poll with the tools (`nft get element ...`,
  `iptables -t nat -S KUBE-SVC-...`) checks it and its seconds are shown ("one poll s");
- one change: a Service created (its EndpointSlice made beforehand, so the change is one API
  object) until its rule is committed, seen the same way; --changes of them, each after a
  pause of 1.2 s so that the proxy is idle past its minSyncPeriod (1 s, both) when it arrives:
  p50 and p99 (the p99 of 20 is their maximum);
- full sync: each proxy's own kubeproxy_sync_full_proxy_rules_duration_seconds (IPv4), read from
  its /metrics (curl inside its namespace). Both observe it around the whole sync function: the
  change trackers applied, the rules built and restored (upstream: iptables/proxier.go and
  nftables/proxier.go syncProxyRules, deferred; ours: live_loop's _sync_lane). "first": the cold
  start's full sync (sum / count once the count is 1 or more). "forced": after the changes, the
  Node's topology.kubernetes.io/zone label is changed; upstream then syncs in full
  (config.go handleNodeEvent -> OnTopologyChange sets needFullSync), ours too (a change of its
  own Node forces one); the seconds the histogram's sum grew by, over the syncs it counted more.
  Upstream's other full syncs (a failed restore, the canary chain gone in iptables mode, hourly)
  are not reachable the same way for both within a run;
- restores (iptables modes): the iptables-restore on PATH is RESTORE_WRAPPER, which logs when
  each call began, when its input was read, the tool's wall and CPU seconds and the input's
  bytes and lines (--keep-restores DIR keeps the inputs): the first, and the median of those
  made during the changes; --caller-cpu-log FILE adds a line per restore with the calling
  proxy's own CPU ticks (user + sys, its threads included) as the tool started and ended: what
  the proxy does on the other core while its restore runs;
- RSS (VmRSS) once the cold start is seen, and its growth per 1,000 Services between two sizes;
- CPU seconds per minute (user + sys of the proxy process, its threads included, not the kernel
  tools it runs) over --idle seconds with no change, then over --churn seconds while
  EndpointSlices change (one endpoint moved, --churn-rate patches per second), scaled to a minute.

--repeat K: the cold start is made K times per proxy, alternating (upstream, ours, then ours,
upstream, ...; the first round is the full measurement above, the others stop once the first
full sync is counted), each in a fresh namespace against the objects loaded once. The table adds
the median and the range (min-max) of the K cold starts and of the first restore's wall and CPU
seconds, and the ratio of the medians: one cold start per proxy cannot tell a 10% difference
from the run-to-run spread of the restore's own time on the same input.

--phases: ours runs through a launcher with bench/coldstart.py's phase marks (plus the streaming
list's), printed after its row: interpreter up, each reflector started, its watch-list, the
objects delivered, the view, render and kernel, in seconds from the fork (the first of each).
--tree DIR: ours from another tree (PYTHONPATH), e.g. a `git archive` of a commit, so that
edits in the checkout during a long run do not reach the proxies it starts. A proxy that exits
before its first rule (e.g. a start-up check that met the xtables lock other netns share) is
started once more in a fresh namespace; API calls are retried on transport errors, 429 and 5xx.

The table gives each value and the ratio ours / upstream (below 1: ours is faster or smaller).
The machine is shared: the load average at the start and end is printed; compare the two columns
of a row (measured within a minute of each other), not runs made at different times.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from coldstart import _PHASES, PHASES, cpu_seconds, memory_mib  # noqa: E402
from render import cluster  # noqa: E402

from kubeproxy.backends.iptables.names import service_chain  # noqa: E402
from kubeproxy.lab import netns as L  # noqa: E402
from kubeproxy.lab.control_plane import ControlPlane, upstream_bin  # noqa: E402
from kubeproxy.lab.kubelet import LabKubelet, NodeInfo  # noqa: E402

CONTROL_IP = "192.168.76.1"  # kube-apiserver's address, on the control namespace's loopback device
NODE = "node-0"
NAMESPACE = "bench"
METRICS = "127.0.0.1:10249"
FULL_SYNC = "kubeproxy_sync_full_proxy_rules_duration_seconds"  # upstream's pkg/proxy/metrics/metrics.go
# mode name: (--proxy-mode, the xtables binary the iptables* commands on PATH run)
MODES = {"iptables-legacy": ("iptables", "xtables-legacy-multi"), "iptables-nft": ("iptables", "xtables-nft-multi"),
         "nftables": ("nftables", "xtables-nft-multi")}  # fmt: skip
IPTABLES_NAMES = ("iptables", "iptables-save", "ip6tables", "ip6tables-save")
RESTORES = ("iptables-restore", "ip6tables-restore")  # wrapped: each call's input and time logged
PACE = 1.2  # seconds between changes: past both proxies' minSyncPeriod (1 s)
WATCH = Path(__file__).resolve().parent / "kernel_watch.py"
# Logs one restore: when its input began (the wrapper's start), when the input was all read and
# the real tool started, when it ended, the input's bytes and lines, the exit status, the name,
# and the CPU seconds (user + sys) of the wrapper's children (the tool; cat, date and mktemp
# add milliseconds). With $KP_RESTORE_KEEP the input is kept there, named by its start.
RESTORE_WRAPPER = """#!/bin/bash
began=$(date +%s.%N)
input=$(mktemp)
cat > "$input"
caller_cpu() { awk '{print $14 + $15}' "/proc/$PPID/stat" 2>/dev/null; }
caller_before=$(caller_cpu)
start=$(date +%s.%N)
"$KP_XTABLES_MULTI" "$(basename "$0")" "$@" < "$input"
status=$?
end=$(date +%s.%N)
if [ -n "$KP_CALLER_CPU_LOG" ]; then
    echo "$start $end $(cat "/proc/$PPID/comm") $caller_before $(caller_cpu) $KP_RESTORE_LOG" >> "$KP_CALLER_CPU_LOG"
fi
times > "$input.cpu"
cpu=$(tail -1 "$input.cpu" | awk '{n = 0; for (i = 1; i <= 2; i++) {split($i, a, /[ms]/); n += a[1] * 60 + a[2]}; print n}')
echo "$began $start $end $(wc -c < "$input") $(wc -l < "$input") $status $(basename "$0") $cpu" >> "$KP_RESTORE_LOG"
if [ -n "$KP_RESTORE_KEEP" ]; then mv "$input" "$KP_RESTORE_KEEP/$(basename "$0")-$start"; fi
rm -f "$input" "$input.cpu"
exit $status
"""


@dataclass
class Result:
    cold: float = float("nan")
    full: float = float("nan")  # seconds of the first full sync, from the proxy's own histogram
    full_count: int = 0  # full syncs the histogram had counted when read
    resync: float = float("nan")  # seconds of the full sync(s) that a change of the Node's zone label forces, mean
    phases: dict[str, float] = field(default_factory=dict)  # --phases: "phase:<label>:start|end", s from the fork
    rss: float = float("nan")
    changes: list[float] = field(default_factory=list)
    idle_cpu: float = float("nan")  # CPU seconds per minute
    churn_cpu: float = float("nan")
    poll: float = float("nan")  # seconds one poll of the kernel for a rule takes, once the cold start is in
    # iptables modes: each restore's (input began, tool started, tool ended) s from the fork, bytes,
    # lines, CPU s of the tool
    restores: list[tuple[float, float, float, int, int, float]] = field(default_factory=list)
    change_window: tuple[float, float] = (float("nan"), float("nan"))  # s from the fork: the changes' span
    # --repeat: each round's cold start and its first restore's (wall, CPU) seconds, this run's first
    colds: list[float] = field(default_factory=list)
    first_restores: list[tuple[float, float]] = field(default_factory=list)
    restore_starts: list[float] = field(default_factory=list)  # s from the fork to each round's first restore

    def p(self, q: float) -> float:
        return quantile(self.changes, q)

    def first_restore(self) -> tuple[float, float, float, int, int, float] | None:
        return self.restores[0] if self.restores else None

    def add_round(self, other: Result) -> None:
        """Count `other`'s cold start and first restore as one more round of this proxy's."""
        self.colds.append(other.cold)
        first = other.first_restore()
        if first is not None:
            self.first_restores.append((first[2] - first[1], first[5]))
            self.restore_starts.append(first[0])

    def change_restores(self) -> list[tuple[float, float, float, int, int, float]]:
        """The restores that began while the changes were being made (their syncs)."""
        lo, hi = self.change_window
        return [r for r in self.restores if lo <= r[0] <= hi]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ---- the API server ------------------------------------------------------------------------


def objects(size: int, endpoints: int, changes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the Services and slices loaded before any proxy starts, the --changes Services made later
    one by one; their slices are in the first list)."""
    objs = cluster(size, endpoints)
    for obj in objs:
        obj["metadata"]["namespace"] = NAMESPACE
        if obj["kind"] == "Service":
            obj["spec"]["clusterIP"] = obj["spec"]["clusterIP"].replace("10.96.", "10.97.", 1)
    later = []
    for k in range(changes):
        name = f"change-{k}"
        address = [{"addresses": [f"10.250.{k // 250}.{k % 250 + 1}"], "nodeName": "node-1"}]
        objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"{name}-1", "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": name}},
                     "addressType": "IPv4", "endpoints": address,
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})  # fmt: skip
        later.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
                      "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})  # fmt: skip
    return objs, later


def collection(obj: dict[str, Any]) -> str:
    if obj["kind"] == "Service":
        return f"/api/v1/namespaces/{NAMESPACE}/services"
    return f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


def call(send: Callable[[], httpx.Response], what: str, tries: int = 4) -> httpx.Response:
    """`send()` again after a transport error, a 429 or a 5xx (a loaded kube-apiserver sheds
    requests), up to `tries` times, 1, 2, 4 s apart; the last answer otherwise, or SystemExit
    naming `what`."""
    for attempt in range(tries):
        try:
            answer = send()
        except httpx.HTTPError as e:
            if attempt == tries - 1:
                raise SystemExit(f"{what}: {e!r} ({tries} tries)") from e
        else:
            if (answer.status_code != 429 and answer.status_code < 500) or attempt == tries - 1:
                return answer
        time.sleep(2**attempt)  # backing off from a server that asked for it
    raise AssertionError("unreachable")


def create(cp: ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    where = collection(obj)
    answer = call(lambda: cp.api.post(where, json=obj), f"POST {where}")
    if answer.status_code == 409:  # a retried POST whose first try was stored after all
        answer = call(lambda: cp.api.get(f"{where}/{obj['metadata']['name']}"), f"GET {where}")
    if answer.status_code >= 300:
        raise SystemExit(f"POST {where}: {answer.status_code} {answer.text[:300]}")
    created: dict[str, Any] = answer.json()
    return created


def label_zone(cp: ControlPlane, zone: str) -> None:
    """Give the Node another topology.kubernetes.io/zone: both proxies then sync in full
    (upstream: pkg/proxy/config/config.go handleNodeEvent -> the proxiers' OnTopologyChange)."""
    patch = {"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}}
    headers = {"Content-Type": "application/merge-patch+json"}
    answer = call(lambda: cp.api.patch(f"/api/v1/nodes/{NODE}", json=patch, headers=headers), "PATCH node")
    if answer.status_code >= 300:
        raise SystemExit(f"PATCH /api/v1/nodes/{NODE}: {answer.status_code} {answer.text[:300]}")


def load(cp: ControlPlane, objs: list[dict[str, Any]], workers: int = 8) -> float:
    """Create every object (8 at a time, through the control plane's kubectl proxy); seconds taken."""
    began = time.monotonic()
    cp.api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    LabKubelet(cp.api).register_node(NodeInfo(NODE, ("192.168.77.2",), ("10.244.0.0/24",)))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda obj: create(cp, obj), objs))
    return time.monotonic() - began


# ---- one proxy in a namespace of its own ---------------------------------------------------


def iptables_path(folder: Path, multi: str) -> tuple[str, str]:
    """(a PATH whose iptables* run `multi` (what iptables-wrapper does in upstream's image), the
    multi binary): the restores go through RESTORE_WRAPPER, which logs each one."""
    folder.mkdir(parents=True, exist_ok=True)
    target = shutil.which(multi)
    if target is None:
        raise SystemExit(f"{multi} is not installed")
    for name in IPTABLES_NAMES:
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(target)
    for name in RESTORES:
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_text(RESTORE_WRAPPER)
        (folder / name).chmod(0o755)
    return f"{folder}:{os.environ['PATH']}", target


def read_restores(path: Path, fork_wall: float) -> list[tuple[float, float, float, int, int, float]]:
    """RESTORE_WRAPPER's log of the IPv4 restores, times in s from the fork."""
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        began, start, end, size, lines, _status, name, cpu = line.split()
        if name == "iptables-restore":
            times = (float(began) - fork_wall, float(start) - fork_wall, float(end) - fork_wall)
            found.append((*times, int(size), int(lines), float(cpu)))
    return found


def rule_key(mode: str, name: str, cluster_ip: str) -> str:
    """The kernel_watch.py line (after its time) that shows Service `name`'s rule committed."""
    if mode == "nftables":
        return f"elem {cluster_ip} tcp 80"
    return f"chain {service_chain(f'{NAMESPACE}/{name}:http', 'tcp')}"


def rule_present(ns: L.NetNS, mode: str, env_path: str, name: str, cluster_ip: str) -> bool:
    if mode == "nftables":
        argv = ["nft", "get", "element", "ip", "kube-proxy", "service-ips", "{", cluster_ip, ".", "tcp", ".", "80", "}"]
    else:
        argv = ["env", f"PATH={env_path}", "iptables", "-w", "5", "-t", "nat", "-S",
                service_chain(f"{NAMESPACE}/{name}:http", "tcp")]  # fmt: skip
    try:
        return ns.run(argv, check=False, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:  # a loaded machine: the next poll asks again
        return False


class EarlyExit(SystemExit):
    """The proxy process ended before the rule awaited was in."""


def full_sync_metric(ns: L.NetNS) -> tuple[float, int]:
    """(sum of seconds, count) of the IPv4 kubeproxy_sync_full_proxy_rules_duration_seconds on
    the proxy's /metrics in `ns`; (nan, 0) when the page does not answer."""
    try:
        page = ns.run(["curl", "-sf", "--max-time", "10", f"http://{METRICS}/metrics"], check=False, timeout=30).stdout
    except subprocess.TimeoutExpired:
        return float("nan"), 0
    found: dict[str, float] = {}
    for line in page.splitlines():
        name, _, rest = line.partition("{")
        if name in (f"{FULL_SYNC}_sum", f"{FULL_SYNC}_count") and 'ip_family="IPv4"' in rest:
            found[name.rsplit("_", 1)[1]] = float(rest.rsplit(" ", 1)[1])
    return found.get("sum", float("nan")), int(found.get("count", 0))


def await_full_syncs(ns: L.NetNS, count: int, deadline: float) -> tuple[float, int]:
    """The histogram once it counts `count` full syncs (observed after the rules are written, so
    a moment after the rule is seen); what it holds at `deadline` otherwise."""
    while True:
        total, seen = full_sync_metric(ns)
        if seen >= count or time.monotonic() > deadline:
            return total, seen
        time.sleep(0.2)  # polling another process's metrics page: no event to wait for


class KernelWatch:
    """bench/kernel_watch.py running in a namespace: the monotonic time each line was first printed."""

    def __init__(self, ns: L.NetNS, mode: str) -> None:
        self.seen: dict[str, float] = {}
        self.lost: list[str] = []
        self._changed = threading.Condition()
        self._proc = ns.popen([sys.executable, str(WATCH), mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._await(lambda: "ready" in self.seen, time.monotonic() + 60):
            raise SystemExit(f"bench/kernel_watch.py {mode} did not start in {ns.name}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            when, _, what = line.rstrip("\n").partition(" ")
            with self._changed:
                if what.startswith("lost "):
                    self.lost.append(what)
                try:
                    self.seen.setdefault(what, float(when))
                except ValueError:  # not one of its lines (a traceback): shown in the failure
                    self.lost.append(line.strip())
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _await(self, done: Callable[[], bool], deadline: float) -> bool:
        with self._changed:
            while not done():
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    return done()
                self._changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return True

    def await_rule(self, proc: subprocess.Popen[str], mode: str, name: str, ip: str, deadline: float) -> float:
        """Monotonic time at which the rule of Service `name` was committed to the namespace's kernel."""
        key = rule_key(mode, name, ip)
        if self._await(lambda: key in self.seen or proc.poll() is not None, deadline) and key in self.seen:
            return self.seen[key]
        if proc.poll() is not None:
            raise EarlyExit(f"the proxy exited with status {proc.returncode} before {name}'s rule was in")
        raise SystemExit(f"the proxy did not converge: no rule for {NAMESPACE}/{name} ({ip}) in its namespace's"
                         f" {mode} ruleset within the time allowed (--timeout); watcher: {self.lost[-3:]}")  # fmt: skip

    def stop(self) -> None:
        L.stop_process(self._proc, 5)


@contextlib.contextmanager
def node_namespace(control: L.NetNS, index: int) -> Iterator[L.NetNS]:
    """A fresh namespace wired to the control plane's by a veth pair of its own."""
    with L.netns("kpvsnode") as ns:
        base = 4 * (index % 60)
        L.link(control, f"vs{index}", f"192.168.77.{base + 1}/30", ns, "eth0", f"192.168.77.{base + 2}/30")
        ns.run(["ip", "route", "add", f"{CONTROL_IP}/32", "via", f"192.168.77.{base + 1}"])
        yield ns


def churn(cp: ControlPlane, slices: list[dict[str, Any]], rate: float, stop: threading.Event) -> None:
    """Move one endpoint of a random slice, `rate` times a second, until `stop`."""
    rand = random.Random(7)
    flip = 0
    while not stop.is_set():
        obj = rand.choice(slices)
        endpoints = json.loads(json.dumps(obj["endpoints"]))
        flip += 1
        endpoints[-1]["addresses"] = [f"10.251.{flip // 250 % 250}.{flip % 250 + 1}"]
        path = f"{collection(obj)}/{obj['metadata']['name']}"
        with contextlib.suppress(httpx.HTTPError):  # a lost patch is one change fewer, not the end of the churn
            cp.api.patch(path, json={"endpoints": endpoints}, headers={"Content-Type": "application/merge-patch+json"})
        stop.wait(1 / rate)


def one(cp: ControlPlane, control: L.NetNS, index: int, impl: str, mode: str, last: tuple[str, str],
        later: list[dict[str, Any]], slices: list[dict[str, Any]], args: argparse.Namespace, tmp: Path,
        cold_only: bool = False) -> Result:  # fmt: skip
    """One proxy's run in a fresh namespace; `cold_only`: until its first full sync is counted."""
    proxy_mode, multi = MODES[mode]
    env_path, multi_path = iptables_path(tmp / f"path-{mode}", multi)
    restore_log = tmp / f"restores-{index}.log"
    launch = [str(cp.bin_dir / "kube-proxy")] if impl == "upstream" else [sys.executable, str(launcher(tmp, args.phases))]
    marks = tmp / f"phases-{index}.log"
    tree = [f"PYTHONPATH={args.tree}"] if args.tree and impl == "ours" else []
    keep = []
    if args.keep_restores:
        (args.keep_restores / f"{impl}-{mode}").mkdir(parents=True, exist_ok=True)
        keep = [f"KP_RESTORE_KEEP={args.keep_restores / f'{impl}-{mode}'}"]
    argv = [*launch, "--kubeconfig", str(cp.admin_kubeconfig), "--hostname-override", NODE, "--proxy-mode", proxy_mode,
            "--cluster-cidr", "10.244.0.0/16", "--metrics-bind-address", METRICS,
            "--healthz-bind-address", "127.0.0.1:10256", "--conntrack-max-per-core", "0"]  # fmt: skip
    result = Result()
    with node_namespace(control, index) as ns, open(tmp / f"{impl}-{mode}-{index}.log", "w") as log:
        watch = KernelWatch(ns, mode)
        began, began_wall = time.monotonic(), time.time()
        env = [f"PATH={env_path}", f"KP_PHASES={marks}", f"KP_RESTORE_LOG={restore_log}", f"KP_XTABLES_MULTI={multi_path}"]
        if args.caller_cpu_log:
            env.append(f"KP_CALLER_CPU_LOG={args.caller_cpu_log.resolve()}")
        proc = ns.popen(["env", *env, *keep, *tree, *argv], stdout=log, stderr=subprocess.STDOUT)
        try:
            result.cold = watch.await_rule(proc, mode, *last, began + args.timeout) - began
            # `ip netns exec` and `env` exec in place: the child's pid is the proxy's.
            pid = proc.pid
            result.rss = memory_mib(pid)[1]
            polled = time.monotonic()
            if not rule_present(ns, mode, env_path, *last):
                raise SystemExit(f"the watcher saw {last[0]}'s rule committed, a poll of the ruleset does not show it")
            result.poll = time.monotonic() - polled
            total, result.full_count = await_full_syncs(ns, 1, time.monotonic() + 60)
            result.full = total / result.full_count if result.full_count else float("nan")
            if args.phases and impl == "ours":
                # the first sync's phases: those that ended by the time its histogram counted it
                result.phases = first_phases(marks, began, time.monotonic() - began)
            if cold_only:
                return result
            first_change = time.monotonic() - began
            for k, svc in enumerate(later):
                time.sleep(PACE)  # pacing: each change meets an idle proxy
                made = create(cp, {**svc, "spec": {**svc["spec"], "clusterIP": f"10.98.{index}.{k + 1}"}})
                sent = time.monotonic()
                deadline = sent + args.timeout
                seen = watch.await_rule(proc, mode, svc["metadata"]["name"], made["spec"]["clusterIP"], deadline)
                result.changes.append(seen - sent)
            result.change_window = (first_change, time.monotonic() - began)
            time.sleep(PACE)  # pacing: the forced full sync meets an idle proxy
            total, count = full_sync_metric(ns)
            label_zone(cp, f"zone-{index}")
            after, now = await_full_syncs(ns, count + 1, time.monotonic() + args.timeout)
            if now <= count:
                raise SystemExit(f"no full sync counted within {args.timeout:.0f} s of the Node's zone label changing")
            result.resync = (after - total) / (now - count)
            result.idle_cpu = _cpu_per_minute(pid, args.idle, lambda: None)
            stop = threading.Event()
            load_thread = threading.Thread(target=churn, args=(cp, slices, args.churn_rate, stop), daemon=True)
            result.churn_cpu = _cpu_per_minute(pid, args.churn, load_thread.start)
            stop.set()
            load_thread.join(timeout=30)
        except SystemExit:
            log.flush()
            print((tmp / f"{impl}-{mode}-{index}.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            L.stop_process(proc, 15)
            watch.stop()
            result.restores = read_restores(restore_log, began_wall)
            for svc in [] if cold_only else later:
                path = f"{collection(svc)}/{svc['metadata']['name']}"
                call(lambda path=path: cp.api.delete(path), f"DELETE {path}")  # type: ignore[misc]
    return result


# bench/coldstart.py's phases, the streaming list (sendInitialEvents) kube-apiserver serves, and
# iptables mode's render (the restore is timed by RESTORE_WRAPPER)
OUR_PHASES = {**PHASES, "kubeproxy.sources.api": [*PHASES["kubeproxy.sources.api"], ("Reflector.run", "reflector {kind}"),
                                                  ("Reflector._watch_list", "watch-list {kind}")],
              "kubeproxy.backends.iptables.proxier": [("render_tables", "  render (iptables)")]}  # fmt: skip


def launcher(tmp: Path, phases: bool) -> Path:
    """Ours' `kube-proxy` command (what .venv/bin/kube-proxy runs), with --phases bench/coldstart.py's
    phase marks written to $KP_PHASES, the first as the interpreter runs the launcher."""
    path = tmp / f"kube-proxy{'-phases' if phases else ''}.py"
    marks = _PHASES.format(wrap=OUR_PHASES) + "_mark('interpreter up', 'start')\n" if phases else ""
    path.write_text(marks + "import sys\nfrom kubeproxy.cli import kube_proxy\nsys.argv[0] = 'kube-proxy'\nkube_proxy()\n")
    return path


def first_phases(path: Path, fork: float, synced: float) -> dict[str, float]:
    """`phase:<label>:start|end`, s from `fork`: each phase's first start, and the first end after
    it (the first sync's, where a later sync runs it again), both before `synced`."""
    found: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        when, what, label = line.split(" ", 2)
        t = float(when) - fork
        key = f"phase:{label}:{what}"
        if t > synced or key in found or (what == "end" and f"phase:{label}:start" not in found):
            continue
        found[key] = t
    return found


def print_phases(marks: dict[str, float]) -> None:
    """Each phase of ours' cold start: first start, last end (s from the fork), by start."""
    labels = sorted({key.split(":")[1] for key in marks}, key=lambda label: marks.get(f"phase:{label}:start", 0.0))
    for label in labels:
        start, end = marks.get(f"phase:{label}:start", float("nan")), marks.get(f"phase:{label}:end", float("nan"))
        print(f"      {label:<22} {start:7.2f} {end:7.2f} {end - start:7.2f}", flush=True)


def _cpu_per_minute(pid: int, seconds: float, start: Callable[[], None]) -> float:
    before = cpu_seconds(pid)
    start()
    time.sleep(seconds)  # a sampling window, not a wait for an event
    return (cpu_seconds(pid) - before) * 60 / seconds


def save(path: Path, results: dict[tuple[int, str, str], Result]) -> None:
    rows = [{"size": size, "mode": mode, "impl": impl, **asdict(r)} for (size, mode, impl), r in results.items()]
    path.write_text(json.dumps(rows, indent=1))


def load_results(path: Path) -> dict[tuple[int, str, str], Result]:
    rows = json.loads(path.read_text())
    return {(row.pop("size"), row.pop("mode"), row.pop("impl")): Result(**row) for row in rows}


# ---- the table and the plot -----------------------------------------------------------------


ROWS: list[tuple[str, Callable[[Result], float | None], str]] = [
    ("cold start s", lambda r: r.cold, "{:.2f}"),
    ("first full sync s", lambda r: r.full, "{:.2f}"),
    ("forced full sync s", lambda r: r.resync, "{:.2f}"),
    ("one change p50 s", lambda r: r.p(0.5), "{:.3f}"),
    ("one change p99 s", lambda r: r.p(0.99), "{:.3f}"),
    ("RSS MiB", lambda r: r.rss, "{:.0f}"),
    ("CPU s/min idle", lambda r: r.idle_cpu, "{:.3f}"),
    ("CPU s/min churn", lambda r: r.churn_cpu, "{:.3f}"),
]
NAN = float("nan")
# Where the time goes (not plotted): the cost of the poll the watcher replaces, and in iptables
# modes each proxy's iptables-restore calls as RESTORE_WRAPPER logged them.
DETAIL_ROWS: list[tuple[str, Callable[[Result], float | None], str]] = [
    ("one poll s", lambda r: r.poll, "{:.3f}"),
    ("1st restore from s", lambda r: r.restores[0][0] if r.restores else NAN, "{:.2f}"),
    ("1st restore input s", lambda r: r.restores[0][1] - r.restores[0][0] if r.restores else NAN, "{:.2f}"),
    ("1st restore run s", lambda r: r.restores[0][2] - r.restores[0][1] if r.restores else NAN, "{:.2f}"),
    ("1st restore CPU s", lambda r: r.restores[0][5] if r.restores and len(r.restores[0]) > 5 else NAN, "{:.2f}"),
    ("1st restore MB", lambda r: r.restores[0][3] / 1e6 if r.restores else NAN, "{:.2f}"),
    ("1st restore klines", lambda r: r.restores[0][4] / 1e3 if r.restores else NAN, "{:.1f}"),
    ("change restores", lambda r: len(r.change_restores()) if r.restores else NAN, "{:.0f}"),
    ("change restore s", lambda r: quantile([c[2] - c[1] for c in r.change_restores()], 0.5), "{:.3f}"),
    ("change restore CPU s", lambda r: quantile([c[5] for c in r.change_restores() if len(c) > 5], 0.5), "{:.3f}"),
    ("change restore kB", lambda r: quantile([c[3] / 1e3 for c in r.change_restores()], 0.5), "{:.0f}"),
    ("change restore lines", lambda r: quantile([float(c[4]) for c in r.change_restores()], 0.5), "{:.0f}"),
]

# --repeat: the K rounds' values, as their median (the ratio is that of the medians) and range
SPREAD_ROWS: list[tuple[str, Callable[[Result], list[float]]]] = [
    ("cold start", lambda r: r.colds),
    ("1st restore from", lambda r: r.restore_starts),
    ("1st restore run", lambda r: [wall for wall, _ in r.first_restores]),
    ("1st restore CPU", lambda r: [cpu for _, cpu in r.first_restores]),
]


def spread_lines(mode: str, size: int, theirs: Result, ours: Result) -> list[str]:
    """The SPREAD_ROWS of a pair measured more than once: `<label> median s (K)` with the ratio of
    the medians, `<label> min-max s`."""
    lines = []
    for label, values in SPREAD_ROWS:
        if mode == "nftables" and "restore" in label:  # upstream's clean-up of iptables rules
            continue
        both = [[v for v in values(r) if v == v] for r in (theirs, ours)]
        if max(len(v) for v in both) < 2:
            continue
        medians = [statistics.median(v) if v else NAN for v in both]
        spans = [f"{min(v):.2f}-{max(v):.2f}" if v else "-" for v in both]
        name = f"{label} med ({len(both[0])}/{len(both[1])})"
        lines.append(f"| {mode:<15} | {size:>8,} | {name:<20} | {cell(medians[0], '{:.2f}'):>8} |"
                     f" {cell(medians[1], '{:.2f}'):>8} | {ratio(medians[1], medians[0]):>13} |")  # fmt: skip
        lines.append(f"| {mode:<15} | {size:>8,} | {label + ' range':<20} | {spans[0]:>8} | {spans[1]:>8} | {'-':>13} |")
    return lines


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else fmt.format(value)


def ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or ours != ours or theirs != theirs or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def table(results: dict[tuple[int, str, str], Result], sizes: list[int], modes: list[str]) -> list[str]:
    lines = [f"| {'mode':<15} | {'services':>8} | {'measure':<20} | {'upstream':>8} | {'ours':>8} | {'ours/upstream':>13} |",
             f"|{'-' * 17}|{'-' * 10}|{'-' * 22}|{'-' * 10}|{'-' * 10}|{'-' * 15}|"]  # fmt: skip
    for mode in modes:
        for size in sizes:
            theirs, ours = results.get((size, mode, "upstream")), results.get((size, mode, "ours"))
            if theirs is None or ours is None:
                continue
            for label, value, fmt in ROWS + DETAIL_ROWS:
                if cell(value(theirs), fmt) == cell(value(ours), fmt) == "-":
                    continue
                if mode == "nftables" and "restore" in label:  # upstream's clean-up of iptables rules
                    continue
                lines.append(f"| {mode:<15} | {size:>8,} | {label:<20} | {cell(value(theirs), fmt):>8} |"
                             f" {cell(value(ours), fmt):>8} | {ratio(value(ours), value(theirs)):>13} |")  # fmt: skip
            lines += spread_lines(mode, size, theirs, ours)
        if len(sizes) >= 2:
            lo, hi = sizes[0], sizes[-1]
            growth = []
            for impl in ("upstream", "ours"):
                a, b = results.get((lo, mode, impl)), results.get((hi, mode, impl))
                growth.append((b.rss - a.rss) / ((hi - lo) / 1000) if a and b else float("nan"))
            lines.append(f"| {mode:<15} | {'per 1k':>8} | {'RSS growth MiB':<20} | {cell(growth[0], '{:.1f}'):>8} |"
                         f" {cell(growth[1], '{:.1f}'):>8} | {ratio(growth[1], growth[0]):>13} |")  # fmt: skip
    return lines


def cold_median(r: Result) -> float:
    """The median of the --repeat rounds' cold starts, or the one cold start."""
    return statistics.median(r.colds) if len(r.colds) > 1 else r.cold


def plot(results: dict[tuple[int, str, str], Result], sizes: list[int], modes: list[str], path: Path) -> None:
    """One panel per measure: the ratio ours / upstream as a bar per mode and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # idle: both near zero; the cold start: the median of the --repeat rounds where there are several
    shown = [("cold start s (median)", cold_median, "") if row[0] == "cold start s" else row
             for row in ROWS if not row[0].endswith("idle")]  # fmt: skip
    columns = 4
    fig, grid = plt.subplots(-(-len(shown) // columns), columns, figsize=(3.6 * columns, 7), sharey=True, squeeze=False)
    axes = list(grid.flat)
    for spare in axes[len(shown) :]:
        spare.set_visible(False)
    width = 0.8 / max(1, len(sizes))
    for ax, (label, value, _) in zip(axes, shown, strict=False):
        for n, size in enumerate(sizes):
            bars = []
            for m, mode in enumerate(modes):
                ours, theirs = results.get((size, mode, "ours")), results.get((size, mode, "upstream"))
                a, b = (value(ours), value(theirs)) if ours and theirs else (None, None)
                bars.append(a / b if a and b and a == a and b == b else 0.0)
                if not bars[-1]:  # no pair measured (e.g. neither converged within --timeout)
                    ax.text(m + n * width, 1.0, "none", rotation=90, fontsize=6, ha="center", va="bottom")
            ax.bar([m + n * width for m in range(len(modes))], bars, width, label=f"{size:,} Services")
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
        ax.set_xticks([m + width * (len(sizes) - 1) / 2 for m in range(len(modes))], modes, fontsize=7)
        ax.set_title(f"{label}", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    for row in grid:
        row[0].set_ylabel("ours / upstream (below 1: ours better)", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle("kubeproxy / upstream kube-proxy v1.37.2, same API server, same mode (bench/vs_upstream.py)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="Services per run (50000 works too: see docs/benchmarks.md)")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle CPU sample")
    parser.add_argument("--churn", type=float, default=20.0, help="seconds of the churn CPU sample")
    parser.add_argument("--churn-rate", type=float, default=5.0, help="EndpointSlice patches per second while churning")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on each wait: the cold start, each change")
    parser.add_argument("--json", type=Path, help="keep the results in this file: a later run (another size) adds to them")
    parser.add_argument("--report-only", action="store_true", help="only the table (and plot) of the --json file's results")
    parser.add_argument("--phases", action="store_true",
                        help="ours runs with bench/coldstart.py's phase marks: where its cold start goes")  # fmt: skip
    parser.add_argument("--tree", type=Path,
                        help="ours from this tree (`git archive HEAD kubeproxy | tar -x -C DIR`), not the checkout")  # fmt: skip
    parser.add_argument("--keep-restores", type=Path, help="keep each iptables-restore input under DIR/<impl>-<mode>/")
    parser.add_argument("--caller-cpu-log", type=Path,
                        help="append each restore's start, end, proxy, proxy CPU ticks before and after to FILE")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="cold starts per proxy and mode, alternating; the table adds their median and range")  # fmt: skip
    parser.add_argument("--plot", type=Path, help="write the ratios' plot here (e.g. docs/vs_upstream.png)")
    args = parser.parse_args()
    if args.report_only:
        report(load_results(args.json), args.modes.split(","), args.plot)
        return
    # A stop (timeout, kill) unwinds the blocks: namespaces, control plane and files are removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: not one run's failure
    if not L.have_root():
        sys.exit("bench/vs_upstream.py needs root: network namespaces and netfilter")
    bin_dir = upstream_bin()
    if bin_dir is None:
        sys.exit("upstream's binaries are not built: run scripts/upstream (or set $KUBEPROXY_UPSTREAM_BIN)")
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    print(f"upstream: {bin_dir}; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results = load_results(args.json) if args.json and args.json.exists() else {}
    indices = itertools.count(1)  # each run's namespace, veth and files
    with tempfile.TemporaryDirectory(prefix="kp-vs-") as tmp_name:
        tmp = Path(tmp_name)
        for size in sizes:
            objs, later = objects(size, args.endpoints, args.changes)
            slices = [o for o in objs if o["kind"] == "EndpointSlice" and not o["metadata"]["name"].startswith("change-")]
            last = (f"svc-{size - 1}", next(o for o in reversed(objs) if o["kind"] == "Service")["spec"]["clusterIP"])
            with L.netns("kpvscp") as control:
                L.ip_batch(control, [f"addr add {CONTROL_IP}/32 dev lo"])
                control.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
                with ControlPlane.start(bin_dir, tmp / f"cp-{size}", ns=control, address=CONTROL_IP) as cp:
                    took = load(cp, objs)
                    print(f"{size:,} Services: control plane up in {cp.startup_seconds:.0f} s, "
                          f"{len(objs):,} objects loaded in {took:.0f} s", flush=True)  # fmt: skip
                    for mode in modes:
                        for round_ in range(args.repeat):
                            # alternating which goes first: neither always meets the other's after-effects
                            for impl in ("upstream", "ours") if round_ % 2 == 0 else ("ours", "upstream"):
                                run = functools.partial(one, cp, control, impl=impl, mode=mode, last=last, later=later,
                                                        slices=slices, args=args, tmp=tmp, cold_only=round_ > 0)  # fmt: skip
                                r = attempt(run, indices, f"  {mode:<15} {impl:<8}")
                                if r is None:
                                    continue
                                base = results[(size, mode, impl)] = r if round_ == 0 else results.get((size, mode, impl), r)
                                base.add_round(r)
                                if args.json:
                                    save(args.json, results)
                                print_run(mode, impl, round_, r)
    print()
    report(results, modes, args.plot)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def attempt(run: Callable[..., Result], indices: Iterator[int], what: str) -> Result | None:
    """`run(index=...)` in a fresh namespace, once more in another if the proxy exited before its
    first rule (e.g. a start-up check that met the xtables lock other namespaces share); None,
    printed, if it failed or timed out: the other runs still count."""
    for tries_left in (1, 0):
        try:
            return run(index=next(indices))
        except EarlyExit as e:
            print(f"{what} {e}{': once more, in a fresh namespace' if tries_left else ''}", flush=True)
        except (SystemExit, Exception) as e:  # one run's failure or timeout
            print(f"{what} failed: {e}", flush=True)
            return None
    return None


def print_run(mode: str, impl: str, round_: int, r: Result) -> None:
    if round_ > 0:
        first = r.first_restore()
        restore = f", 1st restore {first[2] - first[1]:.2f} s wall, {first[5]:.2f} s CPU" if first else ""
        print(f"  {mode:<15} {impl:<8} round {round_ + 1}: cold {r.cold:.2f} s{restore}", flush=True)
        print_phases(r.phases)
        return
    print(f"  {mode:<15} {impl:<8} cold {r.cold:.2f} s,"
          f" full sync {r.full:.2f} s ({r.full_count}) forced {r.resync:.2f} s,"
          f" change p50/p99 {r.p(0.5):.3f}/{r.p(0.99):.3f} s,"
          f" RSS {r.rss:.0f} MiB,"
          f" CPU/min idle {r.idle_cpu:.2f} churn {r.churn_cpu:.2f}", flush=True)  # fmt: skip
    print_phases(r.phases)


def report(results: dict[tuple[int, str, str], Result], modes: list[str], path: Path | None) -> None:
    sizes = sorted({size for size, _, _ in results})
    print("\n".join(table(results, sizes, modes)))
    if path:
        plot(results, sizes, modes, path)
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
