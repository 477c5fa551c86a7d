"""The DNS lab's report: a table of the scenarios and a plot of their timelines."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kubeproxy.lab.dns.lab import LabResult, ScenarioResult
from kubeproxy.lab.dns.world import SNAT_PORTS

# One colour per scenario, the same in every panel.
_COLOURS = {"snat": "tab:red", "dnat": "tab:blue", "local": "tab:green", "nftables": "tab:orange", "nft-ct-timeout": "tab:purple"}


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def _first_failure(r: ScenarioResult) -> str:
    return "-" if r.first_failed_check is None else f"{r.first_failed_check:g} s"


def _timeout(r: ScenarioResult) -> str:
    if r.flow_timeout == r.udp_timeout:
        return f"{r.udp_timeout} s"
    return f"{r.flow_timeout} s (Service; node {r.udp_timeout} s)"


def table(result: LabResult) -> Table:
    plan = result.plan
    what = f"ramp {', '.join(f'{x:g}' for x in plan.rates)}/s" if plan.ramp else f"{plan.rates[0]:g} queries/s"
    t = Table(title=f"DNS lab: {what}, {plan.duration:g} s{' per step' if plan.ramp else ''}, health check every "
                    f"{plan.check_interval:g} s ({plan.check_queries} queries, {plan.check_timeout:g} s wait)")  # fmt: skip
    for name in ("scenario", "rate", "duration", "sent", "answered", "lost", "health checks", "failed", "first failed",
                 "conntrack peak", "UDP timeout", "max healthy rate"):  # fmt: skip
        t.add_column(name, justify="left" if name == "scenario" else "right", no_wrap=True)
    for r in result.scenarios:
        answered_pct = f" ({100 * r.answered / r.sent:.1f}%)" if r.sent and r.answered != r.sent else ""
        failed = len(r.failed_checks)
        t.add_row(
            r.scenario.name,
            _rate(r.rate),
            f"{r.duration:g} s",
            f"{r.sent:,}",
            f"{r.answered:,}{answered_pct}",
            f"{r.lost:,}",
            str(len(r.checks)),
            f"[red]{failed}[/red]" if failed else "0",
            _first_failure(r),
            f"{r.conntrack_peak:,}",
            _timeout(r),
            _rate(r.max_healthy_rate),
        )
    return t


def steps_table(r: ScenarioResult) -> Table:
    """A ramp's steps for one scenario."""
    t = Table(title=f"{r.scenario.name}: steps")
    for name in ("rate", "from", "sent", "answered", "lost", "checks", "failed"):
        t.add_column(name, justify="right")
    for step in r.steps:
        checks = r.step_checks(step)
        failed = sum(not c.healthy for c in checks)
        t.add_row(_rate(step.rate), f"{step.start:.0f} s", f"{step.sent:,}", f"{step.answered:,}", f"{step.lost:,}",
                  str(len(checks)), f"[red]{failed}[/red]" if failed else "0")  # fmt: skip
    return t


def plot(result: LabResult, path: Path) -> None:
    """Offered and answered queries/s, conntrack entries and health checks over time, one colour per scenario."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none wanted
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_ct, ax_check) = plt.subplots(3, 1, figsize=(10, 9), sharex=True, height_ratios=(3, 3, 2))
    for r in result.scenarios:
        colour = _COLOURS.get(r.scenario.name)
        rows = r.series()
        ts = [row["t"] for row in rows]
        ax_rate.plot(ts, [row["offered"] for row in rows], color=colour, linestyle=":", linewidth=1)
        ax_rate.plot(ts, [row["answered"] for row in rows], color=colour, label=f"{r.scenario.name} answered")
        ct = [(s.t, s.count) for s in r.samples]
        ax_ct.plot([t for t, _ in ct], [c for _, c in ct], color=colour, label=r.scenario.name)
        checks = [(c.t, c.answered) for c in r.checks]
        ax_check.step([t for t, _ in checks], [a for _, a in checks], where="post", color=colour, label=r.scenario.name)
    ax_rate.set_ylabel("queries/s")
    ax_rate.set_title("answered (solid) and offered (dotted) queries per second")
    ax_rate.legend(loc="lower left", fontsize="small")
    ax_rate.set_ylim(bottom=0)
    ax_ct.axhline(SNAT_PORTS, color="grey", linestyle="--", linewidth=1)
    ax_ct.annotate(f"{SNAT_PORTS:,} SNAT ports (1024-65535)", (0, SNAT_PORTS), xytext=(2, 4), textcoords="offset points",
                   fontsize="small", color="grey")  # fmt: skip
    ax_ct.set_ylabel("conntrack entries on the node")
    peak = max([SNAT_PORTS, *(r.conntrack_peak for r in result.scenarios)])
    ax_ct.set_ylim(0, peak * 1.12)
    ax_ct.legend(loc="lower right", fontsize="small")
    queries = result.plan.check_queries
    ax_check.set_ylabel(f"health check\nanswered of {queries}")
    ax_check.set_ylim(-5, queries + 5)
    ax_check.set_xlabel("seconds since the load started")
    ax_check.legend(loc="lower left", fontsize="small")
    timeouts = ", ".join(f"{r.scenario.name} {r.flow_timeout} s" for r in result.scenarios if r.flow_timeout != r.udp_timeout)
    node = result.scenarios[0].udp_timeout if result.scenarios else 0
    fig.suptitle(f"DNS through an external IP: {', '.join(r.scenario.name for r in result.scenarios)}\n"
                 f"UDP conntrack timeout {node} s{'; ' + timeouts if timeouts else ''}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
