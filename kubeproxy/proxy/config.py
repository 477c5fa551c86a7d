"""Proxy configuration: upstream's KubeProxyConfiguration (v1alpha1) file and flag names.

`ProxyConfig` is what the rest of the program uses. `load_config_file` reads a
KubeProxyConfiguration YAML: every field upstream defines is accepted (so a kubeadm-generated
file works, with its nulls, `""` and `0s` meaning "the default" as upstream's defaulting has it);
`unused_settings` names the ones set to something kubeproxy does not do, for a start-up warning;
fields upstream does not define are rejected by name. `to_kube_proxy_configuration` writes the
effective configuration back in upstream's form (`--write-config-to`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeproxy.backends import registry
from kubeproxy.cluster.addresses import AddressError, valid_cidr, valid_ip
from kubeproxy.cluster.duration import format_go_duration
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.validation import parse_port_range
from kubeproxy.model.features import gate_enabled
from kubeproxy.model.proxy_config import (
    DEFAULT_CONTENT_TYPE,
    NODEPORT_KEYWORDS,
    ConfigError,
    ConntrackConfig,
    ProxyConfig,
    parse_duration,
    parse_node_ips,
)

if TYPE_CHECKING:
    from kubeproxy.proxy.config_schema import _Conntrack, _KubeProxyConfiguration

PROXY_MODES = registry.ModeNames()
# Upstream's other modes: accepted by upstream's parser, refused here at start-up by name.
UNBUILT_MODES = {
    "kernelspace": "kernelspace is upstream's Windows mode; kubeproxy runs on Linux only (iptables or nftables)",
}
LOGGING_FORMATS = ("text", "json")
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"


def mode_sections(mode: str) -> tuple[str, str]:
    """The KubeProxyConfiguration sections `mode` reads its (periods, masquerade settings) from;
    iptables' for a mode not (or not yet validated as) registered, as upstream's conversion."""
    found = registry.MODES.get(mode)
    return (found.periods_section, found.masquerade_section) if found else ("iptables", "iptables")


def validate(cfg: ProxyConfig) -> ProxyConfig:
    if cfg.mode in UNBUILT_MODES:
        raise ConfigError(f"--proxy-mode (mode): {cfg.mode}: {UNBUILT_MODES[cfg.mode]}")
    if cfg.mode not in PROXY_MODES:
        raise ConfigError(f"--proxy-mode: {cfg.mode!r} is not one of {', '.join(PROXY_MODES)}")
    if (mode_checks := registry.MODES[cfg.mode].validate) is not None:
        mode_checks(cfg)
    if cfg.detect_local_mode and cfg.detect_local_mode not in DETECT_LOCAL_MODES:
        raise ConfigError(
            f"--detect-local-mode: {cfg.detect_local_mode!r} is not one of {', '.join(DETECT_LOCAL_MODES)}"
        )
    for bit in (cfg.masquerade_bit, cfg.inactive_masquerade_bit):
        if not 0 <= bit <= 31:
            raise ConfigError(f"--iptables-masquerade-bit: {bit} is out of range 0-31")
    _validate_nodeport_addresses(cfg.nodeport_addresses)
    for cidr in cfg.cluster_cidr:
        try:
            valid_cidr(cidr)
        except ValueError:
            raise ConfigError(f"--cluster-cidr (clusterCIDR): {cidr!r} is not a valid CIDR") from None
    # Rules carry the CIDR as upstream's detector does: parsed, host bits masked, canonical text.
    cfg = replace(cfg, cluster_cidr=tuple(str(valid_cidr(cidr)) for cidr in cfg.cluster_cidr))
    if cfg.service_node_port_range:
        try:
            parse_port_range(cfg.service_node_port_range)
        except ValueError as exc:
            raise ConfigError(f"--service-node-port-range: {exc}") from None
    if cfg.port_range:
        from kubeproxy.backends.userspace.ports import parse_port_range as parse_proxy_port_range

        try:
            parse_proxy_port_range(cfg.port_range)
        except ValueError as exc:
            raise ConfigError(f"--proxy-port-range (portRange): {exc}") from None
    if cfg.udp_idle_timeout <= 0:
        raise ConfigError("--udp-timeout (udpIdleTimeout): must be greater than 0")
    if cfg.node_ip:
        try:
            parse_node_ips(cfg.node_ip)
        except ValueError as exc:
            raise ConfigError(f"--node-ip: {exc}") from None
    _validate_more(cfg)
    if cfg.detect_local_mode == "BridgeInterface" and not cfg.bridge_interface:
        raise ConfigError("--detect-local-mode=BridgeInterface needs --pod-bridge-interface")
    if cfg.detect_local_mode == "InterfaceNamePrefix" and not cfg.interface_name_prefix:
        raise ConfigError("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
    return cfg


def _validate_sync_periods(cfg: ProxyConfig) -> None:
    """Upstream's bounds: syncPeriod > 0, minSyncPeriod >= 0, syncPeriod >= minSyncPeriod.

    Named as the mode reads them: the ipvs flags and section in ipvs mode, the nftables section
    in nftables mode (its flags are the iptables ones), the iptables ones otherwise."""
    section = mode_sections(cfg.mode)[0]
    flag = "ipvs" if section == "ipvs" else "iptables"  # upstream's period flags: --iptables-*, --ipvs-*
    sync = f"--{flag}-sync-period ({section}.syncPeriod)"
    min_sync = f"--{flag}-min-sync-period ({section}.minSyncPeriod)"
    if cfg.sync_period <= 0:
        raise ConfigError(f"{sync}: {format_go_duration(cfg.sync_period)}: must be greater than 0")
    if cfg.min_sync_period < 0:
        raise ConfigError(f"{min_sync}: {format_go_duration(cfg.min_sync_period)}: must be greater than or equal to 0")
    if cfg.min_sync_period > cfg.sync_period:
        raise ConfigError(f"{sync}: {format_go_duration(cfg.sync_period)}: must be greater than or equal to "
                          f"{min_sync}, {format_go_duration(cfg.min_sync_period)}")


def _validate_more(cfg: ProxyConfig) -> None:
    """Upstream's validation of the fields beyond the rules, with the field's name."""
    try:
        valid_ip(cfg.bind_address)
    except ValueError:
        raise ConfigError(f"--bind-address (bindAddress): {cfg.bind_address!r} is not a valid IP address") from None
    for name, value in (("healthzBindAddress", cfg.healthz_bind_address), ("metricsBindAddress", cfg.metrics_bind_address)):
        if value and not _host_port(value):
            raise ConfigError(f"{name}: {value!r} must be IP:port (for example 0.0.0.0:10256)")
    if cfg.oom_score_adj is not None and not -1000 <= cfg.oom_score_adj <= 1000:
        raise ConfigError(f"--oom-score-adj (oomScoreAdj): {cfg.oom_score_adj} must be within [-1000, 1000]")
    if cfg.logging_format not in LOGGING_FORMATS:
        raise ConfigError(
            f"--logging-format (logging.format): unsupported value {cfg.logging_format!r}: supported values: text, json"
        )
    if cfg.verbosity < 0:
        raise ConfigError(f"-v (logging.verbosity): {cfg.verbosity} must not be negative")
    _validate_logging_extra(cfg)
    if cfg.snat_watch_interval < 0 or not 0 < cfg.snat_watch_threshold <= 1 or cfg.snat_watch_max_entries < 1:
        raise ConfigError(f"--snat-watch={cfg.snat_watch_interval:g}s, --snat-watch-threshold={cfg.snat_watch_threshold:g}, "
                          f"--snat-watch-max-entries={cfg.snat_watch_max_entries}: want an interval >= 0, "
                          "a threshold in (0, 1] and at least one entry")
    ct = cfg.conntrack
    for name, number in (("conntrack.maxPerCore", ct.max_per_core), ("conntrack.min", ct.min)):
        if number is not None and number < 0:
            raise ConfigError(f"{name}: {number} must be greater than or equal to 0")
    for name, seconds in (
        ("conntrack.tcpEstablishedTimeout", ct.tcp_established_timeout),
        ("conntrack.tcpCloseWaitTimeout", ct.tcp_close_wait_timeout),
        ("conntrack.udpTimeout", ct.udp_timeout),
        ("conntrack.udpStreamTimeout", ct.udp_stream_timeout),
    ):
        if seconds is not None and seconds < 0:
            raise ConfigError(f"{name}: must be greater than or equal to 0")
    _validate_sync_periods(cfg)
    if cfg.config_sync_period <= 0:
        raise ConfigError("--config-sync-period (configSyncPeriod): must be greater than 0")
    if cfg.client_burst < 0 or cfg.client_qps < 0:
        raise ConfigError("--kube-api-qps/--kube-api-burst (clientConnection.qps/burst): must not be negative")
    if cfg.show_hidden_metrics_for_version and not re.fullmatch(r"\d+\.\d+", cfg.show_hidden_metrics_for_version):
        raise ConfigError(
            f"--show-hidden-metrics-for-version (showHiddenMetricsForVersion): {cfg.show_hidden_metrics_for_version!r} "
            "must be <major>.<minor>, e.g. 1.16"
        )
    from kubeproxy.model.features import FeatureGateError, check_gates

    try:
        check_gates(cfg.feature_gates)
    except FeatureGateError as exc:
        raise ConfigError(str(exc)) from None


def _validate_logging_extra(cfg: ProxyConfig) -> None:
    """component-base's checks of the logging section, with its messages."""
    if cfg.logging_extra.get("vmodule") and cfg.logging_format != "text":
        raise ConfigError("initialize logging: logging.vmodule: Forbidden: Only supported for text log format")
    options = cfg.logging_extra.get("options") or {}
    forbidden = [
        f"logging.options.{stream}.{key}: Forbidden: Feature LoggingAlphaOptions is disabled"
        for stream in ("text", "json")
        for key, unset in (("splitStream", False), ("infoBufferSize", "0"))
        if str((options.get(stream) or {}).get(key, unset)) not in (str(unset), "None", "")
    ]
    if forbidden and not gate_enabled(cfg.feature_gates, "LoggingAlphaOptions"):
        raise ConfigError("initialize logging: " + (forbidden[0] if len(forbidden) == 1 else f"[{', '.join(forbidden)}]"))


