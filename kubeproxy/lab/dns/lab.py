"""`kubeproxy lab dns`: the seed's experiment, one scenario at a time, in network namespaces.

For each scenario a fresh world is built (kubeproxy.lab.dns.world: resolvers, a node running
`kubeproxy run`, BIND pods, the seed's DNS Service). Then, on one timeline from T0:

- the load (kubeproxy.lab.dns.load) goes from the client's 254 resolver addresses to the
  external IP, a fresh source port per query, at the plan's rate; with a ramp, one step after
  the other without a pause, each step its own load process started just ahead of its time;
- the seed's health check (100 queries at once, each from a fresh port, healthy only if all are
  answered within 1 s) runs every second from the client's own address to the external IP;
- the node's conntrack entry count (and its insert_failed/drop counters) is read every second.

A ramp stops after the first step in which a health check failed (as the seed's operator stopped
adding weight); `max_healthy_rate` is the highest step rate before that whose every check passed.
The node's conntrack table starts empty at T0 and is never flushed between steps, as on a real
node whose L4 weight is turned up.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from kubeproxy.lab import netns as L
from kubeproxy.lab.dns.bind import ANSWER_NAME
from kubeproxy.lab.dns.scenarios import MAX_RATE, MAX_STEP_SECONDS, MAX_STEPS, MAX_UDP_TIMEOUT, Scenario
from kubeproxy.lab.dns.world import EXTERNAL_IP, SNAT_PORTS, SOURCE_CIDR, DnsWorld, LabError, check_proxy_mode

_LEAD = 1.5  # seconds an agent is started ahead of its time (interpreter start-up on a busy machine)
_AGENT = [sys.executable, "-m", "kubeproxy.lab.dns.monitor"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LabPlan:
    scenarios: tuple[Scenario, ...]
    rates: tuple[float, ...]  # one rate, or the steps of a ramp
    duration: float  # seconds per rate
    udp_timeout: int | None = None  # the node's UDP conntrack timeout; None: the kernel's (30 s)
    pods: int = 1
    check_queries: int = 100
    check_timeout: float = 1.0  # the seed's response wait time
    check_interval: float = 1.0
    load_timeout: float = 1.0
    source_cidr: str = SOURCE_CIDR
    stop_on_failure: bool = True  # ramps only

    @property
    def ramp(self) -> bool:
        return len(self.rates) > 1

    def errors(self) -> list[str]:
        """What makes the plan impossible or unbounded, one line each (empty when fine)."""
        out = []
        if not self.scenarios:
            out.append("no scenario given")
        if not self.rates:
            out.append("no rate given")
        if len(self.rates) > MAX_STEPS:
            out.append(f"{len(self.rates)} ramp steps; at most {MAX_STEPS}")
        for rate in self.rates:
            if not 0 < rate <= MAX_RATE:
                out.append(f"rate {rate:g}/s is not in (0, {MAX_RATE:g}]")
        if not 0 < self.duration <= MAX_STEP_SECONDS:
            out.append(f"duration {self.duration:g} s is not in (0, {MAX_STEP_SECONDS:g}]")
        if self.udp_timeout is not None and not 1 <= self.udp_timeout <= MAX_UDP_TIMEOUT:
            out.append(f"UDP timeout {self.udp_timeout} s is not in [1, {MAX_UDP_TIMEOUT}]")
        if not 1 <= self.pods <= 8:
            out.append(f"{self.pods} pods; 1 to 8 are supported")
        return out

    def warnings(self, udp_timeout: int, conntrack_max: int) -> list[str]:
        """What could make a run measure something else than the SNAT limit."""
        out = []
        worst = max(self.rates) * udp_timeout + self.check_queries / self.check_interval * udp_timeout
        if worst > conntrack_max:
            out.append(
                f"at {max(self.rates):g}/s with a {udp_timeout} s UDP timeout the node holds up to {worst:,.0f} conntrack "
                f"entries, more than its nf_conntrack_max {conntrack_max:,}: a full table drops new flows in every scenario"
            )
        if self.ramp and self.duration < udp_timeout:
            out.append(
                f"ramp steps of {self.duration:g} s are shorter than the {udp_timeout} s UDP timeout: the conntrack table "
                "does not reach its steady state within a step, so max healthy rate may come out too high"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "scenarios": [s.name for s in self.scenarios],
            "rates": list(self.rates),
            "duration_s": self.duration,
            "udp_timeout_s": self.udp_timeout,
            "pods": self.pods,
            "health_check": {"queries": self.check_queries, "timeout_s": self.check_timeout, "interval_s": self.check_interval},
            "load_timeout_s": self.load_timeout,
            "source_cidr": self.source_cidr,
        }


@dataclass(frozen=True)
class Check:
    """One health check: `t` seconds after T0."""

    t: float
    queries: int
    answered: int
    failures: dict[str, int]

    @property
    def healthy(self) -> bool:
        return self.answered == self.queries


@dataclass(frozen=True)
class Sample:
    """The node's conntrack table `t` seconds after T0 (drop counters are totals since the node's start)."""

    t: float
    count: int
    insert_failed: int = 0
    drop: int = 0


@dataclass(frozen=True)
class Step:
    """One rate of the run: the load report's totals and its per-second counts."""

    rate: float
    duration: float
    start: float  # seconds after T0 the step was planned to start (k × duration)
    started: float  # seconds after T0 its load's schedule really started (a few ms later)
    totals: dict[str, Any]
    seconds: list[dict[str, Any]]

    @property
    def sent(self) -> int:
        return int(self.totals["sent"])

    @property
    def answered(self) -> int:
        return int(self.totals["answered"])

    @property
    def lost(self) -> int:
        return int(self.totals["lost"])


