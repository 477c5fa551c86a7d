"""What `kube-proxy` checks before it changes anything on the node (OOM score, conntrack sysctls,
rules): a proxy that cannot run must exit leaving the node as it found it.

Beyond the configuration (checked when the flags and file are resolved): the API connection
(the kubeconfig or in-cluster settings readable and parseable, a client built from them, which
loads its certificates), and the kernel tools the mode drives, on PATH. Nothing here contacts
the API server or the kernel.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubeproxy.backends import registry
from kubeproxy.model.proxy_config import ProxyConfig

if TYPE_CHECKING:
    import httpx2


class PreflightError(RuntimeError):
    """Why the proxy cannot run; the message names the setting or the tool."""


@dataclass(frozen=True)
class ApiConnection:
    client: httpx2.AsyncClient
    server: str  # the API server's URL, as the settings name it
    where: str  # which settings: --master, the kubeconfig's path, or in-cluster


def mode_tools(mode: str, variant: str = "") -> tuple[str, ...]:
    """The programs `mode` runs to program the kernel (IPv4's; IPv6's come from the same packages)."""
    found = registry.MODES.get(mode)
    return found.tools(variant) if found is not None else ()


def check_tools(mode: str, variant: str = "", *, which: Callable[[str], str | None] = shutil.which) -> None:
    missing = [tool for tool in mode_tools(mode, variant) if which(tool) is None]
    if missing:
        raise PreflightError(f"{mode} mode needs {', '.join(missing)}, not found on PATH: install "
                             f"{'them' if len(missing) > 1 else 'it'} or choose another --proxy-mode")


def api_connection(cfg: ProxyConfig, master: str) -> ApiConnection:
    """The client for the API server the flags name; PreflightError when the settings cannot be used."""
    from kubeproxy.sources.connection import ConnectionConfigError, connect, load_config

    try:
        settings = load_config(cfg.kubeconfig or None, master=master or None)
        # Requests but watches are limited as client-go's rate limiter limits them (sources/throttle.py).
        client = connect(settings, qps=cfg.client_qps, burst=cfg.client_burst)
    except ConnectionConfigError as exc:
        raise PreflightError(str(exc)) from None
    return ApiConnection(client, settings.cluster.server, master or cfg.kubeconfig or "in-cluster")
