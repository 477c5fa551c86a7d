"""Upstream's kube-proxy and ours side by side, against upstream's control plane.

    switch (bridge) ── control 192.168.30.2   etcd, kube-apiserver :6443, kube-controller-manager
                   ├── node-a  192.168.30.11  pods 10.244.1.0/24   upstream's kube-proxy
                   ├── node-b  192.168.30.12  pods 10.244.2.0/24   ours (.venv/bin/kube-proxy)
                   └── node-c  192.168.30.13  pods 10.244.3.0/24   no proxy: remote pods for both

The cluster is dual-stack: every node also has fd00:30::1N and pods fd00:10:244:N::/64, the
Service ranges are 10.96.0.0/12 and fd00:10:96::/112, and every pod has an address of each family.

Every box is a network namespace, removed with its processes when the block ends. The lab kubelet
(lab/kubelet.py) registers the three Nodes and reports each pod (a namespace wired to its node,
running the probe server) with its IP and readiness; upstream's EndpointSlice controller makes the
slices. Both proxies run as deployed: deploy/00-rbac.yaml applied with upstream's kubectl, a
TokenRequest token for its ServiceAccount and the cluster's CA, TLS verified, the same flags.

node-a and node-b play symmetric roles: the same zone, and pods placed in mirror image
(`add_mirrored_pods`), so their rulesets are equal once each node's own endpoints are named by
role (lab/rules_compare.py).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeproxy.backends import registry
from kubeproxy.lab import ipvs_compare, rules_compare
from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import HTTP_GET, PROBE, SYNC_METRIC, ClusterError, await_ready, pod_interface, wire_pod
from kubeproxy.lab.control_plane import ControlPlane
from kubeproxy.lab.kubelet import LabKubelet, NodeInfo, PodInfo
from kubeproxy.model.options import NFACCT_COUNTERS

UNDERLAY = ipaddress.ip_network("192.168.30.0/24")
CONTROL_IP = "192.168.30.2"
UNDERLAY6 = ipaddress.ip_network("fd00:30::/64")
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
CLUSTER_CIDR = ",".join(CLUSTER_CIDRS)
SERVICE_CIDR = "10.96.0.0/12,fd00:10:96::/112"
ZONE = "zone-a"
UPSTREAM_NODE = "node-a"
OURS_NODE = "node-b"
POD_HOST_NODE = "node-c"
POD_PORT = 8080
IPVS_LISTING = ("ipvsadm-save", "-n")  # of a Mode's listings: the mode programs IPVS virtual servers
METRICS_BIND = "127.0.0.1:10249"
RBAC_MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "00-rbac.yaml"
# The kernel's ICMP error rate limits off: a probe's flows to a Service without endpoints are
# refused by an ICMP error each, and whether a limit dropped one (a timeout instead) would
# depend on when the node's earlier errors went out, not on its rules.
_NODE_SYSCTLS = ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=2", "net.ipv4.conf.default.rp_filter=2",
                 "net.ipv6.conf.all.forwarding=1", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0",
                 "net.ipv4.icmp_msgs_per_sec=1000000", "net.ipv4.icmp_msgs_burst=1000000"]  # fmt: skip
# Pods declare these container ports, so Services may name any of them as their targetPort.
POD_PORTS = (("http", POD_PORT, "TCP"), ("dns", 5353, "UDP"), ("sctp", 9132, "SCTP"))
_FIRST_POD_HOST = 10


@dataclass
class BedNode:
    name: str
    ip: str
    pod_cidr: str
    ns: L.NetNS
    ip6: str = ""
    pod_cidr6: str = ""
    proxy: subprocess.Popen[str] | None = None
    next_host: int = _FIRST_POD_HOST


@dataclass
class BedPod:
    info: PodInfo
    ns: L.NetNS | None  # None: a pod the API knows of with nothing running (rules need no packets)


@dataclass
class SideBySide:
    workdir: Path
    cp: ControlPlane
    kubelet: LabKubelet
    switch: L.NetNS
    nodes: dict[str, BedNode] = field(default_factory=dict)
    pods: dict[str, BedPod] = field(default_factory=dict)
    changed_at: float = 0.0  # wall-clock time of the last change the bed made (as the sync metric counts)
    mode: str = "iptables"  # both proxies' --proxy-mode
    probe_timeout: float = 15.0  # for a pod's probe to say it listens (Python under TCG takes far longer)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)

    @classmethod
    @contextmanager
    def build(cls, bin_dir: Path, mode: str = "iptables", *, startup_timeout: float = 90) -> Iterator[SideBySide]:
        """The bed, its control plane awaited for up to `startup_timeout` s (minutes in a VM under TCG)."""
        with ExitStack() as stack:
            workdir = Path(tempfile.mkdtemp(prefix="kp-side-by-side-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            switch = stack.enter_context(L.netns("kpsbsw"))
            control = stack.enter_context(L.netns("kpsbcp"))
            L.ip_batch(switch, ["link add br0 type bridge", "link set br0 up"])
            switch.run(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"], check=False)
            _attach(switch, control, f"{CONTROL_IP}/{UNDERLAY.prefixlen}", 0)
            cp = stack.enter_context(
                ControlPlane.start(
                    bin_dir,
                    workdir / "control-plane",
                    ns=control,
                    address=CONTROL_IP,
                    service_cidr=SERVICE_CIDR,
                    timeout=startup_timeout,
                )
            )
            bed = cls(workdir, cp, LabKubelet(cp.api), switch, mode=mode, _stack=stack)
            for index, name in enumerate((UPSTREAM_NODE, OURS_NODE, POD_HOST_NODE), start=1):
                ns = stack.enter_context(L.netns(f"kpsbn{index}"))
                node = BedNode(name, str(UNDERLAY[10 + index]), f"10.244.{index}.0/24", ns,
                               str(UNDERLAY6[0x10 + index]), f"fd00:10:244:{index}::/64")  # fmt: skip
                bed.nodes[name] = node
                _attach(switch, ns, f"{node.ip}/{UNDERLAY.prefixlen}", index)
                L.ip_batch(ns, [f"addr add {node.ip6}/{UNDERLAY6.prefixlen} dev eth0 nodad"])
                ns.run(["sysctl", "-qw", *_NODE_SYSCTLS])
                bed.kubelet.register_node(NodeInfo(name, (node.ip, node.ip6), (node.pod_cidr, node.pod_cidr6), ZONE))
            for node in bed.nodes.values():
                others = [n for n in bed.nodes.values() if n is not node]
                routes = [f"route add {n.pod_cidr} via {n.ip}" for n in others]
                L.ip_batch(node.ns, routes + [f"route add {n.pod_cidr6} via {n.ip6}" for n in others])
            cp.run_kubectl("apply", "-f", str(RBAC_MANIFEST))
            stack.callback(bed.stop_proxies)
            yield bed

    def clear(self, *, timeout: float = 60) -> None:
        """The bed as built, for another test on the same control plane: both proxies stopped,
        every pod gone, the default namespace's Services, Endpoints and EndpointSlices deleted
        (the `kubernetes` Service's kept) and awaited gone, each node's rules and conntrack
        table flushed, and the proxies' mode back to iptables."""
        self.stop_proxies()
        for name in list(self.pods):
            self.finish_termination(name)
        not_kubernetes = ("--field-selector", "metadata.name!=kubernetes")
        self.cp.run_kubectl("delete", "services,endpoints", "-n", "default", *not_kubernetes)
        self.cp.run_kubectl("delete", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name!=kubernetes")
        deadline = time.monotonic() + timeout
        while self._leftovers():
            self.check_alive()
            if time.monotonic() >= deadline:
                raise ClusterError(f"the bed's objects were not gone {timeout:g} s after their deletion: {self._leftovers()}")
            time.sleep(0.1)
        for node in self.nodes.values():
            # Both iptables variants' tables and the nftables tables: the state of a fresh namespace.
            node.ns.run(["nft", "flush", "ruleset"])
            if "legacy" in node.ns.run(["iptables", "-V"]).stdout:
                for tool in ("iptables-restore", "ip6tables-restore"):
                    node.ns.run([tool], input="".join(f"*{t}\nCOMMIT\n" for t in ("filter", "nat", "mangle", "raw")))
            for family in ("ipv4", "ipv6"):
                node.ns.run(["conntrack", "-F", "-f", family], check=False)  # an empty table is no failure
            node.next_host = _FIRST_POD_HOST
        self.mode = "iptables"

    def _leftovers(self) -> list[str]:
        """The pods, and the slices other than the `kubernetes` Service's, the API still holds."""
        out = []
        for path in ("/api/v1/namespaces/default/pods", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"):
            answer = self.cp.api.get(path)
            if answer.status_code != 200:
                return [f"GET {path}: {answer.status_code}"]
            for item in answer.json()["items"]:
                if item["metadata"].get("labels", {}).get("kubernetes.io/service-name") != "kubernetes":
                    out.append(f"{path.rsplit('/', 1)[1]} {item['metadata']['name']}")
        return out

    # ---- pods ---------------------------------------------------------------------------------

    def add_pod(self, name: str, node_name: str, labels: Mapping[str, str], *, ready: bool = True, wired: bool = True) -> BedPod:
        """A pod on `node_name` with an address of each family, reported through the API; `wired`,
        a namespace running the probe on POD_PORT (both families)."""
        node = self.nodes[node_name]
        ip = str(ipaddress.ip_network(node.pod_cidr)[node.next_host])
        ip6 = str(ipaddress.ip_network(node.pod_cidr6)[node.next_host])
        node.next_host += 1
        info = PodInfo(name, node_name, (ip, ip6), dict(labels), POD_PORTS)
        if not wired:
            self.pods[name] = BedPod(info, None)
            self.changed_at = time.time()
            self.kubelet.report_pod(info, ready=ready)
            return self.pods[name]
        ns = L.create("kpsbpod")
        pod = BedPod(info, ns)
        self.pods[name] = pod
        self._stack.callback(ns.delete)
        wire_pod(node.ns, ns, pod_interface(ns, name), ip, ip6)
        child = ns.popen([*PROBE, "serve", "--proto", "tcp", "--listen", f"{ip}:{POD_PORT}", "--listen", f"[{ip6}]:{POD_PORT}"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        await_ready(f"the probe in pod {name}", child, timeout=self.probe_timeout)
        self.changed_at = time.time()
        self.kubelet.report_pod(pod.info, ready=ready)
        return pod

    def add_mirrored_pods(self, base: str, labels: Mapping[str, str]) -> None:
        """One pod on each proxy node, `base-node-a` and `base-node-b`: their roles mirror."""
        for node_name in (UPSTREAM_NODE, OURS_NODE):
            self.add_pod(f"{base}-{node_name}", node_name, labels)

    def set_ready(self, name: str, ready: bool) -> None:
        self.changed_at = time.time()
        self.kubelet.set_ready(self.pods[name].info, ready)

    def start_termination(self, name: str) -> None:
        self.changed_at = time.time()
        self.kubelet.start_termination(self.pods[name].info)

    def finish_termination(self, name: str) -> None:
        self.changed_at = time.time()
        pod = self.pods.pop(name)
        if pod.ns is not None:
            pod.ns.delete()
        self.kubelet.finish_termination(pod.info)

    def pods_by_ip(self) -> dict[str, str]:
        return {ip: name for name, pod in self.pods.items() for ip in pod.info.ips}

    # ---- objects ------------------------------------------------------------------------------

    def apply(self, *objs: dict[str, Any]) -> None:
        """One `kubectl apply` of the objects as a List (a LoadBalancer's status.loadBalancer then
        goes to /status): one client start per step, however many objects the step has."""
        self.changed_at = time.time()
        if not objs:
            return
        items = [{k: v for k, v in obj.items() if k != "status"} for obj in objs]
        self.cp.run_kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        for obj in objs:
            status = obj.get("status")
            if obj.get("kind") == "Service" and status:
                meta = obj["metadata"]
                path = f"/api/v1/namespaces/{meta.get('namespace', 'default')}/services/{meta['name']}/status"
                answer = self.cp.api.patch(
                    path, json={"status": status}, headers={"Content-Type": "application/merge-patch+json"}
                )
                if answer.status_code >= 300:
                    raise ClusterError(f"PATCH {path}: {answer.status_code} {answer.text[:300]}")

    def delete(self, kind: str, name: str, namespace: str = "default") -> None:
        self.changed_at = time.time()
        self.cp.run_kubectl("delete", kind, name, "-n", namespace, "--wait=false")

    # ---- proxies ------------------------------------------------------------------------------

    def proxy_argv(self, binary: str, node_name: str, kubeconfig: Path) -> list[str]:
        return [binary, "--kubeconfig", str(kubeconfig), "--hostname-override", node_name, "--proxy-mode", self.mode,
                "--cluster-cidr", CLUSTER_CIDR, "--metrics-bind-address", METRICS_BIND,
                "--healthz-bind-address", "0.0.0.0:10256", "--conntrack-max-per-core", "0", "-v", "2"]  # fmt: skip

    def start_proxies(self, kubeconfig: Path | None = None) -> None:
        """Both proxies, reaching the server with `kubeconfig` (else one made now with a
        TokenRequest token); started again after stop_proxies(), their logs start afresh."""
        kubeconfig = kubeconfig or self.cp.token_kubeconfig(self.workdir / "kubeproxy.kubeconfig", "kube-system", "kubeproxy")
        ours = str(Path(sys.executable).parent / "kube-proxy")
        self.changed_at = time.time()
        for node_name, binary in ((UPSTREAM_NODE, str(self.cp.bin_dir / "kube-proxy")), (OURS_NODE, ours)):
            node = self.nodes[node_name]
            # The nfacct counters exist before either proxy starts, as on a node whose kube-proxy
            # has run before. In a fresh namespace upstream's IPv4 and IPv6 proxiers race to
            # create them: each finds a counter missing, one adds it, the other's add fails
            # with EBUSY (pkg/proxy/util/nfacct: Ensure → ErrObjectAlreadyExists), and that
            # family's rules go without their nfacct matches for the life of the process.
            for counter in NFACCT_COUNTERS:
                node.ns.run(["nfacct", "add", counter], check=False)  # fails when an earlier start made it
            with open(self.workdir / f"proxy-{node_name}.log", "w") as log:
                node.proxy = node.ns.popen(self.proxy_argv(binary, node_name, kubeconfig), stdout=log, stderr=subprocess.STDOUT)

    def stop_proxies(self) -> None:
        for node in self.nodes.values():
            proc, node.proxy = node.proxy, None
            if proc is not None:
                L.stop_process(proc, 10)

    def proxy_log(self, node_name: str) -> str:
        path = self.workdir / f"proxy-{node_name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        self.cp.check_alive()
        for node in self.nodes.values():
            if node.proxy is not None and node.proxy.poll() is not None:
                tail = "\n".join(self.proxy_log(node.name).splitlines()[-30:])
                raise ClusterError(f"{node.name}'s proxy exited with status {node.proxy.returncode}:\n{tail}")

    def last_syncs(self, node_name: str) -> dict[str, float]:
        """The proxy's kubeproxy_sync_proxy_rules_last_timestamp_seconds by its ip_family label
        ({} before its first sync, or when the answer is not there in time: the caller's deadline decides)."""
        try:
            proc = self.nodes[node_name].ns.run([sys.executable, "-c", HTTP_GET, f"http://{METRICS_BIND}/metrics", "2"],
                                                check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {}  # the client's own start counts in the runner's timeout: minutes in a VM under TCG
        if proc.returncode != 0:
            return {}
        found: dict[str, float] = {}
        for line in json.loads(proc.stdout)["body"].splitlines():
            if line.startswith(SYNC_METRIC + "{"):
                labels, value = line[len(SYNC_METRIC) :].rsplit(None, 1)
                family = next((f for f in ("IPv4", "IPv6") if f'ip_family="{f}"' in labels), "")
                found[family] = float(value)
        return found

    def synced_since_change(self, node_name: str, families: Sequence[str], changed: Collection[str] = ("IPv4",)) -> bool:
        """Whether the node's proxy synced every family of `changed` (those the last change
        touched) since that change, and every one of `families` at least once. Upstream syncs
        a family only when something of that family changed."""
        syncs = self.last_syncs(node_name)
        return all(syncs.get(f, 0.0) >= self.changed_at for f in changed) and all(syncs.get(f, 0.0) > 0 for f in families)

    def dump(self, node_name: str) -> dict[str, str]:
        """`iptables-save` and `ip6tables-save` of the node, by family; for a mode whose record
        lists the IPVS table also that table, the ipsets and kube-ipvs0's addresses
        (lab/ipvs_compare.py's keys)."""
        ns = self.nodes[node_name].ns
        got = {"IPv4": ns.run(["iptables-save"]).stdout, "IPv6": ns.run(["ip6tables-save"]).stdout}
        if IPVS_LISTING in registry.mode(self.mode).listings:
            got[ipvs_compare.IPVS] = ns.run(list(IPVS_LISTING)).stdout
            got[ipvs_compare.IPSET] = ns.run(["ipset", "save"]).stdout
            got[ipvs_compare.DUMMY] = ns.run(["ip", "-o", "addr", "show", "dev", ipvs_compare.DUMMY], check=False).stdout
        return got

    # ---- waiting ------------------------------------------------------------------------------

    def slices_settled(self, expected: Mapping[str, set[tuple[str, bool, bool, bool]]]) -> bool:
        """Whether the EndpointSlices of each Service name hold exactly `expected`'s
        (ip, ready, serving, terminating) endpoints."""
        answer = self.cp.api.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices")
        if answer.status_code != 200:
            return False
        seen: dict[str, set[tuple[str, bool, bool, bool]]] = {name: set() for name in expected}
        for item in answer.json()["items"]:
            service = item["metadata"].get("labels", {}).get("kubernetes.io/service-name", "")
            if service not in seen:
                continue
            for ep in item.get("endpoints") or []:
                cond = ep.get("conditions", {})
                for address in ep["addresses"]:
                    seen[service].add(
                        (address, bool(cond.get("ready")), bool(cond.get("serving")), bool(cond.get("terminating")))
                    )
        return seen == {k: set(v) for k, v in expected.items()}

    def await_step(
        self,
        expected: Mapping[str, set[tuple[str, bool, bool, bool]]],
        *,
        families: Sequence[str] = ("IPv4", "IPv6"),
        drop: Sequence[str] = (),
        node_local: Collection[str] = (),
        changed: Collection[str] = ("IPv4",),
        timeout: float = 30,
    ) -> list[str]:
        """After a change: until the slices hold `expected`, both proxies have synced since, and
        their rules are equal (role-named); returns the differences left at the deadline.
        `node_local` names the Services (internalTrafficPolicy Local, no external traffic) whose
        endpoints a node programs only when they are its own pods; `changed`, the families the
        change touched (each proxy must have synced them since)."""
        deadline = time.monotonic() + timeout
        while not self.slices_settled(expected):
            self.check_alive()
            if time.monotonic() >= deadline:
                raise ClusterError(f"the EndpointSlices did not reach {dict(expected)} in {timeout:g} s")
            time.sleep(0.1)
        present = {ip for eps in expected.values() for ip, _, _, _ in eps}
        on_node = {ip: pod.info.node_name for pod in self.pods.values() for ip in pod.info.ips}

        def ready(node_name: str) -> set[str]:
            return {
                ip
                for service, eps in expected.items()
                for ip, is_ready, _, _ in eps
                if is_ready and (service not in node_local or on_node.get(ip) == node_name)
            }

        diffs: list[str] = []
        dumps: dict[str, dict[str, str]] = {}
        while True:
            self.check_alive()
            if all(self.synced_since_change(n, families, changed) for n in (UPSTREAM_NODE, OURS_NODE)):
                dumps = {n: self.dump(n) for n in (UPSTREAM_NODE, OURS_NODE)}
                # Equal rules that miss a ready endpoint or keep a gone one are equally stale, not converged.
                fresh = all(ready(n) <= _destinations(d) <= present for n, d in dumps.items())
                diffs = self.differences(dumps, families=families, drop=drop)
                if fresh and not diffs:
                    return []
            if time.monotonic() >= deadline:
                return diffs or [f"the proxies' rules did not take in the change within {timeout:g} s"]
            time.sleep(0.1)

    def differences(
        self,
        dumps: Mapping[str, Mapping[str, str]] | None = None,
        *,
        families: Sequence[str] = ("IPv4", "IPv6"),
        drop: Sequence[str] = (),
    ) -> list[str]:
        """What differs between the two nodes' rules, per family, each node's own endpoints named by role."""
        got = dumps or {n: self.dump(n) for n in (UPSTREAM_NODE, OURS_NODE)}
        pods = self.pods_by_ip()
        if ipvs_compare.IPVS in got[UPSTREAM_NODE]:
            names = (f"upstream ({UPSTREAM_NODE})", f"ours ({OURS_NODE})")
            return ipvs_compare.differences(got[UPSTREAM_NODE], self.roles(UPSTREAM_NODE), got[OURS_NODE],
                                            self.roles(OURS_NODE), names, families=families, drop=drop)  # fmt: skip
        out: list[str] = []
        for family in families:
            upstream = rules_compare.role_named(got[UPSTREAM_NODE][family], UPSTREAM_NODE, pods, drop)
            ours = rules_compare.role_named(got[OURS_NODE][family], OURS_NODE, pods, drop)
            found = rules_compare.differences(upstream, ours, f"upstream ({UPSTREAM_NODE})", f"ours ({OURS_NODE})")
            out += [f"{family} {d}" for d in found]
        return out

    def roles(self, node_name: str) -> ipvs_compare.Roles:
        """How the node's own addresses and its peer's (the other proxy node) are named (ipvs mode)."""
        peer_name = OURS_NODE if node_name == UPSTREAM_NODE else UPSTREAM_NODE
        node, peer = self.nodes[node_name], self.nodes[peer_name]
        return ipvs_compare.Roles.of(node_name, (node.ip, node.ip6), peer_name, (peer.ip, peer.ip6), self.pods_by_ip())


def _destinations(dump: Mapping[str, str]) -> set[str]:
    """The pod addresses a node's dump sends new connections to: its DNAT rules', or in ipvs mode
    its real servers of weight > 0 (the `kubernetes` Service's endpoint is no pod)."""
    pods = [ipaddress.ip_network(cidr) for cidr in CLUSTER_CIDRS]
    if ipvs_compare.IPVS in dump:
        ips = ipvs_compare.serving_addresses(dump[ipvs_compare.IPVS])
    else:
        chains = [rules_compare.endpoint_chains(dump[family]) for family in ("IPv4", "IPv6")]
        ips = {endpoint.rsplit(":", 1)[0].strip("[]") for found in chains for endpoint in found.values()}
    return {ip for ip in ips if any(ipaddress.ip_address(ip) in cidr for cidr in pods)}


def _attach(switch: L.NetNS, ns: L.NetNS, cidr: str, index: int) -> None:
    port = f"p{index}"
    switch.run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns.name])
    L.ip_batch(switch, [f"link set {port} master br0", f"link set {port} up"])
    L.ip_batch(ns, [f"addr add {cidr} dev eth0", "link set eth0 up"])
