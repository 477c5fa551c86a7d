"""Doctor --live on the lab's DNS worlds (kubeproxy.lab.dns: real `kubeproxy run`, real BIND).

The prediction is checked against the max healthy rates `kubeproxy lab dns --ramp` measured
(docs/labs.md, "The capacity rule" and "nftables mode"): 1,600/s at a 30 s UDP timeout, 800/s at 60 s,
10,000/s with the Service's 5 s annotation. The ramps themselves take minutes each and are not
re-run here; the rules, timeouts and masquerading are read from the running worlds.
"""

from __future__ import annotations

import pytest

from kubeproxy.cluster.state import build_state
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.findings import Report
from kubeproxy.doctor.live import read_node
from kubeproxy.proxy.config import ProxyConfig, validate
from tests.doctor.helpers import by_kind

pytestmark = pytest.mark.root

world_mod = pytest.importorskip("kubeproxy.lab.dns.world")
scenarios = pytest.importorskip("kubeproxy.lab.dns.scenarios")
cluster_mod = pytest.importorskip("kubeproxy.lab.cluster")


def _doctor(scenario: str, udp_timeout: int | None = None) -> Report:
    with world_mod.DnsWorld.build(scenarios.SCENARIOS[scenario], udp_timeout=udp_timeout) as w:
        state, warnings = build_state(w.objects)
        assert not warnings
        got = read_node(w.node.name)
        cfg = validate(ProxyConfig(cluster_cidr=(cluster_mod.CLUSTER_CIDR,), hostname_override=cluster_mod.NODE_NAME))
        return diagnose(DoctorInput(got.ruleset, state, cfg, got.node, got.facts, "", got.rules_source))


def _external_udp(report: Report) -> list[dict[str, object]]:
    return [f.data for f in by_kind(report, "snat-capacity")
            if f.data["protocol"] == "UDP" and any(x["kind"] != "cluster IP" for x in f.data["frontends"])]


@pytest.mark.parametrize(("scenario", "udp_timeout", "measured"),
                         [("snat", None, 1600), ("snat", 60, 800), ("nft-ct-timeout", None, 10_000)])
def test_predicted_failure_rate_is_within_25_percent_of_the_lab(scenario: str, udp_timeout: int | None,
                                                                measured: int) -> None:
    found = _external_udp(_doctor(scenario, udp_timeout))
    assert len(found) == 1
    predicted = found[0]["health_fail_per_service"]
    assert isinstance(predicted, float)
    assert abs(predicted - measured) / measured < 0.25, (predicted, measured)


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
