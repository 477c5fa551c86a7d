"""The BIND report's two dumps, with objects that match them (tests/fixtures/seed000/objects.yaml)."""

from __future__ import annotations

import pytest

from kubeproxy.backends.conntrack.flows import parse_flows
from kubeproxy.doctor.facts import NodeFacts
from tests.doctor.helpers import by_kind, seed_report


def test_kube_proxy_dump_gets_the_snat_finding_with_its_bound() -> None:
    report = seed_report("kube_proxy.iptables-save")
    udp = [f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP"]
    assert len(udp) == 1
    f = udp[0]
    assert f.subject == "Service default/ares-k29-bindapp:dns-udp-53 (UDP)"
    assert f.severity == "warning"
    # 64,512 ports / 30 s: the seed's 2,500 queries/s failed, 1,000-1,200 passed
    assert f.data["bound_per_service"] == pytest.approx(2150.4)
    assert f.data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30, abs=0.1)
    assert 1200 < f.data["health_fail_per_service"] < 2500
    assert {x["address"] for x in f.data["frontends"]} == {"10.24.138.29:53", "10.5.6.29:53", "203.0.113.29:53"}
    assert [e["address"] for e in f.data["endpoints"]] == ["10.100.13.3:53"]
    # the fixes, ranked: eTP=Local first, then the timeout, then more endpoints
    assert f.fixes[0].startswith("externalTrafficPolicy: Local")
    assert "udp-conntrack-timeout" in f.fixes[1]
    assert f.fixes[2].startswith("more endpoints")
    # the worst warning of the report is this one
    assert next(x for x in report.findings if x.severity != "critical") is f
    assert not by_kind(report, "foreign-dnat")
    assert not by_kind(report, "missing-jump")
    # the dump's own oddity: the API server's endpoint chain is declared but has no rules
    (untranslated,) = by_kind(report, "not-translated")
    assert untranslated.subject == "Service default/kubernetes:https (TCP)"
    assert any(e.endswith("KUBE-SEP-UPD7ND2TPNSDBE6L has no rules") for e in untranslated.evidence)


def test_manual_dump_gets_the_foreign_dnat_finding_and_no_snat() -> None:
    report = seed_report("manual_dnat.iptables-save")
    assert not by_kind(report, "snat-capacity")
    dnat = by_kind(report, "foreign-dnat")
    assert len(dnat) == 1
    f = dnat[0]
    assert f.subject == "nat PREROUTING line 4"
    assert f.data["dnat_to"] == ["10.100.13.3:53"]
    assert any("10.5.6.29:53 (external IP)" in s for s in f.data["services"])
    # DNAT to the service's own endpoint: the proxy is bypassed, the traffic is not lost
    assert f.severity == "warning"
    # the dump has the proxy's chains but none of its jumps or rules
    missing = {(m.data["table"], m.data["chain"]) for m in by_kind(report, "missing-jump")}
    assert ("nat", "PREROUTING") in missing and ("nat", "OUTPUT") in missing
    # TCP 53 is not caught by the manual rule and nothing else translates it
    untranslated = {f.subject for f in by_kind(report, "not-translated")}
    assert untranslated == {"Service default/ares-k29-bindapp:dns-tcp-53 (TCP)", "Service default/kubernetes:https (TCP)"}


def test_current_use_from_conntrack_entries_makes_it_critical() -> None:
    # 57,000 masqueraded queries in flight to the pod: 88% of the ports, past the lab's failure point (86%)
    lines = [
        f"udp 17 29 src=198.51.100.{i % 250} dst=10.5.6.29 sport={1024 + i % 60000} dport=53 [UNREPLIED] "
        f"src=10.100.13.3 dst=10.100.13.1 sport=53 dport={1024 + i} mark=0 use=1"
        for i in range(57_000)
    ]
    # and entries that are not masqueraded (the client's address kept) do not count
    lines += ["udp 17 29 src=198.51.100.9 dst=10.5.6.29 sport=5000 dport=53 src=10.100.13.3 dst=198.51.100.9 "
              "sport=53 dport=5000 mark=0 use=1"] * 10
    facts = NodeFacts(flows=parse_flows(lines))
    report = seed_report("kube_proxy.iptables-save", facts)
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.severity == "critical"
    assert f.data["endpoints"][0]["in_use"] == 57_000
    assert f.data["endpoints"][0]["utilisation"] == pytest.approx(57_000 / 64_512, abs=1e-4)


def test_node_udp_timeout_changes_the_bound() -> None:
    facts = NodeFacts(sysctls={"net.netfilter.nf_conntrack_udp_timeout": 60})
    report = seed_report("kube_proxy.iptables-save", facts)
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.data["timeout_seconds"] == 60
    # the lab: 800/s healthy besides its own 100/s of checks
    assert f.data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 60, abs=0.1)
