"""Proxy modes by their `--proxy-mode` name: the only place that knows which backends exist.

Each mode is one `Mode` record: everything the rest of the program needs to know about a mode
(how to build its backend, render it offline, clean it up, which families it runs, which
programs it needs, which metrics it exposes) is a field here, so that a mode is its folder
under `backends/` plus one entry in `MODES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kubeproxy.backends.nftables import NODEPORTS as NFTABLES_NODEPORTS
from kubeproxy.model.contract import Backend, OfflineRenderer
from kubeproxy.model.options import NodePortTraits

if TYPE_CHECKING:
    import subprocess

    from prometheus_client.registry import Collector

    from kubeproxy.kernel.exec import Runner
    from kubeproxy.model.metrics import NfacctReader, ProxyMetrics
    from kubeproxy.model.options import Family
    from kubeproxy.model.proxy_config import ProxyConfig

# Each field that names code imports its mode's package when called: a process runs one mode,
# and importing all four (and prometheus_client) cost `kubeproxy render` a tenth of a second.

Factory = Callable[["Runner", float, str, "ProxyConfig | None"], Backend]  # (run, sync period, variant, cfg)
Lanes = Callable[[], Iterable[tuple["Family", object]]]


class FakeTool(Protocol):
    """A fake of a kernel tool a mode brings along, for `FakeNode` (tests without root)."""

    def handles(self, argv: Sequence[str]) -> bool: ...

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]: ...


@dataclass(frozen=True)
class ModeObservers:
    """What a mode with in-process state of its own (the userspace relay) shows at scrape time:
    a Prometheus collector for /metrics and a detail for /healthz, over the live loop's lanes."""

    collector: Collector
    health_key: str  # "": nothing for /healthz
    health: Callable[[], Any]


@dataclass(frozen=True)
class Mode:
    name: str
    create: Factory
    offline: str  # the module whose `render_text` is the mode's OfflineRenderer (`kubeproxy render`)
    # Removes what the mode installs for one family, and nothing else; what it removed.
    cleanup: Callable[[Runner, Family], list[str]]
    # The programs it runs to program the kernel, by iptables variant ("", "legacy", "nft").
    tools: Callable[[str], tuple[str, ...]]
    # A command (argv, stdin) that fails where the kernel or the tools cannot carry the mode's
    # IPv6 rules; None: no IPv6 rules to check.
    ipv6_probe: Callable[[str], tuple[list[str], str | None]] | None = None
    # Runs both families whatever the node's addresses (upstream's platformCheckSupported);
    # otherwise the families the node's addresses and cluster CIDRs name.
    upstream_dual_stack: bool = True
    # Checks the configuration's parts only this mode reads; raises ConfigError.
    validate: Callable[[ProxyConfig], None] | None = None
    # Metrics of its own on /metrics (lanes: the live loop's (family, backend) pairs).
    observers: Callable[[Lanes], ModeObservers] | None = None
    # ProxyMetrics's mode-specific families this mode exposes, by name.
    metrics: tuple[str, ...] = ()
    failure_metric: str = ""  # of `metrics`: the counter its backend's `record_failure` counts in
    nfacct_metrics: bool = False  # the nfacct-backed packet counters (read at scrape time)
    # NodePorts answer on 127.0.0.0/8 when localhost NodePorts are on (route_localnet): stale
    # conntrack flows to those addresses are the mode's too.
    loopback_nodeports: bool = False
    fake_tools: tuple[Callable[[], FakeTool], ...] = field(default=())  # beyond FakeNode's own
    # Commands that list what the mode programs, for a person or a test to read it back.
    listings: tuple[tuple[str, ...], ...] = ()
    # The KubeProxyConfiguration sections it reads (upstream's v1alpha1 conversion: any mode but
    # ipvs and nftables reads iptables'): syncPeriod and minSyncPeriod; masqueradeAll and -Bit.
    periods_section: str = "iptables"
    masquerade_section: str = "iptables"
    nodeports: NodePortTraits = field(default_factory=NodePortTraits)  # unset nodePortAddresses; the localhost gate
    # What `kube-proxy` logs (as an error) and records as a Warning Event about the Node when it
    # starts in this mode: (reason, action, message).
    start_warning: Callable[[], tuple[str, str, str]] | None = None
    # The start-up line names the iptables variant its rules go through.
    logs_iptables_variant: bool = False
    # The Service annotation that sets its own UDP conntrack timeout is honoured.
    udp_timeout_annotation: bool = False
    # Connections end in the proxy, which opens its own to the endpoint (from a socket of its
    # own, never masqueraded); where pods hang off unnumbered links it listens on --bind-address.
    relays: bool = False
    # KubeProxyConfiguration's top-level fields only this mode reads (a file gets them back only
    # in this mode; in any other they are warned unused).
    file_fields: tuple[str, ...] = ()
    # What its offline render's text is, for `explain --manifests` to read back: "nft" (nft -f
    # text), "iptables-save" (restore sections by family), "ipvs" (those with ipset and ipvsadm
    # parts); "": nothing explain reads.
    render_format: str = ""
    # The module whose `read_rules(run, ports)` reads a node's rules back per service port
    # (model/rules_readback.py), for the lab's beds to wait on; "": the lab cannot read it.
    readback: str = ""
    # Kernel modules it needs beyond netfilter's; a kernel without them runs it in the VM's beds.
    kernel_modules: tuple[str, ...] = ()
    # Without a change it syncs at most every FULL_SYNC_PERIOD (model/contract.py), and between
    # syncs the live loop asks its backend every syncPeriod whether its rules are still there
    # (upstream's iptables and nftables runners); otherwise it syncs every syncPeriod (ipvs).
    quiet_resync: bool = False


