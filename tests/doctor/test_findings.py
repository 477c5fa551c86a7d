"""Each finding family on small worlds rendered by our own iptables renderer (no root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.conntrack.flows import parse_flows
from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.facts import NodeFacts
from kubeproxy.doctor.findings import Finding
from kubeproxy.lab import builders as O
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.netfilter import detect
from kubeproxy.proxy.config import validate
from tests.doctor.helpers import (
    CFG,
    NODE_IFACES,
    NODE_ROUTES,
    V6_CFG,
    V6_IFACES,
    V6_ROUTES,
    by_kind,
    dns_world,
    rendered_report,
    state_of,
    v6_world,
)
from tests.doctor.snat_runs import CHECK_RATE, FITTED, HELD_OUT, LabRun, error


def _rules(objs: list[dict[str, object]]) -> str:
    return with_jumps(render_iptables(state_of(objs), validate(CFG)).rendered.text)


def _lab_prediction(run: LabRun) -> Finding:
    """doctor's external UDP SNAT finding on the rendered rules of the lab world `run` describes."""
    facts = NodeFacts(sysctls={"net.netfilter.nf_conntrack_udp_timeout": run.node_timeout})
    objs = dns_world(pods=run.pods)
    rules = None
    if run.snat_ports is not None:
        # the narrowed range ahead of the proxy's own MASQUERADE, as bench/snat_prediction.py inserts it
        lo, hi = run.snat_ports
        narrowed = f"-A POSTROUTING -p udp -m mark --mark 0x4000/0x4000 -j MASQUERADE --to-ports {lo}-{hi}"
        rules = _rules(objs).replace("-A POSTROUTING ", narrowed + "\n-A POSTROUTING ", 1)
    report = rendered_report(objs, facts, rules=rules, snat_other_flows=CHECK_RATE)
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.severity == "warning"
    assert {"external IP", "node port"} <= {x["kind"] for x in f.data["frontends"]}
    return f


@pytest.mark.parametrize("run", [r for r in FITTED if r.scenario == "snat"], ids=lambda r: r.name)
def test_snat_prediction_scales_with_the_timeout_on_the_runs_it_was_fitted_on(run: LabRun) -> None:
    # HEALTHY_FRACTION came from these runs: agreement here shows the rule's scaling, not a prediction
    f = _lab_prediction(run)
    assert abs(error(f.data["health_fail_per_service"], run)) < 0.25


# The iptables-mode runs: the renderer here is iptables'; the others are checked live (test_lab_worlds).
HELD_OUT_IPTABLES = [r for r in HELD_OUT if r.scenario == "snat"]


@pytest.mark.parametrize("run", HELD_OUT_IPTABLES, ids=lambda r: r.name)
def test_snat_prediction_on_lab_runs_it_was_not_fitted_on(run: LabRun) -> None:
    f = _lab_prediction(run)
    expected_ports = run.snat_ports[1] - run.snat_ports[0] + 1 if run.snat_ports else 64512
    assert f.data["snat_ports"]["count"] == expected_ports
    assert len(f.data["endpoints"]) == run.pods
    predicted = f.data["health_fail_per_service"]
    # every held-out run, narrowed ranges included, came within 10% of its max healthy rate
    assert abs(error(predicted, run)) < 0.10, (predicted, run)
    assert predicted < run.first_failing, (predicted, run)


def test_local_world_gets_no_external_snat_finding() -> None:
    report = rendered_report(dns_world(etp="Local"))
    for f in by_kind(report, "snat-capacity"):
        # only traffic to the ClusterIP from outside the pod range is masqueraded (upstream does that too)
        assert {x["kind"] for x in f.data["frontends"]} == {"cluster IP"}
        assert f.severity == "info"


def test_more_endpoints_raise_the_service_bound_linearly() -> None:
    report = rendered_report(dns_world(pods=4))
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert [e["share"] for e in f.data["endpoints"]] == [0.25] * 4
    assert f.data["bound_per_service"] == pytest.approx(4 * f.data["bound_per_endpoint"], rel=1e-3)


