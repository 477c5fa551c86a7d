"""The lab's agents: small processes that run inside a namespace and report JSON lines.

    python -m kubeproxy.lab.dns.monitor health    --server IP:PORT --start T0 [--interval 1] [--queries 100] [--timeout 1]
    python -m kubeproxy.lab.dns.monitor conntrack --start T0 [--interval 1]
    python -m kubeproxy.lab.dns.monitor load      --server IP:PORT --start T0 --rate R --duration D [--source-ips CIDR]

The lab (kubeproxy.lab.dns.lab) starts them with `ip netns exec`: the health check and the load in
the client, the conntrack sampler in the node. All of them work on one timeline, the wall clock,
from T0 (a `time.time()` the lab chose a little ahead, so that every agent is up by then).

`health` and `conntrack` act at T0, T0 + interval, ... and print one line per act, until the lab
writes `stop T` on their standard input (then they finish the acts due before T and exit) or
closes it (they exit at once: the lab is gone, nothing must outlive it). `load` waits for T0,
runs `kubeproxy.lab.dns.load` once and prints one line: the report and the wall-clock time its
schedule started.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import click

from kubeproxy.lab.dns.check import run_check
from kubeproxy.lab.dns.dns_message import make_query
from kubeproxy.lab.dns.endpoints import family_of, parse_server, source_addresses
from kubeproxy.lab.dns.load import LoadPlan, run_load

_COUNT = Path("/proc/sys/net/netfilter/nf_conntrack_count")
_STATS = Path("/proc/net/stat/nf_conntrack")
_STAT_FIELDS = ("insert_failed", "drop", "early_drop")


class Control:
    """The lab's word on standard input: `stop T` (finish what is due before T) or EOF (stop now)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.until = math.inf
        self.gone = False

    def sleep_until(self, when: float) -> None:
        """Sleep until wall-clock `when`, reading the lab's words meanwhile."""
        while not self.gone:
            wait = when - time.time()
            if wait <= 0:
                return
            ready, _, _ = select.select([self.stream], [], [], wait)
            if ready:
                self._read()

    def poll(self) -> None:
        ready, _, _ = select.select([self.stream], [], [], 0)
        if ready:
            self._read()

    def _read(self) -> None:
        line = self.stream.readline()
        if not line:
            self.gone = True
        elif line.startswith("stop "):
            self.until = float(line.split()[1])

    def go_on(self, slot: float) -> bool:
        return not self.gone and slot < self.until


_EMIT = threading.Lock()


def _emit(out: TextIO, record: dict[str, Any]) -> None:
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with _EMIT:
        out.write(line)
        out.flush()


def every(start: float, interval: float, control: Control, act: Any, out: TextIO, *, overlap: bool = False) -> None:
    """Call `act(slot)` at start, start + interval, ... until told to stop; print each result as a line.

    With `overlap`, each act runs in a thread of its own, so an act that takes longer than the
    interval (a failing health check waits its whole timeout) does not push the next one off its
    slot. Without, a slot missed while acting is skipped, not made up: the series stays on its grid.
    """
    running: list[threading.Thread] = []

    def one(slot: float) -> None:
        _emit(out, {"t": round(slot - start, 6), **act(slot)})

    k = 0
    while True:
        slot = start + k * interval
        control.sleep_until(slot)
        control.poll()
        if not control.go_on(slot):
            break
        if overlap:
            thread = threading.Thread(target=one, args=(slot,), daemon=True)
            thread.start()
            running = [t for t in running if t.is_alive()] + [thread]
            k += 1
        else:
            one(slot)
            k = max(k + 1, math.floor((time.time() - start) / interval) + 1)
    if not control.gone:
        for thread in running:
            thread.join()


@dataclass(frozen=True)
class Target:
    """What the health and load agents query."""

    server: str
    name: str
    timeout: float