# Upstream's nodePortAddresses keywords (kubeproxy.model.options expands them).


def _validate_nodeport_addresses(entries: tuple[str, ...]) -> None:
    """Upstream's check: each entry a CIDR (as ParseCIDRSloppy reads one) or a keyword, each
    keyword at most once; keywords and CIDRs mix freely."""
    where = "--nodeport-addresses (nodePortAddresses"
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        if entry in NODEPORT_KEYWORDS:
            if entry in seen:
                raise ConfigError(f'{where}[{index}]): Duplicate value: "{entry}"')
            seen.add(entry)
            continue
        try:
            valid_cidr(entry)
        except AddressError:
            raise ConfigError(
                f'{where}[{index}]): Invalid value: "{entry}": must be a valid CIDR or one of the keywords '
                "'primary', 'localhost', 'all'"
            ) from None


def _host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        return False
    try:
        valid_ip(host.strip("[]"))
    except ValueError:
        return False
    return True


def unused_settings(cfg: ProxyConfig) -> list[str]:
    """The settings of `cfg` that kubeproxy accepts but does not act on, one "name: why" each.

    Only values that differ from upstream's defaults are named: a kubeadm file that leaves them
    alone gets no warning.
    """
    out = list(cfg.unused_fields)
    default = ProxyConfig()
    if cfg.enable_profiling:
        out.append("enableProfiling (--profiling): kubeproxy serves no /debug/pprof (it has no Go runtime to profile); ignored")
    if cfg.show_hidden_metrics_for_version:
        out.append("showHiddenMetricsForVersion: kubeproxy has no hidden metrics; ignored")
    if cfg.config_sync_period != default.config_sync_period:
        out.append("configSyncPeriod (--config-sync-period): kubeproxy's watches do not resync periodically; ignored")
    if cfg.client_content_type not in ("", DEFAULT_CONTENT_TYPE, "application/json"):
        out.append(f"clientConnection.contentType: {cfg.client_content_type}: kubeproxy asks for protobuf or JSON; JSON used")
    if mode_sections(cfg.mode)[0] != "ipvs":
        for key, value in sorted(cfg.ipvs.items()):
            if value not in (None, "", 0, "0s", False, [], {}):
                out.append(f"ipvs.{key}: used only in ipvs mode; ignored (as upstream does in {cfg.mode} mode)")
    return out


