"""A one-node cluster made of network namespaces: the bed for end-to-end tests and the demo.

    with MiniCluster.build(pods=["a", "b"], remote_pods=["r"]) as cluster:
        objs = [service(...), endpoint_slice(..., cluster.backends("a", "r"), ...)]  # lab.builders
        cluster.write_manifests([cluster.node_object(), *objs])
        cluster.start_proxy()
        cluster.wait_applied(objs)
        cluster.request("tcp", cluster.client, "192.168.0.2:30080")

The proxy runs in `MiniCluster.build(proxy_mode=...)`'s mode (iptables by default, or any the
lab reads back); the waits (`wait_applied`, `wait_endpoints`, `wait_rules`) read that mode's
rules in the node with its reader (lab/node_rules.py), so a test reads the same in every mode.
Without a running proxy, `load_rendered(objs)` loads the offline renderer's iptables rules instead. With an
API server instead of files (the test API server, run in the node namespace, driven by the real
`kubectl` there):

        kubeconfig = cluster.start_apiserver()
        cluster.kubectl_apply([cluster.node_object(), *objs])   # or cluster.kubectl("patch", ...)
        cluster.start_proxy(kubeconfig=kubeconfig)

Layout (every box is a network namespace; all of them, and every process started in them, are
removed when the block ends, whether it ended well or not):

    client 192.168.0.10/24 (+ .11-.13) ── eth0 ── node-1 192.168.0.2/24 ──┬─ cali… ── pod a 10.244.1.10/32
      routes 10.96.0.0/12 and the                  ip_forward, rp_filter  ├─ cali… ── pod b 10.244.1.11/32
      external/LB ranges via the node              loose, route_localnet, └─ cali… ── pod r 10.244.2.10/32
                                                   default via the client            ("on node-2")

Pods are wired as Calico wires them: no bridge, one veth per pod, a /32 route to it on the node
and, in the pod, a default route via a link-local gateway whose MAC is the node end's. So the
node routes every pod packet (hairpin works without a bridge's hairpin mode) and a pod sees the
source address the node really sent. "Remote" pods are routed by node-1 in the same way; only
their EndpointSlice says they run on node-2, so a proxy treats them as non-local.

Every pod runs `python -m kubeproxy.lab.probe serve` on its IP for the cluster's TCP and UDP
ports; its answer names the destination it was reached at and the source it saw.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml

from kubeproxy.backends.iptables import readback as iptables_readback
from kubeproxy.backends.iptables.apply import ensure_nfacct_counters, restore
from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.cluster.state import build_state
from kubeproxy.lab import builders, node_rules
from kubeproxy.lab import netns as L
from kubeproxy.model.options import NFACCT_COUNTERS
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.model.rules_readback import NodeRules

NODE_NAME = "node-1"
REMOTE_NODE_NAME = "node-2"
NODE_IP = "192.168.0.2"
CLIENT_IP = "192.168.0.10"
CLIENT_EXTRA_IPS = ("192.168.0.11", "192.168.0.12", "192.168.0.13")
UPLINK_PREFIX = 24
POD_CIDR = "10.244.1.0/24"
REMOTE_POD_CIDR = "10.244.2.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
# Documentation ranges (RFC 5737) for externalIPs and load-balancer IPs: the client routes them to the node.
EXTERNAL_CIDRS = ("203.0.113.0/24", "198.51.100.0/24")
HEALTHZ_BIND = "0.0.0.0:10256"
METRICS_BIND = "127.0.0.1:10249"
SYNC_METRIC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

_POD_GATEWAY = "169.254.1.1"
_POD_GATEWAY6 = "fe80::1"  # as the IPv4 one: only its MAC (the node's veth end) matters
_GATEWAY_MAC = "ee:ee:ee:ee:ee:ee"  # Calico gives every host-side veth this MAC
_FIRST_POD_HOST = 10
PROBE = [sys.executable, "-m", "kubeproxy.lab.probe"]
_METRICS_GET = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
# One GET, run inside a namespace; prints {"status", "headers", "body"} whatever the status (a 503 is an answer too).
HTTP_GET = """
import json, sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(sys.argv[1], timeout=float(sys.argv[2]))
except urllib.error.HTTPError as e:
    r = e
print(json.dumps({"status": r.status, "headers": dict(r.headers.items()), "body": r.read().decode(errors="replace")}))
"""

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The bed could not be built, or a wait ran out; the message says what and shows the evidence."""


