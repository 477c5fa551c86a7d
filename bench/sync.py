#!/usr/bin/env python3
"""The live proxy's control plane: change → kernel latency, partial vs full sync, memory.

Usage: .venv/bin/python bench/sync.py [--sizes 1000,10000] [--endpoints 10] [--changes 20]
                                      [--modes iptables,nftables] [--variant legacy|nft]
                                      [--parts api,file,full,memory] [--baseline DIR [--runs 3]]

For each size (services × endpoints), in a throwaway network namespace (needs root):
1. change → kernel: the proxy runs in this process against the test API server (and, second,
   against manifest files); each change moves one endpoint of one service; the clock runs from
   the API write (file write) to the end of the iptables-restore that carries it. p50 and p99
   over --changes changes, made one after another (minSyncPeriod 0 so that the number is
   the pipeline's, not the rate limiter's).
2. one endpoint change at this size: a partial sync (only that service's chains) next to a
   full sync, render and restore separately.
3. resident memory of `kubeproxy run --manifests` after its first sync (VmHWM, VmRSS).

Mode `nftables-exec` is nftables mode with every transaction sent by an `nft -f -` process, as
before libnftables was used in-process (kernel/libnft.py): run both for the comparison
(memory is not measured for it: `kubeproxy run` always uses the library where it loads).

The proxy is wired as `kubeproxy run` wires it (lists as one batch, typed where they fit, the
collector managed as in its own process: runtime/memory.py). The test API server runs in this process and
keeps a history of 1,000 events: its watch scans the whole history on every write, so with the
20k objects of the cold start in it (the bench kept 100,000 before) the server's scan took 30-50
ms of every change and the GIL from the proxy. `cpu/change` is this process's CPU (proxy and
test server together) per change, median.

`--baseline DIR` (another version's tree, e.g. `git archive HEAD | tar -x -C /tmp/base`):
--runs times, this script runs once for the baseline's code and once for this tree's,
alternating (each a process of its own, `--tree`), and prints both with medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import ipaddress
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# `--tree DIR`: import kubeproxy from another tree (the parent runs the baseline this way).
ROOT = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv else HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ["KP_BENCH_TREE"] = str(ROOT)  # bench/render.py's way of being told the tree
__import__("kubeproxy")  # first: the package comes from ROOT whatever bench/render.py puts on the path

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters  # noqa: E402
from kubeproxy.backends.iptables.proxier import IptablesProxier  # noqa: E402
from kubeproxy.backends.nftables.proxier import NftablesProxier  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.lab.apiserver import ApiServer  # noqa: E402
from kubeproxy.model.node_model import build_view  # noqa: E402
from kubeproxy.model.options import NFACCT_COUNTERS, Family, node_options  # noqa: E402
from kubeproxy.model.proxy_config import ProxyConfig  # noqa: E402
from kubeproxy.proxy.live_loop import LiveProxy  # noqa: E402
from kubeproxy.sources.api import ApiSource  # noqa: E402
from kubeproxy.sources.connection import connect, load_config  # noqa: E402
from kubeproxy.sources.files import FileSource  # noqa: E402

CFG = ProxyConfig(
    cluster_cidr=("10.0.0.0/8",),
    hostname_override="node-0",
    min_sync_period=0.0,
    sync_period=3600.0,  # no periodic sync in the middle of a measurement
    healthz_bind_address="",
    metrics_bind_address="",
)


def runner(ns: netns.NetNS, exec_nft: bool):  # type: ignore[no-untyped-def]
    """The namespace as the host the proxy runs its tools on; with `exec_nft` a plain function
    (host.Commands) that declares nothing, so the nftables backend runs the `nft` process."""
    return (lambda argv, **kw: ns.run(argv, **kw)) if exec_nft else ns


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def new_proxy(cfg: ProxyConfig, ns: netns.NetNS, variant: str, exec_nft: bool) -> LiveProxy:
    proxy = LiveProxy(cfg, "node-0", run_cmd=runner(ns, exec_nft), iptables_variant=variant)
    proxy.manage_gc = True  # as in `kubeproxy run` (run_until_signalled); an older tree ignores it
    return proxy


def batching(proxy: LiveProxy) -> dict:
    """The source options `kubeproxy run` uses (proxy/kube_proxy.py); none for an older tree."""
    return {"batch_sink": proxy.on_events} if hasattr(proxy, "on_events") else {}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def moved(slice_obj: dict, step: int) -> dict:
    """The slice with its first endpoint moved to a fresh address."""
    new = copy.deepcopy(slice_obj)
    new["endpoints"][0]["addresses"] = [f"10.250.{step // 250}.{step % 250 + 1}"]
    return new


async def _changes(proxy: LiveProxy, apply, slices: list[dict], count: int) -> list[float]:
    """The latency of each change; the median CPU seconds per change is appended last."""
    latencies, cpu = [], [cpu_seconds()]
    for step in range(count):
        target = slices[(step * 7919) % len(slices)]
        key = (target["metadata"]["namespace"], target["metadata"]["labels"]["kubernetes.io/service-name"])
        done = proxy.syncs + proxy.failed_syncs
        start = time.perf_counter()
        await asyncio.to_thread(apply, moved(target, step))
        while True:
            await proxy.wait_for_syncs(done + 1)
            done = proxy.syncs + proxy.failed_syncs
            if proxy.last_changes is not None and key in proxy.last_changes.services:
                break
        latencies.append(time.perf_counter() - start)
        cpu.append(cpu_seconds())
    return [*latencies, statistics.median(b - a for a, b in itertools.pairwise(cpu))]


async def via_api(ns: netns.NetNS, objs: list[dict], count: int, cfg: ProxyConfig, variant: str, tmp: Path,
                  exec_nft: bool = False) -> list[float]:  # fmt: skip
    # See the module doc for the history's size.
    with ApiServer(history_size=1000) as server:
        for obj in objs:
            server.apply(obj)
        proxy = new_proxy(cfg, ns, variant, exec_nft)
        client = connect(load_config(server.write_kubeconfig(tmp / "kubeconfig")), timeout=120)
        options = batching(proxy)
        if options:
            options["typed_lists"] = True
        task = asyncio.create_task(proxy.serve(ApiSource(client, "node-0", proxy.on_event, **options)))
        try:
            await proxy.wait_for_syncs(1)
            slices = [o for o in objs if o["kind"] == "EndpointSlice"]
            return await _changes(proxy, server.apply, slices, count)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()


async def via_files(ns: netns.NetNS, objs: list[dict], count: int, cfg: ProxyConfig, variant: str, tmp: Path,
                    exec_nft: bool = False) -> list[float]:  # fmt: skip
    folder = tmp / "manifests"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    slices = [o for o in objs if o["kind"] == "EndpointSlice"]
    # Everything in one big file except the slices we edit, each in a small file of its own, as
    # a user who keeps one file per app would have it.
    edited = {id(slices[(s * 7919) % len(slices)]) for s in range(count)}
    (folder / "cluster.json").write_text(json.dumps({"kind": "List", "items": [o for o in objs if id(o) not in edited]}))
    paths = {}
    for obj in objs:
        if id(obj) in edited:
            paths[obj["metadata"]["name"]] = folder / f"{obj['metadata']['name']}.json"
            paths[obj["metadata"]["name"]].write_text(json.dumps(obj))

    def write(obj: dict) -> None:
        path = paths[obj["metadata"]["name"]]
        tmp_path = path.with_suffix(".tmp")
        tmp_path.write_text(json.dumps(obj))
        os.replace(tmp_path, path)  # an atomic save, as editors and kubectl-like tools do

    proxy = new_proxy(cfg, ns, variant, exec_nft)
    task = asyncio.create_task(proxy.serve(FileSource([folder], proxy.on_event, **batching(proxy))))
    try:
        await proxy.wait_for_syncs(1)
        return await _changes(proxy, write, slices, count)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def partial_vs_full(ns: netns.NetNS, objs: list[dict], mode: str, variant: str, exec_nft: bool = False) -> dict[str, float]:
    """One full sync and one partial sync (one service changed) at this size, render and kernel apart."""
    state, _ = build_state(objs)
    opts = node_options(CFG, family=Family.IPV4, hostname="node-0", node=None, nfacct_counters=NFACCT_COUNTERS)
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-0")
    proxier: IptablesProxier | NftablesProxier = (
        NftablesProxier(run=runner(ns, exec_nft)) if mode == "nftables" else IptablesProxier(run=ns, variant=variant)
    )
    proxier.prepare()
    proxier.sync(view, opts, None)  # the cold sync; its caches are what a running proxy has
    one = next(iter(view.services)).service
    moved = [
        build_view(
            state.services.values(),
            [moved_slice(s, step) if s.service_name == one[1] else s for s in state.slices.values()],
            Family.IPV4,
            "node-0",
        )
        for step in (0, 1)
    ]
    times = {}
    # The first partial sync after a full one also does the once-per-syncPeriod checks (the
    # nftables table listing); the second is the steady state, which is what is reported.
    steps = (("full", view, None), ("warm-up", moved[0], frozenset({one})), ("partial", moved[1], frozenset({one})))
    for label, target, changed in steps:
        start = time.perf_counter()
        report = proxier.sync(target, opts, changed)
        total = time.perf_counter() - start
        times[f"{label} render"] = report.render_seconds
        times[f"{label} kernel"] = total - report.render_seconds
    return times


def moved_slice(eps, step: int):
    """An EndpointSlice value with its first endpoint at a fresh address."""
    ep, text = eps.endpoints[0], f"10.250.{step // 250}.{step % 250 + 1}"
    if "address" in {f.name for f in dataclasses.fields(ep)}:
        first = dataclasses.replace(ep, address=text)
    else:  # a --baseline tree from before 5a88473: a tuple of ipaddress objects
        first = dataclasses.replace(ep, addresses=(ipaddress.ip_address(text),))
    return dataclasses.replace(eps, endpoints=(first, *eps.endpoints[1:]))


def memory(objs: list[dict], mode: str, variant: str, tmp: Path) -> tuple[float, float]:
    """VmHWM and VmRSS (MiB) of `kubeproxy run` after its first sync."""
    path = tmp / "rss.json"
    path.write_text(json.dumps({"kind": "List", "items": objs}))
    with netns.netns("kpbench") as ns:
        ensure_nfacct_counters(NFACCT_COUNTERS, ns)
        # `kubeproxy` from ROOT (PYTHONPATH puts the tree under test before the installed one).
        launch = "import sys; from kubeproxy.cli import main; sys.argv[0] = 'kubeproxy'; sys.exit(main())"
        argv = [sys.executable, "-c", launch, "-v", "2", "run", "--manifests", str(path),
                "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8",
                "--healthz-bind-address", "", "--metrics-bind-address", "", "--proxy-mode", mode]
        if variant and mode == "iptables":
            argv += ["--iptables-variant", variant]
        proc = ns.popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stderr is not None
        for line in proc.stderr:
            if "SyncProxyRules complete" in line:
                break
        else:
            raise RuntimeError("kubeproxy run exited before its first sync")
        # `ip netns exec` execs the proxy in place, so the child pid is the proxy's.
        status = Path(f"/proc/{proc.pid}/status").read_text()
        fields = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Vm")}
        proc.terminate()
        proc.wait(timeout=30)
        return int(fields["VmHWM"]) / 1024, int(fields["VmRSS"]) / 1024


PARTS = ("api", "file", "full", "memory")
COLUMNS = ("api p50", "api p99", "api cpu", "file p50", "file p99", "file cpu", "full", "full render", "full kernel",
           "partial", "partial render", "partial kernel", "HWM", "RSS")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--modes", default="iptables,nftables")
    parser.add_argument("--variant", default="legacy", help="iptables variant: legacy, nft, or '' for the system's")
    parser.add_argument("--parts", default=",".join(PARTS), help="what to measure: api, file, full, memory")
    parser.add_argument("--baseline", type=Path, help="another version's tree to compare with (see above)")
    parser.add_argument("--runs", type=int, default=3, help="with --baseline: runs of each tree")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # read at import time
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one row as JSON, for --baseline
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/sync.py needs root: it programs a throwaway network namespace")
    if args.baseline is not None:
        compare(args)
        return
    if not args.json:
        print(f"iptables variant: {args.variant or 'system'}; {args.changes} changes per row; times in ms")
        print(HEADER)
        print("-" * len(HEADER))
    for size in (int(s) for s in args.sizes.split(",")):
        objs = cluster(size, args.endpoints)
        results = {mode: row(mode, size, objs, args) for mode in args.modes.split(",")}
        if args.json:
            print(json.dumps({mode: result for mode, result in results.items()}), flush=True)
            continue
        for mode, result in results.items():
            print_row(mode, size, size * args.endpoints, "", result)
        if "nftables" in results and "nftables-exec" in results:
            lib, exe = results["nftables"], results["nftables-exec"]
            print(f"{'':>22} nftables libnftables / nft process: api p50 {lib['api p50'] / exe['api p50']:.2f}, "
                  f"p99 {lib['api p99'] / exe['api p99']:.2f}, partial sync {lib['partial'] / exe['partial']:.2f}",
                  flush=True)  # fmt: skip


HEADER = (
    f"{'mode':>13} {'services':>8} {'eps':>6} {'tree':>4} | {'api p50':>8} {'api p99':>8} {'cpu/chg':>7} |"
    f" {'file p50':>8} {'file p99':>8} {'cpu/chg':>7} | {'full':>7} {'(render':>8} {'kernel)':>8} |"
    f" {'partial':>7} {'(render':>8} {'kernel)':>8} | {'HWM MiB':>7} {'RSS MiB':>7}"
)


def print_row(label: str, size: int, eps: int, tree: str, r: dict[str, float]) -> None:
    ms = lambda key: f"{r[key] * 1000:.0f}" if key in r else "-"  # noqa: E731
    mib = lambda key: f"{r[key]:.0f}" if key in r else "-"  # noqa: E731
    print(
        f"{label:>13} {size:>8} {eps:>6} {tree:>4} | {ms('api p50'):>8} {ms('api p99'):>8} {ms('api cpu'):>7} |"
        f" {ms('file p50'):>8} {ms('file p99'):>8} {ms('file cpu'):>7} |"
        f" {ms('full'):>7} {ms('full render'):>8} {ms('full kernel'):>8} |"
        f" {ms('partial'):>7} {ms('partial render'):>8} {ms('partial kernel'):>8} | {mib('HWM'):>7} {mib('RSS'):>7}",
        flush=True,
    )


def compare(args: argparse.Namespace) -> None:
    """Both trees' rows, alternating runs, medians and ratios (this / baseline)."""
    trees = {"base": args.baseline.resolve(), "this": HERE.parent}
    print(f"iptables variant: {args.variant or 'system'}; {args.changes} changes per run; median of {args.runs} runs "
          f"per tree, alternating; times in ms; load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(HEADER)
    print("-" * len(HEADER))
    for size in args.sizes.split(","):
        for mode in args.modes.split(","):
            got: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
            for _ in range(args.runs):
                for label, tree in trees.items():
                    argv = [sys.executable, __file__, "--tree", str(tree), "--json", "--sizes", size, "--modes", mode,
                            "--endpoints", str(args.endpoints), "--changes", str(args.changes),
                            "--variant", args.variant, "--parts", args.parts]  # fmt: skip
                    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                    got[label].append(json.loads(out.strip().splitlines()[-1])[mode])
            medians = {label: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for label, rows in got.items()}
            for label, med in medians.items():
                print_row(mode, int(size), int(size) * args.endpoints, label, med)
            base, this = medians["base"], medians["this"]
            ratios = ", ".join(f"{key} {this[key] / base[key]:.2f}" for key in COLUMNS if base.get(key) and key in this)
            print(f"{'':>13} this/base: {ratios}; load average {os.getloadavg()[0]:.1f}", flush=True)


def row(label: str, size: int, objs: list[dict], args: argparse.Namespace) -> dict[str, float]:
    exec_nft = label == "nftables-exec"
    mode = "nftables" if exec_nft else label
    cfg = dataclasses.replace(CFG, mode=mode)
    parts = set(args.parts.split(","))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for part, via in (("api", via_api), ("file", via_files)):
            if part in parts:
                with netns.netns("kpbench") as ns:
                    ensure_nfacct_counters(NFACCT_COUNTERS, ns)
                    *times, cpu = asyncio.run(via(ns, objs, args.changes, cfg, args.variant, tmp, exec_nft))
                out |= {f"{part} p50": pct(times, 0.5), f"{part} p99": pct(times, 0.99), f"{part} cpu": cpu}
        if "full" in parts:
            with netns.netns("kpbench") as ns:
                ensure_nfacct_counters(NFACCT_COUNTERS, ns)
                pf = partial_vs_full(ns, objs, mode, args.variant, exec_nft)
            for what in ("full", "partial"):
                out |= {what: pf[f"{what} render"] + pf[f"{what} kernel"],
                        f"{what} render": pf[f"{what} render"], f"{what} kernel": pf[f"{what} kernel"]}  # fmt: skip
        if "memory" in parts and not exec_nft:
            out["HWM"], out["RSS"] = memory(objs, mode, args.variant, tmp)
    if "full" in out and not args.json:
        print(f"{'':>22} partial/full = {out['partial'] / out['full']:.2f}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return out


if __name__ == "__main__":
    main()
