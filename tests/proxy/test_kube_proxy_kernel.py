"""`kube-proxy --init-only` sets the conntrack sysctls as upstream's conntrack configurer does,
read back inside a network namespace (the timeouts and be_liberal are per namespace; the host's
stay as they were), and says so when it cannot (the global nf_conntrack_max, /proc/sys read-only)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kubeproxy.lab.netns import NetNS
from kubeproxy.model.proxy_config import ConntrackConfig
from kubeproxy.proxy.sysctls import conntrack_max
from tests.paths import DEMO

pytestmark = pytest.mark.root

KUBE_PROXY = str(Path(sys.executable).parent / "kube-proxy")
NETFILTER = Path("/proc/sys/net/netfilter")
PER_NETNS = (
    "nf_conntrack_tcp_timeout_established",
    "nf_conntrack_tcp_timeout_close_wait",
    "nf_conntrack_tcp_be_liberal",
    "nf_conntrack_udp_timeout",
    "nf_conntrack_udp_timeout_stream",
)


def read(ns: NetNS, name: str) -> int:
    return int(ns.run(["cat", str(NETFILTER / name)]).stdout)


def host_values() -> dict[str, int]:
    return {name: int((NETFILTER / name).read_text()) for name in (*PER_NETNS, "nf_conntrack_max")}


def test_conntrack_conversion_as_upstream() -> None:
    assert conntrack_max(ConntrackConfig(max_per_core=32768, min=131072), cpus=2) == 131072
    assert conntrack_max(ConntrackConfig(max_per_core=32768, min=131072), cpus=8) == 262144
    assert conntrack_max(ConntrackConfig(max_per_core=0, min=131072), cpus=8) == 0


def test_flags_set_the_per_namespace_sysctls(netns: NetNS) -> None:
    before = host_values()
    ns_before = {name: read(netns, name) for name in PER_NETNS}
    global_max = before["nf_conntrack_max"]
    # maxPerCore 1 with min = the current global maximum: nothing to write there.
    proc = netns.run([KUBE_PROXY, "--init-only", "--oom-score-adj=0", "--conntrack-max-per-core=1",
                      f"--conntrack-min={global_max}", "--conntrack-tcp-timeout-established=1h1m",
                      "--conntrack-tcp-timeout-close-wait=61s", "--conntrack-tcp-be-liberal",
                      "--conntrack-udp-timeout=33s", "--conntrack-udp-timeout-stream=121s"], check=False)
    assert proc.returncode == 0, proc.stderr
    assert {name: read(netns, name) for name in PER_NETNS} == {
        "nf_conntrack_tcp_timeout_established": 3660,
        "nf_conntrack_tcp_timeout_close_wait": 61,
        "nf_conntrack_tcp_be_liberal": 1,
        "nf_conntrack_udp_timeout": 33,
        "nf_conntrack_udp_timeout_stream": 121,
    }
    assert ns_before != {name: read(netns, name) for name in PER_NETNS}
    assert "nf_conntrack_max" not in proc.stderr  # already at the wanted value: not written, no warning
    assert host_values() == before


def test_config_file_fields_and_the_global_maximum(netns: NetNS, tmp_path: Path) -> None:
    before = host_values()
    config = tmp_path / "config.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 0\n"
        "conntrack:\n  maxPerCore: 1\n  min: 12345\n  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 0s\n"
        "  tcpBeLiberal: true\n  udpTimeout: 45s\n  udpStreamTimeout: 0s\n"
    )
    close_wait = read(netns, "nf_conntrack_tcp_timeout_close_wait")
    proc = netns.run([KUBE_PROXY, f"--config={config}", "--init-only"], check=False)
    assert proc.returncode == 0, proc.stderr
    assert read(netns, "nf_conntrack_tcp_timeout_established") == 7200
    assert read(netns, "nf_conntrack_tcp_timeout_close_wait") == close_wait  # 0s: left alone
    assert (read(netns, "nf_conntrack_tcp_be_liberal"), read(netns, "nf_conntrack_udp_timeout")) == (1, 45)
    # nf_conntrack_max is the kernel's: read-only outside the host's namespace. A warning names it.
    assert "net/netfilter/nf_conntrack_max: cannot set it to 12345" in proc.stderr
    assert host_values() == before


def test_read_only_proc_sys_is_a_warning_not_a_failure(netns: NetNS) -> None:
    established = read(netns, "nf_conntrack_tcp_timeout_established")
    command = (
        "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "
        + shlex.join([KUBE_PROXY, "--init-only", "--oom-score-adj=0", "--conntrack-tcp-timeout-established=99s"])
    )
    proc = netns.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command], check=False)
    assert proc.returncode == 0, proc.stderr
    assert "/proc/sys is read-only" in proc.stderr and "nf_conntrack_tcp_timeout_established=99" in proc.stderr
    assert read(netns, "nf_conntrack_tcp_timeout_established") == established


def test_cleanup_flag_removes_our_rules_and_exits(netns: NetNS) -> None:
    netns.run(["iptables", "-t", "nat", "-N", "KUBE-SERVICES"])
    # Our jump exactly as the proxy installs it (upstream's comment included).
    netns.run(["iptables", "-t", "nat", "-A", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals",
               "-j", "KUBE-SERVICES"])
    netns.run(["iptables", "-t", "nat", "-N", "SOMEONE-ELSE"])
    proc = netns.run([KUBE_PROXY, "--cleanup", "-v", "2"], check=False)
    assert proc.returncode == 0, proc.stderr
    chains = netns.run(["iptables", "-t", "nat", "-S"]).stdout
    assert "KUBE-SERVICES" not in chains and "-N SOMEONE-ELSE" in chains
    assert '"Removed"' in proc.stderr


def test_a_changed_config_file_ends_the_proxy(netns: NetNS, tmp_path: Path) -> None:
    """Upstream exits when --config changes (the kubelet updates a ConfigMap volume in place), so
    that the pod restarts with the new configuration."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "demo.yaml").write_text((DEMO).read_text())
    config = tmp_path / "config.conf"
    config.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                      "clusterCIDR: 10.244.0.0/16\noomScoreAdj: 0\n")
    proc = netns.popen([KUBE_PROXY, f"--config={config}", "--manifests", str(tmp_path / "m"), "--hostname-override=node-1"],
                       stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "Starting kubeproxy" in line:
            break
    else:
        raise AssertionError(f"exited with {proc.wait()} before starting")
    config.write_text(config.read_text() + "mode: nftables\n")
    assert proc.wait(timeout=30) == 1
    assert "content of the proxy server's configuration file was updated" in proc.stderr.read()
