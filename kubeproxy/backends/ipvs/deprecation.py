"""IPVS mode's deprecation, as upstream v1.37.2 states and enforces it.

The `KubeProxyIPVS` gate (GA since 1.0, deprecated in 1.37, on by default) allows the mode:
turned off, `ipvs` is refused as an invalid mode (pkg/proxy/apis/config/validation,
validateProxyModeLinux). With the mode on, start-up logs upstream's deprecation message at error
level and records it as a Warning Event about the Node, reason `REASON`, action `ACTION`
(cmd/kube-proxy/app/server_linux.go).
"""

from __future__ import annotations

from collections.abc import Mapping

from kubeproxy.model.features import gate_enabled

GATE = "KubeProxyIPVS"
MESSAGE = ("The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in "
           "Kubernetes 1.43. Migrate to the 'nftables' proxier instead.")  # fmt: skip
REASON = "IPVSDeprecation"
ACTION = "StartKubeProxy"
# Upstream's field error for `ipvs` with the gate off (its valid modes listed without ipvs).
REFUSED = ('KubeProxyConfiguration.Mode.ProxyMode: Invalid value: "ipvs": must be iptables, nftables or blank '
           "(blank means the best-available proxy [currently iptables])")  # fmt: skip


def refusal(feature_gates: Mapping[str, bool]) -> str | None:
    """Why ipvs mode may not run under these gates (upstream's message), or None."""
    return None if gate_enabled(feature_gates, GATE) else REFUSED