# -- the four modes


def _iptables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.iptables.proxier import IptablesProxier

    return IptablesProxier(run=run, sync_period=sync_period, variant=variant)


def _nftables(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.nftables.proxier import NftablesProxier

    return NftablesProxier(run=run)


def _ipvs(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.ipvs.config_section import ipvs_options
    from kubeproxy.backends.ipvs.proxier import IpvsProxier

    return IpvsProxier(run=run, sync_period=sync_period, variant=variant, options=ipvs_options(cfg.ipvs if cfg else {}))


def _userspace(run: Runner, sync_period: float, variant: str, cfg: ProxyConfig | None) -> Backend:
    from kubeproxy.backends.userspace.factory import userspace

    return userspace(run, sync_period, variant, cfg)


def _iptables_cleanup(run: Runner, family: Family) -> list[str]:
    from kubeproxy.backends.iptables.proxier import IptablesProxier

    return IptablesProxier(run=run, family=family).cleanup()


def _nftables_cleanup(run: Runner, family: Family) -> list[str]:
    from kubeproxy.backends.nftables.apply import NftApplier

    return [f"nftables table {family.nft} kube-proxy"] if NftApplier(family.nft, run).cleanup() else []


def _ipvs_cleanup(run: Runner, family: Family) -> list[str]:
    from kubeproxy.backends.ipvs.proxier import IpvsProxier

    return IpvsProxier(run=run, family=family).cleanup()


def _userspace_cleanup(run: Runner, family: Family) -> list[str]:
    from kubeproxy.backends.userspace.proxier import UserspaceProxier

    return UserspaceProxier(run=run, family=family).cleanup()


def _restore(variant: str) -> str:
    from kubeproxy.backends.iptables.apply import iptables_tool
    from kubeproxy.model.options import Family

    return iptables_tool(Family.IPV4, variant, "-restore")  # IPv6's comes from the same package


def _ip6tables_probe(variant: str) -> tuple[list[str], str | None]:
    from kubeproxy.backends.iptables.apply import iptables_tool
    from kubeproxy.model.options import Family

    # ip6tables with a nat table, as upstream's platform check asks of it
    return [iptables_tool(Family.IPV6, variant), "-w", "-t", "nat", "-S", "POSTROUTING"], None


def _nft_probe(variant: str) -> tuple[list[str], str | None]:
    return ["nft", "-c", "-f", "-"], "add table ip6 kube-proxy\n"  # -c: checked, nothing changes


def _ipvs_validate(cfg: ProxyConfig) -> None:
    from kubeproxy.backends.ipvs.config_section import ipvs_options
    from kubeproxy.backends.ipvs.deprecation import refusal
    from kubeproxy.model.proxy_config import ConfigError

    if problem := refusal(cfg.feature_gates):
        raise ConfigError(f"--proxy-mode (mode): {problem}")
    ipvs_options(cfg.ipvs)  # upstream validates the ipvs section (scheduler, excludeCIDRs) only in ipvs mode


def _ipvs_deprecation() -> tuple[str, str, str]:
    from kubeproxy.backends.ipvs import deprecation

    return deprecation.REASON, deprecation.ACTION, deprecation.MESSAGE


def _nftables_observers(lanes: Lanes) -> ModeObservers:
    from kubeproxy.backends.nftables.localhost_metrics import LocalhostNodePortCollector

    return ModeObservers(LocalhostNodePortCollector(lanes), "", lambda: None)


def _userspace_observers(lanes: Lanes) -> ModeObservers:
    from kubeproxy.backends.userspace.relay_metrics import RelayCollector, relay_health

    return ModeObservers(RelayCollector(lanes), "userspaceRelay", lambda: relay_health(lanes))


RESTORE_FAILURES = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
PARTIAL_RESTORE_FAILURES = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
IPTABLES_LISTINGS = (("iptables-save",), ("ip6tables-save",))

MODES: dict[str, Mode] = {
    "iptables": Mode(
        "iptables",
        _iptables,
        "kubeproxy.backends.iptables.offline",
        _iptables_cleanup,
        tools=lambda variant: (_restore(variant),),
        ipv6_probe=_ip6tables_probe,
        metrics=(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            RESTORE_FAILURES,
            PARTIAL_RESTORE_FAILURES,
            "kubeproxy_sync_proxy_rules_iptables_total",
            "kubeproxy_sync_proxy_rules_iptables_last",
        ),
        failure_metric=RESTORE_FAILURES,
        nfacct_metrics=True,
        loopback_nodeports=True,
        listings=IPTABLES_LISTINGS,
        logs_iptables_variant=True,
        render_format="iptables-save",
        readback="kubeproxy.backends.iptables.readback",
        quiet_resync=True,
    ),
    "nftables": Mode(
        "nftables",
        _nftables,
        "kubeproxy.backends.nftables.offline",
        _nftables_cleanup,
        tools=lambda variant: ("nft",),
        ipv6_probe=_nft_probe,
        observers=_nftables_observers,
        metrics=(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
        ),
        failure_metric="kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        listings=(("nft", "list", "ruleset"),),
        periods_section="nftables",
        masquerade_section="nftables",
        nodeports=NFTABLES_NODEPORTS,
        udp_timeout_annotation=True,
        render_format="nft",
        readback="kubeproxy.backends.nftables.readback",
        quiet_resync=True,
    ),
    "ipvs": Mode(
        "ipvs",
        _ipvs,
        "kubeproxy.backends.ipvs.offline",
        _ipvs_cleanup,
        tools=lambda variant: ("ipvsadm", "ipset", _restore(variant)),
        ipv6_probe=_ip6tables_probe,
        validate=_ipvs_validate,
        start_warning=_ipvs_deprecation,
        metrics=(RESTORE_FAILURES,),
        failure_metric=RESTORE_FAILURES,
        listings=(("ipvsadm-save", "-n"), ("ipset", "save"), *IPTABLES_LISTINGS),
        periods_section="ipvs",
        render_format="ipvs",
        readback="kubeproxy.backends.ipvs.readback",
        kernel_modules=("ip_vs",),  # upstream's CleanupLeftovers: `modprobe -va ip_vs` (ipvs/cleanup.go)
    ),
    "userspace": Mode(
        "userspace",
        _userspace,
        "kubeproxy.backends.userspace.offline",
        _userspace_cleanup,
        tools=lambda variant: (_restore(variant),),
        ipv6_probe=_ip6tables_probe,
        upstream_dual_stack=False,  # not upstream's mode: the families the node's addresses name
        observers=_userspace_observers,
        metrics=(RESTORE_FAILURES, PARTIAL_RESTORE_FAILURES),
        failure_metric=RESTORE_FAILURES,
        listings=IPTABLES_LISTINGS,
        relays=True,
        file_fields=("portRange", "udpIdleTimeout"),
        render_format="iptables-save",
        readback="kubeproxy.backends.userspace.readback",
    ),
}


class ModeNames(Sequence[str]):
    """The registered modes' names, read at each use (a test may register a mode of its own)."""

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return list(MODES)[index]

    def __len__(self) -> int:
        return len(MODES)

    def __iter__(self) -> Iterator[str]:
        return iter(list(MODES))

    def __contains__(self, name: object) -> bool:
        return name in MODES


def mode(name: str) -> Mode:
    """The mode called `name`; ValueError naming the modes there are for any other."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"proxy mode {name!r} is not available; this build has {', '.join(MODES)}") from None


def nodeport_traits(mode_name: str) -> NodePortTraits:
    """The NodePort defaults of the mode called `mode_name` (iptables' for a name no mode has)."""
    found = MODES.get(mode_name)
    return found.nodeports if found else NodePortTraits()


def proxy_metrics(
    mode_name: str, *, nfacct: NfacctReader | None = None, feature_gates: Mapping[str, bool] | None = None
) -> ProxyMetrics:
    """/metrics for a proxy in the mode called `mode_name`: every mode's families, the mode's
    own, and the nfacct-backed counters where the mode has them."""
    from kubeproxy.model.metrics import ProxyMetrics

    found = mode(mode_name)
    return ProxyMetrics(found.metrics, nfacct=nfacct if found.nfacct_metrics else None, feature_gates=feature_gates)


def create(mode_name: str, *, run: Runner, sync_period: float, variant: str = "", cfg: ProxyConfig | None = None) -> Backend:
    """The backend for `mode_name`; ValueError naming the modes there are for any other."""
    return mode(mode_name).create(run, sync_period, variant, cfg)


def offline_renderer(mode_name: str) -> OfflineRenderer:
    """The function that prints `mode_name`'s full rule set; ValueError for an unknown mode."""
    renderer: OfflineRenderer = importlib.import_module(mode(mode_name).offline).render_text
    return renderer


def observers(mode_name: str, lanes: Lanes) -> ModeObservers | None:
    """`mode_name`'s observers (None for a mode whose state the kernel holds)."""
    seen = mode(mode_name).observers
    return seen(lanes) if seen is not None else None


@dataclass(frozen=True)
class Cleanup:
    removed: tuple[str, ...]
    errors: tuple[str, ...]  # "<mode> <family>: <why>", for each cleanup that failed


def cleanup_all(run: Runner, families: Iterable[Family]) -> Cleanup:
    """Every mode's cleanup for each of `families` (upstream's CleanupLeftovers of all modes):
    what is ours goes whatever mode installed it; one that fails does not stop the others."""
    removed: list[str] = []
    errors: list[str] = []
    for family in families:
        for m in MODES.values():
            try:
                removed += m.cleanup(run, family)
            except (OSError, RuntimeError) as exc:  # a tool missing or refusing (SyncError is one)
                errors.append(f"{m.name} {family}: {exc}")
    return Cleanup(tuple(removed), tuple(errors))
