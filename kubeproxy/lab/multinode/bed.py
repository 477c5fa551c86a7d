"""The multi-node bed: nodes, pods, routes, the API server, one proxy per node, a client and a
load balancer, each in its own network namespace; everything is removed when the block ends.

    client 172.18.0.10 ── lb/router 172.18.0.1 | 192.168.10.1 ──┐
                                                                  │  underlay: a bridge in its
    control plane 192.168.10.2 (test API server) ────────────────┤  own "switch" namespace
    node-1 192.168.10.11  pods 10.244.1.0/24  zone-a ────────────┤
    node-2 192.168.10.12  pods 10.244.2.0/24  zone-b ────────────┤
    node-3 192.168.10.13  pods 10.244.3.0/24  zone-b ────────────┘

Routing is a simple CNI's (host-gw): each pod has a veth to its node and a /32 route there
(wired as Calico wires it, as in lab/cluster.py), and each node routes every other node's pod
CIDR via that node's underlay address. Nodes route everything else via the lb/router namespace,
which forwards between the client's network and the underlay, so the client reaches NodePorts
and the pods' answers reach the client with its own address.

With `build(dual_stack=True)` everything has an IPv6 twin (underlay fd00:10::/64, node-N
fd00:10::1N with pods in fd00:244:N::/64, client fd00:18::10, Nodes with both InternalIPs and
podCIDRs), so every proxy programs both families; the API server stays on IPv4.

Each node runs `kubeproxy run --kubeconfig ... --hostname-override node-N` in its namespace,
watching the one API server; the test publishes Services, EndpointSlices and Nodes with
`apply()`. The load balancer (lb_handle.py, lb.py) runs in the lb namespace.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kubeproxy.cluster.objects import LABEL_ZONE
from kubeproxy.lab import builders, node_rules
from kubeproxy.lab import netns as L
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.cluster import (
    HTTP_GET,
    METRICS_BIND,
    PROBE,
    SYNC_METRIC,
    ClusterError,
    HttpAnswer,
    Pod,
    ProxyExited,
    await_ready,
    http_get,
    kubeproxy_binary,
    last_lines,
    pod_interface,
    poll,
    wire_pod,
)
from kubeproxy.lab.kubelet import LabKubelet, NodeInfo, PodInfo
from kubeproxy.lab.multinode.control import start_in
from kubeproxy.lab.multinode.lb_handle import LoadBalancer
from kubeproxy.lab.multinode.upstream import UpstreamControl
from kubeproxy.model.options import Family
from kubeproxy.proxy.health import TO_BE_DELETED_TAINT

UNDERLAY = ipaddress.ip_network("192.168.10.0/24")
ROUTER_IP = "192.168.10.1"  # the lb namespace's underlay address: the nodes' gateway
CONTROL_IP = "192.168.10.2"
CLIENT_NET = ipaddress.ip_network("172.18.0.0/24")
CLIENT_GATEWAY = "172.18.0.1"
CLIENT_IP = "172.18.0.10"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
# IPv6 alongside, with `build(dual_stack=True)`: the same plan in ULA space (node-N is fd00:10::1N,
# its pods fd00:244:N::/64, the client fd00:18::10). The API server stays on IPv4.
UNDERLAY6 = ipaddress.ip_network("fd00:10::/64")
ROUTER_IP6 = "fd00:10::1"
CLIENT_NET6 = ipaddress.ip_network("fd00:18::/64")
CLIENT_GATEWAY6 = "fd00:18::1"
CLIENT_IP6 = "fd00:18::10"
CLUSTER_CIDR6 = "fd00:244::/48"
SERVICE_CIDR6 = "fd00:96::/108"
DEFAULT_ZONES = ("zone-a", "zone-b", "zone-b")
# Whose API server the nodes' proxies watch: the test API server in this process ("lab"), or
# upstream's etcd, kube-apiserver and kube-controller-manager (multinode/upstream.py).
CONTROL_PLANES = ("lab", "upstream")
HEALTHZ_PORT = 10256
_FIRST_POD_HOST = 10
_NODE_SYSCTLS = [
    "net.ipv4.ip_forward=1",
    # kube-proxy needs loose reverse-path filtering (DNATed replies come back on another path)
    "net.ipv4.conf.all.rp_filter=2",
    "net.ipv4.conf.default.rp_filter=2",
    "net.ipv4.conf.all.route_localnet=1",
    # REJECTs answer with ICMP, rate-limited per peer by default; tests must see every answer
    "net.ipv4.icmp_ratelimit=0",
]
_NODE_SYSCTLS6 = ["net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0"]


@dataclass
class Node:
    name: str
    index: int  # 1-based: node-1 is 192.168.10.11 with pods in 10.244.1.0/24
    ip: str
    pod_cidr: str
    zone: str
    ns: L.NetNS
    ip6: str = ""  # with build(dual_stack=True)
    pod_cidr6: str = ""
    proxy: subprocess.Popen[str] | None = None
    next_host: int = _FIRST_POD_HOST

    @property
    def healthz_url(self) -> str:
        return f"http://{self.ip}:{HEALTHZ_PORT}/healthz"


@dataclass
class DualPod(Pod):
    """A pod of this bed: its IPv4 address (`ip`) and, with build(dual_stack=True), its IPv6 one."""

    ip6: str = ""

    def address(self, family: Family = Family.IPV4) -> str:
        if family == Family.IPV4:
            return self.ip
        if not self.ip6:
            raise ClusterError(f"pod {self.name} has no IPv6 address: build the bed with dual_stack=True")
        return self.ip6

    def endpoint(self, port: int, family: Family = Family.IPV4) -> str:
        """`ip:port`, or `[ip]:port` for IPv6 (as the probes and the rule readers spell it)."""
        ip = self.address(family)
        return f"[{ip}]:{port}" if family == Family.IPV6 else f"{ip}:{port}"

    def backend(
        self, *, ready: bool = True, serving: bool = True, terminating: bool = False, family: Family = Family.IPV4
    ) -> builders.Backend:
        return builders.Backend(self.address(family), self.node_name, ready=ready, serving=serving, terminating=terminating)


Source = L.NetNS | Pod | Node


@dataclass
class MultiNodeCluster:
    workdir: Path
    switch: L.NetNS
    control: L.NetNS
    lb: L.NetNS
    client: L.NetNS
    api: ApiServer | UpstreamControl  # see CONTROL_PLANES
    proxy_mode: str
    tcp_ports: tuple[int, ...]
    dual_stack: bool = False
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, DualPod] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    # Every Service published: the nftables maps are keyed by address and port, not by name,
    # so the rule waits look a service port up here (lab/node_rules.py).
    _services: dict[tuple[str, str], builders.JSON] = field(default_factory=dict, repr=False)
    # Pods the lab kubelet reported to upstream's API server, by name.
    _reported: dict[str, PodInfo] = field(default_factory=dict, repr=False)

    # ---- building ---------------------------------------------------------------------------

    @classmethod
    @contextmanager
    def build(
        cls,
        nodes: int = 3,
        *,
        proxy_mode: str = "iptables",
        zones: Sequence[str] = DEFAULT_ZONES,
        tcp_ports: Sequence[int] = (8080,),
        dual_stack: bool = False,
        control_plane: str = "lab",
    ) -> Iterator[MultiNodeCluster]:
        """The namespaces, the underlay and its routes, and the API server with a Node object
        per node (no pods, no proxies yet: `add_pod`, `start_proxies`). With `dual_stack`, every
        address, route and Node has its IPv6 twin too (dual-stack nodes). `control_plane` is
        one of CONTROL_PLANES."""
        if control_plane not in CONTROL_PLANES:
            raise ClusterError(f"control_plane {control_plane!r}: want one of {', '.join(CONTROL_PLANES)}")
        if control_plane == "upstream" and dual_stack:
            raise ClusterError("the lab runs upstream's control plane IPv4 only: no dual_stack with it")
        if proxy_mode not in node_rules.MODES:
            raise ClusterError(f"proxy_mode {proxy_mode!r}: want one of {', '.join(node_rules.MODES)}")
        if not 1 <= nodes <= 9:
            raise ClusterError(f"nodes {nodes}: want 1 to 9 (one /24 of pods each, 10.244.1-9.0/24)")
        with ExitStack() as stack:
            workdir = Path(tempfile.mkdtemp(prefix="kp-multinode-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            names = ["kpsw", "kpcp", "kplb", "kpcli"]
            switch, control, lb, client = (stack.enter_context(L.netns(n)) for n in names)
            for ns in (switch, control, lb, client):
                _no_dad(ns, dual_stack)
            api = ApiServer(bookmark_interval=5, host=CONTROL_IP)
            bed = cls(workdir, switch, control, lb, client, api, proxy_mode, tuple(tcp_ports), dual_stack, _stack=stack)
            bed._wire_switch()
            bed._attach(control, f"{CONTROL_IP}/{UNDERLAY.prefixlen}")
            bed._attach(lb, f"{ROUTER_IP}/{UNDERLAY.prefixlen}", f"{ROUTER_IP6}/{UNDERLAY6.prefixlen}")
            bed._wire_client()
            for i in range(1, nodes + 1):
                bed._add_node(i, zones[(i - 1) % len(zones)] if zones else "")
            bed._route_pod_cidrs()
            if control_plane == "upstream":
                # In place of the test API server made above, which never starts.
                upstream = stack.enter_context(
                    UpstreamControl.start(workdir / "control-plane", control, CONTROL_IP, SERVICE_CIDR)
                )
                bed.api = upstream
                for node in bed.nodes.values():
                    upstream.kubelet.register_node(NodeInfo(node.name, (node.ip,), (node.pod_cidr,), node.zone))
            else:
                start_in(control, api)
                stack.callback(api.stop)
                for node in bed.nodes.values():
                    api.apply(bed.node_object(node.name))
            # Unwound in reverse: the balancer and proxies stop before the pods and namespaces go.
            stack.callback(bed.stop_proxies)
            yield bed

    def _wire_switch(self) -> None:
        L.ip_batch(self.switch, ["link add br0 type bridge", "link set br0 up"])
        # If br_netfilter is loaded, bridged frames would pass the switch's (empty) netfilter; a
        # switch should just switch.
        self.switch.run(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"], check=False)

    def _attach(self, ns: L.NetNS, cidr: str, cidr6: str = "") -> None:
        """A veth from `ns` (named eth0 there) to a port of the underlay bridge."""
        port = f"p{len(self._ports_seen())}"
        self.switch.run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns.name])
        L.ip_batch(self.switch, [f"link set {port} master br0", f"link set {port} up"])
        # nodad: the address is usable at once (no second of duplicate detection to wait out)
        v6 = [f"addr add {cidr6} dev eth0 nodad"] if self.dual_stack and cidr6 else []
        L.ip_batch(ns, [f"addr add {cidr} dev eth0", *v6, "link set eth0 up"])

    def _ports_seen(self) -> list[str]:
        out = self.switch.run(["ip", "-o", "link", "show", "master", "br0"]).stdout
        return out.splitlines()

    def _wire_client(self) -> None:
        prefix = CLIENT_NET.prefixlen
        self.lb.run(["ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", self.client.name])
        L.ip_batch(self.lb, [f"addr add {CLIENT_GATEWAY}/{prefix} dev eth1", "link set eth1 up"])
        L.ip_batch(
            self.client,
            [f"addr add {CLIENT_IP}/{prefix} dev eth0", "link set eth0 up", f"route add default via {CLIENT_GATEWAY}"],
        )
        self.lb.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        if self.dual_stack:
            prefix6 = CLIENT_NET6.prefixlen
            L.ip_batch(self.lb, [f"addr add {CLIENT_GATEWAY6}/{prefix6} dev eth1 nodad"])
            L.ip_batch(
                self.client, [f"addr add {CLIENT_IP6}/{prefix6} dev eth0 nodad", f"route add default via {CLIENT_GATEWAY6}"]
            )
            self.lb.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])

    def _add_node(self, index: int, zone: str) -> None:
        name = f"node-{index}"
        ns = self._stack.enter_context(L.netns(f"kpn{index}"))
        _no_dad(ns, self.dual_stack)
        ip = str(UNDERLAY[10 + index])
        node = Node(name, index, ip, f"10.244.{index}.0/24", zone, ns)
        if self.dual_stack:
            node.ip6, node.pod_cidr6 = str(UNDERLAY6[0x10 + index]), f"fd00:244:{index}::/64"
        self.nodes[name] = node
        self._attach(ns, f"{ip}/{UNDERLAY.prefixlen}", f"{node.ip6}/{UNDERLAY6.prefixlen}")
        L.ip_batch(
            ns, [f"route add default via {ROUTER_IP}", *([f"route add default via {ROUTER_IP6}"] if self.dual_stack else [])]
        )
        ns.run(["sysctl", "-qw", *_NODE_SYSCTLS, *(_NODE_SYSCTLS6 if self.dual_stack else [])])

    def _route_pod_cidrs(self) -> None:
        for node in self.nodes.values():
            others = [n for n in self.nodes.values() if n is not node]
            routes = [f"route add {n.pod_cidr} via {n.ip}" for n in others]
            routes += [f"route add {n.pod_cidr6} via {n.ip6}" for n in others if n.pod_cidr6]
            L.ip_batch(node.ns, routes or ["link show lo"])
        # The router sends pod traffic straight to the node that hosts it, as a fabric that
        # learned the pod CIDRs would (used by answers to clients that reach pods directly).
        routes = [f"route add {n.pod_cidr} via {n.ip}" for n in self.nodes.values()]
        routes += [f"route add {n.pod_cidr6} via {n.ip6}" for n in self.nodes.values() if n.pod_cidr6]
        L.ip_batch(self.lb, routes)

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise ClusterError(f"no node {name!r}; there are {', '.join(self.nodes)}") from None

    # ---- pods ---------------------------------------------------------------------------------

    def add_pod(self, name: str, node_name: str) -> DualPod:
        """A pod namespace on `node_name` with the next free IP of its pod CIDR, serving the TCP ports."""
        if name in self.pods:
            raise ClusterError(f"pod {name!r} exists already")
        node = self.node(node_name)
        ip = str(ipaddress.ip_network(node.pod_cidr)[node.next_host])
        ip6 = str(ipaddress.ip_network(node.pod_cidr6)[node.next_host]) if node.pod_cidr6 else ""
        node.next_host += 1
        ns = L.create("kppod")
        _no_dad(ns, self.dual_stack)
        host_if = pod_interface(ns, name)
        pod = DualPod(name, ip, node.name, ns, host_if, ip6=ip6)
        self.pods[name] = pod
        self._stack.callback(self._delete_pod, pod)
        wire_pod(node.ns, ns, host_if, ip, ip6)
        if self.tcp_ports:
            listens = [a for p in self.tcp_ports for a in ("--listen", f"{ip}:{p}")]
            listens += [a for p in self.tcp_ports for a in ("--listen", f"[{ip6}]:{p}")] if ip6 else []
            child = ns.popen(
                [*PROBE, "serve", "--proto", "tcp", *listens], stdout=subprocess.PIPE, stderr=self.log(f"pod-{name}.log")
            )
            await_ready(f"the probe in pod {name}", child, timeout=15)
        return pod

    def remove_pod(self, name: str) -> None:
        """Kill a pod and remove its namespace (its endpoint should be out of the slices first).
        A pod reported to upstream's API server is deleted there for good too, as its kubelet does."""
        pod = self.pods.get(name)
        if pod is None:
            raise ClusterError(f"no pod {name!r}")
        self._delete_pod(pod)
        info = self._reported.pop(name, None)
        if info is not None:
            self._kubelet().finish_termination(info)

    # ---- pods through upstream's API (control_plane="upstream") ----------------------------------

    def _kubelet(self) -> LabKubelet:
        if not isinstance(self.api, UpstreamControl):
            raise ClusterError("pods are reported to the API only with upstream's control plane (control_plane='upstream')")
        return self.api.kubelet

    def report_pod(self, name: str, labels: dict[str, str], *, ready: bool = True) -> None:
        """Tell upstream's API server that pod `name` runs with `labels`: its EndpointSlice
        controller puts it in the slices of the Services that select it."""
        pod = self.pods[name]
        ports = tuple((f"tcp-{port}", port, "TCP") for port in self.tcp_ports)
        info = PodInfo(name, pod.node_name, (pod.ip,), dict(labels), ports)
        self._kubelet().report_pod(info, ready=ready)
        self._reported[name] = info

    def terminate_pod(self, name: str) -> None:
        """`kubectl delete pod`: the pod terminates (still serving) until `remove_pod`."""
        self._kubelet().start_termination(self._reported[name])

    def _delete_pod(self, pod: Pod) -> None:
        if pod.removed:
            return
        pod.removed = True
        self.pods.pop(pod.name, None)
        pod.ns.delete()  # the veth pair and the node's route to it go with the namespace

    # ---- objects ------------------------------------------------------------------------------

    def node_object(self, name: str, *, taints: Sequence[str] = (), deleting: bool = False) -> builders.JSON:
        """`name`'s Node: podCIDR, InternalIP, zone label; `taints` (keys, NoSchedule) and a
        deletionTimestamp when `deleting`, as a draining cluster autoscaler sets them."""
        node = self.node(name)
        obj = builders.node(node.name, node.ip, node.pod_cidr)
        if node.ip6:
            obj["spec"]["podCIDRs"].append(node.pod_cidr6)
            obj["status"]["addresses"].insert(1, {"type": "InternalIP", "address": node.ip6})
        if node.zone:
            obj["metadata"]["labels"][LABEL_ZONE] = node.zone
        if taints:
            obj["spec"]["taints"] = [{"key": key, "effect": "NoSchedule"} for key in taints]
        if deleting:
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return obj

    def drain(self, name: str, *, deleting: bool = False) -> None:
        """Mark `name` as the cluster autoscaler does before removing a node (its taint), or
        as being deleted (deletionTimestamp); upstream's /healthz fails for both."""
        self.apply(self.node_object(name, taints=() if deleting else (TO_BE_DELETED_TAINT,), deleting=deleting))

    def apply(self, *objs: builders.JSON) -> None:
        """Create or replace objects in the API server; every proxy's watch gets them."""
        for obj in objs:
            if obj.get("kind") == "Service":
                meta = obj["metadata"]
                self._services[(meta.get("namespace", "default"), meta["name"])] = obj
            self.api.apply(obj)

    def delete(self, kind: str, name: str, namespace: str = "default") -> None:
        self.api.delete(kind, namespace, name)
        if kind == "Service":
            self._services.pop((namespace, name), None)

    # ---- proxies ------------------------------------------------------------------------------

    def start_proxies(self, *extra_args: str) -> None:
        """`kubeproxy run` in every node namespace against the API server (a kubeconfig per node)."""
        for node in self.nodes.values():
            self.start_proxy(node.name, *extra_args)

    def start_proxy(self, name: str, *extra_args: str) -> subprocess.Popen[str]:
        node = self.node(name)
        if node.proxy is not None and node.proxy.poll() is None:
            raise ClusterError(f"{name}: a proxy is running already")
        kubeconfig = self.api.write_kubeconfig(self.workdir / f"{name}.kubeconfig")
        argv = [
            kubeproxy_binary(),
            "-v",
            "2",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--hostname-override",
            node.name,
            "--proxy-mode",
            self.proxy_mode,
            "--cluster-cidr",
            f"{CLUSTER_CIDR},{CLUSTER_CIDR6}" if self.dual_stack else CLUSTER_CIDR,
            "--healthz-bind-address",
            f"0.0.0.0:{HEALTHZ_PORT}",
            "--metrics-bind-address",
            METRICS_BIND,
            *extra_args,
        ]
        node.proxy = node.ns.popen(argv, stdout=self.log(f"proxy-{name}.log"), stderr=subprocess.STDOUT)
        return node.proxy

    def stop_proxies(self, timeout: float = 10) -> None:
        for node in self.nodes.values():
            proc, node.proxy = node.proxy, None
            if proc is not None:
                L.stop_process(proc, timeout)

    def proxy_log(self, name: str) -> str:
        path = self.workdir / f"proxy-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _check_alive(self) -> None:
        for node in self.nodes.values():
            if node.proxy is not None and node.proxy.poll() is not None:
                raise ProxyExited(
                    f"{node.name}'s proxy exited with status {node.proxy.returncode}:\n{last_lines(self.proxy_log(node.name))}"
                )

    def wait_synced(self, timeout: float = 30) -> None:
        """Until every proxy has completed a sync (its last-sync metric is set)."""
        for node in self.nodes.values():

            def synced(node: Node = node) -> bool:
                self._check_alive()
                proc = node.ns.run([sys.executable, "-c", HTTP_GET, f"http://{METRICS_BIND}/metrics", "2"], check=False)
                if proc.returncode != 0:
                    return False
                body = json.loads(proc.stdout)["body"]
                return any(line.startswith(SYNC_METRIC) and float(line.split()[-1]) > 0 for line in body.splitlines())

            poll(f"{node.name}'s first sync", synced, timeout=timeout, interval=0.2)

    def rules(self, name: str, family: Family = Family.IPV4) -> node_rules.NodeRules:
        """One snapshot of node `name`'s rules of `family` in the proxy's mode."""
        run = self.node(name).ns
        return node_rules.read(self.proxy_mode, run, self._services.values(), family)

    def endpoints(self, name: str, service_port: str, *, family: Family = Family.IPV4) -> set[str]:
        """`ip:port`s (`[ip]:port` for IPv6) node `name`'s rules of `family` DNAT
        `service_port` (`ns/name:port`) to."""
        found = self.rules(name, family).endpoints(service_port)
        return {_bracketed(ep) for ep in found} if family.ipv6 else found

    def wait_rules(
        self,
        name: str,
        what: str,
        check: Callable[[node_rules.NodeRules], bool],
        timeout: float = 20,
        family: Family = Family.IPV4,
    ) -> None:
        """Until `check` holds for node `name`'s rules of `family`; on timeout the error says
        `what` and shows the proxy's log."""

        def holds() -> bool:
            self._check_alive()
            return check(self.rules(name, family))

        try:
            poll(f"{name}'s rules: {what}", holds, timeout=timeout, interval=0.1)
        except ClusterError as exc:
            raise ClusterError(f"{exc}; proxy log:\n{last_lines(self.proxy_log(name))}") from None

    def wait_endpoints(
        self, service_port: str, expected: dict[str, Iterable[str]], timeout: float = 20, *, family: Family = Family.IPV4
    ) -> None:
        """Until each node's rules of `family` for `service_port` go to exactly its `expected`
        `ip:port`s. (An empty set also matches rules that do not know the service yet: to wait
        for a node to have none *local*, use `wait_rules`.)"""
        for name, want in expected.items():
            wanted = set(want)
            seen: list[set[str]] = []

            def matched(
                rules: node_rules.NodeRules, name: str = name, wanted: set[str] = wanted, seen: list[set[str]] = seen
            ) -> bool:
                found = rules.endpoints(service_port)
                seen[:] = [{_bracketed(ep) for ep in found} if family.ipv6 else found]
                return seen[0] == wanted

            try:
                self.wait_rules(name, f"{service_port} to go to {sorted(wanted)}", matched, timeout, family)
            except ClusterError as exc:
                got = sorted(seen[0]) if seen else "nothing read"
                raise ClusterError(f"{exc}\n(the rules went to {got})") from None

    # ---- traffic ------------------------------------------------------------------------------

    def request(self, src: Source, dst: str, count: int = 1, timeout: float = 1.0) -> list[Any]:
        """`count` TCP probes (one new connection each) from `src` to `dst` (`ip:port`): each the
        pod's {"dst", "src"}, or "refused" / "timeout"."""
        ns = src if isinstance(src, L.NetNS) else src.ns
        argv = [*PROBE, "send", "--proto", "tcp", "--dst", dst, "--count", str(count), "--timeout", str(timeout)]
        results: list[Any] = json.loads(ns.run(argv, timeout=30 + count * timeout).stdout)
        return results

    def http_get(self, src: Source, url: str, timeout: float = 2.0) -> HttpAnswer:
        """One GET from `src`'s namespace; any status is an answer (no answer raises)."""
        return http_get(src if isinstance(src, L.NetNS) else src.ns, url, timeout)

    def wait_health_checks(
        self, port: int, want: dict[str, int], timeout: float = 20, *, family: Family = Family.IPV4
    ) -> dict[str, HttpAnswer]:
        """Until a GET from the lb namespace to each node's `http://ip:port/healthz` (its IPv6
        address for IPv6) answers `want[node]` (a status); returns the answers. The listener
        opens after the sync that programs the service, so a wait on the rules alone may beat it."""
        seen: dict[str, str] = {}

        def answered() -> dict[str, HttpAnswer] | None:
            self._check_alive()
            out = {}
            for name, status in want.items():
                try:
                    answer = self.http_get(self.lb, f"http://{self.node_address(name, family)}:{port}/healthz")
                except ClusterError as exc:
                    seen[name] = str(exc).splitlines()[-1]
                    return None
                seen[name] = str(answer.status)
                if answer.status != status:
                    return None
                out[name] = answer
            return out

        try:
            return poll(f"health checks on port {port} to answer {want}", answered, timeout=timeout, interval=0.1)
        except ClusterError as exc:
            raise ClusterError(f"{exc}; seen {seen}") from None

    def node_address(self, name: str, family: Family = Family.IPV4) -> str:
        """`name`'s underlay address of `family` as a URL or `ip:port` spells it (IPv6 in brackets)."""
        node = self.node(name)
        if family == Family.IPV4:
            return node.ip
        if not node.ip6:
            raise ClusterError(f"{name} has no IPv6 address: build the bed with dual_stack=True")
        return f"[{node.ip6}]"

    def start_lb(
        self,
        port: int,
        *,
        health_port: int = 0,
        proxy_healthz: bool = False,
        rate: float = 50.0,
        interval: float = 0.1,
        timeout: float = 1.0,
        nodes: Sequence[str] | None = None,
        family: Family = Family.IPV4,
    ) -> LoadBalancer:
        """The load balancer in the lb namespace, sending to NodePort `port` of `nodes` (all by
        default) that pass `health_port` (the service's healthCheckNodePort) and, with
        `proxy_healthz`, kube-proxy's /healthz; over the nodes' `family` addresses. Stopped when the bed goes."""
        targets = [(n, self.node_address(n, family).strip("[]")) for n in (nodes or self.nodes)]
        lb = LoadBalancer.start(
            self.lb,
            targets,
            port=port,
            log=self.log("lb.log"),
            health_port=health_port,
            proxy_healthz=HEALTHZ_PORT if proxy_healthz else 0,
            rate=rate,
            interval=interval,
            timeout=timeout,
        )
        self._stack.callback(lb.stop)
        return lb

    def log(self, name: str) -> IO[str]:
        return self._stack.enter_context((self.workdir / name).open("a"))


def _bracketed(endpoint: str) -> str:
    """`[ip]:port` for an IPv6 `ip:port` read without brackets (the nftables reader's form)."""
    if endpoint.startswith("["):
        return endpoint
    ip, _, port = endpoint.rpartition(":")
    return f"[{ip}]:{port}"


def _no_dad(ns: L.NetNS, dual_stack: bool) -> None:
    """No duplicate address detection in `ns`: the interfaces made next (their link-local
    addresses too, which neighbour discovery sends from) are usable at once, not a second or
    two later. Only needed, and only set, when the bed has IPv6."""
    if dual_stack:
        ns.run(["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"])
