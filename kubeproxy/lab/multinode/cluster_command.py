"""`kubeproxy lab cluster`: build the multi-node lab, run a rolling move behind the load balancer,
report what the balancer saw, and (with --hold) keep the lab up to look around in."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from types import FrameType

import click

from kubeproxy.lab.cluster import ClusterError
from kubeproxy.lab.control_plane import UPSTREAM_VERSION, upstream_bin
from kubeproxy.lab.multinode.bed import (
    CLIENT_IP,
    CLIENT_IP6,
    CONTROL_IP,
    CONTROL_PLANES,
    ROUTER_IP,
    ROUTER_IP6,
    MultiNodeCluster,
)
from kubeproxy.lab.multinode.lb_handle import LoadBalancer
from kubeproxy.lab.multinode.scenario import LocalService, move_endpoint, move_pod
from kubeproxy.lab.netns import NetnsError
from kubeproxy.lab.node_rules import MODES
from kubeproxy.model.options import Family

WEB = {
    Family.IPV4: LocalService("web", "10.96.0.80", node_port=30080, health_check_node_port=32080),
    Family.IPV6: LocalService("web", "fd00:96::80", node_port=30080, health_check_node_port=32080),
}


def unavailable() -> str | None:
    """Why the lab cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "kubeproxy lab cluster needs root: it builds network namespaces and programs netfilter in them"
    missing = [tool for tool in ("ip", "iptables", "nft") if shutil.which(tool) is None]
    if missing:
        return "kubeproxy lab cluster needs " + ", ".join(missing)
    return None


