#!/usr/bin/env python3
"""The userspace mode's data path, side by side with the kernel's DNAT and with no proxy at all.

Usage: sudo .venv/bin/python bench/userspace.py [--seconds 3] [--rounds 1] [--setups direct,iptables,userspace,userspace-copy]

One bed of three network namespaces per setup (bench/datapath.py's layout), all built first and
measured in turns, round after round:

    client 172.30.0.2 ── node 172.30.0.1 | 10.244.0.1 ── pod 10.244.1.10
                                                          tcp 8080 (accept+close), tcp 9000 (sink), udp 5353 (echo)

- direct          the client talks to the pod's own address (the node only routes)
- iptables        IptablesProxier's rules in the node: ClusterIP 10.97.0.10 DNATed by the kernel
- userspace       UserspaceProxier in the node (a process of its own, as `kubeproxy run` is):
                  the redirect rules, and the relay moving TCP with os.splice
- userspace-copy  the same relay copying through a bounded buffer (recv_into/send)

Columns:
    bulk GB/s      one TCP stream of 1 MiB writes for --seconds, to a sink on the pod
    CPU s/GB       CPU (user+system) of the processes on the path per GB moved: the sender, the
                   pod's sink and the relay; the kernel's forwarding in softirq context is counted
                   only where it runs in one of them (the machine is shared, so its /proc/stat
                   total would count other work too)
    relay s/GB     the relay process's share of it (userspace setups)
    rr conn/s      connect, wait for the pod's close, close; one at a time (a relay completes the
                   handshake itself, so only the pod's close says the connection got through)
    rr p50/p99 us  connect()-to-EOF of those connections
    udp flows/s    a new socket per datagram, echoed by the pod (a new relay flow per datagram)
    udp p50 us     send-to-echo of those datagrams

The senders are C (bench/datapath_loop.c, bench/userspace_loop.c), compiled into a temporary
directory, so that the client's own cost is small next to the path under test. Numbers come
from a shared machine: read the ratios, taken within one run.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.backends.iptables.proxier import IptablesProxier  # noqa: E402
from kubeproxy.backends.userspace.proxier import UserspaceProxier  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.lab.builders import Backend, Port, endpoint_slice, service  # noqa: E402
from kubeproxy.model.node_model import NodeView, build_view  # noqa: E402
from kubeproxy.model.options import Family, NodeOptions, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402

NODE = "node"
CLIENT_IP, NODE_IP, NODE_POD_GW, POD_IP = "172.30.0.2", "172.30.0.1", "10.244.0.1", "10.244.1.10"
SERVICE_IP = "10.97.0.10"
RR, BULK, UDP = Port("rr", 80, 8080), Port("bulk", 9000, 9000), Port("udp", 53, 5353, "UDP")
SETUPS = ("direct", "iptables", "userspace", "userspace-copy")
_RUN = re.compile(r"count=(\d+) errors=(\d+) seconds=([\d.]+) p50_us=([\d.]+) p99_us=([\d.]+)")
_BULK = re.compile(r"bytes=(\d+) seconds=([\d.]+)")
TICK = os.sysconf("SC_CLK_TCK")


def node_model() -> tuple[NodeView, NodeOptions]:
    objs = [
        service("target", SERVICE_IP, [RR, BULK, UDP], namespace="bench"),
        endpoint_slice("target", [Backend(POD_IP, NODE)], [RR, BULK, UDP], namespace="bench"),
    ]
    state = build_state(objs)[0]
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, NODE)
    opts = node_options(ProxyConfig(node_ip=NODE_IP), family=Family.IPV4, hostname=NODE, node=None, nfacct_counters=())
    return view, opts


def serve_relay(mode: str) -> None:
    """`--relay splice|copy`, run inside the node namespace: sync once, serve until stdin closes."""
    view, opts = node_model()
    proxier = UserspaceProxier(splice=mode == "splice")
    proxier.prepare()
    proxier.sync(view, opts, None)
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.read()
    proxier.cleanup()


def children_cpu() -> float:
    """CPU seconds of this process's finished children (the sender runs as one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


