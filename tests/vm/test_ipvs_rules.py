"""The IPVS waits (backends/ipvs/readback.py) and the VM batch's result parsing, on recorded text: no root, no VM."""

from __future__ import annotations

from kubeproxy.backends.ipvs.readback import IpvsRules
from kubeproxy.lab.builders import Port, service
from kubeproxy.model.rules_readback import service_ports
from tests.vm.test_e2e_vm import parse_junit

WEB = service("web", "10.96.0.10", [Port("http", 80, 8080, node_port=30080), Port("dns", 53, 5353, "UDP")],
              type="NodePort", external_ips=["203.0.113.10"])
GONE = service("gone", "10.96.0.40", [Port("http", 80, 8080)])
# As `ipvsadm-save -n` prints it: a quiesced real server (weight 0) and a service without endpoints.
SAVE = """-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.10:8080 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.11:8080 -m -w 0
-A -t 203.0.113.10:80 -s rr
-a -t 203.0.113.10:80 -r 10.244.1.10:8080 -m -w 1
-A -t 192.168.0.2:30080 -s rr
-a -t 192.168.0.2:30080 -r 10.244.1.12:8080 -m -w 1
-A -u 10.96.0.10:53 -s rr
-a -u 10.96.0.10:53 -r 10.244.1.10:5353 -m -w 1
-A -t 10.96.0.40:80 -s rr
"""


def rules() -> IpvsRules:
    return IpvsRules(SAVE, service_ports([WEB, GONE]))


def test_endpoints_are_the_real_servers_of_every_address_and_the_node_port_but_not_quiesced_ones() -> None:
    assert rules().endpoints("default/web:http") == {"10.244.1.10:8080", "10.244.1.12:8080"}
    assert rules().endpoints("default/web:dns") == {"10.244.1.10:5353"}  # UDP only: the protocol is part of the key


def test_a_virtual_server_without_real_servers_rejects() -> None:
    assert rules().rejects("default/gone:http")
    assert not rules().rejects("default/web:http")
    assert rules().endpoints("default/gone:http") == set()


def test_mentions() -> None:
    assert rules().mentions("default/web") and rules().mentions("default/gone")
    assert not IpvsRules("", service_ports([WEB])).mentions("default/web")


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.vm.guest_e2e" name="test_scenario[ipvs-hairpin]" time="30.1"/>
<testcase classname="tests.vm.guest_e2e" name="test_scenario[ipvs-udp_flow_moves_to_the_new_pod]" time="40.2">
<failure message="AssertionError: went to a">trace</failure></testcase>
<testcase classname="tests.e2e.test_live_proxy" name="test_a_change_is_synced_and_reported[nftables]" time="9"/>
<testcase classname="tests.vm.guest_e2e" name="test_hostile_addresses[iptables]" time="0.1">
<skipped message="covered on the host">skip</skipped></testcase>
</testsuite></testsuites>"""


def test_junit_results_become_one_outcome_per_mode_and_scenario() -> None:
    got = parse_junit(JUNIT)
    assert got["ipvs-hairpin"].passed
    assert not got["ipvs-udp_flow_moves_to_the_new_pod"].passed
    assert "went to a" in got["ipvs-udp_flow_moves_to_the_new_pod"].message
    assert got["nftables-test_a_change_is_synced_and_reported"].passed
    skipped = got["iptables-test_hostile_addresses"]
    assert skipped.skipped and not skipped.passed
    assert not got["ipvs-udp_flow_moves_to_the_new_pod"].skipped
    assert parse_junit("") == {}
