"""Whether the source still follows the cluster, shown where an operator looks, never as health.

A source is out of sync while it cannot reach the API server (or list the manifest files), or
knows that what it delivered may be stale and has not relisted yet (sources/api.py). The rules
stay as they were programmed meanwhile, and health stays what upstream defines it to be: the
proxier's freshness against the updates it was given (proxy/health.py). An API outage queues no
update, so a node whose rules are fine keeps answering 200: a control-plane blip must not take
every node out of its load balancers, nor restart every proxy.

What shows the state instead:
- a warning when the source goes out of sync, and a line at default verbosity when it is back
  (with how long it was out);
- the gauge `kubeproxy_source_out_of_sync` (kubeproxy's own metric; upstream has no such one);
- `source` in the /healthz and /livez bodies: `{"inSync": false, "outOfSyncSince": "<RFC 3339>"}`
  while out of sync, `{"inSync": true}` otherwise (an extra field: upstream's are unchanged).

The state is read from the source's `connected` on every check: by `run` once per `interval`,
and by each health request before it answers, so a body never shows a state the log has not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from kubeproxy.proxy.health import rfc3339
from kubeproxy.runtime.logs import STARTUP_LOGGER, kv

log = logging.getLogger("kubeproxy.proxy")
# Back in sync is worth a line at default verbosity (upstream's V(0) information).
notice = logging.getLogger(STARTUP_LOGGER)

METRIC = "kubeproxy_source_out_of_sync"
HEALTH_FIELD = "source"


class Connected(Protocol):
    @property
    def connected(self) -> bool: ...


@dataclass
class SourceWatch:
    """Follows `source.connected`; `name` says which source in the log lines."""

    source: Connected
    registry: CollectorRegistry
    name: str = "source"
    clock: Callable[[], float] = time.time
    # When the source was last seen going out of sync; None while it is in sync.
    out_since: float | None = field(default=None, init=False)
    gauge: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.gauge = Gauge(
            METRIC,
            "1 while the proxy's source (the API server, or the manifest files) cannot be reached or is "
            "known to be stale and not relisted yet, else 0; the programmed rules stay meanwhile. "
            "kubeproxy's own metric, not upstream kube-proxy's.",
            registry=self.registry,
        )

    def check(self) -> bool:
        """Read the source's state, log and count a change; whether it is in sync."""
        in_sync = bool(self.source.connected)
        now = self.clock()
        if not in_sync and self.out_since is None:
            self.out_since = now
            self.gauge.set(1)
            log.warning(kv("Source out of sync: the rules stay as programmed, health is not affected", source=self.name))
        elif in_sync and self.out_since is not None:
            took = now - self.out_since
            self.out_since = None
            self.gauge.set(0)
            notice.info(kv("Source back in sync", source=self.name, outOfSyncSeconds=round(took, 3)))
        return in_sync

    def health_field(self) -> dict[str, object]:
        """The `source` field of the health bodies."""
        if self.check() or self.out_since is None:
            return {"inSync": True}
        return {"inSync": False, "outOfSyncSince": rfc3339(self.out_since)}

    async def run(self, interval: float) -> None:
        """Check every `interval` seconds until cancelled."""
        while True:
            self.check()
            await asyncio.sleep(interval)
