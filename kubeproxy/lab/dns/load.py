"""An open-loop DNS load generator that looks like many real resolvers.

Query i of the run is due at t0 + i/rate, whatever happened to the queries before it (open loop):
a slow server makes answers late or lost, never the sending slower. When the sender itself falls
behind, it sends what is due at once and records how late each query left (`late` counts those
more than `late_after` behind); what is still unsent when the run's time is up is counted as
`unsent`, not quietly sent afterwards, so the achieved rate is sent / duration.

Every query gets a new UDP socket (so an ephemeral source port the kernel picks at random and,
through a masquerading node, a new conntrack entry unless that port's tuple is still remembered
there, as with real clients) that is closed after its answer or its timeout. With `sources`,
query i is bound to sources[i % len(sources)], as if from many clients. The query bytes are built
once; each query gets its own random ID and is matched on ID and question.

Speed: `workers` processes (fresh interpreters, started together on one monotonic t0) each own
every workers-th query of one schedule. A worker is one loop over non-blocking sockets: `sendto`
on a fresh socket, register it with epoll, read answers with `recvmsg`, close. The loop sleeps
at least a tick (200 us) between rounds, so at high rates each wake-up sends and reads several
queries; latency does not suffer from reading late because every answer carries the kernel's
receive timestamp (SO_TIMESTAMPNS), measured against the wall-clock time taken just before the
send. Timeouts leave from a FIFO (one timeout for all, so deadlines come in send order).

Sender-side limits: a socket per query in flight holds a port and a file descriptor. In flight is
rate × latency when answered, up to rate × timeout when not. UDP sockets bound to distinct
addresses may share a port number, so the port budget is the ephemeral range (28,232 by default)
per source address; without sources all queries share one range. SO_REUSEADDR is deliberately
not set: it would let two live queries share a port, and answers could land on the wrong socket.
Instead the plan warns when the run could exceed the budget, sends that still fail (EAGAIN,
EADDRINUSE, EMFILE) are counted as `errors` by errno, and the open-files limit is raised to what
the plan needs.
"""

from __future__ import annotations

import _socket
import contextlib
import gc
import math
import pickle
import random
import select
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kubeproxy.lab.dns.dns_message import Query, rcode_name, response_rcode
from kubeproxy.lab.dns.endpoints import family_of, format_hostport
from kubeproxy.lab.dns.limits import ensure_open_files, ephemeral_ports
from kubeproxy.lab.dns.sockets import errno_name, query_socket, recv_stamped
from kubeproxy.lab.dns.stats import Summary, format_duration

_BURST = 64  # sends before the loop reads answers again, when catching up
_START_MARGIN = 0.05  # seconds between "everyone ready" and t0


class LoadError(RuntimeError):
    """The run could not be carried out (a worker failed); the message says why."""


@dataclass(frozen=True)
class LoadPlan:
    server: tuple[str, int]
    query: Query
    rate: float  # queries per second, all workers together
    duration: float  # seconds
    timeout: float = 1.0
    late_after: float = 0.001
    tick: float = 0.0002  # shortest sleep of a worker's loop
    workers: int = 1
    sources: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def total(self) -> int:
        return int(self.rate * self.duration + 1e-9)

    @property
    def seconds(self) -> int:
        return max(1, math.ceil(self.duration - 1e-9))

    def port_budget(self) -> int:
        return ephemeral_ports() * max(1, len(self.sources))

    def warnings(self) -> list[str]:
        """What could make the sender, not the server, lose queries."""
        worst = min(math.ceil(self.rate * self.timeout), self.total)
        out = []
        if worst > self.port_budget():
            where = f"{len(self.sources)} source addresses" if self.sources else "one source address"
            out.append(
                f"at {self.rate:g}/s with a {format_duration(self.timeout)} timeout up to {worst} queries are in flight "
                f"when the server stops answering, more than the {self.port_budget()} ephemeral ports of {where}: "
                "sends would fail (EAGAIN, or EADDRINUSE when bound to a source address); "
                "lower --timeout or add --source-ips"
            )
        return out


