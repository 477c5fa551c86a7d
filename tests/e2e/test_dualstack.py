"""A dual-stack node in a real kernel: one live proxy programs IPv4 and IPv6, each checked with packets.

The bed (namespaces made here, removed after): a client and two pods, each wired to the node by
a veth carrying an IPv4 and an IPv6 address (fd00::/8, `nodad` so that no DAD delay applies).
The proxy runs in this process with every command sent into the node's namespace, fed the
objects directly (no API server: the source is the one of the fake tests). For each mode and
each family: ClusterIP (TCP and UDP), NodePort, external IP, LoadBalancer IP, eTP=Local keeps
the client's address, hairpin (a pod reaching itself through its Service), a Service without
endpoints rejects, ClientIP affinity sticks to one pod. Every probe has a timeout.
LoadBalancer source ranges in IPv6 (and IPv4 on the dual-stack node): only the allowed source
passes, others are dropped; `::/0` and overlapping ranges admit everyone and break nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.userspace.proxier import STATE_DIR, state_path
from kubeproxy.lab import netns as L
from kubeproxy.lab.builders import Backend, Port, endpoint_slice
from kubeproxy.lab.builders import service as lab_service
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.e2e.scenarios import BOTH
from tests.live.served import Source, serving
from tests.proxy.test_dualstack import endpoints, node, service

pytestmark = pytest.mark.root

NODE = "node-1"
ADDR = {  # per family: client, node (client side), pod a, pod b, node (pod sides), service/external/LB prefixes
    Family.IPV4: {"client": "192.168.50.10", "node": "192.168.50.2", "a": "10.244.1.10", "b": "10.244.2.10",
                  "gw_a": "10.244.1.1", "gw_b": "10.244.2.1", "plen": "24", "svc": "10.96.0.",
                  "ext": "203.0.113.7", "lb": "198.51.100.7",
                  "routes": ("10.96.0.0/12", "203.0.113.0/24", "198.51.100.0/24")},
    Family.IPV6: {"client": "fd00:50::10", "node": "fd00:50::2", "a": "fd00:10:244:1::10", "b": "fd00:10:244:2::10",
                  "gw_a": "fd00:10:244:1::1", "gw_b": "fd00:10:244:2::1", "plen": "64", "svc": "fd00:96::",
                  "ext": "2001:db8:e::7", "lb": "2001:db8:b::7",
                  "routes": ("fd00:96::/108", "2001:db8:e::/64", "2001:db8:b::/64")},
}  # fmt: skip
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16", "fd00:10:244::/48"), min_sync_period=0.0, sync_period=30.0,
                  healthz_bind_address="", metrics_bind_address="")  # fmt: skip

# A receiver on 0.0.0.0 and :: (TCP and UDP, port 8080) answering with what it saw, and a sender;
# both strip the IPv4-mapped form so that addresses compare as written.
PROBE = r"""
import json, selectors, socket, sys
def peer(a): return f"{a[0]}"
if sys.argv[1] == "serve":
    sel = selectors.DefaultSelector()
    for fam, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            s = socket.socket(fam, kind)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, 8080))
            if kind == socket.SOCK_STREAM:
                s.listen(64)
            sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if s.type == socket.SOCK_DGRAM:
                _, src = s.recvfrom(2048)
                s.sendto(json.dumps({"pod": sys.argv[2], "src": peer(src)}).encode(), src)
            else:
                c, src = s.accept()
                with c:
                    c.sendall(json.dumps({"pod": sys.argv[2], "src": peer(src)}).encode())
else:
    proto, host, port, count, sport = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    src, wait = (sys.argv[7], float(sys.argv[8])) if len(sys.argv) > 8 else ("", 2.0)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    out = []
    for _ in range(count):
        with socket.socket(fam, socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM) as s:
            s.settimeout(wait)
            if sport or src:  # one UDP flow to conntrack across runs, or one of the client's addresses
                s.bind((src or ("::" if fam == socket.AF_INET6 else "0.0.0.0"), sport))
            try:
                s.connect((host, port))
                if proto == "udp":
                    s.send(b"x")
                out.append(json.loads(s.recv(2048)))
            except ConnectionRefusedError:
                out.append("refused")
            except TimeoutError:
                out.append("timeout")
            except OSError as e:
                out.append(f"error: {e.strerror}")
    print(json.dumps(out))
