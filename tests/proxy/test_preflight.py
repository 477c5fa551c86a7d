"""A proxy that cannot run exits before it changes the node: the conntrack sysctls and the OOM
score stay as they were when the kubeconfig, the mode's tools or the ports are wrong."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from kubeproxy.proxy.kube_proxy import main
from kubeproxy.proxy.preflight import PreflightError, check_tools, mode_tools

# Only the TCP timeouts: nf_conntrack_max would also grow the host's hash table (/sys).
SYSCTL_FLAGS = ["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=99s",
                "--conntrack-tcp-timeout-close-wait=77s", "--oom-score-adj=123"]  # fmt: skip
TIMEOUTS = {"nf_conntrack_tcp_timeout_established": "99", "nf_conntrack_tcp_timeout_close_wait": "77"}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A fake /proc/sys (and OOM score file) holding other values than the flags ask for."""
    netfilter = tmp_path / "sys" / "net" / "netfilter"
    netfilter.mkdir(parents=True)
    for name in TIMEOUTS:
        (netfilter / name).write_text("1\n")
    (tmp_path / "oom_score_adj").write_text("0\n")
    return tmp_path


def state(node: Path) -> dict[str, str]:
    files = {name: node / "sys" / "net" / "netfilter" / name for name in TIMEOUTS}
    return {name: path.read_text().strip() for name, path in {**files, "oom": node / "oom_score_adj"}.items()}


def run(node: Path, *args: str) -> int:
    return main([*SYSCTL_FLAGS, "--hostname-override=node-1", *args], stdout=io.StringIO(),
                proc_sys=node / "sys", oom_score_adj=node / "oom_score_adj")  # fmt: skip


def test_the_fake_node_is_what_main_writes(node: Path) -> None:
    """The control: --init-only (no API connection needed) changes exactly these files."""
    assert run(node, "--init-only") == 0
    assert state(node) == {**TIMEOUTS, "oom": "123"}


@pytest.mark.parametrize("content", ["{not yaml: [", "apiVersion: v1\nkind: Config\nclusters: 7\n", None])
def test_a_bad_kubeconfig_leaves_the_node_untouched(node: Path, content: str | None, caplog: pytest.LogCaptureFixture) -> None:
    kubeconfig = node / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    before = state(node)
    assert run(node, f"--kubeconfig={kubeconfig}") == 1
    assert state(node) == before == {**dict.fromkeys(TIMEOUTS, "1"), "oom": "0"}
    assert "Error running ProxyServer" in caplog.text and str(kubeconfig) in caplog.text


def test_a_taken_port_with_hard_fail_leaves_the_node_untouched(node: Path, tmp_path: Path) -> None:
    manifests = tmp_path / "m"
    manifests.mkdir()
    before = state(node)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert run(node, f"--manifests={manifests}", "--bind-address-hard-fail", f"--healthz-bind-address={address}") == 1
    assert state(node) == before


def test_a_missing_tool_is_named() -> None:
    assert mode_tools("iptables", "legacy") == ("iptables-legacy-restore",)
    with pytest.raises(PreflightError, match=r"^nftables mode needs nft, not found on PATH"):
        check_tools("nftables", which=lambda tool: None)
    with pytest.raises(PreflightError, match=r"^ipvs mode needs ipset, not found"):
        check_tools("ipvs", which=lambda tool: None if tool == "ipset" else f"/usr/sbin/{tool}")
    check_tools("iptables", which=lambda tool: f"/usr/sbin/{tool}")


def test_a_missing_tool_leaves_the_node_untouched(node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    before = state(node)
    assert run(node, f"--manifests={tmp_path}", "--proxy-mode=nftables") == 1
    assert state(node) == before
