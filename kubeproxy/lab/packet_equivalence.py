"""Equivalence probes for the side-by-side bed (lab/side_by_side.py): real TCP and UDP flows, and
health-check GETs, sent from a pod on the node, from the node itself and from an outside client to
upstream's node and to ours, each outcome told in roles so the two nodes' outcomes compare.

An outcome is what the packets show: whether the flows were answered (or refused, or dropped),
which endpoints answered (a pod on the probed node is `<base>-self`, its mirror on the other proxy
node `<base>-other`), and the source address each endpoint saw (the server echoes its peer): the
prober's own address, or the node's when the flow was masqueraded.

Endpoint choice is random, so a probe that reached an endpoint is repeated `FLOWS` times and the
set of endpoints reached compared. With n ≤ MAX_ENDPOINTS equally likely endpoints a given one is
missed by all FLOWS flows with probability (1 - 1/n)^FLOWS ≤ 0.8^120 < 3e-12; over a run's
outcomes (about a thousand, each of at most MAX_ENDPOINTS endpoints) a set differs between the
nodes by chance with probability below 2e-8, so a difference is a difference. Under session affinity only the number of
endpoints reached is compared (one, whichever the node picked); under an affinity shorter than
SHORT_AFFINITY seconds, which may expire between a probe's flows, only whether some endpoint answered.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import HTTP_GET, PROBE, ClusterError, await_ready
from kubeproxy.lab.side_by_side import (
    OURS_NODE,
    POD_HOST_NODE,
    POD_PORT,
    POD_PORTS,
    UNDERLAY,
    UNDERLAY6,
    UPSTREAM_NODE,
    BedPod,
    SideBySide,
    _attach,
)

FLOWS = 120
MAX_ENDPOINTS = 5
# Each proxy node's outside client on the underlay: its address, and a second source it may use.
CLIENT_IPS = {UPSTREAM_NODE: ("192.168.30.50", "192.168.30.51"), OURS_NODE: ("192.168.30.52", "192.168.30.53")}
CLIENT_IPS6 = {UPSTREAM_NODE: ("fd00:30::50", "fd00:30::51"), OURS_NODE: ("fd00:30::52", "fd00:30::53")}
# LoadBalancer and external IPs, and the Service ranges (as a network that routes them to the
# nodes does): a client routes them to its node.
CLIENT_CIDRS = ("203.0.113.0/24", "198.51.100.0/24", "10.96.0.0/12")
CLIENT_CIDRS6 = ("2001:db8::/32", "fd00:10:96::/112")
_PROXY_NODES = (UPSTREAM_NODE, OURS_NODE)
_PROTOS = {"TCP": "tcp", "UDP": "udp"}  # the probe sends no SCTP
SHORT_AFFINITY = 120
_SECOND_HOST = 20  # a node's second address (not the Node object's): UNDERLAY[_SECOND_HOST + index]


@dataclass(frozen=True)
class Probe:
    """Flows from `origin` ("pod", "node" or "client") to `dst`, in which `{node}` is the probed
    node's address, `{node2}` its second address (`{node6}` and `{node6_2}` their IPv6 twins);
    `second_source` sends from the client's second address of the destination's family; proto
    "http" is one GET whose status and `localEndpoints` are the outcome."""

    name: str
    origin: str
    proto: str
    dst: str
    second_source: bool = False
    affinity: bool = False
    # A session affinity that may expire while the flows run: which endpoints they reach is chance.
    short_affinity: bool = False

    def target(self, addresses: Mapping[str, str]) -> str:
        return self.dst.format_map(addresses)

    @property
    def ipv6(self) -> bool:
        return self.dst.startswith("[")


@dataclass(frozen=True)
class Outcome:
    answer: str  # the kinds of result over the flows: "answered", "refused", "timeout", ... joined by "+"
    endpoints: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.answer} endpoints={list(self.endpoints)} sources={list(self.sources)}"


@dataclass
class ProbeBed:
    """The side-by-side bed with what the probes need: a client pod on each proxy node, a second
    address of each family on each proxy node, and an outside client on the underlay for each
    proxy node (so both nodes are probed at once), which is also the node's default gateway."""

    bed: SideBySide
    clients: dict[str, L.NetNS]
    second_ips: dict[str, str]
    second_ips6: dict[str, str]

    @classmethod
    @contextmanager
    def attach(cls, bed: SideBySide) -> Iterator[ProbeBed]:
        with ExitStack() as stack:
            clients: dict[str, L.NetNS] = {}
            for index, (name, (first, other)) in enumerate(CLIENT_IPS.items(), start=8):
                clients[name] = client = stack.enter_context(L.netns("kpsbcl"))
                _attach(bed.switch, client, f"{first}/{UNDERLAY.prefixlen}", index)
                node = bed.nodes[name]
                first6, other6 = CLIENT_IPS6[name]
                L.ip_batch(client, [f"addr add {other}/{UNDERLAY.prefixlen} dev eth0",
                                    *(f"addr add {a}/{UNDERLAY6.prefixlen} dev eth0 nodad" for a in (first6, other6)),
                                    *(f"route add {cidr} via {node.ip}" for cidr in CLIENT_CIDRS),
                                    *(f"route add {cidr} via {node.ip6}" for cidr in CLIENT_CIDRS6)])  # fmt: skip
                # Without a default route the node could not even address a ClusterIP.
                defaults = [f"default via {first}", f"default via {first6}"]
                L.ip_batch(node.ns, [f"route add {r}" for r in defaults])
                stack.callback(_undo, node.ns, [["route", "del", *r.split()] for r in defaults])
            second: dict[str, str] = {}
            second6: dict[str, str] = {}
            for index, name in enumerate(bed.nodes, start=1):
                second[name] = str(UNDERLAY[_SECOND_HOST + index])
                second6[name] = str(UNDERLAY6[_SECOND_HOST + index])
                added = [f"{second[name]}/{UNDERLAY.prefixlen} dev eth0", f"{second6[name]}/{UNDERLAY6.prefixlen} dev eth0"]
                L.ip_batch(bed.nodes[name].ns, [f"addr add {a} nodad" for a in added])
                stack.callback(_undo, bed.nodes[name].ns, [["addr", "del", *a.split()] for a in added])
            probes = cls(bed, clients, second, second6)
            for name in _PROXY_NODES:
                probes.add_pod(f"cli-{name}", name, {"app": "cli"})
                stack.callback(probes.remove_pod, f"cli-{name}")
            # Leaving, the bed is as it was (a shared bed serves other tests after this one).
            yield probes

    def remove_pod(self, name: str) -> None:
        if name in self.bed.pods:
            self.bed.finish_termination(name)

    def add_pod(self, name: str, node_name: str, labels: Mapping[str, str], *, ready: bool = True) -> BedPod:
        """The bed's pod, answering UDP too (both families): on POD_PORT and on its UDP container port."""
        pod = self.bed.add_pod(name, node_name, labels, ready=ready)
        ip, ip6 = pod.info.ips
        assert pod.ns is not None, "the bed's add_pod wires the pod"
        ports = [POD_PORT, *(number for _, number, protocol in POD_PORTS if protocol == "UDP")]
        listens = [a for number in ports for a in ("--listen", f"{ip}:{number}", "--listen", f"[{ip6}]:{number}")]
        child = pod.ns.popen([*PROBE, "serve", "--proto", "udp", *listens], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        await_ready(f"the UDP probe in pod {name}", child, timeout=15)
        return pod

    # ---- roles --------------------------------------------------------------------------------

    def role(self, ip: str, node_name: str) -> str:
        """An address as the probed node sees it: its own pods and addresses as `self`, the other
        proxy node's as `other` (the nodes mirror each other)."""
        other = OURS_NODE if node_name == UPSTREAM_NODE else UPSTREAM_NODE
        nodes = self.bed.nodes
        named = {
            nodes[node_name].ip: "node-self",
            self.second_ips[node_name]: "node-self-2",
            nodes[other].ip: "node-other",
            self.second_ips[other]: "node-other-2",
            nodes[POD_HOST_NODE].ip: POD_HOST_NODE,
            "127.0.0.1": "loopback",
            CLIENT_IPS[node_name][0]: "client",
            CLIENT_IPS[node_name][1]: "client-2",
            CLIENT_IPS[other][0]: "client-other",
            CLIENT_IPS[other][1]: "client-other-2",
            # IPv6: the same roles (a probe's name says its family)
            nodes[node_name].ip6: "node-self",
            self.second_ips6[node_name]: "node-self-2",
            nodes[other].ip6: "node-other",
            self.second_ips6[other]: "node-other-2",
            nodes[POD_HOST_NODE].ip6: POD_HOST_NODE,
            CLIENT_IPS6[node_name][0]: "client",
            CLIENT_IPS6[node_name][1]: "client-2",
            CLIENT_IPS6[other][0]: "client-other",
            CLIENT_IPS6[other][1]: "client-other-2",
        }
        if ip in named:
            return named[ip]
        pod = self.bed.pods_by_ip().get(ip)
        if pod is None:
            return ip
        for node, suffix in ((node_name, "self"), (other, "other")):
            if pod.endswith(f"-{node}"):
                return f"{pod[: -len(node) - 1]}-{suffix}"
        return pod

    # ---- probing ------------------------------------------------------------------------------

    def origin_ns(self, origin: str, node_name: str) -> L.NetNS:
        if origin == "pod":
            ns = self.bed.pods[f"cli-{node_name}"].ns
            assert ns is not None, "the client pods are wired"
            return ns
        if origin == "node":
            return self.bed.nodes[node_name].ns
        return self.clients[node_name]

    def addresses(self, node_name: str) -> dict[str, str]:
        """What a probe's `dst` may name, for `node_name`."""
        node = self.bed.nodes[node_name]
        return {"node": node.ip, "node2": self.second_ips[node_name], "node6": node.ip6, "node6_2": self.second_ips6[node_name]}

    def outcomes(self, node_name: str, probes: Sequence[Probe]) -> dict[str, Outcome]:
        """Every probe's outcome against `node_name`."""
        addresses = self.addresses(node_name)
        out: dict[str, Outcome] = {}
        flows = [p for p in probes if p.proto != "http"]
        for p in probes:
            if p.proto == "http":
                out[p.name] = self._health(self.origin_ns(p.origin, node_name), f"http://{p.target(addresses)}/")
        first = self._send(flows, node_name, 1)
        answered = [p for p in flows if any(isinstance(r, dict) for r in first[p.name])]
        more = self._send(answered, node_name, FLOWS)
        for p in flows:
            results = first[p.name] + more.get(p.name, [])
            out[p.name] = self._outcome(p, results, node_name)
        return out

    def _send(self, probes: Sequence[Probe], node_name: str, count: int) -> dict[str, list[object]]:
        """`count` flows per probe, one process per origin, protocol and source."""
        addresses = self.addresses(node_name)
        groups: dict[tuple[str, str, bool, bool], list[Probe]] = {}
        for p in probes:
            groups.setdefault((p.origin, p.proto, p.second_source, p.ipv6), []).append(p)
        got: dict[str, list[object]] = {}
        for (origin, proto, second_source, ipv6), group in groups.items():
            argv = [*PROBE, "send", "--proto", proto, "--count", str(count), "--timeout", "1"]
            argv += [a for p in group for a in ("--dst", p.target(addresses))]
            argv += ["--src", (CLIENT_IPS6 if ipv6 else CLIENT_IPS)[node_name][1]] if second_source else []
            proc = self.origin_ns(origin, node_name).run(argv, check=False, timeout=60 + count * len(group) * 2)
            if proc.returncode != 0:
                raise ClusterError(f"probe {argv} from {origin} of {node_name} failed: {proc.stderr.strip()[-500:]}")
            results = json.loads(proc.stdout)
            for i, p in enumerate(group):
                got[p.name] = results[i * count : (i + 1) * count]
        return got

    def _outcome(self, probe: Probe, results: Iterable[object], node_name: str) -> Outcome:
        kinds: set[str] = set()
        endpoints: set[str] = set()
        sources: set[str] = set()
        for r in results:
            if isinstance(r, dict):
                kinds.add("answered")
                endpoints.add(self.role(r["dst"].rsplit(":", 1)[0].strip("[]"), node_name))
                sources.add(self.role(r["src"].rsplit(":", 1)[0].strip("[]"), node_name))
            else:
                kinds.add(str(r))
        if probe.ipv6 and kinds and kinds <= {"refused", "timeout"}:
            # This kernel loses most ICMPv6 errors that an nftables `reject` sends (194 of 200 in two
            # bare namespaces, every ICMP rate limit off; IPv4: none), so over IPv6 a refused flow
            # and a dropped one look alike.
            kinds = {"refused or timeout"}
        reached = tuple(sorted(endpoints))
        if probe.affinity and len(endpoints) == 1:
            reached = ("one endpoint (affinity)",)
        if probe.short_affinity and endpoints:
            reached = ("endpoints by an expiring affinity",)
        return Outcome("+".join(sorted(kinds)), reached, tuple(sorted(sources)))

    @staticmethod
    def _health(ns: L.NetNS, url: str) -> Outcome:
        proc = ns.run([sys.executable, "-c", HTTP_GET, url, "2"], check=False, timeout=30)
        if proc.returncode != 0:
            return Outcome("no answer")
        got = json.loads(proc.stdout)
        try:
            local = json.loads(got["body"]).get("localEndpoints")
        except ValueError:
            local = "unparsed body"
        return Outcome(f"http {got['status']}", (f"localEndpoints={local}",))


def _host_port(ip: str, number: int) -> str:
    return f"[{ip}]:{number}" if ":" in ip else f"{ip}:{number}"


def service_probes(svc: Mapping[str, object]) -> list[Probe]:
    """Probes of the Service's addresses as the API server holds it, on its first TCP or UDP port:
    its ClusterIPs from a pod, its external and LoadBalancer IPs and NodePort from the client."""
    meta, spec, status = svc["metadata"], svc["spec"], svc.get("status") or {}
    assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)
    ports = [p for p in spec.get("ports", []) if p.get("protocol", "TCP") in _PROTOS]
    if not ports:
        return []
    first = ports[0]
    proto, number = _PROTOS[first.get("protocol", "TCP")], first["port"]
    affinity = spec.get("sessionAffinity") == "ClientIP"
    timeout = (spec.get("sessionAffinityConfig") or {}).get("clientIP", {}).get("timeoutSeconds", 10800)
    name = meta["name"]
    out = [Probe(f"pod → {name} ClusterIP {ip}", "pod", proto, _host_port(ip, number), affinity=affinity)
           for ip in spec.get("clusterIPs", [])]  # fmt: skip
    # Of many externalIPs, the first of each family: they all lead to the same place.
    ext = spec.get("externalIPs", [])
    external = [next(ip for ip in ext if (":" in ip) == v6) for v6 in (False, True) if any((":" in ip) == v6 for ip in ext)]
    external += [i["ip"] for i in status.get("loadBalancer", {}).get("ingress", []) if "ip" in i]
    out += [Probe(f"client → {name} at {ip}", "client", proto, _host_port(ip, number), affinity=affinity) for ip in external]
    if first.get("nodePort"):
        for family, template in (("IPv4", "{node}"), ("IPv6", "[{node6}]")):
            if family in spec.get("ipFamilies", []):
                dst = f"{template}:{first['nodePort']}"
                out.append(Probe(f"client → {name} NodePort {family}", "client", proto, dst, affinity=affinity))
    if affinity and timeout < SHORT_AFFINITY:
        out = [replace(p, short_affinity=True) for p in out]
    return out


