"""IPVS mode without a kernel: the render against facts from upstream's proxier_test.go, the diff
that makes a resync send nothing, graceful termination, the CLI, and the start-up error."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.backends.ipvs.apply import IpvsUnavailable, check_kernel, diff_ipvs, parse_connections, parse_ipvsadm_save
from kubeproxy.backends.ipvs.render import IpvsOptions, RealServer, VirtualServer, ipvsadm_save_text, render
from kubeproxy.cli import main
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions
from tests.paths import DEMO

NODE_IP = "100.101.102.103"  # upstream's test node address


def _view(**svc_fields: object) -> NodeView:
    # Upstream's usual fixture: ns1/svc1 port p80 at 10.20.30.41:80, one endpoint 10.180.0.1:80.
    name = ServicePortName("ns1", "svc1", "p80", "TCP")
    svc = ServicePortInfo(name, valid_ip("10.20.30.41"), 80, "TCP", **svc_fields)  # type: ignore[arg-type]
    return NodeView({name: svc}, {name: [EndpointInfo(ip_text(valid_ip("10.180.0.1")), 80)]})


OPTS = NodeOptions(node_name="testHostname", node_ip=NODE_IP)
IPVS = IpvsOptions(node_addresses=(NODE_IP,))


def test_cluster_ip_as_upstream() -> None:
    r = render(_view(), OPTS, IPVS)
    vs = VirtualServer("TCP", "10.20.30.41", 80, "rr")
    assert dict(r.services) == {vs: (RealServer("10.180.0.1", 80, 1),)}
    assert r.sets["KUBE-CLUSTER-IP"] == {"10.20.30.41,tcp:80"}
    assert r.bind_addresses == {"10.20.30.41"}
    assert r.sets["KUBE-IPVS-IPS"] == {"10.20.30.41"}
    # No detector, no masquerade-all: upstream masquerades VIP-sourced traffic (src,dst).
    assert ('-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" '
            "-m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ") in r.iptables


def test_nodeport_as_upstream() -> None:
    r = render(_view(node_port=3001), OPTS, IPVS)
    assert VirtualServer("TCP", NODE_IP, 3001, "rr") in r.services
    assert r.sets["KUBE-NODE-PORT-TCP"] == {"3001"}
    assert NODE_IP not in r.bind_addresses  # node addresses are never bound to kube-ipvs0
    assert ('-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" '
            "-m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ") in r.iptables


def test_local_nodeport_returns_before_masquerade() -> None:
    r = render(_view(node_port=3001, external_policy_local=True), OPTS, IPVS)
    lines = r.iptables.splitlines()
    local = next(i for i, ln in enumerate(lines) if "KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN" in ln)
    plain = next(i for i, ln in enumerate(lines) if "KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ" in ln)
    assert local < plain


def test_affinity_is_persistence_and_mh_sets_its_flag() -> None:
    r = render(_view(client_ip_affinity=True, sticky_max_age_seconds=10800), OPTS, IpvsOptions(scheduler="mh"))
    (vs,) = r.services
    assert (vs.persistent, vs.scheduler, vs.flags) == (10800, "mh", ("flag-2",))
    assert ipvsadm_save_text(r.services).splitlines()[0] == "-A -t 10.20.30.41:80 -s mh -b flag-2 -p 10800"


def test_lb_source_ranges_without_the_node_block_it_from_the_node() -> None:
    r = render(_view(load_balancer_vips=(ipaddress.ip_address("1.2.3.4"),),
                     load_balancer_source_ranges=(ipaddress.ip_network("10.0.0.0/8"),)), OPTS, IPVS)
    assert r.sets["KUBE-LOAD-BALANCER-FW"] == {"1.2.3.4,tcp:80"}
    assert r.sets["KUBE-LOAD-BALANCER-SOURCE-CIDR"] == {"1.2.3.4,tcp:80,10.0.0.0/8"}
    assert "-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP" in r.iptables


def test_ipvsadm_save_round_trip() -> None:
    r = render(_view(node_port=3001, client_ip_affinity=True, sticky_max_age_seconds=60), OPTS, IPVS)
    parsed = parse_ipvsadm_save(ipvsadm_save_text(r.services))
    assert {vs: tuple(rs) for vs, rs in parsed.items()} == dict(r.services)


def test_resync_without_change_sends_nothing() -> None:
    r = render(_view(node_port=3001), OPTS, IPVS)
    have = {vs: list(rs) for vs, rs in r.services.items()}
    assert diff_ipvs(r.services, have, {}).lines == ()


def test_removed_endpoint_is_quiesced_then_deleted() -> None:
    vs = VirtualServer("TCP", "10.20.30.41", 80)
    have = {vs: [RealServer("10.180.0.1", 80), RealServer("10.180.0.2", 80)]}
    want = {vs: (RealServer("10.180.0.1", 80),)}
    busy = {("TCP", "10.20.30.41", 80, "10.180.0.2", 80): (1, 0)}
    ops = diff_ipvs(want, have, busy)
    assert ops.lines == ("-e -t 10.20.30.41:80 -r 10.180.0.2:80 -m -w 0",)
    have[vs][1] = RealServer("10.180.0.2", 80, 0)
    assert diff_ipvs(want, have, busy).lines == ()  # still busy: wait
    assert diff_ipvs(want, have, {}).lines == ("-d -t 10.20.30.41:80 -r 10.180.0.2:80",)


def test_stale_services_deleted_except_excluded_cidrs() -> None:
    mine, theirs = VirtualServer("TCP", "10.20.30.99", 80), VirtualServer("TCP", "192.168.9.9", 80)
    ops = diff_ipvs({}, {mine: [], theirs: []}, {}, exclude_cidrs=("192.168.0.0/16",))
    assert ops.lines == ("-D -t 10.20.30.99:80",)


def test_connections_parsed_from_ipvsadm_ln() -> None:
    text = ("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n"
            "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
            "TCP  10.96.10.10:80 rr\n  -> 10.244.1.10:8080             Masq    0      2          5\n")
    assert parse_connections(text) == {("TCP", "10.96.10.10", 80, "10.244.1.10", 8080): (2, 5)}


def test_cli_render_prints_the_three_parts() -> None:
    result = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--proxy-mode", "ipvs"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for header in ("# ipset restore -exist", "# iptables-restore --noflush", "# ipvsadm-restore (ipvsadm-save -n)"):
        assert header in out
    assert "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n" in out


def test_cli_render_refuses_unknown_scheduler(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                   "mode: ipvs\nipvs:\n  scheduler: fastest\n")
    result = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--config", str(cfg)])
    assert result.exit_code != 0
    assert "ipvs.scheduler: 'fastest' is not an IPVS scheduler" in result.output
    assert "Traceback" not in result.output


def test_cli_render_takes_the_scheduler_flag_over_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                   "mode: ipvs\nipvs:\n  scheduler: lc\n")
    result = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--config", str(cfg), "--ipvs-scheduler", "wlc"])
    assert result.exit_code == 0, result.output
    assert "-A -t 10.96.10.10:80 -s wlc" in result.stdout and " -s lc" not in result.stdout
    bad = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--proxy-mode", "ipvs", "--ipvs-scheduler", "fastest"])
    assert bad.exit_code != 0 and "ipvs.scheduler: 'fastest' is not an IPVS scheduler" in bad.output


def test_kernel_without_ipvs_names_the_modules() -> None:
    def run(argv: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 1, "", "not found")

    with pytest.raises(IpvsUnavailable, match=r"modprobe ip_vs ip_vs_rr .*failed.*CONFIG_IP_VS"):
        check_kernel(run)
