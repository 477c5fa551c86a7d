"""What the proxy is configured to do, as the rest of the program reads it: `ProxyConfig`, with
upstream's KubeProxyConfiguration (v1alpha1) fields under Python names.

The backends and the node model read it; reading it from flags and files, checking it and
writing it back in upstream's form is the application's (proxy/config.py, proxy/flags.py).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.addresses import valid_ip
from kubeproxy.cluster.duration import DurationError, parse_go_duration
from kubeproxy.cluster.validation import ParseOptions, options_for
from kubeproxy.model.features import gate_enabled

DEFAULT_CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
KUBE_PROXY_OOM_SCORE_ADJ = -999  # upstream's qos.KubeProxyOOMScoreAdj
# nodePortAddresses keywords, as upstream's v1.37 accepts them beside CIDRs.
NODEPORT_PRIMARY = "primary"
NODEPORT_LOCALHOST = "localhost"
NODEPORT_ALL = "all"
NODEPORT_KEYWORDS = (NODEPORT_PRIMARY, NODEPORT_LOCALHOST, NODEPORT_ALL)


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
class ConntrackConfig:
    """Upstream's `conntrack` section, in seconds; 0 (or None) leaves the kernel's value as it is."""

    max_per_core: int | None = 32768
    min: int | None = 131072
    tcp_established_timeout: float | None = 86400.0  # 24h
    tcp_close_wait_timeout: float | None = 3600.0  # 1h
    tcp_be_liberal: bool = False
    udp_timeout: float = 0.0
    udp_stream_timeout: float = 0.0


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
    masquerade_bit: int = 14  # the mode's: nftables.masqueradeBit in nftables mode, iptables.masqueradeBit otherwise
    # The other section's masqueradeBit (--iptables-masquerade-bit in nftables mode sets it): no
    # effect on the rules, kept so that --write-config-to and /configz give it back as upstream does.
    inactive_masquerade_bit: int = 14
    localhost_nodeports: bool = True
    nodeport_addresses: tuple[str, ...] = ()
    random_fully: bool = True  # upstream (v1.37) masquerades with --random-fully always
    # The API server's --service-node-port-range, for objects from manifest files (which no API
    # server allocated): "" means upstream's default 30000-32767 for files, no check for the API.
    service_node_port_range: str = ""
    min_sync_period: float = 1.0
    sync_period: float = 30.0
    healthz_bind_address: str = "0.0.0.0:10256"
    metrics_bind_address: str = "127.0.0.1:10249"
    kubeconfig: str = ""
    feature_gates: dict[str, bool] = field(default_factory=dict)
    # Upstream fields beyond the rules (see proxy/flags.py for the flags that set them).
    bind_address: str = "0.0.0.0"  # upstream: overrides the node's primary IP unless unspecified
    bind_address_hard_fail: bool = False
    enable_profiling: bool = False
    show_hidden_metrics_for_version: str = ""
    config_sync_period: float = 900.0
    oom_score_adj: int | None = KUBE_PROXY_OOM_SCORE_ADJ
    conntrack: ConntrackConfig = field(default_factory=ConntrackConfig)
    logging_format: str = "text"
    verbosity: int = 0
    # The logging section's other fields (flushFrequency, vmodule, options) as given, in upstream's
    # form: they change nothing here, and --write-config-to and /configz give them back.
    logging_extra: dict[str, Any] = field(default_factory=dict)
    client_qps: float = 5.0
    client_burst: int = 10
    client_content_type: str = DEFAULT_CONTENT_TYPE
    client_accept_content_types: str = ""
    ipvs: dict[str, Any] = field(default_factory=dict)  # upstream's ipvs section, used in ipvs mode only
    # Ours: the live SNAT gauge (proxy/snat_watch.py); 0 s leaves it off (a sample dumps conntrack).
    snat_watch_interval: float = 0.0
    snat_watch_threshold: float = 0.6  # share of the SNAT ports; the lab's health checks fail from 0.86
    snat_watch_max_entries: int = 20_000
    # Userspace mode only (upstream's portRange / udpIdleTimeout, from before v1.26).
    port_range: str = ""  # --proxy-port-range: where relay listeners bind; "" any free port
    udp_idle_timeout: float = 0.25  # --udp-timeout: a UDP relay flow idle this long is closed
    # Fields of the file that have no effect here, "field: why" (for the start-up warnings).
    unused_fields: tuple[str, ...] = ()

    def parse_options(self, *, from_api_server: bool) -> ParseOptions:
        """How objects from this source are checked (see `cluster.validation.options_for`)."""
        return options_for(
            node_port_range=self.service_node_port_range,
            from_api_server=from_api_server,
            relaxed_service_names=gate_enabled(self.feature_gates, "RelaxedServiceNameValidation"),
        )

    def masquerade_mark(self) -> str:
        # Upstream formats 1<<bit with Go's "%#08x": eight digits after the 0x.
        return f"0x{1 << self.masquerade_bit:08x}"


def parse_duration(text: str) -> float:
    """A Go duration string ("1s", "1m30s", "500ms") in seconds, as Go parses it (cluster/duration.py)."""
    try:
        return parse_go_duration(text)
    except DurationError as exc:
        raise ConfigError(f"{text!r} is not a duration like 1s, 500ms or 1m30s ({exc})") from None


def parse_node_ips(text: str) -> tuple[str, ...]:
    """--node-ip: one address, or a dual-stack pair "IPv4,IPv6" / "IPv6,IPv4" (the first is the
    primary), as kubelet's --node-ip and upstream kube-proxy's --node-ip-override take them.
    ValueError says what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 2:
        raise ValueError(f"{text!r}: at most two addresses, one per IP family")
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for part in parts:
        try:
            ips.append(valid_ip(part))
        except ValueError:
            raise ValueError(f"{part!r} is not a valid IP address") from None
        if ips[-1].is_unspecified:
            raise ValueError(f"{part!r}: the unspecified address is not a node IP")
    if len(ips) == 2 and ips[0].version == ips[1].version:
        raise ValueError(f"{text!r}: a pair must be one IPv4 and one IPv6 address")
    return tuple(str(ip) for ip in ips)
