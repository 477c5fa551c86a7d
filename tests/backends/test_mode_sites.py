"""The registry is the only place that decides by a mode's name, and a fifth mode reaches the
application's other paths (configuration files, the start-up line, `explain`, the DNS lab)
through its `Mode` record alone: the toy mode of test_toy_mode.py, registered and nothing else
changed, gets each mode-dependent answer from its fields.

The scan counts the files outside `backends/registry.py` and the modes' own folders that compare
a value with a mode's name. Each one left compares a dump format, a configuration section or a
hop's table kind that happens to share a mode's name, not the proxy mode: a new mode touches
none of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.backends import registry
from kubeproxy.backends.nftables.annotations import UDP_CONNTRACK_TIMEOUT
from kubeproxy.proxy.config import ProxyConfig, load_config_file, to_kube_proxy_configuration
from kubeproxy.proxy.options import Family, node_options
from kubeproxy.proxy.startup import summary
from tests.backends.test_toy_mode import TOY
from tests.paths import DEMO

PACKAGE = Path(__file__).resolve().parents[2] / "kubeproxy"

# File: why its comparison with a mode's name is about something else.
NOT_THE_MODE = {
    "doctor/reconstruct.py": "the dump's kind (doctor/core.py's mode_of: an nft or iptables listing), which parser reads it",
    "explain/core.py": "a hop's table kind (the tracer's IPVS hops)",
    "explain/rendered.py": "a render's text format (Mode.render_format)",
    "netfilter/iptables_list.py": "the text of an `iptables -L` command line",
    "proxy/config.py": "KubeProxyConfiguration's sections (iptables, ipvs, nftables), which Mode names per mode",
    "proxy/flags.py": "KubeProxyConfiguration's sections, as upstream's flags set them",
    # The lab's beds read the node's rules by their dump (iptables-save, nft JSON, ipvsadm-save,
    # the relay's state file) and compare against upstream's kube-proxy, which has only its modes.
    "lab/cluster.py": "load_rendered loads iptables-restore text only",
    "lab/node_rules.py": "the reader of each mode's rule dump, for the lab's waits",
    "lab/side_by_side.py": "upstream's IPVS tables beside ours (upstream's own modes only)",
}


EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _mode_names(node: ast.expr) -> set[str]:
    names = set(registry.MODES)
    if isinstance(node, ast.Constant) and node.value in names:
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
    return set()


def _comparing_files() -> dict[str, list[str]]:
    """Files outside the registry and the modes' folders: their comparisons with a mode's name."""
    own = {"backends/registry.py", *(f"backends/{name}/" for name in registry.MODES)}
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in own):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare) or not all(isinstance(op, EQUALITY) for op in node.ops):
                continue
            if any(_mode_names(side) for side in (node.left, *node.comparators)):
                found.setdefault(rel, []).append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_registry_compares_with_a_modes_name() -> None:
    found = _comparing_files()
    unexplained = [line for rel, lines in found.items() if rel not in NOT_THE_MODE for line in lines]
    assert unexplained == [], "read the mode's Mode record instead"
    assert sorted(found) == sorted(NOT_THE_MODE)  # an entry whose comparison went away goes too


def test_the_scan_sees_a_comparison_with_a_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site.py").write_text('def f(mode: str) -> bool:\n    return mode == "nftables"\n')
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _comparing_files() == {"site.py": ["site.py:2: mode == 'nftables'"]}


@pytest.fixture
def toy() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.MODES, "toy", TOY)
        yield


@pytest.mark.usefixtures("toy")
def test_a_configuration_file_of_the_toy_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: toy\n"
        "portRange: 30000-30100\nudpIdleTimeout: 1s\n"
    )
    cfg = load_config_file(path)
    assert cfg.mode == "toy"
    assert cfg.unused_fields == (
        "portRange: used only by the userspace mode; ignored",
        "udpIdleTimeout: used only by the userspace mode; ignored",
    )
    written = to_kube_proxy_configuration(cfg)
    assert written["mode"] == "toy" and "udpIdleTimeout" not in written
    assert "udpIdleTimeout" in to_kube_proxy_configuration(ProxyConfig(mode="userspace"))


@pytest.mark.usefixtures("toy")
def test_the_toys_start_up_line_and_node_options() -> None:
    line = summary(ProxyConfig(mode="toy"), node_name="n", node_from="flag", facts=None, iptables_variant="legacy", source="s")
    assert line["mode"] == "toy" and line["iptablesVariant"] == "n/a"
    assert summary(ProxyConfig(), node_name="n", node_from="flag", facts=None, iptables_variant="legacy", source="s")[
        "iptablesVariant"
    ] == "legacy"
    gate = {"KubeProxyNFTablesLocalhostNodePorts": True}
    for mode, listener in (("toy", False), ("nftables", True)):
        cfg = ProxyConfig(mode=mode, feature_gates=gate, nodeport_addresses=("127.0.0.0/8",))
        opts = node_options(cfg, family=Family.IPV4, hostname="n", node=None)
        assert opts.localhost_nodeport_proxy is listener, mode


@pytest.mark.usefixtures("toy")
def test_explain_renders_the_toy_and_says_it_cannot_read_its_rules() -> None:
    from kubeproxy.explain.command import explain

    result = CliRunner().invoke(explain, ["default/web", "--manifests", str(DEMO), "--proxy-mode", "toy"])
    assert result.exit_code == 2
    assert "--proxy-mode toy: explain cannot read this mode's rules" in result.output
    refused = CliRunner().invoke(explain, ["default/web", "--manifests", str(DEMO), "--proxy-mode", "toys"])
    assert refused.exit_code == 2 and "'toy'" in refused.output


@pytest.mark.usefixtures("toy")
def test_the_dns_labs_scenario_in_the_toy_mode() -> None:
    from kubeproxy.lab.dns.scenarios import Scenario

    annotations = {UDP_CONNTRACK_TIMEOUT: "5s"}
    toy = Scenario("toy", "the toy mode", proxy_mode="toy", annotations=annotations)
    assert toy.masquerades_external and toy.service_udp_timeout is None
    assert Scenario("nft", "nftables", proxy_mode="nftables", annotations=annotations).service_udp_timeout == 5
    relay = Scenario("relay", "the userspace relay", proxy_mode="userspace")
    assert not relay.masquerades_external
