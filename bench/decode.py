#!/usr/bin/env python3
"""Decoding 10k Services + 10k EndpointSlices: JSON text to ClusterState, and `kubeproxy render` as a process.

Usage: .venv/bin/python bench/decode.py [--services 10000] [--endpoints 10] [--runs 5] [--no-process]

Everything is measured side by side in one run, on whatever else the machine is doing: each
stage is timed `--runs` times and reported as best / median of the wall clock and of the CPU time
(which a neighbour competing for the cores does not inflate), so that noise shows as a spread
rather than as a different number. Stages:

- file: one kubectl-style `kind: List` JSON file (bench/render.py's `cluster()`), read and split
  into objects (`manifests.parse_documents`), then checked and typed (`state.build_state`);
- api: the same objects as the two list responses an API server sends (ServiceList,
  EndpointSliceList) decoded by the API source's body decoder, then `build_state`;
- process: `kubeproxy render` of the file in both modes as a whole process (python start-up,
  imports, decode, render, print to /dev/null), next to `python -c pass` and the import alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render import cluster  # noqa: E402  (bench/render.py's generator)

from kubeproxy.cluster.manifests import parse_documents, read_text  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.render import load  # noqa: E402
from kubeproxy.sources.api import decode_body  # noqa: E402


def timed(runs: int, fn: Callable[[], Any], *, children: bool = False) -> tuple[list[tuple[float, float]], Any]:
    """(wall, cpu) seconds of each run, and the last result. cpu is this process's, or its children's."""
    times, result = [], None
    for _ in range(runs):
        result = None
        gc.collect()
        cpu_before, start = _cpu(children), time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start, _cpu(children) - cpu_before))
    return times, result


def _cpu(children: bool) -> float:
    # CPU time as well as wall time: on a shared 2-core machine the wall clock includes waiting
    # for a core, the CPU time does not (it still includes cache and memory contention).
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def show(label: str, times: list[tuple[float, float]], budget: float | None = None) -> None:
    wall, cpu = [t[0] for t in times], [t[1] for t in times]
    ratio = f"  best/budget {min(wall) / budget:.2f} (cpu {min(cpu) / budget:.2f})" if budget else ""
    print(
        f"{label:<48} wall best {min(wall):6.3f} median {statistics.median(wall):6.3f}"
        f" | cpu best {min(cpu):6.3f} median {statistics.median(cpu):6.3f}{ratio}"
    )


def decode_file(path: Path) -> Any:
    return load([path])  # what `kubeproxy render` does


def decode_api(bodies: list[bytes]) -> Any:
    items: list[Any] = []
    for body in bodies:
        decoded = decode_body(body)
        kind = decoded["kind"].removesuffix("List")
        for item in decoded["items"]:
            item.setdefault("kind", kind)  # as ApiSource._list does
        items.extend(decoded["items"])
    state, warnings = build_state(items)
    assert not warnings, warnings[:3]
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-process", action="store_true", help="skip the `kubeproxy render` processes")
    args = parser.parse_args()

    objs = cluster(args.services, args.endpoints)
    with tempfile.TemporaryDirectory() as tmp_name:
        path = Path(tmp_name) / "cluster.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
        bodies = [
            json.dumps(
                {
                    "kind": f"{kind}List",
                    "metadata": {"resourceVersion": "1"},
                    "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objs if o["kind"] == kind],
                }
            ).encode()
            for kind in ("Service", "EndpointSlice")
        ]
        size = path.stat().st_size / 2**20
        print(f"{len(objs)} objects ({args.services} services x {args.endpoints} endpoints), {size:.1f} MiB JSON")
        text = read_text(path)
        raw = [r.obj for r in parse_documents(text, str(path))]
        show("file: read + split (text -> dicts)", timed(args.runs, lambda: list(parse_documents(read_text(path), str(path))))[0])
        times, (state, warnings) = timed(args.runs, lambda: build_state(raw))
        assert not warnings and len(state.services) == args.services, warnings[:3]
        show("file: build_state (dicts -> objects)", times)
        show("file: decode total, render.load (budget 0.3 s)", timed(args.runs, lambda: decode_file(path))[0], 0.3)
        show("api: decode bodies + build_state (budget 0.3 s)", timed(args.runs, lambda: decode_api(bodies))[0], 0.3)
        if args.no_process:
            return
        python = str(ROOT / ".venv" / "bin" / "python")
        kubeproxy = str(ROOT / ".venv" / "bin" / "kubeproxy")
        common = ["--manifests", str(path), "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8"]
        commands = {
            "process: python -c pass": [python, "-c", "pass"],
            "process: import kubeproxy.cli": [python, "-c", "import kubeproxy.cli"],
            "process: render --proxy-mode iptables (1.0 s)": [kubeproxy, "render", *common, "--proxy-mode", "iptables"],
            "process: render --proxy-mode nftables (1.0 s)": [kubeproxy, "render", *common, "--proxy-mode", "nftables"],
        }
        for label, argv in commands.items():
            def run(argv: list[str] = argv) -> None:
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)

            show(label, timed(args.runs, run, children=True)[0], 1.0 if "render" in label else None)


if __name__ == "__main__":
    main()
