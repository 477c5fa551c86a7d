#!/usr/bin/env python3
"""Does the userspace relay delay the sync loop? One API change → relay latency, idle and under traffic.

Usage: sudo .venv/bin/python bench/userspace_sync.py [--services 100] [--endpoints 10] [--changes 40]
                                                     [--interval 0.1] [--rounds 3] [--streams 1]
                                                     [--diagnose] [--keep-log FILE]

The bed is bench/userspace.py's (client → node → pod namespaces, the pod's C responders).
In the node namespace this script runs itself again (`--driver`), and that process holds the
test API server (bench/sync.py's: in the driver, not in the proxy) and starts
`kubeproxy run --proxy-mode userspace` against it, a process of its own, as in production:
its relay thread and its sync loop share that process's GIL. The cluster is bench/render.py's
(--services services × --endpoints endpoints, no endpoint on this node) plus one service whose
endpoint is the pod, which the traffic goes through.

A change moves the first endpoint of one of the --services services to a fresh address
(bench/sync.py's `moved`); its latency runs from the API write to the moment the proxy's state
file (written at the end of the sync, after the relay adopted the new table and after the
iptables-restore) lists the new endpoint; the file is polled every 0.5 ms. Changes are paced,
one per --interval seconds (not back to back), so that each one meets the traffic in a steady
state. Conditions, alternated round after round:

    idle          no traffic
    bulk          --streams TCP streams of 1 MiB writes through the service (bench/userspace.py's bulk)
    rr            new TCP connections one at a time (connect, the pod's close, close: its tcp-rr)

    bulk-sep, rr-sep        the same traffic through the same relay code in a process of its own
                            next to the proxy, reached at the node's address (the proxy's relay
                            idles): what moving the relay out of the proxy would give
    bulk-direct, rr-direct  the same traffic to the pod's own address, no relay at all: what the
                            traffic's CPU alone (two shared cores) does to the syncs

and, for the effect the other way round, each traffic for the same time without changes.
Columns: p50/p99/max of the changes' latency (all rounds pooled), their ratio to idle, the
share over 100 ms; the proxy's own sync time p50 (p99) (its "SyncProxyRules complete" lines);
the CPU share of the `kubeproxy run` process; the traffic's rate alone, with changes, and their
ratio. `--diagnose` logs the proxy's sync steps and garbage collections over 20 ms
(`--keep-log FILE` keeps the log).
Needs root; everything lives in namespaces removed at the end. Numbers come from a shared
machine: read the ratios within one run, and the load average printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from render import cluster  # noqa: E402  (bench/render.py's generator)
from sync import moved, pct  # noqa: E402  (bench/sync.py's change and percentile)
from userspace import BULK, NODE, NODE_IP, POD_IP, RR, SERVICE_IP, UDP, bed, compile_loops, node_model  # noqa: E402

from kubeproxy.backends.userspace.proxier import UserspaceProxier, state_path  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.lab.apiserver import lifecycle as apiserver  # noqa: E402
from kubeproxy.lab.builders import Backend, endpoint_slice, service  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
_SYNC = re.compile(r"SyncProxyRules complete.* elapsed=\"?([\d.]+)ms")
_RUN = re.compile(r"count=(\d+) errors=(\d+) seconds=([\d.]+) p50_us=([\d.]+) p99_us=([\d.]+)")
_BULK = re.compile(r"bytes=(\d+) seconds=([\d.]+)")
# Traffic through the proxy's own relay (a thread of `kubeproxy run`), then two controls with the
# same traffic: through the same relay code in a process of its own next to the proxy
# (`-sep`: what moving the relay out of the proxy's process would give), and to the pod's own
# address with no relay at all (`-direct`: what the machine's two cores alone do to the sync).
CONDITIONS = ("idle", "bulk", "rr", "bulk-sep", "rr-sep", "bulk-direct", "rr-direct")


# `--diagnose`: the proxy's slow steps in its log (only in this bench's proxy, by wrapping the
# functions a sync calls): each step of a userspace sync, and garbage collections, over 20 ms.
DIAGNOSE = """
import gc, sys, time, functools
import kubeproxy.backends.userspace.proxier as P
import kubeproxy.backends.userspace.relay_loop as S
def _timed(owner, name):
    fn = getattr(owner, name)
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            ms = (time.perf_counter() - t) * 1000
            if ms > 20:
                print(f"SLOW {name} {ms:.1f}ms", file=sys.stderr, flush=True)
    setattr(owner, name, wrapper)
