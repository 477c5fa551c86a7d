"""The iptables backend of the live proxy: one sync turns the node model into kernel rules.

What a sync does, in upstream's order:

1. Look for the canary chains (`KUBE-PROXY-CANARY` in mangle, nat and filter). If one is gone,
   someone flushed the tables (a firewall reload): recreate them and do a full sync. Between
   syncs the live loop looks for it every syncPeriod (`rules_intact`, upstream's iptables
   Monitor). A sync also becomes a full one when the last was over FULL_SYNC_PERIOD ago, except
   in large clusters, as upstream.
2. Render (`render.py`, pure): a full sync writes every chain; a partial sync rewrites only the
   chains of services whose objects changed, plus the shared chains whose text changed since
   our last successful restore (`last_restore.py`; upstream rewrites them all every time).
3. On a full sync, add the jumps from the built-in chains that are missing (`-I`, as upstream
   prepends them), inside the same restore so that they and their targets appear together.
4. Feed it to `iptables-restore -w --noflush --counters`: one atomic transaction per sync.
   Stale service chains found with `iptables-save -t nat` are flushed and deleted in it too
   (in large clusters at most once per syncPeriod, because iptables-save is slow there).

A failed restore raises `RestoreError`; the caller counts it and asks for a full sync, because
a partial sync builds on the rules the failed one did not install.

All kernel access goes through one `run` callable, so tests drive a network namespace.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kubeproxy.backends.iptables import jumps, names
from kubeproxy.backends.iptables.apply import RestoreError, check_restore, ensure_nfacct_counters, iptables_tool, restore
from kubeproxy.backends.iptables.cache import RenderCache
from kubeproxy.backends.iptables.last_restore import AppliedChains
from kubeproxy.backends.iptables.render import (
    KUBE_EXTERNAL_SERVICES,
    KUBE_FIREWALL,
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_PROXY_CANARY,
    KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
    Rendered,
    TableText,
    is_large_cluster,
    render,
    render_tables,
    restore_chunks,
)
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.model.contract import FULL_SYNC_PERIOD
from kubeproxy.model.metrics import FamilyMetrics
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import NFACCT_COUNTERS, Family, NodeOptions

log = logging.getLogger("kubeproxy.iptables")

CANARY_TABLES = ("mangle", "nat", "filter")

# Chains we remove on cleanup besides the per-service ones. KUBE-MARK-MASQ and KUBE-FIREWALL are
# shared with kubelet: they go only if nothing else still jumps to them.
OWN_CHAINS = {
    "nat": (KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING),
    "filter": (KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL),
}
SHARED_CHAINS = {"nat": (KUBE_MARK_MASQ,), "filter": (KUBE_FIREWALL,)}


@dataclass(frozen=True)
class SyncReport:
    """What one sync did, for logs and metrics."""

    full: bool
    rendered: Rendered  # its `text` is "": the restore input is not kept once restored
    render_seconds: float
    restore_seconds: float
    jumps_added: int = 0
    # Shared chains ("table/chain") a partial sync left out because the kernel holds them unchanged.
    skipped_chains: tuple[str, ...] = ()

    @property
    def no_local_endpoints_internal(self) -> int:
        return self.rendered.no_local_endpoints_internal

    @property
    def no_local_endpoints_external(self) -> int:
        return self.rendered.no_local_endpoints_external

    @property
    def rule_counts(self) -> dict[str, int]:
        return {"filter": self.rendered.filter_rules, "nat": self.rendered.nat_rules_total}

    @property
    def written_rule_counts(self) -> dict[str, int]:
        # A partial sync leaves the chains of unchanged services as they are: not counted here.
        return {"filter": self.rendered.filter_rules, "nat": self.rendered.nat_rules}


def chains_in_save(text: str) -> set[str]:
    """Chain names declared in `iptables-save` output (lines `:NAME POLICY [p:b]`)."""
    return {line[1:].split(" ", 1)[0] for line in text.splitlines() if line.startswith(":")}


@dataclass
class IptablesProxier:
    """One IP family's iptables rules on this node; `sync` is called by the runner only."""

    family: Family = Family.IPV4
    run: Runner = local_run
    # "legacy" or "nft" to pick iptables-legacy / iptables-nft explicitly; "" is the system's.
    variant: str = ""
    sync_period: float = 30.0
    clock: Callable[[], float] = time.monotonic
    nfacct_counters: tuple[str, ...] = field(default=(), init=False)
    _last_stale_cleanup: float = field(default=float("-inf"), init=False)
    _last_full_sync: float = field(default=float("-inf"), init=False)
    # Unchanged services' rules from the previous render: a small change renders only itself.
    _cache: RenderCache = field(default_factory=RenderCache, init=False)
    # The shared chains as our last successful restore wrote them: a partial sync leaves out
    # those it would write unchanged (last_restore.py says why that is safe with --noflush).
    _applied: AppliedChains = field(default_factory=AppliedChains, init=False)

    def _binary(self, tool: str = "") -> str:
        return iptables_tool(self.family, self.variant, tool)

    def _iptables(self, *args: str, check: bool = False) -> bool:
        binary = self._binary()
        return self.run([binary, "-w", *args], check=check).returncode == 0

    def prepare(self) -> None:
        """Before the first sync: the canary chains whose disappearance means a flush, and the
        nfacct counters upstream's rules count with (left out where the kernel has none)."""
        self.nfacct_counters = tuple(sorted(ensure_nfacct_counters(NFACCT_COUNTERS, self.run)))
        self.ensure_canary()

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None:
        log.error('"Failed to execute iptables-restore" err="%s"', exc)
        metrics.restore_failures_total.inc()
        if partial:
            metrics.partial_restore_failures_total.inc()

    def canary_present(self) -> bool:
        """Whether the canary in the mangle table is still there.

        Only mangle is looked at, as upstream's monitor does: it is small, while listing one
        chain of a 10k-service nat table costs iptables-legacy a read of the whole table.
        Whoever reloads the firewall flushes mangle along with the rest.
        """
        return self._iptables("-t", CANARY_TABLES[0], "-S", KUBE_PROXY_CANARY)

    def rules_intact(self) -> bool:
        return self.canary_present()

    def ensure_canary(self) -> None:
        for table in CANARY_TABLES:
            if not self._iptables("-t", table, "-S", KUBE_PROXY_CANARY):
                self._iptables("-t", table, "-N", KUBE_PROXY_CANARY)

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> SyncReport:
        """Program the rules for `view`. `changed_services` None: a full sync."""
        if not self.canary_present():
            log.info("KUBE-PROXY-CANARY is gone: the tables were flushed, doing a full sync")
            self.ensure_canary()
            changed_services = None
        large = is_large_cluster(view)
        if changed_services is not None and not large and self.clock() - self._last_full_sync > FULL_SYNC_PERIOD:
            changed_services = None
        full = changed_services is None

        cleanup_due = not large or self.clock() - self._last_stale_cleanup >= self.sync_period
        existing = self._nat_chains() if cleanup_due else None

        started = time.perf_counter()
        # The restore input as pieces, never joined into one text on a full sync (32 MiB at 10k
        # services x 10 endpoints, and one more copy for the jumps): the report that outlives
        # the sync (the runner keeps the last one) keeps the counts, its text is "".
        rendered, tables = render_tables(
            view,
            opts,
            changed_services=changed_services,
            existing_nat_chains=existing,
            stale_cleanup_due=cleanup_due,
            cache=self._cache,
        )
        # A copy without the set of active chains the render may have cached in it (4 MiB at
        # 10k services): readers of the report that want it compute it again.
        rendered = replace(rendered)
        if full:
            tables, added = self._with_missing_jump_tables(tables)
        else:
            added = 0
        # A sync that carries no change (the hourly one of a large cluster, not made full) writes
        # the shared chains whole, as upstream's every sync does: whatever edited them behind our
        # back is undone. Only syncs that carry changes leave the unchanged ones out.
        filtered = self._applied.filter_chunks(list(restore_chunks(tables)), full=full or not changed_services)
        del tables  # the pieces live on in `filtered` until the restore and their digests are done
        rendered_at = time.perf_counter()
        try:
            restore(filtered.restore_input, self.run, family=self.family, variant=self.variant)
        except Exception:
            # Some tables may have committed and others not: what the kernel holds is unknown.
            self._applied.forget()
            raise
        done = time.perf_counter()
        self._applied.applied(filtered, full=full)  # the digests the next partial sync compares with
        if full:
            self._last_full_sync = self.clock()
        if rendered.stale_cleanup_done:
            self._last_stale_cleanup = self.clock()
        return SyncReport(full, rendered, rendered_at - started, done - rendered_at, added, filtered.skipped)

    def check(self, view: NodeView, opts: NodeOptions) -> str | None:
        """What iptables-restore says of a full sync to `view`, tested (`--test`) but not committed.

        None if it takes it. The kernel keeps its rules; the live proxy's quarantine uses this to
        find the Service a failed restore tripped on. Rendered without the cache, which stays
        that of the rules in the kernel.
        """
        return check_restore(render(view, opts).text, self.run, family=self.family, variant=self.variant)

    def _save(self, table: str) -> str | None:
        binary = self._binary("-save")
        proc = self.run([binary, "-t", table], check=False)
        if proc.returncode != 0:
            log.warning("%s -t %s failed: %s", binary, table, proc.stderr.strip())
            return None
        return proc.stdout

    def _nat_chains(self) -> set[str] | None:
        text = self._save("nat")
        return None if text is None else chains_in_save(text)

    def _missing_jumps(self, declared: dict[str, set[str]]) -> list[jumps.Jump]:
        # Kubelet's KUBE-FIREWALL and its jumps are ensured in both families whether or not
        # this rendering writes the chain's rule (upstream's iptablesKubeletJumpChains, ensured
        # with the proxy's own before every full sync). A chain the rendering does not declare
        # is created with -N, never declared in the restore input, which would flush it.
        wanted = [
            j for j in jumps.ENSURE_ORDER if j.target in declared.get(j.table, set()) or j in jumps.KUBELET_JUMPS
        ]  # fmt: skip
        missing = [j for j in wanted if not self._iptables("-t", j.table, "-C", *_rule_args(j))]
        for chain in {(j.table, j.target) for j in missing if j.target not in declared.get(j.table, set())}:
            self._iptables("-t", chain[0], "-N", chain[1])  # fails, harmlessly, when it exists
        return missing

    def _with_missing_jump_tables(self, tables: tuple[TableText, ...]) -> tuple[tuple[TableText, ...], int]:
        """`tables` plus `-I` lines for missing jumps at the end of each table (before its
        COMMIT), in upstream's prepend order.

        A jump is only looked for when its target is one of the table's shared chains: the
        tables' pieces are not searched (at 10k services they are 320k lines)."""
        declared = {
            t.name: {j.target for j in jumps.ENSURE_ORDER if j.table == t.name and j.target in t.shared_chains} for t in tables
        }
        missing = _group_by_table(self._missing_jumps(declared))
        if not missing:
            return tables, 0
        out = tuple(
            replace(t, chunks=[*t.chunks, "".join(f"-I {_rule_spec(j)}\n" for j in missing[t.name])]) if t.name in missing else t
            for t in tables
        )
        return out, sum(len(v) for v in missing.values())

    def cleanup(self) -> list[str]:
        """Remove our jumps and chains, and nothing else. Returns what was removed."""
        removed: list[str] = []
        self._applied.forget()
        for j in jumps.ENSURE_ORDER:
            while self._iptables("-t", j.table, "-D", *_rule_args(j)):
                removed.append(f"{j.table} {j.builtin} -> {j.target}")
        for table in ("nat", "filter"):
            present = self._save(table)
            if present is None:
                continue
            ours = sorted(
                c for c in chains_in_save(present) if c in OWN_CHAINS[table] or (table == "nat" and names.is_service_chain(c))
            )
            if ours:
                lines = [f"*{table}", *(f":{c} - [0:0]" for c in ours), *(f"-X {c}" for c in ours), "COMMIT", ""]
                try:
                    restore("\n".join(lines), self.run, family=self.family, variant=self.variant)
                    removed.extend(f"{table} {c}" for c in ours)
                except RestoreError as exc:
                    log.error("could not remove our %s chains: %s", table, exc)
            after = self._save(table) or ""
            for shared in SHARED_CHAINS[table]:
                # Flushing a chain kubelet's rules still jump to would break them: only an
                # unreferenced one is ours alone.
                unused = shared in chains_in_save(after) and f"-j {shared}" not in after
                if unused and self._iptables("-t", table, "-F", shared) and self._iptables("-t", table, "-X", shared):
                    removed.append(f"{table} {shared}")
        for table in CANARY_TABLES:
            if self._iptables("-t", table, "-X", KUBE_PROXY_CANARY):
                removed.append(f"{table} {KUBE_PROXY_CANARY}")
        return removed


def _rule_args(j: jumps.Jump) -> list[str]:
    """The jump as an argument list for `iptables -C/-D/-I CHAIN ...`."""
    return [j.builtin, *shlex.split(j.match), "-j", j.target]


def _rule_spec(j: jumps.Jump) -> str:
    """The jump as restore text after `-I ` (match keeps its quoted comment)."""
    return f"{j.builtin} {j.match} -j {j.target}" if j.match else f"{j.builtin} -j {j.target}"


def _group_by_table(items: list[jumps.Jump]) -> dict[str, list[jumps.Jump]]:
    out: dict[str, list[jumps.Jump]] = {}
    for j in items:
        out.setdefault(j.table, []).append(j)
    return out
