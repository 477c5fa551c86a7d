"""Upstream kube-proxy's command line: its flags, pflag's syntax and its precedence over --config.

`kube-proxy ARGS` and `kubeproxy run ARGS` both parse with `parse` then `resolve`:

- syntax as pflag's: `--flag=value` or `--flag value`; booleans as `--flag`, `--flag=true`,
  `--flag=false` (Go's strconv.ParseBool spellings: 1, t, T, TRUE, true, True and the false
  ones); durations as Go's (`90s`, `1m30s`, `0`); `-v 2`, `-v=2`, `-v2` or `--v=2` anywhere;
  `_` in a name is `-` (upstream's word-separator normalisation); repeated list flags add up;
- precedence as upstream's Options.Complete: without --config every flag sets its field; with
  --config the file is the whole configuration and only --hostname-override, the logging flags
  (-v, --vmodule, --logging-format, --log-*) and the flags that are not configuration
  (--master, --cleanup, --init-only, --write-config-to) still apply. Upstream ignores the others
  without a word; we name each in a warning. kubeproxy's own flags (--manifests,
  --iptables-variant, --node-ip, --service-node-port-range, --iptables-random-fully) always apply.
"""

from __future__ import annotations

import copy
import ipaddress
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubeproxy.cluster.addresses import valid_ip
from kubeproxy.cluster.duration import format_go_duration, parse_go_duration
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig, parse_node_ips
from kubeproxy.proxy.config import load_config_file, mode_sections, validate
from kubeproxy.runtime.version import parse_version_flag


class FlagError(ValueError):
    """A command line pflag would refuse; the message is pflag's, naming the flag."""


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # string, bool, int, float, duration, strings, mapbool, ip, ipport, level
    help: str
    # Applies when --config is given too (upstream: logging flags, hostname-override, and the
    # flags that are not part of KubeProxyConfiguration).
    with_config: bool = False
    shorthand: str = ""
    deprecated: str = ""
    ours: bool = False  # a kubeproxy flag upstream does not have
    effect: str = ""  # what kubeproxy does with it, when not simply "as upstream" (for --help)


_IGNORED = "This parameter is ignored if a config file is specified by --config."

# The defaults upstream's --help shows, as it shows them (pflag prints a flag's initial value
# unless it is the type's zero value).
HELP_DEFAULTS: dict[str, str] = {
    "bind-address": "0.0.0.0",
    "config-sync-period": "15m0s",
    "conntrack-max-per-core": "32768",
    "conntrack-min": "131072",
    "conntrack-tcp-timeout-close-wait": "1h0m0s",
    "conntrack-tcp-timeout-established": "24h0m0s",
    "healthz-bind-address": "0.0.0.0:10256",
    "iptables-localhost-nodeports": "true",
    "iptables-masquerade-bit": "14",
    "iptables-min-sync-period": "1s",
    "iptables-sync-period": "30s",
    "ipvs-min-sync-period": "1s",
    "ipvs-sync-period": "30s",
    "kube-api-burst": "10",
    "kube-api-content-type": '"application/vnd.kubernetes.protobuf"',
    "kube-api-qps": "5",
    "log-flush-frequency": "5s",
    "logging-format": '"text"',
    "metrics-bind-address": "127.0.0.1:10249",
    "oom-score-adj": "-999",
}

