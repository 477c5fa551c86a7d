#!/usr/bin/env python3
"""The live proxy's control plane: change → kernel latency, partial vs full sync, memory.

Usage: .venv/bin/python bench/sync.py [--sizes 1000,10000] [--endpoints 10] [--changes 20]
                                      [--modes iptables,nftables] [--variant legacy|nft]

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
before libnftables was used in-process (backends/libnft.py): run both for the comparison
(memory is not measured for it: `kubeproxy run` always uses the library where it loads).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters  # noqa: E402
from kubeproxy.backends.iptables.proxier import IptablesProxier  # noqa: E402
from kubeproxy.backends.nftables.proxier import NftablesProxier  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.lab import netns  # noqa: E402
from kubeproxy.lab.apiserver import ApiServer  # noqa: E402
from kubeproxy.live import LiveProxy  # noqa: E402
from kubeproxy.proxy.config import ProxyConfig  # noqa: E402
from kubeproxy.proxy.model import build_view  # noqa: E402
from kubeproxy.proxy.options import NFACCT_COUNTERS, node_options  # noqa: E402
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
    """The namespace's runner; wrapped in a plain function, libnft.for_runner does not see the
    namespace and the nftables backend runs the `nft` process."""
    return (lambda argv, **kw: ns.run(argv, **kw)) if exec_nft else ns.run


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def moved(slice_obj: dict, step: int) -> dict:
    """The slice with its first endpoint moved to a fresh address."""
    new = copy.deepcopy(slice_obj)
    new["endpoints"][0]["addresses"] = [f"10.250.{step // 250}.{step % 250 + 1}"]
    return new


async def _changes(proxy: LiveProxy, apply, slices: list[dict], count: int) -> list[float]:
    latencies = []
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
    return latencies


async def via_api(ns: netns.NetNS, objs: list[dict], count: int, cfg: ProxyConfig, variant: str, tmp: Path,
                  exec_nft: bool = False) -> list[float]:  # fmt: skip
    with ApiServer(history_size=100_000) as server:
        for obj in objs:
            server.apply(obj)
        proxy = LiveProxy(cfg, "node-0", run_cmd=runner(ns, exec_nft), iptables_variant=variant)
        client = connect(load_config(server.write_kubeconfig(tmp / "kubeconfig")), timeout=120)
        task = asyncio.create_task(proxy.serve(ApiSource(client, "node-0", proxy.on_event)))
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

    proxy = LiveProxy(cfg, "node-0", run_cmd=runner(ns, exec_nft), iptables_variant=variant)
    task = asyncio.create_task(proxy.serve(FileSource([folder], proxy.on_event)))
    try:
        await proxy.wait_for_syncs(1)
        return await _changes(proxy, write, slices, count)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def partial_vs_full(ns: netns.NetNS, objs: list[dict], mode: str, variant: str, exec_nft: bool = False) -> dict[str, float]:
    """One full sync and one partial sync (one service changed) at this size, render and kernel apart."""
    state, _ = build_state(objs)
    opts = node_options(CFG, family="IPv4", hostname="node-0", node=None, nfacct_counters=NFACCT_COUNTERS)
    view = build_view(state.services.values(), state.slices.values(), "IPv4", "node-0")
    proxier: IptablesProxier | NftablesProxier = (
        NftablesProxier(run=runner(ns, exec_nft)) if mode == "nftables" else IptablesProxier(run=ns.run, variant=variant)
    )
    proxier.prepare()
    proxier.sync(view, opts, None)  # the cold sync; its caches are what a running proxy has
    one = next(iter(view.services)).service
    moved = [
        build_view(
            state.services.values(),
            [moved_slice(s, step) if s.service_name == one[1] else s for s in state.slices.values()],
            "IPv4",
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
    first = dataclasses.replace(eps.endpoints[0], addresses=(ipaddress.ip_address(f"10.250.{step // 250}.{step % 250 + 1}"),))
    return dataclasses.replace(eps, endpoints=(first, *eps.endpoints[1:]))


def memory(objs: list[dict], mode: str, variant: str, tmp: Path) -> tuple[float, float]:
    """VmHWM and VmRSS (MiB) of `kubeproxy run` after its first sync."""
    path = tmp / "rss.json"
    path.write_text(json.dumps({"kind": "List", "items": objs}))
    with netns.netns("kpbench") as ns:
        ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
        argv = [str(ROOT / ".venv" / "bin" / "kubeproxy"), "-v", "2", "run", "--manifests", str(path),
                "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8",
                "--healthz-bind-address", "", "--metrics-bind-address", "", "--proxy-mode", mode]
        if variant and mode == "iptables":
            argv += ["--iptables-variant", variant]
        proc = ns.popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--modes", default="iptables,nftables")
    parser.add_argument("--variant", default="legacy", help="iptables variant: legacy, nft, or '' for the system's")
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/sync.py needs root: it programs a throwaway network namespace")

    print(f"iptables variant: {args.variant or 'system'}; {args.changes} changes per row; times in ms")
    header = (
        f"{'mode':>13} {'services':>8} {'eps':>6} | {'api p50':>8} {'api p99':>8} | {'file p50':>8} {'file p99':>8} |"
        f" {'full':>7} {'(render':>8} {'kernel)':>8} | {'partial':>7} {'(render':>8} {'kernel)':>8} |"
        f" {'HWM MiB':>7} {'RSS MiB':>7}"
    )
    print(header)
    print("-" * len(header))
    for size in (int(s) for s in args.sizes.split(",")):
        objs = cluster(size, args.endpoints)
        results = {mode: row(mode, size, objs, args) for mode in args.modes.split(",")}
        if "nftables" in results and "nftables-exec" in results:
            lib, exe = results["nftables"], results["nftables-exec"]
            print(f"{'':>22} nftables libnftables / nft process: api p50 {lib['api p50'] / exe['api p50']:.2f}, "
                  f"p99 {lib['api p99'] / exe['api p99']:.2f}, partial sync {lib['partial'] / exe['partial']:.2f}",
                  flush=True)  # fmt: skip


def row(label: str, size: int, objs: list[dict], args: argparse.Namespace) -> dict[str, float]:
    exec_nft = label == "nftables-exec"
    mode = "nftables" if exec_nft else label
    cfg = dataclasses.replace(CFG, mode=mode)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with netns.netns("kpbench") as ns:
            ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
            api = asyncio.run(via_api(ns, objs, args.changes, cfg, args.variant, tmp, exec_nft))
        with netns.netns("kpbench") as ns:
            ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
            files = asyncio.run(via_files(ns, objs, args.changes, cfg, args.variant, tmp, exec_nft))
        with netns.netns("kpbench") as ns:
            ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
            pf = partial_vs_full(ns, objs, mode, args.variant, exec_nft)
        hwm, rss = (float("nan"), float("nan")) if exec_nft else memory(objs, mode, args.variant, tmp)
    full = pf["full render"] + pf["full kernel"]
    partial = pf["partial render"] + pf["partial kernel"]
    ms = lambda s: f"{s * 1000:.0f}"  # noqa: E731
    print(
        f"{label:>13} {size:>8} {size * args.endpoints:>6} | {ms(pct(api, 0.5)):>8} {ms(pct(api, 0.99)):>8} |"
        f" {ms(pct(files, 0.5)):>8} {ms(pct(files, 0.99)):>8} |"
        f" {ms(full):>7} {ms(pf['full render']):>8} {ms(pf['full kernel']):>8} |"
        f" {ms(partial):>7} {ms(pf['partial render']):>8} {ms(pf['partial kernel']):>8} | {hwm:>7.0f} {rss:>7.0f}"
    )
    print(f"{'':>22} partial/full = {partial / full:.2f}; api mean {statistics.mean(api) * 1000:.0f} ms; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return {"api p50": pct(api, 0.5), "api p99": pct(api, 0.99), "partial": partial}


if __name__ == "__main__":
    main()
