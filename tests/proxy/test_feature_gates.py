"""Feature gates: the pinned release's registry, validated as upstream's component-base does.

The fixtures are upstream's own answers (tests/fixtures/upstream_feature_gates/README.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kubeproxy.model.features import IMPLEMENTED, FeatureGateError, check_gates, gate_enabled, gates_without_effect, registry
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy.config import validate
from tests.paths import REPO

CASES: list[dict[str, Any]] = json.loads(
    (REPO / "tests" / "fixtures" / "upstream_feature_gates" / "cases_v1_37_2.json").read_text()
)


def _messages(text: str) -> list[str]:
    """The messages of an aggregate error (in brackets when several), in any order."""
    if not text.startswith("["):
        return [text]
    return sorted(re.split(r", (?=unrecognized |cannot set |[A-Z]\w+ is enabled, )", text[1:-1]))


def _ours(gates: dict[str, bool]) -> str:
    try:
        registry().check(gates)
    except FeatureGateError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("case", CASES, ids=[json.dumps(c["gates"], sort_keys=True) for c in CASES])
def test_gate_settings_are_answered_as_upstream(case: dict[str, Any]) -> None:
    ours = _ours(case["gates"])
    assert _messages(ours) == _messages(case["error"]) if case["error"] else ours == ""
    for name, state in (case.get("enabled") or {}).items():
        assert gate_enabled(case["gates"], name) is state, name


def test_the_registry_is_the_whole_release() -> None:
    gates = registry().gates
    assert registry().release == "v1.37.2" and len(gates) == 254
    # Every gate upstream's fixtures flip is known; the examples behave as upstream.
    assert {"NFTablesNetlink", "KubeProxyIPVS", "KubeProxyNFTablesLocalhostNodePorts", "AllAlpha", "AllBeta"} <= set(gates)
    assert "LoadBalancerIPMode" not in gates  # no longer in the registry at v1.37.2
    assert gates["NFTablesProxyMode"].locked and gates["KubeProxyIPVS"].stage == "DEPRECATED"
    assert set(gates) >= IMPLEMENTED


def test_configuration_errors_name_the_flag_and_field_with_upstreams_text() -> None:
    for gates, text in (
        ({"LoadBalancerIPMode": True}, "unrecognized feature gate: LoadBalancerIPMode"),
        ({"NFTablesProxyMode": False}, "cannot set feature gate NFTablesProxyMode to false, feature is locked to true"),
        ({"KubeProxyIPVS": "yes"}, "KubeProxyIPVS: 'yes' is not true or false"),
    ):
        with pytest.raises(ConfigError, match="^" + re.escape(f"--feature-gates (featureGates): {text}") + "$"):
            validate(ProxyConfig(feature_gates=gates))  # type: ignore[arg-type]  # a "yes" among them: as a file may say
    with pytest.raises(FeatureGateError):
        check_gates({"AllAlpha": True})  # alpha gates then need a beta one that is off


def test_warnings_are_upstreams_for_deprecated_and_ga_gates_and_ours_for_gates_without_effect() -> None:
    # KubeProxyIPVS and WatchListClient are implemented (ipvs mode refused, lists instead of
    # watch-lists): upstream's deprecation warning only; ContextualLogging changes nothing here.
    assert gates_without_effect(
        {"KubeProxyIPVS": False, "NFTablesProxyMode": True, "ContextualLogging": False, "WatchListClient": False}
    ) == [
        "featureGates.ContextualLogging=false: no effect on kubeproxy",
        'Warning: setting deprecated feature gate. It will be removed in a future release. featureGate="KubeProxyIPVS" '
        "value=false",
        'Warning: setting GA feature gate. It will be removed in a future release. featureGate="NFTablesProxyMode" value=true',
    ]
    assert gates_without_effect({}) == []


def test_implemented_gates_follow_the_release_defaults() -> None:
    # Both are GA and locked on at 1.37: the proxy behaves as with them on, and cannot be told otherwise.
    assert ProxyConfig().parse_options(from_api_server=True).relaxed_service_names
    assert gate_enabled({}, "PreferSameTrafficDistribution")


def test_upstream_binarys_help_lists_the_same_alpha_and_beta_gates() -> None:
    lines = (REPO / "tests" / "fixtures" / "upstream_feature_gates" / "kube_proxy_help_v1_37_2.txt").read_text()
    listed = {}
    for line in lines.splitlines():
        match = re.match(r"(\w+)=true\|false \((ALPHA|BETA) - default=(true|false)\)", line)  # a clause may follow
        assert match, line
        listed[match[1]] = (match[2], match[3] == "true")
    ours = {name: (g.stage, g.default) for name, g in registry().gates.items() if g.stage in ("ALPHA", "BETA")}
    assert ours == listed
