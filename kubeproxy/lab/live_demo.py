"""`kubeproxy demo` on a live node: a MiniCluster, `kubeproxy run` on its node, and real traffic.

In the spirit of the bundled example (kubeproxy/examples/demo.yaml):

- dns/bind: a DNS-like service, UDP and TCP port 53, NodePorts and an external IP, one pod;
- default/web: a ClusterIP service with two pods, scaled to three while traffic flows;
- default/shop: a LoadBalancer with externalTrafficPolicy Local, a pod here and one "on node-2",
  and a health-check node port a load balancer would poll;
- default/gone: a service without endpoints.

Every request is real: a probe sends it from a pod or the client namespace, the pod that gets it
answers with the source address it saw, so the tables show what was NATed and what was not.
Everything (namespaces, processes, rules) is removed at the end, also on failure or Ctrl-C.
Needs root; `unavailable()` says why it cannot run, and the CLI falls back to the offline demo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from kubeproxy.lab import netns as L
from kubeproxy.lab.builders import JSON, Port, endpoint_slice, service
from kubeproxy.lab.cluster import (
    CLIENT_EXTRA_IPS,
    CLIENT_IP,
    CLUSTER_CIDR,
    HEALTHZ_BIND,
    NODE_IP,
    NODE_NAME,
    REMOTE_NODE_NAME,
    ClusterError,
    MiniCluster,
    Source,
)
from kubeproxy.lab.tables import FittingTable

HTTP = Port("http", 80, 8080)
DNS_UDP = Port("dns-udp", 53, 5353, "UDP", node_port=30053)
DNS_TCP = Port("dns-tcp", 53, 5353, "TCP", node_port=30054)
SHOP = Port("https", 443, 8080, node_port=31443)
DNS_EXTERNAL_IP = "203.0.113.53"
SHOP_LB_IP = "198.51.100.7"
HEALTH_CHECK_NODE_PORT = 32000
WEB_IP, DNS_IP, SHOP_IP, GONE_IP = "10.96.10.10", "10.96.0.53", "10.96.20.20", "10.96.40.40"
LOCAL_PODS = ("dns-1", "web-1", "web-2", "shop-1", "toolbox")
REMOTE_PODS = ("shop-2",)
TOOLS = ("ip", "iptables-restore", "iptables-save")


def unavailable() -> str | None:
    """Why the live demo cannot run here (one line), or None when it can."""
    if not L.have_root():
        return "the live demo needs root (it builds network namespaces and programs iptables in them)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the live demo needs {', '.join(missing)} (apt packages iproute2, iptables)"
    return None


@dataclass(frozen=True)
class Request:
    """`count` probes, one connection each, and why they go where they go."""

    label: str  # who sends, for the table
    src: Source
    proto: str
    dst: str
    service: str
    count: int
    why: str
    src_ip: str | None = None
    timeout: float = 1.0


class LiveDemo:
    def __init__(self, cluster: MiniCluster, console: Console) -> None:
        self.c = cluster
        self.console = console

    # ---- what the cluster holds --------------------------------------------------------------

    def objects(self, web_pods: Sequence[str]) -> list[JSON]:
        c = self.c
        shop = service(
            "shop",
            SHOP_IP,
            [SHOP],
            type="LoadBalancer",
            load_balancer_ips=[SHOP_LB_IP],
            external_traffic_policy="Local",
            health_check_node_port=HEALTH_CHECK_NODE_PORT,
        )
        return [
            c.node_object(),
            service("bind", DNS_IP, [DNS_UDP, DNS_TCP], namespace="dns", type="NodePort", external_ips=[DNS_EXTERNAL_IP]),
            endpoint_slice("bind", c.backends("dns-1"), [DNS_UDP, DNS_TCP], namespace="dns"),
            service("web", WEB_IP, [HTTP]),
            endpoint_slice("web", c.backends(*web_pods), [HTTP]),
            shop,
            endpoint_slice("shop", c.backends("shop-1", "shop-2"), [SHOP]),
            service("gone", GONE_IP, [HTTP]),
        ]

    # ---- the show ------------------------------------------------------------------------------

    def run(self) -> None:
        c, out = self.c, self.console
        out.print(self._pods_table())
        objs = self.objects(["web-1", "web-2"])
        c.write_manifests(objs)
        started = time.monotonic()
        proxy = c.start_proxy("--min-sync-period", "0s", "--cluster-cidr", CLUSTER_CIDR)
        c.wait_synced()
        c.wait_applied(objs)
        nat = sum(1 for line in c.iptables_save("nat").splitlines() if line.startswith("-A KUBE-"))
        out.print(
            f"[bold]kubeproxy run[/] --manifests {c.manifests} (pid {proxy.pid}, in {NODE_NAME}'s namespace): "
            f"4 services, {nat} nat rules, in {time.monotonic() - started:.1f} s\n"
        )

        toolbox, client = c.pods["toolbox"], c.client
        # 24 to default/web's two pods: each shows up but once in 2^23 runs (tests/e2e/test_demo.py
        # checks both; with 8, one pod was missing from the table once in 128 runs)
        requests = [
            Request(f"pod toolbox {toolbox.ip}", toolbox, "tcp", f"{WEB_IP}:80", "default/web", 24,
                    "ClusterIP from a pod: balanced, source untouched"),
            Request(f"pod toolbox {toolbox.ip}", toolbox, "udp", f"{DNS_IP}:53", "dns/bind", 3,
                    "ClusterIP, UDP: the same, per datagram flow"),
            Request(f"client {CLIENT_IP}", client, "udp", f"{DNS_EXTERNAL_IP}:53", "dns/bind", 3,
                    "external IP, Cluster policy: SNAT, so replies return through the node"),
            Request(f"client {CLIENT_IP}", client, "tcp", f"{NODE_IP}:{DNS_TCP.node_port}", "dns/bind", 3,
                    "NodePort, Cluster policy: SNAT too"),
            Request(f"client {CLIENT_EXTRA_IPS[0]}", client, "tcp", f"{SHOP_LB_IP}:443", "default/shop", 6,
                    "LB IP, Local policy: only this node's pod, client IP kept", src_ip=CLIENT_EXTRA_IPS[0]),
            Request(f"pod toolbox {toolbox.ip}", toolbox, "tcp", f"{GONE_IP}:80", "default/gone", 2,
                    "no endpoints: REJECT, refused at once", timeout=3),
        ]  # fmt: skip
        table = self._requests_table("Requests, and what the pods saw")
        for req in requests:
            got = c.request(req.proto, req.src, req.dst, count=req.count, src_ip=req.src_ip, timeout=req.timeout)
            table.add_row(req.label, f"{req.dst}/{req.proto}", req.service, self.answered(got), self.saw(got), req.why)
        out.print(table)
        out.print(self._health_table())
        self._scale_up()

    def _scale_up(self) -> None:
        c, out = self.c, self.console
        out.rule("Scaling default/web from 2 to 3 pods while the toolbox pod sends requests")
        with c.traffic("tcp", c.pods["toolbox"], f"{WEB_IP}:80", batch=5) as flow:
            flow.wait_for_more(10)
            web3 = c.add_pod("web-3")  # serving before its endpoint is published, as a ready pod would be
            changed = time.monotonic()
            c.write_manifests(self.objects(["web-1", "web-2", "web-3"]))
            c.wait_endpoints("default/web:http", {f"{c.pods[p].ip}:8080" for p in ("web-1", "web-2", "web-3")})
            synced = time.monotonic() - changed
            mark = len(flow.results)
            # 45, of which the batch in flight at the mark may have sent 5 before the change: with 40
            # on three pods, web-3 is missing once in 10^7 runs ((2/3)^40; with 30 it was 1 in 25,000)
            flow.wait_for_more(45)
        out.print(f"pod web-3 started at {web3.ip}, its endpoint published; in the node's rules {synced:.1f} s later")
        table = self._requests_table("Requests to default/web, before and after the change reached the rules")
        for when, got in (("while it changed", flow.results[:mark]), ("after the change", flow.results[mark:])):
            failed = sum(1 for r in got if not isinstance(r, dict))
            why = f"{len(got)} requests, {failed} failed"
            table.add_row(f"pod toolbox ({when})", f"{WEB_IP}:80/tcp", "default/web", self.answered(got), self.saw(got), why)
        out.print(table)

    # ---- reading the answers -----------------------------------------------------------------

    def answered(self, results: Sequence[Any]) -> str:
        """Which pods answered, how often: `web-1 ×4, web-2 ×4`; refusals and timeouts as such."""
        names = {pod.ip: pod.name for pod in self.c.pods.values()}
        counts = Counter(names.get(r["dst"].rsplit(":", 1)[0], r["dst"]) if isinstance(r, dict) else r for r in results)
        return ", ".join(f"{'[red]' + k + '[/]' if k in ('refused', 'timeout') else k} ×{n}" for k, n in sorted(counts.items()))

    def saw(self, results: Sequence[Any]) -> str:
        """The source addresses the pods saw, and whose they are."""
        names = {pod.ip: f"pod {pod.name}: its own" for pod in self.c.pods.values()}
        names[NODE_IP] = "[yellow]the node: masqueraded[/]"
        for ip in (CLIENT_IP, *CLIENT_EXTRA_IPS):
            names[ip] = "[green]the real client IP, kept[/]"
        ips = sorted({r["src"].rsplit(":", 1)[0] for r in results if isinstance(r, dict)})
        return "\n".join(f"{ip} ({names.get(ip, '?')})" for ip in ips) or "-"

    # ---- tables ------------------------------------------------------------------------------

    def _pods_table(self) -> FittingTable:
        table = FittingTable(f"node-1 {NODE_IP}, client {CLIENT_IP} (+ {', '.join(CLIENT_EXTRA_IPS)}); pods",
                             ("pod", "IP", "node", "serves"))  # fmt: skip
        for pod in self.c.pods.values():
            note = "" if pod.node_name == NODE_NAME else " (its slice says so; routed by node-1)"
            table.add_row(pod.name, pod.ip, pod.node_name + note, "tcp 8080, 5353; udp 5353")
        return table

    @staticmethod
    def _requests_table(title: str) -> FittingTable:
        return FittingTable(title, ("from", "to", "service", "answered by", "source the pod saw", "why"))

    def _health_table(self) -> FittingTable:
        table = FittingTable("What a load balancer polls on the node (from the client)", ("url", "status", "answer"))
        port = HEALTHZ_BIND.rsplit(":", 1)[1]
        for url in (f"http://{NODE_IP}:{HEALTH_CHECK_NODE_PORT}/", f"http://{NODE_IP}:{port}/healthz"):
            got = self.c.http_get(self.c.client, url)
            doc = got.json()
            if "localEndpoints" in doc:
                answer = f"localEndpoints {doc['localEndpoints']} (default/shop: shop-1 here, shop-2 on {REMOTE_NODE_NAME})"
            else:
                answer = f"healthy {doc.get('healthy')}, nodeEligible {doc.get('nodeEligible')}"
            table.add_row(url, str(got.status), answer)
        return table


def run(console: Console | None = None) -> int:
    """Build the cluster, show the traffic, clean up. Returns the exit status (0, or 1 on failure)."""
    # Piped output gets room for the tables unless COLUMNS says otherwise.
    console = console or Console(width=None if Console().is_terminal or os.environ.get("COLUMNS") else 150)
    console.rule(f"[bold]kubeproxy demo[/]: a live node, {len(LOCAL_PODS) + len(REMOTE_PODS)} pods, real traffic")
    started = time.monotonic()
    namespaces: list[str] = []
    try:
        with MiniCluster.build(pods=LOCAL_PODS, remote_pods=REMOTE_PODS, tcp_ports=(8080, 5353), udp_ports=(5353,)) as c:
            try:
                LiveDemo(c, console).run()
            finally:
                namespaces = [c.node.name, c.client.name, *(p.ns.name for p in c.pods.values())]
    except (ClusterError, L.NetnsError, OSError, subprocess.SubprocessError) as exc:
        console.print(f"kubeproxy demo: the live demo failed: {exc}")
        return 1
    except KeyboardInterrupt:
        console.print("kubeproxy demo: interrupted; everything it built is removed")
        return 130
    listed = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split())
    left = sorted(set(namespaces) & listed)
    if left:
        console.print(f"[red]cleanup left namespaces behind:[/] {', '.join(left)}")
        return 1
    console.print(
        f"\ncleaned up: the proxy and {len(namespaces)} namespaces (with their rules and processes) removed; "
        f"demo took {time.monotonic() - started:.1f} s. Without root: kubeproxy demo --offline"
    )
    return 0
