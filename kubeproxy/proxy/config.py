"""Proxy configuration: upstream's KubeProxyConfiguration (v1alpha1) file and flag names.

`ProxyConfig` is what the rest of the program uses. `load_config_file` reads a
KubeProxyConfiguration YAML: fields upstream defines but we do not use are accepted (so a
kubeadm-generated file works) and reported; fields upstream does not define are rejected.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubeproxy.cluster.errors import ManifestError

PROXY_MODES = ("iptables", "nftables")
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the flag or field."""


@dataclass(frozen=True)
class LocalDetector:
    """How to tell traffic from a local pod: upstream's --detect-local-mode."""

    mode: str = ""  # "" means no detector (upstream's "no-op" detector)
    cidrs: tuple[str, ...] = ()  # ClusterCIDR / NodeCIDR (per family: the caller filters)
    interface: str = ""  # BridgeInterface name or InterfaceNamePrefix

    @property
    def implemented(self) -> bool:
        return bool(self.mode)


@dataclass(frozen=True)
class ProxyConfig:
    mode: str = "iptables"
    hostname_override: str = ""
    node_ip: str = ""
    cluster_cidr: tuple[str, ...] = ()
    detect_local_mode: str = ""
    bridge_interface: str = ""
    interface_name_prefix: str = ""
    masquerade_all: bool = False
    masquerade_bit: int = 14
    localhost_nodeports: bool = True
    nodeport_addresses: tuple[str, ...] = ()
    random_fully: bool = False
    min_sync_period: float = 1.0
    sync_period: float = 30.0
    healthz_bind_address: str = "0.0.0.0:10256"
    metrics_bind_address: str = "127.0.0.1:10249"
    kubeconfig: str = ""
    feature_gates: dict[str, bool] = field(default_factory=dict)

    def masquerade_mark(self) -> str:
        # Upstream formats 1<<bit with Go's "%#08x": eight digits after the 0x.
        return f"0x{1 << self.masquerade_bit:08x}"