def test_annotation_is_reported_as_ignored_in_iptables_mode() -> None:
    report = rendered_report(dns_world(annotations={"kubeproxy.io/udp-conntrack-timeout": "5s"}))
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.data["timeout_seconds"] == 30
    assert any("nftables mode only" in e for e in f.evidence)


def test_random_fully_and_port_range_come_from_the_masquerade_rule() -> None:
    objs = dns_world()
    rules = _rules(objs)
    rules = rules.replace("-j MASQUERADE", "-j MASQUERADE --to-ports 20000-29999 --random-fully")
    report = rendered_report(objs, rules=rules)
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.data["snat_ports"] == {"low": 20000, "high": 29999, "count": 10000, "random_fully": True, "from_rule": True}
    assert f.data["bound_per_endpoint"] == pytest.approx(10000 / 30, abs=0.1)


def test_foreign_dnat_to_an_address_that_is_no_endpoint_is_critical() -> None:
    objs = dns_world()
    rules = _rules(objs)
    manual = "-A PREROUTING -d 203.0.113.53/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.244.9.9:53"
    rules = _prepend(rules, "nat", "PREROUTING", manual)
    report = rendered_report(objs, rules=rules)
    f = by_kind(report, "foreign-dnat")
    assert len(f) == 1 and f[0].severity == "critical"
    assert f[0].data["dnat_to"] == ["10.244.9.9:53"]
    # the external IP's UDP flows no longer reach the proxy's rules, so they are not masqueraded either
    udp = next(x for x in by_kind(report, "snat-capacity") if x.data["protocol"] == "UDP")
    assert "203.0.113.53:53" not in {x["address"] for x in udp.data["frontends"]}


def _prepend(rules: str, table: str, chain: str, rule: str) -> str:
    """Put `rule` first in `chain` of `table` (as `iptables -I` would)."""
    out: list[str] = []
    current = ""
    done = False
    for line in rules.splitlines():
        if line.startswith("*"):
            current = line[1:]
        if not done and current == table and line.startswith(f"-A {chain} "):
            out.append(rule)
            done = True
        out.append(line)
    assert done
    return "\n".join(out) + "\n"


def test_foreign_drop_of_service_traffic() -> None:
    objs = dns_world()
    rules = _rules(objs)
    rules = _prepend(rules, "filter", "FORWARD", "-A FORWARD -p udp -m udp --dport 53 -j DROP")
    report = rendered_report(objs, rules=rules)
    drops = by_kind(report, "foreign-drop")
    assert len(drops) == 1 and drops[0].severity == "critical"
    assert drops[0].subject.startswith("filter FORWARD line")


def test_missing_jump_and_untranslated_service() -> None:
    objs = dns_world()
    rules = _rules(objs)
    rules = "\n".join(line for line in rules.splitlines() if not line.startswith("-A PREROUTING "))
    report = rendered_report(objs, rules=rules + "\n")
    missing = by_kind(report, "missing-jump")
    assert [(m.data["table"], m.data["chain"], m.data["target"]) for m in missing] == [("nat", "PREROUTING", "KUBE-SERVICES")]
    assert missing[0].severity == "critical"
    assert {f.subject for f in by_kind(report, "not-translated")} == {"Service default/dns:dns (UDP)",
                                                                     "Service default/dns:dns-tcp (TCP)"}
    assert report.findings[0].severity == "critical"


def test_stale_chain_and_outside_reference() -> None:
    objs = dns_world()
    rules = _rules(objs)
    svc_chain = next(line.split()[0][1:] for line in rules.splitlines() if line.startswith(":KUBE-SVC-"))
    extra = [":KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]", ":KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]", ":MY-CHAIN - [0:0]",
             "-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB",
             "-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.244.3.3:80",
             f"-A MY-CHAIN -j {svc_chain}"]
    rules = rules.replace("*nat\n", "*nat\n" + "\n".join(extra) + "\n", 1)
    report = rendered_report(objs, rules=rules)
    stale = {f.subject: f for f in by_kind(report, "stale-chain")}
    assert "nat KUBE-SVC-AAAAAAAAAAAAAAAA" in stale  # nothing jumps to it
    assert "nat KUBE-SEP-BBBBBBBBBBBBBBBB" not in stale  # reached from the stale chain: reported once, above
    outside = by_kind(report, "outside-reference")
    assert [f.subject for f in outside] == [f"nat {svc_chain}"]
    assert outside[0].data["from"] == ["MY-CHAIN"]


