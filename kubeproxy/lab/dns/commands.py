"""`kubeproxy dns check` and `kubeproxy dns load`: the click group (registered by kubeproxy.cli).

Also runnable on its own: `python -m kubeproxy.lab.dns check --server 10.96.0.10`.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import IO, Any

import click

from kubeproxy.lab.dns.check import format_check, run_check
from kubeproxy.lab.dns.endpoints import AddressError, family_of, parse_server, source_addresses
from kubeproxy.lab.dns.load import LoadError, LoadPlan, format_report, run_load
from kubeproxy.lab.dns.wire import Query, WireError, make_query, parse_qtype
from kubeproxy.proxy.config import ConfigError, parse_duration

DEFAULT_NAME = "www.lab.test."
# Queries per second one worker process sends comfortably on this class of machine (bench/dns_load.py).
WORKER_RATE = 8000.0


def _server(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
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
        click.option("--server", required=True, callback=_server, help="DNS server, IP[:PORT] (port 53 by default)."),
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
    try:
        report = run_load(plan)
    except LoadError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_report(report), err=to_stdout)
    if json_out is not None:
        json.dump(report.to_json(), json_out, indent=2)
        json_out.write("\n")
        json_out.flush()
