"""The seed's world in network namespaces: resolvers, a node running `kubeproxy run`, BIND pods.

    client  192.168.0.10 + 254 resolver addresses 100.64.0.1-254 ── node-1 (kubeproxy run) ── pod bind-1 (named)
            routes the external IP 203.0.113.53 via the node                                 └─ pod bind-2 ...

It is a MiniCluster (kubeproxy.lab.cluster) whose pods run a real BIND 9 instead of the probe
servers, with the DNS Service of the BIND report: a ClusterIP, an external IP and a NodePort, UDP and
TCP port 53, its EndpointSlice naming the BIND pods. A scenario (kubeproxy.lab.dns.scenarios)
picks the traffic policy, the proxy mode and whether the seed's manual DNAT rule goes in.

Everything (namespaces, named, the proxy, temporary files) is removed when the block ends,
whether it ended well or not.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kubeproxy.backends import registry
from kubeproxy.lab import builders
from kubeproxy.lab import netns as L
from kubeproxy.lab.builders import JSON, Port, endpoint_slice, service
from kubeproxy.lab.cluster import (
    CLUSTER_CIDR,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    ClusterError,
    MiniCluster,
    kubeproxy_binary,
    last_lines,
)
from kubeproxy.lab.dns.bind import ANSWER_IP, ANSWER_NAME, DNS_PORT, BindServer
from kubeproxy.lab.dns.scenarios import Scenario
from kubeproxy.model.options import NodeOptions

SERVICE_NAMESPACE, SERVICE_NAME = "dns", "bind"
CLUSTER_IP = "10.96.0.53"
EXTERNAL_IP = "203.0.113.53"  # in the MiniCluster's external range, which the client routes via the node
NODE_PORT = 30053
DNS_UDP = Port("dns-udp", DNS_PORT, DNS_PORT, "UDP", node_port=NODE_PORT)
DNS_TCP = Port("dns-tcp", DNS_PORT, DNS_PORT, "TCP", node_port=NODE_PORT)
# The resolvers the load comes from (RFC 6598 space: "many clients behind a carrier's NAT").
SOURCE_CIDR = "100.64.0.0/24"
# MASQUERADE without --to-ports maps source ports >= 1024 into 1024-65535: per (node IP, pod IP,
# pod port) at most this many UDP flows can be masqueraded at once.
SNAT_PORTS = 65535 - 1024 + 1
MANUAL_DNAT_COMMENT = "kubeproxy lab: manual DNAT of the BIND report"  # no quote: iptables-save would escape it
NARROWED_SNAT_COMMENT = "kubeproxy lab: narrowed SNAT ports"
# The mark the lab's proxy (default flags) puts on flows it masquerades.
MASQ_MARK = NodeOptions().masquerade_mark
_SYSCTL = "/proc/sys/net/netfilter/"


class LabError(RuntimeError):
    """The lab could not be built or run; the message says what, with the evidence."""


@dataclass
class DnsWorld:
    scenario: Scenario
    cluster: MiniCluster
    servers: list[BindServer]
    objects: list[JSON]
    source_cidr: str
    sources: int
    _stack: ExitStack = field(repr=False)

    @classmethod
    @contextmanager
    def build(
        cls,
        scenario: Scenario,
        *,
        pods: int = 1,
        udp_timeout: int | None = None,
        source_cidr: str = SOURCE_CIDR,
        proxy_timeout: float = 30,
    ) -> Iterator[DnsWorld]:
        """The world for `scenario`, with `pods` BIND pods, the proxy synced and the external IP answering.

        `udp_timeout` (seconds) sets the node's nf_conntrack_udp_timeout and _stream; None keeps
        the kernel's defaults (30 s and 120 s).
        """
        if pods < 1:
            raise LabError(f"pods: {pods}: at least one BIND pod is needed")
        names = [f"bind-{i + 1}" for i in range(pods)]
        with ExitStack() as stack:
            try:
                cluster = stack.enter_context(MiniCluster.build(pods=names, remote_pods=(), tcp_ports=(), udp_ports=()))
            except (ClusterError, L.NetnsError, subprocess.CalledProcessError) as exc:
                raise LabError(f"could not build the namespaces: {exc}") from None
            sources = _add_sources(cluster, source_cidr)
            servers = [stack.enter_context(BindServer.start(cluster.pods[n].ns, cluster.pods[n].ip)) for n in names]
            if udp_timeout is not None:
                set_udp_timeout(cluster.node, udp_timeout)
            objs = service_objects(cluster, scenario, names)
            world = cls(scenario, cluster, servers, objs, source_cidr, sources, stack)
            world._start_proxy(proxy_timeout)
            if scenario.manual_dnat:
                world._insert_manual_dnat()
            world.flush_conntrack()
            yield world

    # ---- building ------------------------------------------------------------------------------

    def _start_proxy(self, timeout: float) -> None:
        c = self.cluster
        c.write_manifests(self.objects)
        # The pods hang off unnumbered veths, where REDIRECT has no address to send to: the
        # userspace relay listens on the node IP and its rules DNAT there (upstream's --bind-address).
        bind = ("--bind-address", NODE_IP) if registry.mode(self.scenario.proxy_mode).relays else ()
        c.start_proxy("--proxy-mode", self.scenario.proxy_mode, "--cluster-cidr", CLUSTER_CIDR, *bind)
        deadline = time.monotonic() + timeout
        while not self.answers(EXTERNAL_IP):
            if c.proxy is not None and c.proxy.poll() is not None:
                raise LabError(
                    f"scenario {self.scenario.name}: `kubeproxy run --proxy-mode {self.scenario.proxy_mode}` "
                    f"exited with status {c.proxy.returncode}:\n{last_lines(c.proxy_log(), 20)}"
                )
            if time.monotonic() >= deadline:
                raise LabError(
                    f"scenario {self.scenario.name}: {EXTERNAL_IP}:53 did not answer within {timeout:g} s of starting "
                    f"the proxy; proxy log:\n{last_lines(c.proxy_log(), 20)}"
                )
            time.sleep(0.2)

    def _insert_manual_dnat(self) -> None:
        """The seed's rule (`-A PREROUTING -i eth3 -p udp --dport 53 -m state --state NEW -j DNAT`),
        limited to the external IP and inserted ahead of kube-proxy's jump. With several pods the
        new queries are spread with `statistic` as kube-proxy spreads them."""
        ips = [s.ip for s in self.servers]
        for i, ip in enumerate(ips):
            spread = []
            if i < len(ips) - 1:
                spread = ["-m", "statistic", "--mode", "random", "--probability", f"{1 / (len(ips) - i):.10f}"]
            rule = ["-i", "eth0", "-d", f"{EXTERNAL_IP}/32", "-p", "udp", "-m", "udp", "--dport", str(DNS_PORT),
                    "-m", "state", "--state", "NEW", *spread, "-m", "comment", "--comment", MANUAL_DNAT_COMMENT,
                    "-j", "DNAT", "--to-destination", f"{ip}:{DNS_PORT}"]  # fmt: skip
            self.cluster.node.run(["iptables", "-w", "-t", "nat", "-I", "PREROUTING", str(i + 1), *rule])

    # ---- what the world offers -------------------------------------------------------------------

    @property
    def node(self) -> L.NetNS:
        return self.cluster.node

    @property
    def client(self) -> L.NetNS:
        return self.cluster.client

    @property
    def pod_ips(self) -> list[str]:
        return [s.ip for s in self.servers]

    def answers(self, server: str, port: int = DNS_PORT) -> bool:
        """One `dig` from the client: does `server` answer the lab's name?"""
        proc = self.client.run(
            ["dig", f"@{server}", "-p", str(port), "+short", "+time=1", "+tries=1", ANSWER_NAME, "A"], check=False, timeout=10
        )
        return proc.returncode == 0 and ANSWER_IP in proc.stdout.split()

    def flush_conntrack(self) -> None:
        self.node.run(["conntrack", "-F"], check=False)

    def udp_flow_timeouts(self, orig_dst: str) -> list[int]:
        """Seconds left to each of the node's UDP conntrack entries whose original destination is `orig_dst`."""
        out = self.node.run(["conntrack", "-L", "-p", "udp", "--orig-dst", orig_dst], check=False).stdout
        return [int(m.group(1)) for m in re.finditer(r"^udp\s+17\s+(\d+)\s", out, re.M)]

    def conntrack_count(self) -> int:
        return int(self._read(_SYSCTL + "nf_conntrack_count"))

    def conntrack_max(self) -> int:
        return int(self._read(_SYSCTL + "nf_conntrack_max"))

    def udp_timeout(self) -> int:
        return int(self._read(_SYSCTL + "nf_conntrack_udp_timeout"))

    def _read(self, path: str) -> str:
        return self.node.run(["cat", path]).stdout.strip()

    def manual_dnat_packets(self) -> int:
        """Packets (new flows) the manual DNAT rules have DNATed so far; 0 when there are none."""
        text = self.node.run(["iptables-save", "-c", "-t", "nat"]).stdout
        total = 0
        for line in text.splitlines():
            m = re.match(r"\[(\d+):\d+\] -A PREROUTING ", line)
            if m and MANUAL_DNAT_COMMENT in line:
                total += int(m.group(1))
        return total

    def narrow_snat_ports(self, low: int, high: int) -> None:
        """Masquerade the proxy's marked UDP flows into ports `low`-`high`, by a rule at the top of
        nat POSTROUTING, ahead of the proxy's own MASQUERADE (which the proxy's syncs leave alone).
        The node's ip_local_port_range would not narrow it: MASQUERADE without --to-ports keeps to
        1024-65535 whatever that range is."""
        if not 1024 <= low <= high <= 65535:
            raise LabError(f"SNAT ports {low}-{high}: need 1024 <= low <= high <= 65535")
        rule = ["-p", "udp", "-m", "mark", "--mark", f"{MASQ_MARK}/{MASQ_MARK}", "-m", "comment", "--comment",
                NARROWED_SNAT_COMMENT, "-j", "MASQUERADE", "--to-ports", f"{low}-{high}"]  # fmt: skip
        self.node.run(["iptables", "-w", "-t", "nat", "-I", "POSTROUTING", "1", *rule])

    def narrowed_snat_rule_first(self) -> bool:
        """Is the rule of narrow_snat_ports still the first of nat POSTROUTING?"""
        text = self.node.run(["iptables-save", "-t", "nat"]).stdout
        rules = [ln for ln in text.splitlines() if ln.startswith("-A POSTROUTING")]
        return bool(rules) and NARROWED_SNAT_COMMENT in rules[0]

    def masquerade_rule(self) -> str | None:
        """kube-proxy's MASQUERADE rule in the node, as iptables-save shows it (None if absent)."""
        for line in self.node.run(["iptables-save", "-t", "nat"]).stdout.splitlines():
            if line.startswith("-A KUBE-POSTROUTING") and "MASQUERADE" in line:
                return line
        return None

    def describe(self) -> str:
        s = self.scenario
        pods = ", ".join(f"{n}={ip}" for n, ip in zip((p for p in self.cluster.pods), self.pod_ips, strict=True))
        return (
            f"{s.name}: {s.summary}; Service {SERVICE_NAMESPACE}/{SERVICE_NAME} clusterIP {CLUSTER_IP}, "
            f"externalIP {EXTERNAL_IP}, nodePort {NODE_PORT}; BIND pods {pods}; "
            f"{self.sources} client addresses in {self.source_cidr}; node {NODE_IP}, UDP conntrack timeout "
            f"{self.udp_timeout()} s, conntrack max {self.conntrack_max()}"
        )


