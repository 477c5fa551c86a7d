"""What the proxy says when it starts: one summary line, and a warning for each thing that is off.

Shared by `kube-proxy`/`kubeproxy run` (logged) and `kubeproxy render` (printed on stderr), so
that an operator sees the same diagnosis offline and on the node.
"""

from __future__ import annotations

import ipaddress
import subprocess
from contextlib import suppress
from dataclasses import dataclass

from kubeproxy import __version__
from kubeproxy.backends import registry
from kubeproxy.cluster.addresses import AddressError, valid_cidr
from kubeproxy.cluster.objects import Node
from kubeproxy.model.features import gates_without_effect
from kubeproxy.model.options import (
    Family,
    configured_node_ips,
    effective_nodeport_cidrs,
    local_detector,
    node_ips,
    nodeport_addresses,
)
from kubeproxy.model.proxy_config import ConfigError, LocalDetector, ProxyConfig
from kubeproxy.proxy.config import unused_settings

# Upstream's texts, so that searches for them find our logs too.
NO_NODE_IP = "Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag"
NO_CLUSTER_CIDR = "Detect-local-mode set to ClusterCIDR, but no cluster CIDR specified for primary IP family"
NODEPORT_ADDRESSES_UNSET = (
    "nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. "
    "Consider using `--nodeport-addresses primary`"
)


@dataclass(frozen=True)
class NodeFacts:
    ips: tuple[str, ...]
    ips_from: str
    family: str
    detector: LocalDetector
    warnings: tuple[str, ...]


def node_facts(cfg: ProxyConfig, node: Node | None) -> NodeFacts:
    """This node's IPs (and where they come from), its local-traffic detector, and warnings."""
    ips = tuple(node_ips(cfg, node))
    warnings: list[str] = []
    configured, setting = configured_node_ips(cfg)
    if configured:
        ips_from = setting
    elif ips:
        ips_from = "the Node's status.addresses"
    else:
        ips_from = "nowhere"
        warnings.append(NO_NODE_IP)
    family = Family.of(ipaddress.ip_address(ips[0])) if ips else Family.IPV4
    try:
        detector = local_detector(cfg, node, family)
    except ConfigError as exc:
        detector = LocalDetector()
        warnings.append(str(exc))
    if cfg.detect_local_mode in ("", "ClusterCIDR") and not detector.implemented:
        # Upstream defaults detectLocalMode to ClusterCIDR: no cluster CIDR means pod traffic to a
        # Service from this node's pods is not told from outside traffic.
        shown = ",".join(cfg.cluster_cidr) or "none"
        warnings.append(f"{NO_CLUSTER_CIDR} (ipFamily={family}, clusterCIDRs={shown}): traffic from pods is "
                        "not told apart; set --cluster-cidr (clusterCIDR) to the pod CIDR")
    if nodeport_addresses(cfg, registry.nodeport_traits(cfg.mode)) and (warning := _nodeport_family_warning(cfg, node, family)):
        warnings.append(f"Kube-proxy configuration may be incomplete or incorrect: {warning}")
    return NodeFacts(ips, ips_from, family, detector, tuple(warnings))


def _families(cidrs: list[str]) -> set[Family]:
    """The families of these CIDRs; one that is not a CIDR (a section unused in this mode) has none."""
    out: set[Family] = set()
    for cidr in cidrs:
        try:
            out.add(Family.of(valid_cidr(cidr)))
        except AddressError:
            with suppress(ValueError):
                out.add(Family.of(ipaddress.ip_network(cidr, strict=False)))
    return out


def _nodeport_family_warning(cfg: ProxyConfig, node: Node | None, primary: Family) -> str | None:
    """Upstream's checks of the expanded nodePortAddresses against the families in use: a family
    they leave out accepts NodePorts on every local address of it."""
    cidrs = effective_nodeport_cidrs(cfg, node, registry.nodeport_traits(cfg.mode))
    if not cidrs:
        # `primary` without a node IP leaves nothing: upstream then accepts NodePorts everywhere.
        return NODEPORT_ADDRESSES_UNSET
    other = Family.IPV4 if primary.ipv6 else Family.IPV6
    configs = [list(cfg.cluster_cidr), cidrs, [str(c) for c in cfg.ipvs.get("excludeCIDRs") or ()],
               [str(c) for c in node.pod_cidrs] if node else []]
    dual = any(len(_families(c)) == 2 for c in configs)
    families = _families(cidrs)
    if dual and families == {primary}:
        return (f"cluster appears to be dual-stack but nodePortAddresses contains only {primary} addresses; "
                f"NodePort connections will be accepted on all local {other} IPs")
    if primary not in families:
        return (f"cluster appears to be {primary}-primary but nodePortAddresses contains only {other} addresses; "
                f"NodePort connections will be accepted on all local {primary} IPs")
    return None


def config_warnings(cfg: ProxyConfig) -> list[str]:
    """Settings that do nothing here, gates without effect, and upstream's bad-config warnings."""
    out = [f"{text}" for text in unused_settings(cfg)]
    out.extend(gates_without_effect(cfg.feature_gates))
    if not nodeport_addresses(cfg, registry.nodeport_traits(cfg.mode)):
        out.append(f"Kube-proxy configuration may be incomplete or incorrect: {NODEPORT_ADDRESSES_UNSET}")
    return out


def _logs_variant(mode: str) -> bool:
    found = registry.MODES.get(mode)
    return found is not None and found.logs_iptables_variant


def system_iptables_variant() -> str:
    """"legacy" or "nft": what the system's `iptables` drives (its --version says), as upstream logs it."""
    try:
        out = subprocess.run(["iptables", "--version"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return "nft" if "nf_tables" in out else "legacy" if "legacy" in out else out.strip() or "unknown"


def summary(
    cfg: ProxyConfig,
    *,
    node_name: str,
    node_from: str,
    facts: NodeFacts | None,
    iptables_variant: str,
    source: str,
) -> dict[str, object]:
    """The fields of the start-up line."""
    detector = facts.detector if facts else None
    return {
        "version": __version__,
        "mode": cfg.mode,
        "iptablesVariant": (iptables_variant or system_iptables_variant()) if _logs_variant(cfg.mode) else "n/a",
        "node": node_name,
        "nodeFrom": node_from,
        "nodeIPs": ",".join(facts.ips) if facts and facts.ips else "unknown",
        "nodeIPsFrom": facts.ips_from if facts else "not yet known",
        "localTrafficDetector": (
            f"{detector.mode}:{','.join(detector.cidrs) or detector.interface}" if detector and detector.implemented
            else "none"
        ),
        "clusterCIDR": ",".join(cfg.cluster_cidr) or "unset",
        "healthz": cfg.healthz_bind_address or "disabled",
        "metrics": cfg.metrics_bind_address or "disabled",
        "syncPeriod": f"{cfg.sync_period:g}s",
        "minSyncPeriod": f"{cfg.min_sync_period:g}s",
        "source": source,
    }
