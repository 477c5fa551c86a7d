"""The redirect rules, whole (golden, in upstream v1.25's rule shape), and the proxier against
the fake iptables: listeners follow services, rules follow listeners, without root."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.userspace import render as R
from kubeproxy.backends.userspace.ports import PortRange, parse_port_range
from kubeproxy.backends.userspace.proxier import UserspaceProxier
from kubeproxy.cluster.addresses import CheckedIP, ip_text, valid_ip
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions

WEB = ServicePortName("default", "web", "http", "TCP")
DNS = ServicePortName("kube-system", "dns", "dns", "UDP")
SHOP = ServicePortName("default", "shop", "", "TCP")
OPTS = NodeOptions(node_name="node", node_ip="192.168.0.2")


def ip(text: str) -> CheckedIP:
    return valid_ip(text)


def view(*, web_endpoints: int = 2) -> NodeView:
    services = {
        WEB: ServicePortInfo(WEB, ip("10.96.0.10"), 80, "TCP"),
        DNS: ServicePortInfo(DNS, ip("10.96.0.53"), 53, "UDP"),
        SHOP: ServicePortInfo(
            SHOP, ip("10.96.0.20"), 8080, "TCP", node_port=30080,
            external_ips=(ip("203.0.113.7"),), load_balancer_vips=(ip("198.51.100.9"),),
        ),
    }  # fmt: skip
    endpoints = {
        WEB: [EndpointInfo(ip_text(ip(f"10.244.1.{i}")), 8080) for i in range(1, web_endpoints + 1)],
        DNS: [EndpointInfo(ip_text(ip("10.244.1.9")), 53)],
        SHOP: [EndpointInfo(ip_text(ip("10.244.2.1")), 8080, ready=False, serving=True, terminating=True)],
    }
    return NodeView(services, endpoints)


# The whole restore text, in upstream v1.25 userspace proxier's rule shape (iptables-save word order).
GOLDEN = (Path(__file__).parent / "golden_rules.txt").read_text()


def test_rules_golden() -> None:
    ports = {WEB: 36000, SHOP: 36001, DNS: 36002}
    rendered = R.render(view(), OPTS, ports)
    assert rendered.text == GOLDEN
    assert (rendered.nat_rules, rendered.filter_rules) == (13, 1)


def test_rules_do_not_depend_on_endpoints() -> None:
    ports = {WEB: 36000, SHOP: 36001, DNS: 36002}
    assert R.render(view(web_endpoints=50), OPTS, ports).text == R.render(view(web_endpoints=0), OPTS, ports).text


def test_without_node_ip_only_container_traffic_is_redirected() -> None:
    rendered = R.render(view(), NodeOptions(), {WEB: 36000})
    assert "KUBE-PORTALS-HOST -d" not in rendered.text
    assert "-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32" in rendered.text
    assert rendered.warnings


def test_jumps_match_upstream_iptables_init() -> None:
    text = R.with_jumps(R.render(view(), OPTS, {}).text)
    assert (
        '-A PREROUTING -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" '
        "-j KUBE-PORTALS-CONTAINER"
    ) in text
    assert (
        '-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be '
        'the last rule in the chain" -j KUBE-NODEPORT-HOST'
    ) in text
    assert '-A INPUT -m comment --comment "Ensure that non-local NodePort traffic can flow" -j KUBE-NODEPORT-NON-LOCAL' in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", PortRange()), ("0-0", PortRange()), ("30000-30009", PortRange(30000, 10)), ("40000+4", PortRange(40000, 5)),
     ("5000", PortRange(5000, 1))],
)  # fmt: skip
def test_port_range(text: str, expected: PortRange) -> None:
    assert parse_port_range(text) == expected


@pytest.mark.parametrize("text", ["x", "10-5", "70000", "1-2-3"])
def test_port_range_refused(text: str) -> None:
    with pytest.raises(ValueError, match="range"):
        parse_port_range(text)


def test_proxier_opens_listeners_programs_rules_and_closes_them(tmp_path: Path) -> None:
    node = FakeNode()
    state = tmp_path / "state.json"
    proxier = UserspaceProxier(run=node, state_file=state)
    try:
        proxier.prepare()
        report = proxier.sync(view(), OPTS, None)
        assert report.listeners == 3 and report.rule_counts == {"nat": 13, "filter": 1}
        web_port = proxier._ports[WEB]
        # A real listener on the any address, and the rule that leads to it.
        with socket.create_connection(("127.0.0.1", web_port), timeout=2):
            pass
        assert any(f"--to-ports {web_port}" in r for r in node.iptables.rules("nat", R.KUBE_PORTALS_CONTAINER))
        assert any(R.KUBE_PORTALS_CONTAINER in r for r in node.iptables.rules("nat", "PREROUTING"))
        assert '"endpoints": [\n    "10.244.1.1:8080",\n    "10.244.1.2:8080"' in state.read_text()
        # Endpoints change: same port. The service goes: its rules first, then its listener.
        proxier.sync(view(web_endpoints=1), OPTS, frozenset({("default", "web")}))
        assert proxier._ports[WEB] == web_port
        smaller = NodeView({k: v for k, v in view().services.items() if k != WEB}, {})
        proxier.sync(smaller, OPTS, frozenset({("default", "web")}))
        assert WEB not in proxier._ports
        assert not any(f"--to-ports {web_port}" in r for r in node.iptables.rules("nat", R.KUBE_PORTALS_CONTAINER))
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", web_port), timeout=2)
    finally:
        removed = proxier.cleanup()
    assert "nat KUBE-PORTALS-CONTAINER" in removed and not state.exists()
    assert not any("KUBE-PORTALS" in r for r in node.iptables.rules("nat", "PREROUTING"))


def test_an_endpoint_change_leaves_iptables_alone(tmp_path: Path) -> None:
    node = FakeNode()
    proxier = UserspaceProxier(run=node, state_file=tmp_path / "state.json")

    def restores() -> int:
        return sum(1 for c in node.iptables.calls if c[0].endswith("-restore"))

    try:
        proxier.sync(view(), OPTS, None)
        first = restores()
        assert first >= 1
        # The redirects have nothing per endpoint: only the relay's tables change (as upstream).
        proxier.sync(view(web_endpoints=1), OPTS, frozenset({("default", "web")}))
        assert restores() == first
        assert '"endpoints": [\n    "10.244.1.1:8080"\n' in (tmp_path / "state.json").read_text()
        # A service going changes the text; a full sync restores in any case (wiped rules come back).
        smaller = NodeView({k: v for k, v in view().services.items() if k != DNS}, view().endpoints)
        proxier.sync(smaller, OPTS, frozenset({("kube-system", "dns")}))
        assert restores() == first + 1
        node.iptables.run(["iptables", "-t", "nat", "-F", R.KUBE_PORTALS_CONTAINER])
        assert not node.iptables.rules("nat", R.KUBE_PORTALS_CONTAINER)
        proxier.sync(smaller, OPTS, None)
        assert restores() == first + 2
        assert node.iptables.rules("nat", R.KUBE_PORTALS_CONTAINER)
    finally:
        proxier.cleanup()


def test_proxier_in_a_port_range(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        base = probe.getsockname()[1]
    proxier = UserspaceProxier(run=FakeNode().run, port_range=f"{base}+40")
    try:
        proxier.sync(view(), OPTS, None)
        assert all(base <= p <= base + 40 for p in proxier._ports.values())
    finally:
        proxier.cleanup()


def test_kubeproxy_render_prints_the_mode(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kubeproxy.cli import main

    result = CliRunner().invoke(
        main,
        ["render", "--proxy-mode", "userspace", "--node-ip", "192.168.0.2", "--with-jumps",
         "--manifests", str(Path(__file__).parents[3] / "kubeproxy" / "examples" / "demo.yaml")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "-j KUBE-PORTALS-CONTAINER" in result.output
    assert '--comment "dns/bind:dns-udp" -m udp --dport 53 -j REDIRECT --to-ports' in result.output
    assert "proxy ports are chosen when the proxy binds its listeners" in result.output
