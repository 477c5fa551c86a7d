"""Feature gates (`--feature-gates`, `featureGates:`): the ones kubeproxy knows, validated as upstream.

Upstream's kube-proxy accepts every Kubernetes gate and refuses an unknown one with
"unrecognized feature gate: NAME"; a GA gate is locked to true ("cannot set feature gate NAME to
false, feature is locked to true"). kubeproxy knows the gates that change what a proxy does,
plus upstream's AllAlpha/AllBeta switches: those it implements follow the gate; those whose
behaviour it always has (GA upstream) are accepted at true and refused at false, as upstream.
"""

from __future__ import annotations

from dataclasses import dataclass


class FeatureGateError(ValueError):
    """A gate that cannot be set; the message names it (a ConfigError for the caller)."""


@dataclass(frozen=True)
class Gate:
    default: bool
    stage: str  # "ALPHA", "BETA" or "GA" (locked to true)
    implemented: bool  # kubeproxy's behaviour follows the gate


KNOWN_GATES: dict[str, Gate] = {
    # Implemented: the node model reads these.
    "PreferSameTrafficDistribution": Gate(True, "BETA", True),
    "RelaxedServiceNameValidation": Gate(False, "ALPHA", True),
    # Upstream's proxy gates that are GA: kubeproxy always behaves as with the gate on.
    "ServiceTrafficDistribution": Gate(True, "GA", True),
    "TopologyAwareHints": Gate(True, "GA", True),
    "KubeProxyDrainingTerminatingNodes": Gate(True, "GA", True),
    "NFTablesProxyMode": Gate(True, "GA", True),
    "ProxyTerminatingEndpoints": Gate(True, "GA", True),
    "MinimizeIPTablesRestore": Gate(True, "GA", True),
    "ServiceInternalTrafficPolicy": Gate(True, "GA", True),
    "EndpointSliceTerminatingCondition": Gate(True, "GA", True),
    "LoadBalancerIPMode": Gate(True, "GA", True),
    "IPv6DualStack": Gate(True, "GA", True),
    # Gates of other components that clusters commonly set for everything (kubeadm passes the
    # cluster's gates to kube-proxy too): accepted, no effect on a proxy.
    "MultiCIDRServiceAllocator": Gate(False, "BETA", False),
    "DisableAllocatorDualWrite": Gate(False, "BETA", False),
    "InPlacePodVerticalScaling": Gate(True, "BETA", False),
    "SidecarContainers": Gate(True, "BETA", False),
    "UserNamespacesSupport": Gate(False, "BETA", False),
    "StructuredAuthenticationConfiguration": Gate(True, "BETA", False),
    "ComponentFlagz": Gate(False, "ALPHA", False),
    "ComponentStatusz": Gate(False, "ALPHA", False),
    "ContextualLogging": Gate(True, "BETA", False),
    "LoggingAlphaOptions": Gate(False, "ALPHA", False),
    "LoggingBetaOptions": Gate(True, "BETA", False),
    "AllAlpha": Gate(False, "ALPHA", False),
    "AllBeta": Gate(False, "BETA", False),
}


def check_gates(gates: dict[str, bool]) -> None:
    """Raise FeatureGateError (naming the gate) for a gate upstream would refuse or we do not know."""
    for name, value in gates.items():
        gate = KNOWN_GATES.get(name)
        if gate is None:
            known = ", ".join(sorted(KNOWN_GATES))
            raise FeatureGateError(f"--feature-gates (featureGates): unrecognized feature gate: {name} (known: {known})")
        if not isinstance(value, bool):
            raise FeatureGateError(f"--feature-gates (featureGates): {name}: {value!r} is not true or false")
        if gate.stage == "GA" and not value:
            raise FeatureGateError(f"--feature-gates (featureGates): cannot set feature gate {name} to false, "
                                   "feature is locked to true")


def gates_without_effect(gates: dict[str, bool]) -> list[str]:
    """Gates set away from their default that change nothing in a proxy (for a start-up warning)."""
    return [
        f"featureGates.{name}={str(value).lower()}: no effect on kubeproxy"
        for name, value in sorted(gates.items())
        if name in KNOWN_GATES and not KNOWN_GATES[name].implemented and value != KNOWN_GATES[name].default
    ]
