"""`kubeproxy dns load`: open-loop load from fresh sockets, counted per second, through the click group.

Rates here are modest: the tests check counting and behaviour, not speed (bench/dns_load.py does that).
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kubeproxy.lab.dns.command_group import dns
from kubeproxy.lab.dns.dns_message import make_query
from kubeproxy.lab.dns.load import LoadPlan, run_schedule
from kubeproxy.lab.dns.responder import Responder
from kubeproxy.lab.netns import NetNS


def _run(*args: str) -> Result:
    return CliRunner().invoke(dns, list(args), catch_exceptions=False)


def _server(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def test_rate_times_duration_sent_and_all_answered(tmp_path: Path) -> None:
    report = tmp_path / "load.json"
    with Responder() as r:
        out = _run("load", "--server", _server(r.address), "--rate", "2000", "--duration", "2s", "--workers", "1",
                   "--json", str(report))  # fmt: skip
        served = r.queries
    assert out.exit_code == 0, out.output + out.stderr
    data = json.loads(report.read_text())
    totals, seconds = data["totals"], data["seconds"]
    assert totals["scheduled"] == 4000
    assert abs(totals["sent"] - 4000) <= 0.03 * 4000, totals  # what is not sent is counted as unsent
    assert totals["sent"] + totals["unsent"] + totals["errors"] == 4000
    assert totals["answered"] == totals["sent"] == served
    assert totals["lost"] == 0 and totals["errors"] == 0 and totals["mismatched"] == 0
    assert totals["rcodes"] == {"NOERROR": totals["answered"]}
    assert [s["second"] for s in seconds] == [0, 1]
    assert sum(s["sent"] for s in seconds) == totals["sent"]
    assert all(s["sent"] + s["unsent"] == 2000 for s in seconds), seconds
    for s in seconds:
        lat = s["latency_ms"]
        assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] <= 1000
    assert data["plan"]["rate"] == 2000 and data["plan"]["workers"] == 1
    # The table: one row per second and the summary.
    assert "second    sent answered" in out.output
    assert f"sent {totals['sent']} of 4000 scheduled" in out.output


@pytest.mark.parametrize("workers", [1, 2])
def test_source_ips_spread_queries_round_robin(workers: int) -> None:
    with Responder(record_sources=True) as r:
        out = _run("load", "--server", _server(r.address), "--rate", "600", "--duration", "1s",
                   "--source-ips", "127.0.9.0/29", "--workers", str(workers))  # fmt: skip
        seen = r.sources
    assert out.exit_code == 0, out.output + out.stderr
    per_address = Counter(ip for ip, _ in seen)
    assert set(per_address) == {f"127.0.9.{i}" for i in range(1, 7)}, per_address
    # Query i goes from address i % 6, so the addresses' counts stay within a few of each other
    # however many of the 600 a loaded machine got out in the second (the rest are counted unsent).
    sent = re.search(r"sent (\d+) of 600 scheduled", out.output)
    assert sent is not None, out.output
    assert sum(per_address.values()) <= int(sent.group(1)), (sent.group(0), per_address)
    assert max(per_address.values()) - min(per_address.values()) <= 3, per_address
    assert "6 source addresses from 127.0.9.1" in out.output


def test_open_loop_keeps_sending_when_nothing_answers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never read: no answers, no ICMP
        silent.bind(("127.0.0.1", 0))
        out = _run("load", "--server", _server(silent.getsockname()), "--rate", "400", "--duration", "1s",
                   "--timeout", "200ms", "--json", "-")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    totals = json.loads(out.stdout)["totals"]
    assert totals["sent"] + totals["unsent"] == 400 and totals["sent"] >= 388
    assert totals["answered"] == 0 and totals["lost"] == totals["sent"]
    assert totals["reasons"] == {"timeout": totals["sent"]}
    assert "lost" in out.stderr  # the table went to stderr, JSON alone on stdout


def test_lateness_is_reported_not_absorbed() -> None:
    # A schedule whose first 0.3 s are already past: those queries go out at once and count as
    # late; a schedule entirely past counts every query as unsent rather than sending it afterwards.
    query = make_query("www.lab.test")
    with Responder() as r:
        plan = LoadPlan(r.address, query, rate=1000, duration=0.5, timeout=0.5)
        tally = run_schedule(plan, 0, time.monotonic() - 0.3)
        assert sum(tally.sent) + sum(tally.unsent) == 500
        assert sum(tally.late) >= 290, tally.late
        assert tally.lateness[0][0] > 0.2  # the first query left 0.3 s behind its time
        gone = run_schedule(plan, 0, time.monotonic() - 5)
    assert sum(gone.sent) == 0 and sum(gone.unsent) == 500 and gone.unsent == [500]


def test_port_budget_warning() -> None:
    query = make_query("www.lab.test")
    ports = LoadPlan(("127.0.0.1", 53), query, rate=1, duration=1).port_budget()  # this host's ephemeral range
    rate = ports + 1000
    assert "more than the" in LoadPlan(("127.0.0.1", 53), query, rate=rate, duration=1).warnings()[0]
    assert LoadPlan(("127.0.0.1", 53), query, rate=rate, duration=1, timeout=0.5).warnings() == []
    assert LoadPlan(("127.0.0.1", 53), query, rate=rate, duration=0.5).warnings() == []  # fewer queries than ports
    two = ("127.0.0.1", "127.0.0.2")
    assert LoadPlan(("127.0.0.1", 53), query, rate=rate, duration=1, sources=two).warnings() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0", "--duration", "1s"], "--rate"),
        (["--rate", "100", "--duration", "0s"], "must be longer than 0s"),
        (["--rate", "100", "--duration", "10"], "'10' is not a duration"),
        (["--rate", "100", "--duration", "1s", "--source-ips", "198.18.255.252/30"], "not assigned to a local interface"),
        (["--rate", "100", "--duration", "1s", "--source-ips", "::1/128"], "IPv6 sources for an IPv4 server"),
        (["--rate", "100", "--duration", "1s", "--source-ips", "127.0.0.0/33"], "127.0.0.0/33"),
        (["--rate", "100", "--duration", "1s", "--json", "/nonexistent/dir/x.json"], "/nonexistent/dir/x.json"),
        (["--rate", "100", "--duration", "1s", "--workers", "0"], "--workers"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(args: list[str], message: str) -> None:
    out = _run("load", "--server", "127.0.0.1:5353", *args)
    assert out.exit_code == 2, out.output + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.root
def test_in_a_namespace_with_source_addresses_added_to_an_interface(netns: NetNS) -> None:
    """The lab's shape: a server address and client addresses added to an interface, real port 53."""
    netns.run(["ip", "addr", "add", "10.53.0.1/32", "dev", "lo"])
    for i in range(1, 15):
        netns.run(["ip", "addr", "add", f"10.53.1.{i}/32", "dev", "lo"])
    responder = netns.popen([sys.executable, "-m", "kubeproxy.lab.dns.responder", "--listen", "10.53.0.1:53"],
                            stdout=-1)  # fmt: skip
    assert responder.stdout is not None and responder.stdout.readline().startswith("ready")
    dns_cli = [sys.executable, "-m", "kubeproxy.lab.dns"]

    check = netns.run([*dns_cli, "check", "--server", "10.53.0.1"], check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "answered    100/100" in check.stdout

    load = netns.run([*dns_cli, "load", "--server", "10.53.0.1", "--rate", "1000", "--duration", "1s",
                      "--source-ips", "10.53.1.0/28", "--json", "-"], check=False)  # fmt: skip
    assert load.returncode == 0, load.stderr
    data = json.loads(load.stdout)
    assert data["plan"]["source_addresses"] == 14
    assert data["totals"]["answered"] == data["totals"]["sent"] >= 970

    missing = netns.run([*dns_cli, "load", "--server", "10.53.0.1", "--rate", "10", "--duration", "1s",
                         "--source-ips", "10.53.2.0/30"], check=False)  # fmt: skip
    assert missing.returncode == 2
    assert "10.53.2.0/30: 2 of 2 addresses are not assigned to a local interface (first: 10.53.2.1)" in missing.stderr


@pytest.mark.root
def test_sender_port_exhaustion_is_counted_and_more_source_addresses_avoid_it(netns: NetNS) -> None:
    """Ten ephemeral ports and a server that never answers: in-flight queries hold every port."""
    netns.run(["sysctl", "-w", "net.ipv4.ip_local_port_range=40000 40009"])
    silent = netns.popen([sys.executable, "-m", "kubeproxy.lab.dns.responder", "--listen", "127.0.0.1:53",
                          "--drop-every", "1"], stdout=-1)  # fmt: skip
    assert silent.stdout is not None and silent.stdout.readline().startswith("ready")
    load = [sys.executable, "-m", "kubeproxy.lab.dns", "load", "--server", "127.0.0.1", "--rate", "100",
            "--duration", "1s", "--timeout", "2s", "--json", "-"]  # fmt: skip

    one = netns.run(load, check=False)
    assert one.returncode == 0, one.stderr
    assert "more than the 10 ephemeral ports of one source address" in one.stderr
    totals = json.loads(one.stdout)["totals"]
    assert totals["sent"] == 10 and totals["errors"] == 90 - totals["unsent"]
    assert set(totals["reasons"]) == {"timeout", "EAGAIN"}, totals["reasons"]

    # UDP sockets bound to different addresses may share a port number: 14 addresses, 140 ports.
    many = netns.run([*load, "--source-ips", "127.0.0.0/28"], check=False)
    assert many.returncode == 0, many.stderr
    assert "warning" not in many.stderr
    totals = json.loads(many.stdout)["totals"]
    assert totals["errors"] == 0 and totals["sent"] + totals["unsent"] == 100 and totals["sent"] >= 97


def test_progress_lines_show_how_far_the_run_is() -> None:
    from kubeproxy.lab.dns.load import run_load

    lines: list[str] = []
    with Responder() as r:
        plan = LoadPlan(r.address, make_query("www.lab.test.", 1), 200.0, 2.0, timeout=0.5, workers=1)
        report = run_load(plan, progress=lines.append)
    assert report.totals()["answered"] > 0
    assert lines and lines[-1] == "\n"  # the run ends the progress line
    assert all(line.startswith("\rdns load: ") and line.endswith("s of 2.5 s (200/s)") for line in lines[:-1])


def test_check_defaults_to_the_hosts_nameserver(tmp_path: Path) -> None:
    from kubeproxy.lab.dns.command_group import system_nameserver

    conf = tmp_path / "resolv.conf"
    conf.write_text("# written by hand\nsearch lab.test\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n")
    assert system_nameserver(conf) == "192.0.2.53"
    conf.write_text("search lab.test\n")
    assert system_nameserver(conf) is None
    assert system_nameserver(tmp_path / "missing") is None
