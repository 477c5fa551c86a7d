"""A three-namespace bed for differential tests: client -- node (rules under test) -- backends.

The kernel is the oracle: a ruleset is loaded into the node's namespace, real packets are sent
from the client (or from the node itself), and receivers report which destination they were
sent to and which source they saw. The tracer's outcomes must explain what arrived.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NotRequired, TypedDict

from kubeproxy.lab import netns as L
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.simulate import Outcome

PROBE = [sys.executable, "-m", "kubeproxy.lab.probe"]
# Total chance that a correct tracer fails one distribution comparison (Hoeffding + union bound).
ALPHA = 1e-6


@dataclass
class Bed:
    client: L.NetNS
    node: L.NetNS
    backend: L.NetNS
    client_ip: str
    model: Node
    stack: ExitStack = field(repr=False)

    def load_iptables(self, text: str, restore: str = "iptables-restore") -> None:
        self.node.run([restore], input=text)

    def load_nft(self, text: str) -> None:
        self.node.run(["nft", "-f", "-"], input=text)

    def serve(self, where: L.NetNS, proto: str, listens: list[str]) -> None:
        args = [x for spec in listens for x in ("--listen", spec)]
        child = where.popen([*PROBE, "serve", "--proto", proto, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
        assert child.stdout is not None
        line = child.stdout.readline()  # readiness: every socket is bound
        if line.strip() != "ready":
            raise RuntimeError(f"receiver did not start: {child.stderr.read() if child.stderr else ''}")

    def send(self, proto: str, dst: str, count: int, *, src: str | None = None, timeout: float = 1.0,
             from_node: bool = False) -> list[Any]:
        """The probe's JSON outcome per packet: "refused", "timeout", or {"dst": ..., "src": ...}."""
        ns = self.node if from_node else self.client
        argv = [*PROBE, "send", "--proto", proto, "--dst", dst, "--count", str(count), "--timeout", str(timeout)]
        if src:
            argv += ["--src", src]
        outcomes: list[Any] = json.loads(ns.run(argv, timeout=60 + count * timeout).stdout)
        return outcomes


class BedSpec(TypedDict):
    """bed()'s arguments, for tests that keep their topology in a constant."""

    client_ip: str
    node_front: tuple[str, str]
    node_back: tuple[str, str]
    backends: list[str]
    v6: NotRequired[tuple[str, str, str, list[str]]]


@contextmanager
def bed(
    client_ip: str, node_front: tuple[str, str], node_back: tuple[str, str], backends: list[str],
    v6: tuple[str, str, str, list[str]] | None = None,
) -> Iterator[Bed]:
    """client_ip and backends are `IP/PLEN`; node_front/back are (ifname, `IP/PLEN`); `v6` adds
    IPv6 addresses (client, node front, node back, backends) beside them, routed the same way."""
    with ExitStack() as stack:
        client = stack.enter_context(L.netns("kpc"))
        node = stack.enter_context(L.netns("kpn"))
        backend = stack.enter_context(L.netns("kpb"))
        L.link(client, "eth0", client_ip, node, node_front[0], node_front[1])
        L.link(node, node_back[0], node_back[1], backend, "eth0", backends[0])
        for extra in backends[1:]:
            backend.run(["ip", "addr", "add", extra, "dev", "eth0"])
        ifaces = [f"{node_front[0]}={node_front[1]}", f"{node_back[0]}={node_back[1]}"]
        if v6 is not None:
            c6, f6, k6, b6 = v6
            # nodad: the addresses are usable at once (duplicate detection would hold them ~1 s)
            for ns, dev, cidr in ((client, "eth0", c6), (node, node_front[0], f6), (node, node_back[0], k6),
                                  *((backend, "eth0", x) for x in b6)):
                ns.run(["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"])
            client.run(["ip", "-6", "route", "add", "default", "via", f6.split("/")[0]])
            backend.run(["ip", "-6", "route", "add", "default", "via", k6.split("/")[0]])
            node.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0"])
            node.run(["ip", "-6", "route", "add", "default", "via", c6.split("/")[0]])
            ifaces += [f"{node_front[0]}={f6}", f"{node_back[0]}={k6}"]
        client.run(["ip", "route", "add", "default", "via", node_front[1].split("/")[0]])
        backend.run(["ip", "route", "add", "default", "via", node_back[1].split("/")[0]])
        node.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        # REJECT answers with ICMP errors, which the kernel rate-limits per peer; a test that
        # sends hundreds of probes must see every answer
        node.run(["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0", "net.ipv4.icmp_msgs_per_sec=100000",
                  "net.ipv4.icmp_msgs_burst=100000"])
        # the node's default route points at the client side, as a node's uplink would
        gw = client_ip.split("/")[0]
        node.run(["ip", "route", "add", "default", "via", gw])
        routes = [f"default={node_front[0]}@{gw}"]
        if v6 is not None:
            routes.append(f"default={node_front[0]}@{v6[0].split('/')[0]}")
        model = Node.from_flags(ifaces=ifaces, routes=routes)
        yield Bed(client, node, backend, client_ip.split("/")[0], model, stack)


def outcome_key(o: Outcome) -> object:
    if o.verdict == "DROP" and any(n.startswith("no route") for n in o.notes):
        return "error: Network is unreachable"
    if o.verdict == "DROP":
        return "timeout"
    if o.verdict == "REJECT":
        return "refused"
    if o.v6:
        return (f"[{A.fmt_ip(o.dst, True)}]:{o.dport}", A.fmt_ip(o.src, True))
    return (f"{A.fmt_ip(o.dst)}:{o.dport}", A.fmt_ip(o.src))


def observed_key(r: object) -> object:
    if isinstance(r, dict):
        return (r["dst"], r["src"].rsplit(":", 1)[0].strip("[]"))
    return r


def assert_kernel_agrees(outcomes: list[Outcome], observed: list[object]) -> None:
    """Every observation is a predicted outcome; frequencies match probabilities.

    Deterministic outcomes must be seen every time. Random ones: by Hoeffding, a correct
    prediction p is off by more than t = sqrt(ln(2K/ALPHA) / 2n) with chance below ALPHA/K."""
    expected: dict[object, Fraction] = {}
    for o in outcomes:
        k = outcome_key(o)
        expected[k] = expected.get(k, Fraction(0)) + o.probability
    assert sum(expected.values()) == 1
    n = len(observed)
    counts = Counter(observed_key(r) for r in observed)
    unexpected = {k: c for k, c in counts.items() if k not in expected}
    assert not unexpected, f"kernel did what the tracer did not predict: {unexpected}; predicted {expected}"
    t = math.sqrt(math.log(2 * len(expected) / ALPHA) / (2 * n))
    for k, p in expected.items():
        if p == 1:
            assert counts[k] == n, f"{k}: {counts[k]}/{n}, predicted always"
        else:
            f = counts[k] / n
            assert abs(f - float(p)) <= t, f"{k}: seen {f:.3f}, predicted {float(p):.3f} (tolerance {t:.3f})"
