"""Proxy modes by their `--proxy-mode` name: the only place that knows which backends exist."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeproxy.backends.base import Backend, OfflineRenderer
from kubeproxy.backends.exec import Runner
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.options import Family

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

# Each factory imports its mode's package when called: a process runs one mode, and importing all
# four (and prometheus_client) cost `kubeproxy render` a tenth of a second at start.


def _iptables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.iptables.proxier import IptablesProxier

    return IptablesProxier(run=run, sync_period=sync_period, variant=variant)


def _nftables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.nftables.proxier import NftablesProxier

    return NftablesProxier(run=run, sync_period=sync_period)


def _ipvs(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.ipvs.options import ipvs_options
    from kubeproxy.backends.ipvs.proxier import IpvsProxier

    return IpvsProxier(run=run, sync_period=sync_period, variant=variant, options=ipvs_options(cfg.ipvs if cfg else {}))


def _userspace(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.userspace.factory import userspace

    return userspace(run, sync_period, variant, cfg)


# Each factory picks from the configuration what its mode reads (e.g. the `ipvs:` section).
BACKENDS: dict[str, Callable[[Runner, float, str, ProxyConfig | None], Backend]] = {
    "iptables": _iptables,
    "nftables": _nftables,
    "ipvs": _ipvs,
    "userspace": _userspace,
}


def create(
    mode: str, *, run: Runner, sync_period: float, variant: str = "", cfg: ProxyConfig | None = None
) -> Backend:
    """The backend for `mode`; ValueError naming the modes there are for any other."""
    try:
        factory = BACKENDS[mode]
    except KeyError:
        raise ValueError(f"proxy mode {mode!r} is not available; this build has {', '.join(BACKENDS)}") from None
    return factory(run, sync_period, variant, cfg)


# `kubeproxy render --proxy-mode X`: each mode's offline renderer, imported when asked for.
OFFLINE = {
    "iptables": "kubeproxy.backends.iptables.offline",
    "nftables": "kubeproxy.backends.nftables.offline",
    "ipvs": "kubeproxy.backends.ipvs.offline",
    "userspace": "kubeproxy.backends.userspace.offline",
}


def offline_renderer(mode: str) -> OfflineRenderer:
    """The function that prints `mode`'s full rule set; ValueError for a mode without one."""
    try:
        module = importlib.import_module(OFFLINE[mode])
    except KeyError:
        raise ValueError(f"proxy mode {mode!r} has no offline renderer; there are {', '.join(OFFLINE)}") from None
    renderer: OfflineRenderer = module.render_text
    return renderer


@dataclass(frozen=True)
class ModeObservers:
    """What a mode with in-process state of its own (the userspace relay) shows at scrape time:
    a Prometheus collector for /metrics and a detail for /healthz, over the live loop's lanes."""

    collector: Collector
    health_key: str  # "": nothing for /healthz
    health: Callable[[], Any]


def observers(mode: str, lanes: Callable[[], Iterable[tuple[Family, object]]]) -> ModeObservers | None:
    """`mode`'s observers (None for the kernel modes: the kernel holds their state, except
    nftables mode's localhost NodePort listeners)."""
    if mode == "nftables":
        from kubeproxy.backends.nftables.metrics import LocalhostNodePortCollector

        return ModeObservers(LocalhostNodePortCollector(lanes), "", lambda: None)
    if mode != "userspace":
        return None
    from kubeproxy.backends.userspace.metrics import RelayCollector, relay_health

    return ModeObservers(RelayCollector(lanes), "userspaceRelay", lambda: relay_health(lanes))