@dataclass
class ScenarioResult:
    scenario: Scenario
    description: str
    udp_timeout: int
    conntrack_max: int
    steps: list[Step] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    manual_dnat_packets: int | None = None
    # Seconds left to the external IP's UDP conntrack entries when the load ended: (min, max, how many).
    flow_timeouts_left: tuple[int, int, int] | None = None
    warnings: list[str] = field(default_factory=list)

    # ---- what the report says ----------------------------------------------------------------

    @property
    def rate(self) -> float:
        """The highest rate offered (the only one without a ramp)."""
        return max((s.rate for s in self.steps), default=0.0)

    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.steps)

    @property
    def sent(self) -> int:
        return sum(s.sent for s in self.steps)

    @property
    def answered(self) -> int:
        return sum(s.answered for s in self.steps)

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.steps)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.healthy]

    @property
    def first_failed_check(self) -> float | None:
        failed = self.failed_checks
        return failed[0].t if failed else None

    @property
    def flow_timeout(self) -> int:
        """How long (s) a DNS query's conntrack entry, and so its SNAT port, lives: the Service's own
        UDP timeout when the scenario sets one, else the node's."""
        return self.scenario.service_udp_timeout or self.udp_timeout

    @property
    def conntrack_peak(self) -> int:
        return max((s.count for s in self.samples), default=0)

    @property
    def insert_failed(self) -> int:
        """Flows the node dropped because conntrack could not insert them (for NAT: no free tuple) during the run."""
        if len(self.samples) < 2:
            return 0
        return self.samples[-1].insert_failed - self.samples[0].insert_failed

    def step_checks(self, step: Step) -> list[Check]:
        return [c for c in self.checks if step.start <= c.t < step.start + step.duration]

    def step_healthy(self, step: Step) -> bool:
        checks = self.step_checks(step)
        return bool(checks) and all(c.healthy for c in checks)

    @property
    def max_healthy_rate(self) -> float | None:
        """The highest rate, among those tried in order, up to which every health check passed."""
        best = None
        for step in self.steps:
            if not self.step_healthy(step):
                break
            best = step.rate
        return best

    def series(self) -> list[dict[str, Any]]:
        """One row per second after T0: offered rate, sent, answered, lost, conntrack count, health check answered."""
        rows: dict[int, dict[str, Any]] = {}
        end = math.ceil(self.duration - 1e-9)
        for t in range(end):
            rows[t] = {"t": t, "offered": 0.0, "sent": 0, "answered": 0, "lost": 0, "conntrack": None, "check_answered": None}
        for step in self.steps:
            base = round(step.started)
            for s in step.seconds:
                row = rows.get(base + s["second"])
                if row is None:
                    continue
                row["offered"] = step.rate
                for key in ("sent", "answered", "lost"):
                    row[key] += s[key]
        for sample in self.samples:
            row = rows.get(round(sample.t))
            if row is not None:
                row["conntrack"] = sample.count
        for check in self.checks:
            row = rows.get(round(check.t))
            if row is not None:
                row["check_answered"] = check.answered
        return [rows[t] for t in sorted(rows)]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "summary": self.scenario.summary,
            "rate": self.rate,
            "duration_s": self.duration,
            "sent": self.sent,
            "answered": self.answered,
            "lost": self.lost,
            "health_checks": len(self.checks),
            "health_checks_failed": len(self.failed_checks),
            "first_failed_check_s": self.first_failed_check,
            "conntrack_peak": self.conntrack_peak,
            "max_healthy_rate": self.max_healthy_rate,
            "udp_timeout_s": self.udp_timeout,
            "service_udp_timeout_s": self.scenario.service_udp_timeout,
            "snat_ports": SNAT_PORTS,
            "snat_capacity_per_s": round(SNAT_PORTS / self.flow_timeout, 1),
            "conntrack_max": self.conntrack_max,
            "conntrack_insert_failed": self.insert_failed,
            "manual_dnat_packets": self.manual_dnat_packets,
            "flow_timeouts_left_s": None
            if self.flow_timeouts_left is None
            else dict(zip(("min", "max", "entries"), self.flow_timeouts_left, strict=True)),
            "world": self.description,
            "warnings": self.warnings,
            "steps": [
                {
                    "rate": s.rate,
                    "start_s": s.start,
                    "started_s": round(s.started, 3),
                    "duration_s": s.duration,
                    "sent": s.sent,
                    "answered": s.answered,
                    "lost": s.lost,
                    "errors": s.totals.get("errors", 0),
                    "unsent": s.totals.get("unsent", 0),
                    "health_checks": len(self.step_checks(s)),
                    "health_checks_failed": sum(not c.healthy for c in self.step_checks(s)),
                    "latency_ms": s.totals.get("latency_ms"),
                }
                for s in self.steps
            ],
            "checks": [{"t": c.t, "answered": c.answered, "queries": c.queries, "failures": c.failures} for c in self.checks],
            "series": self.series(),
        }