def _undo(ns: L.NetNS, commands: Sequence[Sequence[str]]) -> None:
    """`ip` commands that take back what attach() added; one that finds it gone already is no error."""
    for command in commands:
        ns.run(["ip", *command], check=False)


def differences(upstream: Mapping[str, Outcome], ours: Mapping[str, Outcome]) -> list[str]:
    return [
        f"{name}: upstream ({UPSTREAM_NODE}) {upstream.get(name)}; ours ({OURS_NODE}) {ours.get(name)}"
        for name in sorted(set(upstream) | set(ours))
        if upstream.get(name) != ours.get(name)
    ]


def await_same_packets(
    probes: ProbeBed,
    probe_set: Sequence[Probe],
    expected: Mapping[str, set[tuple[str, bool, bool, bool]]],
    fresh: Callable[[str, Mapping[str, Outcome]], bool],
    *,
    families: Sequence[str] = ("IPv4",),
    timeout: float = 120,
) -> tuple[dict[str, Outcome], list[str]]:
    """After a change: until the slices hold `expected`, both proxies have synced `families` since,
    `fresh` holds for both nodes' outcomes (they show the change: equal outcomes of two stale
    rulesets are not convergence) and the outcomes are equal. Returns upstream's outcomes and the
    differences left at the deadline (none when they converged)."""
    bed = probes.bed
    deadline = time.monotonic() + timeout
    while not bed.slices_settled(expected):
        bed.check_alive()
        if time.monotonic() >= deadline:
            raise ClusterError(f"the EndpointSlices did not reach {dict(expected)} in {timeout:g} s")
        time.sleep(0.1)
    diffs: list[str] = []
    while True:
        bed.check_alive()
        if all(bed.synced_since_change(n, families, families) for n in _PROXY_NODES):
            with ThreadPoolExecutor(len(_PROXY_NODES)) as pool:
                got = dict(zip(_PROXY_NODES, pool.map(lambda n: probes.outcomes(n, probe_set), _PROXY_NODES), strict=True))
            stale = [n for n in _PROXY_NODES if not fresh(n, got[n])]
            diffs = differences(got[UPSTREAM_NODE], got[OURS_NODE])
            if not stale and not diffs:
                return got[UPSTREAM_NODE], []
            diffs += [f"{n}'s outcomes do not show the change yet" for n in stale]
        if time.monotonic() >= deadline:
            return {}, diffs + _log_tails(bed) if diffs else _not_synced(bed, timeout)
        time.sleep(0.2)


def _not_synced(bed: SideBySide, timeout: float) -> list[str]:
    """Why a step timed out before both proxies synced: each one's last syncs and its log's tail."""
    return [f"the proxies did not sync the change (made at {bed.changed_at:.3f}) within {timeout:g} s", *_log_tails(bed)]


def _log_tails(bed: SideBySide) -> list[str]:
    out = []
    for node in _PROXY_NODES:
        tail = "\n".join(bed.proxy_log(node).splitlines()[-40:])
        out.append(f"{node}: last syncs {bed.last_syncs(node)} (the change at {bed.changed_at:.3f}); its log ends:\n{tail}")
    return out
