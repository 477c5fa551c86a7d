"""How fast does `kubeproxy dns load` send? Target rate vs achieved, against the lab responder.

    .venv/bin/python bench/dns_load.py [--rates 5000,10000,20000,30000] [--duration 3s]
        [--workers N] [--responder-processes 1]

As root the responder and the generator run in a fresh network namespace (its own loopback, no
conntrack or rules of the host); otherwise on the host's loopback. Each rate is one run of the
real CLI (`python -m kubeproxy.lab.dns load ... --json -`), a fresh socket per query. Columns:

    target/s     the schedule;  sent/s  what left (sent / duration);  answered %  of those sent
    unsent       queries the generator could not send before the run ended (it fell behind)
    late %       sent more than 1 ms after their scheduled time
    p50/p99 ms   answer latency (kernel receive timestamp - send);  late p99  lateness of sends
    gen us/q, resp us/q   CPU time (user+sys) per query of the generator's sending loops and of the responder
    busy %       the whole machine's CPU use during the run (other work on the box shows here)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubeproxy.lab import netns
from kubeproxy.model.proxy_config import parse_duration

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live children (the responder's SO_REUSEPORT forks)."""
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def _machine_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@contextmanager
def _bed(processes: int) -> Iterator[tuple[list[str], subprocess.Popen[str], str]]:
    """(argv prefix to run commands in the bed, the responder, the server address)."""
    responder_argv = [sys.executable, "-m", "kubeproxy.lab.dns.responder", "--processes", str(processes)]
    if netns.have_root():
        with netns.netns("kpb") as ns:
            proc = ns.popen([*responder_argv, "--listen", "127.0.0.1:53"], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            ready = proc.stdout.readline().split()
            yield ns.argv([]), proc, ready[1]
        return
    proc = subprocess.Popen([*responder_argv, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        yield [], proc, ready[1]
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="5000,10000,20000,30000")
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--workers", type=int, help="generator processes (default: the CLI's choice)")
    ap.add_argument("--responder-processes", type=int, default=1)
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    duration = parse_duration(args.duration)

    with _bed(args.responder_processes) as (prefix, responder, server):
        where = "a fresh namespace" if prefix else "the host's loopback"
        print(f"generator and responder ({args.responder_processes} process) in {where}, {os.cpu_count()} CPUs, "
              f"{args.duration} per rate, server {server}")  # fmt: skip
        header = (
            f"{'target/s':>9} {'workers':>7} {'sent/s':>9} {'answered':>9} {'lost':>6} {'unsent':>7} {'late %':>7}"
            f" {'p50 ms':>7} {'p99 ms':>7} {'late p99':>9} {'gen us/q':>8} {'resp us/q':>9} {'busy %':>6} {'load1':>5}"
        )
        print(header)
        for rate in rates:
            cmd = [*prefix, sys.executable, "-m", "kubeproxy.lab.dns", "load", "--server", server,
                   "--rate", f"{rate:g}", "--duration", args.duration, "--json", "-"]  # fmt: skip
            if args.workers:
                cmd += ["--workers", str(args.workers)]
            load1 = os.getloadavg()[0]
            before_resp = _cpu_seconds(responder.pid)
            busy0, total0 = _machine_busy()
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 3 + 60, check=False)
            busy1, total1 = _machine_busy()
            resp_cpu = _cpu_seconds(responder.pid) - before_resp
            if run.returncode != 0:
                print(f"{rate:>9g} failed (exit {run.returncode}): {run.stderr.strip()[-300:]}")
                continue
            data = json.loads(run.stdout)
            t, plan = data["totals"], data["plan"]
            gen_cpu = t["sender_cpu_seconds"]
            sent = max(1, t["sent"])
            lat, lateness = t["latency_ms"] or {}, t["lateness_ms"] or {}
            print(
                f"{rate:>9g} {plan['workers']:>7} {t['achieved_rate']:>9.0f} {100 * t['answered'] / sent:>8.2f}%"
                f" {t['lost']:>6} {t['unsent']:>7} {100 * t['late'] / sent:>7.2f}"
                f" {lat.get('p50', float('nan')):>7.3f} {lat.get('p99', float('nan')):>7.3f}"
                f" {lateness.get('p99', float('nan')):>9.3f} {gen_cpu / sent * 1e6:>8.1f} {resp_cpu / sent * 1e6:>9.1f}"
                f" {100 * (busy1 - busy0) / max(1, total1 - total0):>6.0f} {load1:>5.2f}",
                flush=True,
            )
            time.sleep(1)  # let the responder drain and the sockets' ports go before the next rate


if __name__ == "__main__":
    main()
