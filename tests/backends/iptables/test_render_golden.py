"""One small scenario per renderer feature, rendered through the CLI and compared byte for byte.

Regenerate after an intended change with KUBEPROXY_REGEN=1 and review the diff.
"""

from __future__ import annotations

import os
import shlex

import pytest
from click.testing import CliRunner

from kubeproxy.cli import main
from tests.backends.iptables.rules_invariants import check_invariants
from tests.paths import TESTS

GOLDEN = TESTS / "golden"
SCENARIOS = sorted(p.stem for p in GOLDEN.glob("*.yaml"))


def render_scenario(name: str) -> str:
    path = GOLDEN / f"{name}.yaml"
    args = shlex.split(path.read_text().splitlines()[0].removeprefix("# args:"))
    result = CliRunner().invoke(main, ["render", "--manifests", str(path), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("name", SCENARIOS)
def test_golden(name: str) -> None:
    actual = render_scenario(name)
    expected_path = GOLDEN / f"{name}.rules"
    if os.environ.get("KUBEPROXY_REGEN"):
        expected_path.write_text(actual)
    assert actual == expected_path.read_text()
    check_invariants(actual)


def _lines(name: str, needle: str) -> list[str]:
    return [line for line in render_scenario(name).splitlines() if needle in line]


def test_detectors_mark_non_pod_traffic() -> None:
    assert _lines("cluster_ip", "! -s 10.244.0.0/16 -j KUBE-MARK-MASQ")
    assert _lines("detect_local_node_cidr", "! -s 10.244.1.0/24 -j KUBE-MARK-MASQ")
    assert _lines("detect_local_node_cidr", '"pod traffic for default/web:http external destinations" -s 10.244.1.0/24')
    assert _lines("detect_local_bridge", "! -i cbr0 -j KUBE-MARK-MASQ")
    assert _lines("detect_local_interface_prefix", "! -i veth+ -j KUBE-MARK-MASQ")
    assert _lines("masquerade_all", "--dport 80 -j KUBE-MARK-MASQ")


def test_random_fully_by_default_and_mark_bit() -> None:
    # Upstream (v1.37) masquerades with --random-fully unconditionally.
    assert _lines("cluster_ip", "-j MASQUERADE --random-fully")
    assert not _lines("no_random_fully_mark_bit", "--random-fully")
    assert _lines("no_random_fully_mark_bit", "-j MARK --or-mark 0x00000020")


def test_session_affinity_uses_recent_with_timeout() -> None:
    assert len(_lines("session_affinity", "--rcheck --seconds 300 --reap")) == 2
    assert len(_lines("session_affinity", "-m recent --name KUBE-SEP-")) == 4


def test_source_ranges_trimmed_and_proxy_mode_ingress_ignored() -> None:
    assert _lines("lb_source_ranges_ipmode", "-s 192.168.0.0/24 -j KUBE-EXT-")
    assert not _lines("lb_source_ranges_ipmode", "203.0.113.11")
    # The node's IP is inside a source range, so the LB IP itself is allowed as a source.
    assert _lines("lb_source_ranges_ipmode", "-s 203.0.113.10 -j KUBE-EXT-")


def test_topology_hints_select_endpoints() -> None:
    zone = render_scenario("topology_zone_hints")
    assert "10.244.1.5:8080" in zone and "10.244.3.5:8080" in zone and "10.244.2.5" not in zone
    node = render_scenario("topology_node_hints")
    assert "10.244.1.5:8080" in node and "10.244.2.5" not in node


def test_skipped_services_and_endpoint_conditions() -> None:
    text = render_scenario("skipped_services")
    for absent in ("default/headless", "default/ext", "default/mine", "10.244.1.6"):
        assert absent not in text
    assert "10.244.1.5:8080" in text and "10.244.1.7" not in text  # terminating only used as fallback


def test_ipv6_renders_ip6tables_rules() -> None:
    text = render_scenario("ipv6")
    assert "--to-destination [fd00:10:244:1::5]:8080" in text
    assert "! -d ::1/128 -j KUBE-NODEPORTS" in text
    assert "192.168.0.10" not in text and "KUBE-FIREWALL" not in text


def test_large_cluster_mode_drops_endpoint_comments() -> None:
    text = render_scenario("large_cluster_mode")
    sep_rules = [line for line in text.splitlines() if line.startswith("-A KUBE-SEP-")]
    assert len(sep_rules) == 2 * 2 * 501
    assert not any("--comment" in line for line in sep_rules)
    assert " -> 10.0." not in text


def test_nodeport_addresses_restrict_the_nodeports_jump() -> None:
    jumps = _lines("nodeport_addresses", "-j KUBE-NODEPORTS")
    assert [j.split(" -d ")[1].split()[0] for j in jumps] == ["192.168.0.2", "127.0.0.1"]


def test_chain_hash_matches_standard_base32() -> None:
    import base64
    import hashlib

    from kubeproxy.backends.iptables import names

    for text in ("ns1/svc1:p80tcp", "", "a" * 300, "default/web:http" + "udp" + "[fd00::1]:53"):
        expected = base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]
        assert names._base32_16(hashlib.sha256(text.encode()).digest()) == expected
    # A known upstream name (TestOverallIPTablesRules: ns1/svc1:p80).
    assert names.service_chain("ns1/svc1:p80", "tcp") == "KUBE-SVC-XPGD46QRK7WJZT7O"


def test_with_jumps_appends_upstreams_jump_rules_in_node_order() -> None:
    path = GOLDEN / "cluster_ip.yaml"
    result = CliRunner().invoke(main, ["render", "--manifests", str(path), "--cluster-cidr", "10.244.0.0/16", "--with-jumps"])
    assert result.exit_code == 0, result.output
    inputs = [line.split(" -j ")[1] for line in result.stdout.splitlines() if line.startswith("-A INPUT ")]
    # Each jump is prepended by upstream, kubelet's last: so a node lists them in reverse.
    assert inputs == ["KUBE-FIREWALL", "KUBE-PROXY-FIREWALL", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES"]
    assert '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' in result.stdout
    check_invariants(result.stdout)