FLAGS: tuple[Flag, ...] = (
    Flag("config", "string", "The path to the configuration file.", with_config=True),
    Flag("write-config-to", "string", "If set, write the effective configuration to this file and exit.", with_config=True),
    Flag("cleanup", "bool", "If true cleanup iptables and nftables rules and exit.", with_config=True),
    Flag("init-only", "bool", "If true, perform the initialization steps that need full root privileges "
         "(conntrack sysctls, OOM score) and exit.", with_config=True),
    Flag("feature-gates", "mapbool", f"A set of key=value pairs that describe feature gates. {_IGNORED}"),
    Flag("kubeconfig", "string", "Path to kubeconfig file with authorization information (the master location "
         "can be overridden by the master flag)."),
    Flag("master", "string", "The address of the Kubernetes API server (overrides any value in kubeconfig)",
         with_config=True),
    Flag("kube-api-content-type", "string", "Content type of requests sent to apiserver.",
         effect="accepted; kubeproxy asks for JSON"),
    Flag("kube-api-burst", "int", "Burst to use while talking with kubernetes apiserver",
         effect="accepted; no client-side rate limit"),
    Flag("kube-api-qps", "float", "QPS to use while talking with kubernetes apiserver",
         effect="accepted; no client-side rate limit"),
    Flag("hostname-override", "string", "If non-empty, will be used as the name of the Node that kube-proxy is "
         "running on. If unset, the node name is assumed to be the same as the node's hostname.", with_config=True),
    Flag("bind-address", "ip", f"Overrides kube-proxy's idea of what its node's primary IP is. {_IGNORED}"),
    Flag("healthz-bind-address", "ipport", f"The IP address and port for the health check server to serve on, "
         f"defaulting to \"0.0.0.0:10256\". {_IGNORED}"),
    Flag("metrics-bind-address", "ipport", f"The IP address and port for the metrics server to serve on, "
         f"defaulting to \"127.0.0.1:10249\". Set empty to disable. {_IGNORED}"),
    Flag("bind-address-hard-fail", "bool", "If true kube-proxy will treat failure to bind to a port as fatal and exit"),
    Flag("profiling", "bool", f"If true enables profiling via web interface on /debug/pprof handler. {_IGNORED}",
         effect="accepted; kubeproxy has no /debug/pprof and warns"),
    Flag("show-hidden-metrics-for-version", "string", f"The previous version for which you want to show hidden "
         f"metrics. {_IGNORED}", effect="accepted; no hidden metrics, warns"),
    # {modes}: filled in by usage() from the backend registry, so that a new mode shows up by itself.
    Flag("proxy-mode", "string", f"Which proxy mode to use: {{modes}} (default 'iptables'). {_IGNORED}"),
    Flag("iptables-masquerade-bit", "int", "The bit of the fwmark space to mark packets requiring SNAT with. "
         "Must be within the range [0, 31]."),
    Flag("masquerade-all", "bool", "SNAT all traffic sent via Service cluster IPs."),
    Flag("iptables-localhost-nodeports", "bool", "If false, disable the legacy behavior of allowing NodePort "
         "services to be accessed via localhost (iptables mode and IPv4 only)."),
    Flag("iptables-sync-period", "duration", "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently "
         "various re-synchronizing and cleanup operations are performed. Must be greater than 0."),
    Flag("iptables-min-sync-period", "duration", "The minimum period between rule resyncs (e.g. '5s', '1m', "
         "'2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate resync."),
    Flag("ipvs-sync-period", "duration", "ipvs mode only."),
    Flag("ipvs-min-sync-period", "duration", "ipvs mode only."),
    Flag("ipvs-scheduler", "string", "ipvs mode only."),
    Flag("ipvs-exclude-cidrs", "strings", "ipvs mode only."),
    Flag("ipvs-strict-arp", "bool", "ipvs mode only."),
    Flag("ipvs-tcp-timeout", "duration", "ipvs mode only."),
    Flag("ipvs-tcpfin-timeout", "duration", "ipvs mode only."),
    Flag("ipvs-udp-timeout", "duration", "ipvs mode only."),
    Flag("detect-local-mode", "string", f"Mode to use to detect local traffic. {_IGNORED}"),
    Flag("pod-bridge-interface", "string", "A bridge interface name (for --detect-local-mode=BridgeInterface)."),
    Flag("pod-interface-name-prefix", "string", "An interface name prefix (for "
         "--detect-local-mode=InterfaceNamePrefix)."),
    Flag("cluster-cidr", "string", f"The CIDR range of the pods in the cluster (a comma-separated dual-stack "
         f"pair for dual-stack). {_IGNORED}"),
    Flag("nodeport-addresses", "strings", f"CIDR ranges and/or keywords naming the node IPs where NodePorts "
         f"answer: 'primary' (the node's IPv4 and/or IPv6 IP), 'localhost' (127.0.0.0/8 and ::1/128), 'all' "
         f"(0.0.0.0/0 and ::/0), in any combination. Unset: 'primary' in nftables mode, 'all' in iptables and ipvs "
         f"modes. {_IGNORED}"),
    Flag("oom-score-adj", "int", f"The oom-score-adj value for kube-proxy process. Values must be within the "
         f"range [-1000, 1000]. {_IGNORED}"),
    Flag("conntrack-max-per-core", "int", "Maximum number of NAT connections to track per CPU core (0 to leave "
         "the limit as-is and ignore conntrack-min)."),
    Flag("conntrack-min", "int", "Minimum number of conntrack entries to allocate, regardless of "
         "conntrack-max-per-core."),
    Flag("conntrack-tcp-timeout-established", "duration", "Idle timeout for established TCP connections "
         "(0 to leave as-is)"),
    Flag("conntrack-tcp-timeout-close-wait", "duration", "NAT timeout for TCP connections in the CLOSE_WAIT state"),
    Flag("conntrack-tcp-be-liberal", "bool", "Enable liberal mode for tracking TCP packets by setting "
         "nf_conntrack_tcp_be_liberal to 1"),
    Flag("conntrack-udp-timeout", "duration", "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)"),
    Flag("conntrack-udp-timeout-stream", "duration", "Idle timeout for ASSURED UDP connections (0 to leave as-is)"),
    Flag("config-sync-period", "duration", "How often configuration from the apiserver is refreshed. Must be "
         "greater than 0.", effect="accepted; watches do not resync"),
    Flag("healthz-port", "int", "The port to bind the health check server. Use 0 to disable.",
         deprecated="This flag is deprecated and will be removed in a future release. Please use "
         "--healthz-bind-address instead."),
    Flag("metrics-port", "int", "The port to bind the metrics server. Use 0 to disable.",
         deprecated="This flag is deprecated and will be removed in a future release. Please use "
         "--metrics-bind-address instead."),
    # component-base's logging flags: they win over the file's logging section.
    Flag("v", "level", "number for the log level verbosity", with_config=True, shorthand="v"),
    Flag("vmodule", "string", "comma-separated list of pattern=N settings for file-filtered logging",
         with_config=True, effect="accepted; -v applies everywhere"),
    Flag("logging-format", "string", "Sets the log format. Permitted formats: \"json\", \"text\".", with_config=True),
    Flag("log-flush-frequency", "duration", "Maximum number of seconds between log flushes", with_config=True,
         effect="accepted; every line is written at once"),
    Flag("log-json-info-buffer-size", "string", "[Alpha] buffer size of the JSON info stream", with_config=True,
         effect="accepted; unbuffered"),
    Flag("log-json-split-stream", "bool", "[Alpha] write error messages to stderr, info messages to stdout",
         with_config=True, effect="accepted; everything goes to stderr"),
    Flag("log-text-info-buffer-size", "string", "[Alpha] buffer size of the text info stream", with_config=True,
         effect="accepted; unbuffered"),
    Flag("log-text-split-stream", "bool", "[Alpha] write error messages to stderr, info messages to stdout",
         with_config=True, effect="accepted; everything goes to stderr"),
    Flag("version", "version", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the "
         "reported version", with_config=True),
    Flag("help", "bool", "help for kube-proxy", with_config=True, shorthand="h"),
    # kubeproxy's own.
    Flag("manifests", "strings", "Watch these YAML/JSON files or folders instead of an API server (repeatable).",
         with_config=True, ours=True),
    Flag("iptables-variant", "string", "Drive iptables-legacy or iptables-nft explicitly: 'legacy' or 'nft' "
         "(default: the system's iptables).", with_config=True, ours=True),
    Flag("node-ip", "ips", "This node's IP, or a dual-stack pair 'IPv4,IPv6' (the first is the primary; "
         "otherwise --bind-address, then the Node object).", with_config=True, ours=True),
    Flag("service-node-port-range", "string", "The API server's node port range (default 30000-32767), "
         "checked for objects from --manifests.", with_config=True, ours=True),
    Flag("iptables-random-fully", "bool", "MASQUERADE with --random-fully, as upstream always does; =false leaves it out "
         "(an iptables older than 1.6.2 lacks it).", with_config=True, ours=True),
    Flag("snat-watch", "duration", "Sample the SNAT ports in use per masqueraded endpoint this often "
         "(kubeproxy_snat_port_utilization); 0 (the default) disables it.", with_config=True, ours=True),
    Flag("snat-watch-threshold", "float", "Warn when a Service's fullest endpoint holds this share of its SNAT "
         "ports (default 0.6; the lab's health checks fail from 0.86).", with_config=True, ours=True),
    Flag("snat-watch-max-entries", "int", "Read at most this many conntrack entries per sample (default 20000); "
         "a larger table is sampled and the counts scaled.", with_config=True, ours=True),
    # Upstream's userspace-mode flags (removed with the mode in v1.26; kubeproxy has the mode).
    Flag("proxy-port-range", "string", "Range of host ports (beginPort-endPort, single port or beginPort+offset, "
         "inclusive) that may be consumed in order to proxy service traffic. If unspecified, 0, or (0-0) then "
         "ports will be randomly chosen (userspace mode only).", ours=True),
    Flag("udp-timeout", "duration", "How long an idle UDP connection will be kept open (e.g. '250ms', '2s'). "
         "Must be greater than 0. Only applicable for proxy-mode=userspace", ours=True),
)

BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
BY_SHORTHAND: dict[str, Flag] = {f.shorthand: f for f in FLAGS if f.shorthand}
# Aliases kubeproxy has accepted before (`kubeproxy run --sync-period`): kept working.
ALIASES = {"sync-period": "iptables-sync-period", "min-sync-period": "iptables-min-sync-period"}

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def go_bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def go_duration(text: str) -> float:
    """Go's time.ParseDuration, in seconds (cluster/duration.py); ValueError with Go's message."""
    return parse_go_duration(text)


def _go_int(text: str, bits: int = 32) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ValueError(f'strconv.ParseInt: parsing "{text}": value out of range')
    return value


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")] if text else []


def _map_bool(text: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for pair in _csv(text):
        if not pair:
            continue
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"missing bool value for {key}")
        try:
            out[key.strip()] = go_bool(value.strip())
        except ValueError:
            raise ValueError(f"invalid value of {key}={value}, err: {go_bool.__name__}: invalid syntax") from None
    return out


def _ip(text: str) -> str:
    try:
        return str(valid_ip(text.strip()))
    except ValueError:
        raise ValueError(f'"{text}" is not a valid IP address') from None


def _ips(text: str) -> str:
    """One IP or a dual-stack pair (config.parse_node_ips), normalised, comma-separated."""
    return ",".join(parse_node_ips(text))


