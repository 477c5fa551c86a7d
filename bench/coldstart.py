#!/usr/bin/env python3
"""Cold start of `kubeproxy run` against the test API server: process start to rules in the kernel.

Usage: .venv/bin/python bench/coldstart.py [--sizes 1000,10000] [--endpoints 10] [--runs 3]
                                           [--modes nftables,iptables] [--timeout 300]
                                           [--baseline DIR] [--profile DIR]

For each size and mode, in a network namespace created for the run (needs root):
1. the test API server (kubeproxy.lab.apiserver) is started inside the namespace, in a process
   of its own (this script with --serve), and loaded with N services x --endpoints endpoints
   (bench/render.py's objects); the clock does not run yet;
2. `kubeproxy run --kubeconfig ...` is started in the namespace at its default verbosity
   (iptables mode: iptables-legacy); the clock runs from the fork until its metrics page shows a
   first successful sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds set), polled every
   10 ms from inside the namespace by this script with --poll (the rules are in by then);
3. every kernel tool the proxy runs (nft, iptables-legacy-restore, ...) is a wrapper on PATH that
   records how long the real tool took, so the table splits the total into the kernel tools'
   part and ours (python start-up, imports, list + decode, build the view, render).
   In nftables mode a cold table goes to a pipeline of `nft` processes that overlap each other
   (backends/nftables/stream.py), so the tools' part is the wall time during which at least one
   tool ran, not the sum of their times; small transactions go through libnftables inside the
   proxy process (kernel/libnft.py) and count in "ours".

Phases (times from the fork, CLOCK_MONOTONIC, which every process of the machine shares):
  up       the metrics page answers (interpreter start-up, imports, flags, start-up checks)
  synced   the first sync is done (list + decode + view + render + kernel tools)
Each cell is the median of --runs runs (a fresh namespace and API server each).
`--restart`: a first proxy (untimed) programs the namespace and stops, leaving its rules, as a
restarted or upgraded kube-proxy finds them; the timed one then starts (its first sync is a
full one over the existing table).

HWM/RSS: the proxy's peak and resident memory (VmHWM, VmRSS) at that moment.
CPU seconds (user + sys, from /proc at the moment the first sync is seen): `proxy cpu` is the
proxy process's own (its worker threads and libnftables included, the kernel tools' processes
not); `server cpu` is what the test API server spent meanwhile (serialising the 20k-object lists
and the watch start-up). On this 2-core machine the two compete with each other and with the
kernel tools, so the wall time includes some waiting for the server; its CPU is shown next to
ours rather than subtracted (a real API server runs on other machines, but its lists are not
free either: they take the same bytes over the wire).

`--server fast` (the default): in the test API server's process, copies and encodings go through
msgspec instead of `copy.deepcopy` and `json.dumps` (same JSON, see `fast_server`). It was made
when the lab server deep-copied every listed object (1.4 s of its CPU for the two 10k lists, on
the critical path, competing with the proxy for the 2 cores); since the lab server lists its
stored objects without copying and encodes them with msgspec itself, `plain` (the lab
server as it is) costs the same, and `fast` matters only for a baseline tree from before that.

`--baseline DIR` (another version's tree, e.g. `git archive HEAD | tar -x -C /tmp/base`): each
run starts the baseline's proxy and then this tree's, alternating, each against a fresh test API
server of its own tree (the baseline's bench/coldstart.py --serve), and the table shows both with
their ratio (this tree / baseline). `--profile DIR`
runs the proxy under cProfile (slower: use it for the profile, not for the times) and writes
`DIR/<mode>-<services>-<tree>.prof`.

`--phases`: where the time goes, without a profiler's overhead. The proxy's launcher wraps a few
functions (`PHASES`) as their modules are imported (the proxy imports as it otherwise would) and
notes when each starts and ends; after the table, each tree's phases as medians over the runs, in
seconds from the fork: the lists of the three resources (request to decoded), their delivery to
the proxy (parse, validate, track), the view, and the render and kernel work of the first sync.
A phase that a tree lacks (an older baseline) is left out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kubeproxy.lab import netns  # noqa: E402

TOOLS = ("nft", "iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy",
         "ip6tables-legacy-restore", "ip6tables-legacy-save", "conntrack", "sysctl")  # fmt: skip
_WRAPPER = """#!/bin/sh
# bench/coldstart.py: time the real {tool} and append "{tool} seconds" to the log.
start=$(date +%s%N)
{real} "$@"
rc=$?
end=$(date +%s%N)
echo "{tool} $(( end - start )) $end" >> {log}
exit $rc
"""
_SYNCED = re.compile(r"^kubeproxy_sync_proxy_rules_last_timestamp_seconds(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)
METRICS = "127.0.0.1:10249"


def fast_server() -> None:
    """In the server's process only: answer lists faster, the same JSON (see the module doc).

    The test server copies every listed object with `copy.deepcopy` and encodes with `json.dumps`:
    ~1.4 s of its CPU for the two 10k lists, on the critical path of the cold start (the proxy
    waits for the slices list). A real API server answers from its watch cache in compiled code.
    Here a JSON round trip through msgspec makes the same copies, and msgspec encodes the same
    JSON (compact: no spaces after separators; UTF-8 rather than \\u escapes)."""
    import copy
    import types

    import msgspec

    from kubeproxy.lab.apiserver import handler, store

    def deepcopy(obj: object) -> object:
        try:
            return msgspec.json.decode(msgspec.json.encode(obj))
        except (TypeError, ValueError, OverflowError):  # not plain JSON: the general copy
            return copy.deepcopy(obj)

    def dumps(obj: object, **options: object) -> str:
        if options:
            return json.dumps(obj, **options)  # type: ignore[arg-type]
        return msgspec.json.encode(obj).decode()

    store.copy = types.SimpleNamespace(deepcopy=deepcopy)  # type: ignore[assignment,attr-defined]
    handler.json = types.SimpleNamespace(dumps=dumps, loads=json.loads, JSONDecodeError=json.JSONDecodeError)  # type: ignore[assignment,attr-defined]


def serve(objects: Path, kubeconfig: Path, fast: bool) -> None:
    """--serve: run the API server with `objects` loaded, print "ready", stop when stdin closes."""
    from kubeproxy.lab.apiserver import ApiServer

    if fast:
        fast_server()

    with ApiServer(history_size=1000) as server:
        for obj in json.loads(objects.read_text()):
            server.apply(obj)
        # A server that has run for a while holds its objects in the collector's oldest generation.
        # Just filled with 20k objects, this one would instead pay a full collection over them in
        # the middle of the proxy's first list (0.15 s of 0.2 s at 10k services, on the critical
        # path). This process is the server's alone, so the freeze touches nothing else.
        gc.collect()
        gc.freeze()
        server.write_kubeconfig(kubeconfig)
        print("ready", flush=True)
        sys.stdin.read()


def poll(url: str) -> None:
    """--poll: print "up T" when `url` first answers and "synced T" when it shows a first sync."""
    import urllib.request

    print("polling", flush=True)
    up = False
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                text = resp.read().decode()
        except OSError:
            time.sleep(0.01)  # not listening yet: there is no event to wait for across processes
            continue
        if not up:
            print(f"up {time.monotonic()}", flush=True)
            up = True
        m = _SYNCED.search(text)
        if m and float(m[1]) > 0:
            print(f"synced {time.monotonic()}", flush=True)
            print(f"wallclock {time.time()}", flush=True)  # to compare with the tools' log
            return
        time.sleep(0.01)


def wrappers(folder: Path, log: Path) -> dict[str, str]:
    """A folder of timing wrappers for the kernel tools; the PATH that puts them first."""
    folder.mkdir(exist_ok=True)
    for tool in TOOLS:
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if real:
            (folder / tool).write_text(_WRAPPER.format(tool=tool, real=real, log=log))
            (folder / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def memory_mib(pid: int) -> tuple[float, float]:
    """VmHWM and VmRSS of a live process, MiB."""
    fields = {line.split(":")[0]: line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
              if line.startswith("Vm")}  # fmt: skip
    return int(fields["VmHWM"]) / 1024, int(fields["VmRSS"]) / 1024


def cpu_seconds(pid: int) -> float:
    """user + sys CPU seconds of a live process (its threads included), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compile_tree(tree: Path) -> None:
    """Byte-compile `tree`'s package, as an installed one is: with PYTHONDONTWRITEBYTECODE set (or
    a fresh `git archive` tree) every start would otherwise compile the stale or missing modules
    again (~0.07 s for 60 modules), and unevenly between the trees compared."""
    python = str(ROOT / ".venv" / "bin" / "python")
    subprocess.run([python, "-m", "compileall", "-q", str(tree / "kubeproxy")], check=True, stdout=subprocess.DEVNULL)


