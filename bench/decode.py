#!/usr/bin/env python3
"""Decoding 10k Services + 10k EndpointSlices: JSON text to ClusterState, and `kubeproxy render` as a process.

Usage: .venv/bin/python bench/decode.py [--services 10000] [--endpoints 10] [--runs 5] [--no-process | --process-only]

Everything is measured side by side in one run, on whatever else the machine is doing: each
stage is timed `--runs` times and reported as best / median of the wall clock and of the CPU time
(which a neighbour competing for the cores does not inflate), so that noise shows as a spread
rather than as a different number. Stages:

- file: one kubectl-style `kind: List` JSON file (bench/render.py's `cluster()`), read and split
  into objects (`manifests.parse_documents`), then checked and typed (`state.build_state`);
- api: the same objects as the two list responses an API server sends (ServiceList,
  EndpointSliceList) decoded by `schema.decode_list` into structs (the API source's general body
  decoder where it does not take a body), then `build_state`;
- process: `kubeproxy render` of the file in both modes as a whole process (python start-up,
  imports, decode, render, print to /dev/null), next to `python -c pass` and the import alone,
  with each process's peak RSS.

`--baseline DIR` (another version's tree, e.g. `git archive HEAD | tar -x -C /tmp/base`) runs
the same process rows with that tree's code interleaved with this one's, and prints the ratio;
its own bench/decode.py gives its in-process rows first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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

from kubeproxy.cluster.manifest_load import load  # noqa: E402
from kubeproxy.cluster.manifests import parse_documents, read_text  # noqa: E402
from kubeproxy.cluster.state import build_state  # noqa: E402
from kubeproxy.sources.api import decode_body  # noqa: E402

try:  # a tree without the typed list decoding (--baseline) has no decode_list
    from msgspec import UNSET

    from kubeproxy.cluster.schema import decode_list
except ImportError:
    decode_list = None  # type: ignore[assignment]


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


def show(label: str, times: list[tuple[float, float]], budget: float | None = None, rss_kib: int | None = None) -> None:
    wall, cpu = [t[0] for t in times], [t[1] for t in times]
    ratio = f"  best/budget {min(wall) / budget:.2f} (cpu {min(cpu) / budget:.2f})" if budget else ""
    rss = f"  peak RSS {rss_kib / 1024:5.0f} MiB" if rss_kib else ""
    print(
        f"{label:<58} wall best {min(wall):6.3f} median {statistics.median(wall):6.3f}"
        f" | cpu best {min(cpu):6.3f} median {statistics.median(cpu):6.3f}{ratio}{rss}"
    )


def decode_file(path: Path) -> Any:
    return load([path])  # what `kubeproxy render` does


def decode_api(bodies: list[bytes]) -> Any:
    items: list[Any] = []
    for body in bodies:
        typed = decode_list(body) if decode_list is not None else None
        if typed is not None:  # the typed decoder's structs, which ClusterState.apply reads
            head, structs = typed
            kind = head["kind"].removesuffix("List")
            for struct in structs:
                if struct.kind is UNSET:
                    struct.kind = kind  # as ApiSource._list does
            items.extend(structs)
            continue
        decoded = decode_body(body)
        kind = decoded["kind"].removesuffix("List")
        for item in decoded["items"]:
            item.setdefault("kind", kind)  # as ApiSource._list does
        items.extend(decoded["items"])
    state, warnings = build_state(items)
    assert not warnings, warnings[:3]
    return state


def _with_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with the two managedFields entries a controller-made object has (kubectl get -o json)."""
    keys: dict[str, Any] = {
        f"k:{json.dumps({'port': p.get('port'), 'protocol': 'TCP'}, separators=(',', ':'))}": {".": {}, "f:port": {}}
        for p in obj.get("spec", {}).get("ports", [])
    }
    labels: dict[str, Any] = {".": {}, **{f"f:{k}": {} for k in obj["metadata"].get("labels", {})}}
    if "spec" in obj:
        fields: dict[str, Any] = {"f:metadata": {"f:labels": labels}, "f:spec": {"f:ports": {".": {}, **keys}}}
    else:
        fields = {"f:metadata": {"f:labels": labels}, "f:addressType": {}, "f:endpoints": {}, "f:ports": {}}
    entries = [
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": obj.get("apiVersion", "v1"),
         "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields},
        {"manager": "kube-apiserver", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:00Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}, "subresource": "status"},
    ]
    return {**obj, "metadata": {**obj["metadata"], "managedFields": entries}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-process", action="store_true", help="skip the `kubeproxy render` processes")
    parser.add_argument("--baseline", type=Path, help="another version's tree to compare with (see above)")
    parser.add_argument("--process-only", action="store_true", help="only the process rows (e.g. for start-up work)")
    args = parser.parse_args()
    if args.baseline is not None and not args.process_only:
        print(f"baseline {args.baseline}, in-process stages (its own bench/decode.py):", flush=True)
        bench = args.baseline / "bench" / "decode.py"
        argv = [sys.executable, str(bench), "--services", str(args.services), "--endpoints", str(args.endpoints)]
        subprocess.run([*argv, "--runs", str(args.runs), "--no-process"], check=True, cwd=args.baseline,
                       env={**os.environ, "PYTHONPATH": str(args.baseline)})
        print("this tree, in-process stages:")

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
        # As an API server sends them: every item with its metadata.managedFields (2 entries).
        managed_bodies = [
            json.dumps({**body, "items": [_with_managed_fields(o) for o in body["items"]]}).encode()
            for body in map(json.loads, bodies)
        ]
        size = path.stat().st_size / 2**20
        print(f"{len(objs)} objects ({args.services} services x {args.endpoints} endpoints), {size:.1f} MiB JSON")
        if not args.process_only:
            in_process(args, path, bodies, managed_bodies)
        if args.no_process:
            return
        run_processes(args, path)


def in_process(args: argparse.Namespace, path: Path, bodies: list[bytes], managed_bodies: list[bytes]) -> None:
    """The in-process stages: file split, build_state, file and API decode."""
    text = read_text(path)
    raw = [r.obj for r in parse_documents(text, str(path))]
    show("file: read + split (text -> dicts)", timed(args.runs, lambda: list(parse_documents(read_text(path), str(path))))[0])
    times, (state, warnings) = timed(args.runs, lambda: build_state(raw))
    assert not warnings and len(state.services) == args.services, warnings[:3]
    show("file: build_state (dicts -> objects)", times)
    show("file: decode total, render.load (budget 0.3 s)", timed(args.runs, lambda: decode_file(path))[0], 0.3)
    show("api: decode bodies + build_state (budget 0.3 s)", timed(args.runs, lambda: decode_api(bodies))[0], 0.3)
    show("api: the same with managedFields in every item", timed(args.runs, lambda: decode_api(managed_bodies))[0])


def run_processes(args: argparse.Namespace, path: Path) -> None:
    """`kubeproxy render` (and the interpreter, and the import) as processes, trees alternating."""
    python = str(ROOT / ".venv" / "bin" / "python")
    # The `kubeproxy` entry point's code, run from whichever tree PYTHONPATH names.
    kubeproxy = [python, "-c", "import sys; from kubeproxy.cli import main; sys.argv[0] = 'kubeproxy'; main()"]
    common = ["--manifests", str(path), "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8"]
    commands = {
        "process: python -c pass": [python, "-c", "pass"],
        "process: import kubeproxy.cli": [python, "-c", "import kubeproxy.cli"],
        "process: render --proxy-mode iptables (1.0 s)": [*kubeproxy, "render", *common, "--proxy-mode", "iptables"],
        "process: render --proxy-mode nftables (1.0 s)": [*kubeproxy, "render", *common, "--proxy-mode", "nftables"],
    }
    trees = {"": ROOT} if args.baseline is None else {"baseline ": args.baseline.resolve(), "this tree ": ROOT}
    for tree in trees.values():
        # Byte-compiled, as an installed package is: with PYTHONDONTWRITEBYTECODE set (or a fresh
        # `git archive` tree) each process would otherwise compile stale or missing modules again.
        subprocess.run([python, "-m", "compileall", "-q", str(tree / "kubeproxy")], check=True, stdout=subprocess.DEVNULL)
    for label, argv in commands.items():
        results: dict[str, list[tuple[float, float]]] = {}
        rss: dict[str, int] = {}
        for _ in range(args.runs):  # the trees alternate, so that both see the same neighbours
            for name, tree in trees.items():
                wall, cpu, peak = run_process(argv, tree)
                results.setdefault(name, []).append((wall, cpu))
                rss[name] = max(rss.get(name, 0), peak)
        for name in trees:
            show(f"{name}{label}", results[name], 1.0 if "render" in label else None, rss[name])
        if args.baseline is not None:
            ratio = statistics.median(t[0] for t in results["this tree "]) / statistics.median(
                t[0] for t in results["baseline "]
            )
            memory = rss["this tree "] / rss["baseline "]
            print(f"{'':<12}this tree / baseline, median wall: {ratio:.2f}x; peak RSS {memory:.2f}x")


def run_process(argv: list[str], tree: Path) -> tuple[float, float, int]:
    """(wall s, cpu s, peak RSS KiB) of one process running `argv` with `tree`'s kubeproxy."""
    # The child's peak RSS is its VmHWM, which it writes to a file as it exits: ru_maxrss would
    # start from this process's size at the fork (the generated objects, 300 MiB), not from zero.
    with tempfile.NamedTemporaryFile("r") as hwm:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSTARTUP": "", "KP_BENCH_HWM": hwm.name}
        wrapped = [argv[0], "-c", _HWM_AT_EXIT + (argv[2] if argv[1] == "-c" else ""), *argv[3:]]
        start = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time, not all children's
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{argv} in {tree} exited {os.waitstatus_to_exitcode(status)}")
        peak = int(hwm.read().split()[1])
    return wall, usage.ru_utime + usage.ru_stime, peak


# Prepended to each child's `-c` program: at exit, its VmHWM line ("VmHWM:  123456 kB") to the file.
_HWM_AT_EXIT = (
    "import atexit, os\n"
    "def _hwm():\n"
    "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
    "    open(os.environ['KP_BENCH_HWM'], 'w').write(line)\n"
    "atexit.register(_hwm)\n"
)


if __name__ == "__main__":
    main()
