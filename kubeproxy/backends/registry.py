"""Proxy modes by their `--proxy-mode` name: the only place that knows which backends exist."""

from __future__ import annotations

from collections.abc import Callable

from kubeproxy.backends.base import Backend
from kubeproxy.backends.exec import Runner
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.backends.nftables.proxier import NftablesProxier


def _iptables(run: Runner, sync_period: float, variant: str) -> Backend:
    return IptablesProxier(run=run, sync_period=sync_period, variant=variant)


def _nftables(run: Runner, sync_period: float, variant: str) -> Backend:
    return NftablesProxier(run=run, sync_period=sync_period)


BACKENDS: dict[str, Callable[[Runner, float, str], Backend]] = {
    "iptables": _iptables,
    "nftables": _nftables,
}


def create(mode: str, *, run: Runner, sync_period: float, variant: str = "") -> Backend:
    """The backend for `mode`; ValueError naming the modes there are for any other."""
    try:
        factory = BACKENDS[mode]
    except KeyError:
        raise ValueError(f"proxy mode {mode!r} is not available; this build has {', '.join(BACKENDS)}") from None
    return factory(run, sync_period, variant)
