#!/usr/bin/env python3
"""Where `kubeproxy run`'s memory goes after its first sync (nftables <= 150 MiB RSS, iptables <= 200).

Usage: .venv/bin/python bench/memory.py [--sizes 10000] [--endpoints 10] [--modes nftables,iptables]
                                        [--source manifests|api] [--runs 3] [--top 25] [--timeout 300]
                                        [--baseline DIR] [--no-breakdown]

Needs root: each run is `kubeproxy run` (iptables mode: iptables-legacy) in a throwaway network
namespace, fed bench/render.py's N services x --endpoints endpoints as one `--manifests` List
(or, --source api, through the test API server as bench/coldstart.py does). The first sync is
awaited on the metrics page (bench/coldstart.py's poller, from inside the namespace).

1. baseline: VmRSS of `python -c pass` and of `python -c 'import kubeproxy.cli'`.
2. RSS: VmRSS / VmHWM / RssAnon / RssFile of the proxy after its first sync, median of --runs
   (a plain process, as a user runs it). --baseline DIR alternates DIR's tree with this one.
3. breakdown (one run, separate because tracemalloc inflates RSS): the proxy started under
   `python -X tracemalloc=10` through this script (--child), which, once the metrics page shows
   the first sync, runs on the proxy's event loop and reports
   - tracemalloc's live bytes grouped by our file (the innermost kubeproxy frame), by third-party
     package, and "import" (module code and dicts, the innermost frame being importlib);
   - the big holders: a walk of the objects each LiveProxy attribute reaches (sys.getsizeof,
     each object counted once, in the order printed: the source's cache first, then the
     ClusterState, the change tracker, the lanes' views and backends' applied state);
   - which notable packages `kubeproxy run` has imported by then.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("127.0.0.1", 10249)
NOTABLE = ("prometheus_client", "pydantic", "lightkube", "httpx", "httpcore", "anyio", "h11", "yaml", "msgspec",
           "matplotlib", "numpy", "click", "kubeproxy.lab", "kubeproxy.netfilter", "kubeproxy.doctor", "ctypes",
           "ipaddress", "asyncio", "ssl", "email", "http", "json", "urllib")  # fmt: skip
MiB = 1024 * 1024
# The console script's import, with the tree's own package first on sys.path ("" = the cwd, the tree).
_ENTRY = "import sys; from kubeproxy.cli import main; sys.argv[0] = 'kubeproxy'; main()"


# ---------------------------------------------------------------------------------------------
# The child: `kubeproxy run` in this process, measured from inside once it has synced.


def _synced() -> bool:
    """Whether the metrics page shows a first sync (a raw socket: importing urllib would count)."""
    data = b""
    try:
        with socket.create_connection(METRICS, timeout=2) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while chunk := s.recv(65536):
                data += chunk
    except TimeoutError:
        pass  # a server that keeps the connection open: the page is in by then
    except OSError:
        return False
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("kubeproxy_sync_proxy_rules_last_timestamp_seconds"):
            return float(line.split()[-1]) > 0
    return False


_SHARED = (type, types.ModuleType, types.FunctionType, types.CodeType, types.BuiltinFunctionType, types.MethodWrapperType)


def _deep(roots: list[Any], seen: set[int]) -> tuple[int, int]:
    """Bytes and objects reachable from `roots` not yet in `seen` (modules, classes, functions are shared)."""
    size = count = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        size += sys.getsizeof(obj)
        count += 1
        stack.extend(gc.get_referents(obj))
    return size, count


def _holders(proxy: Any) -> list[tuple[str, int, int]]:
    """(holder, bytes, objects) for what the LiveProxy keeps, each object counted with the first holder."""
    import asyncio

    seen: set[int] = {id(proxy)}
    # The loop, the servers and the tasks reach everything (through the proxy); keep them out of the walk.
    seen.update(id(t) for t in asyncio.all_tasks())
    seen.add(id(asyncio.get_running_loop()))
    seen.add(id(proxy.lanes))
    out: list[tuple[str, int, int]] = []
    source = proxy.source
    if source is not None:
        seen.add(id(source))
        for name, value in sorted(vars(source).items(), key=lambda kv: kv[0] not in ("_files", "_view", "_cache")):
            if name in ("sink",):
                continue
            size, count = _deep([value], seen)
            out.append((f"source.{name} ({type(source).__name__})", size, count))
    order = ["state", "tracker", "view_builder"]
    for name in order:
        size, count = _deep([getattr(proxy, name)], seen)
        out.append((f"proxy.{name}", size, count))
    for i, lane in enumerate(proxy.lanes):
        seen.add(id(lane))
        for name in ("last_good", "backend", "quarantine", "last_changes", "last_report", "service_health", "opts"):
            size, count = _deep([getattr(lane, name)], seen)
            out.append((f"lanes[{i}].{name} ({lane.family})", size, count))
    rest = {k: v for k, v in vars(proxy).items() if k not in ("source", "lanes", *order)}
    for name, value in rest.items():
        size, count = _deep([value], seen)
        out.append((f"proxy.{name}", size, count))
    return out


def _group(trace: Any) -> str:
    """Who a traced allocation belongs to: our innermost file, 'import', or a third-party package."""
    frames = list(reversed(trace.traceback))  # tracemalloc lists the oldest first: innermost first here
    if "importlib" in frames[0].filename or frames[0].filename.startswith("<frozen"):
        return "import (module code, dicts)"
    for f in frames:
        if "/kubeproxy/" in f.filename and "/site-packages/" not in f.filename:
            return f.filename.split("/kubeproxy/", 1)[1]
    name = frames[0].filename
    if "/site-packages/" in name:
        return "3rd: " + name.split("/site-packages/", 1)[1].split("/", 1)[0]
    return "stdlib: " + name.rsplit("/", 1)[-1]


def _lines(trace: Any) -> str:
    for f in reversed(trace.traceback):
        if "/kubeproxy/" in f.filename and "/site-packages/" not in f.filename:
            return f"{f.filename.split('/kubeproxy/', 1)[1]}:{f.lineno}"
    return f"{trace.traceback[-1].filename.rsplit('/', 2)[-1]}:{trace.traceback[-1].lineno}"


coros: list[Any] = []  # the child's: run_until_signalled(proxy, source), set by child()


def _analyse(out: Path) -> None:
    """On the proxy's loop once it has synced: tracemalloc groups, holders, modules; JSON to `out`."""
    import tracemalloc

    from kubeproxy.proxy.live_loop import LiveProxy

    status = _status(os.getpid())
    snap = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    by_group: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    for trace in snap.traces:
        by_group[_group(trace)] += trace.size
        by_line[_lines(trace)] += trace.size
    frame = coros[0].cr_frame if coros else None
    proxy = frame.f_locals.get("proxy") if frame is not None else None
    holders = _holders(proxy) if isinstance(proxy, LiveProxy) else []
    mods = sorted(sys.modules)
    notable = {n: sum(1 for m in mods if m == n or m.startswith(n + ".")) for n in NOTABLE}
    part = out.with_suffix(".part")
    part.write_text(json.dumps({
        "status": status, "traced": current, "traced_peak": peak, "groups": by_group.most_common(),
        "lines": by_line.most_common(60), "holders": holders, "modules": len(mods), "notable": notable,
        "gc_objects": len(gc.get_objects()),
    }))  # fmt: skip
    part.rename(out)  # at once: the parent waits for `out` to exist


