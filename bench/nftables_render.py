#!/usr/bin/env python3
"""nftables render and node view at scale: time and memory, this tree next to a baseline tree.

Usage: .venv/bin/python bench/nftables_render.py [--services 10000] [--endpoints 10] [--runs 5]
                                                 [--baseline DIR] [--no-process]

DIR is another version's tree (e.g. `git archive HEAD | tar -x -C /tmp/base`); without it only
this tree is measured. No root needed: nothing touches a kernel. Each tree runs in its own child
processes (PYTHONPATH = the tree), the trees alternating run by run, so that both see the same
neighbours on a shared machine; the table gives medians of --runs, wall clock and CPU time
(user + sys, which a neighbour competing for the cores inflates less), and the ratio of this
tree to the baseline. Rows (bench/render.py's services, one port, 10 endpoints each, 2 local):

  view          build_view over the ClusterState (one IP family)
  render        the nftables render, the pure function (full, no previous rendering)
  text          the rendering's `nft -f` text
  view MiB      memory the NodeView holds (tracemalloc, after the build)
  rendering MiB memory the rendering holds, with its bookkeeping for incremental renders
  process       `kubeproxy render --proxy-mode nftables` of one JSON List file, the whole
                process (start, imports, decode, view, render, print to /dev/null); its peak RSS
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render import cluster  # noqa: E402  (bench/render.py's generator)

# Run in a child with PYTHONPATH = a tree: prints one JSON line of seconds and MiB.
_STAGES = r"""
import gc, json, resource, sys, time, tracemalloc
from kubeproxy.cluster.state import build_state
from kubeproxy.backends.nftables.render import render
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import node_options
objs = json.load(open(sys.argv[1]))["items"]
state = build_state(objs)[0]
del objs
opts = node_options(ProxyConfig(cluster_cidr=("10.0.0.0/8",)), family="IPv4", hostname="node-0", node=None, nfacct_counters=())

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def timed(fn):
    gc.collect()
    gc.disable()  # as `kubeproxy render` and the live render (paused_gc) run
    c0, t0 = cpu(), time.perf_counter()
    out = fn()
    wall, used = time.perf_counter() - t0, cpu() - c0
    gc.enable()
    return out, wall, used

out = {}
view, out["view wall"], out["view cpu"] = timed(
    lambda: build_view(state.services.values(), state.slices.values(), "IPv4", "node-0"))
rendering, out["render wall"], out["render cpu"] = timed(lambda: render(view, opts))
_, out["text wall"], out["text cpu"] = timed(rendering.text)
del view, rendering
gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
view = build_view(state.services.values(), state.slices.values(), "IPv4", "node-0")
gc.collect()
held_view = tracemalloc.get_traced_memory()[0]
rendering = render(view, opts)
gc.collect()
held_rendering = tracemalloc.get_traced_memory()[0]
out["view MiB"] = (held_view - base) / 2**20
out["rendering MiB"] = (held_rendering - held_view) / 2**20
print(json.dumps(out))
"""

# Prepended to the `kubeproxy render` child: at exit, its VmHWM line to the file KP_BENCH_HWM names.
_HWM_AT_EXIT = (
    "import atexit, os\n"
    "def _hwm():\n"
    "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
    "    open(os.environ['KP_BENCH_HWM'], 'w').write(line)\n"
    "atexit.register(_hwm)\n"
)
_KUBEPROXY = "import sys; from kubeproxy.cli import main; sys.argv[0] = 'kubeproxy'; main()"


def stages(tree: Path, path: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _STAGES, str(path)], env=env, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"stages in {tree} failed:\n{proc.stderr}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def render_process(tree: Path, path: Path) -> dict[str, float]:
    """`kubeproxy render --proxy-mode nftables` as a process: wall s, cpu s, peak RSS MiB."""
    argv = ["render", "--manifests", str(path), "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8"]
    with tempfile.NamedTemporaryFile("r") as hwm:
        env = {**os.environ, "PYTHONPATH": str(tree), "KP_BENCH_HWM": hwm.name}
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", _HWM_AT_EXIT + _KUBEPROXY, *argv, "--proxy-mode", "nftables"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tree,
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"kubeproxy render in {tree} exited {os.waitstatus_to_exitcode(status)}")
        peak = int(hwm.read().split()[1]) / 1024
    return {"process wall": wall, "process cpu": usage.ru_utime + usage.ru_stime, "process RSS MiB": peak}


ROWS: list[tuple[str, str, str | None, str]] = [
    ("view", "view wall", "view cpu", "s"),
    ("render", "render wall", "render cpu", "s"),
    ("view + render", "view+render wall", "view+render cpu", "s"),
    ("text", "text wall", "text cpu", "s"),
    ("view held", "view MiB", None, "MiB"),
    ("rendering held", "rendering MiB", None, "MiB"),
    ("kubeproxy render (process)", "process wall", "process cpu", "s"),
    ("  its peak RSS", "process RSS MiB", None, "MiB"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another version's tree to compare with")
    parser.add_argument("--no-process", action="store_true", help="skip the `kubeproxy render` processes")
    args = parser.parse_args()
    trees = {"this": ROOT} if args.baseline is None else {"baseline": args.baseline.resolve(), "this": ROOT}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster(args.services, args.endpoints)}))
        for run in range(args.runs):
            for name, tree in trees.items():  # alternating: both trees see the same neighbours
                got = stages(tree, path)
                got["view+render wall"] = got["view wall"] + got["render wall"]
                got["view+render cpu"] = got["view cpu"] + got["render cpu"]
                if not args.no_process:
                    got.update(render_process(tree, path))
                for key, value in got.items():
                    samples[name].setdefault(key, []).append(value)
            print(f"run {run + 1}/{args.runs} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)

    def med(name: str, key: str | None) -> float | None:
        values = samples[name].get(key or "")
        return statistics.median(values) if values else None

    print(f"{args.services} services x {args.endpoints} endpoints, nftables, medians of {args.runs} (wall / cpu)")
    header = f"{'':<28}" + "".join(f"{n:>22}" for n in trees) + ("   this/baseline" if len(trees) == 2 else "")
    print(header)
    for label, wall_key, cpu_key, unit in ROWS:
        cells, ratios = [], []
        for name in trees:
            wall, cpu = med(name, wall_key), med(name, cpu_key)
            if wall is None:
                cells.append(f"{'-':>22}")
                continue
            text = f"{wall:.3f} / {cpu:.3f} {unit}" if cpu is not None else f"{wall:.1f} {unit}"
            cells.append(f"{text:>22}")
        if len(trees) == 2:
            for column in (wall_key, cpu_key):
                before, after = med("baseline", column), med("this", column)
                if before and after is not None:
                    ratios.append(f"{after / before:.2f}x")
        print(f"{label:<28}" + "".join(cells) + (f"   {' / '.join(ratios)}" if ratios else ""))


if __name__ == "__main__":
    main()
