#!/usr/bin/env python3
"""The scaling curve: cold sync, one-change latency, memory and first-packet latency against the
number of services, iptables and nftables modes side by side; prints a table, writes docs/scale.png.

Usage: .venv/bin/python bench/scale.py [--sizes 1000,5000,10000,20000,50000] [--endpoints 10]
           [--modes iptables,nftables] [--changes 10] [--budget 600] [--upstream-timeout 120]
           [--plot docs/scale.png]

Every point (mode, size) is built in throwaway network namespaces (needs root), one point at a
time, and torn down before the next. Columns:

  cold s        a full sync of N services x --endpoints endpoints into an empty node namespace
                (render + kernel, the backend's own sync; `render` is our part of it)
  change p50/p99 ms   one endpoint of one service replaced, the partial sync that carries it
                (render + kernel), --changes changes one after another after a warm-up one
  RSS MiB       (nan: the process did not finish its first sync within --budget)
                resident memory of `kubeproxy run --manifests` after its first sync (VmRSS;
                HWM is the peak), a separate process in a namespace of its own, at its default
                verbosity
  tcp p50 us    connect() time of new TCP flows through a ClusterIP whose service sorts last
                (bench/datapath.py's bed and C sender; 1 round of --seconds): the SYN is the
                first packet, the only one that walks the service rules
  upstream cold s   (nftables rows) nft -f of upstream kube-proxy's nftables rule shape for the
                same services (bench/nftables.py's generator), bounded by --upstream-timeout

iptables mode uses iptables-legacy (iptables-nft takes minutes to load 10k services: see
bench/iptables_nft.py). A point whose predicted duration (the previous size's, scaled linearly
by the number of services, x1.5) exceeds --budget seconds is skipped and shown as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.model.node_model import NodeView  # noqa: E402


def _bench(name: str) -> ModuleType:
    # bench/ is not a package, and its nftables.py would shadow a system `nftables` module.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


datapath, nftbench = _bench("datapath"), _bench("nftables")


@dataclasses.dataclass
class Point:
    mode: str
    services: int
    seconds: float = 0.0  # how long the whole point took (for the budget of the next size)
    skipped: str = ""
    cold: float = 0.0
    render: float = 0.0
    change_p50: float = 0.0
    change_p99: float = 0.0
    hwm: float = 0.0
    rss: float = 0.0
    tcp_p50: float = 0.0
    tcp_rate: float = 0.0
    upstream_cold: str = ""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(mode: str, size: int, args: argparse.Namespace, loop: Path, upstream: bool) -> Point:
    started = time.perf_counter()
    p = Point(mode, size)
    try:
        with ExitStack() as stack:
            print(f"# {mode} {size:,}: cold sync", file=sys.stderr, flush=True)
            b = stack.enter_context(datapath.bed(mode, size, args.endpoints, "legacy", loop))
            p.cold, p.render = b.load_seconds, b.render_seconds
            print(f"#   {p.cold:.2f} s (render {p.render:.2f} s); changes", file=sys.stderr, flush=True)
            view, times = b.view, []
            for k in range(args.changes + 1):  # the first partial sync also does the periodic checks
                view, spn, _, _ = nftbench.change_one(view, k)
                t0 = time.perf_counter()
                b.sync(view, frozenset({spn.service}))
                if k:
                    times.append(time.perf_counter() - t0)
            p.change_p50, p.change_p99 = statistics.median(times), pct(times, 0.99)
            run = b.measure(loop, "tcp", args.seconds)
            p.tcp_p50, p.tcp_rate = run.p50_us, run.rate
            if upstream:
                p.upstream_cold = upstream_cold(b.view, args.upstream_timeout)
    except subprocess.TimeoutExpired as exc:
        # The backends bound every kernel tool (iptables-restore: 60 s): the live proxy would
        # fail this sync the same way, so it is a result, not a crash of the benchmark.
        tool = exc.cmd[4] if exc.cmd[:3] == ["ip", "netns", "exec"] else exc.cmd[0]
        p.skipped = f"timeout: {tool} took more than {exc.timeout:.0f} s (the backend's bound)"
        p.seconds = time.perf_counter() - started
        return p
    print("#   memory (kubeproxy run --manifests)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="kp-scale-") as tmp:
        p.hwm, p.rss = memory(nftbench._bench_cluster()(size, args.endpoints), mode, Path(tmp), args.budget)
    p.seconds = time.perf_counter() - started
    return p


def memory(objs: list[dict], mode: str, tmp: Path, timeout: float) -> tuple[float, float]:
    """VmHWM and VmRSS (MiB) of `kubeproxy run --manifests` after its first sync; NaN if none in `timeout` s."""
    path = tmp / "objects.json"
    path.write_text(json.dumps({"kind": "List", "items": objs}))
    with netns.netns("kpscm") as ns:
        argv = [str(ROOT / ".venv" / "bin" / "kubeproxy"), "run", "--manifests", str(path),
                "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8", "--iptables-variant", "legacy",
                "--healthz-bind-address", "", "--metrics-bind-address", "127.0.0.1:10249", "--proxy-mode", mode]  # fmt: skip
        proc = ns.popen(argv, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            # The first sync shows on the metrics page (bench/coldstart.py's poller, in the namespace).
            poller = ns.popen([sys.executable, str(ROOT / "bench" / "coldstart.py"), "--poll",
                               "http://127.0.0.1:10249/metrics"], stdout=subprocess.PIPE, text=True)  # fmt: skip
            try:
                out = poller.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                poller.kill()
                return float("nan"), float("nan")
            if "synced" not in out:
                return float("nan"), float("nan")
            # `ip netns exec` execs the proxy in place, so the child pid is the proxy's.
            status = Path(f"/proc/{proc.pid}/status").read_text()
            fields = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Vm")}
            return int(fields["VmHWM"]) / 1024, int(fields["VmRSS"]) / 1024
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def upstream_cold(view: NodeView, timeout: float) -> str:
    # The generator writes every service as TCP port 80: the fillers, not the bed's target.
    fillers = {k: v for k, v in view.services.items() if k.namespace != datapath.TARGET_NS}
    text = nftbench.upstream_text(NodeView(fillers, view.endpoints), datapath.NODE)
    with netns.netns("kpscu") as ns:
        t0 = time.perf_counter()
        try:
            ns.run(["nft", "-f", "-"], input=text, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f">{timeout:.0f}"
        return f"{time.perf_counter() - t0:.2f}"


HEADER = (
    f"{'mode':<9} {'services':>8} {'cold s':>7} {'(render':>8} {'kernel)':>8} {'change p50':>10} {'p99 ms':>7}"
    f" {'HWM MiB':>7} {'RSS MiB':>7} {'tcp p50 us':>10} {'tcp conn/s':>10} {'upstream cold s':>15}"
)


def line(p: Point) -> str:
    if p.skipped:
        return f"{p.mode:<9} {p.services:>8,} skipped: {p.skipped}"
    return (
        f"{p.mode:<9} {p.services:>8,} {p.cold:>7.2f} {p.render:>8.2f} {p.cold - p.render:>8.2f}"
        f" {p.change_p50 * 1000:>10.1f} {p.change_p99 * 1000:>7.1f} {p.hwm:>7.0f} {p.rss:>7.0f}"
        f" {p.tcp_p50:>10.1f} {p.tcp_rate:>10,.0f} {p.upstream_cold or '-':>15}"
    )


def growth(points: list[Point]) -> list[str]:
    """RSS growth per 1,000 services between the smallest and the largest point of each mode."""
    out = []
    for mode in dict.fromkeys(p.mode for p in points):
        done = [p for p in points if p.mode == mode and not p.skipped and p.rss == p.rss]  # NaN: no first sync
        if len(done) >= 2:
            lo, hi = done[0], done[-1]
            per = (hi.rss - lo.rss) / (hi.services - lo.services) * 1000
            out.append(f"{mode}: RSS grows {per:.1f} MiB per 1,000 services ({lo.services:,} -> {hi.services:,})")
    return out


def plot(points: list[Point], path: Path, endpoints: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [
        ("cold sync (s)", lambda p: p.cold),
        ("one change -> kernel, p99 (ms)", lambda p: p.change_p99 * 1000),
        ("resident memory of kubeproxy run (MiB)", lambda p: p.rss),
        ("first packet: TCP connect p50 (us)", lambda p: p.tcp_p50),
    ]
    for ax, (title, value) in zip(axes.flat, panels, strict=True):
        for mode in dict.fromkeys(p.mode for p in points):
            done = [p for p in points if p.mode == mode and not p.skipped]
            label = "iptables (legacy)" if mode == "iptables" else mode
            ax.plot([p.services for p in done], [value(p) for p in done], marker="o", label=label)
        if title.startswith("cold"):
            ups = [(p.services, float(p.upstream_cold)) for p in points if p.upstream_cold and p.upstream_cold[0] != ">"]
            if ups:
                ax.plot(*zip(*ups, strict=True), marker="x", linestyle="--", label="upstream's nftables shape (nft -f)")
        ax.set_title(title)
        ax.set_xlabel(f"services (x {endpoints} endpoints)")
        ax.set_xscale("log")
        if not title.startswith("resident"):
            ax.set_yscale("log")  # from tens of milliseconds to tens of seconds
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("kubeproxy at scale (bench/scale.py, 2-core machine)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,10000,20000,50000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--modes", default="iptables,nftables")
    parser.add_argument("--changes", type=int, default=10, help="changes per point (p99 of 10 is the slowest)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of the data-path measurement")
    parser.add_argument("--budget", type=float, default=600, help="skip a point predicted to take longer (s)")
    parser.add_argument("--upstream-timeout", type=float, default=60, help="0: skip upstream's shape")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "scale.png"), help="'' for no plot")
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/scale.py needs root: it programs throwaway network namespaces")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    modes = [m for m in args.modes.split(",") if m]
    print(f"{args.endpoints} endpoints per service; {args.changes} changes per point; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="kp-scale-") as tmp:
        loop = datapath.compile_loop(Path(tmp))
        for size in sizes:
            for mode in modes:
                before = [p for p in points if p.mode == mode and not p.skipped]
                predicted = before[-1].seconds * size / before[-1].services * 1.5 if before else 0.0
                if any(q.skipped.startswith("timeout") for q in points if q.mode == mode):
                    p = Point(mode, size, skipped="a smaller size already hit a timeout")
                elif predicted > args.budget:
                    p = Point(mode, size, skipped=f"predicted {predicted:.0f} s > budget {args.budget:.0f} s")
                else:
                    # Upstream's shape grows faster than linearly: once it missed its timeout, bigger ones will too.
                    upstream = (
                        mode == "nftables"
                        and args.upstream_timeout > 0
                        and not any(q.upstream_cold.startswith(">") for q in points)
                    )
                    p = measure(mode, size, args, loop, upstream)
                points.append(p)
                print(f"# {line(p)}  [{p.seconds:.0f} s]", file=sys.stderr, flush=True)
    print(HEADER)
    print("-" * len(HEADER))
    for p in points:
        print(line(p))
    for text in growth(points):
        print(text)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    if args.plot:
        plot(points, Path(args.plot), args.endpoints)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