# --- KubeProxyConfiguration file ---------------------------------------------------------

# The pydantic models of the file live in proxy/config_schema.py, imported only to read one.


def _seconds(path: str, field_name: str, value: str | None) -> float | None:
    """A duration field in seconds, naming the field when it is not one; None when unset."""
    if value is None or value == "":
        return None
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise ConfigError(f"--config {path}: {field_name}: {exc}") from None


def _duration_text(value: Any) -> str | None:
    """A duration field of a section kept as plain YAML: its text (a number is not a Go duration)."""
    return None if value is None else str(value)


def _not_a_kube_proxy_configuration(path: str | Path, raw: dict[str, Any]) -> ConfigError:
    kind, api_version = raw.get("kind"), raw.get("apiVersion")
    if kind == "ConfigMap":
        data: dict[str, Any] = raw["data"] if isinstance(raw.get("data"), dict) else {}
        meta: dict[str, Any] = raw["metadata"] if isinstance(raw.get("metadata"), dict) else {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}".strip("/")
        keys = ", ".join(sorted(str(k) for k in data)) or "none"
        hint = "its 'config.conf' key" if "config.conf" in data else "the data key that holds the KubeProxyConfiguration"
        return ConfigError(
            f"--config {path}: this is a ConfigMap ({name or 'unnamed'}, data keys: {keys}), not a "
            f"KubeProxyConfiguration: pass the content of {hint} (kubeadm's DaemonSet mounts the "
            "ConfigMap at /var/lib/kube-proxy and passes --config=/var/lib/kube-proxy/config.conf)"
        )
    return ConfigError(
        f"--config {path}: expected apiVersion {API_VERSION} kind KubeProxyConfiguration, got {api_version} {kind}"
    )


