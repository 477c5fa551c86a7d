"""`doctor --rules` alone on the corpus's real dumps (tests/netfilter/corpus, as posted in public
issues): what the proxy's own rules say is read back, and a dump cut short (most posted dumps are
excerpts) gives no finding about what it lacks."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Report
from kubeproxy.doctor.reconstruct import state_from_rules
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node
from kubeproxy.proxy.config import validate
from tests.netfilter.corpus_bed import Entry, entries

ENTRIES = {e.name: e for e in entries()}


def _alone(entry: Entry) -> tuple[Report, list[str], int]:
    rs = detect.parse(entry.text)
    state, notes = state_from_rules(rs, "nftables" if entry.fmt == "nft" else "iptables")
    report = diagnose(DoctorInput(rs, state, validate(ProxyConfig()), Node.from_flags(ifaces=["eth0=10.0.0.2/24"]),
                                  NodeFacts(), "eth0"))  # fmt: skip
    return report, notes, len(state.services)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_dump_alone_gives_a_report_and_says_what_it_read(name: str) -> None:
    report, notes, services = _alone(ENTRIES[name])
    assert notes and notes[0].startswith("no --manifests or --kubeconfig")
    assert ("read back from the proxy's own rules" in notes[0]) == (services > 0)
    assert all(f.subject for f in report.findings)


def _kinds(report: Report) -> Counter[str]:
    return Counter(f.kind for f in report.findings)


def test_a_whole_dump_gives_the_services_its_reject_rules_name() -> None:
    entry = ENTRIES["centos7_2024_flannel_libvirt_docker"]
    report, _, services = _alone(entry)
    assert services == 6
    # Each "has no endpoints" comment in the dump, found here by text alone, is one finding.
    rejected = set(re.findall(r'"([^"]+) has no endpoints"', entry.text))
    found = {f.subject.removeprefix("Service ").rsplit(" (", 1)[0] for f in report.findings if f.kind == "no-endpoints"}
    assert found == rejected and len(found) == 8
    (snat,) = [f for f in report.findings if f.kind == "snat-capacity"]
    assert snat.subject == "Service default/kubernetes:https (TCP)"
    assert [e["address"] for e in snat.data["endpoints"]] == ["192.168.1.5:6443"]
    assert snat.data["bound_per_service"] == pytest.approx(64512 / 120)


def test_a_2016_dump_gives_the_dns_services_snat_bound() -> None:
    report, _, services = _alone(ENTRIES["coreos_2016_flannel_docker"])
    assert services == 1
    snat = {f.data["protocol"]: f for f in report.findings if f.kind == "snat-capacity"}
    assert sorted(snat) == ["TCP", "UDP"]
    assert [e["address"] for e in snat["UDP"].data["endpoints"]] == ["10.2.6.2:53"]
    assert snat["UDP"].data["bound_per_service"] == pytest.approx(64512 / 30)
    assert snat["UDP"].data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30, abs=0.1)


@pytest.mark.parametrize(("name", "left_out"), [
    ("kilo268_k3s_services", {"argocd/argocd-repo-server:server", "default/kubernetes:https",
                              "kube-system/coredns-coredns:udp-53"}),
    ("flannel835_kube_services", {"kube-system/tiller-deploy:tiller", "wubo-49/intelligencemaster:intelligencemaster-3"}),
    ("weave3363_kube_dns_split", {"kube-system/kube-dns:dns", "kube-system/kube-dns:dns-tcp"}),
    ("submariner1205_verbose_numbered", {"default/kubernetes:https"}),
])  # fmt: skip
def test_an_excerpt_leaves_out_the_ports_whose_endpoints_it_lacks(name: str, left_out: set[str]) -> None:
    report, notes, services = _alone(ENTRIES[name])
    said = {n.split(": left out", 1)[0] for n in notes if ": left out, the dump lacks" in n}
    assert left_out <= said
    assert services == 0 and "could be read back whole" in notes[0]
    kinds = _kinds(report)
    assert not kinds["no-endpoints"] and not kinds["not-translated"] and not kinds["snat-capacity"], kinds
