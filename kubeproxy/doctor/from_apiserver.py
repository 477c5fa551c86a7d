"""The cluster's objects for doctor from the API server, read-only, as `kubeproxy run` reads them.

The same reflectors as the proxy (kubeproxy.sources.api.ApiSource: Services and EndpointSlices
with upstream's label selector, and this node's Node) list everything once; doctor stops them as
soon as all three have synced, so only GETs (list, then the start of a watch) reach the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubeproxy.cluster.state import ClusterState
from kubeproxy.cluster.validation import ParseOptions
from kubeproxy.sources.events import WatchEvent

if TYPE_CHECKING:
    from lightkube.config.kubeconfig import SingleConfig


class ApiReadError(RuntimeError):
    pass


@dataclass
class ApiObjects:
    state: ClusterState
    source: str  # where from, for the report
    warnings: list[str] = field(default_factory=list)


def read_objects(kubeconfig: str | None, master: str | None, node_name: str, options: ParseOptions,
                 timeout: float = 30.0) -> ApiObjects:
    """List the objects once; ApiReadError (naming the server) if they cannot be had within `timeout` s."""
    from kubeproxy.sources.connection import ConnectionConfigError, load_config

    where = master or kubeconfig or "in-cluster"
    try:
        config = load_config(kubeconfig, master=master)
    except ConnectionConfigError as exc:
        raise ApiReadError(str(exc)) from None
    got = ApiObjects(ClusterState(options=options), f"API server ({where})")
    try:
        asyncio.run(_list(config, node_name, got, timeout))
    except TimeoutError:
        raise ApiReadError(f"API server {config.cluster.server} ({where}): the Services, EndpointSlices and "
                           f"Node {node_name!r} were not listed within {timeout:g} s (is it reachable?)") from None
    return got


async def _list(config: SingleConfig, node_name: str, got: ApiObjects, timeout: float) -> None:
    from kubeproxy.sources.api import ApiSource
    from kubeproxy.sources.connection import connect

    def sink(event: WatchEvent) -> None:
        warning = got.state.apply(event.obj, deleted=event.type == "DELETED")
        if warning:
            got.warnings.append(f"{event}: {warning}")

    client = connect(config)
    try:
        source = ApiSource(client, node_name, sink)
        task = asyncio.create_task(source.run(), name="doctor-api")
        try:
            await asyncio.wait_for(source.wait_synced(), timeout)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    finally:
        await client.aclose()