for owner, name in ((P, "restore"), (P, "port_table"), (S.RelayServer, "call"), (P.UserspaceProxier, "_write_state"),
                    (P.UserspaceProxier, "sync"), (P.R, "render")):
    _timed(owner, name)
_gc = {}
def _gc_cb(phase, info):
    if phase == "start":
        _gc["t"] = time.perf_counter()
    elif (time.perf_counter() - _gc.get("t", time.perf_counter())) > 0.02:
        print(f"SLOW gc{info['generation']} {(time.perf_counter() - _gc['t']) * 1000:.1f}ms", file=sys.stderr, flush=True)
gc.callbacks.append(_gc_cb)
"""


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def serve_relay() -> None:
    """`--relay`, in the node namespace: the relay code alone in a process (a UserspaceProxier
    whose iptables commands do nothing, so that it never rewrites the chains `kubeproxy run`
    owns); clients reach its listeners at the node's address. Serves until stdin closes."""
    view, opts = node_model()
    proxier = UserspaceProxier(run=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "", ""))
    proxier.prepare()
    proxier.sync(view, opts, None)
    ports = {name.port: port for name, port in proxier._ports.items()}
    print(f"ready {ports[RR.name]} {ports[BULK.name]}", flush=True)
    sys.stdin.read()
    assert proxier.server is not None
    proxier.server.stop()


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONDITIONS})
    syncs: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONDITIONS})  # the proxy's own
    cpu: dict[str, list[float]] = field(default_factory=dict)  # the proxy's CPU share, per run
    rates: dict[str, list[float]] = field(default_factory=dict)  # bulk GB/s or rr conn/s, per run
    rr_p99: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0