"""


class Bed:
    def __init__(self) -> None:
        self.spaces: list[L.NetNS] = []
        try:
            self._build()
        except BaseException:
            self.close()  # a half-built bed goes too
            raise

    def _build(self) -> None:
        self.node = self._ns("kpds-node")
        self.client = self._ns("kpds-cli")
        self.pod_a = self._ns("kpds-a")
        self.pod_b = self._ns("kpds-b")
        v4, v6 = ADDR[Family.IPV4], ADDR[Family.IPV6]
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv4.conf.all.rp_filter=0"):
            self.node.run(["sysctl", "-q", "-w", key])
        L.link(self.client, "eth0", f"{v4['client']}/24", self.node, "eth0", f"{v4['node']}/24")
        self._v6(self.client, "eth0", f"{v6['client']}/64")
        self._v6(self.node, "eth0", f"{v6['node']}/64")
        for fam, gw in ((v4, v4["node"]), (v6, v6["node"])):
            for prefix in fam["routes"]:
                self.client.run(["ip", "route", "add", str(prefix), "via", str(gw)])
        # A node has a default route: without one, a ClusterIP without endpoints would fail
        # routing (net unreachable) before the filter's REJECT is reached. An uplink of its own
        # (a router namespace), not back towards the client, which would add ICMP redirects.
        router = self._ns("kpds-up")
        L.link(self.node, "uplink", "192.168.60.2/24", router, "eth0", "192.168.60.1/24")
        self._v6(self.node, "uplink", "fd00:60::2/64")
        self._v6(router, "eth0", "fd00:60::1/64")
        self.node.run(["ip", "route", "add", "default", "via", "192.168.60.1"])
        self.node.run(["ip", "-6", "route", "add", "default", "via", "fd00:60::1"])
        for name, pod in (("a", self.pod_a), ("b", self.pod_b)):
            L.link(pod, "eth0", f"{v4[name]}/24", self.node, f"p{name}", f"{v4['gw_' + name]}/24")
            self._v6(pod, "eth0", f"{v6[name]}/64")
            self._v6(self.node, f"p{name}", f"{v6['gw_' + name]}/64")
            pod.run(["ip", "route", "add", "default", "via", str(v4["gw_" + name])])
            pod.run(["ip", "-6", "route", "add", "default", "via", str(v6["gw_" + name])])
            server = pod.popen([sys.executable, "-c", PROBE, "serve", name], stdout=-1)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"

    def _ns(self, prefix: str) -> L.NetNS:
        ns = L.create(prefix)
        self.spaces.append(ns)
        return ns

    @staticmethod
    def _v6(ns: L.NetNS, dev: str, cidr: str) -> None:
        ns.run(["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"])

    def send(self, src: L.NetNS, proto: str, host: str, port: int, count: int = 1, sport: int = 0,
             src_ip: str = "", timeout: float = 2.0) -> list[Any]:  # fmt: skip
        argv = [sys.executable, "-c", PROBE, "send", proto, host, str(port), str(count), str(sport), src_ip, str(timeout)]
        out = src.run(argv, timeout=30 + (1 + timeout) * count)
        return list(json.loads(out.stdout))

    def close(self) -> None:
        for ns in self.spaces:
            ns.delete()


@pytest.fixture
def bed() -> Iterator[Bed]:
    if not L.have_root():
        pytest.skip("needs root (network namespaces)")
    b = Bed()
    try:
        yield b
    finally:
        b.close()


def objects(families: tuple[Family, ...]) -> list[dict[str, Any]]:
    v4, v6 = ADDR[Family.IPV4], ADDR[Family.IPV6]
    objs: list[dict[str, Any]] = [node(*(str(ADDR[f]["node"]) for f in families))]

    def svc(name: str, last: int, pods: str, port: int, **spec: Any) -> None:
        ips = [f"{v4['svc']}{last}", f"{v6['svc']}{last:x}"]
        objs.append(service(name, ips, port=port, **spec))
        for fam, addrs in (("IPv4", v4), ("IPv6", v6)):
            objs.append(endpoints(name, fam, *(str(addrs[p]) for p in pods)))

    def udp(name: str, last: int, pods: str) -> None:
        ips = [f"{v4['svc']}{last}", f"{v6['svc']}{last:x}"]
        objs.append(service(name, ips, port=53, protocol="UDP"))
        for fam, addrs in (("IPv4", v4), ("IPv6", v6)):
            objs.append(endpoints(name, fam, *(str(addrs[p]) for p in pods), protocol="UDP"))

    svc("web", 10, "a", 80, type="LoadBalancer", externalIPs=[v4["ext"], v6["ext"]])
    objs[-3]["spec"]["ports"][0]["nodePort"] = 30080
    objs[-3]["status"] = {"loadBalancer": {"ingress": [{"ip": v4["lb"]}, {"ip": v6["lb"]}]}}
    objs[-3]["spec"]["allocateLoadBalancerNodePorts"] = True
    svc("local", 11, "a", 81, type="NodePort", externalTrafficPolicy="Local")
    objs[-3]["spec"]["ports"][0]["nodePort"] = 30081
    svc("sticky", 12, "ab", 82, sessionAffinity="ClientIP")
    svc("empty", 13, "", 83)
    udp("dns", 14, "a")
    return objs


STACKS = {"dual-stack": (Family.IPV4, Family.IPV6), "IPv6 single-stack": (Family.IPV6,)}


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_dual_stack_node_in_the_kernel(bed: Bed, mode: str, stack: str) -> None:
    """Every flow, per family; the IPv6 single-stack node (only an IPv6 address and pod CIDR)
    runs the same flows with IPv6 as its only (primary) family."""
    families = STACKS[stack]
    results: dict[str, dict[str, object]] = {}
    cidrs = tuple(c for c in CFG.cluster_cidr if Family.of(ipaddress.ip_network(c)) in families)

    async def main() -> None:
        proxy = LiveProxy(replace(CFG, mode=mode, cluster_cidr=cidrs), NODE, run_cmd=bed.node)
        source = Source(proxy, objects(families))
        async with serving(proxy, source, 30):
            # Both lanes whatever the node's addresses (upstream's platformCheckSupported), the
            # primary of the node's first address.
            assert [lane.family for lane in proxy.lanes] == sorted(Family, key=lambda f: f != families[0])
            assert proxy.failed_syncs == 0
            for family in families:
                results[family] = await asyncio.wait_for(asyncio.to_thread(flows, bed, family), 120)
            # Stale UDP conntrack entries go, in each family: one flow (fixed source port) to
            # the DNS service keeps going to pod a until its entry is deleted when a leaves.
            for family in families:
                got = await asyncio.to_thread(bed.send, bed.client, "udp", _ip(family, 14), 53, 1, 40053)
                results[family]["UDP flow before"] = _reached(got)
            done = proxy.syncs
            for fam in Family:
                source.publish(endpoints("dns", fam, str(ADDR[fam]["b"]), protocol="UDP"))
            await asyncio.wait_for(proxy.wait_for_syncs(done + 1), 30)
            for family in families:
                got = await asyncio.to_thread(bed.send, bed.client, "udp", _ip(family, 14), 53, 1, 40053)
                results[family]["stale UDP conntrack entry cleared"] = _reached(got, pod="b")
            # A Service added later reaches both families' tables in a partial sync.
            done = proxy.syncs
            source.publish(service("late", [_ip(Family.IPV4, 15), _ip(Family.IPV6, 15)], port=85), kind="ADDED")
            for fam in Family:
                source.publish(endpoints("late", fam, str(ADDR[fam]["b"])), kind="ADDED")
            await asyncio.wait_for(proxy.wait_for_syncs(done + 1), 30)
            await asyncio.wait_for(_until(lambda: all(lane.last_changes and "late" in str(lane.last_changes.services)
                                                      for lane in proxy.lanes)), 30)
            for lane in proxy.lanes:
                assert lane.last_changes is not None and not lane.last_changes.full
            for family in families:
                got = await asyncio.to_thread(bed.send, bed.client, "tcp", _ip(family, 15), 85)
                results[family]["added later (partial sync)"] = _reached(got, pod="b")

    asyncio.run(main())
    failures = {f"{fam} {what}": got for fam, checks in results.items() for what, got in checks.items() if got is not True}
    print(json.dumps({str(f): {k: v is True for k, v in c.items()} for f, c in results.items()}, indent=1))
    assert not failures, failures


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.02)


def _ip(family: Family, last: int) -> str:
    svc = str(ADDR[family]["svc"])
    return f"{svc}{last:x}" if family.ipv6 else f"{svc}{last}"


def _reached(got: list[Any], pod: str = "a", src: str | None = None) -> object:
    ok = all(isinstance(r, dict) and r["pod"] == pod and (src is None or r["src"] == src) for r in got)
    return True if ok and got else got


def flows(bed: Bed, family: Family) -> dict[str, object]:
    """Each flow's outcome: True, or what was seen instead."""
    a = ADDR[family]
    reached = _reached

    def ip(last: int) -> str:
        return _ip(family, last)

    out: dict[str, object] = {
        "ClusterIP": reached(bed.send(bed.client, "tcp", ip(10), 80)),
        "NodePort": reached(bed.send(bed.client, "tcp", str(a["node"]), 30080)),
        "external IP": reached(bed.send(bed.client, "tcp", str(a["ext"]), 80)),
        "LoadBalancer": reached(bed.send(bed.client, "tcp", str(a["lb"]), 80)),
        "eTP=Local keeps the source": reached(bed.send(bed.client, "tcp", str(a["node"]), 30081), src=str(a["client"])),
        "hairpin": reached(bed.send(bed.pod_a, "tcp", ip(10), 80)),
        "UDP": reached(bed.send(bed.client, "udp", ip(14), 53)),
    }
    empty = bed.send(bed.client, "tcp", ip(13), 83)
    out["no endpoints rejects"] = True if empty == ["refused"] else empty
    sticky = bed.send(bed.client, "tcp", ip(12), 82, count=12)
    pods = {r["pod"] for r in sticky if isinstance(r, dict)}
    out["ClientIP affinity"] = True if len(pods) == 1 and all(isinstance(r, dict) for r in sticky) else sticky
    return out


