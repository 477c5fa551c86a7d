"""`doctor --live` on real kernels: rules, sysctls and conntrack entries read inside namespaces.

The beds are tests/netfilter/kernel_bed.py's client -- node -- backend namespaces; the rules under
test go into the node's namespace only, and the traffic is the probe's real UDP queries.
"""

from __future__ import annotations

import json
import sys

import pytest

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.backends.nftables.offline import render_nftables
from kubeproxy.cluster.state import ClusterState
from kubeproxy.doctor.core import DoctorInput, diagnose
from kubeproxy.doctor.findings import Report
from kubeproxy.doctor.live import read_node
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import validate
from tests.doctor.helpers import CFG, SEED, V6_CFG, by_kind, dns_world, seed_state, state_of, v6_world
from tests.netfilter.kernel_bed import Bed, BedSpec, bed

pytestmark = pytest.mark.root

CT_DUMP = """
import json, sys
from kubeproxy.backends.conntrack import ctnetlink
d = ctnetlink.dump(sys.argv[1:], ("udp",))
print(json.dumps(sorted([*k, n] for k, n in d.counts.items())))
"""

SEED_BED: BedSpec = {
    "client_ip": "10.5.6.2/24",
    "node_front": ("eth3", "10.5.6.29/24"),
    "node_back": ("docker0", "10.100.13.1/24"),
    "backends": ["10.100.13.3/24"],
}
LAB_BED: BedSpec = {
    "client_ip": "192.168.0.1/24",
    "node_front": ("eth0", "192.168.0.2/24"),
    "node_back": ("cni0", "10.244.1.1/24"),
    "backends": ["10.244.1.10/24"],
}


def _live(b: Bed, state: ClusterState, cfg: ProxyConfig) -> Report:
    got = read_node(b.node.name)
    return diagnose(DoctorInput(got.ruleset, state, validate(cfg), got.node, got.facts, "", got.rules_source))


def test_live_seed_counts_the_snat_ports_in_use_and_reads_the_node_timeout() -> None:
    with bed(**SEED_BED) as b:
        b.load_iptables((SEED / "kube_proxy.iptables-save").read_text())
        b.node.run(["sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=60"])
        b.serve(b.backend, "udp", ["10.100.13.3:53"])
        sent = b.send("udp", "10.5.6.29:53", 40)
        assert len(sent) == 40
        report = _live(b, seed_state(), ProxyConfig(cluster_cidr=("10.24.0.0/16",)))
    assert "iptables" in report.inputs["rules"]["source"]
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.data["timeout_seconds"] == 60  # read from the namespace, not the kernel default
    assert f.data["health_fail_per_service"] == pytest.approx(0.86 * 64512 / 60, abs=0.1)
    # every query was masqueraded to docker0's address and holds one port
    assert f.data["endpoints"] == [{"address": "10.100.13.3:53", "share": 1.0, "in_use": 40,
                                    "utilisation": round(40 / 64512, 4)}]
    assert report.inputs["conntrack_entries"] >= 40
    assert "insert_failed" in report.inputs["conntrack_stats"]
    assert not by_kind(report, "foreign-dnat") and not by_kind(report, "missing-jump")


def test_live_manual_dnat_is_a_foreign_rule_and_keeps_the_client_address() -> None:
    with bed(**SEED_BED) as b:
        b.load_iptables((SEED / "manual_dnat.iptables-save").read_text())
        b.serve(b.backend, "udp", ["10.100.13.3:53"])
        b.send("udp", "10.5.6.29:53", 10)
        report = _live(b, seed_state(), ProxyConfig(cluster_cidr=("10.24.0.0/16",)))
    assert not by_kind(report, "snat-capacity")
    f = by_kind(report, "foreign-dnat")
    assert len(f) == 1 and f[0].data["chain"] == "PREROUTING" and f[0].data["dnat_to"] == ["10.100.13.3:53"]


