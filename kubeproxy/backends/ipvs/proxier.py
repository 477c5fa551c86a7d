"""The IPVS backend of the live proxy (`--proxy-mode ipvs`): the Backend contract over apply.py.

A sync, in upstream's order (syncProxyRules): render (pure); ipsets to their entries; kube-ipvs0
holding the service addresses; the iptables ruleset (atomic, --noflush) and upstream's jumps; then
the IPVS table, diffed against `ipvsadm-save -n`, in one `ipvsadm -R`. Every step diffs against
the kernel, so a resync without change runs only the three reads (ipset save, ip addr, ipvsadm-save).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.iptables.apply import iptables_tool
from kubeproxy.backends.ipvs.apply import Applier, IpvsOps, check_kernel, diff_ipvs
from kubeproxy.backends.ipvs.render import (
    DUMMY_DEVICE,
    FILTER_CHAINS,
    JUMPS,
    NAT_CHAINS,
    SETS,
    IpvsOptions,
    IpvsRendered,
    create_line,
    render,
    set_name,
)
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.kernel.interfaces import interface_addresses
from kubeproxy.model.contract import SyncError
from kubeproxy.model.metrics import FamilyMetrics
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family, NodeOptions

log = logging.getLogger("kubeproxy.ipvs")

# Upstream's sysctls for IPVS mode (NewProxier); conn_reuse_mode depends on the kernel (conn_reuse_sysctls).
SYSCTLS: tuple[tuple[str, int], ...] = (
    ("net/ipv4/vs/conntrack", 1),
    ("net/ipv4/vs/expire_nodest_conn", 1),
    ("net/ipv4/vs/expire_quiescent_template", 1),
    ("net/ipv4/ip_forward", 1),
)
STRICT_ARP: tuple[tuple[str, int], ...] = (("net/ipv4/conf/all/arp_ignore", 1), ("net/ipv4/conf/all/arp_announce", 2))
CONN_REUSE = "net/ipv4/vs/conn_reuse_mode"


def conn_reuse_sysctls(kernel_release: str) -> tuple[tuple[str, int], ...]:
    """conn_reuse_mode as upstream sets it for this kernel: 0 from 4.1 until 5.9, where the kernel
    fixed the 1 s delay of reused connections with conntrack on (kubernetes issue 93297); left
    as-is after, and unsettable before (the sysctl is missing)."""
    parts = kernel_release.split("-", 1)[0].split(".")
    try:
        version = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except ValueError:
        log.warning("Cannot read the kernel version %r: %s left as-is", kernel_release, CONN_REUSE)
        return ()
    if version < (4, 1):
        log.error("Can't set sysctl, kernel version doesn't satisfy minimum version requirements "
                  "sysctl=%s minimumKernelVersion=4.1", CONN_REUSE)
        return ()
    if version >= (5, 9):
        log.debug("Left as-is sysctl=%s", CONN_REUSE)
        return ()
    return ((CONN_REUSE, 0),)
SHARED_MARK_CHAIN = "KUBE-MARK-MASQ"  # kubelet jumps to it too


@dataclass(frozen=True)
class IpvsSyncReport:
    full: bool
    rendered: IpvsRendered
    ipvs_ops: IpvsOps
    ipset_lines: int
    addresses_changed: int
    iptables_loaded: bool
    seconds: float

    @property
    def no_local_endpoints_internal(self) -> int:
        return self.rendered.no_local_endpoints_internal

    @property
    def no_local_endpoints_external(self) -> int:
        return self.rendered.no_local_endpoints_external

    @property
    def rule_counts(self) -> Mapping[str, int]:
        return self.rendered.rule_counts

    @property
    def written_rule_counts(self) -> Mapping[str, int]:
        return {}  # upstream sets this gauge in its iptables mode only


@dataclass
class IpvsProxier:
    run: Runner = local_run
    sync_period: float = 30.0
    variant: str = ""
    options: IpvsOptions = field(default_factory=IpvsOptions)
    family: Family = Family.IPV4
    nfacct_counters: tuple[str, ...] = ()
    kernel_release: str = field(default_factory=lambda: os.uname().release)  # which sysctls upstream sets
    applier: Applier = field(init=False)

    def __post_init__(self) -> None:
        self.applier = Applier(self.run, self.family, self.variant)

    def prepare(self) -> None:
        """Upstream's NewProxier and CanUseIPVSProxier: the modules, the sysctls, the timeouts."""
        check_kernel(self.run, self.options.scheduler)
        wanted = conn_reuse_sysctls(self.kernel_release) + SYSCTLS + (STRICT_ARP if self.options.strict_arp else ())
        for key, value in wanted:
            self.run(["sysctl", "-q", "-w", f"{key.replace('/', '.')}={value}"], check=True)
        o = self.options
        if o.tcp_timeout or o.tcpfin_timeout or o.udp_timeout:
            # `ipvsadm --set` keeps the kernel's value where 0 is given, as upstream's ConfigureTimeouts.
            self.run(["ipvsadm", "--set", str(int(o.tcp_timeout)), str(int(o.tcpfin_timeout)), str(int(o.udp_timeout))],
                     check=True)

    def node_addresses(self) -> tuple[str, ...]:
        """Every local address but kube-ipvs0's: where NodePorts listen (upstream's GetAllLocalAddressesExcept).

        Loopback addresses and IPv6 link-local ones are left out, as upstream's isValidForSet
        (pkg/proxy/ipvs/netlink_linux.go): a NodePort is not served on 127.0.0.1 in IPVS mode."""
        version = 6 if self.family.ipv6 else 4
        return tuple(dict.fromkeys(
            a.ip for a in interface_addresses(self.run)
            if a.device != DUMMY_DEVICE and not a.link_local and not ipaddress.ip_address(a.ip).is_loopback
            and ipaddress.ip_address(a.ip).version == version
        ))

    def _render(self, view: NodeView, opts: NodeOptions) -> IpvsRendered:
        # The live loop sets `family` after construction; every sync and check renders first.
        self.applier.family = self.family
        o = self.options
        ipvs = IpvsOptions(o.scheduler, o.strict_arp, o.exclude_cidrs, o.tcp_timeout, o.tcpfin_timeout,
                           o.udp_timeout, self.node_addresses())
        return render(view, opts, ipvs)

    def rules_intact(self) -> bool:
        """Never asked: the mode syncs every syncPeriod, which puts back whatever was lost."""
        return True

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> IpvsSyncReport:
        started = time.monotonic()
        rendered = self._render(view, opts)
        ipset_lines = self.applier.apply_ipsets(rendered.sets, opts.family)
        added, removed = self.applier.ensure_dummy(rendered.bind_addresses)
        loaded = self.applier.apply_iptables(rendered.iptables)
        have, conns = self.applier.read_ipvs()
        ops = diff_ipvs(rendered.services, have, conns, exclude_cidrs=self.options.exclude_cidrs,
                        family=opts.family)
        self.applier.apply_ipvs(ops)
        return IpvsSyncReport(True, rendered, ops, ipset_lines, added + removed, loaded, time.monotonic() - started)

    def check(self, view: NodeView, opts: NodeOptions) -> str | None:
        """Whether a sync to `view` would be taken: the iptables text (--test) and the set entries."""
        rendered = self._render(view, opts)
        problem = self.applier.check_iptables(rendered.iptables)
        if problem:
            return problem
        # ipset has no dry run: load the entries into throwaway sets of the same types, then drop them.
        lines: list[str] = []
        names: list[str] = []
        for i, spec in enumerate(SETS):
            # Per family, as the sets themselves: the other family's lane may check in turn.
            tmp = set_name(f"KUBE-CHECK-{i}", opts.family)
            names.append(tmp)
            lines.append(create_line(spec, opts.family, tmp))
            lines.extend(f"add {tmp} {e}" for e in sorted(rendered.sets[spec.name]))
        proc = self.applier.feed(["ipset", "restore", "-exist"], lines)
        for tmp in names:
            self.run(["ipset", "destroy", tmp], check=False)
        return None if proc.returncode == 0 else f"ipset restore failed: {proc.stderr.strip()}"

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None:
        log.error('"Failed to sync ipvs rules" err="%s"', exc)
        metrics.restore_failures_total.inc()

    def cleanup(self) -> list[str]:
        """Upstream's cleanupLeftovers: the IPVS table, kube-ipvs0, our chains and jumps, our sets."""
        removed: list[str] = []
        ipt = iptables_tool(self.family, self.variant)
        # `kubeproxy cleanup` runs on nodes of every mode: without ipvsadm or ipset there is no
        # IPVS state of ours to remove, only the iptables part may be left.
        try:
            if self.run(["ipvsadm", "-C"], check=False).returncode == 0:
                removed.append("ipvs table")
        except FileNotFoundError:
            pass
        if self.run(["ip", "link", "del", DUMMY_DEVICE], check=False).returncode == 0:
            removed.append(DUMMY_DEVICE)
        for j in JUMPS:
            args = ["-m", "comment", "--comment", j.comment, "-j", j.target]
            while self.run([ipt, "-w", "-t", j.table, "-D", j.builtin, *args], check=False).returncode == 0:
                removed.append(f"{j.table} {j.builtin} -> {j.target}")
        for table, chains in (("nat", NAT_CHAINS), ("filter", FILTER_CHAINS)):
            # KUBE-MARK-MASQ is kubelet's too: flushed only once nothing but our chains used it.
            own = [c for c in chains if c != SHARED_MARK_CHAIN]
            for chain in own:
                self.run([ipt, "-w", "-t", table, "-F", chain], check=False)
            for chain in own:
                if self.run([ipt, "-w", "-t", table, "-X", chain], check=False).returncode == 0:
                    removed.append(f"{table} {chain}")
            if SHARED_MARK_CHAIN in chains:
                rules = self.run([ipt, "-w", "-t", table, "-S"], check=False).stdout
                if f"-j {SHARED_MARK_CHAIN}" not in rules and f"-N {SHARED_MARK_CHAIN}" in rules:
                    self.run([ipt, "-w", "-t", table, "-F", SHARED_MARK_CHAIN], check=False)
                    if self.run([ipt, "-w", "-t", table, "-X", SHARED_MARK_CHAIN], check=False).returncode == 0:
                        removed.append(f"{table} {SHARED_MARK_CHAIN}")
        try:
            for set_spec in SETS:
                name = set_name(set_spec.name, self.family)
                if self.run(["ipset", "destroy", name], check=False).returncode == 0:
                    removed.append(f"ipset {name}")
        except FileNotFoundError:
            pass  # no ipset tool, so no sets of ours
        self.applier.last_iptables = None
        return removed


__all__ = ["IpvsProxier", "IpvsSyncReport", "SyncError"]