# The userspace mode: its listeners are the proxy's own sockets, so the proxy runs inside the node
# namespace (tests/e2e/dualstack_runner.py), one relay and one set of listeners per family.

RESET = "error: Connection reset by peer"


class NodeProxy:
    """tests/e2e/dualstack_runner.py in the node namespace, driven by lines."""

    def __init__(self, bed: Bed, mode: str, cidrs: tuple[str, ...], initial: list[dict[str, Any]]) -> None:
        root = str(Path(__file__).resolve().parents[2])
        self.proc = bed.node.popen([sys.executable, "-m", "tests.e2e.dualstack_runner", mode, json.dumps(cidrs)],
                                   stdin=-1, stdout=-1, cwd=root)  # fmt: skip
        self.status = self._send(json.dumps(initial))

    def _send(self, line: str) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        got = self.proc.stdout.readline().split()  # the runner answers after the sync (its own timeout: 60 s)
        assert got and got[0] == "synced", f"the proxy in the node namespace stopped: {got}"
        return got

    def publish(self, obj: dict[str, Any], kind: str = "MODIFIED") -> list[str]:
        return self._send(json.dumps({"kind": kind, "obj": obj}))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the runner cleans up (chains, listeners) and exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def userspace_flows(bed: Bed, family: Family) -> dict[str, object]:
    """The flows a relay can serve: every one of flows() but eTP=Local's client address (the relay
    connects from the node), and a service without endpoints resets instead of refusing."""
    a = ADDR[family]
    out: dict[str, object] = {
        "ClusterIP": _reached(bed.send(bed.client, "tcp", _ip(family, 10), 80), src=str(a["gw_a"])),
        "NodePort": _reached(bed.send(bed.client, "tcp", str(a["node"]), 30080)),
        "external IP": _reached(bed.send(bed.client, "tcp", str(a["ext"]), 80)),
        "LoadBalancer": _reached(bed.send(bed.client, "tcp", str(a["lb"]), 80)),
        "hairpin": _reached(bed.send(bed.pod_a, "tcp", _ip(family, 10), 80)),
        "UDP": _reached(bed.send(bed.client, "udp", _ip(family, 14), 53)),
    }
    empty = bed.send(bed.client, "tcp", _ip(family, 13), 83)
    out["no endpoints resets"] = True if empty == [RESET] else empty
    sticky = bed.send(bed.client, "tcp", _ip(family, 12), 82, count=12)
    pods = {r["pod"] for r in sticky if isinstance(r, dict)}
    out["ClientIP affinity"] = True if len(pods) == 1 and all(isinstance(r, dict) for r in sticky) else sticky
    return out


