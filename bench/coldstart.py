#!/usr/bin/env python3
"""Cold start of `kubeproxy run` against the test API server: process start to rules in the kernel.

Usage: .venv/bin/python bench/coldstart.py [--sizes 1000,10000] [--endpoints 10] [--runs 3]
                                           [--modes nftables,iptables] [--timeout 300]

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
   In nftables mode the transactions go through libnftables inside the proxy process
   (backends/libnft.py), so no `nft` process runs: its kernel time is counted in "ours".

Phases (times from the fork, CLOCK_MONOTONIC, which every process of the machine shares):
  up       the metrics page answers (interpreter start-up, imports, flags, start-up checks)
  synced   the first sync is done (list + decode + view + render + kernel tools)
Each cell is the median of --runs runs (a fresh namespace and API server each).
"""

from __future__ import annotations

import argparse
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


def serve(objects: Path, kubeconfig: Path) -> None:
    """--serve: run the API server with `objects` loaded, print "ready", stop when stdin closes."""
    from kubeproxy.lab.apiserver import ApiServer

    with ApiServer(history_size=1000) as server:
        for obj in json.loads(objects.read_text()):
            server.apply(obj)
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


def one(mode: str, objects: Path, tmp: Path, timeout: float) -> dict[str, float]:
    log = tmp / "tools.log"
    log.unlink(missing_ok=True)
    env = wrappers(tmp / "bin", log)
    kubeconfig = tmp / "kubeconfig"
    python = str(ROOT / ".venv" / "bin" / "python")
    with netns.netns("kpcold") as ns:
        server = ns.popen([python, __file__, "--serve", str(objects), str(kubeconfig)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None and server.stdin is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the test API server did not start")
        argv = [str(ROOT / ".venv" / "bin" / "kubeproxy"), "run", "--kubeconfig", str(kubeconfig),
                "--hostname-override", "node-0", "--cluster-cidr", "10.0.0.0/8", "--proxy-mode", mode,
                "--healthz-bind-address", "", "--metrics-bind-address", METRICS]  # fmt: skip
        if mode == "iptables":
            argv += ["--iptables-variant", "legacy"]
        poller = ns.popen([python, __file__, "--poll", f"http://{METRICS}/metrics"], stdout=subprocess.PIPE, text=True)
        assert poller.stdout is not None
        if poller.stdout.readline().strip() != "polling":
            raise SystemExit("the metrics poller did not start")
        start = time.monotonic()
        proxy = ns.popen(argv, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, text=True)
        marks: dict[str, float] = {}
        try:
            poller.wait(timeout=timeout)
            for line in poller.stdout:
                what, when = line.split()
                marks[what] = float(when) - (0 if what == "wallclock" else start)
            if "synced" not in marks:
                raise SystemExit(f"{mode}: no first sync (exit status {proxy.poll()})")
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{mode}: no first sync within {timeout:.0f} s") from None
        finally:
            poller.kill()
            proxy.terminate()
            proxy.wait(timeout=30)
            server.stdin.close()
            server.wait(timeout=30)
    # The kernel tools that finished before the first sync was reported (not the cleanup after it).
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    synced_ns = marks.pop("wallclock") * 1e9
    tools = sum(int(ns_) for _, ns_, end in calls if int(end) <= synced_ns) / 1e9
    return {**marks, "tools": tools}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]), Path(sys.argv[3]))
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
    args = parser.parse_args()
    if not netns.have_root():
        sys.exit("bench/coldstart.py needs root: it runs the proxy in a throwaway network namespace")
    from render import cluster  # bench/render.py's generator

    print(f"median of {args.runs} runs; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    header = (f"{'mode':<9} {'services':>8} | {'up s':>7} {'synced s':>8} |"
              f" {'kernel tools s':>14} {'ours s':>7} {'ours/tools':>10}")  # fmt: skip
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="kp-cold-") as tmp_name:
        tmp = Path(tmp_name)
        for size in (int(s) for s in args.sizes.split(",")):
            objects = tmp / "objects.json"
            objects.write_text(json.dumps(cluster(size, args.endpoints)))
            for mode in args.modes.split(","):
                runs = [one(mode, objects, tmp, args.timeout) for _ in range(args.runs)]

                def med(key: str, runs: list[dict[str, float]] = runs) -> float:
                    return statistics.median(r[key] for r in runs)

                total, tools = med("synced"), med("tools")
                ours = statistics.median(r["synced"] - r["tools"] for r in runs)
                print(
                    f"{mode:<9} {size:>8,} | {med('up'):>7.2f} {total:>8.2f} | {tools:>14.2f} {ours:>7.2f}"
                    f" {ours / tools if tools else float('inf'):>10.2f}",
                    flush=True,
                )
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