def validate(cfg: ProxyConfig) -> ProxyConfig:
    if cfg.mode not in PROXY_MODES:
        raise ConfigError(f"--proxy-mode: {cfg.mode!r} is not one of {', '.join(PROXY_MODES)}")
    if cfg.detect_local_mode and cfg.detect_local_mode not in DETECT_LOCAL_MODES:
        raise ConfigError(
            f"--detect-local-mode: {cfg.detect_local_mode!r} is not one of {', '.join(DETECT_LOCAL_MODES)}"
        )
    if not 0 <= cfg.masquerade_bit <= 31:
        raise ConfigError(f"--iptables-masquerade-bit: {cfg.masquerade_bit} is out of range 0-31")
    for cidr in (*cfg.cluster_cidr, *cfg.nodeport_addresses):
        if cidr == "primary":
            continue
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"{cidr!r} is not a valid CIDR") from None
    if cfg.node_ip:
        try:
            ipaddress.ip_address(cfg.node_ip)
        except ValueError:
            raise ConfigError(f"--node-ip: {cfg.node_ip!r} is not a valid IP address") from None
    if cfg.detect_local_mode == "ClusterCIDR" and not cfg.cluster_cidr:
        raise ConfigError("--detect-local-mode=ClusterCIDR needs --cluster-cidr")
    if cfg.detect_local_mode == "BridgeInterface" and not cfg.bridge_interface:
        raise ConfigError("--detect-local-mode=BridgeInterface needs --pod-bridge-interface")
    if cfg.detect_local_mode == "InterfaceNamePrefix" and not cfg.interface_name_prefix:
        raise ConfigError("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
    return cfg


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go duration string ("1s", "1m30s", "500ms") in seconds."""
    text = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ConfigError(f"{text!r} is not a duration like 1s, 500ms or 1m30s")
    return total


# --- KubeProxyConfiguration file ---------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Loose(BaseModel):
    """A section upstream defines that we accept without using its contents."""

    model_config = ConfigDict(extra="allow")


class _SyncSection(_Strict):
    masqueradeAll: bool | None = None
    masqueradeBit: int | None = None
    localhostNodePorts: bool | None = None
    syncPeriod: str | None = None
    minSyncPeriod: str | None = None


class _DetectLocal(_Strict):
    bridgeInterface: str | None = None
    interfaceNamePrefix: str | None = None


class _ClientConnection(_Strict):
    kubeconfig: str | None = None
    acceptContentTypes: str | None = None
    contentType: str | None = None
    qps: float | None = None
    burst: int | None = None


class _KubeProxyConfiguration(_Strict):
    apiVersion: str
    kind: str
    mode: str | None = None
    hostnameOverride: str | None = None
    clusterCIDR: str | None = None
    detectLocalMode: str | None = None
    detectLocal: _DetectLocal | None = None
    iptables: _SyncSection | None = None
    nftables: _SyncSection | None = None
    nodePortAddresses: list[str] | None = None
    healthzBindAddress: str | None = None
    metricsBindAddress: str | None = None
    clientConnection: _ClientConnection | None = None
    featureGates: dict[str, bool] | None = None
    # Upstream fields we accept and do not act on (yet):
    bindAddress: str | None = None
    bindAddressHardFail: bool | None = None
    enableProfiling: bool | None = None
    showHiddenMetricsForVersion: str | None = None
    configSyncPeriod: str | None = None
    oomScoreAdj: int | None = None
    portRange: str | None = None
    logging: _Loose | None = None
    ipvs: _Loose | None = None
    winkernel: _Loose | None = None
    conntrack: _Loose | None = None
    udpIdleTimeout: str | None = None
    syncPeriod: str | None = Field(default=None)
    minSyncPeriod: str | None = Field(default=None)


def load_config_file(path: str | Path, base: ProxyConfig | None = None) -> ProxyConfig:
    """ProxyConfig from a KubeProxyConfiguration file, on top of `base` (defaults)."""
    cfg = base or ProxyConfig()
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(str(path), mark.line + 1 if mark else None, "not valid YAML") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: expected a KubeProxyConfiguration object")
    try:
        doc = _KubeProxyConfiguration.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            what = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}: {what}")
        raise ConfigError(f"--config {path}: " + "; ".join(problems)) from None
    if doc.apiVersion != API_VERSION or doc.kind != "KubeProxyConfiguration":
        raise ConfigError(
            f"--config {path}: expected apiVersion {API_VERSION} kind KubeProxyConfiguration, "
            f"got {doc.apiVersion} {doc.kind}"
        )
    changes: dict[str, Any] = {}
    if doc.mode:
        changes["mode"] = doc.mode
    if doc.hostnameOverride:
        changes["hostname_override"] = doc.hostnameOverride
    if doc.clusterCIDR:
        changes["cluster_cidr"] = tuple(c.strip() for c in doc.clusterCIDR.split(",") if c.strip())
    if doc.detectLocalMode:
        changes["detect_local_mode"] = doc.detectLocalMode
    if doc.detectLocal:
        if doc.detectLocal.bridgeInterface:
            changes["bridge_interface"] = doc.detectLocal.bridgeInterface
        if doc.detectLocal.interfaceNamePrefix:
            changes["interface_name_prefix"] = doc.detectLocal.interfaceNamePrefix
    section = doc.nftables if (doc.mode or cfg.mode) == "nftables" and doc.nftables else doc.iptables
    # A zero duration in the file means "the default", as upstream's defaulting has it
    # (kubeadm writes `0s`); only the command-line flags can ask for a real 0.
    for top_level, value in (("sync_period", doc.syncPeriod), ("min_sync_period", doc.minSyncPeriod)):
        if value and parse_duration(value):
            changes[top_level] = parse_duration(value)
    if section:
        if section.masqueradeAll is not None:
            changes["masquerade_all"] = section.masqueradeAll
        if section.masqueradeBit is not None:
            changes["masquerade_bit"] = section.masqueradeBit
        if section.localhostNodePorts is not None:
            changes["localhost_nodeports"] = section.localhostNodePorts
        if section.syncPeriod and parse_duration(section.syncPeriod):
            changes["sync_period"] = parse_duration(section.syncPeriod)
        if section.minSyncPeriod and parse_duration(section.minSyncPeriod):
            changes["min_sync_period"] = parse_duration(section.minSyncPeriod)
    if doc.nodePortAddresses is not None:
        changes["nodeport_addresses"] = tuple(doc.nodePortAddresses)
    if doc.healthzBindAddress:
        changes["healthz_bind_address"] = doc.healthzBindAddress
    if doc.metricsBindAddress:
        changes["metrics_bind_address"] = doc.metricsBindAddress
    if doc.clientConnection and doc.clientConnection.kubeconfig:
        changes["kubeconfig"] = doc.clientConnection.kubeconfig
    if doc.featureGates:
        changes["feature_gates"] = dict(doc.featureGates)
    return replace(cfg, **changes)