def load_config_file(path: str | Path, base: ProxyConfig | None = None) -> ProxyConfig:
    """ProxyConfig from a KubeProxyConfiguration file, on top of `base` (defaults)."""
    import yaml  # only with --config: the start-up of most runs does without it

    cfg = base or ProxyConfig()
    from kubeproxy.cluster.manifests import read_text

    try:
        # Bounded, UTF-8 checked, and only a regular file: a FIFO would hold the start for ever.
        raw = yaml.safe_load(read_text(Path(path), regular_only=True))
    except ManifestError as exc:
        raise ConfigError(f"--config {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(str(path), mark.line + 1 if mark else None, "not valid YAML") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: expected a KubeProxyConfiguration object")
    if raw.get("kind") != "KubeProxyConfiguration" or raw.get("apiVersion") != API_VERSION:
        raise _not_a_kube_proxy_configuration(path, raw)
    doc, unknown = _decode(path, raw)
    changes: dict[str, Any] = {}
    if doc.mode:
        changes["mode"] = doc.mode
    if doc.mode in UNBUILT_MODES:
        raise ConfigError(f"--config {path}: mode: {doc.mode}: {UNBUILT_MODES[doc.mode]}")
    if doc.portRange:
        changes["port_range"] = doc.portRange
    udp_idle = _seconds(str(path), "udpIdleTimeout", doc.udpIdleTimeout)
    if udp_idle:
        changes["udp_idle_timeout"] = udp_idle
    if doc.hostnameOverride:
        changes["hostname_override"] = doc.hostnameOverride.strip().lower()
    if doc.clusterCIDR:
        changes["cluster_cidr"] = tuple(c.strip() for c in doc.clusterCIDR.split(",") if c.strip())
    if doc.detectLocalMode:
        changes["detect_local_mode"] = doc.detectLocalMode
    if doc.detectLocal:
        if doc.detectLocal.bridgeInterface:
            changes["bridge_interface"] = doc.detectLocal.bridgeInterface
        if doc.detectLocal.interfaceNamePrefix:
            changes["interface_name_prefix"] = doc.detectLocal.interfaceNamePrefix
    periods_name, name = mode_sections(doc.mode or cfg.mode)
    # The mode's section, as upstream's conversion reads it: nftables mode never falls back to iptables'.
    section, other = (doc.nftables, doc.iptables) if name == "nftables" else (doc.iptables, doc.nftables)
    if periods_name == "ipvs" and doc.ipvs:
        # The ipvs section's periods are the ones ipvs mode runs by, as upstream's conversion has it.
        ipvs = doc.ipvs.model_extra or {}
        for attr, key in (("sync_period", "syncPeriod"), ("min_sync_period", "minSyncPeriod")):
            if seconds := _seconds(str(path), f"ipvs.{key}", _duration_text(ipvs.get(key))):
                changes[attr] = seconds
    # A zero duration in the file means "the default", as upstream's defaulting has it
    # (kubeadm writes `0s`); only the command-line flags can ask for a real 0.
    for top_level, value in (("sync_period", doc.syncPeriod), ("min_sync_period", doc.minSyncPeriod)):
        seconds = _seconds(str(path), top_level.replace("_p", "P").replace("_s", "S"), value)
        if seconds:
            changes[top_level] = seconds
    if section:
        if section.masqueradeAll is not None:
            changes["masquerade_all"] = section.masqueradeAll
        if section.masqueradeBit is not None:
            changes["masquerade_bit"] = section.masqueradeBit
    # Upstream keeps both sections' bits and iptables.localhostNodePorts whatever the mode.
    if other and other.masqueradeBit is not None:
        changes["inactive_masquerade_bit"] = other.masqueradeBit
    if doc.iptables and doc.iptables.localhostNodePorts is not None:
        changes["localhost_nodeports"] = doc.iptables.localhostNodePorts
    if section:
        periods = periods_name == name  # ipvs mode runs by the ipvs section's
        if periods and (seconds := _seconds(str(path), f"{name}.syncPeriod", section.syncPeriod)):
            changes["sync_period"] = seconds
        if periods and (seconds := _seconds(str(path), f"{name}.minSyncPeriod", section.minSyncPeriod)):
            changes["min_sync_period"] = seconds
    if doc.nodePortAddresses is not None:
        changes["nodeport_addresses"] = tuple(doc.nodePortAddresses)
    if doc.healthzBindAddress:
        changes["healthz_bind_address"] = doc.healthzBindAddress
    if doc.metricsBindAddress:
        changes["metrics_bind_address"] = doc.metricsBindAddress
    client = doc.clientConnection
    if client:
        if client.kubeconfig:
            changes["kubeconfig"] = client.kubeconfig
        # Zero and "" mean upstream's defaults (qps 5, burst 10, protobuf), as kubeadm writes them.
        if client.qps:
            changes["client_qps"] = client.qps
        if client.burst:
            changes["client_burst"] = client.burst
        if client.contentType:
            changes["client_content_type"] = client.contentType
        if client.acceptContentTypes:
            changes["client_accept_content_types"] = client.acceptContentTypes
    if doc.featureGates:
        changes["feature_gates"] = dict(doc.featureGates)
    if doc.bindAddress:
        changes["bind_address"] = doc.bindAddress
    if doc.bindAddressHardFail is not None:
        changes["bind_address_hard_fail"] = doc.bindAddressHardFail
    if doc.enableProfiling is not None:
        changes["enable_profiling"] = doc.enableProfiling
    if doc.showHiddenMetricsForVersion:
        changes["show_hidden_metrics_for_version"] = doc.showHiddenMetricsForVersion
    if seconds := _seconds(str(path), "configSyncPeriod", doc.configSyncPeriod):
        changes["config_sync_period"] = seconds
    if doc.oomScoreAdj is not None:
        changes["oom_score_adj"] = doc.oomScoreAdj
    if doc.conntrack:
        changes["conntrack"] = _conntrack(str(path), doc.conntrack, cfg.conntrack)
    if doc.logging:
        if doc.logging.format:
            changes["logging_format"] = doc.logging.format
        if doc.logging.verbosity is not None:
            changes["verbosity"] = doc.logging.verbosity
        given = {key: value for key, value in raw["logging"].items() if key not in ("format", "verbosity")}
        changes["logging_extra"] = {key: value for key, value in given.items() if value is not None}
    if doc.ipvs:
        changes["ipvs"] = _ipvs_types(str(path), dict(doc.ipvs.model_extra or {}))
    changes["unused_fields"] = tuple(
        [f"{where}: unknown field, ignored (upstream decodes leniently too: \"Using lenient decoding as strict "
         "decoding failed\"); check its spelling" for where in unknown] + _unused_file_fields(doc)
    )
    return replace(cfg, **changes)


