"""Faults of the real API server, given to upstream's kube-proxy and ours side by side
(lab/side_by_side.py): for each, whether a node's rules lost a Service or an endpoint while the
server was away, how long each proxy took to take in a change once the fault ended, what shows
that the fault really happened, and what differs between the two nodes' rules afterwards.

    with FaultBed.build(upstream_bin()) as faults:    # a bed of its own; FaultBed.on(bed): a shared one
        result = faults.run("etcd-compacted")     # a FaultResult

None of the faults needs a control plane of its own: each ends with the server as the bed had it
(kube-apiserver's flags, the FlowSchemas, the proxies' ClusterRole and ServiceAccount), also when
it fails midway. A restart or an etcd compaction leaves nothing behind that a later user sees:
clients that relist (the controller manager, the proxies, `kubectl`) meet a server as after any
restart.

The faults (`FAULTS`), each cutting the proxies' watches by restarting kube-apiserver where the
fault alone would leave an established watch untouched (RBAC, APF and authentication are
checked when a request starts, not on a watch already streaming):

- apiserver-restart: stopped and started again; a Service and its pod are added right after;
- etcd-compacted: stopped, etcd compacted at its newest revision through its HTTP/JSON
  gateway, started again (its watch cache starts past the proxies' resourceVersions): 410;
- apf-429: a FlowSchema for the proxies' ServiceAccount sends them to a PriorityLevel with no
  seats and no queues, so every request is answered 429 with Retry-After; then removed;
- rbac-denied: the proxies' ClusterRole loses endpointslices; then restored;
- token-rotated: the ServiceAccount deleted and made again (its old tokens no longer
  authenticate: 401), then a new TokenRequest token written over the proxies' token file;
- watch-list-off / watch-list-on: kube-apiserver with --feature-gates=WatchList=false, then
  without it, both proxies started again against each (lists, then streamed lists).

Times are measured from the end of the fault (or the proxies' start) to the first sample of the
node's iptables-save that holds the change; samples are taken every SAMPLE_INTERVAL seconds.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.lab import builders, rules_compare
from kubeproxy.lab.cluster import HTTP_GET, ClusterError
from kubeproxy.lab.control_plane import kubeconfig
from kubeproxy.lab.side_by_side import (
    CLUSTER_CIDR,
    METRICS_BIND,
    OURS_NODE,
    POD_HOST_NODE,
    RBAC_MANIFEST,
    UPSTREAM_NODE,
    SideBySide,
)

FAULTS = (
    "apiserver-restart",
    "etcd-compacted",
    "apf-429",
    "rbac-denied",
    "token-rotated",
    "watch-list-off",
    "watch-list-on",
)
PROXY_NODES = (UPSTREAM_NODE, OURS_NODE)
SERVICE_ACCOUNT = ("kube-system", "kubeproxy")
FORBIDDEN_SLICES = r"endpointslices\S* is forbidden"  # a 403's message for them, in either proxy's log
OWN_SERVICE = "default/kubernetes:https"  # the API server's own Service
STARVED = "kubeproxy-starved"  # the FlowSchema and PriorityLevelConfiguration of apf-429
SAMPLE_INTERVAL = 0.1
CONVERGE_TIMEOUT = 150.0
EVIDENCE_TIMEOUT = 150.0  # a retry after a long outage may come 30-60 s later (the back-off at its cap)

Expected = dict[str, set[tuple[str, bool, bool, bool]]]


@dataclass(frozen=True)
class Sample:
    at: float  # wall-clock time the dump was taken
    services: frozenset[str]  # namespace/name:port of the Services KUBE-SERVICES sends somewhere
    destinations: frozenset[str]  # pod addresses the rules DNAT to


def sample_of(dump: str, at: float) -> Sample:
    nat = dict(rules_compare.parse(dump).get("nat", rules_compare.Table("nat", (), ())).rules)
    services = {rules_compare.rule_service(rule) for rule in nat.get("KUBE-SERVICES", ())}
    pods = [ipaddress.ip_network(cidr) for cidr in CLUSTER_CIDR.split(",")]
    ips = {ep.rsplit(":", 1)[0].strip("[]") for ep in rules_compare.endpoint_chains(dump).values()}
    return Sample(
        at,
        frozenset(s for s in services if s),
        frozenset(ip for ip in ips if any(ipaddress.ip_address(ip) in net for net in pods)),
    )


@dataclass
class RuleWatch:
    """Samples both proxy nodes' IPv4 rules in a thread until stopped: what each held over time."""

    bed: SideBySide
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {n: [] for n in PROXY_NODES})
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in PROXY_NODES:
                at = time.time()
                proc = self.bed.nodes[node].ns.run(["iptables-save", "-t", "nat"], check=False)
                if proc.returncode != 0:
                    self.errors.append(f"{node}: iptables-save: {proc.stderr.strip()}")
                    continue
                with self._changed:
                    self.samples[node].append(sample_of(proc.stdout, at))
                    self._changed.notify_all()
            self._stop.wait(SAMPLE_INTERVAL)

    @contextmanager
    def running(self) -> Iterator[RuleWatch]:
        thread = threading.Thread(target=self._run, name="rule-watch", daemon=True)
        thread.start()
        try:
            self.await_first()
            yield self
        finally:
            self._stop.set()
            thread.join(10)

    def await_first(self) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: all(self.samples.values()), timeout=30):
                raise ClusterError(f"no iptables-save sample of both nodes in 30 s: {self.errors[-3:]}")

    def lost(self) -> list[str]:
        """Every sample that misses a Service or a pod address the node's first sample had. The
        `kubernetes` Service is left out: a stopping kube-apiserver takes its own address out of
        that Service's endpoints, so both proxies rightly drop it until the server is back."""
        out: list[str] = []
        for node, samples in self.samples.items():
            first = samples[0]
            kept = first.services - {OWN_SERVICE}
            for sample in samples[1:]:
                gone = sorted(kept - sample.services) + sorted(first.destinations - sample.destinations)
                if gone:
                    out.append(f"{node} at +{sample.at - first.at:.1f} s lacked {', '.join(gone)}")
        return out

    def await_holding(self, service: str, ip: str, since: float, timeout: float) -> dict[str, float | None]:
        """Per node: seconds from `since` to its first sample holding `service` with a DNAT to
        `ip` (None if none did within `timeout`)."""

        def found() -> dict[str, float | None]:
            return {
                node: next(
                    (s.at - since for s in samples if s.at >= since and service in s.services and ip in s.destinations), None
                )
                for node, samples in self.samples.items()
            }

        with self._changed:
            self._changed.wait_for(lambda: all(v is not None for v in found().values()), timeout=timeout)
            return found()