def _ipport(text: str) -> str:
    if text == "":
        return ""
    try:
        valid_ip(text)
        return text  # a bare IP: the port comes from the default (upstream's IPPortVar)
    except ValueError:
        pass
    host, sep, port = text.rpartition(":")
    try:
        valid_ip(host.strip("[]"))
        if not sep or not 0 <= int(port) <= 65535:
            raise ValueError
    except ValueError:
        raise ValueError(f'"{text}" is not in a valid format (ip or ip:port)') from None
    return text


_PARSERS: dict[str, Callable[[str], Any]] = {
    "string": str,
    "bool": go_bool,
    "int": _go_int,
    "float": float,
    "duration": go_duration,
    "strings": _csv,
    "mapbool": _map_bool,
    "ip": _ip,
    "ips": _ips,
    "ipport": _ipport,
    "level": lambda text: _go_int(text),
    "version": parse_version_flag,
}


@dataclass
class Parsed:
    """What the command line said: each flag given (last value wins; lists and maps add up)."""

    values: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # flag names as given, for messages
    positional: list[str] = field(default_factory=list)
    deprecations: list[str] = field(default_factory=list)

    def given(self, name: str) -> bool:
        return name in self.values


def _normalize(name: str) -> str:
    name = name.replace("_", "-")  # upstream's WordSepNormalizeFunc
    return ALIASES.get(name, name)