def health(target: Target, start: float, interval: float, queries: int, control: Control, out: TextIO) -> None:
    server = parse_server(target.server)
    query = make_query(target.name)

    def check(slot: float) -> dict[str, Any]:
        started = time.time()
        result = run_check(server, query, queries=queries, timeout=target.timeout)
        latency = result.latency
        return {
            "started": round(started, 6),
            "queries": len(result.outcomes),
            "answered": result.answered,
            "healthy": result.healthy,
            "failures": dict(result.failures()),
            "p50_ms": round(latency.p50 * 1e3, 3) if latency else None,
            "max_ms": round(latency.max * 1e3, 3) if latency else None,
        }

    every(start, interval, control, check, out, overlap=True)


def read_conntrack() -> dict[str, int]:
    """This namespace's conntrack entry count and its drop counters (summed over CPUs)."""
    record = {"count": int(_COUNT.read_text())}
    try:
        lines = _STATS.read_text().split("\n")
    except OSError:
        return record
    header = lines[0].split()
    sums = dict.fromkeys(_STAT_FIELDS, 0)
    for line in lines[1:]:
        values = line.split()
        if len(values) != len(header):
            continue
        for name in _STAT_FIELDS:
            if name in header:
                sums[name] += int(values[header.index(name)], 16)
    record.update(sums)
    return record


def conntrack(start: float, interval: float, control: Control, out: TextIO) -> None:
    every(start, interval, control, lambda slot: read_conntrack(), out)


def load(
    target: Target, start: float, rate: float, duration: float, source_ips: str | None, workers: int, out: TextIO
) -> None:
    server = parse_server(target.server)
    sources = source_addresses(source_ips, family_of(server[0])) if source_ips else ()
    plan = LoadPlan(server, make_query(target.name), rate, duration, timeout=target.timeout,
                    workers=workers, sources=sources)  # fmt: skip
    wait = start - time.time()
    if wait > 0:
        time.sleep(wait)
    report = run_load(plan)
    # run_load's schedule starts at its own monotonic t0 and `wall` runs from there to the end.
    t0 = time.time() - report.wall
    _emit(out, {"t0": round(t0, 6), "report": report.to_json()})


def _stop_on_sigterm() -> None:
    # The lab stops agents with SIGTERM when it is interrupted: unwind (the load's workers are killed
    # in its finally) instead of dying where we stand.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


START = click.option("--start", type=float, required=True, help="T0, wall-clock seconds (time.time()).")
INTERVAL = click.option("--interval", type=float, default=1.0, show_default=True)


def _target(f: Callable[..., None]) -> Callable[..., None]:
    f = click.option("--timeout", type=float, default=1.0, show_default=True)(f)
    f = click.option("--name", default="www.lab.test.", show_default=True)(f)
    return click.option("--server", required=True)(f)


@click.group(name="python -m kubeproxy.lab.dns.monitor", help=__doc__.split("\n\n")[0])
def main() -> None:
    _stop_on_sigterm()


@main.command(name="health")
@START
@_target
@INTERVAL
@click.option("--queries", type=int, default=100, show_default=True)
def health_command(start: float, server: str, name: str, timeout: float, interval: float, queries: int) -> None:
    health(Target(server, name, timeout), start, interval, queries, Control(sys.stdin), sys.stdout)


@main.command(name="conntrack")
@START
@INTERVAL
def conntrack_command(start: float, interval: float) -> None:
    conntrack(start, interval, Control(sys.stdin), sys.stdout)


@main.command(name="load")
@START
@_target
@click.option("--rate", type=float, required=True)
@click.option("--duration", type=float, required=True)
@click.option("--source-ips")
@click.option("--workers", type=int, default=1, show_default=True)
def load_command(
    start: float, server: str, name: str, timeout: float, rate: float, duration: float, source_ips: str | None,
    workers: int,
) -> None:
    load(Target(server, name, timeout), start, rate, duration, source_ips, workers, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the lab went away mid-line
        os._exit(1)