@dataclass
class FaultResult:
    name: str
    seconds: dict[str, float | None]  # node -> seconds to take in the change (None: not within the timeout)
    lost: list[str]  # samples during the fault that missed a Service or endpoint the node had
    differences: list[str]  # between the two nodes' rules at the end ([]: equal to upstream's)
    evidence: list[str]  # what shows the fault happened (log lines, answers)
    counts: dict[str, int] = field(default_factory=dict)  # what a fault counted (requests, log lines)


@dataclass
class FaultBed:
    bed: SideBySide
    token_file: Path
    proxy_kubeconfig: Path
    selectors: dict[str, str] = field(default_factory=dict)  # Service -> the app its selector picks
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod -> (ip, app)
    counts: dict[str, int] = field(default_factory=dict)  # of the fault running
    _next_ip: int = 100
    # What puts the control plane back as the bed had it, by what a fault changed: run when the
    # fault ends it, or (a fault that failed midway, a server left with other flags) by `on`.
    _undo: dict[str, Callable[[], object]] = field(default_factory=dict)

    @classmethod
    @contextmanager
    def build(cls, bin_dir: Path) -> Iterator[FaultBed]:
        """A side-by-side bed of its own, given the faults (bench/faults_vs_upstream.py)."""
        with SideBySide.build(bin_dir) as bed, cls.on(bed) as faults:
            yield faults

    @classmethod
    @contextmanager
    def on(cls, bed: SideBySide) -> Iterator[FaultBed]:
        """The faults on a side-by-side bed another user may share: cleared first; each fault
        leaves the control plane as it found it, also when it fails (`run`), and the proxies
        are stopped when the block ends."""
        bed.clear()
        token_file = bed.workdir / "kubeproxy.token"
        config = bed.workdir / "kubeproxy-tokenfile.kubeconfig"
        config.write_text(kubeconfig(bed.cp.server, bed.cp.pki.data("ca.crt"), {"tokenFile": str(token_file)}))
        faults = cls(bed, token_file, config)
        try:
            faults.write_token()
            for name in ("web-0", "web-1"):
                faults.add_pod(name, "web")
            bed.apply(builders.service("web", "10.96.0.10", [builders.Port("http", 80, 8080)], spec={"selector": {"app": "web"}}))
            faults.selectors["web"] = "web"
            bed.start_proxies(faults.proxy_kubeconfig)
            diffs = faults.converged()
            if diffs:
                raise ClusterError("the proxies' first syncs differ:\n" + "\n".join(diffs))
            yield faults
        finally:
            try:
                faults.undo_all()
            finally:
                bed.stop_proxies()

    # ---- the cluster's state ------------------------------------------------------------------

    def add_pod(self, name: str, app: str) -> str:
        pod = self.bed.add_pod(name, POD_HOST_NODE, {"app": app})
        self.pods[name] = (pod.info.ips[0], app)
        return pod.info.ips[0]

    def add_service(self, name: str) -> tuple[str, str]:
        """A Service `name` and one pod of it (on the node without a proxy): the change a fault
        is followed by. Returns (the Service's port as rules name it, the pod's address)."""
        ip = self.add_pod(f"{name}-0", name)
        self._next_ip += 1
        cluster_ip = f"10.96.1.{self._next_ip}"
        self.bed.apply(builders.service(name, cluster_ip, [builders.Port("http", 80, 8080)], spec={"selector": {"app": name}}))
        self.selectors[name] = name
        return f"default/{name}:http", ip

    def expected(self) -> Expected:
        return {svc: {(ip, True, True, False) for ip, a in self.pods.values() if a == app} for svc, app in self.selectors.items()}

    def converged(self) -> list[str]:
        return self.bed.await_step(self.expected(), families=("IPv4", "IPv6"), timeout=CONVERGE_TIMEOUT)

    def write_token(self) -> str:
        """A new TokenRequest token for the proxies' ServiceAccount, put in place of the token
        file at once (written beside it, then renamed, as the kubelet's projected volume does)."""
        namespace, name = SERVICE_ACCOUNT
        token = self.bed.cp.run_kubectl("create", "token", name, "-n", namespace, "--duration", "2h").stdout.strip()
        partial = self.token_file.with_suffix(".new")
        partial.write_text(token)
        os.replace(partial, self.token_file)
        return token

    def undo_all(self) -> None:
        """Every undo left, each tried whatever the others do; a ClusterError names those that failed."""
        failed: list[str] = []
        while self._undo:
            change, undo = self._undo.popitem()
            try:
                undo()
            except Exception as exc:  # a server that is down refuses each; the others still run
                failed.append(f"{change}: {exc}")
        if failed:
            raise ClusterError("the control plane was not put back: " + "; ".join(failed))

    def _end(self, change: str) -> None:
        self._undo.pop(change)()

    # ---- what shows a fault ------------------------------------------------------------------

    def metrics(self, node: str) -> str:
        url = f"http://{METRICS_BIND}/metrics"
        proc = self.bed.nodes[node].ns.run([sys.executable, "-c", HTTP_GET, url, "2"], check=False)
        return str(json.loads(proc.stdout)["body"]) if proc.returncode == 0 else ""

    def requests_answered(self, node: str, code: int) -> int:
        """The proxy's rest_client_requests_total with that status code (client-go's metric)."""
        pattern = re.compile(r'^rest_client_requests_total\{[^}]*code="' + str(code) + r'"[^}]*\} (\S+)$', re.M)
        return sum(int(float(v)) for v in pattern.findall(self.metrics(node)))

    def ours_log_since(self, offset: int) -> str:
        return self.bed.proxy_log(OURS_NODE)[offset:]

    def await_log(self, offset: int, pattern: str, what: str) -> str:
        """The first line of ours's log after `offset` that matches `pattern`, awaited."""
        deadline = time.monotonic() + EVIDENCE_TIMEOUT
        regex = re.compile(pattern)
        while True:
            line = next((ln for ln in self.ours_log_since(offset).splitlines() if regex.search(ln)), None)
            if line is not None:
                return line
            if time.monotonic() >= deadline:
                tail = "\n".join(self.ours_log_since(offset).splitlines()[-15:])
                raise ClusterError(f"ours never logged {what} ({pattern!r}) in {EVIDENCE_TIMEOUT:g} s; its log:\n{tail}")
            time.sleep(0.1)

    def await_metric(self, node: str, code: int, at_least: int, timeout: float = EVIDENCE_TIMEOUT) -> int:
        deadline = time.monotonic() + timeout
        while (count := self.requests_answered(node, code)) < at_least:
            if time.monotonic() >= deadline:
                raise ClusterError(f"{node}'s proxy was answered {code} {count} times, not {at_least}, in {timeout:g} s")
            time.sleep(0.2)
        return count

    # ---- the faults ---------------------------------------------------------------------------

    def run(self, name: str) -> FaultResult:
        """Give both proxies the fault `name` (one of FAULTS) and measure them through it."""
        fault: Callable[[int, list[str]], tuple[float, str, str]] = getattr(self, "_" + name.replace("-", "_"))
        offset = len(self.bed.proxy_log(OURS_NODE))
        evidence: list[str] = []
        self.counts = {}
        watch = RuleWatch(self.bed)
        try:
            with watch.running():
                since, service, ip = fault(offset, evidence)
                seconds = watch.await_holding(service, ip, since, CONVERGE_TIMEOUT)
        except BaseException as failure:
            try:
                self.undo_all()  # the next fault, or the bed's next user, finds the server as it was
            except ClusterError as undo_failure:
                failure.add_note(str(undo_failure))  # the fault's own error stays the one reported
            raise
        differences = self.converged()
        return FaultResult(name, seconds, watch.lost(), differences, evidence, self.counts)

    def _apiserver_restart(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        self.bed.cp.restart_apiserver()
        since = time.time()
        service, ip = self.add_service("after-restart")
        evidence.append(self.await_log(offset, r"restarted from resourceVersion|streamed|listed", "a resumed watch"))
        return since, service, ip

    def _etcd_compacted(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        cp = self.bed.cp
        cp.stop_apiserver()
        revision = cp.etcd_revision()
        cp.compact_etcd(revision)
        self.counts["etcd refuses a read below the compaction"] = int(cp.etcd_compacted_at(revision - 1))
        evidence.append(f"etcd compacted at revision {revision}")
        cp.start_apiserver()
        since = time.time()
        service, ip = self.add_service("after-compaction")
        evidence.append(self.await_log(offset, r"is gone \(410\)", "a 410"))
        return since, service, ip

    def _apf_429(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        cp = self.bed.cp
        namespace, name = SERVICE_ACCOUNT
        self._undo["apf"] = lambda: [
            cp.run_kubectl("delete", kind, STARVED, "--ignore-not-found", "--wait=false")
            for kind in ("flowschema", "prioritylevelconfiguration")
        ]
        cp.run_kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": _starved(namespace, name)})
        )
        # A level without seats still runs a request when none of its own is running
        # (queueset.go canAccommodateSeatsLocked), so the level is kept busy: requests of the
        # same ServiceAccount that each wait ~3 s for a resourceVersion the server never reaches.
        assert cp.ns is not None
        hog = cp.ns.popen([sys.executable, "-c", _HOG, cp.server, str(cp.pki.path("ca.crt")), str(self.token_file), "6"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            # The proxies reach the restarted server only once a hog's request runs in the level:
            # a proxy's watch let in first would stream on, untouched by APF, and never see a 429.
            with self._proxies_refused():
                cp.restart_apiserver()
                self._await_executing(STARVED)
            service, ip = self.add_service("after-apf")
            evidence.append(self.await_log(offset, r"429.*retryAfter=", "a 429 with Retry-After"))
            evidence.append(f"{UPSTREAM_NODE}: {self.await_metric(UPSTREAM_NODE, 429, 1)} requests answered 429")
            since = time.time()
            self._end("apf")
        finally:
            hog.kill()
            hog.wait()
        return since, service, ip

    @contextmanager
    def _proxies_refused(self) -> Iterator[None]:
        """The proxy nodes' connections to kube-apiserver refused (a TCP reset) in the block."""
        assert self.bed.cp.ns is not None
        ns, port = self.bed.cp.ns, self.bed.cp.server.rsplit(":", 1)[1]
        sources = ",".join(self.bed.nodes[n].ip for n in PROXY_NODES)
        rule = ["INPUT", "-p", "tcp", "--dport", port, "-s", sources, "-j", "REJECT", "--reject-with", "tcp-reset"]
        self._undo["refused"] = lambda: ns.run(["iptables", "-w", "-D", *rule], check=False)
        ns.run(["iptables", "-w", "-I", *rule])
        try:
            yield
        finally:
            self._end("refused")

    def _await_executing(self, level: str, timeout: float = 30) -> None:
        """Until kube-apiserver runs a request in the priority level `level` (its APF gauge)."""
        pattern = re.compile(
            r'^apiserver_flowcontrol_current_executing_requests\{[^}]*priority_level="' + re.escape(level) + r'"[^}]*\} (\S+)$',
            re.M,
        )
        deadline = time.monotonic() + timeout
        while True:
            answer = self.bed.cp.api.get("/metrics")
            if answer.status_code == 200 and any(float(v) >= 1 for v in pattern.findall(answer.text)):
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"no request ran in the priority level {level} within {timeout:g} s")
            time.sleep(0.1)

    def _rbac_denied(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        cp = self.bed.cp
        self._undo["rbac"] = lambda: cp.run_kubectl("apply", "-f", str(RBAC_MANIFEST))
        cp.run_kubectl("apply", "-f", "-", input=json.dumps(_role_without(RBAC_MANIFEST, "endpointslices")))
        cp.restart_apiserver()
        service, ip = self.add_service("after-rbac")
        evidence.append(self.await_log(offset, r"EndpointSlice.*forbidden", "a 403 naming endpointslices"))
        # Retries back off up to 30 s (times [1, 2)): a few of them may take minutes.
        denied = self.await_metric(OURS_NODE, 403, 3, timeout=CONVERGE_TIMEOUT)
        said = [ln for ln in self.ours_log_since(offset).splitlines() if re.search(r"EndpointSlice.*forbidden", ln)]
        upstream_said = re.findall(FORBIDDEN_SLICES, self.bed.proxy_log(UPSTREAM_NODE))
        self.counts |= {"ours 403 answers": denied, "ours 403 log lines": len(said),
                        "upstream 403 answers": self.requests_answered(UPSTREAM_NODE, 403),
                        "upstream 403 log lines": len(upstream_said)}  # fmt: skip
        since = time.time()
        self._end("rbac")
        return since, service, ip

    def _token_rotated(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        cp = self.bed.cp
        namespace, name = SERVICE_ACCOUNT
        old = self.token_file.read_text().strip()
        self._undo["token"] = self._restore_token
        cp.run_kubectl("delete", "serviceaccount", name, "-n", namespace)
        cp.run_kubectl("create", "serviceaccount", name, "-n", namespace)
        cp.restart_apiserver()  # ends the watches the old token opened (and the server's token cache)
        evidence.append(f"the old token: {self._whoami(old)}")
        service, ip = self.add_service("after-token")
        evidence.append(self.await_log(offset, r" 401 Unauthorized", "a 401"))
        since = time.time()
        self._end("token")
        return since, service, ip

    def _restore_token(self) -> None:
        namespace, name = SERVICE_ACCOUNT
        if self.bed.cp.run_kubectl("get", "serviceaccount", name, "-n", namespace, check=False).returncode != 0:
            self.bed.cp.run_kubectl("create", "serviceaccount", name, "-n", namespace)
        self.write_token()

    def _whoami(self, token: str) -> str:
        config = self.bed.workdir / "probe-token.kubeconfig"
        config.write_text(kubeconfig(self.bed.cp.server, self.bed.cp.pki.data("ca.crt"), {"token": token}))
        argv = [str(self.bed.cp.bin_dir / "kubectl"), "--kubeconfig", str(config), "get", "--raw", "/api"]
        ns = self.bed.cp.ns
        proc = subprocess.run(ns.argv(argv) if ns else argv, capture_output=True, text=True, timeout=30, check=False)
        return proc.stdout.strip()[:80] if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1][:200]

    def _watch_list_off(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        return self._restarted_both(["--feature-gates=WatchList=false"], "after-list", r"no watch-list \(", evidence)

    def _watch_list_on(self, offset: int, evidence: list[str]) -> tuple[float, str, str]:
        return self._restarted_both([], "after-stream", r"streamed \d+ ", evidence)

    def _restarted_both(self, flags: list[str], name: str, pattern: str, evidence: list[str]) -> tuple[float, str, str]:
        """kube-apiserver with `flags`, a change, then both proxies started afresh against it. The
        server keeps `flags` until the next restart; the bed's own flags are back by the end of `on`."""
        self.bed.cp.restart_apiserver(flags)
        self._undo.pop("apiserver flags", None)
        if flags:
            self._undo["apiserver flags"] = self.bed.cp.restart_apiserver
        self.bed.stop_proxies()
        service, ip = self.add_service(name)
        # The time counts from the proxies' start, not from the controller manager's catching up.
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        while not self.bed.slices_settled(self.expected()):
            if time.monotonic() >= deadline:
                raise ClusterError(f"the EndpointSlices did not reach {self.expected()} in {CONVERGE_TIMEOUT:g} s")
            time.sleep(0.1)
        since = time.time()
        self.bed.start_proxies(self.proxy_kubeconfig)
        evidence.append(self.await_log(0, pattern, f"how it got the state ({pattern})"))
        return since, service, ip


# Threads that keep requests in flight against the server at argv[1] (CA file argv[2], bearer
# token file argv[3], argv[4] threads): each asks for a list at a resourceVersion far ahead,
# which the server holds for its freshness wait (3 s) before it answers 504.
_HOG = """
import http.client, ssl, sys, threading, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
context = ssl.create_default_context(cafile=sys.argv[2])
token = open(sys.argv[3]).read().strip()
def hog():
    while True:
        try:
            conn = http.client.HTTPSConnection(url.hostname, url.port, context=context, timeout=30)
            conn.request("GET", "/api/v1/services?resourceVersion=999999999&resourceVersionMatch=NotOlderThan",
                         headers={"Authorization": "Bearer " + token})
            conn.getresponse().read()
            conn.close()
        except OSError:
            pass
threads = [threading.Thread(target=hog) for _ in range(int(sys.argv[4]))]
for t in threads:
    t.start()
"""


def _starved(namespace: str, name: str) -> list[dict[str, Any]]:
    """A PriorityLevel with no seats and no queue (every request rejected: 429 with Retry-After)
    and a FlowSchema that sends the ServiceAccount's requests there, ahead of the bootstrap
    schemas (kube-system-service-accounts is at 900)."""
    api = "flowcontrol.apiserver.k8s.io/v1"
    limited = {
        "nominalConcurrencyShares": 0,
        "lendablePercent": 0,
        "borrowingLimitPercent": 0,
        "limitResponse": {"type": "Reject"},
    }
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": name, "namespace": namespace}}
    rules = {
        "subjects": [subject],
        "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
    }
    return [
        {"apiVersion": api, "kind": "PriorityLevelConfiguration", "metadata": {"name": STARVED},
         "spec": {"type": "Limited", "limited": limited}},
        {"apiVersion": api, "kind": "FlowSchema", "metadata": {"name": STARVED},
         "spec": {"priorityLevelConfiguration": {"name": STARVED}, "matchingPrecedence": 50,
                  "distinguisherMethod": {"type": "ByUser"}, "rules": [rules]}},
    ]  # fmt: skip


def _role_without(manifest: Path, resource: str) -> dict[str, Any]:
    """The manifest's ClusterRole with every rule naming `resource` gone."""
    role = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "ClusterRole")
    role["rules"] = [r for r in role["rules"] if resource not in r.get("resources", [])]
    return dict(role)
