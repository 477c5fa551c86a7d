"""`kubeproxy lab dns`: the seed's SNAT collapse reproduced in namespaces, and the pieces it is made of.

The root tests build the real world (BIND 9 pods, `kubeproxy run` on the node, the seed's DNS
Service) and send real traffic; the CI-sized one runs `snat` and `local` with the same load and
checks that only the masquerading one collapses, at the SNAT port limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import CLIENT_IP, NODE_IP
from kubeproxy.lab.dns.bind import ANSWER_IP, ANSWER_NAME, BindServer, named_conf, zone_text
from kubeproxy.lab.dns.command_group import lab, parse_ramp
from kubeproxy.lab.dns.lab import Check, LabPlan, Sample, ScenarioResult, Step
from kubeproxy.lab.dns.scenarios import SCENARIOS
from kubeproxy.lab.dns.world import EXTERNAL_IP, SNAT_PORTS, DnsWorld, LabError, check_proxy_mode


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(lab, list(args), catch_exceptions=False)


# ---- without root: arguments, plans and the arithmetic of a report ---------------------------------


def test_parse_ramp() -> None:
    assert parse_ramp("1000:3000:500") == (1000, 1500, 2000, 2500, 3000)
    assert parse_ramp("500:500:100") == (500,)
    assert parse_ramp("100:350:100") == (100, 200, 300)
    for bad, why in (("1000:3000", "FROM:TO:STEP"), ("a:b:c", "numbers"), ("3000:1000:5", "FROM <= TO"),
                     ("0:10:1", "0 < FROM"), ("1:1000:1", "at most 40")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            parse_ramp(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "snat", "--rate", "1000", "--ramp", "1:2:1"], "--rate or --ramp, not both"),
        (["--scenario", "snat", "--ramp", "1:2"], "FROM:TO:STEP"),
        (["--scenario", "snat", "--rate", "90000"], "90000"),
        (["--scenario", "snat", "--udp-timeout", "0"], "at least 1s"),
        (["--scenario", "snat", "--udp-timeout", "soon"], "not a duration"),
        (["--scenario", "nosuch"], "nosuch"),
        (["--scenario", "snat", "--duration", "0s"], "longer than 0s"),
    ],
)
def test_bad_arguments_are_named_not_tracebacks(args: list[str], message: str) -> None:
    out = CliRunner().invoke(lab, ["dns", *args])
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert "Traceback" not in out.output


def test_plan_bounds() -> None:
    snat = SCENARIOS["snat"]
    assert LabPlan((snat,), (3000.0,), 40).errors() == []
    problems = LabPlan((snat,), (3000.0, 40000.0), 700, udp_timeout=0, pods=9).errors()
    assert any("40000" in p for p in problems)
    assert any("duration 700" in p for p in problems)
    assert any("UDP timeout 0" in p for p in problems)
    assert any("9 pods" in p for p in problems)
    # Warnings: a table that fills before the SNAT ports do, and ramp steps shorter than the timeout.
    warnings = LabPlan((snat,), (5000.0, 6000.0), 10).warnings(udp_timeout=60, conntrack_max=262144)
    assert any("nf_conntrack_max" in w for w in warnings)
    assert any("shorter than the 60 s UDP timeout" in w for w in warnings)


def _result(checks: list[tuple[float, int]], steps: list[tuple[float, float]], duration: float = 3) -> ScenarioResult:
    r = ScenarioResult(SCENARIOS["snat"], "", udp_timeout=30, conntrack_max=262144)
    for rate, start in steps:
        seconds = [{"second": s, "sent": int(rate), "answered": int(rate) - s, "lost": s} for s in range(int(duration))]
        totals = {"sent": int(rate * duration), "answered": int(rate * duration) - 3, "lost": 3}
        r.steps.append(Step(rate, duration, start, start + 0.05, totals, seconds))
    r.checks = [Check(t, 100, answered, {} if answered == 100 else {"timeout": 100 - answered}) for t, answered in checks]
    r.samples = [Sample(0, 10, 5), Sample(1, 70000, 7), Sample(2, 64000, 12)]
    return r


def test_report_arithmetic() -> None:
    r = _result(checks=[(0, 100), (1, 100), (2, 100), (3, 100), (4, 99), (5, 0)], steps=[(1000, 0), (2000, 3)])
    assert r.rate == 2000 and r.duration == 6
    assert r.sent == 9000 and r.answered == 8994 and r.lost == 6
    assert [c.t for c in r.failed_checks] == [4, 5]
    assert r.first_failed_check == 4
    assert r.max_healthy_rate == 1000  # the 2000/s step had failed checks
    assert r.conntrack_peak == 70000
    assert r.insert_failed == 7
    series = r.series()
    assert [row["t"] for row in series] == [0, 1, 2, 3, 4, 5]
    assert [row["offered"] for row in series] == [1000, 1000, 1000, 2000, 2000, 2000]
    assert [row["answered"] for row in series] == [1000, 999, 998, 2000, 1999, 1998]
    assert [row["check_answered"] for row in series] == [100, 100, 100, 100, 99, 0]
    assert [row["conntrack"] for row in series][:3] == [10, 70000, 64000]
    data = r.to_json()
    for key in ("name", "rate", "duration_s", "sent", "answered", "lost", "health_checks", "health_checks_failed",
                "first_failed_check_s", "conntrack_peak", "max_healthy_rate"):  # fmt: skip
        assert key in data
    assert data["health_checks"] == 6 and data["health_checks_failed"] == 2
    assert [s["health_checks"] for s in data["steps"]] == [3, 3]


def test_no_healthy_rate_when_the_first_step_fails_and_none_without_failures() -> None:
    assert _result(checks=[(0, 100), (1, 98)], steps=[(3000, 0)]).max_healthy_rate is None
    healthy = _result(checks=[(0, 100), (1, 100), (2, 100)], steps=[(3000, 0)])
    assert healthy.max_healthy_rate == 3000 and healthy.first_failed_check is None


def test_named_conf_is_valid_and_authoritative_only(tmp_path: Path) -> None:
    (tmp_path / "zone.db").write_text(zone_text())
    conf = tmp_path / "named.conf"
    conf.write_text(named_conf(tmp_path, "10.244.1.10"))
    text = conf.read_text()
    assert "recursion no;" in text and "listen-on port 53 { 10.244.1.10; };" in text and "notify no;" in text
    checked = subprocess.run(["named-checkconf", "-z", str(conf)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ---- as root: BIND, the agents and the world -----------------------------------------------------------


def _dig(ns: L.NetNS, server: str, name: str = ANSWER_NAME) -> subprocess.CompletedProcess[str]:
    return ns.run(["dig", f"@{server}", "+time=1", "+tries=1", name, "A"], check=False, timeout=10)


@pytest.mark.root
def test_bind_answers_its_zone_on_its_address_only(netns: L.NetNS) -> None:
    netns.run(["ip", "addr", "add", "10.53.0.1/32", "dev", "lo"])
    with BindServer.start(netns, "10.53.0.1") as server:
        answer = _dig(netns, "10.53.0.1")
        assert "status: NOERROR" in answer.stdout and ANSWER_IP in answer.stdout
        # Recursion is off: a name outside the zone is refused, never looked up elsewhere.
        assert "status: REFUSED" in _dig(netns, "10.53.0.1", "example.com.").stdout
        # It listens on its address only.
        assert _dig(netns, "127.0.0.1").returncode != 0
        workdir = server.workdir
        assert (workdir / "named.pid").exists()
    assert not workdir.exists()
    assert server.process.poll() is not None


@pytest.mark.root
def test_periodic_agent_stops_when_told_and_when_its_lab_goes(netns: L.NetNS) -> None:
    argv = [sys.executable, "-m", "kubeproxy.lab.dns.monitor", "conntrack", "--interval", "0.2"]
    start = time.time() + 1.5
    proc = netns.popen([*argv, "--start", str(start)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(f"stop {start + 0.9}\n")
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 0  # stdin still open: it stopped because it was told to
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdin.close()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [round(r["t"], 1) for r in lines] == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert all(isinstance(r["count"], int) for r in lines)
    # Standard input closed (the lab died): the agent exits at once, whatever its schedule.
    proc = netns.popen([*argv, "--start", str(time.time() + 60)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def _reply_destinations(world: DnsWorld) -> set[str]:
    """Where the pod's answers to the external IP's queries go, as the node's conntrack entries say."""
    out = world.node.run(["conntrack", "-L", "-p", "udp", "--orig-dst", EXTERNAL_IP], check=False).stdout
    found = set()
    for line in out.splitlines():
        fields = [f for f in line.split() if f.startswith("dst=")]
        if len(fields) == 2:
            found.add(fields[1].removeprefix("dst="))
    return found


