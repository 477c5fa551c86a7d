"""Service annotations the nftables backend understands.

`kubeproxy.io/udp-conntrack-timeout: 5s` (a Go duration, at least 1s) gives the Service's UDP
flows their own conntrack timeout, for both the unreplied and the replied state, instead of the
kernel's defaults (30 s, and 120 s once a flow has seen traffic both ways). A DNS service behind
SNAT then frees its source ports in seconds. Values are rounded up to whole seconds (what the
kernel's ct timeout policy holds). An invalid value is reported with the Service's name and
ignored: the default timeouts stay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kubeproxy.model.proxy_config import ConfigError, parse_duration

UDP_CONNTRACK_TIMEOUT = "kubeproxy.io/udp-conntrack-timeout"
# The kernel keeps ct timeouts in jiffies in a u32: far beyond any sensible value.
MAX_TIMEOUT_SECONDS = 86400 * 7


def udp_conntrack_timeout(annotations: Mapping[str, str], service: str) -> tuple[int | None, str | None]:
    """(seconds, None) when the annotation is valid, (None, warning) when not, (None, None) if absent."""
    raw = annotations.get(UDP_CONNTRACK_TIMEOUT)
    if raw is None:
        return None, None
    try:
        seconds = parse_duration(raw)
    except ConfigError as exc:
        return None, _warning(service, raw, str(exc))
    if seconds < 1:
        return None, _warning(service, raw, "must be at least 1s")
    if seconds > MAX_TIMEOUT_SECONDS:
        return None, _warning(service, raw, f"must be at most {MAX_TIMEOUT_SECONDS // 86400 * 24}h")
    return math.ceil(seconds), None


def _warning(service: str, raw: str, reason: str) -> str:
    return f"Service {service}: annotation {UDP_CONNTRACK_TIMEOUT}={raw!r}: {reason}; the default UDP conntrack timeout is kept"