@dataclass
class Bed:
    setup: str
    client: netns.NetNS
    node: netns.NetNS
    relay_pid: int = 0
    sink_pid: int = 0
    results: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return POD_IP if self.setup == "direct" else SERVICE_IP

    def port(self, p: Port) -> int:
        return p.target if self.setup == "direct" else p.port

    def _record(self, what: str, values: dict[str, float]) -> None:
        self.results.setdefault(what, []).append(values)

    def measure_bulk(self, loop: Path, seconds: float) -> None:
        sender, sink = children_cpu(), process_cpu(self.sink_pid)
        relay = process_cpu(self.relay_pid) if self.relay_pid else 0.0
        out = self.client.run([str(loop), "bulk", self.target, str(self.port(BULK)), f"{seconds:g}"], timeout=seconds + 60).stdout
        m = _BULK.search(out)
        if m is None:
            raise SystemExit(f"{self.setup}: bulk printed {out!r}")
        gb = int(m[1]) / 1e9
        relay_s = (process_cpu(self.relay_pid) - relay) if self.relay_pid else 0.0
        path = (children_cpu() - sender) + (process_cpu(self.sink_pid) - sink) + relay_s
        relay_per_gb = relay_s / gb if self.relay_pid else float("nan")
        self._record("bulk", {"gbps": gb / float(m[2]), "cpu": path / gb, "relay": relay_per_gb})

    def measure_loop(self, loop: Path, what: str, seconds: float) -> None:
        argv = {"rr": ["tcp-rr", self.target, str(self.port(RR))], "udp": ["udp", self.target, str(self.port(UDP))]}[what]
        self.node.run(["conntrack", "-F"], check=False)
        out = self.client.run([str(loop), *argv, f"{seconds:g}"], timeout=seconds + 60).stdout
        m = _RUN.search(out)
        if m is None:
            raise SystemExit(f"{self.setup}: the {what} loop printed {out!r}")
        count, errors, secs = int(m[1]), int(m[2]), float(m[3])
        self._record(what, {"rate": count / secs, "errors": errors, "p50": float(m[4]), "p99": float(m[5])})

    def median(self, what: str, key: str) -> float:
        return statistics.median(r[key] for r in self.results[what])


def compile_loops(workdir: Path) -> tuple[Path, Path]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("bench/userspace.py needs a C compiler (gcc) for its senders")
    out = []
    for name in ("datapath_loop", "userspace_loop"):
        binary = workdir / name
        subprocess.run([gcc, "-O2", "-Wall", "-o", str(binary), str(ROOT / "bench" / f"{name}.c")], check=True)
        out.append(binary)
    return out[0], out[1]