_LAUNCH = """import sys
from kubeproxy.cli import main
sys.argv[0] = "kubeproxy"
sys.exit(main())
"""


# module: (function or Class.method, label); "{kind}": the reflector's resource.
PHASES = {
    "kubeproxy.sources.api": [("Reflector._list_all", "list {kind}"), ("Reflector._deliver", "deliver {kind}")],
    "kubeproxy.proxy.family_lanes": [("FamilyLane.take", "view"), ("FamilyLane.program", "render + kernel")],
    "kubeproxy.backends.nftables.proxier": [("render", "  render (nftables)")],
    "kubeproxy.backends.nftables.apply": [("NftApplier.apply", "  kernel (nftables)")],
}

# Prepended to the launcher with --phases: wraps PHASES' functions as their modules load.
_PHASES = """import functools, importlib.abc, importlib.util, inspect, os, sys, time
_out = open(os.environ["KP_PHASES"], "w", buffering=1)
_WRAP = {wrap!r}

def _mark(label, what):
    _out.write(f"{{time.monotonic()}} {{what}} {{label}}\\n")

def _wrapped(fn, label):
    def name(args):
        spec = getattr(args[0], "spec", None) if args else None
        return label.format(kind=getattr(spec, "kind", "?"))
    if inspect.iscoroutinefunction(fn):
        async def run(*args, **kwargs):
            _mark(name(args), "start")
            try:
                return await fn(*args, **kwargs)
            finally:
                _mark(name(args), "end")
    else:
        def run(*args, **kwargs):
            _mark(name(args), "start")
            try:
                return fn(*args, **kwargs)
            finally:
                _mark(name(args), "end")
    return functools.wraps(fn)(run)

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _WRAP:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            for where, label in _WRAP[fullname]:
                *owner, attr = where.split(".")
                obj = functools.reduce(getattr, owner, module)
                if hasattr(obj, attr):
                    setattr(obj, attr, _wrapped(getattr(obj, attr), label))
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
"""


