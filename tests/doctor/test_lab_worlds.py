"""Doctor --live on the lab's DNS worlds (kubeproxy.lab.dns: real `kubeproxy run`, real BIND).

The prediction, given the lab's own health-check rate as the other masqueraded flows, is compared
with the ramps of tests/doctor/snat_runs.py: those doctor's 0.86 was fitted on (1,600/s at a 30 s
UDP timeout, 800/s at 60 s, 10,000/s with the Service's 5 s annotation: they check how the rule
scales) and those predicted before they were run (45 s, 15 s and 60 s timeouts, two and three pods,
narrowed SNAT ranges, nftables at 30 s: docs/labs.md, "The prediction on runs it was not fitted on").
The ramps take minutes each and are not re-run here; the rules, timeouts, SNAT ranges and endpoint
shares are read from the running worlds.
"""

from __future__ import annotations

import pytest

from kubeproxy.cluster.state import build_state
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.findings import Report
from kubeproxy.doctor.live import read_node
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import validate
from tests.doctor.helpers import by_kind
from tests.doctor.snat_runs import CHECK_RATE, FITTED, HELD_OUT, LabRun, error

pytestmark = pytest.mark.root

world_mod = pytest.importorskip("kubeproxy.lab.dns.world")
scenarios = pytest.importorskip("kubeproxy.lab.dns.scenarios")
cluster_mod = pytest.importorskip("kubeproxy.lab.cluster")


def _doctor(scenario: str, udp_timeout: int | None = None, pods: int = 1,
            snat_ports: tuple[int, int] | None = None) -> Report:
    with world_mod.DnsWorld.build(scenarios.SCENARIOS[scenario], udp_timeout=udp_timeout, pods=pods) as w:
        if snat_ports is not None:
            w.narrow_snat_ports(*snat_ports)
        state, warnings = build_state(w.objects)
        assert not warnings
        got = read_node(w.node.name)
        cfg = validate(ProxyConfig(cluster_cidr=(cluster_mod.CLUSTER_CIDR,), hostname_override=cluster_mod.NODE_NAME))
        return diagnose(DoctorInput(got.ruleset, state, cfg, got.node, got.facts, "", got.rules_source,
                                    snat_other_flows=CHECK_RATE))


def _external_udp(report: Report) -> list[dict[str, object]]:
    return [f.data for f in by_kind(report, "snat-capacity")
            if f.data["protocol"] == "UDP" and any(x["kind"] != "cluster IP" for x in f.data["frontends"])]


def _predicted(run: LabRun) -> dict[str, object]:
    found = _external_udp(_doctor(run.scenario, run.udp_timeout, run.pods, run.snat_ports))
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("run", FITTED, ids=lambda r: r.name)
def test_predicted_failure_rate_scales_as_on_the_runs_it_was_fitted_on(run: LabRun) -> None:
    predicted = _predicted(run)["health_fail_per_service"]
    assert isinstance(predicted, float)
    assert abs(error(predicted, run)) < 0.25, (predicted, run)


@pytest.mark.parametrize("run", HELD_OUT, ids=lambda r: r.name)
def test_predicted_failure_rate_on_runs_it_was_not_fitted_on(run: LabRun) -> None:
    found = _predicted(run)
    ports = found["snat_ports"]
    assert isinstance(ports, dict)
    assert ports["count"] == (run.snat_ports[1] - run.snat_ports[0] + 1 if run.snat_ports else 64512)
    assert isinstance(found["endpoints"], list) and len(found["endpoints"]) == run.pods
    predicted = found["health_fail_per_service"]
    assert isinstance(predicted, float)
    assert abs(error(predicted, run)) < 0.10, (predicted, run)
    assert predicted < run.first_failing, (predicted, run)


def test_local_world_has_no_snat_finding_for_external_traffic() -> None:
    assert _external_udp(_doctor("local")) == []


def test_dnat_world_has_the_foreign_rule_and_no_snat_for_the_external_ip() -> None:
    report = _doctor("dnat")
    # the manual rule catches the external IP only: its queries keep the client address, while
    # the NodePort still goes through the proxy's rules and is masqueraded
    (udp,) = _external_udp(report)
    addresses = {x["address"] for x in udp["frontends"]}  # type: ignore[attr-defined]
    assert "203.0.113.53:53" not in addresses and any(a.endswith(":30053") for a in addresses)
    dnat = by_kind(report, "foreign-dnat")
    assert len(dnat) == 1 and dnat[0].data["chain"] == "PREROUTING"
    assert any("203.0.113.53:53 (external IP)" in s for s in dnat[0].data["services"])
