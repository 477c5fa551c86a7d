#!/usr/bin/env python3
"""Doctor's SNAT prediction against DNS-lab ramps it was not fitted on (as root).

    .venv/bin/python bench/snat_prediction.py predict [--json bench/snat_prediction.json]
    .venv/bin/python bench/snat_prediction.py measure CONDITION [--json bench/snat_measured_CONDITION.json]
    .venv/bin/python bench/snat_prediction.py table [--prediction ...] [--measured ... ...]

doctor's rule (kubeproxy/doctor/snat.py) is ports / timeout per endpoint, and health checks failing
from HEALTHY_FRACTION (0.75) of it; that fraction came from ramps at a 30 s and 60 s UDP timeout
(snat) and 5 s (nft-ct-timeout), so none of those conditions can test it. Each condition here
differs from them in one thing the rule claims to account for:

    timeout-45   snat, the node's UDP timeout at 45 s
    pods-2       snat, two BIND pods (each endpoint ip:port has a port space of its own)
    ports-10k    snat, plus a MASQUERADE --to-ports 40000-49999 for the proxy's marked UDP flows,
                 inserted at the top of nat POSTROUTING (a narrowed SNAT range; the node's
                 ip_local_port_range would not do: MASQUERADE ignores it)
    nft-30       nftables mode (fully-random masquerade) at the kernel's 30 s

`predict` builds each condition's lab world (no load), runs `doctor --live` on the node as it is,
and prints doctor's bound, its predicted failure onset, and for each ramp step whether health
checks should pass. `measure` builds the same world and runs that ramp (kubeproxy.lab.dns.lab,
stopping after the first step with a failed check); `table` puts both side by side with the
error of the prediction against the measured max healthy rate (the convention the fitted
conditions used) and whether the prediction falls between the max healthy and the first
failing step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.cluster.state import build_state
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.live import read_node
from kubeproxy.lab.cluster import CLUSTER_CIDR, NODE_NAME
from kubeproxy.lab.dns.lab import LabPlan, run_scenario
from kubeproxy.lab.dns.scenarios import SCENARIOS
from kubeproxy.lab.dns.world import DnsWorld
from kubeproxy.proxy.config import ProxyConfig, validate

HERE = Path(__file__).resolve().parent
NARROW_PORTS = "40000-49999"
NARROW_COMMENT = "snat_prediction: narrowed SNAT range"


@dataclass(frozen=True)
class Condition:
    name: str
    summary: str
    scenario: str
    ramp: tuple[float, ...]
    step_seconds: float
    udp_timeout: int | None = None
    pods: int = 1
    narrow_ports: bool = False


def _steps(low: float, high: float, step: float) -> tuple[float, ...]:
    return tuple(low + i * step for i in range(int((high - low) / step) + 1))


# Ramps bracket the onset one would guess from ports/timeout alone; each step lasts at least the
# UDP timeout so the table reaches its steady state (docs/labs.md, "The capacity rule").
CONDITIONS = {
    c.name: c
    for c in (
        Condition("timeout-45", "snat, node UDP timeout 45 s", "snat", _steps(800, 1400, 100), 50, udp_timeout=45),
        Condition("pods-2", "snat, 2 BIND pods, 30 s", "snat", _steps(2400, 4000, 200), 35, pods=2),
        Condition(
            "ports-10k", f"snat, MASQUERADE --to-ports {NARROW_PORTS}, 30 s", "snat", _steps(125, 425, 50), 35, narrow_ports=True
        ),
        Condition("nft-30", "nftables mode (fully-random), 30 s", "nftables", _steps(1200, 2200, 100), 35),
    )
}


def _narrow(world: DnsWorld) -> None:
    """The proxy's marked UDP flows masqueraded into NARROW_PORTS, ahead of its own MASQUERADE."""
    world.node.run(["iptables", "-w", "-t", "nat", "-I", "POSTROUTING", "1", "-p", "udp", "-m", "mark", "--mark",
                    "0x4000/0x4000", "-m", "comment", "--comment", NARROW_COMMENT, "-j", "MASQUERADE", "--to-ports",
                    NARROW_PORTS])  # fmt: skip


def _narrow_in_place(world: DnsWorld) -> bool:
    first = [ln for ln in world.node.run(["iptables-save", "-t", "nat"]).stdout.splitlines() if ln.startswith("-A POSTROUTING")][
        :1
    ]
    return bool(first) and NARROW_COMMENT in first[0]


def _with_world(c: Condition, body: Callable[[DnsWorld], dict[str, Any]]) -> dict[str, Any]:
    with DnsWorld.build(SCENARIOS[c.scenario], pods=c.pods, udp_timeout=c.udp_timeout) as world:
        if c.narrow_ports:
            _narrow(world)
        out = body(world)
        if c.narrow_ports and not _narrow_in_place(world):
            raise SystemExit(f"{c.name}: the narrowed MASQUERADE rule is no longer first in POSTROUTING")
        return out