@contextmanager
def bed(setup: str, datapath_loop: Path, userspace_loop: Path) -> Iterator[Bed]:
    with ExitStack() as stack:
        client, node, pod = (stack.enter_context(netns.netns(p)) for p in ("kpusc", "kpusn", "kpusp"))
        netns.link(client, "eth0", f"{CLIENT_IP}/24", node, "eth0", f"{NODE_IP}/24")
        netns.link(node, "eth1", f"{NODE_POD_GW}/16", pod, "eth0", f"{POD_IP}/16")
        client.run(["ip", "route", "add", "default", "via", NODE_IP])
        pod.run(["ip", "route", "add", "default", "via", NODE_POD_GW])
        node.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        pod.popen([str(datapath_loop), "serve-tcp", POD_IP, str(RR.target)])
        pod.popen([str(datapath_loop), "serve-udp", POD_IP, str(UDP.target)])
        sink = pod.popen([str(userspace_loop), "serve-sink", POD_IP, str(BULK.target)])
        b = Bed(setup, client, node, sink_pid=sink.pid)
        if setup == "iptables":
            view, opts = node_model()
            proxier = IptablesProxier(run=node, variant="legacy")
            proxier.prepare()
            proxier.sync(view, opts, None)
        elif setup.startswith("userspace"):
            mode = "copy" if setup.endswith("copy") else "splice"
            relay = node.popen([sys.executable, __file__, "--relay", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert relay.stdout is not None and relay.stdin is not None
            line = relay.stdout.readline().split()
            if line[:1] != ["ready"]:
                raise SystemExit(f"{setup}: the relay did not start")
            b.relay_pid = int(line[1])
            stack.callback(relay.wait, 10)
            stack.callback(relay.stdin.close)
        node.run(["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_close=1",
                  "net.netfilter.nf_conntrack_udp_timeout=1"], check=False)  # fmt: skip
        # Check the path answers before measuring it.
        b.measure_loop(datapath_loop, "udp", 0.2)
        b.measure_loop(userspace_loop, "rr", 0.2)
        if any(r["errors"] or not r["rate"] for runs in b.results.values() for r in runs):
            raise SystemExit(f"{setup}: the service does not answer: {b.results}")
        b.results.clear()
        yield b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--relay", choices=("splice", "copy"), help=argparse.SUPPRESS)  # the relay process
    args = parser.parse_args()
    if args.relay:
        serve_relay(args.relay)
        return
    setups = [s for s in args.setups.split(",") if s]
    if unknown := [s for s in setups if s not in SETUPS]:
        raise SystemExit(f"unknown setups {unknown}; there are {', '.join(SETUPS)}")
    if not 0 < args.seconds <= 30 or not 1 <= args.rounds <= 10:
        raise SystemExit("--seconds must be in (0, 30] and --rounds in [1, 10]")
    if not netns.have_root():
        raise SystemExit("bench/userspace.py needs root: it builds network namespaces and programs netfilter in them")
    with tempfile.TemporaryDirectory(prefix="kp-userspace-") as tmp, ExitStack() as stack:
        datapath_loop, userspace_loop = compile_loops(Path(tmp))
        beds = [stack.enter_context(bed(s, datapath_loop, userspace_loop)) for s in setups]
        for r in range(args.rounds):
            for b in beds:
                b.measure_bulk(userspace_loop, args.seconds)
                for what in ("rr", "udp"):
                    b.measure_loop(userspace_loop if what == "rr" else datapath_loop, what, args.seconds)
                print(f"# round {r + 1}: {b.setup}: {b.results['bulk'][-1]['gbps']:.2f} GB/s, "
                      f"rr {b.results['rr'][-1]['rate']:,.0f}/s, udp {b.results['udp'][-1]['rate']:,.0f}/s",
                      file=sys.stderr, flush=True)  # fmt: skip
        report(beds, args)


def report(beds: list[Bed], args: argparse.Namespace) -> None:
    print(f"one service, client -> node -> pod namespaces; median of {args.rounds} round(s) of {args.seconds:g} s each")
    header = (f"{'setup':<15} {'bulk GB/s':>9} {'CPU s/GB':>8} {'relay s/GB':>10} {'rr conn/s':>9} {'rr p50 us':>9}"
              f" {'rr p99 us':>9} {'udp flows/s':>11} {'udp p50 us':>10} {'errors':>6}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for b in beds:
        errors = sum(int(r["errors"]) for what in ("rr", "udp") for r in b.results[what])
        relay = b.median("bulk", "relay")
        print(
            f"{b.setup:<15} {b.median('bulk', 'gbps'):>9.2f} {b.median('bulk', 'cpu'):>8.2f}"
            f" {'-' if relay != relay else f'{relay:.2f}':>10} {b.median('rr', 'rate'):>9,.0f}"
            f" {b.median('rr', 'p50'):>9.1f} {b.median('rr', 'p99'):>9.1f} {b.median('udp', 'rate'):>11,.0f}"
            f" {b.median('udp', 'p50'):>10.1f} {errors:>6}"
        )
    base = next((b for b in beds if b.setup == "iptables"), None)
    if base is None:
        return
    print("\nratios to the iptables mode (kernel DNAT) in this run")
    print(f"{'setup':<15} {'bulk GB/s':>9} {'CPU s/GB':>8} {'rr conn/s':>9} {'rr p50':>7} {'udp flows/s':>11}")
    for b in beds:
        print(
            f"{b.setup:<15} {b.median('bulk', 'gbps') / base.median('bulk', 'gbps'):>9.2f}"
            f" {b.median('bulk', 'cpu') / base.median('bulk', 'cpu'):>8.2f}"
            f" {b.median('rr', 'rate') / base.median('rr', 'rate'):>9.2f}"
            f" {b.median('rr', 'p50') / base.median('rr', 'p50'):>7.2f}"
            f" {b.median('udp', 'rate') / base.median('udp', 'rate'):>11.2f}"
        )


if __name__ == "__main__":
    main()
