"""Feature gates (`--feature-gates`, `featureGates:`), validated as upstream's kube-proxy does.

Upstream's kube-proxy shares one gate registry with every Kubernetes binary: all Kubernetes
gates, the API server library's, client-go's, component-base's (logging, metrics, z-pages) and
the AllAlpha/AllBeta switches. That registry, as the release kubeproxy follows holds it at its own
version, is data here (feature_gates_v1_37.json: its "source" names the upstream files, and
scripts/feature-gates regenerates it from the release's code). Setting gates is checked as
k8s.io/component-base/featuregate does it at that release, with its messages.

kubeproxy's behaviour follows the gates in IMPLEMENTED; every other gate is accepted as upstream
accepts it, and one set away from its default is named in a start-up warning.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

RELEASE_DATA = "feature_gates_v1_37.json"
ALL_ALPHA = "AllAlpha"
ALL_BETA = "AllBeta"
# The gates whose state changes what kubeproxy does (read through `GateRegistry.enabled`).
IMPLEMENTED = frozenset({
    "PreferSameTrafficDistribution", "RelaxedServiceNameValidation", "NFTablesProxyMode", "KubeProxyIPVS",
    "KubeProxyNFTablesLocalhostNodePorts", "MultiCIDRServiceAllocator", "WatchListClient",
})


class FeatureGateError(ValueError):
    """A gate setting upstream refuses; the message is upstream's (a ConfigError for the caller)."""


@dataclass(frozen=True)
class Gate:
    stage: str  # ALPHA, BETA, GA, DEPRECATED or PRE-ALPHA (not yet available at this version)
    default: bool
    locked: bool
    depends_on: tuple[str, ...] = ()


def _go_bool(value: bool) -> str:
    return "true" if value else "false"


def _aggregate(errors: list[str]) -> str:
    """apimachinery's aggregate error text: one message alone, several (deduplicated) in brackets."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


@dataclass(frozen=True)
class GateRegistry:
    release: str
    emulation_version: str
    min_compatibility_version: str
    gates: Mapping[str, Gate]

    def _resolved(self, values: Mapping[str, bool]) -> tuple[dict[str, bool], list[str]]:
        """The explicitly enabled state and the errors, in component-base's order of checks."""
        enabled: dict[str, bool] = {}
        errors: list[str] = []
        for name, value in values.items():
            gate = self.gates.get(name)
            if gate is None:
                # Upstream stops at the first unknown gate.
                errors.append(f"unrecognized feature gate: {name}")
                return enabled, errors
            if gate.locked and gate.default != value:
                errors.append(f"cannot set feature gate {name} to {_go_bool(value)}, "
                              f"feature is locked to {_go_bool(gate.default)}")
                continue
            if name in (ALL_ALPHA, ALL_BETA):
                stage = "ALPHA" if name == ALL_ALPHA else "BETA"
                for other, spec in self.gates.items():
                    if spec.stage == stage and other not in (ALL_ALPHA, ALL_BETA):
                        enabled.setdefault(other, value)
                enabled[name] = value
                continue
            if gate.stage == "PRE-ALPHA":
                errors.append(f"cannot set feature gate {name} to {_go_bool(value)}, feature is PreAlpha at emulated "
                              f"version {self.emulation_version}, min compatibility version {self.min_compatibility_version}")
                continue
            # An explicit setting wins over AllAlpha/AllBeta whichever comes first.
            enabled[name] = value
        return enabled, errors

    def errors(self, values: Mapping[str, bool]) -> list[str]:
        enabled, errors = self._resolved(values)
        if errors:
            return errors
        for name in sorted(self.gates):
            if not self._on(name, enabled):
                continue
            disabled = [dep for dep in self.gates[name].depends_on if not self._on(dep, enabled)]
            if disabled:
                errors.append(f"{name} is enabled, but depends on features that are disabled: [{' '.join(disabled)}]")
        return errors

    def _on(self, name: str, enabled: Mapping[str, bool]) -> bool:
        gate = self.gates.get(name)
        return enabled.get(name, gate.default if gate else False)

    def check(self, values: Mapping[str, bool]) -> None:
        """Raise FeatureGateError with upstream's message when upstream would refuse these settings."""
        errors = self.errors(values)
        if errors:
            raise FeatureGateError(_aggregate(errors))

    def enabled(self, values: Mapping[str, bool], name: str) -> bool:
        """A gate's state under these (valid) settings: the setting, AllAlpha/AllBeta, else its default."""
        enabled, _ = self._resolved(values)
        return self._on(name, enabled)

    def warnings(self, values: Mapping[str, bool]) -> list[str]:
        """Upstream's warnings for deprecated and GA gates that are set, and our note for gates
        set away from their default whose behaviour kubeproxy does not have."""
        out: list[str] = []
        for name, value in sorted(values.items()):
            gate = self.gates.get(name)
            if gate is None:
                continue
            if gate.stage == "DEPRECATED":
                out.append("Warning: setting deprecated feature gate. It will be removed in a future release. "
                           f'featureGate="{name}" value={_go_bool(value)}')
            elif gate.stage == "GA":
                out.append("Warning: setting GA feature gate. It will be removed in a future release. "
                           f'featureGate="{name}" value={_go_bool(value)}')
            if name not in IMPLEMENTED and name not in (ALL_ALPHA, ALL_BETA) and value != gate.default:
                out.append(f"featureGates.{name}={_go_bool(value)}: no effect on kubeproxy")
        return out


def _gate(raw: Mapping[str, Any]) -> Gate:
    return Gate(str(raw["stage"]), bool(raw["default"]), bool(raw["locked"]), tuple(raw.get("dependsOn") or ()))


@functools.cache
def registry() -> GateRegistry:
    """The pinned release's registry (immutable data, read once)."""
    raw = json.loads(resources.files("kubeproxy.model").joinpath(RELEASE_DATA).read_text())
    return GateRegistry(
        str(raw["release"]),
        str(raw["emulationVersion"]),
        str(raw["minCompatibilityVersion"]),
        {name: _gate(spec) for name, spec in raw["gates"].items()},
    )


def check_gates(gates: Mapping[str, object]) -> None:
    """Raise FeatureGateError (upstream's message, after the flag and field) for settings
    upstream's kube-proxy refuses."""
    where = "--feature-gates (featureGates)"
    for name, value in gates.items():
        if not isinstance(value, bool):
            raise FeatureGateError(f"{where}: {name}: {value!r} is not true or false")
    try:
        registry().check({name: bool(value) for name, value in gates.items()})
    except FeatureGateError as exc:
        raise FeatureGateError(f"{where}: {exc}") from None


def gate_enabled(gates: Mapping[str, bool], name: str) -> bool:
    return registry().enabled(gates, name)


def gates_without_effect(gates: Mapping[str, bool]) -> list[str]:
    """Start-up warnings for the gates set (see `GateRegistry.warnings`)."""
    return registry().warnings(gates)