def _trim(out: Path) -> None:
    """On the proxy's loop once it has synced: RSS around gc.collect, malloc_trim and gc.freeze; JSON to `out`.

    The proxy (runtime/memory.py) freezes the heap after its first sync, before any collection: unfreeze
    first so the collection sees the cold start's cyclic garbage too, then freeze again.
    """
    from kubeproxy.runtime.memory import release_free_memory

    steps: list[tuple[str, dict[str, float]]] = [("after first sync", _status(os.getpid()))]
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    started = time.process_time()
    collected = gc.collect()
    collect_s = time.process_time() - started
    steps.append((f"gc.collect() ({collected:,} objects, {collect_s:.2f} s CPU)", _status(os.getpid())))
    started = time.process_time()
    released = release_free_memory()
    trim_s = time.process_time() - started
    steps.append((f"malloc_trim(0) ({released / MiB:.1f} MiB, {trim_s:.3f} s CPU)", _status(os.getpid())))
    gc.freeze()
    steps.append((f"gc.freeze() ({gc.get_freeze_count():,} objects)", _status(os.getpid())))
    part = out.with_suffix(".part")
    part.write_text(json.dumps({"steps": steps, "frozen_by_proxy": frozen, "pymalloc": _pymalloc()}))
    part.rename(out)