def proxy_argv(tree: Path, tmp: Path, profile: Path | None, phases: bool = False) -> tuple[list[str], dict[str, str]]:
    """How to start `kubeproxy` from `tree` (PYTHONPATH puts it before the installed one)."""
    launcher = tmp / "launch.py"
    launcher.write_text((_PHASES.format(wrap=PHASES) if phases else "") + _LAUNCH)
    python = str(ROOT / ".venv" / "bin" / "python")
    argv = [python, *(["-m", "cProfile", "-o", str(profile)] if profile else []), str(launcher)]
    return argv, {"PYTHONPATH": str(tree)}


def one(mode: str, objects: Path, tmp: Path, timeout: float, tree: Path = ROOT, profile: Path | None = None,
        server_speed: str = "fast", restart: bool = False, phases: bool = False) -> dict[str, float]:  # fmt: skip
    log = tmp / "tools.log"
    log.unlink(missing_ok=True)
    marks_file = tmp / "phases.log"
    marks_file.unlink(missing_ok=True)
    env = wrappers(tmp / "bin", log) | ({"KP_PHASES": str(marks_file)} if phases else {})
    kubeconfig = tmp / "kubeconfig"
    python = str(ROOT / ".venv" / "bin" / "python")
    # Each tree with its own test API server (its bench/coldstart.py --serve), so that a
    # baseline run measures the server as it was too.
    serve_script = tree / "bench" / "coldstart.py"
    with netns.netns("kpcold") as ns:
        server = ns.popen([python, str(serve_script if serve_script.exists() else __file__), "--serve", str(objects),
                           str(kubeconfig), server_speed],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None and server.stdin is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the test API server did not start")
        launch, extra_env = proxy_argv(tree, tmp, profile, phases)
        argv = [*launch, "run", "--kubeconfig", str(kubeconfig),
                "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8", "--proxy-mode", mode,
                "--healthz-bind-address", "", "--metrics-bind-address", METRICS]  # fmt: skip
        if mode == "iptables":
            argv += ["--iptables-variant", "legacy"]
        try:
            if restart:  # a first proxy programs the table and stops (leaving it), untimed
                _start(ns, argv, {**env, **extra_env}, server, mode, timeout)
                log.unlink(missing_ok=True)
            marks = _start(ns, argv, {**env, **extra_env}, server, mode, timeout)
        finally:
            server.stdin.close()
            server.wait(timeout=30)
    # The kernel tools that finished before the first sync was reported (not the cleanup after it).
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    synced_ns = marks.pop("wallclock") * 1e9
    spans = sorted((int(end) - int(ns_), int(end)) for _, ns_, end in calls if int(end) <= synced_ns)
    return {**marks, "tools": covered(spans) / 1e9, **(phase_marks(marks_file, marks) if phases else {})}


def phase_marks(path: Path, marks: dict[str, float]) -> dict[str, float]:
    """`phase:<label>:start|end` in seconds from the fork: a phase's first start and last end
    before the first sync was seen (later calls belong to the syncs after it)."""
    fork = marks.pop("fork")
    found: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        when, what, label = line.split(" ", 2)
        t = float(when) - fork
        if t > marks["synced"]:
            continue
        key = f"phase:{label}:{what}"
        found[key] = min(found.get(key, t), t) if what == "start" else max(found.get(key, t), t)
    return found


def _start(ns: netns.NetNS, argv: list[str], env: dict[str, str], server: subprocess.Popen[str], mode: str,
           timeout: float) -> dict[str, float]:  # fmt: skip
    """Start the proxy, wait for its first sync (seen on its metrics page), stop it (SIGTERM: it
    leaves its rules in the kernel, as upstream does). The marks and CPU seconds of that start."""
    python = str(ROOT / ".venv" / "bin" / "python")
    poller = ns.popen([python, __file__, "--poll", f"http://{METRICS}/metrics"], stdout=subprocess.PIPE, text=True)
    assert poller.stdout is not None
    if poller.stdout.readline().strip() != "polling":
        raise SystemExit("the metrics poller did not start")
    server_cpu = cpu_seconds(server.pid)
    start = time.monotonic()
    proxy = ns.popen(argv, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, text=True)
    marks: dict[str, float] = {}
    try:
        poller.wait(timeout=timeout)
        # Read at once: the proxy and the server idle after the first sync (no changes).
        marks["proxy cpu"] = cpu_seconds(proxy.pid)
        marks["HWM"], marks["RSS"] = memory_mib(proxy.pid)
        marks["server cpu"] = cpu_seconds(server.pid) - server_cpu
        for line in poller.stdout:
            what, when = line.split()
            marks[what] = float(when) - (0 if what == "wallclock" else start)
        marks["fork"] = start
        if "synced" not in marks:
            raise SystemExit(f"{mode}: no first sync (exit status {proxy.poll()})")
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{mode}: no first sync within {timeout:.0f} s") from None
    finally:
        poller.kill()
        proxy.terminate()  # SIGTERM: a clean exit, so that cProfile writes its file
        proxy.wait(timeout=60)
    return marks


def print_phases(runs: dict[str, list[dict[str, float]]]) -> None:
    """Each tree's phases: medians of start and end over the runs that have them, by start."""
    for label, got in runs.items():
        names = {key.split(":")[1] for r in got for key in r if key.startswith("phase:")}
        rows = []
        for name in names:
            have = [r for r in got if f"phase:{name}:start" in r and f"phase:{name}:end" in r]
            start = statistics.median(r[f"phase:{name}:start"] for r in have)
            end = statistics.median(r[f"phase:{name}:end"] for r in have)
            took = statistics.median(r[f"phase:{name}:end"] - r[f"phase:{name}:start"] for r in have)
            rows.append((start, end, took, name))
        print(f"  phases{' of ' + label if label else ''} (s from the fork, medians):{'start':>9} {'end':>7} {'took':>7}")
        for start, end, took, name in sorted(rows):
            print(f"    {name:<40} {start:>7.3f} {end:>7.3f} {took:>7.3f}")
        print(f"    {'first sync seen':<40} {statistics.median(r['synced'] for r in got):>15.3f}", flush=True)


def covered(spans: list[tuple[int, int]]) -> int:
    """The length of the union of sorted (start, end) intervals: tools that overlap count once."""
    total, reach = 0, None
    for start, end in spans:
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "fast")
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--poll":
        poll(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="nftables,iptables")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--baseline", type=Path, help="another version's tree to compare with (see above)")
    parser.add_argument("--profile", type=Path, help="run the proxy under cProfile, profiles in this folder")
    parser.add_argument("--restart", action="store_true",
                        help="time a restart: an earlier proxy's rules are in the kernel when the timed one starts")  # fmt: skip
    parser.add_argument("--phases", action="store_true", help="also: when each phase of the cold start ran (see above)")
    parser.add_argument("--server", choices=("fast", "plain"), default="fast",
                        help="the test API server's list answers: fast (msgspec, the default) or plain (as the lab has it)")
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/coldstart.py needs root: it runs the proxy in a throwaway network namespace")
    from render import cluster  # bench/render.py's generator

    trees = {"": ROOT} if args.baseline is None else {"base": args.baseline.resolve(), "this": ROOT}
    for tree in trees.values():
        compile_tree(tree)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"test API server: {args.server}; {'restart (rules of an earlier run in the kernel); ' if args.restart else ''}"
          f"median of {args.runs} runs; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    header = (f"{'mode':<9} {'services':>8} {'tree':>4} | {'up s':>6} {'synced s':>8} |"
              f" {'kernel tools s':>14} {'ours s':>7} {'ours/tools':>10} | {'proxy cpu s':>11} {'server cpu s':>12} |"
              f" {'HWM MiB':>7} {'RSS MiB':>7}")  # fmt: skip
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="kp-cold-") as tmp_name:
        tmp = Path(tmp_name)
        for size in (int(s) for s in args.sizes.split(",")):
            objects = tmp / "objects.json"
            objects.write_text(json.dumps(cluster(size, args.endpoints)))
            for mode in args.modes.split(","):
                runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
                for _ in range(args.runs):
                    for label, tree in trees.items():  # alternating: both see the same load
                        prof = args.profile / f"{mode}-{size}-{label or 'this'}.prof" if args.profile else None
                        runs[label].append(one(mode, objects, tmp, args.timeout, tree, prof, args.server, args.restart,
                                               args.phases))  # fmt: skip
                totals = {}
                for label, got in runs.items():

                    def med(key: str, got: list[dict[str, float]] = got) -> float:
                        return statistics.median(r[key] for r in got)

                    total, tools = med("synced"), med("tools")
                    ours = statistics.median(r["synced"] - r["tools"] for r in got)
                    totals[label] = (total, ours, med("proxy cpu"))
                    print(
                        f"{mode:<9} {size:>8,} {label:>4} | {med('up'):>6.2f} {total:>8.2f} | {tools:>14.2f} {ours:>7.2f}"
                        f" {ours / tools if tools else float('inf'):>10.2f} | {med('proxy cpu'):>11.2f}"
                        f" {med('server cpu'):>12.2f} | {med('HWM'):>7.0f} {med('RSS'):>7.0f}",
                        flush=True,
                    )
                if len(totals) == 2:
                    (bt, bo, bc), (tt, to, tc) = totals["base"], totals["this"]
                    print(f"{'':>18} this/base: synced {tt / bt:.2f}, ours {to / bo:.2f}, proxy cpu {tc / bc:.2f}", flush=True)
                if args.phases:
                    print_phases(runs)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