def test_services_that_cannot_work() -> None:
    ports = [O.Port("http", 80, 8080)]
    objs = [
        O.node("node-1", "192.168.0.2", "10.244.1.0/24"),
        O.service("empty", "10.96.0.1", ports),
        O.service("local", "10.96.0.2", [O.Port("http", 80, 8080, node_port=30080)], type="NodePort",
                  external_traffic_policy="Local"),
        O.endpoint_slice("local", [O.Backend("10.244.2.5", "node-2")], ports),
        O.service("dying", "10.96.0.3", ports),
        O.endpoint_slice("dying", [O.Backend("10.244.2.6", "node-2", ready=False, serving=True, terminating=True)], ports),
        O.service("down", "10.96.0.4", ports),
        O.endpoint_slice("down", [O.Backend("10.244.2.7", "node-2", ready=False, serving=False)], ports),
    ]
    report = rendered_report(objs)
    kinds = {(f.kind, f.subject) for f in report.findings}
    assert ("no-endpoints", "Service default/empty:http (TCP)") in kinds
    assert ("no-local-endpoint", "Service default/local:http (TCP)") in kinds
    assert ("only-terminating", "Service default/dying:http (TCP)") in kinds
    assert ("no-ready-endpoints", "Service default/down:http (TCP)") in kinds


def test_topology_hints_that_exclude_this_zone() -> None:
    ports = [O.Port("http", 80, 8080)]
    node = O.node("node-1", "192.168.0.2", "10.244.1.0/24")
    node["metadata"]["labels"]["topology.kubernetes.io/zone"] = "zone-a"
    eps = O.endpoint_slice("web", [O.Backend("10.244.2.5", "node-2")], ports)
    eps["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-b"}]}
    report = rendered_report([node, O.service("web", "10.96.0.9", ports), eps])
    f = by_kind(report, "topology-excludes-zone")
    assert len(f) == 1 and "zone-a" in f[0].title


def test_conntrack_health() -> None:
    facts = NodeFacts(sysctls={"net.netfilter.nf_conntrack_count": 240_000, "net.netfilter.nf_conntrack_max": 262_144},
                      stats={"insert_failed": 30_493, "drop": 0, "early_drop": 12})
    report = rendered_report(dns_world(), facts)
    full = by_kind(report, "conntrack-full")
    assert len(full) == 1 and full[0].severity == "critical" and full[0].data["fill"] == pytest.approx(0.9155, abs=1e-3)
    drops = by_kind(report, "conntrack-drops")
    assert drops[0].data["stats"] == {"insert_failed": 30_493, "early_drop": 12}
    quiet = rendered_report(dns_world(), NodeFacts(sysctls={"net.netfilter.nf_conntrack_count": 10,
                                                             "net.netfilter.nf_conntrack_max": 262_144}))
    assert not by_kind(quiet, "conntrack-full") and not by_kind(quiet, "conntrack-drops")


def test_kube_services_length_cost() -> None:
    ports = [O.Port("http", 80, 8080)]
    objs = [O.node("node-1", "192.168.0.2", "10.244.1.0/24")]
    for i in range(2600):
        name = f"s{i}"
        objs += [O.service(name, f"10.96.{i // 250}.{i % 250 + 1}", ports),
                 O.endpoint_slice(name, [O.Backend(f"10.244.{2 + i // 250}.{i % 250 + 1}", "node-2")], ports)]
    report = rendered_report(objs)
    cost = by_kind(report, "rule-walk-cost")
    assert len(cost) == 1
    n = cost[0].data["rules"]
    assert n >= 2600
    assert cost[0].data["extra_us"] == pytest.approx(n * 7.1 / 1000, abs=0.1)
    assert cost[0].severity == "info"