def _ipvs_types(path: str, ipvs: dict[str, Any]) -> dict[str, Any]:
    """The ipvs section's value types, checked in every mode as upstream's decoding does (ipvs
    mode checks the values themselves: backends/ipvs/config_section.py)."""
    for key, value in ipvs.items():
        if value is None:
            continue
        if key in ("syncPeriod", "minSyncPeriod", "tcpTimeout", "tcpFinTimeout", "udpTimeout"):
            _seconds(path, f"ipvs.{key}", _duration_text(value))
        elif key == "excludeCIDRs" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"--config {path}: ipvs.excludeCIDRs: {value!r} is not a list of CIDRs")
        elif key == "scheduler" and not isinstance(value, str):
            raise ConfigError(f"--config {path}: ipvs.scheduler: {value!r} is not a string")
        elif key == "strictARP" and not isinstance(value, bool):
            raise ConfigError(f"--config {path}: ipvs.strictARP: {value!r} is not true or false")
    return ipvs


def _decode(path: str | Path, raw: dict[str, Any]) -> tuple[_KubeProxyConfiguration, list[str]]:
    """The file, decoded as upstream does: strictly, else leniently (unknown fields dropped and
    named, for a warning). A value of the wrong type is an error either way, naming the field."""
    from pydantic import ValidationError

    from kubeproxy.proxy.config_schema import _KubeProxyConfiguration

    try:
        return _KubeProxyConfiguration.model_validate(raw), []
    except ValidationError as exc:
        errors = exc.errors()
    bad = [err for err in errors if err["type"] != "extra_forbidden"]
    if bad:
        problems = [f"{'.'.join('json' if p == 'json_' else str(p) for p in err['loc'])}: {err['msg']}" for err in bad]
        raise ConfigError(f"--config {path}: " + "; ".join(problems)) from None
    lenient = copy.deepcopy(raw)
    unknown = []
    for err in errors:
        loc = ["json" if p == "json_" else p for p in err["loc"]]
        unknown.append(".".join(str(p) for p in loc))
        parent: Any = lenient
        for part in loc[:-1]:
            parent = parent[part]
        parent.pop(loc[-1], None)
    return _KubeProxyConfiguration.model_validate(lenient), unknown