def _set(parsed: Parsed, flag: Flag, raw: str, shown: str) -> None:
    try:
        value = _PARSERS[flag.kind](raw)
    except ValueError as exc:
        raise FlagError(f'invalid argument "{raw}" for "{shown}" flag: {exc}') from None
    if flag.kind == "strings" and flag.name in parsed.values:
        value = [*parsed.values[flag.name], *value]
    elif flag.kind == "mapbool" and flag.name in parsed.values:
        value = {**parsed.values[flag.name], **value}
    parsed.values[flag.name] = value
    parsed.order.append(flag.name)
    if flag.deprecated:
        parsed.deprecations.append(f"Flag --{flag.name} has been deprecated, {flag.deprecated}")


def parse(args: Sequence[str]) -> Parsed:
    """pflag's parse of `args` against upstream's flags (FlagError names what is wrong)."""
    parsed = Parsed()
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg == "--":
            parsed.positional.extend(items[i:])
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            flag = BY_NAME.get(_normalize(name))
            if flag is None or not name:
                raise FlagError(f"unknown flag: --{name}")
            shown = f"--{name}"
        elif arg.startswith("-") and len(arg) > 1:
            letter, rest = arg[1], arg[2:]
            flag = BY_SHORTHAND.get(letter)
            if flag is None:
                raise FlagError(f"unknown shorthand flag: {letter!r} in {arg}")
            shown = f"-{letter}, --{flag.name}"
            eq, value = ("=", rest[1:]) if rest.startswith("=") else ("=", rest) if rest else ("", "")
        else:
            parsed.positional.append(arg)
            continue
        if flag.kind == "bool":
            _set(parsed, flag, value if eq else "true", shown)
            continue
        if flag.name == "version" and not eq:
            _set(parsed, flag, "true", shown)  # upstream's --version takes an optional value
            continue
        if not eq:
            if i >= len(items):
                raise FlagError(f"flag needs an argument: {shown}")
            value = items[i]
            i += 1
        _set(parsed, flag, value, shown)
    return parsed


@dataclass(frozen=True)
class Invocation:
    """The resolved command line: the configuration and what else to do."""

    cfg: ProxyConfig
    config_file: str = ""
    master: str = ""
    write_config_to: str = ""
    cleanup: bool = False
    init_only: bool = False
    manifests: tuple[str, ...] = ()
    iptables_variant: str = ""
    help: bool = False
    version: bool = False
    warnings: tuple[str, ...] = ()


