"""The live proxy's own HTTP servers: healthz (healthzBindAddress) and metrics
(metricsBindAddress), one connection budget for both and the health-check node ports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from kubeproxy.model.metrics import ProxyMetrics
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers, serve_healthz, serve_metrics
from kubeproxy.proxy.http import Handler
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.proxy")

Start = Callable[[str], Awaitable[asyncio.AbstractServer]]


@dataclass
class StatusServers:
    cfg: ProxyConfig
    health: ProxyHealth
    metrics: ProxyMetrics
    service_health: ServiceHealthServers  # whose connection budget and error log they share
    pages: Mapping[str, Handler]  # /configz, /flagz, /statusz (proxy/zpages.py)
    servers: dict[str, asyncio.AbstractServer] = field(default_factory=dict)  # proxy.http.HttpServer

    def _starters(self) -> list[tuple[str, str, Start]]:
        budget, errors = self.service_health.budget, self.service_health.errors
        return [
            ("healthz", self.cfg.healthz_bind_address,
             lambda b: serve_healthz(self.health, self.metrics, b, budget=budget, errors=errors)),
            ("metrics", self.cfg.metrics_bind_address,
             lambda b: serve_metrics(self.metrics, b, self.cfg.mode, budget=budget, errors=errors, pages=self.pages)),
        ]  # fmt: skip

    async def start(self, *, ipv6_wildcard: bool = False) -> None:
        """Start each server on its bind address; with `ipv6_wildcard`, only the `[::]` twin of
        each on 0.0.0.0 (Go's listener on 0.0.0.0 takes IPv6 too; ours takes one family)."""
        for what, bind, start in self._starters():
            if ipv6_wildcard:
                what, bind = f"{what} IPv6", _ipv6_wildcard(bind)
            if not bind:  # an empty address disables the server, as upstream
                continue
            try:
                self.servers[what] = await start(bind)
            except OSError as exc:
                # Upstream keeps proxying without the server; so do we, loudly.
                log.error(kv("Failed to start server", address=bind, err=exc))

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def _ipv6_wildcard(bind: str) -> str:
    """`[::]:port` for a bind address on every IPv4 address (`0.0.0.0:port`), else ""."""
    host, sep, port = bind.rpartition(":")
    return f"[::]:{port}" if sep and host == "0.0.0.0" else ""