def _pymalloc() -> dict[str, int]:
    """CPython's small-object allocator, from sys._debugmallocstats (written to fd 2): arenas
    (1 MiB each, returned to the system only when entirely free), bytes in live blocks and bytes in
    free blocks of partly used pools. Free blocks are what the cold start's transient objects left
    among long-lived ones: malloc_trim cannot return them."""
    import re

    read, write = os.pipe()
    saved = os.dup(2)
    try:
        os.dup2(write, 2)
        os.close(write)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    text = b"".join(chunks).decode(errors="replace")
    keys = {"arenas": "# arenas allocated current", "used": "# bytes in allocated blocks", "free": "# bytes in available blocks"}
    out = {}
    for name, label in keys.items():
        found = re.search(re.escape(label) + r"\s*=\s*([\d,]+)", text)
        out[name] = int(found.group(1).replace(",", "")) if found else -1
    return out


# (module, attribute, step) wrapped by _watch_peaks: the first read's steps, outermost first.
_STEPS = (
    ("kubeproxy.sources.files", "_read_if_changed", "file read + decode (files._read_if_changed)"),
    ("kubeproxy.sources.files", "_parse", "  decode (files._parse)"),
    ("kubeproxy.sources.files", "FileSource._apply", "stored copies + diff (FileSource._apply)"),
    ("kubeproxy.proxy.live_loop", "LiveProxy.on_events", "state build (LiveProxy.on_events)"),
    ("kubeproxy.proxy.live_loop", "LiveProxy.sync", "sync (LiveProxy.sync)"),
    ("kubeproxy.proxy.family_lanes", "FamilyLane.take", "  view (FamilyLane.take)"),
    ("kubeproxy.proxy.family_lanes", "FamilyLane.program", "  render + apply (FamilyLane.program)"),
    ("kubeproxy.backends.nftables.proxier", "render", "    render (nftables render)"),
    ("kubeproxy.backends.nftables.apply", "NftApplier.apply", "    apply (NftApplier.apply)"),
    ("kubeproxy.backends.iptables.proxier", "render_tables", "    render (iptables render_tables)"),
    ("kubeproxy.backends.iptables.proxier", "IptablesProxier._nat_chains", "    existing chains (_nat_chains)"),
    ("kubeproxy.backends.iptables.proxier", "IptablesProxier._with_missing_jump_tables", "    jumps (_with_missing_jump_tables)"),
    ("kubeproxy.backends.iptables.proxier", "AppliedChains.filter_chunks", "    unchanged out (AppliedChains.filter_chunks)"),
    ("kubeproxy.backends.iptables.proxier", "restore", "    apply (iptables restore)"),
)


