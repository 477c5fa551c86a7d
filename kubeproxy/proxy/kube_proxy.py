"""`kube-proxy ARGS` / `kubeproxy run ARGS`: upstream's start-up sequence around the live proxy.

As upstream's Options.Complete/Validate/Run and newProxyServer: parse the flags (proxy/flags.py),
load --config, set up logging (-v, --logging-format), then --write-config-to or --cleanup and
exit, or: OOM score, conntrack sysctls (--init-only stops here), the health and metrics ports
(bindAddressHardFail: a port taken is fatal), then the proxy until SIGTERM. Every setting that has
no effect here is a warning at start, and once the source has delivered its initial state one
line says what this proxy is: version, mode, node and how it was found, IPs, detector, periods.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from kubeproxy.cluster.errors import ManifestError
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy import flags as upstream_flags
from kubeproxy.proxy.config import to_kube_proxy_configuration
from kubeproxy.proxy.http import Handler
from kubeproxy.proxy.preflight import ApiConnection, PreflightError, api_connection, check_tools
from kubeproxy.proxy.startup import config_warnings, node_facts, summary
from kubeproxy.proxy.sysctls import SysctlError, apply_oom_score_adj, configure_conntrack
from kubeproxy.proxy.zpages import ZPages, flag_values
from kubeproxy.runtime import logs
from kubeproxy.runtime.logs import STARTUP_LOGGER, kv
from kubeproxy.runtime.version import VersionInfo
from kubeproxy.sources.event_recorder import EventRecorder, KubeEvent, ObjectRef, node_ref

log = logging.getLogger(STARTUP_LOGGER)


def main(
    args: Sequence[str],
    *,
    prog: str = "kube-proxy",
    verbosity: int = 0,
    stdout: TextIO | None = None,
    proc_sys: Path = Path("/proc/sys"),
    oom_score_adj: Path = Path("/proc/self/oom_score_adj"),
) -> int:
    """Run the proxy as upstream's kube-proxy command would; the exit status. `proc_sys` and
    `oom_score_adj`: where the node's settings are written (tests point them elsewhere)."""
    started = time.time()
    out = stdout or sys.stdout
    try:
        parsed = upstream_flags.parse(args)
    except upstream_flags.FlagError as exc:
        sys.stderr.write(f"Error: {exc}\nRun '{prog} --help' for usage.\n")
        return 1
    if parsed.given("help"):
        out.write(upstream_flags.usage(prog))
        return 0
    if parsed.given("version") and parsed.values["version"] in ("true", "raw"):
        info = VersionInfo()
        out.write((info.raw() if parsed.values["version"] == "raw" else info.line()) + "\n")
        return 0
    if verbosity and not parsed.given("v"):
        parsed.values["v"] = verbosity  # `kubeproxy -v 2 run ...`: as a -v flag
        parsed.order.append("v")
    # Logging as the flags say until the file is read (its errors are logged in that format).
    logs.setup(int(parsed.values.get("v", 0)), str(parsed.values.get("logging-format", "text")))
    try:
        inv = upstream_flags.resolve(parsed)
    except (upstream_flags.FlagError, ConfigError, ManifestError) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 1
    cfg = inv.cfg
    logs.setup(cfg.verbosity, cfg.logging_format)
    for warning in (*inv.warnings, *config_warnings(cfg)):
        log.warning(warning)
    if inv.write_config_to:
        return _write_config(cfg, inv.write_config_to)
    if inv.cleanup:
        return _cleanup()
    # Everything that can refuse to run is checked before the node is changed (preflight.py).
    api: ApiConnection | None = None
    if not inv.init_only:
        try:
            check_tools(cfg.mode, inv.iptables_variant)
            api = None if inv.manifests else api_connection(cfg, inv.master)
        except PreflightError as exc:
            log.error(kv("Error running ProxyServer", err=str(exc)))
            return 1
        if cfg.bind_address_hard_fail:
            for what, address in (("healthz", cfg.healthz_bind_address), ("metrics", cfg.metrics_bind_address)):
                if problem := _port_taken(address):
                    log.error(kv(f"failed to start {what} server", address=address, err=problem))
                    return 1
    if message := apply_oom_score_adj(cfg.oom_score_adj, oom_score_adj):
        log.warning(message)  # upstream logs and carries on
    try:
        report = configure_conntrack(cfg.conntrack, proc_sys=proc_sys)
    except SysctlError as exc:
        log.error(kv("Error running ProxyServer", err=str(exc)))
        return 1
    for warning in report.warnings:
        log.warning(warning)
    startup_events = _mode_warnings(cfg)  # after the sysctls, where upstream creates the proxier
    if inv.init_only:
        log.info(kv("Initialization done (--init-only)", conntrack=report.set or "unchanged"))
        return 0
    pages = ZPages(cfg, flag_values(parsed.values), started).routes()
    return _serve(inv, pages, api, startup_events)


