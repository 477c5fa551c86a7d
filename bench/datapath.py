#!/usr/bin/env python3
"""The data path: how fast new connections get through a ClusterIP with 10 and with 10,000 services.

Usage: .venv/bin/python bench/datapath.py [--sizes 10,10000] [--modes iptables,nftables]
           [--seconds 3] [--rounds 3] [--endpoints 10] [--iptables-variant legacy]

One bed of three network namespaces per (mode, size), all built first, then measured in turns
(round after round, every bed in each round) so that whatever else the machine is doing falls
on all of them alike; the table shows the median of the rounds:

    client 172.30.0.2 ── node 172.30.0.1 | 10.244.0.1 (the mode's rules) ── pod 10.244.1.10
                                                                              tcp 8080, udp 5353

The node's rules are installed by the backends themselves (IptablesProxier / NftablesProxier
`sync` with `run` set to the node namespace), for N-1 filler services (bench/render.py's, with
--endpoints endpoints each, none reachable) and the service under test, `zz-datapath/target`,
ClusterIP 10.97.0.10, TCP 80 -> 8080 and UDP 53 -> 5353 on the pod. Its namespace sorts last, so
in iptables mode its rules are the last service rules of KUBE-SERVICES: every new flow to it is
compared with every other service's rule first, upstream's worst case (the `position` column
shows where it is). In nftables mode it is one lookup in the `service-ips` map whatever N is.
No local detector is set, so nothing is masqueraded (no SNAT port limit comes into it).

The sender is a small C program (bench/datapath_loop.c, compiled with gcc into a temporary
directory) so that its own cost per flow is a few microseconds, one flow at a time:

    tcp conn/s   connect() + close with RST (no TIME_WAIT), as many as fit in --seconds; the
                 SYN is the flow's first packet, the only one that walks the nat table
    tcp p50 us   median connect() time (SYN out to SYN-ACK back), through the node
    udp flows/s  a new socket (fresh source port) per datagram, echoed by the pod: a new
                 conntrack entry, and a walk of the nat table, per datagram
    udp p50 us   median send-to-echo time of those first packets
    pod conn/s   the TCP loop straight to the pod's address (routed by the node, no service):
                 iptables' PREROUTING walks KUBE-SERVICES for every new flow, service or not

The iptables mode uses iptables-legacy by default: iptables-nft takes minutes to load 10,000
services (bench/render.py). The node's conntrack table is flushed before each measurement and
its TCP close / UDP timeouts are set to 1 s there, so entries of one run do not fill the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.backends.iptables.proxier import IptablesProxier  # noqa: E402
from kubeproxy.backends.nftables.proxier import NftablesProxier  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.lab.builders import Backend, Port, endpoint_slice, service  # noqa: E402
from kubeproxy.model.node_model import build_view  # noqa: E402
from kubeproxy.model.options import Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402

NODE = "node"
CLIENT_IP, NODE_IP, NODE_POD_GW, POD_IP = "172.30.0.2", "172.30.0.1", "10.244.0.1", "10.244.1.10"
TARGET_NS, TARGET_NAME, TARGET_IP = "zz-datapath", "target", "10.97.0.10"
TCP = Port("tcp", 80, 8080, "TCP")
UDP = Port("udp", 53, 5353, "UDP")
SOURCE = ROOT / "bench" / "datapath_loop.c"
MODES = ("iptables", "nftables")
_RESULT = re.compile(r"count=(\d+) errors=(\d+) seconds=([\d.]+) p50_us=([\d.]+) p99_us=([\d.]+)")


def _bench_cluster() -> Callable[[int, int], list[dict]]:
    spec = importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cluster  # the same filler services and endpoints as bench/render.py


def objects(services: int, endpoints: int) -> list[dict]:
    """services-1 fillers and the service under test (last in name order)."""
    target = service(TARGET_NAME, TARGET_IP, [TCP, UDP], namespace=TARGET_NS)
    slice_ = endpoint_slice(TARGET_NAME, [Backend(POD_IP, NODE)], [TCP, UDP], namespace=TARGET_NS)
    return [*_bench_cluster()(services - 1, endpoints), target, slice_]


@dataclass(frozen=True)
class Run:
    count: int
    errors: int
    seconds: float
    p50_us: float
    p99_us: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds


@dataclass
class Bed:
    mode: str
    services: int
    client: netns.NetNS
    node: netns.NetNS
    pod: netns.NetNS
    load_seconds: float = 0.0
    position: str = ""
    runs: dict[str, list[Run]] = field(default_factory=dict)
    # What bench/scale.py needs to make further syncs on the loaded bed (a change, its latency).
    render_seconds: float = 0.0
    sync: Callable[[object, frozenset[tuple[str, str]] | None], object] | None = None
    view: object = None

    def measure(self, loop: Path, what: str, seconds: float) -> Run:
        proto, dst, port = {"tcp": ("tcp", TARGET_IP, TCP.port), "udp": ("udp", TARGET_IP, UDP.port),
                             "pod": ("tcp", POD_IP, TCP.target)}[what]  # fmt: skip
        self.node.run(["conntrack", "-F"], check=False)
        out = self.client.run([str(loop), proto, dst, str(port), f"{seconds:g}"], timeout=seconds + 30).stdout
        m = _RESULT.search(out)
        if m is None:
            raise SystemExit(f"{self.mode} {self.services}: the {what} loop printed {out!r}")
        run = Run(int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]))
        self.runs.setdefault(what, []).append(run)
        return run

    def median(self, what: str, key: Callable[[Run], float]) -> float:
        return statistics.median(key(r) for r in self.runs[what])


def compile_loop(workdir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("bench/datapath.py needs a C compiler (gcc) for its sender, bench/datapath_loop.c")
    binary = workdir / "datapath_loop"
    subprocess.run([gcc, "-O2", "-Wall", "-o", str(binary), str(SOURCE)], check=True)
    return binary


@contextmanager
def bed(mode: str, services: int, endpoints: int, variant: str, loop: Path) -> Iterator[Bed]:
    with ExitStack() as stack:
        client, node, pod = (stack.enter_context(netns.netns(p)) for p in ("kpdpc", "kpdpn", "kpdpp"))
        netns.link(client, "eth0", f"{CLIENT_IP}/24", node, "eth0", f"{NODE_IP}/24")
        netns.link(node, "eth1", f"{NODE_POD_GW}/16", pod, "eth0", f"{POD_IP}/16")
        client.run(["ip", "route", "add", "default", "via", NODE_IP])
        pod.run(["ip", "route", "add", "default", "via", NODE_POD_GW])
        node.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        pod.popen([str(loop), "serve-tcp", POD_IP, str(TCP.target)])
        pod.popen([str(loop), "serve-udp", POD_IP, str(UDP.target)])

        state = build_state(objects(services, endpoints))[0]
        view = build_view(state.services.values(), state.slices.values(), Family.IPV4, NODE)
        opts = node_options(ProxyConfig(), family=Family.IPV4, hostname=NODE, node=None, nfacct_counters=())
        proxier = IptablesProxier(run=node, variant=variant) if mode == "iptables" else NftablesProxier(run=node)
        started = time.perf_counter()
        proxier.prepare()
        report = proxier.sync(view, opts, None)
        b = Bed(mode, services, client, node, pod, load_seconds=time.perf_counter() - started,
                render_seconds=report.render_seconds, view=view,
                sync=lambda v, changed: proxier.sync(v, opts, changed))  # type: ignore[arg-type]  # fmt: skip
        # Conntrack hooks are live once the rules are; short timeouts keep each run's entries from piling up.
        node.run(["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_close=1",
                  "net.netfilter.nf_conntrack_udp_timeout=1", "net.netfilter.nf_conntrack_udp_timeout_stream=1"])  # fmt: skip
        b.position = _position(b, variant)
        for what in ("tcp", "udp"):
            probe = b.measure(loop, what, 0.3)
            if probe.count == 0 or probe.errors:
                raise SystemExit(f"{mode} with {services} services: {TARGET_IP} does not answer over {what}: {probe}")
        b.runs.clear()
        yield b


def _position(b: Bed, variant: str) -> str:
    """Where the target's first rule is among the service rules the first packet is compared with."""
    if b.mode == "iptables":
        save = b.node.run([f"iptables-{variant}-save" if variant else "iptables-save", "-t", "nat"]).stdout
        rules = [line for line in save.splitlines() if line.startswith("-A KUBE-SERVICES ")]
        hit = next((i for i, line in enumerate(rules) if f"-d {TARGET_IP}/32" in line), None)
        if hit is None:
            raise SystemExit(f"iptables, {b.services} services: no KUBE-SERVICES rule for {TARGET_IP}")
        return f"rule {hit + 1:,} of {len(rules):,}"
    listing = b.node.run(["nft", "list", "map", "ip", "kube-proxy", "service-ips"]).stdout
    return f"map of {listing.count(' : goto ') + listing.count(' : jump '):,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,10000", help="services installed (the target included)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--endpoints", type=int, default=10, help="endpoints per filler service")
    parser.add_argument("--iptables-variant", default="legacy", help="legacy, nft, or '' for the system's iptables")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    problems = [f"unknown mode {m!r}" for m in modes if m not in MODES] + [f"size {n} < 1" for n in sizes if n < 1]
    if not 0 < args.seconds <= 60 or not 1 <= args.rounds <= 20:
        problems.append("--seconds must be in (0, 60] and --rounds in [1, 20]")
    if problems:
        raise SystemExit("; ".join(problems))
    if not netns.have_root():
        raise SystemExit("bench/datapath.py needs root: it builds network namespaces and programs netfilter in them")

    with tempfile.TemporaryDirectory(prefix="kp-datapath-") as tmp, ExitStack() as stack:
        loop = compile_loop(Path(tmp))
        beds: list[Bed] = []
        for size in sizes:
            for mode in modes:
                print(f"# building {mode} with {size:,} services", file=sys.stderr, flush=True)
                b = stack.enter_context(bed(mode, size, args.endpoints, args.iptables_variant, loop))
                print(f"#   rules loaded in {b.load_seconds:.2f} s; target at {b.position}", file=sys.stderr, flush=True)
                beds.append(b)
        for r in range(args.rounds):
            for b in beds:
                runs = {what: b.measure(loop, what, args.seconds) for what in ("tcp", "udp", "pod")}
                print(f"# round {r + 1}: {b.mode} {b.services:,}: " + ", ".join(f"{w} {x.rate:,.0f}/s" for w, x in runs.items()),
                      file=sys.stderr, flush=True)  # fmt: skip
        report(beds, args)


