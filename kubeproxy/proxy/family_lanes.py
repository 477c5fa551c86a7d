"""Both IP families from one proxy: upstream's meta-proxier, in the live loop's terms.

Upstream runs one proxier per family and hands each the Services and EndpointSlices of its
family. Here the cluster state is shared and each family's node view already holds only that
family's addresses (`build_view(..., family)`), so dispatching by family is building one view
per family. What must be separate per family is everything that remembers the previous sync:
the backend (its tables: `iptables`/`ip6tables`, `ip`/`ip6 kube-proxy`), the change tracker's
last view, the view builder, the quarantine and its last accepted view, and the health-check
listeners (bound to that family's addresses, counting that family's local endpoints). That is a
`FamilyLane`; `LiveProxy` syncs every lane in turn, and a lane that fails leaves the other's
rules and health alone.

Which families the live proxy runs (`live_families`): as upstream's platformCheckSupported
(cmd/kube-proxy/app/server_linux.go), both in upstream's modes whatever the node's addresses, the
primary one of the first node IP; a family the kernel lacks (`kernel_lacks`) is logged once and
left out, and the other keeps working. A family the node has no address of gets the loopback
address as its node IP (upstream's detectNodeIPs). `kubeproxy render` works offline, without the
kernel to ask, and renders the families the node's addresses or --cluster-cidr name
(kubeproxy.render.node_families); so does the userspace mode, which is not upstream's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.backends import registry
from kubeproxy.backends.base import Backend, SyncReport
from kubeproxy.backends.exec import Runner
from kubeproxy.cluster.objects import Node
from kubeproxy.proxy.changes import Changes, ChangeTracker
from kubeproxy.proxy.config import ProxyConfig
from kubeproxy.proxy.health import ServiceHealthServers
from kubeproxy.proxy.node_model import NodeView
from kubeproxy.proxy.options import Family, NodeOptions
from kubeproxy.proxy.quarantine import Quarantine
from kubeproxy.proxy.view import ViewBuilder
from kubeproxy.render import node_families, primary_family

log = logging.getLogger("kubeproxy.proxy")

# Every mode's backend programs one family per instance, so that two instances make a
# dual-stack node. IPVS's two instances share the IPVS table and kube-ipvs0: each reads and
# changes only its own family's virtual servers and addresses there, and names its IPv6 ipsets
# KUBE-6-... (upstream's NewIPSet). Userspace: each family has its own listeners (IPv6 ones
# with IPV6_V6ONLY on `::`), relay thread, ip6tables redirects and state file. Which families
# run is the mode's `upstream_dual_stack` (backends/registry.py).

PROC_IPV6 = Path("/proc/sys/net/ipv6")


@dataclass
class FamilyLane:
    """What one family's syncs remember; see the module docstring."""

    family: Family
    backend: Backend
    tracker: ChangeTracker
    service_health: ServiceHealthServers
    view_builder: ViewBuilder = field(default_factory=ViewBuilder)
    quarantine: Quarantine = field(default_factory=Quarantine)
    last_good: NodeView | None = None  # the view the kernel last accepted
    last_report: SyncReport | None = None
    last_changes: Changes | None = None
    opts: NodeOptions | None = None  # of the last sync
    # Refusals the quarantine worked around in the worker thread, counted by the loop after it.
    refusals: list[Exception] = field(default_factory=list)
    prepared: bool = False


def other(family: Family) -> Family:
    return Family.IPV4 if family.ipv6 else Family.IPV6


def live_families(cfg: ProxyConfig, node: Node | None) -> tuple[Family, ...]:
    """The families the live proxy runs, the primary first (see the module docstring)."""
    if registry.mode(cfg.mode).upstream_dual_stack:
        primary = primary_family(cfg, node)
        return (primary, other(primary))
    return node_families(cfg, node)


def kernel_lacks(family: Family, mode: str, run: Runner, *, variant: str = "", proc_ipv6: Path = PROC_IPV6) -> str | None:
    """Why this node's kernel cannot carry `family`'s rules in `mode`, or None if it can.

    As upstream's platform check: IPv4 is assumed; IPv6 needs the kernel's IPv6 stack, not
    disabled by net.ipv6.conf.all.disable_ipv6, and the mode's tool for it (ip6tables with a
    nat table; nft accepting an `ip6` table, checked with `nft -c`, which changes nothing): the
    mode's `ipv6_probe`.
    """
    if not family.ipv6:
        return None
    if not proc_ipv6.exists():
        return f"{proc_ipv6} is absent: the kernel has no IPv6"
    disabled = proc_ipv6 / "conf" / "all" / "disable_ipv6"
    try:
        if disabled.read_text().strip() == "1":
            return f"IPv6 is disabled ({disabled} is 1)"
    except OSError:
        pass  # upstream too reads it only to see a 1
    probe = registry.mode(mode).ipv6_probe
    if probe is None:
        return None
    argv, stdin = probe(variant)
    try:
        proc = run(argv, input=stdin, check=False)
    except OSError as exc:  # the tool is not installed
        return f"{argv[0]}: {exc.strerror or exc}"
    if proc.returncode != 0:
        return f"`{' '.join(argv)}` failed: {(proc.stderr or '').strip() or f'exit status {proc.returncode}'}"
    return None