def test_live_nftables_with_the_timeout_annotation() -> None:
    # 30 s rather than the lab's 5 s: on a loaded CI machine the probe and the read took over 5 s
    # and the first query's entry had expired (19 of 20 counted).
    objs = dns_world(annotations={"kubeproxy.io/udp-conntrack-timeout": "30s"})
    state = state_of(objs)
    text = render_nftables(state, validate(CFG)).rendering.text()
    with bed(**LAB_BED) as b:
        b.load_nft(text)
        b.serve(b.backend, "udp", ["10.244.1.10:53"])
        b.send("udp", "203.0.113.53:53", 20)
        report = _live(b, state, CFG)
    assert report.inputs["rules"]["mode"] == "nftables"
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP")
    assert f.data["timeout_source"].startswith("annotation")
    assert f.data["snat_ports"]["random_fully"] is True  # upstream's nftables masquerade
    # no other flows given: 86% of the ports in use (the lab's checks passed up to 1,600/s besides their own 100/s)
    assert f.data["health_fail_per_service"] == pytest.approx(64512 * 0.86 / 30, abs=0.1)
    assert f.data["endpoints"][0]["in_use"] == 20


def test_live_iptables_rendered_by_us_without_masquerade_for_local_policy() -> None:
    objs = dns_world(etp="Local")
    state = state_of(objs)
    with bed(**LAB_BED) as b:
        b.load_iptables(with_jumps(render_iptables(state, validate(CFG), nfacct_counters=()).rendered.text))
        b.serve(b.backend, "udp", ["10.244.1.10:53"])
        b.send("udp", "203.0.113.53:53", 10)
        report = _live(b, state, CFG)
    udp = [f for f in by_kind(report, "snat-capacity") if f.data["protocol"] == "UDP"]
    # only the ClusterIP reached from outside the pod range is masqueraded; the external IP is not
    assert len(udp) == 1 and [x["kind"] for x in udp[0].data["frontends"]] == ["cluster IP"]
    assert udp[0].severity == "info"
    # the 10 queries to the external IP kept the client's address: no SNAT port is held
    assert udp[0].data["endpoints"][0]["in_use"] == 0
    assert report.inputs["conntrack_entries"] >= 10


def test_live_ipv6_service_reads_ip6tables_and_counts_ipv6_snat_ports() -> None:
    # The node holds the IPv6 world's ip6tables rules only: doctor reads ip6tables-save beside
    # iptables-save and counts the IPv6 flows conntrack holds.
    objs = v6_world()
    state = state_of(objs)
    cfg = validate(V6_CFG)
    dual: BedSpec = {**LAB_BED, "v6": ("fd00:168::1/64", "fd00:168::2/64", "fd00:244:1::1/64", ["fd00:244:1::10/64"])}
    with bed(**dual) as b:
        rules = render_iptables(state, cfg, nfacct_counters=(), family=Family.IPV6).rendered.text
        b.load_iptables(with_jumps(rules), restore="ip6tables-restore")
        b.serve(b.backend, "udp", ["[fd00:244:1::10]:53"])
        sent = b.send("udp", "[2001:db8:113::53]:53", 25)
        assert all(isinstance(r, dict) for r in sent), sent
        report = _live(b, state, V6_CFG)
        # the live gauge's ctnetlink count sees the same IPv6 tuples (run inside the node's namespace)
        counted = b.node.run([sys.executable, "-c", CT_DUMP, "fd00:168::2", "fd00:244:1::1"]).stdout
    assert json.loads(counted) == [["fd00:244:1::10", "fd00:244:1::1", "udp", 53, 25]]
    assert "ip6tables" in report.inputs["rules"]["source"]
    assert report.inputs["families"] == ["IPv6"]  # iptables-save listed no IPv4 tables at all
    f = next(f for f in by_kind(report, "snat-capacity") if f.data["family"] == "IPv6")
    assert f.severity == "warning" and f.subject == "Service default/dns:dns (UDP, IPv6)"
    # every query was masqueraded to cni0's IPv6 address and holds one port
    assert f.data["endpoints"] == [{"address": "[fd00:244:1::10]:53", "share": 1.0, "in_use": 25,
                                    "utilisation": round(25 / 64512, 4)}]