@click.command("cluster")
@click.option("--proxy-mode", type=click.Choice(MODES), default="iptables", show_default=True, help="Every node's proxy mode.")
@click.option("--nodes", type=click.IntRange(2, 9), default=3, show_default=True, help="How many nodes.")
@click.option("--moves", type=click.IntRange(0, 30), default=3, show_default=True, help="Times the pod moves to the next node.")
@click.option("--rate", type=click.FloatRange(1, 500), default=50, show_default=True, help="Load balancer requests per second.")
@click.option("--dual-stack", is_flag=True, help="IPv6 addresses too: nodes, pods, client; every proxy programs both families.")
@click.option(
    "--service-family",
    type=click.Choice([f.value for f in Family]),
    default=Family.IPV4.value,
    show_default=True,
    help="The family of the service behind the balancer (IPv6 needs --dual-stack).",
)
@click.option(
    "--control-plane",
    type=click.Choice(CONTROL_PLANES),
    default="lab",
    show_default=True,
    help="lab: the test API server, the lab publishes EndpointSlices; upstream: upstream's etcd, kube-apiserver and "
    "kube-controller-manager (scripts/upstream builds them), pods reported by the lab kubelet, slices made by "
    "upstream's controller, proxies as deployed (deploy/'s RBAC, a ServiceAccount token, TLS verified). IPv4 only.",
)
@click.option("--hold", is_flag=True, help="Afterwards keep the lab up (namespaces listed) until Ctrl-C.")
def cluster(
    proxy_mode: str, nodes: int, moves: int, rate: float, dual_stack: bool, service_family: str, control_plane: str, hold: bool
) -> None:
    """Nodes in network namespaces, each running `kubeproxy run` against one API server (the
    test one, or upstream's with --control-plane upstream); pods routed between nodes; a
    client; and a load balancer that sends to the NodePort of a LoadBalancer Service with
    externalTrafficPolicy Local, only to the nodes whose health-check node port passes. Its one
    pod moves from node to node as a rolling update moves it, and the balancer's requests and
    failures are counted (root)."""
    reason = unavailable()
    if reason:
        raise click.ClickException(reason)
    family = Family(service_family)
    if family.ipv6 and not dual_stack:
        raise click.UsageError("--service-family IPv6 needs --dual-stack")
    if control_plane == "upstream":
        if dual_stack:
            raise click.UsageError("--control-plane upstream runs IPv4 only: drop --dual-stack")
        if upstream_bin() is None:
            raise click.ClickException(
                f"--control-plane upstream needs upstream's binaries: run scripts/upstream {UPSTREAM_VERSION}"
            )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _run(proxy_mode, nodes, moves, rate, dual_stack, WEB[family], control_plane, hold)
    except (ClusterError, NetnsError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted; the lab is removed", err=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the bed's ExitStack, so the namespaces go


def _run(
    proxy_mode: str, nodes: int, moves: int, rate: float, dual_stack: bool, web: LocalService, control_plane: str, hold: bool
) -> None:
    started = time.monotonic()
    family = web.family
    upstream = control_plane == "upstream"
    with MultiNodeCluster.build(nodes, proxy_mode=proxy_mode, dual_stack=dual_stack, control_plane=control_plane) as bed:
        stack = "dual-stack" if dual_stack else "IPv4"
        server = f"upstream's {UPSTREAM_VERSION} control plane" if upstream else "the test API server"
        click.echo(f"lab: {nodes} {stack} nodes, proxy mode {proxy_mode}, {server} at {bed.api.url} (in {bed.control.name})")
        for node in bed.nodes.values():
            v6 = f" {node.ip6} pods {node.pod_cidr6}" if dual_stack else ""
            click.echo(f"  {node.name}  {node.ip:<15} pods {node.pod_cidr:<14}{v6} {node.zone:<7} netns {node.ns.name}")
        client, router = (f"{CLIENT_IP} {CLIENT_IP6}", f"{ROUTER_IP} {ROUTER_IP6}") if dual_stack else (CLIENT_IP, ROUTER_IP)
        click.echo(f"  client {client} (netns {bed.client.name}); lb/router {router} (netns {bed.lb.name})")
        names = list(bed.nodes)
        pod = bed.add_pod("web-0", names[0])
        if upstream:
            bed.report_pod(pod.name, web.selector)
            bed.apply(web.service(selecting=True))
        else:
            bed.apply(web.service(), web.slice(pod.backend(family=family)))
        bed.start_proxies()
        bed.wait_synced(timeout=60)
        others = {n: 503 for n in names[1:]}
        bed.wait_health_checks(web.health_check_node_port, {names[0]: 200, **others}, family=family)
        click.echo(
            f"proxies synced in {time.monotonic() - started:.1f} s; web ({family}): NodePort {web.node_port}, "
            f"healthCheckNodePort {web.health_check_node_port}, pod web-0 on {names[0]}"
        )
        lb = bed.start_lb(web.node_port, health_port=web.health_check_node_port, rate=rate, family=family)
        lb.wait_health({names[0]})
        start = lb.mark()
        for i in range(1, moves + 1):
            target = names[i % len(names)]
            t0 = time.monotonic()
            pod = (move_pod if upstream else move_endpoint)(bed, lb, web, pod, f"web-{i}", target)
            click.echo(f"move {i}: web-{i - 1} -> web-{i} on {target} in {time.monotonic() - t0:.1f} s")
        lb.wait_requests(10)
        end = lb.mark()
        _report(lb, start, end)
        if hold:
            dst = f"{bed.node_address(names[0], family)}:{web.node_port}"
            probe = f"{sys.executable} -m kubeproxy.lab.probe send --proto tcp --dst {dst}"
            click.echo(
                f"holding the lab (API server on {CONTROL_IP}); try `ip netns exec {bed.client.name} {probe}`; Ctrl-C ends it"
            )
            lb.stop()
            threading.Event().wait()


def _report(lb: LoadBalancer, start: int, end: int) -> None:
    requests = lb.requests(start, end)
    failures = lb.failures(start, end)
    click.echo(f"load balancer: {len(requests)} requests, {len(failures)} failed")
    for node, count in sorted(lb.per_node(start, end).items(), key=lambda kv: str(kv[0])):
        failed = sum(1 for r in failures if r.node == node)
        click.echo(f"  {node or '(no healthy node)':<18} {count:>6} requests {failed:>4} failed")
    t0 = lb.requests(start, start + 1)[0].t if requests else 0.0
    for change in lb.health_changes():
        if change.index >= start:
            click.echo(f"  +{change.t - t0:6.2f} s  healthy: {', '.join(sorted(change.healthy)) or '-'}")
    for r in failures[:10]:
        click.echo(f"  failed: {r.node}: {r.error}")