@pytest.mark.parametrize("stack", list(STACKS))
def test_userspace_dual_stack_node_in_the_kernel(bed: Bed, stack: str) -> None:
    families = STACKS[stack]
    cidrs = tuple(c for c in CFG.cluster_cidr if Family.of(ipaddress.ip_network(c)) in families)
    results: dict[str, dict[str, object]] = {}
    proxy = NodeProxy(bed, "userspace", cidrs, objects(families))
    try:
        assert proxy.status[2] == ",".join(str(f) for f in families) and proxy.status[3] == "0", proxy.status
        ns_inode = bed.node.run(["readlink", "/proc/self/ns/net"]).stdout.strip().split("[")[1].rstrip("]")
        for family in families:
            results[family] = userspace_flows(bed, family)
            state = state_path(STATE_DIR, ns_inode, family)
            doc = json.loads(state.read_text()) if state.exists() else {}
            web = doc.get("ports", {}).get("default/web:p", {})
            pod_a = f"[{ADDR[family]['a']}]:8080" if family.ipv6 else f"{ADDR[family]['a']}:8080"
            results[family]["its own state file"] = True if web.get("endpoints") == [pod_a] else doc
            results[family]["UDP flow before"] = _reached(bed.send(bed.client, "udp", _ip(family, 14), 53, 1, 40053))
        # The DNS endpoints move to pod b: the relay ends flows to the gone endpoint, so the same
        # client flow (fixed source port) reaches b on its next datagram, in each family.
        for fam in Family:
            proxy.publish(endpoints("dns", fam, str(ADDR[fam]["b"]), protocol="UDP"))
        for family in families:
            got = bed.send(bed.client, "udp", _ip(family, 14), 53, 1, 40053)
            results[family]["UDP flow moves to the new pod"] = _reached(got, pod="b")
    finally:
        proxy.close()
    leftovers = bed.node.run(["iptables-save", "-t", "nat"]).stdout + bed.node.run(["ip6tables-save", "-t", "nat"]).stdout
    print(json.dumps({str(f): {k: v is True for k, v in c.items()} for f, c in results.items()}, indent=1))
    failures = {f"{fam} {what}": got for fam, checks in results.items() for what, got in checks.items() if got is not True}
    assert not failures, failures
    assert "KUBE-PORTALS" not in leftovers  # both families' chains went with the proxy


