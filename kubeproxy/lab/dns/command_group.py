"""`kubeproxy dns check|load` and `kubeproxy lab dns`: the click groups (registered by kubeproxy.cli).

`dns` is also runnable on its own: `python -m kubeproxy.lab.dns check --server 10.96.0.10`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import click

from kubeproxy.lab.control_plane_cli import control_plane
from kubeproxy.lab.dns.check import format_check, run_check
from kubeproxy.lab.dns.dns_message import Query, WireError, make_query, parse_qtype
from kubeproxy.lab.dns.endpoints import AddressError, family_of, parse_server, source_addresses
from kubeproxy.lab.dns.load import LoadError, LoadPlan, format_report, run_load
from kubeproxy.lab.dns.scenarios import MAX_RATE, MAX_STEPS, SCENARIOS
from kubeproxy.lab.multinode.cluster_command import cluster as multinode_cluster
from kubeproxy.model.proxy_config import ConfigError, parse_duration

DEFAULT_NAME = "www.lab.test."
# Queries per second one worker process sends comfortably on this class of machine (bench/dns_load.py).
WORKER_RATE = 8000.0


RESOLV_CONF = Path("/etc/resolv.conf")


def system_nameserver(resolv_conf: Path) -> str | None:
    """The first `nameserver` of resolv.conf (what this host's own lookups use), if any."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            return words[1]
    return None


def _server(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int]:
    if value is None:
        value = system_nameserver(RESOLV_CONF)
        if value is None:
            raise click.BadParameter(f"no nameserver in {RESOLV_CONF}: give --server IP[:PORT]")
    try:
        return parse_server(value)
    except AddressError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def _positive_duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    seconds = _duration(ctx, param, value)
    if seconds <= 0:
        raise click.BadParameter(f"{value!r} must be longer than 0s")
    return seconds


def _qtype(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        return parse_qtype(value)
    except WireError as exc:
        raise click.BadParameter(str(exc)) from None


def _query(name: str, qtype: int) -> Query:
    try:
        return make_query(name, qtype)
    except WireError as exc:
        raise click.BadParameter(str(exc), param_hint="--name") from None


def query_options(func: Any) -> Any:
    options = [
        click.option(
            "--server",
            callback=_server,
            help="DNS server, IP[:PORT] (port 53 by default).  [default: the first nameserver of /etc/resolv.conf]",
        ),
        click.option("--name", default=DEFAULT_NAME, show_default=True, help="Name to ask for."),
        click.option("--type", "qtype", default="A", show_default=True, callback=_qtype, help="Record type (A, AAAA, ...)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.group("dns")
def dns() -> None:
    """DNS lab tools: the seed's health check and an open-loop load generator."""


@dns.command("check")
@query_options
@click.option("--queries", type=click.IntRange(1, 10000), default=100, show_default=True, help="Queries per check.")
@click.option(
    "--timeout",
    default="1s",
    show_default=True,
    callback=_positive_duration,
    help="Response wait time: each query must be answered this soon after it was sent.",
)
@click.option(
    "--linger",
    default="0s",
    show_default=True,
    callback=_duration,
    help="Keep listening this long after the wait, to report late answers apart from lost ones.",
)
def check(server: tuple[str, int], name: str, qtype: int, queries: int, timeout: float, linger: float) -> None:
    """Send QUERIES queries at once, each from a fresh source port; healthy only if all are answered in time.

    Exit status 0 healthy, 1 unhealthy, 2 bad arguments.
    """
    query = _query(name, qtype)
    result = run_check(server, query, queries=queries, timeout=timeout, linger=linger)
    click.echo(format_check(result))
    sys.exit(0 if result.healthy else 1)


@dns.command("load")
@query_options
@click.option("--rate", required=True, type=click.FloatRange(0, min_open=True), help="Queries per second (all workers).")
@click.option("--duration", required=True, callback=_positive_duration, help="How long to send (1s, 30s, 2m).")
@click.option("--source-ips", help="Bind query i to the i-th host address of this CIDR, round robin (must be local).")
@click.option(
    "--workers", type=click.IntRange(1, 256), help=f"Sender processes [default: rate/{WORKER_RATE:g}, at most the CPUs]."
)
@click.option("--timeout", default="1s", show_default=True, callback=_positive_duration, help="When an unanswered query is lost.")
@click.option(
    "--late-after",
    default="1ms",
    show_default=True,
    callback=_duration,
    help="A query sent this long after its scheduled time counts as late.",
)
@click.option(
    "--json",
    "json_out",
    type=click.File("w", lazy=False),
    help="Write the per-second series and totals as JSON to this file ('-': stdout, the table goes to stderr).",
)
@click.option("--seed", type=int, help="Seed for query IDs (reproducible runs).")
def load(
    server: tuple[str, int],
    name: str,
    qtype: int,
    rate: float,
    duration: float,
    source_ips: str | None,
    workers: int | None,
    timeout: float,
    late_after: float,
    json_out: IO[str] | None,
    seed: int | None,
) -> None:
    """Send RATE queries/s for DURATION on schedule (open loop), each from a fresh socket, and report per second.

    Exit status 0 when the run was carried out (whatever was lost: read the report), 1 when it
    could not be, 2 on bad arguments.
    """
    query = _query(name, qtype)
    sources: tuple[str, ...] = ()
    if source_ips:
        try:
            sources = source_addresses(source_ips, family_of(server[0]))
        except AddressError as exc:
            raise click.BadParameter(str(exc), param_hint="--source-ips") from None
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, math.ceil(rate / WORKER_RATE)))
    plan = LoadPlan(server, query, rate, duration, timeout=timeout, late_after=late_after, workers=workers,
                    sources=sources, seed=seed)  # fmt: skip
    to_stdout = json_out is not None and json_out.name == "<stdout>"
    for warning in plan.warnings():
        click.echo(f"warning: {warning}", err=True)
    # Elapsed time on a terminal, so a long run does not look stuck (workers report only at the end).
    progress = (lambda line: click.echo(line, err=True, nl=False)) if sys.stderr.isatty() and not to_stdout else None
    try:
        report = run_load(plan, progress=progress)
    except LoadError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_report(report), err=to_stdout)
    if json_out is not None:
        json.dump(report.to_json(), json_out, indent=2)
        json_out.write("\n")
        json_out.flush()


# ---- `kubeproxy lab dns`: the seed's experiment in namespaces ------------------------------------


def _ramp(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        return parse_ramp(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _seconds(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds < 1:
        raise click.BadParameter(f"{value!r}: at least 1s")
    return math.ceil(seconds)  # the kernel keeps whole seconds


@click.group("lab")
def lab() -> None:
    """Test beds in network namespaces that reproduce the seeds' incidents (root)."""


lab.add_command(multinode_cluster)
lab.add_command(control_plane)


@lab.command("dns")
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    required=True,
    type=click.Choice(list(SCENARIOS)),
    help="Scenario to run (repeatable): " + "; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values()),
)
@click.option("--rate", type=click.FloatRange(0, MAX_RATE, min_open=True), help="Queries per second [default: 3000].")
@click.option(
    "--ramp",
    callback=_ramp,
    metavar="FROM:TO:STEP",
    help="Rates FROM, FROM+STEP, ... TO, one after the other, each for --duration; stops after the first step "
    "with a failed health check.",
)
@click.option("--duration", default="40s", show_default=True, callback=_positive_duration, help="How long each rate runs.")
@click.option(
    "--udp-timeout",
    callback=_seconds,
    help="The node's nf_conntrack_udp_timeout (and _stream), seconds or a duration [default: the kernel's, 30s].",
)
@click.option("--pods", type=click.IntRange(1, 8), default=1, show_default=True, help="BIND pods behind the Service.")
@click.option("--whole-ramp", is_flag=True, help="Run every step of --ramp, also after a failed health check.")
@click.option("--json", "json_out", type=click.File("w", lazy=True), help="Write the results as JSON to this file ('-': stdout).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot of the run here.")
def lab_dns(
    scenario_names: tuple[str, ...],
    rate: float | None,
    ramp: tuple[float, ...] | None,
    duration: float,
    udp_timeout: int | None,
    pods: int,
    whole_ramp: bool,
    json_out: IO[str] | None,
    plot_path: Path | None,
) -> None:
    """Reproduce the BIND report: BIND behind an external IP, real load, the seed's health check, the node's conntrack.

    Each scenario gets a fresh world of network namespaces: 254 resolver addresses on a client,
    a node running `kubeproxy run`, BIND 9 pods, the seed's DNS Service (ClusterIP, external IP
    203.0.113.53, NodePort; UDP and TCP 53). The load goes to the external IP, a fresh source
    port per query; the health check (100 queries, 1 s wait) runs every second; the node's
    conntrack entries are counted every second. Everything is removed afterwards, also on Ctrl-C.
    Needs root, named (bind9), dig, conntrack and iptables.
    """
    from rich.console import Console

    from kubeproxy.lab.dns import report
    from kubeproxy.lab.dns.lab import LabPlan, run_lab, write_json
    from kubeproxy.lab.dns.world import LabError

    if rate is not None and ramp is not None:
        raise click.UsageError("give --rate or --ramp, not both")
    missing = lab_unavailable()
    if missing:
        raise click.ClickException(missing)
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib (pip install matplotlib), checked before the run rather than after")
    plan = LabPlan(
        tuple(SCENARIOS[n] for n in dict.fromkeys(scenario_names)),
        ramp or (rate if rate is not None else 3000.0,),
        duration,
        udp_timeout=udp_timeout,
        pods=pods,
        stop_on_failure=not whole_ramp,
    )
    problems = plan.errors()
    if problems:
        raise click.UsageError("; ".join(problems))
    err = _wide(Console(stderr=True, highlight=False))
    to_stdout = json_out is not None and getattr(json_out, "name", "") == "-"
    out = err if to_stdout else _wide(Console(highlight=False))
    try:
        with terminate_as_interrupt():
            result = run_lab(plan, progress=lambda line: err.print(line, markup=False))
    except KeyboardInterrupt:
        err.print("interrupted: the lab's namespaces and processes are removed")
        sys.exit(130)
    except LabError as exc:
        raise click.ClickException(str(exc)) from None
    out.print(report.table(result))
    if plan.ramp:
        for r in result.scenarios:
            out.print(report.steps_table(r))
    if json_out is not None:
        write_json(result, json_out)
        json_out.flush()
    if plot_path is not None:
        report.plot(result, plot_path)
        err.print(f"plot written to {plot_path}")


def _wide(console: Any) -> Any:
    # Piped into a file or CI log, rich would wrap the table at 80 columns: give it room instead.
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def parse_ramp(text: str) -> tuple[float, ...]:
    """`1000:3000:500` -> (1000, 1500, 2000, 2500, 3000)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"{text!r}: expected FROM:TO:STEP, e.g. 1000:3000:500")
    try:
        low, high, step = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r}: FROM, TO and STEP must be numbers") from None
    if low <= 0 or step <= 0 or high < low:
        raise ValueError(f"{text!r}: need 0 < FROM <= TO and STEP > 0")
    count = math.floor((high - low) / step + 1e-9) + 1
    if count > MAX_STEPS:
        raise ValueError(f"{text!r}: {count} steps; at most {MAX_STEPS}")
    return tuple(low + i * step for i in range(count))


def lab_unavailable() -> str | None:
    """Why the lab cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "kubeproxy lab dns needs root: it builds network namespaces and programs netfilter in them"
    tools = {"ip": "iproute2", "iptables": "iptables", "conntrack": "conntrack", "named": "bind9", "dig": "bind9-dnsutils"}
    missing = [f"{tool} ({package})" for tool, package in tools.items() if shutil.which(tool) is None]
    if missing:
        return "kubeproxy lab dns needs " + ", ".join(missing) + " (scripts/setup installs them)"
    return None


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C while the block runs, so the lab cleans up after itself either way."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
