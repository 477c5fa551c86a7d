"""A `LiveProxy` served by a scripted source: the set-up most live-loop tests share.

`Source` delivers its objects as watch events; `serving` runs the proxy's loop until the block
ends and ends it by cancelling, so that an exception the loop raised instead is the test's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.events import EventType, WatchEvent


@dataclass
class Source:
    """Delivers `initial`, then whatever `publish` is given, as watch events."""

    proxy: LiveProxy
    initial: list[dict[str, Any]]
    connected: bool = True
    _synced: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        for obj in self.initial:
            self.proxy.on_event(WatchEvent("ADDED", obj["kind"], obj))
        self._synced.set()
        await asyncio.Event().wait()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def publish(self, *objs: dict[str, Any], kind: EventType = "MODIFIED") -> None:
        for obj in objs:
            self.proxy.on_event(WatchEvent(kind, obj["kind"], obj))


@contextlib.asynccontextmanager
async def serving(proxy: LiveProxy, source: Any, timeout: float = 10.0) -> AsyncIterator[None]:
    """The block runs once the proxy's first sync is done (within `timeout` seconds)."""
    task = asyncio.create_task(proxy.serve(source))
    try:
        await asyncio.wait_for(proxy.wait_for_syncs(1), timeout)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


Body = Callable[[LiveProxy, Source], Awaitable[None]]


def serve_with(make: Callable[[], LiveProxy], initial: list[dict[str, Any]], body: Body, timeout: float = 10.0) -> LiveProxy:
    """A proxy made by `make` (in the loop it runs in), served `initial`; `body` runs after the
    first sync and within `timeout` seconds."""

    async def main() -> LiveProxy:
        proxy = make()
        source = Source(proxy, initial)
        async with serving(proxy, source, timeout):
            await asyncio.wait_for(body(proxy, source), timeout)
        return proxy

    return asyncio.run(main())