def _mode_warnings(cfg: ProxyConfig) -> list[tuple[str, str, str]]:
    """The mode's start-up warning, logged as upstream logs it; the (reason, action, note) of the
    Warning Event it records about the Node."""
    from kubeproxy.backends import registry

    warning = registry.mode(cfg.mode).start_warning
    if warning is None:
        return []
    reason, action, message = warning()
    log.error(kv(message))
    return [(reason, action, message)]


def _write_config(cfg: ProxyConfig, path: str) -> int:
    from kubeproxy.proxy import goyaml  # --write-config-to only

    text = goyaml.dump(to_kube_proxy_configuration(cfg))
    try:
        if path == "-":
            sys.stdout.write(text)
        else:
            Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        log.error(kv("Error writing configuration", file=path, err=exc.strerror))
        return 1
    log.info(kv("Wrote configuration", file=path))
    return 0


def _cleanup() -> int:
    from kubeproxy.backends import registry
    from kubeproxy.kernel.exec import local_run
    from kubeproxy.model.options import Family

    done = registry.cleanup_all(local_run, list(Family))
    for item in done.removed:
        log.info(kv("Removed", item=item))
    for error in done.errors:
        log.error(kv("Cleanup failed", err=error))
    return 1 if done.errors else 0


def _port_taken(address: str) -> str | None:
    """Why `address` (ip:port) cannot be bound now, or None: bindAddressHardFail's check."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As asyncio.start_server binds: SO_REUSEADDR, so only a listener (not TIME_WAIT) counts.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
            sock.listen(1)
        except OSError as exc:
            return f"listen tcp {address}: bind: {exc.strerror or errno.errorcode.get(exc.errno or 0, exc)}"
    return None


class ConfigFileChanged(RuntimeError):
    """--config changed on disk: exit, so that the pod restarts with it (upstream's runLoop)."""


async def watch_config_file(path: str, interval: float = 1.0) -> None:
    """Raise ConfigFileChanged once `path`'s content differs from what it was at start.

    Upstream watches the file with fsnotify and exits on a write or rename (a ConfigMap update
    is an atomic symlink swap by the kubelet); without inotify in the standard library the
    content is compared every `interval` seconds.
    """
    from kubeproxy.cluster.manifests import read_text

    def content() -> str | None:
        # Never blocks the event loop: a FIFO swapped in would hold it, SIGTERM's handler included.
        try:
            return read_text(Path(path), regular_only=True)
        except ManifestError as exc:
            return str(exc)  # unreadable now: a change all the same

    start = content()
    while True:
        await asyncio.sleep(interval)
        if content() != start:
            raise ConfigFileChanged(f"content of the proxy server's configuration file was updated: {path}")


class _Announcing:
    """The source, plus the start-up line once its initial state is in (the node is known then),
    plus the --config watch (its change ends the source, hence the proxy)."""

    def __init__(self, inner: Any, proxy: Any, inv: upstream_flags.Invocation, node_from: str, source: str,
                 recorder: EventRecorder | None = None) -> None:
        self.inner, self.proxy, self.inv, self.node_from, self.source = inner, proxy, inv, node_from, source
        self.recorder = recorder

    async def run(self) -> None:
        if self.recorder is None:
            await self._run_source()
            return
        # Upstream's birth cry, once its informers are started.
        self.recorder.record(KubeEvent(node_ref(self.proxy.node_name), "Normal", "Starting", "StartKubeProxy"))
        writer = asyncio.create_task(self.recorder.run(), name="event-recorder")
        try:
            await self._run_source()
        finally:
            writer.cancel()

    async def _run_source(self) -> None:
        if not self.inv.config_file:
            await self.inner.run()
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(self.inner.run(), name="source")
            group.create_task(watch_config_file(self.inv.config_file), name="config-watch")

    async def wait_synced(self) -> None:
        await self.inner.wait_synced()
        announce(self.proxy.state, self.inv, self.proxy.node_name, self.node_from, self.source)

    @property
    def connected(self) -> bool:
        return bool(self.inner.connected)


def announce(state: Any, inv: upstream_flags.Invocation, node_name: str, node_from: str, source: str) -> None:
    cfg = inv.cfg
    node = state.nodes.get(node_name)
    if node is None:
        others = sorted(state.nodes)
        where = f"among the {len(others)} Nodes received ({', '.join(others[:5])})" if others else "received"
        log.warning(f"Node {node_name!r} ({node_from}) is not {where}: no endpoint is local to this node, so "
                    "eTP=Local NodePorts and LoadBalancers drop here; set --hostname-override to this node's name")
    elif not cfg.hostname_override and len(state.nodes) > 1:
        log.warning(f"{len(state.nodes)} Nodes received and no --hostname-override: using this machine's hostname "
                    f"{node_name!r}; set --hostname-override (kubeadm's DaemonSet passes $(NODE_NAME))")
    facts = node_facts(cfg, node)
    for warning in facts.warnings:
        log.warning(warning)
    fields = summary(cfg, node_name=node_name, node_from=node_from, facts=facts,
                     iptables_variant=inv.iptables_variant, source=source)
    log.info(kv("Starting kubeproxy", **fields))


def _serve(inv: upstream_flags.Invocation, metrics_pages: Mapping[str, Handler], api: ApiConnection | None,
           startup_events: Sequence[tuple[str, str, str]] = ()) -> int:
    from kubeproxy.cluster.state import ClusterState
    from kubeproxy.model.contract import SyncError
    from kubeproxy.proxy import live_loop

    cfg = inv.cfg
    hostname = socket.gethostname().strip().lower()
    node_name = cfg.hostname_override or hostname
    node_from = "--hostname-override" if cfg.hostname_override else "this machine's hostname"
    if inv.manifests:
        state = ClusterState(options=cfg.parse_options(from_api_server=False))
    else:
        state = ClusterState(options=cfg.parse_options(from_api_server=True))
    proxy = live_loop.LiveProxy(cfg, node_name, iptables_variant=inv.iptables_variant, state=state)
    try:
        inner, source = _source(inv, proxy, api)
    except (ManifestError, ConfigError) as exc:
        log.error(kv("Error running ProxyServer", err=str(exc)))
        return 1
    proxy.source_name = source
    proxy.metrics_pages = metrics_pages
    # Events go to the API server only; recorded before the writer starts, they wait for it.
    recorder = EventRecorder(api.client) if api is not None else None
    if recorder is not None:
        for reason, action, note in startup_events:
            recorder.record(KubeEvent(node_ref(node_name), "Warning", reason, action, note))
        proxy.lanes[0].service_health.on_failure = _health_check_events(recorder)
    status = 0
    try:
        asyncio.run(live_loop.run_until_signalled(proxy, _Announcing(inner, proxy, inv, node_from, source, recorder)))
    except* ConfigFileChanged as group:
        log.error(kv("Error running ProxyServer", err=str(_leaf(group))))
        status = 1
    except* SyncError as group:
        # The backend's start-up checks (e.g. ipvs mode on a kernel without IPVS) say what to do.
        log.error(kv("Error running ProxyServer", err=str(_leaf(group))))
        status = 1
    return status


def _health_check_events(recorder: EventRecorder) -> Callable[[tuple[str, str], str], None]:
    """Upstream's Event about a Service whose health-check node port cannot be opened."""

    def failed(service: tuple[str, str], message: str) -> None:
        ref = ObjectRef("Service", service[1], service[0])
        recorder.record(KubeEvent(ref, "Warning", "FailedToStartServiceHealthcheck", "Listen", message))

    return failed


def _leaf(error: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def _source(inv: upstream_flags.Invocation, proxy: Any, api: ApiConnection | None) -> tuple[Any, str]:
    if api is None:
        from kubeproxy.sources.files import FileSource

        files = FileSource(list(inv.manifests), proxy.on_event, batch_sink=proxy.on_events)
        return files, f"manifests {','.join(inv.manifests)}"
    from kubeproxy.sources.api import ApiSource
    from kubeproxy.sources.client_metrics import RestClientMetrics

    client = api.client
    RestClientMetrics(proxy.metrics.registry, api.server).attach(client)
    where = api.where
    # Whole lists at once, as structs where they fit the schema (sources/api.py); watch-lists as
    # client-go's WatchListClient gate says.
    from kubeproxy.model.features import gate_enabled
    from kubeproxy.model.proxy_config import DEFAULT_CONTENT_TYPE

    watch_list = gate_enabled(inv.cfg.feature_gates, "WatchListClient")
    source = ApiSource(client, proxy.node_name, proxy.on_event, batch_sink=proxy.on_events, typed_lists=True,
                       watch_list=watch_list, content_type=inv.cfg.client_content_type or DEFAULT_CONTENT_TYPE,
                       accept_content_types=inv.cfg.client_accept_content_types)  # fmt: skip
    return source, f"API server ({where})"