@pytest.mark.root
@pytest.mark.parametrize(
    ("name", "masqueraded"),
    [("snat", True), ("dnat", False), ("local", False), ("nftables", True), ("nft-ct-timeout", True)],
)
def test_scenarios_decide_who_the_pod_answers(name: str, masqueraded: bool) -> None:
    with DnsWorld.build(SCENARIOS[name], udp_timeout=45) as world:
        assert world.udp_timeout() == 45
        assert world.conntrack_count() == 0  # flushed after the readiness queries
        assert world.answers(EXTERNAL_IP)
        assert world.answers(world.pod_ips[0])  # the client reaches the pod straight, for dnsperf
        assert _reply_destinations(world) == {NODE_IP if masqueraded else CLIENT_IP}
        if name == "dnat":
            assert world.manual_dnat_packets() >= 1
        nodes = {p.ns.name for p in world.cluster.pods.values()} | {world.node.name, world.client.name}
    left = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    assert not nodes & left


# ---- as root: the seed's collapse, CI-sized ---------------------------------------------------------------

# 3,000 queries/s (and the health check's 100/s) fill the 64,512 SNAT ports in about 21 s, inside
# the default 30 s UDP timeout, so `snat` collapses within 25 s; `local` gets the same load (more
# flows than there are SNAT ports) and keeps answering. About a minute for both.
CI_RATE, CI_SECONDS = 3000, 25