@dataclass
class Tally:
    """Counts per scheduled second (index = second of the schedule the query belongs to)."""

    sent: list[int]
    answered: list[int]
    lost: list[int]  # sent, not answered within the timeout
    errors: list[int]  # could not be sent (the sender ran out of ports or files)
    unsent: list[int]  # never sent: the sender was too far behind when the run ended
    late: list[int]
    latency: list[array[float]]
    lateness: list[array[float]]
    reasons: Counter[str] = field(default_factory=Counter)  # "timeout", "refused", errno names
    rcodes: Counter[int] = field(default_factory=Counter)
    mismatched: int = 0
    max_inflight: int = 0
    cpu_seconds: float = 0.0  # the sending loops' own CPU time (user + system), without start-up

    @classmethod
    def empty(cls, seconds: int) -> Tally:
        def zeros() -> list[int]:
            return [0] * seconds

        return cls(
            zeros(), zeros(), zeros(), zeros(), zeros(), zeros(),
            [array("d") for _ in range(seconds)], [array("d") for _ in range(seconds)],
        )  # fmt: skip

    def merge(self, other: Tally) -> None:
        for mine, theirs in (
            (self.sent, other.sent), (self.answered, other.answered), (self.lost, other.lost),
            (self.errors, other.errors), (self.unsent, other.unsent), (self.late, other.late),
        ):  # fmt: skip
            for s, value in enumerate(theirs):
                mine[s] += value
        for s in range(len(self.latency)):
            self.latency[s].extend(other.latency[s])
            self.lateness[s].extend(other.lateness[s])
        self.reasons.update(other.reasons)
        self.rcodes.update(other.rcodes)
        self.mismatched += other.mismatched
        self.max_inflight += other.max_inflight  # workers peak at about the same time; an upper bound
        self.cpu_seconds += other.cpu_seconds