def _conntrack(path: str, section: _Conntrack, base: ConntrackConfig) -> ConntrackConfig:
    """Upstream's defaulting: null takes the default; an explicit 0 (or 0s) leaves the kernel alone."""
    changes: dict[str, Any] = {}
    if section.maxPerCore is not None:
        changes["max_per_core"] = section.maxPerCore
    if section.min is not None:
        changes["min"] = section.min
    if section.tcpBeLiberal is not None:
        changes["tcp_be_liberal"] = section.tcpBeLiberal
    for attr, name in _CONNTRACK_TIMEOUTS:
        value = _seconds(path, f"conntrack.{name}", getattr(section, name))
        if value is not None:
            changes[attr] = value
    return replace(base, **changes)


# ConntrackConfig's timeouts and their names in the file, in the file's order (the first bad one is reported).
_CONNTRACK_TIMEOUTS = (
    ("tcp_established_timeout", "tcpEstablishedTimeout"),
    ("tcp_close_wait_timeout", "tcpCloseWaitTimeout"),
    ("udp_timeout", "udpTimeout"),
    ("udp_stream_timeout", "udpStreamTimeout"),
)


def _unused_file_fields(doc: _KubeProxyConfiguration) -> list[str]:
    out = []
    given = {"portRange": bool(doc.portRange), "udpIdleTimeout": bool(doc.udpIdleTimeout and parse_duration(doc.udpIdleTimeout))}
    for key in sorted(k for k, v in given.items() if v and k not in _file_fields(doc.mode or "")):
        readers = " and ".join(m.name for m in registry.MODES.values() if key in m.file_fields)
        out.append(f"{key}: used only by the {readers} mode; ignored")
    if doc.windowsRunAsService:
        out.append("windowsRunAsService: Windows only; ignored")
    if doc.logging and doc.logging.vmodule:
        out.append("logging.vmodule: per-file verbosity is not supported; logging.verbosity applies everywhere")
    return out


