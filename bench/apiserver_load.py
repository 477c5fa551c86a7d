#!/usr/bin/env python3
"""What N nodes' proxies cost upstream's kube-apiserver: ours against upstream's kube-proxy v1.37.2.

Usage: .venv/bin/python bench/apiserver_load.py [--nodes 20] [--services 2000] [--endpoints 3]
                                                [--settle 5] [--timeout 300]

Needs root and upstream's binaries (scripts/upstream; $KUBEPROXY_UPSTREAM_BIN). One run:

    switch (bridge) ── control 10.123.0.1  etcd, kube-apiserver :6443 (lab/control_plane.py)
                   ├── ours    10.123.0.2  one process: N ApiSources (sources/api.py), no kernel rules
                   └── up-i    10.123.1.i  upstream's kube-proxy --proxy-mode iptables, one per node

Every box is a network namespace made here and removed at the end (also on Ctrl-C or SIGTERM).
The server holds --services selector-less Services, each with one EndpointSlice of --endpoints
endpoints (bench/vs_upstream.py's objects, created through the API 8 at a time; the time is
printed). kube-controller-manager is stopped once the objects are in, so the server's counters
move only for the proxies, this script's changes (PATCH, left out of the table) and the server's
own loopback clients (the same for both columns). Each of our simulated nodes is a real
`ApiSource` with its own client from `connect()` (one HTTP connection pool each), its own Node
name and a TokenRequest token for deploy/00-rbac.yaml's ServiceAccount, as `kubeproxy run` builds
it (typed lists, WatchList on); upstream's proxies use the same kubeconfig.

Ours and upstream's are measured one after the other, never together, through the same phases,
each bounded by --timeout:
- cold start: all N start; until every one has its first full state from the server (ours: the
  source's synced signal; upstream's: its Service, EndpointSlice and Node informers' "Caches are
  synced" log lines), not until the rules are in its kernel;
- service change: one Service's port patched, until every node saw it (ours: the event reached
  the sink; upstream's: kubeproxy_sync_proxy_rules_service_changes_total moved);
- slice change: one EndpointSlice's endpoint moved (likewise, endpoint_changes_total);
- apiserver restart (history kept): ControlPlane.restart_apiserver, then one Service and one
  slice change that every node must see (its watches are back);
- history lost: the server stopped, one key outside the API's prefix written to etcd directly,
  etcd compacted to its current revision, the server started, then the two changes as above.
  The new server's watch cache begins at the revision it started at (apiserver
  pkg/storage/cacher/watch_cache_history.go GetIntervalLocked: an older version is 410 Expired),
  so a watch resumes there only from that revision: without the write, a reflector whose last
  event or bookmark was etcd's last revision before the restart resumes, and which ones are
  depends on when the old server's once-a-minute bookmarks fell (before or after its last write,
  during its graceful shutdown), not on the proxy. In a real cluster etcd is written every few
  seconds (leases, Events) while a server restarts: every reflector's history is lost;
- 429 storm: a FlowSchema sends the proxies' ServiceAccount to a PriorityLevel with no seats and
  no queue (APF answers 429 with Retry-After; lab/server_faults.py's apf-429), the server is
  restarted (with the same write to etcd while it is down), the storm lasts --storm seconds,
  then the FlowSchema goes and one Service and one slice change must reach every node. The
  `429s` column counts those answers per node.
After each phase's end condition, --settle seconds more are counted (requests that trail it).

Per phase, from kube-apiserver's /metrics scraped before and after (a restart zeroes them: its
phase counts the new process's values): every request the proxies sent (`sent`: priority and
fairness's dispatched and rejected counters outside the exempt flow schema, counted as a request
starts, whatever it is answered: the authorization filter's 403s are in no other counter);
requests by verb (apiserver_request_total, counted when a request ends: a watch still open, or
a request refused by authentication or authorization, is not in it) for services, endpointslices, nodes and
servicecidrs, watch-lists (apiserver_watch_list_duration_seconds, counted when the initial
state has been sent), watches open at the phase's end (apiserver_longrunning_requests), response
bytes (apiserver_response_sizes_sum, also at a request's end: the state a watch-list streams is
in the watch bytes instead),
watch events and their bytes (apiserver_watch_events_total / _sizes_sum), lists served from the
watch cache (apiserver_cache_list_total) and from etcd (apiserver_storage_list_duration_seconds
count), the server's CPU seconds (process_cpu_seconds_total) and the connections established
at :6443 when the phase ends (ss in the control namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_upstream import NAMESPACE, collection, load, objects  # noqa: E402

from kubeproxy.lab import netns as L  # noqa: E402
from kubeproxy.lab.control_plane import ControlPlane, upstream_bin  # noqa: E402
from kubeproxy.lab.kubelet import LabKubelet, NodeInfo  # noqa: E402
from kubeproxy.lab.server_faults import SERVICE_ACCOUNT, STARVED, _starved  # noqa: E402
from kubeproxy.lab.side_by_side import RBAC_MANIFEST, _attach  # noqa: E402
from kubeproxy.model.options import NFACCT_COUNTERS  # noqa: E402

UNDERLAY = ipaddress.ip_network("10.123.0.0/16")
CONTROL_IP = str(UNDERLAY[1])
OURS_IP = str(UNDERLAY[2])
RESOURCES = ("services", "endpointslices", "nodes", "servicecidrs")
PROXY_VERBS = ("LIST", "WATCH", "GET")  # the proxies' verbs; this script's own writes are others
METRICS = "127.0.0.1:10249"
APF_COUNTERS = ("apiserver_flowcontrol_dispatched_requests_total", "apiserver_flowcontrol_rejected_requests_total")
POLL = 0.2
UNWATCHED = b"/apiserver-load/unwatched"  # an etcd key outside kube-apiserver's /registry prefix
FLEET = 5000
SERVICE_CHANGES = "kubeproxy_sync_proxy_rules_service_changes_total"
ENDPOINT_CHANGES = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
# client-go's shared_informer.go logs these once each informer has its first list.
SYNCED_LINES = tuple(f'"Caches are synced" controller="{c} config"' for c in ("service", "endpoint slice", "node"))


def node_name(index: int) -> str:
    return f"node-{index + 1}"


# ---- the server's metrics ------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)")
_LABEL = re.compile(r'([a-zA-Z_]+)="([^"]*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            samples.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return samples


@dataclass
class Cost:
    """What one phase cost the server: counters (the `after - before` of a scrape) and connections."""

    requests: Counter[str] = field(default_factory=Counter)  # by verb
    # Every request of the proxies that reached priority and fairness, answered or not: those its
    # filters refuse after it (a 403 from authorization) are in no other counter, and a watch is
    # counted as it starts. Everyone else here is in the exempt flow schema (system:masters).
    sent: float = 0.0
    rejected: float = 0.0  # answered 429 (any verb)
    response_bytes: float = 0.0
    watch_events: float = 0.0
    watch_lists: float = 0.0  # watches that streamed the state (sendInitialEvents), counted as it ends
    watches_open: float = 0.0  # a gauge: the value when the phase ends
    watch_bytes: float = 0.0
    cache_lists: float = 0.0
    etcd_lists: float = 0.0
    cpu: float = 0.0
    connections: int = 0
    seconds: float = 0.0

    @classmethod
    def of(cls, text: str) -> Cost:
        cost = cls()
        for name, labels, value in parse_metrics(text):
            resource = labels.get("resource", "")
            if name == "process_cpu_seconds_total":
                cost.cpu += value
            elif name in APF_COUNTERS and labels.get("flow_schema") != "exempt":
                cost.sent += value
            elif resource not in RESOURCES:
                continue
            elif name == "apiserver_request_total" and labels.get("verb") in PROXY_VERBS:
                cost.requests[labels["verb"]] += int(value)
                cost.rejected += value if labels.get("code") == "429" else 0.0
            elif name == "apiserver_response_sizes_sum" and labels.get("verb") in PROXY_VERBS:
                cost.response_bytes += value
            elif name == "apiserver_watch_list_duration_seconds_count":
                cost.watch_lists += value
            elif name == "apiserver_longrunning_requests" and labels.get("verb") == "WATCH":
                cost.watches_open += value
            elif name == "apiserver_watch_events_total":
                cost.watch_events += value
            elif name == "apiserver_watch_events_sizes_sum":
                cost.watch_bytes += value
            elif name == "apiserver_cache_list_total":
                cost.cache_lists += value
            elif name == "apiserver_storage_list_duration_seconds_count":
                cost.etcd_lists += value
        return cost

    def minus(self, before: Cost) -> Cost:
        return Cost(self.requests - before.requests, self.sent - before.sent, self.rejected - before.rejected,
                    self.response_bytes - before.response_bytes,
                    self.watch_events - before.watch_events, self.watch_lists - before.watch_lists, self.watches_open,
                    self.watch_bytes - before.watch_bytes,
                    self.cache_lists - before.cache_lists, self.etcd_lists - before.etcd_lists,
                    self.cpu - before.cpu)  # fmt: skip

    def row(self, per: int) -> dict[str, float]:
        return {
            "requests": sum(self.requests.values()) / per,
            "sent": self.sent / per,
            "lists": self.requests["LIST"] / per,
            "watches": self.requests["WATCH"] / per,
            "429s": self.rejected / per,
            "KB sent": self.response_bytes / 1024 / per,
            "watch-lists": self.watch_lists / per,
            "watches open": self.watches_open / per,
            "watch events": self.watch_events / per,
            "watch KB": self.watch_bytes / 1024 / per,
            "cache lists": self.cache_lists / per,
            "etcd lists": self.etcd_lists / per,
            "CPU ms": self.cpu * 1000 / per,
            "conns": self.connections / per,
        }


@dataclass
class Server:
    cp: ControlPlane
    control: L.NetNS

    def scrape(self) -> Cost:
        answer = self.cp.api.get("/metrics")
        answer.raise_for_status()
        return Cost.of(answer.text)

    def connections(self) -> int:
        out = self.control.run(["ss", "-Htn", "state", "established", "( sport = :6443 )"]).stdout
        # The peer is the last column; the control plane's own clients (kubectl proxy, the
        # server's loopback) connect from inside its namespace.
        peers = [line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()]
        return sum(1 for peer in peers if peer not in (CONTROL_IP, "127.0.0.1", "[::1]"))

    def patch(self, path: str, body: dict[str, Any]) -> None:
        answer = self.cp.api.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
        if answer.status_code >= 300:
            raise SystemExit(f"PATCH {path}: {answer.status_code} {answer.text[:300]}")


# ---- the fleets ----------------------------------------------------------------------------


class Fleet(Protocol):
    """N proxies of one kind: started, awaited, stopped."""

    @property
    def name(self) -> str: ...

    def start(self) -> None: ...
    def synced(self) -> set[int]: ...
    def mark(self) -> None: ...
    def saw(self, kind: str, name: str) -> set[int]: ...
    def stop(self) -> None: ...


@dataclass
class OursFleet:
    """The worker process (this script with --worker) in the `ours` namespace; it prints one line
    per node synced and per event a synced node receives."""

    ns: L.NetNS
    kubeconfig: Path
    nodes: int
    log: Path
    tag_nodes: bool = False
    name: str = "ours"
    proc: subprocess.Popen[str] | None = None
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    _synced: set[int] = field(default_factory=set)
    _seen: set[tuple[int, str, str]] = field(default_factory=set)

    def start(self) -> None:
        self._synced.clear()
        with open(self.log, "a") as log:
            argv = [sys.executable, __file__, "--worker", str(self.kubeconfig), "--nodes", str(self.nodes)]
            self.proc = self.ns.popen([*argv, "--tag-nodes"] if self.tag_nodes else argv, stdout=subprocess.PIPE, stderr=log)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line)

    def _drain(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise SystemExit(f"our worker exited with status {self.proc.returncode}: see {self.log}")
        while True:
            try:
                words = self.lines.get_nowait().split()
            except queue.Empty:
                return
            if words[0] == "synced":
                self._synced.add(int(words[1]))
            elif words[0] == "seen":
                self._seen.add((int(words[1]), words[2], words[3]))

    def synced(self) -> set[int]:
        self._drain()
        return set(self._synced)

    def mark(self) -> None:
        self._drain()
        self._seen.clear()

    def saw(self, kind: str, name: str) -> set[int]:
        self._drain()
        return {i for i, k, n in self._seen if k == kind and n == name}

    def stop(self) -> None:
        if self.proc is not None:
            L.stop_process(self.proc, 15)
            self.proc = None


@dataclass
class UpstreamFleet:
    """Upstream's kube-proxy, one per namespace, read through its metrics port."""

    namespaces: list[L.NetNS]
    binary: Path
    kubeconfig: Path
    logs: Path
    name: str = "upstream"
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    _marks: list[dict[str, float]] = field(default_factory=list)

    def start(self) -> None:
        for index, ns in enumerate(self.namespaces):
            # As side_by_side.py: counters made beforehand, so its two proxiers do not race to.
            for counter in NFACCT_COUNTERS:
                ns.run(["nfacct", "add", counter], check=False)
            argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--hostname-override", node_name(index),
                    "--proxy-mode", "iptables", "--cluster-cidr", "10.244.0.0/16", "--metrics-bind-address", METRICS,
                    "--healthz-bind-address", "127.0.0.1:10256", "--conntrack-max-per-core", "0"]  # fmt: skip
            with open(self.logs / f"upstream-{index}.log", "w") as log:
                self.procs.append(ns.popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def _metrics(self, index: int) -> dict[str, float]:
        if self.procs[index].poll() is not None:
            raise SystemExit(f"upstream's kube-proxy {index} exited: see {self.logs / f'upstream-{index}.log'}")
        out = self.namespaces[index].run(["curl", "-sf", "-m", "5", f"http://{METRICS}/metrics"], check=False).stdout
        found: dict[str, float] = {}
        for name, _labels, value in parse_metrics(out):
            if name in (SERVICE_CHANGES, ENDPOINT_CHANGES):
                found[name] = value
        return found

    def synced(self) -> set[int]:
        # Its informers' "Caches are synced" lines: the first full state as the API delivered it
        # (the first sync's timestamp metric waits for iptables-restore too, minutes for 20
        # proxies' 22k rules each on 2 cores, which is not the server's cost).
        return {i for i in range(len(self.procs)) if all(line in self._log(i) for line in SYNCED_LINES)}

    def _log(self, index: int) -> str:
        if self.procs[index].poll() is not None:
            raise SystemExit(f"upstream's kube-proxy {index} exited: see {self.logs / f'upstream-{index}.log'}")
        return (self.logs / f"upstream-{index}.log").read_text(errors="replace")

    def mark(self) -> None:
        self._marks = [self._metrics(i) for i in range(len(self.procs))]

    def saw(self, kind: str, name: str) -> set[int]:
        metric = SERVICE_CHANGES if kind == "Service" else ENDPOINT_CHANGES
        return {i for i in range(len(self.procs)) if self._metrics(i).get(metric, 0) > self._marks[i].get(metric, 0)}

    def stop(self) -> None:
        for proc in self.procs:
            L.stop_process(proc, 15)
        self.procs.clear()


# ---- phases --------------------------------------------------------------------------------


def await_all(what: str, found: Callable[[], set[int]], nodes: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(found()) < nodes:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {len(found())} of {nodes} nodes within {timeout:.0f} s")
        time.sleep(POLL)  # another process's progress, read by polling: no event to wait for here


@dataclass
class Changes:
    server: Server
    fleet: Fleet
    nodes: int
    timeout: float
    flip: int = 0  # each change writes a value no earlier change wrote: a no-op patch sends no event

    def service(self) -> None:
        self.flip += 1
        self.fleet.mark()
        self.server.patch(f"/api/v1/namespaces/{NAMESPACE}/services/svc-0",
                          {"spec": {"ports": [{"name": "http", "port": 1000 + self.flip, "protocol": "TCP"}]}})  # fmt: skip
        await_all("the Service change", lambda: self.fleet.saw("Service", "svc-0"), self.nodes, self.timeout)

    def slice(self) -> None:
        self.flip += 1
        self.fleet.mark()
        path = collection({"kind": "EndpointSlice"}) + "/svc-1-1"
        self.server.patch(path, {"endpoints": [{"addresses": [f"10.250.{self.flip // 250 % 250}.{self.flip % 250 + 1}"],
                                                "nodeName": "node-0"}]})  # fmt: skip
        await_all("the EndpointSlice change", lambda: self.fleet.saw("EndpointSlice", "svc-1-1"), self.nodes, self.timeout)


def run_phases(server: Server, fleet: Fleet, args: argparse.Namespace) -> dict[str, Cost]:
    changes = Changes(server, fleet, args.nodes, args.timeout)

    def cold() -> None:
        fleet.start()
        await_all("cold start", fleet.synced, args.nodes, args.timeout)

    def restart(lose_history: bool = False) -> None:
        # Killed and reaped within a minute: on a loaded machine a SIGKILLed server can take >10 s.
        server.cp.stop_apiserver(timeout=60)
        if lose_history:
            server.cp.compact_etcd(server.cp.write_etcd(UNWATCHED, str(time.time_ns()).encode()))
        server.cp.start_apiserver(timeout=args.timeout)
        changes.service()
        changes.slice()

    def history_lost() -> None:
        restart(lose_history=True)

    def storm() -> None:
        cp = server.cp
        cp.run_kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": _starved(*SERVICE_ACCOUNT)})
        )
        cp.stop_apiserver(timeout=60)
        cp.write_etcd(UNWATCHED, str(time.time_ns()).encode())  # as above: no watch resumes by chance
        cp.start_apiserver(timeout=args.timeout)
        time.sleep(args.storm)  # the storm's length: every proxy request meanwhile is answered 429
        cp.run_kubectl("delete", "flowschema", STARVED)
        cp.run_kubectl("delete", "prioritylevelconfiguration", STARVED)
        changes.service()
        changes.slice()

    phases: list[tuple[str, Callable[[], None], bool]] = [
        ("cold start", cold, False), ("service change", changes.service, False),
        ("slice change", changes.slice, False), ("restart, history kept", restart, True),
        ("restart, history lost", history_lost, True), ("429 storm", storm, True),
    ]  # fmt: skip
    costs: dict[str, Cost] = {}
    try:
        for name, act, restarts in phases:
            if name != "cold start" and args.phases and not any(word in name for word in args.phases):
                continue
            before = server.scrape()
            began = time.monotonic()
            act()
            took = time.monotonic() - began
            time.sleep(args.settle)  # a counting window for requests that trail the end condition
            cost = server.scrape() if restarts else server.scrape().minus(before)
            cost.connections = server.connections()
            cost.seconds = took
            costs[name] = cost
            print(f"  {fleet.name:<8} {name:<22} {took:6.1f} s, {cost.sent:5.0f} sent, "
                  f"{sum(cost.requests.values()):5.0f} requests, "
                  f"{cost.response_bytes / 2**20:7.1f} MiB, {cost.connections} connections", flush=True)  # fmt: skip
    finally:
        fleet.stop()
    return costs


# ---- the report ----------------------------------------------------------------------------

COLUMNS = ("sent", "requests", "lists", "watches", "429s", "watch-lists", "watches open", "KB sent", "watch events", "watch KB",
           "cache lists", "etcd lists", "CPU ms", "conns")  # fmt: skip


def report(results: dict[str, dict[str, Cost]], nodes: int) -> list[str]:
    lines = [f"Per node (the server's counters / {nodes}); ratio = ours / upstream (below 1: ours costs less)", ""]
    lines.append("| phase | proxy | seconds | " + " | ".join(COLUMNS) + " |")
    lines.append("|---|---|---:|" + "---:|" * len(COLUMNS))
    for phase in results.get("ours", results.get("upstream", {})):
        rows = {impl: costs[phase] for impl, costs in results.items() if phase in costs}
        for impl, cost in rows.items():
            row = cost.row(nodes)
            cells = [f"{row[c]:.2f}" if row[c] < 100 else f"{row[c]:.0f}" for c in COLUMNS]
            lines.append(f"| {phase} | {impl} | {cost.seconds:.1f} | " + " | ".join(cells) + " |")
        if len(rows) == 2:
            ours, theirs = rows["ours"].row(nodes), rows["upstream"].row(nodes)
            cells = [f"{ours[c] / theirs[c]:.2f}" if theirs[c] else ("=" if not ours[c] else "∞") for c in COLUMNS]
            lines.append(f"| {phase} | ratio | | " + " | ".join(cells) + " |")
    lines += ["", f"At {FLEET:,} nodes (per node x {FLEET:,}): assumes the cost is linear in nodes, the same objects "
              "(see the header), no other clients; a real server's watch cache and APF make etcd lists and "
              "queueing grow faster than linearly.", ""]  # fmt: skip
    for impl, costs in results.items():
        for phase in ("cold start", "restart, history lost"):
            if phase in costs:
                row = costs[phase].row(nodes)
                lines.append(f"- {impl}, {phase}: {row['sent'] * FLEET:,.0f} requests sent, "
                             f"{row['KB sent'] * FLEET / 2**20:,.1f} GiB sent, "
                             f"{row['etcd lists'] * FLEET:,.0f} etcd lists, {row['CPU ms'] * FLEET / 1000:,.0f} server CPU s, "
                             f"{row['conns'] * FLEET:,.0f} connections")  # fmt: skip
    return lines


PLOTTED = ("sent", "watch KB", "CPU ms")  # per node, one panel each


def plot(results: dict[str, dict[str, Cost]], nodes: int, path: Path) -> None:
    """A PNG of the PLOTTED columns per node, phase by phase, ours beside upstream's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(next(iter(results.values()), {}))
    figure, axes = plt.subplots(1, len(PLOTTED), figsize=(5 * len(PLOTTED), 4.5))
    width = 0.8 / max(1, len(results))
    for ax, column in zip(axes, PLOTTED, strict=True):
        for offset, (impl, costs) in enumerate(results.items()):
            values = [costs[phase].row(nodes)[column] if phase in costs else 0.0 for phase in phases]
            ax.bar([i + offset * width for i in range(len(phases))], values, width, label=impl)
        ax.set_title(f"{column} per node")
        ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(phases))], phases, rotation=30, ha="right")
        ax.set_yscale("symlog", linthresh=1)
    axes[0].legend()
    figure.suptitle(f"What {nodes} nodes' proxies cost kube-apiserver v1.37.2, per node (bench/apiserver_load.py)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


# ---- the bed -------------------------------------------------------------------------------


def audit_flags(log: Path, workdir: Path) -> list[str]:
    """kube-apiserver's flags for an audit log of the proxies' requests at Metadata level (verb,
    URI with its query, response code, source address, User-Agent), every stage (a watch's code
    is in its ResponseStarted stage); a restarted server appends to the same file."""
    policy = workdir / "audit-policy.yaml"
    namespace, name = SERVICE_ACCOUNT
    policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
        {"level": "Metadata", "users": [f"system:serviceaccount:{namespace}:{name}"]}, {"level": "None"}]}))  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    return ["--audit-policy-file", str(policy), "--audit-log-path", str(log.resolve()), "--audit-log-maxsize", "0"]


@contextmanager
def bed(bin_dir: Path, args: argparse.Namespace, workdir: Path) -> Iterator[tuple[Server, L.NetNS, list[L.NetNS]]]:
    with ExitStack() as stack:
        switch = stack.enter_context(L.netns("kpalsw"))
        control = stack.enter_context(L.netns("kpalcp"))
        L.ip_batch(switch, ["link add br0 type bridge", "link set br0 up"])
        switch.run(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"], check=False)
        _attach(switch, control, f"{CONTROL_IP}/{UNDERLAY.prefixlen}", 0)
        ours = stack.enter_context(L.netns("kpalours"))
        _attach(switch, ours, f"{OURS_IP}/{UNDERLAY.prefixlen}", 1)
        upstream = []
        for index in range(args.nodes):
            ns = stack.enter_context(L.netns("kpalup"))
            _attach(switch, ns, f"{UNDERLAY[256 + index + 1]}/{UNDERLAY.prefixlen}", index + 2)
            upstream.append(ns)
        flags = audit_flags(args.audit, workdir) if args.audit else []
        cp = stack.enter_context(ControlPlane.start(bin_dir, workdir / "control-plane", ns=control, address=CONTROL_IP,
                                                    apiserver_flags=flags, timeout=args.timeout))  # fmt: skip
        cp.run_kubectl("apply", "-f", str(RBAC_MANIFEST))
        objs, _ = objects(args.services, args.endpoints, 0)
        took = load(cp, objs)
        print(f"control plane up in {cp.startup_seconds:.0f} s; {len(objs):,} objects loaded in {took:.1f} s "
              f"({len(objs) / took:.0f}/s, through the API, 8 at a time)", flush=True)  # fmt: skip
        kubelet = LabKubelet(cp.api)
        for index in range(args.nodes):
            kubelet.register_node(NodeInfo(node_name(index), (str(UNDERLAY[256 + index + 1]),), (f"10.244.{index + 1}.0/24",)))
        # The controllers' own watches and resyncs would count as the proxies'.
        L.stop_process(cp.processes.pop("kube-controller-manager"), 10)
        yield Server(cp, control), ours, upstream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--services", type=int, default=2000)
    parser.add_argument("--endpoints", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds counted after each phase's end condition")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on each phase's wait")
    parser.add_argument("--storm", type=float, default=30.0, help="seconds of the 429 storm phase")
    parser.add_argument("--fleets", choices=("both", "ours", "upstream"), default="both",
                        help="measure ours, upstream's or both (the other column is then left out)")  # fmt: skip
    parser.add_argument("--logs", type=Path, help="keep the proxies' and the control plane's logs in this directory")
    parser.add_argument("--phases", nargs="*", default=[],
                        help="only the phases whose names hold one of these words (the cold start always runs)")  # fmt: skip
    parser.add_argument("--audit", type=Path,
                        help="kube-apiserver writes an audit log (Metadata level, the proxies' requests only) to this "
                             "file; each of our simulated nodes names itself in its User-Agent")  # fmt: skip
    parser.add_argument("--plot", type=Path, help="also write the requests, watch KB and CPU per node as a PNG here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # the ours process, given its kubeconfig
    parser.add_argument("--tag-nodes", action="store_true", help=argparse.SUPPRESS)  # the worker's User-Agents
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker, args.nodes, args.tag_nodes))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not L.have_root():
        sys.exit("bench/apiserver_load.py needs root: network namespaces")
    bin_dir = upstream_bin()
    if bin_dir is None:
        sys.exit("upstream's binaries are not built: run scripts/upstream (or set $KUBEPROXY_UPSTREAM_BIN)")
    began = time.monotonic()
    print(f"{args.nodes} nodes, {args.services:,} Services x {args.endpoints} endpoints; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="kp-apiserver-load-"))
    results: dict[str, dict[str, Cost]] = {}
    try:
        with bed(bin_dir, args, workdir) as (server, ours_ns, upstream_ns):
            kubeconfig = server.cp.token_kubeconfig(workdir / "kubeproxy.kubeconfig", "kube-system", "kubeproxy")
            fleets: Sequence[Fleet] = (
                OursFleet(ours_ns, kubeconfig, args.nodes, workdir / "ours.log", tag_nodes=args.audit is not None),
                UpstreamFleet(upstream_ns, bin_dir / "kube-proxy", kubeconfig, workdir),
            )
            for fleet in fleets:
                if args.fleets not in ("both", fleet.name):
                    continue
                try:
                    results[fleet.name] = run_phases(server, fleet, args)
                except SystemExit as e:
                    print(f"  {fleet.name} failed: {e}", flush=True)
                    shutil.copytree(workdir, Path(tempfile.gettempdir()) / f"kp-apiserver-load-failed-{os.getpid()}",
                                    ignore=shutil.ignore_patterns("etcd", "*.sock", "pki"), dirs_exist_ok=True)  # fmt: skip
    finally:
        if args.logs:
            shutil.copytree(workdir, args.logs, ignore=shutil.ignore_patterns("etcd", "*.sock", "pki"), dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print("\n".join(report(results, args.nodes)))
    if args.plot and results:
        plot(results, args.nodes, args.plot)
        print(f"plot: {args.plot}")
    print(f"\nwall time {time.monotonic() - began:.0f} s; load average at end {os.getloadavg()[0]:.1f}")


# ---- the worker: N simulated nodes in one process ------------------------------------------


async def worker(kubeconfig: Path, nodes: int, tag_nodes: bool) -> None:
    from kubeproxy.sources.api import ApiSource
    from kubeproxy.sources.connection import USER_AGENT, connect, load_config
    from kubeproxy.sources.events import WatchEvent
    from kubeproxy.sources.protobuf import MEDIA_TYPE as PROTOBUF

    config = load_config(kubeconfig)
    # Tagged, an audit log tells the simulated nodes apart (they share one address).
    clients = [connect(config, user_agent=f"{USER_AGENT} {node_name(i)}" if tag_nodes else USER_AGENT) for i in range(nodes)]
    sources: list[ApiSource] = []

    def sink_of(index: int) -> tuple[Callable[[WatchEvent], None], Callable[[Sequence[WatchEvent]], None]]:
        def one(event: WatchEvent) -> None:
            if sources[index].synced:  # the first state's events are not news
                print("seen", index, event.kind, event.name, flush=True)

        def batch(events: Sequence[WatchEvent]) -> None:
            for event in events:
                one(event)

        return one, batch

    for index, client in enumerate(clients):
        sink, batch = sink_of(index)
        # As the kube-proxy command configures it: upstream's default content type, protobuf.
        sources.append(ApiSource(client, node_name(index), sink, batch_sink=batch, typed_lists=True, content_type=PROTOBUF))

    async def announce(index: int) -> None:
        await sources[index].wait_synced()
        print("synced", index, flush=True)

    try:
        async with asyncio.TaskGroup() as group:
            for index, source in enumerate(sources):
                group.create_task(source.run())
                group.create_task(announce(index))
    finally:
        for client in clients:
            await client.aclose()


if __name__ == "__main__":
    main()