def run_schedule(plan: LoadPlan, index: int, t0: float) -> Tally:
    """Worker `index`'s share of the schedule: queries index, index+workers, ... Returns its tally."""
    rate, stride, total = plan.rate, plan.workers, plan.total
    mine = len(range(index, total, stride))
    tally = Tally.empty(plan.seconds)
    sent, answered, lost, late = tally.sent, tally.answered, tally.lost, tally.late
    latency, lateness, reasons, rcodes = tally.latency, tally.lateness, tally.reasons, tally.rcodes
    ids = random.Random(None if plan.seed is None else plan.seed * 1000 + index).randbytes(2 * mine)
    tail, question = plan.query.tail, plan.query.question
    sources, nsources = plan.sources, len(plan.sources)
    server, family = plan.server, family_of(plan.server[0])
    timeout, late_after, tick = plan.timeout, plan.late_after, plan.tick
    cutoff = t0 + plan.duration + late_after
    ensure_open_files(int(rate / stride * timeout * 1.25) + 256)

    epoll = select.epoll()
    register, poll, epollin = epoll.register, epoll.poll, select.EPOLLIN
    clock, wallclock, sleep = time.monotonic, time.time, time.sleep
    inflight: dict[int, tuple[_socket.socket, int, float, int]] = {}  # fd -> (socket, j, sent at (wall), second)
    expiry: deque[tuple[float, int, int]] = deque()  # (deadline, fd, j) in send order
    j = 0
    due = t0 + index / rate
    # The loop allocates a few tuples per query; generational GC passes over them are pure overhead here.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    cpu_start = time.process_time()
    try:
        while True:
            now = clock()
            if j < mine and now > cutoff:
                for jj in range(j, mine):
                    tally.unsent[min(int((index + jj * stride) / rate), plan.seconds - 1)] += 1
                j = mine
            burst = 0
            while j < mine and due <= now and burst < _BURST:
                i = index + j * stride
                second = int(i / rate)
                sock = None
                try:
                    sock = query_socket(family)
                    if nsources:
                        sock.bind((sources[i % nsources], 0))
                    packet = ids[2 * j : 2 * j + 2] + tail
                    # Stamped before the send: on loopback the answer can arrive before sendto() returns.
                    t, sent_at = clock(), wallclock()
                    sock.sendto(packet, server)
                except OSError as exc:
                    if sock is not None:
                        sock.close()
                    tally.errors[second] += 1
                    reasons[errno_name(exc)] += 1
                else:
                    fd = sock.fileno()
                    register(fd, epollin)
                    inflight[fd] = (sock, j, sent_at, second)
                    expiry.append((t + timeout, fd, j))
                    sent[second] += 1
                    behind = t - due
                    lateness[second].append(behind)
                    if behind > late_after:
                        late[second] += 1
                j += 1
                burst += 1
                due = t0 + (index + j * stride) / rate
            if len(inflight) > tally.max_inflight:
                tally.max_inflight = len(inflight)
            for fd, _mask in poll(0):
                entry = inflight.pop(fd, None)
                if entry is None:
                    continue
                sock, jj, sent_at, second = entry
                try:
                    data, arrived = recv_stamped(sock)
                except BlockingIOError:
                    inflight[fd] = entry
                    continue
                except OSError as exc:
                    sock.close()
                    lost[second] += 1
                    reasons[errno_name(exc)] += 1
                    continue
                rcode = response_rcode(data, ids[2 * jj : 2 * jj + 2], question)
                if rcode is None:
                    # Not our answer (another ID or question): keep waiting, as a resolver would.
                    tally.mismatched += 1
                    inflight[fd] = entry
                    continue
                sock.close()
                took = (arrived or wallclock()) - sent_at
                if took > timeout:
                    lost[second] += 1
                    reasons["answered after timeout"] += 1
                    continue
                answered[second] += 1
                latency[second].append(took)
                rcodes[rcode] += 1
            now = clock()
            while expiry and expiry[0][0] <= now:
                _, fd, jj = expiry.popleft()
                entry = inflight.get(fd)
                if entry is not None and entry[1] == jj:
                    del inflight[fd]
                    entry[0].close()
                    lost[entry[3]] += 1
                    reasons["timeout"] += 1
            if j >= mine and not inflight:
                break
            if j < mine and due <= now:
                continue  # behind schedule: send on, no sleep
            # Wake for the next send or deadline, but not more often than every tick: answers carry
            # kernel receive timestamps, so reading them a little later does not change their latency.
            wake = due if j < mine else math.inf
            if expiry and expiry[0][0] < wake:
                wake = expiry[0][0]
            sleep(max(wake - now, tick))
    finally:
        for sock, *_ in inflight.values():
            sock.close()
        epoll.close()
        if gc_was_enabled:
            gc.enable()
        tally.cpu_seconds = time.process_time() - cpu_start
    return tally


@dataclass(frozen=True)
class SecondReport:
    second: int
    sent: int
    answered: int
    lost: int
    errors: int
    unsent: int
    late: int
    latency: Summary | None
    lateness: Summary | None

    def to_json(self) -> dict[str, Any]:
        return {
            "second": self.second,
            "sent": self.sent,
            "answered": self.answered,
            "lost": self.lost,
            "errors": self.errors,
            "unsent": self.unsent,
            "late": self.late,
            "latency_ms": self.latency.to_ms() if self.latency else None,
            "lateness_ms": self.lateness.to_ms() if self.lateness else None,
        }