def to_kube_proxy_configuration(cfg: ProxyConfig) -> dict[str, Any]:
    """`cfg` as upstream's v1alpha1 KubeProxyConfiguration, as upstream converts its internal form:
    fields in the Go struct's order (what `/configz` serves; `--write-config-to` sorts them).

    As upstream's conversion does: the periods and masqueradeAll go into the mode's section (the
    others get `0s` and false), the default detectLocalMode is written as ClusterCIDR, nftables
    mode's default nodePortAddresses as `[primary]`, and the logging section keeps what was given.
    kubeproxy's own settings (the userspace mode's udpIdleTimeout) are written only where upstream
    could not load the file anyway (mode userspace), so that upstream decodes every other file
    strictly.
    """
    mode = cfg.mode
    section, masquerading = mode_sections(mode)

    def periods(name: str) -> dict[str, str]:
        if name != section:
            return {"syncPeriod": "0s", "minSyncPeriod": "0s"}
        return {"syncPeriod": format_go_duration(cfg.sync_period), "minSyncPeriod": format_go_duration(cfg.min_sync_period)}

    def masquerade(name: str) -> dict[str, Any]:
        active = name == masquerading
        bit = cfg.masquerade_bit if active else cfg.inactive_masquerade_bit
        return {"masqueradeBit": bit, "masqueradeAll": cfg.masquerade_all and active}

    ct = cfg.conntrack
    out: dict[str, Any] = {"kind": "KubeProxyConfiguration", "apiVersion": API_VERSION}
    if cfg.feature_gates:
        out["featureGates"] = dict(sorted(cfg.feature_gates.items()))
    out |= {
        "clientConnection": {
            "kubeconfig": cfg.kubeconfig,
            "acceptContentTypes": cfg.client_accept_content_types,
            "contentType": cfg.client_content_type,
            "qps": _go_number(cfg.client_qps),
            "burst": cfg.client_burst,
        },
        "logging": _logging_section(cfg),
        "hostnameOverride": cfg.hostname_override,
        "bindAddress": cfg.bind_address,
        "healthzBindAddress": cfg.healthz_bind_address,
        "metricsBindAddress": cfg.metrics_bind_address,
        "bindAddressHardFail": cfg.bind_address_hard_fail,
        "enableProfiling": cfg.enable_profiling,
        "showHiddenMetricsForVersion": cfg.show_hidden_metrics_for_version,
        "mode": mode,
        "iptables": {**masquerade("iptables"), "localhostNodePorts": cfg.localhost_nodeports, **periods("iptables")},
        "ipvs": {**periods("ipvs"), **_ipvs_section(cfg.ipvs)},
        "nftables": {**masquerade("nftables"), **periods("nftables")},
        "winkernel": {
            "networkName": "",
            "sourceVip": "",
            "enableDSR": False,
            "rootHnsEndpointName": "",
            "forwardHealthCheckVip": False,
        },
        "detectLocalMode": cfg.detect_local_mode or "ClusterCIDR",
        "detectLocal": {"bridgeInterface": cfg.bridge_interface, "interfaceNamePrefix": cfg.interface_name_prefix},
        "clusterCIDR": ",".join(cfg.cluster_cidr),
        "nodePortAddresses": list(cfg.nodeport_addresses or registry.nodeport_traits(mode).default_addresses) or None,
        "oomScoreAdj": cfg.oom_score_adj,
        "conntrack": {
            "maxPerCore": ct.max_per_core,
            "min": ct.min,
            "tcpEstablishedTimeout": _go_duration_or_none(ct.tcp_established_timeout),
            "tcpCloseWaitTimeout": _go_duration_or_none(ct.tcp_close_wait_timeout),
            "tcpBeLiberal": ct.tcp_be_liberal,
            "udpTimeout": format_go_duration(ct.udp_timeout),
            "udpStreamTimeout": format_go_duration(ct.udp_stream_timeout),
        },
        "configSyncPeriod": format_go_duration(cfg.config_sync_period),
        "portRange": cfg.port_range,
    }
    if "udpIdleTimeout" in _file_fields(mode):
        out["udpIdleTimeout"] = format_go_duration(cfg.udp_idle_timeout)
    return out