def test_snat_watch_sample_counts_masqueraded_flows_per_endpoint() -> None:
    from kubeproxy.backends.conntrack.flows import parse_flows
    from kubeproxy.doctor import snat_gauge
    from kubeproxy.model.node_model import build_view

    state = state_of(dns_world(pods=2))
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-1")
    targets = snat_gauge.masqueraded_endpoints(view)
    assert sorted(targets) == ["10.244.1.10:53", "10.244.1.11:53"]
    lines = [f"udp 17 29 src=100.64.0.{i % 200} dst=203.0.113.53 sport={2000 + i} dport=53 src=10.244.1.10 "
             f"dst=192.168.0.2 sport=53 dport={2000 + i}" for i in range(40_000)]
    lines += ["udp 17 29 src=100.64.0.1 dst=203.0.113.53 sport=9 dport=53 src=10.244.1.11 dst=100.64.0.1 sport=53 dport=9"]
    gauges = snat_gauge.sample(parse_flows(lines), targets, {"192.168.0.2"})
    assert [(g.endpoint, g.in_use) for g in gauges] == [("10.244.1.10:53", 40_000), ("10.244.1.11:53", 0)]
    # the fast path reads the same text to the same counts, and skips lines it cannot read
    assert snat_gauge.sample_text("\n".join([*lines, "garbage", "udp 17 29 src=1.2.3.4"]), targets, {"192.168.0.2"}) == gauges
    warned = snat_gauge.warnings(gauges)
    assert len(warned) == 1 and warned[0].startswith("Service default/dns:dns: endpoint 10.244.1.10:53 holds 40,000")
    local = build_view(state_of(dns_world(etp="Local")).services.values(), state.slices.values(), Family.IPV4, "node-1")
    assert snat_gauge.masqueraded_endpoints(local) == {}


def test_ipv6_service_frontends_get_the_snat_finding_from_an_ip6tables_dump() -> None:
    from kubeproxy.netfilter.node import Node

    objs = v6_world()
    state = state_of(objs)
    cfg = validate(V6_CFG)
    dump = with_jumps(render_iptables(state, cfg, family=Family.IPV6).rendered.text)
    facts = NodeFacts(flows=parse_flows("\n".join(
        f"udp 17 29 src=2001:db8:9::{i + 1} dst=2001:db8:113::53 sport={3000 + i} dport=53 src=fd00:244:1::10 "
        f"dst=fd00:244:1::1 sport=53 dport={3000 + i} mark=0 use=1" for i in range(30))))
    facts.node_ips.add("fd00:244:1::1")  # masqueraded to cni0's address, on the way to the pod
    node = Node.from_flags(ifaces=V6_IFACES, routes=V6_ROUTES)
    report = diagnose(DoctorInput(detect.parse(dump), state, cfg, node, facts, "eth0"))
    assert report.inputs["families"] == ["IPv6"]
    (f,) = by_kind(report, "snat-capacity")
    assert f.subject == "Service default/dns:dns (UDP, IPv6)"
    assert f.data["family"] == "IPv6"
    # from outside: the external IP, the NodePort on the node's addresses, and the ClusterIP (not from a pod)
    assert {fe["address"] for fe in f.data["frontends"]} == {
        "[2001:db8:113::53]:53", "[fd00:168::2]:30053", "[fd00:244:1::1]:30053", "[fd00:96::53]:53"}
    assert f.data["endpoints"] == [{"address": "[fd00:244:1::10]:53", "share": 1.0, "in_use": 30,
                                    "utilisation": round(30 / 64512, 4)}]
    assert f.data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30, abs=0.1)
    # eTP=Local: external traffic keeps its source, no SNAT finding for IPv6 either
    local = state_of(v6_world(etp="Local"))
    dump = with_jumps(render_iptables(local, cfg, family=Family.IPV6).rendered.text)
    report = diagnose(DoctorInput(detect.parse(dump), local, cfg, Node.from_flags(ifaces=V6_IFACES, routes=V6_ROUTES),
                                  NodeFacts(), "eth0"))
    # only the ClusterIP from outside the pod range is left, an info
    assert [(f.severity, [fe["kind"] for fe in f.data["frontends"]]) for f in by_kind(report, "snat-capacity")] == [
        ("info", ["cluster IP"])]