# LoadBalancer source ranges in IPv6: the firewall of each family filters on its own
# ranges. The client gets two more addresses per family: one allowed by the restricted Service's
# /128 (/32), one outside it. Hostile-but-valid ranges (`::/0`, overlapping CIDRs) must allow
# every client and leave the other Services' rules in place: in nftables mode, 0.0.0.0/0 once
# made the whole transaction fail and wiped every rule.

ALLOWED = {Family.IPV4: "192.168.50.11", Family.IPV6: "fd00:50::11"}
DENIED = {Family.IPV4: "192.168.50.12", Family.IPV6: "fd00:50::12"}
LB_PORT = Port("p", 80, 8080)
RANGES = {  # per family: the restricted Service's one address, everything, and overlapping CIDRs
    "restricted": {Family.IPV4: [f"{ALLOWED[Family.IPV4]}/32"], Family.IPV6: [f"{ALLOWED[Family.IPV6]}/128"]},
    "open": {Family.IPV4: ["0.0.0.0/0"], Family.IPV6: ["::/0"]},
    "overlap": {Family.IPV4: ["192.168.50.0/24", "192.168.50.11/32", "192.168.0.0/16", "192.168.50.10/31"],
                Family.IPV6: ["fd00:50::/64", "fd00:50::11/128", "fd00:50::/56", "fd00:50::10/127", "fd00::/8"]},
}  # fmt: skip