# Flag → how it sets ProxyConfig (without --config, or always for with_config ones).
def _apply(cfg: ProxyConfig, name: str, value: Any) -> ProxyConfig:
    ct = cfg.conntrack
    simple = {
        "kubeconfig": "kubeconfig",
        "kube-api-content-type": "client_content_type",
        "kube-api-burst": "client_burst",
        "kube-api-qps": "client_qps",
        "bind-address": "bind_address",
        "healthz-bind-address": "healthz_bind_address",
        "metrics-bind-address": "metrics_bind_address",
        "bind-address-hard-fail": "bind_address_hard_fail",
        "profiling": "enable_profiling",
        "show-hidden-metrics-for-version": "show_hidden_metrics_for_version",
        "proxy-mode": "mode",
        "masquerade-all": "masquerade_all",
        "iptables-localhost-nodeports": "localhost_nodeports",
        "detect-local-mode": "detect_local_mode",
        "pod-bridge-interface": "bridge_interface",
        "pod-interface-name-prefix": "interface_name_prefix",
        "oom-score-adj": "oom_score_adj",
        "config-sync-period": "config_sync_period",
        "v": "verbosity",
        "logging-format": "logging_format",
        "node-ip": "node_ip",
        "service-node-port-range": "service_node_port_range",
        "iptables-random-fully": "random_fully",
        "snat-watch": "snat_watch_interval",
        "snat-watch-threshold": "snat_watch_threshold",
        "snat-watch-max-entries": "snat_watch_max_entries",
        "proxy-port-range": "port_range",
        "udp-timeout": "udp_idle_timeout",
    }
    if name in simple:
        return replace(cfg, **{simple[name]: value})
    if name == "iptables-masquerade-bit":
        # The iptables section's bit: nftables mode marks with the nftables section's (upstream).
        active = mode_sections(cfg.mode)[1] == "iptables"
        return replace(cfg, **{"masquerade_bit" if active else "inactive_masquerade_bit": value})
    conntrack = {
        "conntrack-max-per-core": "max_per_core",
        "conntrack-min": "min",
        "conntrack-tcp-timeout-established": "tcp_established_timeout",
        "conntrack-tcp-timeout-close-wait": "tcp_close_wait_timeout",
        "conntrack-tcp-be-liberal": "tcp_be_liberal",
        "conntrack-udp-timeout": "udp_timeout",
        "conntrack-udp-timeout-stream": "udp_stream_timeout",
    }
    if name in conntrack:
        return replace(cfg, conntrack=replace(ct, **{conntrack[name]: value}))
    if name == "feature-gates":
        return replace(cfg, feature_gates={**cfg.feature_gates, **value})
    if name == "cluster-cidr":
        return replace(cfg, cluster_cidr=tuple(c.strip() for c in value.split(",") if c.strip()))
    if name == "nodeport-addresses":
        return replace(cfg, nodeport_addresses=tuple(value))
    if name.startswith("ipvs-"):
        key = {"ipvs-sync-period": "syncPeriod", "ipvs-min-sync-period": "minSyncPeriod", "ipvs-scheduler": "scheduler",
               "ipvs-exclude-cidrs": "excludeCIDRs", "ipvs-strict-arp": "strictARP", "ipvs-tcp-timeout": "tcpTimeout",
               "ipvs-tcpfin-timeout": "tcpFinTimeout", "ipvs-udp-timeout": "udpTimeout"}[name]
        cfg = replace(cfg, ipvs={**cfg.ipvs, key: value})
        if name in ("ipvs-sync-period", "ipvs-min-sync-period") and mode_sections(cfg.mode)[0] == "ipvs":
            # processV1Alpha1Flags: in ipvs mode these set the top-level periods.
            cfg = replace(cfg, **{"sync_period" if name == "ipvs-sync-period" else "min_sync_period": value})
        return cfg
    if name in ("iptables-sync-period", "iptables-min-sync-period"):
        # processV1Alpha1Flags: these set the top-level periods unless the mode is ipvs.
        attr = "sync_period" if name == "iptables-sync-period" else "min_sync_period"
        return cfg if mode_sections(cfg.mode)[0] == "ipvs" else replace(cfg, **{attr: value})
    if name == "vmodule" or name.startswith("log-"):
        return replace(cfg, logging_extra=_logging_flag(cfg.logging_extra, name, value))
    return cfg  # flags that are not configuration (config, master, cleanup, ...)


