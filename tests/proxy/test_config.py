"""Configuration: upstream flag names, KubeProxyConfiguration files, clear errors."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.cli import build_config, main
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig, parse_duration
from kubeproxy.proxy.config import load_config_file
from kubeproxy.proxy.kube_proxy import ConfigFileChanged, watch_config_file
from tests.paths import DEMO

KUBEADM_STYLE = """
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
  burst: 10
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  tcpEstablishedTimeout: 24h0m0s
detectLocalMode: ClusterCIDR
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  masqueradeAll: true
  masqueradeBit: 12
  minSyncPeriod: 2s
  syncPeriod: 1m30s
  localhostNodePorts: false
ipvs:
  scheduler: rr
metricsBindAddress: 127.0.0.1:10249
mode: iptables
nodePortAddresses: [192.168.0.0/24]
winkernel: {}
"""


def test_kubeadm_style_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(KUBEADM_STYLE)
    cfg = load_config_file(path)
    assert cfg.masquerade_all and cfg.masquerade_bit == 12 and not cfg.localhost_nodeports
    assert cfg.min_sync_period == 2 and cfg.sync_period == 90
    assert cfg.cluster_cidr == ("10.244.0.0/16",) and cfg.nodeport_addresses == ("192.168.0.0/24",)
    assert cfg.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert cfg.masquerade_mark() == "0x00001000"


def test_unknown_fields_are_named_and_ignored_as_upstreams_lenient_decoding(tmp_path: Path) -> None:
    """Upstream decodes strictly, then leniently (unknown fields dropped, one log line): a newer
    kubeadm's field never stops the node's proxy. We name each such field in a start-up warning."""
    from kubeproxy.proxy.config import unused_settings

    path = tmp_path / "config.yaml"
    path.write_text(KUBEADM_STYLE.replace("masqueradeBit: 12", "masqueradeBits: 12").replace("mode: iptables", "moed: x"))
    cfg = load_config_file(path)
    assert cfg.masquerade_bit == 14 and cfg.mode == "iptables"  # the misspelt fields had no effect
    warnings = "\n".join(unused_settings(cfg))
    assert "iptables.masqueradeBits: unknown field, ignored" in warnings and "moed: unknown field, ignored" in warnings
    # A known field with a value of the wrong type is an error, naming it (upstream fails too).
    path.write_text(KUBEADM_STYLE.replace("masqueradeBit: 12", "masqueradeBit: twelve"))
    with pytest.raises(ConfigError, match=re.escape("iptables.masqueradeBit: Input should be a valid integer")):
        load_config_file(path)


def test_wrong_kind_and_bad_duration(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\n")
    with pytest.raises(ConfigError, match=re.escape("expected apiVersion kubeproxy.config.k8s.io/v1alpha1")):
        load_config_file(path)
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kp}\ndata: {other: x}\n")
    with pytest.raises(ConfigError, match=re.escape("this is a ConfigMap (kp, data keys: other), not a KubeProxyConfiguration")):
        load_config_file(path)
    assert parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    with pytest.raises(ConfigError):
        parse_duration("5 seconds")


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(KUBEADM_STYLE)
    cfg = build_config(config_file=str(path), masquerade_all=False, cluster_cidr=("10.0.0.0/8,fd00::/48",))
    assert not cfg.masquerade_all and cfg.cluster_cidr == ("10.0.0.0/8", "fd00::/48")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"iptables_masquerade_bit": 40}, "--iptables-masquerade-bit: 40 is out of range"),
        ({"cluster_cidr": ("10.0.0.0/40",)}, "'10.0.0.0/40' is not a valid CIDR"),
        ({"node_ip": "10.0.0.300"}, "--node-ip: '10.0.0.300' is not a valid IP address"),
        ({"detect_local_mode": "BridgeInterface"}, "needs --pod-bridge-interface"),
    ],
)
def test_invalid_flags(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(**flags)


def test_cluster_cidr_mode_without_a_cluster_cidr_is_accepted_as_upstream_does() -> None:
    """Upstream validates only the mode's name; with no CIDR it runs without a local detector
    (and says so at start-up), which is also what its default configuration file spells out."""
    assert build_config(detect_local_mode="ClusterCIDR").detect_local_mode == "ClusterCIDR"


def test_cli_reports_config_errors_without_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--iptables-masquerade-bit", "99"])
    assert result.exit_code == 2 and "out of range" in result.stderr and "Traceback" not in result.output
    node_cidr = CliRunner().invoke(
        main, ["render", "--manifests", str(DEMO), "--detect-local-mode", "NodeCIDR", "--hostname-override", "elsewhere"]
    )
    assert node_cidr.exit_code == 2 and "needs the Node object" in node_cidr.stderr


def test_hostname_override_decides_local_endpoints() -> None:
    args = ["render", "--manifests", str(DEMO), "--cluster-cidr", "10.244.0.0/16"]
    here = CliRunner().invoke(main, args).stdout
    elsewhere = CliRunner().invoke(main, [*args, "--hostname-override", "node-3"]).stdout
    # default/shop is Local-policy: node-1 sends outside traffic to 10.244.1.20, node-3 to 10.244.3.20.
    assert "KUBE-SVL-YBRHFGZD3TRL7I6I -m comment --comment \"default/shop:https -> 10.244.1.20:8443\"" in here
    assert "KUBE-SVL-YBRHFGZD3TRL7I6I -m comment --comment \"default/shop:https -> 10.244.3.20:8443\"" in elsewhere


def test_defaults_match_upstream() -> None:
    cfg = ProxyConfig()
    assert (cfg.min_sync_period, cfg.sync_period, cfg.masquerade_bit) == (1.0, 30.0, 14)
    assert cfg.healthz_bind_address == "0.0.0.0:10256" and cfg.metrics_bind_address == "127.0.0.1:10249"


def test_zero_sync_periods_in_a_file_mean_the_defaults(tmp_path: Path) -> None:
    # kubeadm writes `0s` for "unset"; upstream's defaulting turns it into 30s / 1s.
    path = tmp_path / "kubeadm.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "iptables:\n  syncPeriod: 0s\n  minSyncPeriod: 0s\n"
    )
    cfg = load_config_file(path)
    assert (cfg.sync_period, cfg.min_sync_period) == (30.0, 1.0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("mode: iptables\niptables: {syncPeriod: 30s, minSyncPeriod: 1m}\n",
         "--iptables-sync-period (iptables.syncPeriod): 30s: must be greater than or equal to --iptables-min-sync-period"),
        ("mode: nftables\nnftables: {syncPeriod: 1s, minSyncPeriod: 2s}\n", "(nftables.syncPeriod): 1s: must be greater"),
        ("mode: ipvs\nipvs: {syncPeriod: 1s, minSyncPeriod: 2s}\n", "--ipvs-sync-period (ipvs.syncPeriod): 1s: must be greater"),
        ("syncPeriod: 1ns\n", "(iptables.syncPeriod): 1ns: must be greater than or equal to"),
        ("iptables: {syncPeriod: -5s}\n", "(iptables.syncPeriod): -5s: must be greater than 0"),
        ("iptables: {syncPeriod: \"\u0661\u0660s\"}\n", "iptables.syncPeriod: '\u0661\u0660s' is not a duration"),
    ],
)  # fmt: skip
def test_sync_periods_of_the_file_are_validated_naming_the_field(tmp_path: Path, section: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + section)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(config_file=str(path))
    result = CliRunner().invoke(main, ["run", "--config", str(path)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_ipvs_mode_runs_by_the_ipvs_sections_periods(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
                    "iptables: {syncPeriod: 1h, minSyncPeriod: 1m}\nipvs: {syncPeriod: 45s, minSyncPeriod: 5s}\n")  # fmt: skip
    cfg = load_config_file(path)
    assert (cfg.sync_period, cfg.min_sync_period) == (45.0, 5.0)


def test_a_config_file_that_is_not_utf8_or_not_a_regular_file_is_a_config_error(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: \"\xff\"\n")
    with pytest.raises(ConfigError, match=re.escape(f"--config {latin1}: not UTF-8 text")):
        load_config_file(latin1)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: reading it would wait for ever
    with pytest.raises(ConfigError, match=re.escape(f"--config {fifo}: not a regular file (a FIFO)")):
        load_config_file(fifo)


def test_the_config_watch_never_blocks_on_a_fifo_swapped_in(tmp_path: Path) -> None:
    path = tmp_path / "config.conf"
    path.write_text(KUBEADM_STYLE)

    async def main() -> None:
        watch = asyncio.create_task(watch_config_file(str(path), interval=0.01))
        await asyncio.sleep(0)  # one turn of the loop: the task reads the file up to its first await
        path.unlink()
        os.mkfifo(path)
        with pytest.raises(ConfigFileChanged):
            await asyncio.wait_for(watch, 30)

    asyncio.run(main())
