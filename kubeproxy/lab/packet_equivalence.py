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
endpoints reached is compared (one, whichever the node picked).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import HTTP_GET, PROBE, ClusterError, await_ready
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, POD_PORT, UNDERLAY, UPSTREAM_NODE, BedPod, SideBySide, _attach

FLOWS = 120
MAX_ENDPOINTS = 5
# Each proxy node's outside client on the underlay: its address, and a second source it may use.
CLIENT_IPS = {UPSTREAM_NODE: ("192.168.30.50", "192.168.30.51"), OURS_NODE: ("192.168.30.52", "192.168.30.53")}
# LoadBalancer and external IPs, and the Service range (as a network that routes it to the nodes
# does): a client routes them to its node.
CLIENT_CIDRS = ("203.0.113.0/24", "198.51.100.0/24", "10.96.0.0/12")
_PROXY_NODES = (UPSTREAM_NODE, OURS_NODE)
_SECOND_HOST = 20  # a node's second address (not the Node object's): UNDERLAY[_SECOND_HOST + index]


@dataclass(frozen=True)
class Probe:
    """Flows from `origin` ("pod", "node" or "client") to `dst`, in which `{node}` is the probed
    node's address, `{node2}` its second address; `second_source` sends from the client's
    second address; proto "http" is one GET whose status and `localEndpoints` are the outcome."""

    name: str
    origin: str
    proto: str
    dst: str
    second_source: bool = False
    affinity: bool = False

    def target(self, node_ip: str, node2_ip: str) -> str:
        return self.dst.format(node=node_ip, node2=node2_ip)


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
    address on each proxy node, and an outside client on the underlay for each proxy node (so
    both nodes are probed at once), which is also the node's default gateway."""

    bed: SideBySide
    clients: dict[str, L.NetNS]
    second_ips: dict[str, str]

    @classmethod
    @contextmanager
    def attach(cls, bed: SideBySide) -> Iterator[ProbeBed]:
        with ExitStack() as stack:
            clients: dict[str, L.NetNS] = {}
            for index, (name, (first, other)) in enumerate(CLIENT_IPS.items(), start=8):
                clients[name] = client = stack.enter_context(L.netns("kpsbcl"))
                _attach(bed.switch, client, f"{first}/{UNDERLAY.prefixlen}", index)
                via = bed.nodes[name].ip
                L.ip_batch(client, [f"addr add {other}/{UNDERLAY.prefixlen} dev eth0",
                                    *(f"route add {cidr} via {via}" for cidr in CLIENT_CIDRS)])  # fmt: skip
                # Without a default route the node could not even address a ClusterIP.
                L.ip_batch(bed.nodes[name].ns, [f"route add default via {first}"])
            second: dict[str, str] = {}
            for index, name in enumerate(bed.nodes, start=1):
                second[name] = str(UNDERLAY[_SECOND_HOST + index])
                bed.nodes[name].ns.run(["ip", "addr", "add", f"{second[name]}/{UNDERLAY.prefixlen}", "dev", "eth0"])
            probes = cls(bed, clients, second)
            for node in _PROXY_NODES:
                probes.add_pod(f"cli-{node}", node, {"app": "cli"})
            yield probes

    def add_pod(self, name: str, node_name: str, labels: Mapping[str, str], *, ready: bool = True) -> BedPod:
        """The bed's pod, answering UDP on POD_PORT too."""
        pod = self.bed.add_pod(name, node_name, labels, ready=ready)
        ip = pod.info.ips[0]
        assert pod.ns is not None, "the bed's add_pod wires the pod"
        child = pod.ns.popen([*PROBE, "serve", "--proto", "udp", "--listen", f"{ip}:{POD_PORT}"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        await_ready(f"the UDP probe in pod {name}", child, timeout=15)
        return pod

    # ---- roles --------------------------------------------------------------------------------

    def role(self, ip: str, node_name: str) -> str:
        """An address as the probed node sees it: its own pods and addresses as `self`, the other
        proxy node's as `other` (the nodes mirror each other)."""
        other = OURS_NODE if node_name == UPSTREAM_NODE else UPSTREAM_NODE
        named = {
            self.bed.nodes[node_name].ip: "node-self",
            self.second_ips[node_name]: "node-self-2",
            self.bed.nodes[other].ip: "node-other",
            self.second_ips[other]: "node-other-2",
            self.bed.nodes[POD_HOST_NODE].ip: POD_HOST_NODE,
            "127.0.0.1": "loopback",
            CLIENT_IPS[node_name][0]: "client",
            CLIENT_IPS[node_name][1]: "client-2",
            CLIENT_IPS[other][0]: "client-other",
            CLIENT_IPS[other][1]: "client-other-2",
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

    def outcomes(self, node_name: str, probes: Sequence[Probe]) -> dict[str, Outcome]:
        """Every probe's outcome against `node_name`."""
        node_ip, node2 = self.bed.nodes[node_name].ip, self.second_ips[node_name]
        out: dict[str, Outcome] = {}
        flows = [p for p in probes if p.proto != "http"]
        for p in probes:
            if p.proto == "http":
                out[p.name] = self._health(self.origin_ns(p.origin, node_name), f"http://{p.target(node_ip, node2)}/")
        first = self._send(flows, node_name, 1)
        answered = [p for p in flows if any(isinstance(r, dict) for r in first[p.name])]
        more = self._send(answered, node_name, FLOWS)
        for p in flows:
            results = first[p.name] + more.get(p.name, [])
            out[p.name] = self._outcome(p, results, node_name)
        return out

    def _send(self, probes: Sequence[Probe], node_name: str, count: int) -> dict[str, list[object]]:
        """`count` flows per probe, one process per origin, protocol and source."""
        node_ip, node2 = self.bed.nodes[node_name].ip, self.second_ips[node_name]
        groups: dict[tuple[str, str, bool], list[Probe]] = {}
        for p in probes:
            groups.setdefault((p.origin, p.proto, p.second_source), []).append(p)
        got: dict[str, list[object]] = {}
        for (origin, proto, second_source), group in groups.items():
            argv = [*PROBE, "send", "--proto", proto, "--count", str(count), "--timeout", "1"]
            argv += [a for p in group for a in ("--dst", p.target(node_ip, node2))]
            argv += ["--src", CLIENT_IPS[node_name][1]] if second_source else []
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
        reached = tuple(sorted(endpoints))
        if probe.affinity and len(endpoints) == 1:
            reached = ("one endpoint (affinity)",)
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
    timeout: float = 120,
) -> tuple[dict[str, Outcome], list[str]]:
    """After a change: until the slices hold `expected`, both proxies have synced IPv4 since,
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
        if all(bed.synced_since_change(n, ("IPv4",)) for n in _PROXY_NODES):
            with ThreadPoolExecutor(len(_PROXY_NODES)) as pool:
                got = dict(zip(_PROXY_NODES, pool.map(lambda n: probes.outcomes(n, probe_set), _PROXY_NODES), strict=True))
            stale = [n for n in _PROXY_NODES if not fresh(n, got[n])]
            diffs = differences(got[UPSTREAM_NODE], got[OURS_NODE])
            if not stale and not diffs:
                return got[UPSTREAM_NODE], []
            diffs += [f"{n}'s outcomes do not show the change yet" for n in stale]
        if time.monotonic() >= deadline:
            return {}, diffs or _not_synced(bed, timeout)
        time.sleep(0.2)


def _not_synced(bed: SideBySide, timeout: float) -> list[str]:
    """Why a step timed out before both proxies synced: each one's last syncs and its log's tail."""
    out = [f"the proxies did not sync the change (made at {bed.changed_at:.3f}) within {timeout:g} s"]
    for node in _PROXY_NODES:
        tail = "\n".join(bed.proxy_log(node).splitlines()[-40:])
        out.append(f"{node}: last syncs {bed.last_syncs(node)}; its log ends:\n{tail}")
    return out