def _logging_flag(extra: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """A logging flag into the logging section's fields, as component-base writes them."""
    out = copy.deepcopy(extra)
    if name == "log-flush-frequency":
        out["flushFrequency"] = format_go_duration(value)
    elif name == "vmodule":
        pairs = [item.rpartition("=") for item in value.split(",") if item]
        out["vmodule"] = [{"filePattern": pattern, "verbosity": int(level) if level.isdigit() else level}
                          for pattern, _, level in pairs]
    else:  # log-{text,json}-{info-buffer-size,split-stream}
        stream, setting = name.removeprefix("log-").split("-", 1)
        key = "splitStream" if setting == "split-stream" else "infoBufferSize"
        out.setdefault("options", {}).setdefault(stream, {})[key] = value
    return out


def _with_port(address: str, port: int) -> str:
    """Upstream's addressFromDeprecatedFlags: port 0 disables the server; a bare IP gets the
    port; an address with a port (the defaults have one) or anything else stays as it is."""
    if port == 0:
        return ""
    try:
        ip = valid_ip(address)
    except ValueError:
        return address
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def resolve(parsed: Parsed, base: ProxyConfig | None = None) -> Invocation:
    """The configuration and actions of a parsed command line, with upstream's precedence.

    Raises FlagError (positional arguments) or ConfigError (the file or a value), naming it.
    """
    values = parsed.values
    if [arg for arg in parsed.positional if arg]:
        raise FlagError(f'"kube-proxy" does not take any arguments, got {parsed.positional!r}')
    warnings = list(parsed.deprecations)
    config_file = values.get("config", "")
    cfg = base or ProxyConfig()
    order = list(dict.fromkeys(parsed.order))
    if config_file:
        cfg = load_config_file(config_file, ProxyConfig())
        ignored = [name for name in order if not BY_NAME[name].with_config]
        for name in ignored:
            warnings.append(f"--{name} is ignored because --config is given: upstream's kube-proxy takes every "
                            "setting from the file then (only --hostname-override, the logging flags, --master, "
                            "--cleanup, --init-only and --write-config-to still apply)")
        applied = [name for name in order if BY_NAME[name].with_config]
    else:
        # mode first: --iptables-sync-period depends on it, whatever the order on the command line.
        applied = sorted(order, key=lambda name: name != "proxy-mode")
    for name in applied:
        if name == "hostname-override":
            continue
        cfg = _apply(cfg, name, values[name])
    if not config_file and not values.get("write-config-to"):
        cfg = replace(
            cfg,
            healthz_bind_address=_with_port(cfg.healthz_bind_address, values.get("healthz-port", 10256)),
            metrics_bind_address=_with_port(cfg.metrics_bind_address, values.get("metrics-port", 10249)),
        )
    if values.get("hostname-override"):
        name = values["hostname-override"].strip()
        if not name:
            raise ConfigError("--hostname-override: empty hostname-override is invalid")
        cfg = replace(cfg, hostname_override=name.lower())
    # bindAddress, unless unspecified, is the node's primary IP (upstream); --node-ip is ours and wins.
    if not cfg.node_ip and not ipaddress.ip_address(_ip_or_unspecified(cfg.bind_address)).is_unspecified:
        cfg = replace(cfg, node_ip=cfg.bind_address)
    for name in order:
        flag = BY_NAME[name]
        # Logging knobs that change nothing here (the others show up in the configuration's warnings).
        if flag.name in ("vmodule", "log-flush-frequency") or flag.name.startswith(("log-json-", "log-text-")):
            warnings.append(f"--{name}: {flag.effect}")
    variant = values.get("iptables-variant", "")
    if variant not in ("", "legacy", "nft"):
        raise FlagError(f'invalid argument "{variant}" for "--iptables-variant" flag: want legacy or nft')
    cfg = validate(cfg)
    return Invocation(
        cfg=cfg,
        config_file=config_file,
        master=values.get("master", ""),
        write_config_to=values.get("write-config-to", ""),
        cleanup=bool(values.get("cleanup")),
        init_only=bool(values.get("init-only")),
        manifests=tuple(values.get("manifests", ())),
        iptables_variant=variant,
        help=bool(values.get("help")),
        version=values.get("version", "false") in ("true", "raw"),
        warnings=tuple(warnings),
    )


def _ip_or_unspecified(text: str) -> str:
    try:
        valid_ip(text)
        return text
    except ValueError:
        return "0.0.0.0"  # validate() names the bad value


def usage(prog: str = "kube-proxy") -> str:
    """--help: upstream's flags, then kubeproxy's own; each with what kubeproxy does when it differs."""
    lines = [
        "The Kubernetes network proxy runs on each node: it programs iptables, nftables",
        "or IPVS rules for Services (or relays them itself: userspace), from the API",
        "server (or from --manifests files).",
        "",
        f"Usage:\n  {prog} [flags]",
        "",
        "Flags:",
    ]
    from kubeproxy.backends.registry import MODES

    modes = ", ".join(f"'{mode}'" for mode in MODES)
    for flag in FLAGS:
        if flag.deprecated:
            continue
        name = f"-{flag.shorthand}, --{flag.name}" if flag.shorthand else f"    --{flag.name}"
        kind = "" if flag.kind == "bool" else " version[=true]" if flag.kind == "version" else f" {flag.kind}"
        effect = f" [kubeproxy: {flag.effect}]" if flag.effect else ""
        default = f" (default {HELP_DEFAULTS[flag.name]})" if flag.name in HELP_DEFAULTS else ""
        text = flag.help.replace("{modes}", modes) + default + effect + (" [kubeproxy only]" if flag.ours else "")
        lines.append(f"  {name}{kind}")
        lines.extend(textwrap.wrap(text, width=80, initial_indent=" " * 8, subsequent_indent=" " * 8))
    return "\n".join(lines) + "\n"

