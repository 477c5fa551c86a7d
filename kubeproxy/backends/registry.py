"""Proxy modes by their `--proxy-mode` name: the only place that knows which backends exist."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from kubeproxy.backends.base import Backend, OfflineRenderer
from kubeproxy.backends.exec import Runner
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.backends.ipvs.options import ipvs_options
from kubeproxy.backends.ipvs.proxier import IpvsProxier
from kubeproxy.backends.nftables.proxier import NftablesProxier
from kubeproxy.proxy.config import ProxyConfig


def _iptables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    return IptablesProxier(run=run, sync_period=sync_period, variant=variant)


def _nftables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    return NftablesProxier(run=run, sync_period=sync_period)


def _ipvs(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    return IpvsProxier(run=run, sync_period=sync_period, variant=variant, options=ipvs_options(cfg.ipvs if cfg else {}))


# Each factory picks from the configuration what its mode reads (e.g. the `ipvs:` section).
BACKENDS: dict[str, Callable[[Runner, float, str, ProxyConfig | None], Backend]] = {
    "iptables": _iptables,
    "nftables": _nftables,
    "ipvs": _ipvs,
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
}


def offline_renderer(mode: str) -> OfflineRenderer:
    """The function that prints `mode`'s full rule set; ValueError for a mode without one."""
    try:
        module = importlib.import_module(OFFLINE[mode])
    except KeyError:
        raise ValueError(f"proxy mode {mode!r} has no offline renderer; there are {', '.join(OFFLINE)}") from None
    renderer: OfflineRenderer = module.render_text
    return renderer
