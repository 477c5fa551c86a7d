"""The contract every backend (proxy mode) implements, and the error a failed sync raises.

The live loop (`kubeproxy/live.py`) holds one `Backend` and never asks which mode it is:

- `prepare()` once before the first sync (canary chains, nfacct counters, ...);
- `sync(view, opts, changed_services)` programs the kernel for `view` (None: a full sync) and
  returns a `SyncReport`, or raises `SyncError` with the kernel tool's words (`ToolTimeout`
  when the tool ran out of time); the kernel then still holds what it had (each mode applies
  atomically);
- `check(view, opts)` answers whether a full sync to `view` would be taken, without applying
  it (`nft -c`, `iptables-restore --test`): the quarantine bisects with it;
- `record_failure(metrics, exc, partial)` counts and logs a failed sync in the mode's own
  metrics and upstream's words for it;
- `rules_intact()` says, cheaply, whether what the last sync installed is still in the kernel
  (a canary chain, the table): False (a firewall reload flushed it) makes the live loop ask for
  a full sync. Modes that sync every syncPeriod anyway answer True;
- `cleanup()` removes what the mode installed and nothing else.

`kubeproxy render` prints a mode's rules through its `OfflineRenderer` (the mode's offline.py).
A mode is a folder under `backends/` plus one `Mode` entry in `backends/registry.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kubeproxy.cluster.state import ClusterState
    from kubeproxy.model.metrics import FamilyMetrics
    from kubeproxy.model.node_model import NodeView
    from kubeproxy.model.options import Family, NodeOptions
    from kubeproxy.model.proxy_config import ProxyConfig


# How long a mode whose Mode record says `quiet_resync` goes without a sync when nothing changes,
# and how often its backend makes a sync a full one (upstream's proxyutil.FullSyncPeriod).
FULL_SYNC_PERIOD = 3600.0


class SyncError(RuntimeError):
    """A kernel tool refused a transaction or could not be run; the message carries its words."""


class ToolTimeout(SyncError):
    """A kernel tool did not finish within its bound and was killed: `tool`, `bound` (seconds)
    and the `lines` of input it was given (None where unknown).

    Not a refusal: no rule is to blame, so the quarantine never bisects on it (that would only
    run the slow tool again and again); the live loop tries the sync again with a longer bound
    (kernel/exec.py's `Patience`). What the killed tool had not committed keeps the rules it had:
    nft commits a transaction at the end of its input, iptables-restore each table at its COMMIT.
    """

    def __init__(self, tool: str, bound: float, lines: int | None = None) -> None:
        self.tool, self.bound, self.lines = tool, bound, lines
        size = "" if lines is None else f" ({lines} lines of input)"
        super().__init__(f"{tool} did not finish within {bound:g} s{size} and was killed")


class SyncReport(Protocol):
    """What one sync did, for logs and metrics."""

    @property
    def full(self) -> bool: ...

    @property
    def no_local_endpoints_internal(self) -> int: ...

    @property
    def no_local_endpoints_external(self) -> int: ...

    @property
    def rule_counts(self) -> Mapping[str, int]:
        """Rules per table, for modes that expose them (kubeproxy_sync_proxy_rules_iptables_total)."""
        ...

    @property
    def written_rule_counts(self) -> Mapping[str, int]:
        """Rules per table that this sync wrote, for modes that expose them
        (kubeproxy_sync_proxy_rules_iptables_last)."""
        ...


@dataclass(frozen=True)
class OfflineOptions:
    """What `kubeproxy render` adds to the configuration (modes ignore what they have no use for)."""

    nfacct: bool = True  # the node's kernel has nfacct counters (iptables mode)
    conntrack_tcp_liberal: bool = False  # the node sets nf_conntrack_tcp_be_liberal (iptables mode)
    with_jumps: bool = False  # add the jumps from the built-in chains (iptables mode)


@dataclass(frozen=True)
class OfflineText:
    """A mode's full rule set as a person reads and loads it, and what to warn about."""

    text: str
    warnings: tuple[str, ...] = ()


class OfflineRenderer(Protocol):
    def __call__(self, state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText: ...


class Backend(Protocol):
    # The IP family this instance programs; a dual-stack node runs one instance per family
    # (proxy/family_lanes.py), and the live loop sets it before every sync.
    family: Family
    # nfacct counters the rules may use, once `prepare` has created them (iptables mode only).
    nfacct_counters: tuple[str, ...]

    def prepare(self) -> None: ...

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> SyncReport: ...

    def check(self, view: NodeView, opts: NodeOptions) -> str | None: ...

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None: ...

    def rules_intact(self) -> bool: ...

    def cleanup(self) -> list[str]: ...
