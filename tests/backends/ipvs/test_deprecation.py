"""IPVS mode's deprecation as upstream v1.37.2 has it: the `KubeProxyIPVS` gate (deprecated,
on by default) allows the mode, and off refuses it with upstream's validation message (the case
"ipvs is not allowed - with KubeProxyIPVS feature gate disabled" of
pkg/proxy/apis/config/validation/validation_test.go); with the mode on, start-up logs upstream's
deprecation message and queues its Warning Event about the Node."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeproxy.backends.ipvs import deprecation
from kubeproxy.model.features import gates_without_effect, registry
from kubeproxy.model.proxy_config import ConfigError
from kubeproxy.proxy import kube_proxy
from kubeproxy.proxy.flags import parse, resolve

UPSTREAM_REFUSAL = ('KubeProxyConfiguration.Mode.ProxyMode: Invalid value: "ipvs": must be iptables, nftables or blank '
                    "(blank means the best-available proxy [currently iptables])")  # fmt: skip


def test_the_gate_is_the_releases() -> None:
    gate = registry().gates[deprecation.GATE]
    assert (gate.stage, gate.default, gate.locked) == ("DEPRECATED", True, False)


@pytest.mark.parametrize("gates", [[], ["--feature-gates=KubeProxyIPVS=true"]])
def test_ipvs_is_allowed_with_the_gate_on(gates: list[str]) -> None:
    assert resolve(parse(["--proxy-mode=ipvs", *gates])).cfg.mode == "ipvs"


def test_ipvs_is_refused_with_the_gate_off() -> None:
    with pytest.raises(ConfigError) as refused:
        resolve(parse(["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"]))
    assert str(refused.value) == f"--proxy-mode (mode): {UPSTREAM_REFUSAL}"


def test_the_config_file_is_refused_too(tmp_path: Path) -> None:
    config = tmp_path / "config.conf"
    config.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
                      "featureGates:\n  KubeProxyIPVS: false\n")  # fmt: skip
    with pytest.raises(ConfigError, match="must be iptables, nftables or blank"):
        resolve(parse([f"--config={config}"]))


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_other_modes_run_with_the_gate_off(mode: str) -> None:
    assert resolve(parse([f"--proxy-mode={mode}", "--feature-gates=KubeProxyIPVS=false"])).cfg.mode == mode


def test_setting_the_gate_is_upstreams_deprecated_gate_warning_only() -> None:
    warnings = gates_without_effect({"KubeProxyIPVS": False})
    assert warnings == ['Warning: setting deprecated feature gate. It will be removed in a future release. '
                        'featureGate="KubeProxyIPVS" value=false']  # fmt: skip


def test_ipvs_mode_logs_and_queues_the_deprecation(caplog: pytest.LogCaptureFixture) -> None:
    cfg = resolve(parse(["--proxy-mode=ipvs"])).cfg
    with caplog.at_level(logging.INFO):
        events = kube_proxy._mode_warnings(cfg)
    assert events == [("IPVSDeprecation", "StartKubeProxy", deprecation.MESSAGE)]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and deprecation.MESSAGE in errors[0].getMessage()
    assert deprecation.MESSAGE == ("The ipvs proxier has been deprecated and will be disabled by default in Kubernetes "
                                   "1.40 and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead.")
    caplog.clear()
    assert kube_proxy._mode_warnings(resolve(parse(["--proxy-mode=nftables"])).cfg) == [] and not caplog.records
