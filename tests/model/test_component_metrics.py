"""`kubernetes_build_info` and `kubernetes_feature_enabled` against upstream kube-proxy v1.37.2's
/metrics (tests/fixtures/upstream_operator/metrics_component.txt)."""

from __future__ import annotations

import re

from kubeproxy.backends import registry
from kubeproxy.runtime.version import VersionInfo
from tests.paths import TESTS

UPSTREAM = (TESTS / "fixtures" / "upstream_operator" / "metrics_component.txt").read_text().splitlines()
SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def samples(lines: list[str], name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in lines:
        match = SAMPLE.match(line)
        if match and match[1] == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            out.append((labels, float(match[3])))
    return out


def exposition(**gates: bool) -> list[str]:
    return registry.proxy_metrics("nftables", feature_gates=gates).exposition().decode().splitlines()


def test_help_and_type_lines_are_upstreams() -> None:
    ours = exposition()
    for name in ("kubernetes_build_info", "kubernetes_feature_enabled"):
        for kind in ("HELP", "TYPE"):
            [line] = [line for line in UPSTREAM if line.startswith(f"# {kind} {name} ")]
            assert line in ours


def test_build_info_has_upstreams_labels_and_kubeproxys_version() -> None:
    [(upstream, _)] = samples(UPSTREAM, "kubernetes_build_info")
    [(ours, value)] = samples(exposition(), "kubernetes_build_info")
    assert sorted(ours) == sorted(upstream) and value == 1
    fields = VersionInfo().fields()
    assert (ours["git_version"], ours["major"], ours["minor"]) == (upstream["git_version"], "1", "37")
    assert ours["platform"] == fields["Platform"]
    # What describes a Go build is empty here, as --version=raw says.
    assert [ours[k] for k in ("build_date", "compiler", "git_commit", "git_tree_state", "go_version")] == [""] * 5


def test_feature_enabled_is_upstreams_gate_for_gate() -> None:
    upstream = {(labels["name"], labels["stage"]): value for labels, value in samples(UPSTREAM, "kubernetes_feature_enabled")}
    ours = {(labels["name"], labels["stage"]): value for labels, value in samples(exposition(), "kubernetes_feature_enabled")}
    assert len(ours) == 254 and ours == upstream


def test_feature_enabled_follows_the_proxys_settings() -> None:
    ours = {labels["name"]: value for labels, value in
            samples(exposition(KubeProxyIPVS=False, AllAlpha=True), "kubernetes_feature_enabled")}  # fmt: skip
    assert ours["KubeProxyIPVS"] == 0 and ours["AllAlpha"] == 1
    assert ours["APIServerWebhookAuthenticationToken"] == 1  # an ALPHA gate, on with AllAlpha