def _file_fields(mode: str) -> tuple[str, ...]:
    found = registry.MODES.get(mode)
    return found.file_fields if found else ()


def _go_duration_or_none(seconds: float | None) -> str | None:
    return None if seconds is None else format_go_duration(seconds)


def _go_number(value: float) -> int | float:
    """A float32 field as Go's JSON encoder writes it: a whole number without a fraction."""
    return int(value) if float(value).is_integer() else value


# The ipvs section's fields after the periods, in the struct's order, with their zero values.
_IPVS_FIELDS: tuple[tuple[str, Any], ...] = (
    ("scheduler", ""),
    ("excludeCIDRs", None),
    ("strictARP", False),
    ("tcpTimeout", "0s"),
    ("tcpFinTimeout", "0s"),
    ("udpTimeout", "0s"),
)


def _ipvs_section(ipvs: dict[str, Any]) -> dict[str, Any]:
    """Upstream's ipvs section from the settings kept as given (flags give seconds, a file text)."""
    out: dict[str, Any] = {}
    for key, zero in _IPVS_FIELDS:
        value = ipvs.get(key)
        if value is None or value == "" or value == []:
            value = zero
        elif zero == "0s":
            value = format_go_duration(value if isinstance(value, int | float) else parse_duration(str(value)))
        elif key == "excludeCIDRs":
            value = [str(cidr) for cidr in value]
        out[key] = value
    return out


LOG_FLUSH_FREQUENCY = "5s"  # component-base's default


def _logging_section(cfg: ProxyConfig) -> dict[str, Any]:
    """component-base's LoggingConfiguration: format and verbosity as in effect, the rest as given."""
    extra = cfg.logging_extra
    out: dict[str, Any] = {
        "format": cfg.logging_format,
        "flushFrequency": extra.get("flushFrequency", LOG_FLUSH_FREQUENCY),
        "verbosity": cfg.verbosity,
    }
    if extra.get("vmodule"):
        out["vmodule"] = extra["vmodule"]
    given = extra.get("options") or {}
    options: dict[str, Any] = {}
    for stream in ("text", "json"):
        settings = given.get(stream) or {}
        options[stream] = {"infoBufferSize": str(settings.get("infoBufferSize") or "0")}
        if settings.get("splitStream"):
            options[stream] = {"splitStream": True, **options[stream]}
    out["options"] = options
    return out