@pytest.mark.root
def test_snat_collapses_at_the_snat_port_limit_local_does_not(tmp_path: Path) -> None:
    report, plot = tmp_path / "lab.json", tmp_path / "lab.png"
    out = _invoke("dns", "--scenario", "snat", "--scenario", "local", "--rate", str(CI_RATE), "--duration", f"{CI_SECONDS}s",
                  "--udp-timeout", "30", "--json", str(report), "--plot", str(plot))  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(report.read_text())
    snat, local = data["scenarios"]
    assert (snat["name"], local["name"]) == ("snat", "local")
    for s in (snat, local):
        assert s["udp_timeout_s"] == 30 and s["duration_s"] == CI_SECONDS
        assert s["health_checks"] >= CI_SECONDS - 2, s["checks"]  # one a second
        assert s["sent"] >= 0.9 * CI_RATE * CI_SECONDS, s["steps"]  # the sender (nearly) kept its schedule
    # snat: every masqueraded query holds one of the node's 64,512 source ports for 30 s; once they
    # are taken, new queries (and the health check's) are dropped.
    assert snat["health_checks_failed"] > 0
    assert snat["first_failed_check_s"] is not None
    assert 0.97 * SNAT_PORTS <= snat["conntrack_peak"] <= SNAT_PORTS + 50, snat["conntrack_peak"]
    assert snat["lost"] > 0 and snat["conntrack_insert_failed"] > 0
    assert snat["max_healthy_rate"] is None
    # local: the same load, no SNAT: more flows than there are SNAT ports, all answered.
    assert local["health_checks_failed"] == 0, local["checks"]
    assert local["first_failed_check_s"] is None and local["max_healthy_rate"] == CI_RATE
    assert local["conntrack_peak"] > SNAT_PORTS
    assert local["lost"] == 0 and local["answered"] == local["sent"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "snat" in out.output and "local" in out.output and "max healthy rate" in out.output


@pytest.mark.root
def test_a_short_service_udp_timeout_keeps_snat_healthy(tmp_path: Path) -> None:
    # The same load that collapses `snat` above, through the nftables mode with the Service's
    # own 5 s UDP timeout: ports come back after 5 s, so the table never fills.
    report = tmp_path / "lab.json"
    out = _invoke("dns", "--scenario", "nft-ct-timeout", "--rate", str(CI_RATE), "--duration", f"{CI_SECONDS}s",
                  "--udp-timeout", "30", "--json", str(report))  # fmt: skip
    assert out.exit_code == 0, out.output
    (r,) = json.loads(report.read_text())["scenarios"]
    assert (r["udp_timeout_s"], r["service_udp_timeout_s"]) == (30, 5)
    assert r["sent"] >= 0.9 * CI_RATE * CI_SECONDS, r["steps"]
    assert r["health_checks_failed"] == 0 and r["lost"] == 0, r["checks"]
    assert r["conntrack_peak"] < 0.75 * SNAT_PORTS  # includes expired entries not yet collected
    left = r["flow_timeouts_left_s"]
    assert left["entries"] > CI_RATE and left["max"] <= 5  # the masqueraded flows carry the Service's timeout


@pytest.mark.root
def test_a_proxy_mode_that_cannot_run_is_reported_before_any_world_is_built() -> None:
    with pytest.raises(LabError, match=r"--proxy-mode no-such-mode` cannot run here \(exit status 1\)"):
        check_proxy_mode("no-such-mode")