class Driver:
    """Runs in the node namespace: the API server, `kubeproxy run`, the changes and their clock."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.client = netns.NetNS(args.client)  # the bed's, by name (`ip netns exec` works from here)
        self.objs = cluster(args.services, args.endpoints)
        self.slices = [o for o in self.objs if o["kind"] == "EndpointSlice"]
        self.server = apiserver.ApiServer(history_size=1000)
        self.server.start()
        for obj in self.objs:
            self.server.apply(obj)
        ports = [RR, BULK, UDP]
        self.server.apply(service("target", SERVICE_IP, ports, namespace="bench"))
        self.server.apply(endpoint_slice("target", [Backend(POD_IP, NODE)], ports, namespace="bench"))
        kubeconfig = self.server.write_kubeconfig(tmp / "kubeconfig")
        self.state = state_path()
        self.state.unlink(missing_ok=True)
        launch = "import sys; from kubeproxy.cli import main; sys.argv[0] = 'kubeproxy'; sys.exit(main())"
        if args.diagnose:
            launch = DIAGNOSE + launch
        # -v 2: the "SyncProxyRules complete" lines, the proxy's own sync times, are INFO.
        argv = [sys.executable, "-c", launch, "-v", "2", "run", "--proxy-mode", "userspace", "--kubeconfig", str(kubeconfig),
                "--hostname-override", NODE, "--cluster-cidr", "10.0.0.0/8", "--iptables-min-sync-period", "0s",
                "--iptables-sync-period", "1h", "--healthz-bind-address", "", "--metrics-bind-address", ""]  # fmt: skip
        self.log_path = tmp / "proxy.log"
        self.log = self.log_path.open("w")
        self.log_offset = 0
        self.proxy = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True
        )
        self.step = 0
        self.mtime = 0
        # Synced: every service port (3 of the target's, one per generated service) has a listener.
        self._wait(lambda doc: len(doc["ports"]) == args.services + 3, 60)
        self.relay = subprocess.Popen(
            [sys.executable, __file__, "--relay"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.relay.stdout is not None
        line = self.relay.stdout.readline().split()
        if line[:1] != ["ready"]:
            raise SystemExit("the separate relay did not start")
        self.sep_ports = {"rr": int(line[1]), "bulk": int(line[2])}

    def close(self) -> None:
        netns.stop_process(self.proxy, 10)
        self.state.unlink(missing_ok=True)  # the proxy leaves it behind (its namespace is gone next)
        if self.relay.stdin is not None:
            self.relay.stdin.close()
        self.relay.wait(10)
        self.server.stop()
        self.log.close()

    def _wait(self, done, timeout: float) -> float:  # type: ignore[no-untyped-def]
        """Poll the state file until `done(doc)`; the time it became true (perf_counter)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proxy.poll() is not None:
                raise SystemExit(f"kubeproxy run exited with {self.proxy.returncode}; see its log")
            try:
                mtime = self.state.stat().st_mtime_ns
            except FileNotFoundError:
                mtime = 0
            if mtime and mtime != self.mtime:
                seen = time.perf_counter()
                self.mtime = mtime
                try:
                    doc = json.loads(self.state.read_text())
                except (OSError, ValueError):
                    continue  # replaced while being read: the next poll reads the new one
                if done(doc):
                    return seen
            time.sleep(0.0005)
        raise SystemExit(f"the proxy did not sync within {timeout} s")

    def change(self) -> float:
        """One endpoint moved on one generated service; seconds until the proxy serves it."""
        target = self.slices[(self.step * 7919) % len(self.slices)]
        new = moved(target, self.step)
        self.step += 1
        name = target["metadata"]["labels"]["kubernetes.io/service-name"]
        key, address = f"bench/{name}:http", new["endpoints"][0]["addresses"][0]
        start = time.perf_counter()
        self.server.apply(new)
        seen = self._wait(
            lambda doc: any(e.startswith(f"{address}:") for e in doc["ports"].get(key, {}).get("endpoints", [])), 30
        )
        return seen - start

    def sync_times(self) -> list[float]:
        """The proxy's own sync times (its "SyncProxyRules complete" lines) since the last call."""
        self.log.flush()
        with self.log_path.open() as f:
            f.seek(self.log_offset)
            text = f.read()
            self.log_offset = f.tell()
        return [float(ms) / 1000 for ms in _SYNC.findall(text)]

    def changes(self, count: int) -> tuple[list[float], list[float]]:
        """`count` changes, one per --interval; their latencies and the proxy's own sync times."""
        self.sync_times()
        out = []
        tick = time.perf_counter()
        for _ in range(count):
            out.append(self.change())
            tick += self.args.interval
            time.sleep(max(0.0, tick - time.perf_counter()))  # pacing, not synchronisation
        return out, self.sync_times()

    def traffic(self, what: str, seconds: float) -> list[subprocess.Popen[str]]:
        kind, _, via = what.partition("-")
        verb, port = {"bulk": ("bulk", BULK), "rr": ("tcp-rr", RR)}[kind]
        target = {"": (SERVICE_IP, port.port), "sep": (NODE_IP, self.sep_ports[kind]), "direct": (POD_IP, port.target)}[via]
        argv = [verb, target[0], str(target[1])]
        n = self.args.streams if kind == "bulk" else 1
        return [self.client.popen([self.args.loop, *argv, f"{seconds:g}"], stdout=subprocess.PIPE) for _ in range(n)]

    def finish(self, what: str, procs: list[subprocess.Popen[str]], res: Results) -> float:
        rate = 0.0
        for p in procs:
            out = p.communicate(timeout=120)[0]
            if what.startswith("bulk"):
                m = _BULK.search(out)
                if m is None:
                    raise SystemExit(f"bulk printed {out!r}")
                rate += int(m[1]) / 1e9 / float(m[2])
            else:
                m = _RUN.search(out)
                if m is None:
                    raise SystemExit(f"tcp-rr printed {out!r}")
                rate += int(m[1]) / float(m[3])
                res.errors += int(m[2])
                res.rr_p99.setdefault(what, []).append(float(m[5]))
        return rate

    def round(self, res: Results) -> None:
        a = self.args
        window = a.changes * a.interval
        seconds = window + 2 * a.warmup
        for cond in CONDITIONS:
            for with_changes in (False, True) if cond != "idle" else (True,):
                label = f"{cond}{'+chg' if with_changes else ''}"
                cpu0, t0 = process_cpu(self.proxy.pid), time.perf_counter()
                procs = self.traffic(cond, seconds) if cond != "idle" else []
                # The traffic's first moments (connect, slow start) are not what is measured.
                time.sleep(a.warmup if procs else 0)
                if with_changes:
                    lat, syncs = self.changes(a.changes)
                    res.latencies[cond] += lat
                    res.syncs[cond] += syncs
                if procs:
                    rate = self.finish(cond, procs, res)
                    res.rates.setdefault(label, []).append(rate)
                if with_changes:
                    res.cpu.setdefault(cond, []).append((process_cpu(self.proxy.pid) - cpu0) / (time.perf_counter() - t0))