def report(beds: list[Bed], args: argparse.Namespace) -> None:
    variant = args.iptables_variant or "system"
    print(f"new flows through ClusterIP {TARGET_IP} (the last service), one at a time from one client; "
          f"median of {args.rounds} rounds of {args.seconds:g} s; iptables mode: iptables-{variant}")  # fmt: skip
    header = (f"{'mode':<9} {'services':>8} {'target position':>22} {'load s':>7} {'tcp conn/s':>10} {'tcp p50 us':>10}"
              f" {'tcp p99 us':>10} {'udp flows/s':>11} {'udp p50 us':>10} {'pod conn/s':>10} {'errors':>6}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for b in beds:
        errors = sum(r.errors for runs in b.runs.values() for r in runs)
        print(
            f"{b.mode:<9} {b.services:>8,} {b.position:>22} {b.load_seconds:>7.2f}"
            f" {b.median('tcp', lambda r: r.rate):>10,.0f} {b.median('tcp', lambda r: r.p50_us):>10.1f}"
            f" {b.median('tcp', lambda r: r.p99_us):>10.1f} {b.median('udp', lambda r: r.rate):>11,.0f}"
            f" {b.median('udp', lambda r: r.p50_us):>10.1f} {b.median('pod', lambda r: r.rate):>10,.0f} {errors:>6}"
        )
    sizes = sorted({b.services for b in beds})
    if len(sizes) < 2:
        return
    small, large = sizes[0], sizes[-1]
    print(f"\nratios {large:,} / {small:,} services (1.00 = flat)")
    print(f"{'mode':<9} {'tcp conn/s':>10} {'tcp p50':>8} {'udp flows/s':>11} {'udp p50':>8} {'pod conn/s':>10}")
    for mode in dict.fromkeys(b.mode for b in beds):
        lo = next(b for b in beds if b.mode == mode and b.services == small)
        hi = next(b for b in beds if b.mode == mode and b.services == large)

        def ratio(what: str, key: Callable[[Run], float], lo: Bed = lo, hi: Bed = hi) -> float:
            return hi.median(what, key) / lo.median(what, key)

        print(
            f"{mode:<9} {ratio('tcp', lambda r: r.rate):>10.2f} {ratio('tcp', lambda r: r.p50_us):>8.2f}"
            f" {ratio('udp', lambda r: r.rate):>11.2f} {ratio('udp', lambda r: r.p50_us):>8.2f}"
            f" {ratio('pod', lambda r: r.rate):>10.2f}"
        )


if __name__ == "__main__":
    main()
