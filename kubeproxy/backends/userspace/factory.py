"""The registry's constructor for the userspace mode: what it reads from the configuration."""

from __future__ import annotations

from kubeproxy.backends.userspace.proxier import UserspaceProxier, state_path
from kubeproxy.kernel.exec import Runner
from kubeproxy.model.contract import Backend
from kubeproxy.model.proxy_config import ProxyConfig


def userspace(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    return UserspaceProxier(
        run=run,
        sync_period=sync_period,
        variant=variant,
        port_range=cfg.port_range if cfg else "",
        udp_timeout=cfg.udp_idle_timeout if cfg else 0.25,
        listen_ip=cfg.bind_address if cfg else "",
        state_file=state_path(),
    )