def check_proxy_mode(mode: str, wait: float = 3.0) -> None:
    """Fail early (LabError with the proxy's words) when `kubeproxy run --proxy-mode MODE` cannot run.

    The proxy is started for `wait` seconds in a throwaway namespace with one Node object; one that
    is still running then is taken as able to run the mode.
    """
    with L.netns("kpmode") as ns, tempfile.TemporaryDirectory(prefix="kp-mode-") as tmp:
        manifests = Path(tmp) / "node.yaml"
        manifests.write_text(yaml.safe_dump(builders.node(NODE_NAME, NODE_IP, POD_CIDR)))
        argv = [kubeproxy_binary(), "run", "--proxy-mode", mode, "--manifests", str(manifests), "--hostname-override",
                NODE_NAME, "--healthz-bind-address", "", "--metrics-bind-address", ""]  # fmt: skip
        proc = ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            output, _ = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            return  # still running: the mode works (the namespace's removal stops it)
        raise LabError(
            f"`kubeproxy run --proxy-mode {mode}` cannot run here (exit status {proc.returncode}): {last_lines(output, 5)}"
        )


def service_objects(cluster: MiniCluster, scenario: Scenario, pod_names: list[str]) -> list[JSON]:
    """node-1's Node, the seed-shaped DNS Service for `scenario` and its EndpointSlice."""
    svc = service(
        SERVICE_NAME,
        CLUSTER_IP,
        [DNS_UDP, DNS_TCP],
        namespace=SERVICE_NAMESPACE,
        type="NodePort",
        external_ips=[EXTERNAL_IP],
        external_traffic_policy=scenario.external_traffic_policy,
    )
    if scenario.annotations:
        svc["metadata"]["annotations"] = dict(scenario.annotations)
    slice_ = endpoint_slice(SERVICE_NAME, cluster.backends(*pod_names), [DNS_UDP, DNS_TCP], namespace=SERVICE_NAMESPACE)
    return [cluster.node_object(), svc, slice_]


def set_udp_timeout(node: L.NetNS, seconds: int) -> None:
    """The node's UDP conntrack timeouts (unreplied and stream) in its own namespace only."""
    keys = ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream")
    node.run(["sysctl", "-qw", *(f"net.netfilter.{key}={seconds}" for key in keys)])


def _add_sources(cluster: MiniCluster, cidr: str) -> int:
    """Give the client every host address of `cidr` (as /32s) and a route to the pods via the node
    (for measurements straight to a pod). Returns how many addresses."""
    net = ipaddress.ip_network(cidr)
    hosts = [str(ip) for ip in net.hosts()] or [str(net.network_address)]
    commands = [f"addr add {ip}/32 dev eth0" for ip in hosts] + [f"route add {POD_CIDR} via {NODE_IP}"]
    L.ip_batch(cluster.client, commands)
    return len(hosts)
