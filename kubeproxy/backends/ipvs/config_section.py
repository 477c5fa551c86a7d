"""The `ipvs` section of the configuration (upstream's KubeProxyIPVSConfiguration) as IpvsOptions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeproxy.backends.ipvs.render import DEFAULT_SCHEDULER, IpvsOptions, validate_scheduler
from kubeproxy.cluster.addresses import valid_cidr
from kubeproxy.cluster.duration import DurationError, parse_go_duration
from kubeproxy.model.proxy_config import ConfigError


def _seconds(value: Any) -> float:
    """A duration from the config: a number of seconds or Go's '900s' / '15m' / '1h0m0s' form."""
    if value in (None, ""):
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return parse_go_duration(str(value))
    except DurationError as exc:
        raise ConfigError(f"ipvs: {value!r} is not a duration ({exc})") from None


def ipvs_options(section: Mapping[str, Any], node_addresses: tuple[str, ...] = ()) -> IpvsOptions:
    """IpvsOptions from the config's `ipvs` section (upstream's field names); ConfigError names the field."""
    scheduler = str(section.get("scheduler") or DEFAULT_SCHEDULER)
    problem = validate_scheduler(scheduler)
    if problem:
        raise ConfigError(problem)
    cidrs = section.get("excludeCIDRs") or ()
    if isinstance(cidrs, str):
        cidrs = [c for c in cidrs.split(",") if c]
    for c in cidrs:
        try:
            valid_cidr(c)
        except ValueError:
            raise ConfigError(f"ipvs.excludeCIDRs: {c!r} is not a CIDR") from None
    return IpvsOptions(
        scheduler=scheduler,
        strict_arp=bool(section.get("strictARP", False)),
        exclude_cidrs=tuple(str(valid_cidr(c)) for c in cidrs),
        tcp_timeout=_seconds(section.get("tcpTimeout")),
        tcpfin_timeout=_seconds(section.get("tcpFinTimeout")),
        udp_timeout=_seconds(section.get("udpTimeout")),
        node_addresses=node_addresses,
    )