class ProxyExited(ClusterError):
    """The proxy under test exited while a test waited on it; the message carries its log's tail."""


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # as sent; look them up with `header()`
    body: str

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


def poll(what: str, check: Callable[[], T | None], *, timeout: float, interval: float = 0.05) -> T:
    """Call `check` until it returns something other than None (or False); give up after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise ClusterError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Pod:
    name: str
    ip: str
    node_name: str
    ns: L.NetNS
    host_if: str  # the veth end in the node's namespace
    removed: bool = False

    def backend(self, *, ready: bool = True, serving: bool = True, terminating: bool = False) -> builders.Backend:
        return builders.Backend(self.ip, self.node_name, ready=ready, serving=serving, terminating=terminating)


Source = L.NetNS | Pod


@dataclass
class MiniCluster:
    node: L.NetNS
    client: L.NetNS
    workdir: Path
    tcp_ports: tuple[int, ...]
    udp_ports: tuple[int, ...]
    proxy_mode: str = "iptables"  # the proxy's --proxy-mode, and so the rules the waits read
    # Seconds a pod's probe may take to start: interpreter start-up, ~40x slower in the VM (tests/vm).
    start_timeout: float = 15.0
    pods: dict[str, Pod] = field(default_factory=dict)
    proxy: subprocess.Popen[str] | None = None
    apiserver: subprocess.Popen[str] | None = None
    kubeconfig: Path | None = None  # reaches `apiserver` from inside the node namespace
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _next_host: dict[str, int] = field(default_factory=dict, repr=False)
    _jumps_loaded: bool = field(default=False, repr=False)
    _applied: dict[tuple[str, str, str], builders.JSON] = field(default_factory=dict, repr=False)
    # Every Service published (files or kubectl), latest version: the nftables maps are keyed by
    # their addresses and ports, not by name, so the waits look a service port up here.
    _services: dict[tuple[str, str, str], builders.JSON] = field(default_factory=dict, repr=False)

    # ---- building and tearing down -------------------------------------------------------

    @classmethod
    @contextmanager
    def build(
        cls,
        pods: Sequence[str] = ("a", "b"),
        remote_pods: Sequence[str] = ("r",),
        *,
        tcp_ports: Sequence[int] = (8080,),
        udp_ports: Sequence[int] = (5353,),
        proxy_mode: str = "iptables",
        start_timeout: float = 15.0,
    ) -> Iterator[MiniCluster]:
        """The node, the client and the pods, each pod serving `tcp_ports` and `udp_ports`;
        `start_proxy` runs the proxy in `proxy_mode`."""
        if proxy_mode not in node_rules.KNOWN_MODES:
            raise ClusterError(f"proxy_mode {proxy_mode!r}: want one of {', '.join(node_rules.KNOWN_MODES)}")
        with ExitStack() as stack:
            workdir = Path(tempfile.mkdtemp(prefix="kp-cluster-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            node = stack.enter_context(L.netns("kpnode"))
            client = stack.enter_context(L.netns("kpcli"))
            cluster = cls(node, client, workdir, tuple(tcp_ports), tuple(udp_ports), proxy_mode,
                          start_timeout=start_timeout, _stack=stack)
            (workdir / "manifests").mkdir()
            cluster._wire_node_and_client()
            # Pods are torn down after the proxy (ExitStack unwinds in reverse), the node and client last.
            for name in pods:
                cluster.add_pod(name)
            for name in remote_pods:
                cluster.add_pod(name, node_name=REMOTE_NODE_NAME)
            stack.callback(cluster.stop_proxy)
            yield cluster

    def _wire_node_and_client(self) -> None:
        L.link(self.client, "eth0", f"{CLIENT_IP}/{UPLINK_PREFIX}", self.node, "eth0", f"{NODE_IP}/{UPLINK_PREFIX}")
        client_cmds = [f"addr add {ip}/{UPLINK_PREFIX} dev eth0" for ip in CLIENT_EXTRA_IPS]
        client_cmds += [f"route add {cidr} via {NODE_IP}" for cidr in (SERVICE_CIDR, *EXTERNAL_CIDRS)]
        L.ip_batch(self.client, client_cmds)
        # a node's uplink has a gateway; without a route the node's own connections to service IPs
        # would fail before netfilter sees them
        L.ip_batch(self.node, [f"route add default via {CLIENT_IP}"])
        self.node.run(
            [
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
                # kube-proxy needs loose (or no) reverse-path filtering and, for localhost NodePorts, route_localnet
                "net.ipv4.conf.all.rp_filter=2",
                "net.ipv4.conf.default.rp_filter=2",
                "net.ipv4.conf.all.route_localnet=1",
                # REJECT answers with ICMP, which the kernel rate-limits per peer; tests must see every answer
                "net.ipv4.icmp_ratelimit=0",
                "net.ipv4.icmp_msgs_per_sec=100000",
                "net.ipv4.icmp_msgs_burst=100000",
            ]
        )

    def add_pod(self, name: str, *, node_name: str = NODE_NAME) -> Pod:
        """A pod namespace with the next free IP of its node's podCIDR, serving the cluster's ports."""
        if name in self.pods:
            raise ClusterError(f"pod {name!r} exists already")
        cidr = ipaddress.ip_network(POD_CIDR if node_name == NODE_NAME else REMOTE_POD_CIDR)
        host = self._next_host.get(node_name, _FIRST_POD_HOST)
        self._next_host[node_name] = host + 1
        ip = str(cidr[host])
        ns = L.create("kppod")
        host_if = pod_interface(ns, name)
        pod = Pod(name, ip, node_name, ns, host_if)
        self.pods[name] = pod
        self._stack.callback(self._delete_pod, pod)
        wire_pod(self.node, ns, host_if, ip)
        self._serve(pod)
        return pod

    def _serve(self, pod: Pod) -> None:
        # Started together, awaited together: interpreter start-up is the slow part.
        children = [
            self._start_probe(pod.ns, proto, [f"{pod.ip}:{port}" for port in ports], f"pod-{pod.name}")
            for proto, ports in (("tcp", self.tcp_ports), ("udp", self.udp_ports))
            if ports
        ]
        for what, child in children:
            await_ready(what, child, timeout=self.start_timeout)

    def serve(self, where: Source, proto: str, listens: Sequence[str]) -> None:
        """Start a probe receiver in any namespace of the bed (e.g. the node or the client) on `ip:port`s."""
        ns = where.ns if isinstance(where, Pod) else where
        await_ready(*self._start_probe(ns, proto, listens, ns.name), timeout=self.start_timeout)

    def _start_probe(self, ns: L.NetNS, proto: str, listens: Sequence[str], label: str) -> tuple[str, subprocess.Popen[str]]:
        args = [arg for spec in listens for arg in ("--listen", spec)]
        log = self._log_file(f"{label}-{proto}.log")
        child = ns.popen([*PROBE, "serve", "--proto", proto, *args], stdout=subprocess.PIPE, stderr=log)
        return f"{proto} probe in {label} on {', '.join(listens)}", child

    def remove_pod(self, name: str) -> None:
        """Kill a pod and remove its namespace and route (its endpoint should be gone from the slice first)."""
        self._delete_pod(self.pods.pop(name))

    def _delete_pod(self, pod: Pod) -> None:
        if pod.removed:
            return
        pod.removed = True
        self.pods.pop(pod.name, None)
        pod.ns.delete()  # the veth pair and the node's route to it go with the namespace

    def _log_file(self, name: str) -> IO[str]:
        # appended to, so that a restarted proxy's log follows the previous one's
        return self._stack.enter_context((self.workdir / name).open("a"))

    # ---- objects ---------------------------------------------------------------------------

    @property
    def manifests(self) -> Path:
        return self.workdir / "manifests"

    def node_object(self) -> builders.JSON:
        """node-1's Node: its podCIDR and InternalIP, so the proxy knows its own addresses."""
        return builders.node(NODE_NAME, NODE_IP, POD_CIDR)

    def backends(self, *names: str) -> list[builders.Backend]:
        return [self.pods[n].backend() for n in names]

    def write_manifests(self, objs: Iterable[builders.JSON], filename: str = "cluster.yaml") -> Path:
        """Write objects as one multi-document YAML file, atomically: a watcher never sees half a file."""
        path = self.manifests / filename
        tmp = path.with_name(f".{filename}.tmp")
        objs = list(objs)
        tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        os.replace(tmp, path)
        self._remember(objs)
        return path

    def _remember(self, objs: Iterable[builders.JSON]) -> None:
        self._services.update((_object_key(obj), obj) for obj in objs if obj.get("kind") == "Service")

    # ---- objects through an API server and kubectl -----------------------------------------

    def start_apiserver(self, timeout: float = 15) -> Path:
        """The test API server (`python -m kubeproxy.lab.apiserver`) as a process in the node namespace.

        It listens on 127.0.0.1 there, so only the node's processes (the proxy, `kubectl()`) reach
        it. Returns the kubeconfig it wrote (also `self.kubeconfig`); its log is apiserver.log.
        """
        if self.apiserver is not None and self.apiserver.poll() is None:
            raise ClusterError("an API server is running already")
        path = self.workdir / "kubeconfig"
        path.unlink(missing_ok=True)
        log = self._log_file("apiserver.log")
        argv = [sys.executable, "-m", "kubeproxy.lab.apiserver", "--kubeconfig", str(path), "--bookmark-interval", "5"]
        self.apiserver = self.node.popen(argv, stdout=log, stderr=subprocess.STDOUT)

        def written() -> bool:
            if self.apiserver is not None and self.apiserver.poll() is not None:
                tail = last_lines((self.workdir / "apiserver.log").read_text(errors="replace"))
                raise ClusterError(f"the API server exited with status {self.apiserver.returncode}:\n{tail}")
            # written after the server listens; complete once its last key is there
            return path.exists() and "preferences" in path.read_text()

        poll("the API server's kubeconfig", written, timeout=timeout)
        self.kubeconfig = path
        self._applied.clear()
        return path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The real `kubectl` inside the node namespace, against `start_apiserver()`'s server.

        Nothing of the caller's ~/.kube or environment leaks in. A failure (with `check`) is a
        ClusterError carrying kubectl's stderr.
        """
        if self.kubeconfig is None:
            raise ClusterError("kubectl needs the API server: start_apiserver() first")
        binary = shutil.which("kubectl")
        if binary is None:
            raise ClusterError("kubectl is not on PATH")
        env = ["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}", f"HOME={self.workdir}"]
        argv = [*env, binary, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.workdir / "kube-cache"), *args]
        proc = self.node.run(argv, input=input, check=False, timeout=30)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {shlex.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def kubectl_apply(self, objs: Iterable[builders.JSON]) -> str:
        """Make the API server hold `objs`, as an operator would: `kubectl apply -f` a file of them,
        then `kubectl delete -f` the ones an earlier call applied and `objs` lacks. Returns what
        kubectl said (`service/web created`, `... unchanged`, `... deleted`).
        """
        wanted = {_object_key(obj): obj for obj in objs}
        self._remember(wanted.values())
        gone = [obj for key, obj in self._applied.items() if key not in wanted]
        said = []
        if wanted:
            path = self.workdir / "kubectl-apply.yaml"
            path.write_text(yaml.safe_dump_all(list(wanted.values()), sort_keys=False))
            said.append(self.kubectl("apply", "-f", str(path)).stdout)
        if gone:
            path = self.workdir / "kubectl-delete.yaml"
            path.write_text(yaml.safe_dump_all(gone, sort_keys=False))
            said.append(self.kubectl("delete", "-f", str(path)).stdout)
        self._applied = wanted
        return "".join(said)

    # ---- rules without a running proxy -----------------------------------------------------

    def load_rendered(self, objs: Iterable[builders.JSON], cfg: ProxyConfig | None = None) -> str:
        """Render `objs` as node-1 with the offline renderer and load the result into the node.

        The first load also adds the jumps from the built-in chains (as a proxy's start-up
        would); later loads are full syncs of our chains only. Returns the loaded text.
        """
        if node_rules.reader(self.proxy_mode) is not iptables_readback.read_rules:
            raise ClusterError(f"load_rendered loads iptables rules; this cluster reads {self.proxy_mode} rules")
        cfg = cfg or ProxyConfig(hostname_override=NODE_NAME)
        state, warnings = build_state(objs)
        if warnings:
            raise ClusterError("objects rejected: " + "; ".join(warnings))
        counters = ensure_nfacct_counters(NFACCT_COUNTERS, self.node)
        text = render_iptables(state, cfg, nfacct_counters=counters).rendered.text
        if not self._jumps_loaded:
            text = with_jumps(text)
        restore(text, run=self.node)
        self._jumps_loaded = True
        return text

    # ---- the proxy under test --------------------------------------------------------------

    def start_proxy(
        self, *extra_args: str, kubeconfig: Path | None = None, command: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        """`kubeproxy -v 2 run --proxy-mode MODE` inside the node namespace, reading the manifests
        folder, or with `kubeconfig` (see `start_apiserver`) watching that API server; output in
        proxy.log. A `--proxy-mode` among `extra_args` wins, and the waits read that mode's rules.
        `command` replaces `kubeproxy -v 2 run` (e.g. an image's kube-proxy run through chroot)."""
        if self.proxy is not None and self.proxy.poll() is None:
            raise ClusterError("a proxy is running already; stop_proxy() first")
        if "--proxy-mode" in extra_args:
            mode = extra_args[extra_args.index("--proxy-mode") + 1 :][:1]
            if not mode or mode[0] not in node_rules.KNOWN_MODES:
                raise ClusterError(f"--proxy-mode {' '.join(mode)!r}: want one of {', '.join(node_rules.KNOWN_MODES)}")
            self.proxy_mode = mode[0]
        else:
            extra_args = ("--proxy-mode", self.proxy_mode, *extra_args)
        source = ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else ["--manifests", str(self.manifests)]
        argv = [
            *(command or (kubeproxy_binary(), "-v", "2", "run")),
            *source,
            "--hostname-override",
            NODE_NAME,
            "--healthz-bind-address",
            HEALTHZ_BIND,
            "--metrics-bind-address",
            METRICS_BIND,
            *extra_args,
        ]
        log = self._log_file("proxy.log")
        self.proxy = self.node.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        return self.proxy

    def stop_proxy(self, timeout: float = 10) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` s. Returns its exit status."""
        proc, self.proxy = self.proxy, None
        if proc is None:
            return None
        L.stop_process(proc, timeout)
        return proc.returncode

    def proxy_log(self) -> str:
        path = self.workdir / "proxy.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def last_sync(self) -> float | None:
        """The proxy's `kubeproxy_sync_proxy_rules_last_timestamp_seconds`, or None before the first sync."""
        proc = self.node.run([sys.executable, "-c", _METRICS_GET, f"http://{METRICS_BIND}/metrics"], check=False)
        if proc.returncode != 0:
            return None
        for line in proc.stdout.splitlines():
            if line.startswith(SYNC_METRIC):
                value = float(line.split()[-1])
                return value or None
        return None

    def wait_synced(self, after: float | None = None, timeout: float = 15) -> float:
        """Wait for a sync that completed after `after` (a `time.time()`); any sync if None.

        To be sure a change is in: `t = time.time(); write_manifests(...); wait_synced(t)`, or,
        since a sync that was already running at `t` may have missed the change, wait for the
        rules themselves with `wait_applied`, `wait_endpoints` or `wait_rules`.
        """

        def synced() -> float | None:
            ts = self.last_sync()
            return ts if ts is not None and (after is None or ts > after) else None

        return self._poll_with_log("a sync" + (f" after {after:.3f}" if after else ""), synced, timeout)

    def iptables_save(self, table: str = "nat") -> str:
        return self.node.run(["iptables-save", "-t", table]).stdout

    def node_rules(self) -> NodeRules:
        """One snapshot of the node's rules in the proxy's mode (iptables-save, or our nft table)."""
        return node_rules.read(self.proxy_mode, self.node, self._services.values())

    def wait_rules(
        self, what: str, check: Callable[[NodeRules], bool], timeout: float = 15, seen: Callable[[], str] | None = None
    ) -> NodeRules:
        """Poll the node's rules until `check(rules)` holds; return that snapshot. On timeout the
        error says `seen()` (what the last look found), then the proxy's log."""

        def matched() -> NodeRules | None:
            rules = self.node_rules()
            return rules if check(rules) else None

        return self._poll_with_log(what, matched, timeout, seen)

    def endpoints_in_rules(self, service_port: str, rules: NodeRules | None = None) -> set[str]:
        """`ip:port`s the node's rules DNAT `service_port` (`ns/name:port`, as upstream names it) to."""
        return (rules or self.node_rules()).endpoints(service_port)

    def wait_endpoints(self, service_port: str, expected: Iterable[str], timeout: float = 15) -> None:
        """Wait until the node's DNAT rules for `service_port` go to exactly `expected` (`ip:port`)."""
        want = set(expected)
        seen: list[set[str]] = []

        def check(rules: NodeRules) -> bool:
            seen[:] = [rules.endpoints(service_port)]
            return seen[0] == want

        what = f"{service_port} endpoints {sorted(want)} in the node's {self.proxy_mode} rules"
        self.wait_rules(what, check, timeout, lambda: f"the rules went to {sorted(seen[0]) if seen else 'nothing yet'}")

    def wait_applied(self, objs: Sequence[builders.JSON], timeout: float = 15) -> None:
        """Wait until the node's rules send every service port in `objs` to the endpoints its
        slices give it, and reject those without endpoints (see `builders.expected_endpoints`)."""
        expected = builders.expected_endpoints(objs)
        mismatch: list[str] = []

        def applied(rules: NodeRules) -> bool:
            for service_port, want in expected.items():
                if want and (got := rules.endpoints(service_port)) != want:
                    mismatch[:] = [f"{service_port} goes to {sorted(got)}, not {sorted(want)}"]
                    return False
                if not want and not rules.rejects(service_port):
                    mismatch[:] = [f"{service_port} is not rejected for want of endpoints"]
                    return False
            return True

        what = f"the {self.proxy_mode} rules of {len(expected)} service ports"
        self.wait_rules(what, applied, timeout, lambda: mismatch[0] if mismatch else "nothing read yet")

    def _check_proxy_alive(self) -> None:
        if self.proxy is not None and self.proxy.poll() is not None:
            raise ProxyExited(f"the proxy exited with status {self.proxy.returncode}:\n{last_lines(self.proxy_log())}")

    def _poll_with_log(
        self, what: str, check: Callable[[], T | None], timeout: float, seen: Callable[[], str] | None = None
    ) -> T:
        def checked() -> T | None:
            self._check_proxy_alive()
            return check()

        try:
            return poll(what, checked, timeout=timeout)
        except ProxyExited:
            raise
        except ClusterError as exc:
            message = f"{exc}; {seen()}" if seen is not None else str(exc)
            if self.proxy is None:
                raise ClusterError(message) from None
            raise ClusterError(f"{message}; proxy log:\n{last_lines(self.proxy_log())}") from None

    # ---- traffic ---------------------------------------------------------------------------

    def request(
        self,
        proto: str,
        src: Source,
        dst: str,
        count: int = 1,
        src_ip: str | None = None,
        timeout: float = 1.0,
        sport: int = 0,
    ) -> list[Any]:
        """`count` probes (one new connection each) from `src` to `dst` (`ip:port`).

        Each result is the receiver's {"dst", "src"} (as `ip:port` strings), "refused" (a REJECT)
        or "timeout" (a DROP), as `kubeproxy.lab.probe send` reports them. A fixed UDP `sport`
        makes all of them one flow to conntrack.
        """
        ns = src.ns if isinstance(src, Pod) else src
        argv = [*PROBE, "send", "--proto", proto, "--dst", dst, "--count", str(count), "--timeout", str(timeout)]
        if src_ip:
            argv += ["--src", src_ip]
        if sport:
            argv += ["--sport", str(sport)]
        out = ns.run(argv, timeout=30 + count * timeout).stdout
        results: list[Any] = json.loads(out)
        return results

    def sweep(self, proto: str, src: Source, dsts: Sequence[str], timeout: float = 1.0) -> dict[str, Any]:
        """One probe (a new connection) to each of `dsts` in turn, from one sender process: {dst: result}."""
        ns = src.ns if isinstance(src, Pod) else src
        argv = [*PROBE, "send", "--proto", proto, "--timeout", str(timeout), *(a for d in dsts for a in ("--dst", d))]
        results: list[Any] = json.loads(ns.run(argv, timeout=30 + len(dsts) * timeout).stdout)
        return dict(zip(dsts, results, strict=True))

    def http_get(self, src: Source, url: str, timeout: float = 2.0) -> HttpAnswer:
        """One HTTP GET from `src`'s namespace; any status is an answer (a refused connection raises)."""
        return http_get(src.ns if isinstance(src, Pod) else src, url, timeout)

    @contextmanager
    def traffic(self, proto: str, src: Source, dst: str, batch: int = 10, timeout: float = 1.0) -> Iterator[Traffic]:
        """Probes sent back to back (`batch` per sender process) from `src` to `dst` until the block ends.

        Results accumulate in the yielded `Traffic` while the test changes things; the batch in
        flight is finished (and counted) when the block ends.
        """
        flow = Traffic(f"{proto} {dst}")
        stop = threading.Event()

        def loop() -> None:
            try:
                while not stop.is_set():
                    flow.results.extend(self.request(proto, src, dst, count=batch, timeout=timeout))
            except Exception as exc:  # reported in the test's thread, below
                flow.error = exc

        sender = threading.Thread(target=loop, name=f"traffic {flow.what}", daemon=True)
        sender.start()
        try:
            yield flow
        finally:
            stop.set()
            sender.join()
        if flow.error is not None:
            raise ClusterError(f"traffic {flow.what} stopped: {flow.error}") from flow.error


@dataclass
class Traffic:
    what: str
    results: list[Any] = field(default_factory=list)
    error: Exception | None = None

    def failures(self) -> list[Any]:
        """Probes that were refused, timed out or failed otherwise."""
        return [r for r in self.results if not isinstance(r, dict)]

    def wait_for_more(self, count: int, timeout: float = 60) -> None:
        """Wait until `count` more probes have been answered (or have failed) than now.

        The bound is wide because it only matters when something is wrong: under TCG in the VM,
        on a loaded machine, ten probes once took more than 15 s."""
        target = len(self.results) + count
        poll(f"{count} more probes of {self.what}", lambda: len(self.results) >= target, timeout=timeout)


def pod_interface(pod: L.NetNS, name: str) -> str:
    """The node's end of pod `name`'s veth: `cali` and a hash, as Calico names it (15 characters at most)."""
    return "cali" + hashlib.sha1(f"{pod.name}/{name}".encode()).hexdigest()[:11]


def wire_pod(node: L.NetNS, pod: L.NetNS, host_if: str, ip: str, ip6: str = "") -> None:
    """Wire a pod as Calico does: a veth from `host_if` on the node (every node end has the same
    MAC) to the pod's eth0, a /32 route (/128 for `ip6`) to the pod on the node, and in the pod a
    default route via a link-local gateway whose neighbour entry is that MAC."""
    node.run(["ip", "link", "add", host_if, "address", _GATEWAY_MAC, "type", "veth", "peer", "name", "eth0", "netns", pod.name])
    host_routes = [f"route add {ip}/32 dev {host_if} scope link"]
    host_routes += [f"route add {ip6}/128 dev {host_if}"] if ip6 else []
    L.ip_batch(node, [f"link set {host_if} up", *host_routes])
    v6 = [
        f"addr add {ip6}/128 dev eth0 nodad",
        f"neigh replace {_POD_GATEWAY6} lladdr {_GATEWAY_MAC} dev eth0 nud permanent",
        f"route add default via {_POD_GATEWAY6} dev eth0",
    ]
    L.ip_batch(
        pod,
        [
            f"addr add {ip}/32 dev eth0",
            "link set eth0 up",
            f"route add {_POD_GATEWAY} dev eth0 scope link",
            f"route add default via {_POD_GATEWAY} dev eth0",
            f"neigh replace {_POD_GATEWAY} lladdr {_GATEWAY_MAC} dev eth0 nud permanent",
            *(v6 if ip6 else []),
        ],
    )


def await_ready(what: str, child: subprocess.Popen[str], timeout: float) -> None:
    """Until `child` (a probe) says "ready" on its first line, or `timeout` s."""
    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        line = child.stdout.readline() if sel.select(timeout) else ""
    if line.strip() != "ready":
        status = child.poll()
        raise ClusterError(f"{what} did not start (exit status {status}, said {line.strip()!r})")


def http_get(ns: L.NetNS, url: str, timeout: float) -> HttpAnswer:
    """One HTTP GET from inside `ns`; any status is an answer (a refused connection raises)."""
    proc = ns.run([sys.executable, "-c", HTTP_GET, url, str(timeout)], check=False, timeout=timeout + 30)
    if proc.returncode != 0:
        raise ClusterError(f"GET {url} from {ns.name} failed: {last_lines(proc.stderr, 3)}")
    got = json.loads(proc.stdout)
    return HttpAnswer(got["status"], got["headers"], got["body"])


def kubeproxy_binary() -> str:
    beside = Path(sys.executable).parent / "kubeproxy"
    found = str(beside) if beside.exists() else shutil.which("kubeproxy")
    if not found:
        raise ClusterError(f"no kubeproxy executable beside {sys.executable} or on PATH")
    return found


def _object_key(obj: builders.JSON) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))


def last_lines(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"