@dataclass(frozen=True)
class LoadReport:
    plan: LoadPlan
    tally: Tally
    wall: float  # seconds from t0 until the last answer or timeout

    def per_second(self) -> list[SecondReport]:
        t = self.tally
        counts = zip(t.sent, t.answered, t.lost, t.errors, t.unsent, t.late, strict=True)
        return [
            SecondReport(s, sent, answered, lost, errors, unsent, late, Summary.of(t.latency[s]), Summary.of(t.lateness[s]))
            for s, (sent, answered, lost, errors, unsent, late) in enumerate(counts)
        ]

    @property
    def sent(self) -> int:
        return sum(self.tally.sent)

    @property
    def answered(self) -> int:
        return sum(self.tally.answered)

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.plan.duration

    def latency(self) -> Summary | None:
        return Summary.of(v for s in self.tally.latency for v in s)

    def lateness(self) -> Summary | None:
        return Summary.of(v for s in self.tally.lateness for v in s)

    def totals(self) -> dict[str, Any]:
        t = self.tally
        latency, lateness = self.latency(), self.lateness()
        return {
            "scheduled": self.plan.total,
            "sent": self.sent,
            "answered": self.answered,
            "lost": sum(t.lost),
            "errors": sum(t.errors),
            "unsent": sum(t.unsent),
            "late": sum(t.late),
            "mismatched": t.mismatched,
            "reasons": dict(sorted(t.reasons.items())),
            "rcodes": {rcode_name(k): v for k, v in sorted(t.rcodes.items())},
            "target_rate": self.plan.rate,
            "achieved_rate": round(self.achieved_rate, 1),
            "answered_rate": round(self.answered / self.plan.duration, 1),
            "max_inflight": t.max_inflight,
            "sender_cpu_seconds": round(t.cpu_seconds, 3),
            "latency_ms": latency.to_ms() if latency else None,
            "lateness_ms": lateness.to_ms() if lateness else None,
            "wall_seconds": round(self.wall, 3),
        }

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {
            "plan": {
                "server": format_hostport(*p.server),
                "name": p.query.name,
                "type": p.query.describe().split()[-1],
                "rate": p.rate,
                "duration_seconds": p.duration,
                "timeout_seconds": p.timeout,
                "late_after_seconds": p.late_after,
                "workers": p.workers,
                "source_addresses": len(p.sources),
                "first_source": p.sources[0] if p.sources else None,
            },
            "seconds": [s.to_json() for s in self.per_second()],
            "totals": self.totals(),
        }


def run_load(plan: LoadPlan, progress: Callable[[str], None] | None = None) -> LoadReport:
    """Carry out the plan: in this process for one worker, else in worker processes started together.

    progress: called about once a second with a `\r`-led line saying how far the run is, and with
    a newline at the end (for a terminal; the per-second counts come in the report).
    """
    with _progress_lines(plan, progress):
        return _run_load(plan)


