"""A live proxy run inside a node namespace, for the dual-stack e2e of modes whose work is in-process.

The userspace mode's listeners are sockets of the proxy's own process: they must be opened in the
node's namespace, which the in-process proxy of tests/e2e/test_dualstack.py (commands sent into
the namespace, sockets in the test's) cannot do. So the test starts this module with
`ip netns exec NODE python -m tests.e2e.dualstack_runner MODE CIDRS_JSON` and talks to it by lines:

- stdin: one JSON object per line, published as a watch event (`{"kind": "ADDED"|"MODIFIED",
  "obj": {...}}`); the first line is the list of initial objects;
- stdout: `synced N FAMILIES FAILED` after the first sync and after each published event's sync
  (N the proxy's sync count, FAMILIES its lanes' families comma-separated, FAILED failed syncs).
Runs until stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source

NODE = "node-1"


def _status(proxy: LiveProxy) -> str:
    families = ",".join(str(lane.family) for lane in proxy.lanes)
    return f"synced {proxy.syncs} {families} {proxy.failed_syncs}"


async def main(mode: str, cidrs: tuple[str, ...]) -> None:
    cfg = ProxyConfig(mode=mode, cluster_cidr=cidrs, min_sync_period=0.0, sync_period=30.0,
                      healthz_bind_address="", metrics_bind_address="")  # fmt: skip
    loop = asyncio.get_running_loop()
    initial: list[dict[str, Any]] = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    proxy = LiveProxy(cfg, NODE)
    source = Source(proxy, initial)
    task = asyncio.create_task(proxy.serve(source))
    try:
        await asyncio.wait_for(proxy.wait_for_syncs(1), 60)
        print(_status(proxy), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            event = json.loads(line)
            done = proxy.syncs
            source.publish(event["obj"], kind=event["kind"])
            await asyncio.wait_for(proxy.wait_for_syncs(done + 1), 60)
            print(_status(proxy), flush=True)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for lane in proxy.lanes:  # listeners, relay threads, redirect chains, state files
            lane.backend.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], tuple(json.loads(sys.argv[2]))))