def drive(args: argparse.Namespace) -> None:
    res = Results()
    load = []
    with tempfile.TemporaryDirectory(prefix="kp-us-sync-") as tmp:
        driver = Driver(args, Path(tmp))
        try:
            for r in range(args.rounds):
                load.append(os.getloadavg()[0])
                driver.round(res)
                print(f"# round {r + 1}: " + ", ".join(f"{c} p50 {pct(res.latencies[c], 0.5) * 1e3:.1f} ms" for c in CONDITIONS),
                      file=sys.stderr, flush=True)  # fmt: skip
            load.append(os.getloadavg()[0])
        except BaseException:
            print((Path(tmp) / "proxy.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            driver.close()
            if args.keep_log not in (None, "None"):
                shutil.copy(Path(tmp) / "proxy.log", args.keep_log)
    report(args, res, load)


def slow(latencies: list[float]) -> str:
    """The share of changes that took over 100 ms ("never blocks" made a number)."""
    return f"{sum(t > 0.1 for t in latencies) / len(latencies):.0%}"


def report(args: argparse.Namespace, res: Results, load: list[float]) -> None:
    med = statistics.median
    print(f"kubeproxy run --proxy-mode userspace, {args.services} services x {args.endpoints} endpoints + 1 served;"
          f" {args.changes} changes x {args.rounds} rounds per row, one per {args.interval:g} s; bulk: {args.streams}"
          f" stream(s); load average {min(load):.1f}-{max(load):.1f} (2 shared cores)")  # fmt: skip
    header = (f"{'traffic':<11} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'p50/idle':>8} {'p99/idle':>8} {'>100ms':>6}"
              f" {'sync ms':>7} {'(p99)':>6} {'proxy CPU':>9} |"
              f" {'traffic alone':>14} {'with changes':>13} {'ratio':>6}")  # fmt: skip
    print(header)
    print("-" * len(header))
    idle = res.latencies["idle"]
    for cond in CONDITIONS:
        lat = res.latencies[cond]
        syncs = res.syncs[cond] or [float("nan")]
        if cond == "idle":
            alone = chg = ratio = "-"
        else:
            a, c = med(res.rates[cond]), med(res.rates[f"{cond}+chg"])
            bulk = cond.startswith("bulk")
            alone, chg = (f"{v:.2f} GB/s" if bulk else f"{v:,.0f} conn/s" for v in (a, c))
            ratio = f"{c / a:.2f}"
        print(f"{cond:<11} {pct(lat, 0.5) * 1e3:>7.1f} {pct(lat, 0.99) * 1e3:>7.1f} {max(lat) * 1e3:>7.1f}"
              f" {pct(lat, 0.5) / pct(idle, 0.5):>8.2f} {pct(lat, 0.99) / pct(idle, 0.99):>8.2f} {slow(lat):>6}"
              f" {pct(syncs, 0.5) * 1e3:>7.1f} {pct(syncs, 0.99) * 1e3:>6.1f} {med(res.cpu[cond]) * 100:>8.0f}% |"
              f" {alone:>14} {chg:>13} {ratio:>6}")  # fmt: skip
    if res.errors:
        print(f"rr errors: {res.errors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=40, help="changes per condition and round")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between the starts of two changes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=1, help="bulk TCP streams at once")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of traffic before the first change")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)  # the node namespace's process
    parser.add_argument("--diagnose", action="store_true", help="log the proxy's slow sync steps (see DIAGNOSE)")
    parser.add_argument("--keep-log", help="copy the proxy's log here at the end")
    parser.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)  # the separate relay
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--loop", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        drive(args)
        return
    if args.relay:
        serve_relay()
        return
    if not (1 <= args.changes <= 500 and 0.01 <= args.interval <= 1 and 1 <= args.rounds <= 10 and 1 <= args.streams <= 4):
        raise SystemExit("--changes in [1, 500], --interval in [0.01, 1] s, --rounds in [1, 10], --streams in [1, 4]")
    if args.changes * args.interval > 30:
        raise SystemExit("--changes x --interval must stay within 30 s (the traffic runs that long)")
    if not netns.have_root():
        raise SystemExit("bench/userspace_sync.py needs root: it builds network namespaces and programs netfilter in them")
    with tempfile.TemporaryDirectory(prefix="kp-us-sync-") as tmp, ExitStack() as stack:
        datapath_loop, userspace_loop = compile_loops(Path(tmp))
        # bench/userspace.py's bed with no proxy of its own ("direct" checks the pod answers).
        b = stack.enter_context(bed("direct", datapath_loop, userspace_loop))
        argv = [sys.executable, __file__, "--driver", "--client", b.client.name, "--loop", str(userspace_loop)]
        argv += [
            f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("services", "endpoints", "changes", "interval", "rounds", "streams", "warmup", "keep_log")
        ]
        argv += ["--diagnose"] if args.diagnose else []
        driver = b.node.popen(argv)
        if driver.wait() != 0:
            raise SystemExit(f"the driver exited with {driver.returncode}")


if __name__ == "__main__":
    main()