@dataclass
class LabResult:
    plan: LabPlan
    scenarios: list[ScenarioResult]

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan.to_json(), "scenarios": [s.to_json() for s in self.scenarios]}


# ---- running ------------------------------------------------------------------------------------


class _Agent:
    """One agent process in a namespace, its JSON lines collected by a thread as they come."""

    def __init__(self, ns: L.NetNS, argv: Sequence[str], what: str) -> None:
        self.what = what
        self.lines: list[dict[str, Any]] = []
        self.proc = ns.popen([*_AGENT, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, name=f"agent {what}", daemon=True)
        self._reader.start()
        self._stderr: list[str] = []
        self._err_reader = threading.Thread(target=self._read_err, name=f"agent {what} stderr", daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.append(json.loads(line))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-20]

    def stop_at(self, until: float) -> None:
        """Ask a periodic agent to finish what is due before wall-clock `until` and exit."""
        self._write(f"stop {until:.6f}\n")

    def _write(self, text: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def wait(self, timeout: float) -> None:
        """Wait for the agent to exit and its output to be read; an agent that failed is a LabError."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise LabError(f"the {self.what} agent did not finish within {timeout:g} s") from None
        self._reader.join(5)
        self._err_reader.join(5)
        if self.proc.returncode != 0:
            raise LabError(f"the {self.what} agent exited with status {self.proc.returncode}: {''.join(self._stderr).strip()}")

    def kill(self) -> None:
        L.stop_process(self.proc, 3)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def run_scenario(world: DnsWorld, plan: LabPlan, progress: Progress = lambda _: None) -> ScenarioResult:
    """The plan's rates against `world`, with the health check and the conntrack sampler running throughout."""
    udp_timeout, ct_max = world.udp_timeout(), world.conntrack_max()
    flow_timeout = world.scenario.service_udp_timeout or udp_timeout
    result = ScenarioResult(world.scenario, world.describe(), udp_timeout, ct_max, warnings=plan.warnings(flow_timeout, ct_max))
    server = f"{EXTERNAL_IP}:53"
    t0 = time.time() + _LEAD
    agents: list[_Agent] = []
    try:
        health = _Agent(world.client, ["health", "--server", server, "--start", f"{t0:.6f}", "--name", ANSWER_NAME,
                                       "--interval", str(plan.check_interval), "--queries", str(plan.check_queries),
                                       "--timeout", str(plan.check_timeout)], "health check")  # fmt: skip
        sampler = _Agent(world.node, ["conntrack", "--start", f"{t0:.6f}", "--interval", str(plan.check_interval)], "conntrack")
        agents += [health, sampler]
        loads: list[tuple[float, _Agent]] = []
        start = t0
        for k, rate in enumerate(plan.rates):
            _sleep_until(start - _LEAD)
            if k and plan.stop_on_failure and _failed_since(health, t0, start - plan.duration):
                break
            load = _Agent(world.client, ["load", "--server", server, "--start", f"{start:.6f}", "--name", ANSWER_NAME,
                                         "--rate", f"{rate:g}", "--duration", f"{plan.duration:g}",
                                         "--timeout", str(plan.load_timeout), "--source-ips", plan.source_cidr,
                                         "--workers", str(_workers(rate))], f"load {rate:g}/s")  # fmt: skip
            agents.append(load)
            loads.append((rate, load))
            progress(f"{world.scenario.name}: {rate:g} queries/s for {plan.duration:g} s (t = {start - t0:.0f} s)")
            start += plan.duration
        end = start
        for agent in (health, sampler):
            agent.stop_at(end)
        for rate, load in loads:
            load.wait(max(0.0, end - time.time()) + plan.duration + plan.load_timeout + 60)
            if not load.lines:
                raise LabError(f"the load agent at {rate:g}/s reported nothing")
            line = load.lines[-1]
            report = line["report"]
            planned = len(result.steps) * plan.duration
            result.steps.append(Step(rate, plan.duration, planned, line["t0"] - t0, report["totals"], report["seconds"]))
        left = world.udp_flow_timeouts(EXTERNAL_IP)
        if left:
            result.flow_timeouts_left = (min(left), max(left), len(left))
        for agent in (health, sampler):
            agent.wait(max(0.0, end - time.time()) + plan.check_timeout + 30)
        lines = sorted(health.lines, key=lambda r: r["t"])  # overlapping checks report in the order they end
        result.checks = [Check(r["t"], r["queries"], r["answered"], r["failures"]) for r in lines]
        result.samples = [Sample(r["t"], r["count"], r.get("insert_failed", 0), r.get("drop", 0)) for r in sampler.lines]
    finally:
        for agent in agents:
            agent.kill()
    if world.scenario.manual_dnat:
        result.manual_dnat_packets = world.manual_dnat_packets()
    return result


def run_lab(plan: LabPlan, progress: Progress = lambda _: None) -> LabResult:
    """Every scenario of the plan, each in a world of its own, built and removed in turn."""
    problems = plan.errors()
    if problems:
        raise LabError("; ".join(problems))
    for mode in sorted({s.proxy_mode for s in plan.scenarios} - {"iptables"}):
        progress(f"checking that `kubeproxy run --proxy-mode {mode}` runs")
        check_proxy_mode(mode)
    results = []
    for scenario in plan.scenarios:
        progress(f"{scenario.name}: building the world ({scenario.summary})")
        with DnsWorld.build(scenario, pods=plan.pods, udp_timeout=plan.udp_timeout, source_cidr=plan.source_cidr) as world:
            progress(world.describe())
            for warning in plan.warnings(scenario.service_udp_timeout or world.udp_timeout(), world.conntrack_max()):
                progress(f"warning: {warning}")
            result = run_scenario(world, plan, progress)
        progress(summary_line(result))
        results.append(result)
    return LabResult(plan, results)


def summary_line(r: ScenarioResult) -> str:
    first = "none failed" if r.first_failed_check is None else f"first failed at {r.first_failed_check:g} s"
    return (
        f"{r.scenario.name}: sent {r.sent}, answered {r.answered}, lost {r.lost}; health checks {len(r.checks)}, "
        f"failed {len(r.failed_checks)} ({first}); conntrack peak {r.conntrack_peak}"
    )


def _workers(rate: float) -> int:
    # One sending process keeps up with about 8k queries/s (bench/dns_load.py) with a socket bound per query.
    return max(1, math.ceil(rate / 8000))


def _failed_since(health: _Agent, t0: float, since: float) -> bool:
    return any(r["answered"] != r["queries"] and r["t"] >= since - t0 for r in list(health.lines))


def _sleep_until(when: float) -> None:
    wait = when - time.time()
    if wait > 0:
        time.sleep(wait)


def write_json(result: LabResult, out: IO[str]) -> None:
    json.dump(result.to_json(), out, indent=2)
    out.write("\n")