def lb_service(name: str, last: int, families: tuple[Family, ...], ranges: str) -> list[dict[str, Any]]:
    """A LoadBalancer Service of `families` (ingress IP `<lb prefix>.<last>` in each) with the
    source ranges `RANGES[ranges]` of those families, and one EndpointSlice per family (pods a, b)."""
    lb_ips = [_lb_ip(f, last) for f in families]
    cluster_ips = [_ip(f, last) for f in families]
    spec = {"clusterIPs": cluster_ips, "ipFamilies": [str(f) for f in families],
            "ipFamilyPolicy": "RequireDualStack" if len(families) > 1 else "SingleStack"}  # fmt: skip
    svc = lab_service(name, cluster_ips[0], [LB_PORT], type="LoadBalancer", load_balancer_ips=lb_ips,
                      source_ranges=[r for f in families for r in RANGES[ranges][f]], spec=spec)  # fmt: skip
    slices = [endpoint_slice(name, [Backend(str(ADDR[f]["a"]), NODE), Backend(str(ADDR[f]["b"]), NODE)], [LB_PORT],
                             name=f"{name}-{f.lower()}", address_type=str(f)) for f in families]  # fmt: skip
    return [svc, *slices]


def _lb_ip(family: Family, last: int) -> str:
    """An address in the LB prefix the client routes through the node (ADDR's `lb` is .7 / ::7)."""
    prefix = str(ADDR[family]["lb"]).rsplit(":" if family.ipv6 else ".", 1)[0]
    return f"{prefix}:{last:x}" if family.ipv6 else f"{prefix}.{last}"


def _masqueraded(got: list[Any], family: Family) -> bool:
    """Every probe answered, each pod seeing the node's address on its side: LB traffic with
    eTP=Cluster is masqueraded to the address of the interface towards the pod."""
    return bool(got) and all(isinstance(r, dict) and r["src"] == ADDR[family]["gw_" + r["pod"]] for r in got)


def _both_pods(got: list[Any], family: Family) -> object:
    """Masqueraded, and by both pods (see scenarios.BOTH)."""
    return True if _masqueraded(got, family) and {r["pod"] for r in got} == {"a", "b"} else got


def _path_works(bed: Bed, family: Family) -> dict[str, object]:
    """Polls, from each client address, the bed's LoadBalancer without ranges until it answers
    (10 s at most). The control of the "dropped" checks: right after the bed is built, IPv6
    packets from a fresh address are lost for about a second (neighbour discovery while the
    veths' link-local addresses are still tentative), which would pass for a firewall's drop."""
    out: dict[str, object] = {}
    for src in (ALLOWED[family], DENIED[family], str(ADDR[family]["client"])):
        deadline, got = time.monotonic() + 10, []
        while time.monotonic() < deadline:
            got = bed.send(bed.client, "tcp", str(ADDR[family]["lb"]), 80, count=1, src_ip=src, timeout=0.5)
            if _masqueraded(got, family):
                break
        out[f"control: {src} reaches an LB without ranges"] = True if _masqueraded(got, family) else got
    return out