def test_a_dual_stack_nft_ruleset_gets_a_finding_per_family() -> None:
    from kubeproxy.backends.nftables.offline import render_nftables
    from kubeproxy.netfilter.node import Node

    state = state_of(v6_world(dual=True))
    cfg = validate(ProxyConfig(cluster_cidr=("10.244.0.0/16", "fd00:244::/48"), hostname_override="node-1"))
    text = "\n".join(render_nftables(state, cfg, family=fam).rendering.text() for fam in (Family.IPV4, Family.IPV6))
    node = Node.from_flags(ifaces=[*NODE_IFACES, *V6_IFACES], routes=[*NODE_ROUTES, *V6_ROUTES])
    report = diagnose(DoctorInput(detect.parse(text, "nft"), state, cfg, node, NodeFacts(), "eth0"))
    assert report.inputs["families"] == ["IPv4", "IPv6"]
    snat = by_kind(report, "snat-capacity")
    assert sorted(f.subject for f in snat) == ["Service default/dns:dns (UDP)", "Service default/dns:dns (UDP, IPv6)"]
    assert sorted(e["address"] for f in snat for e in f.data["endpoints"]) == ["10.244.1.10:53", "[fd00:244:1::10]:53"]


def test_doctor_takes_an_iptables_nodes_ipv4_and_ipv6_dumps_together(tmp_path: Any) -> None:
    import json

    import yaml
    from click.testing import CliRunner

    from kubeproxy.cli import main

    objs = v6_world(dual=True)
    state = state_of(objs)
    cfg = validate(ProxyConfig(cluster_cidr=("10.244.0.0/16", "fd00:244::/48"), hostname_override="node-1"))
    paths = []
    for fam in (Family.IPV4, Family.IPV6):
        path = tmp_path / f"{fam.nft}.save"
        path.write_text(with_jumps(render_iptables(state, cfg, family=fam).rendered.text))
        paths += ["--rules", str(path)]
    (tmp_path / "objs.yaml").write_text(yaml.safe_dump_all(objs))
    args = ["doctor", *paths, "--manifests", str(tmp_path / "objs.yaml"), "--hostname-override", "node-1",
            "--cluster-cidr", "10.244.0.0/16,fd00:244::/48", "--json"]
    for i in (*NODE_IFACES, *V6_IFACES):
        args += ["--iface", i]
    for r in (*NODE_ROUTES, *V6_ROUTES):
        args += ["--route", r]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 1), result.output
    out = json.loads(result.stdout)
    assert out["inputs"]["families"] == ["IPv4", "IPv6"]
    snat = [f for f in out["findings"] if f["kind"] == "snat-capacity" and f["severity"] == "warning"]
    assert sorted((f["data"]["family"], f["data"]["endpoints"][0]["address"]) for f in snat) == [
        ("IPv4", "10.244.1.10:53"), ("IPv6", "[fd00:244:1::10]:53")]


def test_doctor_counts_the_other_masqueraded_flows_it_is_given() -> None:
    import json

    from click.testing import CliRunner

    from kubeproxy.cli import main

    dump = str(Path(__file__).parents[1] / "fixtures" / "seed000" / "kube_proxy.iptables-save")

    def udp_finding(*extra: str) -> dict[str, Any]:
        result = CliRunner().invoke(main, ["doctor", "--rules", dump, "--json", *extra])
        assert result.exit_code in (0, 1), result.output
        found = [f for f in json.loads(result.stdout)["findings"]
                 if f["kind"] == "snat-capacity" and f["data"]["protocol"] == "UDP" and f["severity"] == "warning"]
        assert len(found) == 1
        return dict(found[0])

    alone, checked = udp_finding(), udp_finding("--snat-other-flows", "250")
    assert alone["data"]["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30, abs=0.1)
    assert checked["data"]["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 30 - 250, abs=0.1)
    assert checked["data"]["other_flows_per_service"] == 250
    # the finding says what it assumed about traffic the rules cannot show
    assert any("assuming no other masqueraded flows" in e and "--snat-other-flows" in e for e in alone["evidence"])
    assert any("250/s of other masqueraded flows" in e for e in checked["evidence"])
    bad = CliRunner().invoke(main, ["doctor", "--rules", dump, "--snat-other-flows", "-1"])
    assert bad.exit_code == 2 and "--snat-other-flows" in bad.output