def _watch_peaks() -> dict[str, list[float]]:
    """Wrap _STEPS so each records, per call, (traced at entry, traced peak inside, traced at exit).

    tracemalloc has one peak: a step resets it on entry, and hands what it saw up to the step it
    is nested in, so the outer step's peak still covers its inner ones.
    """
    import functools
    import importlib
    import tracemalloc

    rows: dict[str, list[float]] = {}  # step -> [calls, entry, peak, exit] of its highest-peak call
    stack: list[list[int]] = []  # per open step: [highest peak seen by the steps inside it]

    def wrap(step: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            entry, before = tracemalloc.get_traced_memory()
            if stack:
                stack[-1][0] = max(stack[-1][0], before)
            stack.append([0])
            tracemalloc.reset_peak()
            try:
                return fn(*args, **kwargs)
            finally:
                exit_, peak = tracemalloc.get_traced_memory()
                peak = max(peak, stack.pop()[0])
                if stack:
                    stack[-1][0] = max(stack[-1][0], peak)
                row = rows.setdefault(step, [0, 0, 0, 0])
                row[0] += 1
                if peak - entry > row[2] - row[1]:
                    row[1:] = [entry, peak, exit_]

        return wrapped

    for module, attr, step in _STEPS:
        mod = importlib.import_module(module)
        owner, _, name = attr.rpartition(".")
        target = getattr(mod, owner) if owner else mod
        setattr(target, name, wrap(step, getattr(target, name)))
    return rows


def child(out: Path, argv: list[str], analyse: Any = _analyse) -> None:
    """--child OUT ARGV...: `kubeproxy run ARGV` here; after its first sync, `analyse`, then SIGTERM."""
    import asyncio
    import signal

    def watch() -> None:
        while not _synced():
            time.sleep(0.05)  # across the process boundary of the HTTP page there is no event to await
        done = threading.Event()

        def run() -> None:
            try:
                analyse(out)
            except Exception:  # the parent shows it: the child's stderr is not kept
                import traceback

                out.write_text(json.dumps({"error": traceback.format_exc()}))
            finally:
                done.set()

        loops[0].call_soon_threadsafe(run)  # the walk runs where the proxy's objects change: on its loop
        done.wait(600)
        os.kill(os.getpid(), signal.SIGTERM)  # the parent kills us if this does not end the proxy

    # The proxy's loop and its main coroutine (run_until_signalled(proxy, source)), caught at asyncio.run.
    loops: list[asyncio.AbstractEventLoop] = []
    real_run = asyncio.run

    def run_caught(coro: Any, **kwargs: Any) -> Any:
        async def caught() -> Any:
            loops.append(asyncio.get_running_loop())
            coros.append(coro)
            return await coro

        return real_run(caught(), **kwargs)

    asyncio.run = run_caught  # type: ignore[assignment]  # the proxy's own asyncio.run, caught
    threading.Thread(target=watch, daemon=True).start()
    from kubeproxy.cli import main as cli

    cli(["run", *argv], prog_name="kubeproxy")


# ---------------------------------------------------------------------------------------------
# The parent.


def _status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of `pid`, MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    fields = {line.split(":")[0]: line.split()[1] for line in text.splitlines() if line.startswith(("Vm", "Rss"))}
    return {k: int(fields[k]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile") if k in fields}


def _settled_status(pid: int, *, steady: int = 5, interval: float = 0.1, bound: float = 10.0) -> dict[str, float]:
    """`_status` once VmRSS has not moved for `steady` readings `interval` apart (at most `bound` s).

    The metrics page shows the first sync as soon as it is done, but the proxy settles its heap
    (gc.freeze, malloc_trim) just after: read at once, the RSS was sometimes the peak (VmRSS ==
    VmHWM), sometimes the settled value, depending on the machine's load.
    """
    last, same = _status(pid), 0
    deadline = time.monotonic() + bound
    while same < steady and time.monotonic() < deadline:
        time.sleep(interval)  # polling a value that has no event to await
        now = _status(pid)
        same = same + 1 if now["VmRSS"] == last["VmRSS"] else 0
        last = now
    return last


def baseline_rss(tree: Path) -> dict[str, float]:
    py = str(tree / ".venv" / "bin" / "python")
    probe = "import json,sys; print(json.dumps({{'rss': [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')][0] / 1024, 'mods': len(sys.modules)}}))"  # noqa: E501
    res = {}
    for name, code in (("python -c pass", ""), ("import kubeproxy.cli", "import kubeproxy.cli; ")):
        out = subprocess.run([py, "-c", code + probe.format()], cwd=tree, capture_output=True, text=True, check=True)
        d = json.loads(out.stdout)
        res[name], res[name + " modules"] = d["rss"], d["mods"]
    return res


def _argv(mode: str, objects: Path, kubeconfig: Path | None) -> list[str]:
    src = ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--manifests", str(objects)]
    bind = f"{METRICS[0]}:{METRICS[1]}"
    return [*src, "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8", "--iptables-variant", "legacy",
            "--healthz-bind-address", "", "--metrics-bind-address", bind, "--proxy-mode", mode]  # fmt: skip


class _Server:
    """bench/coldstart.py's test API server (--serve) in `ns`, loaded with `objects`."""

    def __init__(self, ns: Any, objects: Path, kubeconfig: Path) -> None:
        py = str(ROOT / ".venv" / "bin" / "python")
        self.proc = ns.popen([py, str(ROOT / "bench" / "coldstart.py"), "--serve", str(objects), str(kubeconfig), "fast"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the test API server did not start")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def rss_run(tree: Path, mode: str, objects: Path, source: str, tmp: Path, timeout: float) -> dict[str, float]:
    """RSS of a plain `kubeproxy run` of `tree` after its first sync."""
    from kubeproxy.lab import netns

    with netns.netns("kpmem") as ns:
        server = _Server(ns, objects, tmp / "kubeconfig") if source == "api" else None
        argv = [str(tree / ".venv" / "bin" / "python"), "-c", _ENTRY, "run",
                *_argv(mode, objects, tmp / "kubeconfig" if server else None)]  # fmt: skip
        proc = ns.popen(argv, cwd=tree, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        started = time.monotonic()
        try:
            poller = ns.popen([sys.executable, str(ROOT / "bench" / "coldstart.py"), "--poll",
                               f"http://{METRICS[0]}:{METRICS[1]}/metrics"], stdout=subprocess.PIPE, text=True)  # fmt: skip
            try:
                out = poller.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                poller.kill()
                raise SystemExit(f"{mode}: no first sync within {timeout:.0f} s") from None
            if "synced" not in out:
                raise SystemExit(f"{mode}: no first sync (exit status {proc.poll()})")
            res = _settled_status(proc.pid)  # `ip netns exec` execs the proxy in place: the pid is the proxy's
            res["synced s"] = time.monotonic() - started
            return res
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            if server:
                server.close()


def breakdown_run(mode: str, objects: Path, source: str, tmp: Path, timeout: float, how: str = "breakdown") -> dict[str, Any]:
    """The child's report: the tracemalloc breakdown, the RSS steps of _trim (untraced) or the steps' peaks."""
    from kubeproxy.lab import netns

    out = tmp / "breakdown.json"
    out.unlink(missing_ok=True)
    with netns.netns("kpmemt") as ns:
        server = _Server(ns, objects, tmp / "kubeconfig") if source == "api" else None
        flags = {"trim": ["--child-trim"], "peaks": ["-X", "tracemalloc=1", "--child-peaks"]}
        child_argv = flags.get(how, ["-X", "tracemalloc=10", "--child"])
        argv = [str(ROOT / ".venv" / "bin" / "python"), *child_argv[:-1], __file__, child_argv[-1], str(out),
                *_argv(mode, objects, tmp / "kubeconfig" if server else None)]  # fmt: skip
        proc = ns.popen(argv, cwd=ROOT, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            # The child renames its report into place when done; nothing to await across processes.
            while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if server:
                server.close()
    if not out.exists():
        raise SystemExit(f"{mode}: breakdown run wrote nothing (exit status {proc.returncode})")
    result: dict[str, Any] = json.loads(out.read_text())
    if "error" in result:
        raise SystemExit(f"{mode}: breakdown failed:\n{result['error']}")
    return result


def show_breakdown(mode: str, size: int, b: dict[str, Any], top: int) -> None:
    st = b["status"]
    print(f"\n## breakdown: {mode}, {size:,} services (under tracemalloc: RSS {st['VmRSS']:.0f} MiB, "
          f"HWM {st['VmHWM']:.0f} MiB; traced now {b['traced'] / MiB:.1f} MiB, traced peak {b['traced_peak'] / MiB:.1f} MiB; "
          f"{b['gc_objects']:,} gc-tracked objects, {b['modules']} modules)")  # fmt: skip
    print(f"{'traced MiB':>10}  by file (innermost kubeproxy frame) / package")
    for name, size_ in b["groups"][:top]:
        print(f"{size_ / MiB:>10.1f}  {name}")
    print(f"{'traced MiB':>10}  by line")
    for name, size_ in b["lines"][:top]:
        print(f"{size_ / MiB:>10.1f}  {name}")
    print(f"{'MiB':>10} {'objects':>10}  holder (getsizeof walk; each object with its first holder)")
    for name, size_, count in sorted(b["holders"], key=lambda h: -h[1]):
        if size_ >= MiB / 10:
            print(f"{size_ / MiB:>10.1f} {count:>10,}  {name}")
    loaded = ", ".join(f"{k} ({v})" for k, v in b["notable"].items() if v)
    missing = ", ".join(k for k, v in b["notable"].items() if not v)
    print(f"imported at first sync (modules): {loaded}\nnot imported: {missing}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        child(Path(sys.argv[2]), sys.argv[3:])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--child-peaks":
        sys.path.insert(0, str(ROOT))
        peak_rows = _watch_peaks()

        def peaks(out: Path) -> None:
            import tracemalloc

            part = out.with_suffix(".part")
            now, _peak = tracemalloc.get_traced_memory()
            part.write_text(json.dumps({"rows": peak_rows, "traced": now, "status": _status(os.getpid())}))
            part.rename(out)

        child(Path(sys.argv[2]), sys.argv[3:], peaks)
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--child-trim":
        sys.path.insert(0, str(ROOT))
        child(Path(sys.argv[2]), sys.argv[3:], _trim)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--modes", default="nftables,iptables")
    parser.add_argument("--source", choices=("manifests", "api"), default="manifests")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--baseline", type=Path, help="another tree (with .venv) to alternate with this one")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--peaks", action="store_true", help="also: traced peak of each step of the first read")
    parser.add_argument(
        "--trim", action="store_true", help="also: RSS around gc.collect / malloc_trim(0) / gc.freeze after the first sync"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from render import cluster  # bench/render.py's generator

    from kubeproxy.lab import netns

    if not netns.have_root():
        sys.exit("bench/memory.py needs root: it runs the proxy in a throwaway network namespace")
    trees = {"this": ROOT, **({"base": args.baseline.resolve()} if args.baseline else {})}
    print(f"median of {args.runs}; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"source {args.source}")  # fmt: skip
    for label, tree in trees.items():
        b = baseline_rss(tree)
        print(f"{label}: RSS python -c pass {b['python -c pass']:.1f} MiB ({b['python -c pass modules']:.0f} modules);"
              f" import kubeproxy.cli {b['import kubeproxy.cli']:.1f} MiB"
              f" ({b['import kubeproxy.cli modules']:.0f} modules)")  # fmt: skip
    breakdowns = []
    with tempfile.TemporaryDirectory(prefix="kp-mem-") as tmp_name:
        tmp = Path(tmp_name)
        header = (f"{'tree':<5} {'mode':<9} {'services':>8} | {'RSS MiB':>7} {'HWM MiB':>7} {'anon MiB':>8}"
                  f" {'file MiB':>8} {'synced s':>8}")  # fmt: skip
        print(header)
        print("-" * len(header))
        rows: dict[tuple[str, int], dict[str, float]] = {}
        for size in (int(s) for s in args.sizes.split(",")):
            objects = tmp / "objects.json"
            objs = cluster(size, args.endpoints)
            objects.write_text(json.dumps(objs if args.source == "api" else {"kind": "List", "items": objs}))
            for mode in args.modes.split(","):
                runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
                for _ in range(args.runs):
                    for label, tree in trees.items():  # alternate the trees: the machine's noise hits both
                        runs[label].append(rss_run(tree, mode, objects, args.source, tmp, args.timeout))
                for label in trees:
                    med = {k: statistics.median(r[k] for r in runs[label]) for k in runs[label][0]}
                    rows[(label, size)] = med
                    print(f"{label:<5} {mode:<9} {size:>8,} | {med['VmRSS']:>7.1f} {med['VmHWM']:>7.1f}"
                          f" {med.get('RssAnon', 0):>8.1f} {med.get('RssFile', 0):>8.1f} {med['synced s']:>8.2f}",
                          flush=True)  # fmt: skip
                if "base" in trees:
                    ratio = rows[("this", size)]["VmRSS"] / rows[("base", size)]["VmRSS"]
                    print(f"{'':<25} | ratio this/base RSS {ratio:.2f}")
                if args.trim:
                    t = breakdown_run(mode, objects, args.source, tmp, args.timeout, how="trim")
                    print(f"  trim, {mode} {size:,} (proxy had frozen {t['frozen_by_proxy']:,} objects):")
                    for step, st in t["steps"]:
                        print(f"    {st['VmRSS']:>7.1f} MiB RSS {st.get('RssAnon', 0):>7.1f} anon  {step}", flush=True)
                    pm = t.get("pymalloc")
                    if pm:
                        print(f"    pymalloc: {pm['arenas']} arenas of 1 MiB, {pm['used'] / MiB:.1f} MiB in live blocks,"
                              f" {pm['free'] / MiB:.1f} MiB free in partly used pools")  # fmt: skip
                if args.peaks:
                    pk = breakdown_run(mode, objects, args.source, tmp, args.timeout, how="peaks")
                    print(
                        f"  traced peaks of the first read's steps, {mode} {size:,} (MiB; highest call of each;"
                        f" at the first sync: traced {pk['traced'] / MiB:.1f}, RSS {pk['status']['VmRSS']:.0f}):"
                    )
                    print(f"    {'calls':>5} {'entry':>7} {'peak':>7} {'+peak':>7} {'exit':>7}  step")
                    for _, _, step in _STEPS:
                        if step in pk["rows"]:
                            c, e, pe, x = pk["rows"][step]
                            print(
                                f"    {c:>5.0f} {e / MiB:>7.1f} {pe / MiB:>7.1f} {(pe - e) / MiB:>7.1f} {x / MiB:>7.1f}  {step}"
                            )
                if not args.no_breakdown:
                    breakdowns.append((mode, size, breakdown_run(mode, objects, args.source, tmp, args.timeout)))
    for mode, size, b in breakdowns:
        show_breakdown(mode, size, b, args.top)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