def source_range_flows(bed: Bed, family: Family, services: tuple[str, ...]) -> dict[str, object]:
    """Each check's outcome: True, or what was seen instead."""
    out = _path_works(bed, family)
    lb = {"restricted": _lb_ip(family, 20), "open": _lb_ip(family, 21), "overlap": _lb_ip(family, 22)}
    if "restricted" in services:
        got = bed.send(bed.client, "tcp", lb["restricted"], 80, count=BOTH, src_ip=ALLOWED[family])
        out["restricted: the allowed source reaches both pods"] = _both_pods(got, family)
        for src in (DENIED[family], str(ADDR[family]["client"])):
            # outside the ranges: dropped (a firewall), so a timeout, never a refusal
            got = bed.send(bed.client, "tcp", lb["restricted"], 80, count=2, src_ip=src, timeout=0.5)
            out[f"restricted: {src} is dropped"] = True if got == ["timeout"] * 2 else got
    for name in ("open", "overlap"):
        if name in services:
            for src in (ALLOWED[family], DENIED[family], str(ADDR[family]["client"])):
                got = bed.send(bed.client, "tcp", lb[name], 80, count=3, src_ip=src)
                out[f"{name}: {src} is allowed"] = True if _masqueraded(got, family) else got
    # the node's other Services: a ClusterIP and the first bed's LoadBalancer without ranges
    out["other Service: ClusterIP"] = _reached(bed.send(bed.client, "tcp", _ip(family, 10), 80))
    out["other Service: LB without ranges"] = _reached(bed.send(bed.client, "tcp", str(ADDR[family]["lb"]), 80))
    return out


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_ipv6_load_balancer_source_ranges(bed: Bed, mode: str, stack: str) -> None:
    """A restricted LoadBalancer (one allowed /128, and /32 on a dual-stack node) lets only that
    source in; then Services with `::/0` and overlapping ranges, added in a partial sync, let every
    client in while the restricted one keeps dropping and the other Services keep working."""
    families = STACKS[stack]
    cidrs = tuple(c for c in CFG.cluster_cidr if Family.of(ipaddress.ip_network(c)) in families)
    for family in families:
        for addr in (ALLOWED[family], DENIED[family]):
            if family.ipv6:
                bed._v6(bed.client, "eth0", f"{addr}/64")
            else:
                bed.client.run(["ip", "addr", "add", f"{addr}/24", "dev", "eth0"])
    results: dict[str, dict[str, object]] = {}

    async def main() -> None:
        proxy = LiveProxy(replace(CFG, mode=mode, cluster_cidr=cidrs), NODE, run_cmd=bed.node)
        source = Source(proxy, objects(families) + lb_service("restricted", 20, families, "restricted"))
        async with serving(proxy, source, 30):
            assert proxy.failed_syncs == 0
            for family in families:
                results[f"{family} before"] = await asyncio.to_thread(source_range_flows, bed, family, ("restricted",))
            done = proxy.syncs
            added = lb_service("open", 21, families, "open") + lb_service("overlap", 22, families, "overlap")
            for obj in added:
                source.publish(obj, kind="ADDED")
            await asyncio.wait_for(proxy.wait_for_syncs(done + 1), 30)
            await asyncio.wait_for(_until(lambda: all(lane.last_changes and "overlap" in str(lane.last_changes.services)
                                                      for lane in proxy.lanes if lane.family in families)), 30)  # fmt: skip
            assert proxy.failed_syncs == 0, "a sync failed on valid source ranges"
            for family in families:
                results[f"{family} after"] = await asyncio.to_thread(
                    source_range_flows, bed, family, ("restricted", "open", "overlap")
                )

    asyncio.run(main())
    print(json.dumps({k: {w: v is True for w, v in c.items()} for k, c in results.items()}, indent=1))
    failures = {f"{k} {what}": got for k, checks in results.items() for what, got in checks.items() if got is not True}
    assert not failures, failures