@contextlib.contextmanager
def _progress_lines(plan: LoadPlan, progress: Callable[[str], None] | None) -> Iterator[None]:
    if progress is None:
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(1.0):
            elapsed = min(time.monotonic() - started, plan.duration + plan.timeout)
            progress(f"\rdns load: {elapsed:4.0f} s of {plan.duration + plan.timeout:g} s ({plan.rate:g}/s)")

    ticker = threading.Thread(target=tick, name="dns-load-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        progress("\n")


def _run_load(plan: LoadPlan) -> LoadReport:
    if plan.workers <= 1:
        t0 = time.monotonic() + _START_MARGIN
        tally = run_schedule(plan, 0, t0)
        return LoadReport(plan, tally, time.monotonic() - t0)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(plan.workers):
            # A fresh interpreter per worker (not multiprocessing): nothing of the caller's __main__
            # or threads is carried over, whoever calls us.
            proc = subprocess.Popen(
                [sys.executable, "-m", "kubeproxy.lab.dns.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            procs.append(proc)
            assert proc.stdin is not None
            pickle.dump((plan, index), proc.stdin)
            proc.stdin.flush()
        for index, proc in enumerate(procs):
            assert proc.stdout is not None
            if proc.stdout.readline() != b"ready\n":
                raise LoadError(f"worker {index} did not start (exit status {proc.wait(timeout=10)})")
        t0 = time.monotonic() + _START_MARGIN
        for proc in procs:
            assert proc.stdin is not None
            pickle.dump(t0, proc.stdin)
            proc.stdin.close()
        merged = Tally.empty(plan.seconds)
        for index, proc in enumerate(procs):
            assert proc.stdout is not None
            try:
                status, payload = pickle.load(proc.stdout)
            except (EOFError, pickle.UnpicklingError):
                raise LoadError(f"worker {index} exited without a report (exit status {proc.wait(timeout=10)})") from None
            if status != "ok":
                raise LoadError(f"worker {index}: {payload}")
            merged.merge(payload)
        wall = time.monotonic() - t0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
    return LoadReport(plan, merged, wall)


def worker_stdio(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The worker process's side: plan and index in, `ready`, t0 in, ("ok", tally) or ("error", text) out."""
    plan, index = pickle.load(stdin)
    stdout.write(b"ready\n")
    stdout.flush()
    t0 = pickle.load(stdin)
    try:
        reply: tuple[str, object] = ("ok", run_schedule(plan, index, t0))
    except Exception as exc:  # reported to the parent, which names the worker
        reply = ("error", f"{type(exc).__name__}: {exc}")
    pickle.dump(reply, stdout)
    stdout.flush()


def _ms(summary: Summary | None, key: str) -> str:
    return f"{getattr(summary, key) * 1e3:.3f}" if summary else "-"


def format_report(report: LoadReport) -> str:
    p = report.plan
    src = f", {len(p.sources)} source addresses from {p.sources[0]}" if p.sources else ""
    lines = [
        f"dns load {format_hostport(*p.server)}: {p.query.describe()} at {p.rate:g}/s for {format_duration(p.duration)}, "
        f"{p.workers} worker{'s' if p.workers != 1 else ''}, a fresh socket per query{src}, "
        f"timeout {format_duration(p.timeout)}, late after {format_duration(p.late_after)}",
        f"{'second':>6} {'sent':>7} {'answered':>8} {'lost':>6} {'errors':>6} {'unsent':>6} {'late':>6}"
        f" {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'late p99':>8}",
    ]
    for s in report.per_second():
        lines.append(
            f"{s.second:>6} {s.sent:>7} {s.answered:>8} {s.lost:>6} {s.errors:>6} {s.unsent:>6} {s.late:>6}"
            f" {_ms(s.latency, 'p50'):>8} {_ms(s.latency, 'p90'):>8} {_ms(s.latency, 'p99'):>8}"
            f" {_ms(s.latency, 'max'):>8} {_ms(s.lateness, 'p99'):>8}"
        )
    t = report.totals()
    answered_pct = 100 * t["answered"] / t["sent"] if t["sent"] else 0.0
    lines.append(
        f"sent {t['sent']} of {t['scheduled']} scheduled: {t['achieved_rate']:g}/s of {p.rate:g}/s; "
        f"answered {t['answered']} ({answered_pct:.2f}%), lost {t['lost']}, errors {t['errors']}, "
        f"unsent {t['unsent']}, late {t['late']}"
    )
    latency, lateness = report.latency(), report.lateness()
    lines.append("latency ms   " + (latency.line() if latency else "-"))
    lines.append("lateness ms  " + (lateness.line() if lateness else "-"))
    cpu_per_query = t["sender_cpu_seconds"] / max(1, t["sent"]) * 1e6
    extra = [f"max in flight {t['max_inflight']}", f"sender CPU {t['sender_cpu_seconds']:g}s ({cpu_per_query:.1f} us/query)"]
    if t["reasons"]:
        extra.append("reasons " + " ".join(f"{k}={v}" for k, v in t["reasons"].items()))
    if t["rcodes"]:
        extra.append("rcodes " + " ".join(f"{k}={v}" for k, v in t["rcodes"].items()))
    if t["mismatched"]:
        extra.append(f"mismatched {t['mismatched']}")
    lines.append("; ".join(extra))
    return "\n".join(lines)