def _doctor(world: DnsWorld) -> dict[str, Any]:
    state, warnings = build_state(world.objects)
    if warnings:
        raise SystemExit(f"the lab's objects: {warnings}")
    got = read_node(world.node.name, entries=False)
    cfg = validate(ProxyConfig(cluster_cidr=(CLUSTER_CIDR,), hostname_override=NODE_NAME))
    report = diagnose(DoctorInput(got.ruleset, state, cfg, got.node, got.facts, "", got.rules_source))
    found = [
        f
        for f in report.findings
        if f.kind == "snat-capacity"
        and f.data["protocol"] == "UDP"
        and any(x["kind"] != "cluster IP" for x in f.data["frontends"])
    ]
    if len(found) != 1:
        raise SystemExit(f"expected one external UDP snat-capacity finding, got {len(found)}")
    d = found[0].data
    return {
        k: d[k]
        for k in (
            "snat_ports",
            "timeout_seconds",
            "bound_per_endpoint",
            "bound_per_service",
            "health_fail_per_service",
            "endpoints",
        )
    } | {"evidence": found[0].evidence}


def predict(names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        c = CONDITIONS[name]
        p = _with_world(c, _doctor)
        onset = p["health_fail_per_service"]
        p["steps"] = [{"rate": r, "predicted_healthy": r < onset} for r in c.ramp]
        p["ramp"] = list(c.ramp)
        p["step_seconds"] = c.step_seconds
        p["summary"] = c.summary
        out[name] = p
        print(f"predicted {name}: onset {onset:,.0f}/s", file=sys.stderr, flush=True)
    return out


def measure(name: str) -> dict[str, Any]:
    c = CONDITIONS[name]
    plan = LabPlan((SCENARIOS[c.scenario],), c.ramp, c.step_seconds, udp_timeout=c.udp_timeout, pods=c.pods)

    def run(world: DnsWorld) -> dict[str, Any]:
        before = _uptime()
        r = run_scenario(world, plan, progress=lambda line: print(line, file=sys.stderr, flush=True))
        after = _uptime()
        first_failing = next((s.rate for s in r.steps if not r.step_healthy(s)), None)
        return {
            "condition": name, "description": r.description, "load_before": before, "load_after": after,
            "max_healthy_rate": r.max_healthy_rate, "first_failing_rate": first_failing,
            "conntrack_peak": r.conntrack_peak, "insert_failed": r.insert_failed, "warnings": r.warnings,
            "steps": [{"rate": s.rate, "sent": s.sent, "answered": s.answered, "lost": s.lost,
                       "checks": len(r.step_checks(s)), "failed_checks": sum(not k.healthy for k in r.step_checks(s)),
                       "healthy": r.step_healthy(s)} for s in r.steps],
        }  # fmt: skip

    return _with_world(c, run)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def prediction_table(pred: dict[str, Any]) -> str:
    lines = [
        f"{'condition':<11} {'SNAT ports':>11} {'timeout':>7} {'endpoints':>9} {'bound/s':>8} "
        f"{'predicted onset/s':>17}  steps: rate -> predicted"
    ]
    for name, p in pred.items():
        steps = ", ".join(f"{s['rate']:g} {'pass' if s['predicted_healthy'] else 'FAIL'}" for s in p["steps"])
        lines.append(
            f"{name:<11} {p['snat_ports']['count']:>11,} {p['timeout_seconds']:>6}s {len(p['endpoints']):>9} "
            f"{p['bound_per_service']:>8,.0f} {p['health_fail_per_service']:>17,.0f}  {steps}"
        )
    return "\n".join(lines)


def comparison_table(pred: dict[str, Any], measured: list[dict[str, Any]]) -> str:
    lines = [
        f"{'condition':<11} {'bound/s':>8} {'predicted':>9} {'max healthy':>11} {'first failing':>13} "
        f"{'error':>6} {'in bracket':>10}"
    ]
    for m in measured:
        p = pred[m["condition"]]
        onset, ok, bad = p["health_fail_per_service"], m["max_healthy_rate"], m["first_failing_rate"]
        error = f"{(onset - ok) / ok:+.0%}" if ok else "-"
        inside = "yes" if (ok or 0) <= onset and (bad is None or onset < bad) else "no"
        lines.append(
            f"{m['condition']:<11} {p['bound_per_service']:>8,.0f} {onset:>9,.0f} "
            f"{'-' if ok is None else f'{ok:,.0f}':>11} {'-' if bad is None else f'{bad:,.0f}':>13} "
            f"{error:>6} {inside:>10}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, default=HERE / "snat_prediction.json")
    p.add_argument("--condition", action="append", choices=list(CONDITIONS))
    m = sub.add_parser("measure")
    m.add_argument("condition", choices=list(CONDITIONS))
    m.add_argument("--json", type=Path)
    t = sub.add_parser("table")
    t.add_argument("--prediction", type=Path, default=HERE / "snat_prediction.json")
    t.add_argument("--measured", type=Path, nargs="*")
    args = ap.parse_args()
    if args.cmd == "predict":
        pred = predict(args.condition or list(CONDITIONS))
        args.json.write_text(json.dumps(pred, indent=2) + "\n")
        print(prediction_table(pred))
    elif args.cmd == "measure":
        got = measure(args.condition)
        (args.json or HERE / f"snat_measured_{args.condition}.json").write_text(json.dumps(got, indent=2) + "\n")
        print(json.dumps({k: got[k] for k in ("condition", "max_healthy_rate", "first_failing_rate", "load_before",
                                               "load_after")}, indent=2))  # fmt: skip
    else:
        pred = json.loads(args.prediction.read_text())
        paths = args.measured or sorted(HERE.glob("snat_measured_*.json"))
        print(comparison_table(pred, [json.loads(x.read_text()) for x in paths]))


if __name__ == "__main__":
    main()
