"""The only code that runs `nft`: brings the kernel's table to a rendering, sending only changes.

`NftApplier.apply(rendering)` remembers the last rendering it applied and sends the difference
(diff.py): a resync with no change runs nothing at all; a one-endpoint change is a handful of
element operations. Large plans are cut into `nft -f` runs of at most `chunk_size` operations,
on unit boundaries, each leaving a consistent table; plans of `stream_min_operations` or more
(a cold table) go to a pipeline of `nft` processes, each parsing its chunk while the one before
commits, in the same order (stream.py). Chains, sets and objects nothing uses any
more are flushed in the sync that drops them and deleted by a later one, at least
`stale_delay` seconds after (see diff.py).

A full sync (the first one, `apply(full=True)`, or after any failure) does not trust memory:
 - no table in the kernel: it is created in chunks (nothing to disturb yet);
 - a table exists (a restart, or someone flushed it): one atomic transaction flushes every chain
   found, replaces every set and map (dynamic ones, which hold ClientIP affinity, are kept),
   re-adds everything, and on the first sync of this applier recreates the base chains so that a
   table left by an older version gets the current hooks and priorities (as upstream does once
   per start). Chains and objects of ours the rendering no longer has become stale. If nft
   refuses it, the table keeps what it had: it is never deleted to start over.
`check(rendering)` asks nft (`nft -c`) whether that full sync would be taken, changing nothing:
the live proxy's quarantine uses it to find the Service a failed sync tripped on.
`table_intact()` is the cheap check the live proxy can run each period (the `services` chain
still has its rules) to force such a resync.

Every call goes through `run(argv, input=, check=, timeout=)`, as in the iptables backend, so
tests drive a network namespace (`NetNS.run`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.backends.nftables.diff import NeedsFullSync, Plan, chunks, create_plan, plan, render_ops
from kubeproxy.backends.nftables.render import BASE_CHAINS, CONNTRACK_CHAINS, SERVICES
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.backends.nftables.stream import STREAM_FILE, NftStream, Spawn, spawner
from kubeproxy.backends.nftables.table_objects import TABLE, TABLE_COMMENT, add_lines, quote
from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.kernel.exec import Runner, bounded, local_run
from kubeproxy.kernel.libnft import LibNft
from kubeproxy.model.contract import SyncError, ToolTimeout

log = logging.getLogger("kubeproxy.nftables")

DEFAULT_CHUNK = 50_000
TIMEOUT_PER_LINE = 0.001  # seconds an `nft -f` run is allowed per line, on top of `timeout`
# Larger transactions (cold and full syncs) run in the `nft` process even when libnftables is
# loaded: in our process the cold sync of 10k services x 10 endpoints raised RSS by 123 MiB
# (libnftables' parse of 9 MiB of text), and the process run is bounded by a timeout; the
# ~25 ms the library saves matters only to small syncs. `nft` is needed anyway (listings).
IN_PROCESS_MAX_BYTES = 1 << 20
# Plans of this many operations (~1 MiB of text and more: a cold or large sync) are streamed into
# a pipeline of `nft` processes, each parsing its chunk while the one before commits (stream.py).
STREAM_MIN_OPERATIONS = 20_000
# Chunks of a streamed plan: small ones make a fine-grained pipeline (the first chunk's parse and
# the last one's commit, which nothing overlaps, are short). At 10k x 10 a cold table (applied
# in a namespace, a core free) took 0.72 s in 13 pipelined runs of 10k, 0.89 s in 3 of 50k, and
# 1.1 s either way one run after the other; the processes cost ~0.07 s more CPU in all.
STREAM_CHUNK = 10_000
_DELETE_ORDER = {"chain": 0, "set": 1, "map": 1, "ct timeout": 2, "counter": 2}


class NftError(SyncError):
    """nft refused a transaction; the message carries its complaint."""


@dataclass(frozen=True)
class ApplyResult:
    mode: str  # noop | incremental | create | full
    operations: int  # commands and elements sent
    invocations: int  # nft runs that changed the kernel (listings not counted)
    chunks: int
    stale_flushed: int
    stale_deleted: int
    seconds: float


@dataclass
class ApplierStats:
    operations_total: int = 0
    invocations_total: int = 0
    listings_total: int = 0
    failures_total: int = 0
    full_syncs_total: int = 0
    stale_deleted_total: int = 0


@dataclass
class NftApplier:
    """Keeps one table (`ip kube-proxy` or `ip6 kube-proxy`) equal to the renderings it is given."""

    family: str = "ip"
    run: Runner = local_run
    chunk_size: int = DEFAULT_CHUNK
    stale_delay: float = 1.0
    clock: Callable[[], float] = time.monotonic
    timeout: float = 300.0
    # In-process libnftables for the transactions (saves the ~25 ms start of an `nft` process
    # per sync); None: `nft -f -` through `run`, which is also what tests with a fake use.
    lib: LibNft | None = None
    in_process_max_bytes: int = IN_PROCESS_MAX_BYTES  # larger texts go to the `nft` process
    # Plans this large go to streamed `nft` processes where `run` allows it (stream.spawner);
    # None: never (every chunk through `run` or libnftables, one after the other).
    stream_min_operations: int | None = STREAM_MIN_OPERATIONS
    stream_chunk_size: int = STREAM_CHUNK  # at most chunk_size
    applied: NftRendering | None = field(default=None, init=False)
    stats: ApplierStats = field(default_factory=ApplierStats, init=False)
    _stale: dict[tuple[str, str], float] = field(default_factory=dict, init=False)
    _needs_full: bool = field(default=True, init=False)
    _base_recreated: bool = field(default=False, init=False)

    @property
    def table(self) -> str:
        return f"{self.family} {TABLE}"

    @property
    def stale(self) -> list[tuple[str, str]]:
        """(kind, name) of objects flushed and waiting to be deleted."""
        return sorted(self._stale)

    # ------------------------------------------------------------------ public
    def apply(self, rendering: NftRendering, *, full: bool = False) -> ApplyResult:
        """Make the kernel's table match `rendering`. Raises NftError; the next call is then full."""
        with paused_gc():
            return self._apply(rendering, full)

    def _apply(self, rendering: NftRendering, full: bool) -> ApplyResult:
        if rendering.family != self.family:
            raise ValueError(f"rendering is for family {rendering.family}, this applier for {self.family}")
        start = self.clock()
        before_ops, before_inv = self.stats.operations_total, self.stats.invocations_total
        for kind, name in [k for k in self._stale if self._present(rendering, *k)]:
            del self._stale[(kind, name)]  # back in use: re-populated by this sync
        deleted = self._delete_stale(start, rendering)
        mode = "full" if full or self._needs_full or self.applied is None else "incremental"
        flushed = 0
        n_chunks = 0
        try:
            if mode == "incremental":
                assert self.applied is not None
                try:
                    p = plan(self.applied, rendering)
                except NeedsFullSync as exc:
                    log.info("nftables: full sync needed: %s", exc)
                    mode = "full"
                else:
                    n_chunks = self._send(p)
                    flushed = len(p.stale)
                    self._mark_stale(p.stale)
                    if not p.units:
                        mode = "noop"
            if mode == "full":
                mode, n_chunks, flushed = self._full(rendering)
        except (NftError, ToolTimeout):
            self._needs_full = True
            self.stats.failures_total += 1
            raise
        except BaseException:
            # Anything else (a bug, an interrupt) may have stopped a plan half sent: trust nothing.
            self._needs_full = True
            raise
        self.applied = rendering
        self._needs_full = False
        return ApplyResult(
            mode=mode,
            operations=self.stats.operations_total - before_ops,
            invocations=self.stats.invocations_total - before_inv,
            chunks=n_chunks,
            stale_flushed=flushed,
            stale_deleted=deleted,
            seconds=self.clock() - start,
        )

    def table_intact(self) -> bool:
        """False when the table is gone or was flushed (its `services` chain lost its rules).

        Read from the terse ruleset listing (`_ours`): `nft -j list chain` fetched every set
        element too, 1.7 s of nft CPU at 10k services x 10 endpoints, every sync period.
        """
        return any("rule" in obj and obj["rule"].get("chain") == SERVICES for obj in self._ours())

    def _ours(self) -> list[dict[str, Any]]:
        """The objects of our table, without set elements.

        `nft -t list table` (and `list chain`) in nft 1.0.6 still fetch every element from the
        kernel, only to leave them out: 2.3-2.5 s at 10k services x 10 endpoints, on the path of
        every restart's first sync. `-t list ruleset FAMILY` fetches none: 0.01 s for the same
        objects (the family's other tables are filtered out here).
        """
        with bounded("nft", None):
            proc = self.run(["nft", "-j", "-t", "list", "ruleset", self.family], check=False, timeout=self.timeout)
        self.stats.listings_total += 1
        if proc.returncode != 0:
            return []
        ours = []
        for obj in _objects(proc.stdout):
            body = next(iter(obj.values()), None) if len(obj) == 1 else None
            if not isinstance(body, dict) or body.get("family", self.family) != self.family:
                continue
            if ("table" in obj and body.get("name") == TABLE) or body.get("table") == TABLE:
                ours.append(obj)
        return ours

    def listing(self) -> dict[str, Any]:
        """Our table without set elements (`nft -t`), or {} if there is none.

        {"chains": {name: rule count}, "sets": {name: {"kind", "dynamic"}}, "objects": {name: kind}}
        """
        ours = self._ours()
        if not any("table" in obj for obj in ours):
            return {}
        out: dict[str, Any] = {"chains": {}, "sets": {}, "objects": {}}
        for obj in ours:
            if "chain" in obj:
                out["chains"].setdefault(obj["chain"]["name"], 0)
            elif "rule" in obj:
                out["chains"][obj["rule"]["chain"]] = out["chains"].get(obj["rule"]["chain"], 0) + 1
            elif "set" in obj or "map" in obj:
                kind = "set" if "set" in obj else "map"
                body = obj[kind]
                out["sets"][body["name"]] = {
                    "kind": kind,
                    "dynamic": "dynamic" in body.get("flags", []) or body["name"] == "affinity",
                }
            elif "ct timeout" in obj or "counter" in obj:
                kind = "ct timeout" if "ct timeout" in obj else "counter"
                out["objects"][obj[kind]["name"]] = kind
        return out

    def cleanup(self) -> bool:
        """Delete our table (`kubeproxy cleanup`). True if there was one."""
        with bounded("nft", None):
            proc = self.run(["nft", "delete", "table", self.family, TABLE], check=False, timeout=self.timeout)
        self.applied = None
        self._needs_full = True
        self._stale.clear()
        return proc.returncode == 0

    # ------------------------------------------------------------------ internals
    def _run_text(self, text: str, *, check: bool = False) -> tuple[int, str]:
        """(return code, error text) of `nft [-c] -f -` fed `text`, in-process when we can."""
        if self.lib is not None and len(text) < self.in_process_max_bytes:
            rc, _, err = self.lib.run_text(text, check=check)
            return rc, err
        # Like iptables-restore's (iptables/apply.py), the bound grows with the input: a cold
        # sync at 50k services is a million lines on a loaded node.
        lines = text.count("\n")
        with bounded("nft", lines):
            proc = self.run(["nft", *(["-c"] if check else []), "-f", "-"], input=text, check=False,
                            timeout=self.timeout + TIMEOUT_PER_LINE * lines)  # fmt: skip
        return proc.returncode, proc.stderr

    def _nft(self, text: str, operations: int) -> None:
        rc, err = self._run_text(text)
        self.stats.invocations_total += 1
        if rc != 0:
            raise NftError(f"nft -f failed: {err.strip()[:2000]}")
        self.stats.operations_total += operations

    def _send(self, p: Plan) -> int:
        spawn = self._spawner(p)
        if spawn is not None:
            return self._stream(p, spawn)
        n = 0
        for text, ops in chunks(p.units, self.table, self.chunk_size):
            self._nft(text, ops)
            n += 1
        return n

    def _spawner(self, p: Plan) -> Spawn | None:
        if self.stream_min_operations is None or p.operations < self.stream_min_operations:
            return None
        return spawner(self.run)

    def _stream(self, p: Plan, spawn: Spawn) -> int:
        """Send the plan's chunks through a pipeline of `nft` processes (see stream.py).

        Chunk k+1 is written to its own process (which parses it as it reads) while chunk k's
        process, its input closed, evaluates and commits. Chunk k+1's input is closed only after
        chunk k's process exited successfully, so the kernel gets the same transactions in the
        same order as `_nft` would send them. If anything fails first (nft refuses chunk k, or
        an exception while a chunk is produced or written), the process still being written
        to is killed with its input open: none of its chunk reaches the kernel.
        """
        committing: list[tuple[NftStream, int]] = []  # input closed: evaluating and committing
        n = 0
        try:
            for text, ops in chunks(p.units, self.table, min(self.chunk_size, self.stream_chunk_size)):
                bound = self.timeout + TIMEOUT_PER_LINE * text.count("\n")
                current = spawn(["-f", STREAM_FILE], bound)
                try:
                    reading = current.write(text)
                    self._wait_streams(committing)
                except BaseException:
                    current.abort()
                    raise
                current.close()
                committing.append((current, ops))
                n += 1
                if not reading:  # it stopped reading (it failed): its error, before anything else
                    self._wait_streams(committing)
            self._wait_streams(committing)
        finally:
            for stream, _ in committing:  # complete chunks whose input was closed: let them end
                with contextlib.suppress(ToolTimeout):  # what ends the sync was raised already
                    stream.wait()
        return n

    def _wait_streams(self, committing: list[tuple[NftStream, int]]) -> None:
        while committing:
            stream, ops = committing.pop(0)
            rc, err = stream.wait()
            self.stats.invocations_total += 1
            if rc != 0:
                raise NftError(f"nft -f failed: {err.strip()[:2000]}")
            self.stats.operations_total += ops

    def _mark_stale(self, names: list[tuple[str, str]]) -> None:
        now = self.clock()
        for key in names:
            self._stale.setdefault(key, now)

    @staticmethod
    def _present(r: NftRendering, kind: str, name: str) -> bool:
        if kind == "chain":
            return name in r.chains
        if kind in ("ct timeout", "counter"):
            return name in r.objects
        return name in r.sets

    def _delete_stale(self, now: float, rendering: NftRendering) -> int:
        due = [k for k, since in self._stale.items() if now - since >= self.stale_delay]
        if not due:
            return 0
        due.sort(key=lambda k: (_DELETE_ORDER[k[0]], k[1]))
        text = "".join(f"delete {kind} {self.table} {name}\n" for kind, name in due)
        try:
            self._nft(text, len(due))
        except (NftError, ToolTimeout) as exc:
            # Still referenced (or already gone, or nft was slow): try again next time; never
            # fail the sync for it.
            log.warning("nftables: could not delete %d stale objects yet: %s", len(due), exc)
            for key in due:
                self._stale[key] = now
            return 0
        for key in due:
            del self._stale[key]
        self.stats.stale_deleted_total += len(due)
        return len(due)

    def check(self, rendering: NftRendering) -> str | None:
        """What nft says of the full sync to `rendering`, checked (`nft -c`) but not applied.

        The text is what the next (full) apply would send, in one transaction; None if nft
        takes it. The kernel's table is not touched, which is what lets the live proxy look
        for the Service a failed sync tripped on while every other rule stays in place.
        """
        existing = self.listing()
        if existing:
            text, _ = self._full_text(rendering, existing)
        else:
            text = "".join(chunk for chunk, _ in chunks(create_plan(rendering).units, self.table, sys.maxsize))
        rc, err = self._run_text(text, check=True)
        self.stats.listings_total += 1
        return None if rc == 0 else f"nft -f failed: {err.strip()[:2000]}"

    def _full(self, rendering: NftRendering) -> tuple[str, int, int]:
        self.stats.full_syncs_total += 1
        existing = self.listing()
        if not existing:
            p = create_plan(rendering)
            n = self._send(p)
            self._base_recreated = True
            self._stale.clear()
            return "create", n, 0
        text, ops = self._full_text(rendering, existing)
        # One transaction: packets never see a half-built table. If nft refuses it, the table
        # stays as it was: it is never deleted to start over, which would take every Service
        # down for the sake of the one the kernel refuses (the live proxy quarantines that one).
        try:
            self._nft(text, ops)
        except NftError as exc:
            # A dynamic set kept for its ClientIP affinity entries may be of another definition
            # (a table left by an older version): replace it too, losing only those entries.
            log.warning("nftables: resync in place failed, trying again without keeping dynamic sets: %s", exc)
            text, ops = self._full_text(rendering, existing, keep_dynamic=False)
            self._nft(text, ops)
        self._base_recreated = True
        gone = [k for k in existing["chains"] if k not in rendering.chains]
        # Sets and objects the rendering lacks were deleted above; only chains wait.
        self._stale = {k: v for k, v in self._stale.items() if k[0] == "chain" and k[1] in gone}
        self._mark_stale([("chain", name) for name in gone])
        return "full", 1, len(gone)

    def _full_text(self, rendering: NftRendering, existing: dict[str, Any], *, keep_dynamic: bool = True) -> tuple[str, int]:
        """One transaction that makes the existing table equal to `rendering`, and its operation count."""
        t = self.table
        lines = [f"add table {t} {{ comment {quote(TABLE_COMMENT)} ; }}"]
        if not self._base_recreated:
            # Hooks and priorities of existing base chains cannot be changed in place.
            for name in sorted({*BASE_CHAINS, *CONNTRACK_CHAINS} & existing["chains"].keys()):
                lines += [f"delete chain {t} {name}"]
        for name in sorted(existing["chains"]):
            if self._base_recreated or (name not in BASE_CHAINS and name not in CONNTRACK_CHAINS):
                lines.append(f"flush chain {t} {name}")
        kept = {n for n, s in existing["sets"].items() if keep_dynamic and s["dynamic"] and n in rendering.sets}
        for name in sorted(existing["sets"]):
            if name not in kept:
                lines.append(f"delete {existing['sets'][name]['kind']} {t} {name}")
        for name in sorted(set(existing["objects"]) - rendering.objects.keys()):
            lines.append(f"delete {existing['objects'][name]} {t} {name}")
        for name in sorted(rendering.objects):
            if name not in existing["objects"]:
                o = rendering.objects[name]
                lines.append(f"add {o.kind} {t} {name}{o.declaration()}")
        for name in sorted(rendering.sets):
            s = rendering.sets[name]
            lines.append(f"add {s.kind} {t} {name}{s.declaration()}")
        for name in sorted(rendering.chains):
            lines.append(f"add chain {t} {name}{rendering.chains[name].declaration()}")
        for name in sorted(rendering.chains):
            lines.extend(f"add rule {t} {name} {r.body()}" for r in rendering.chains[name].rules)
        ops = len(lines)
        for name in sorted(rendering.elements):
            d = rendering.elements[name]
            ops += len(d)
            lines.extend(add_lines(t, name, d, sorted(d)))
        return "\n".join(lines) + "\n", ops


def _objects(text: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return []
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    return [o for o in items if isinstance(o, dict)]


__all__ = ["ApplierStats", "ApplyResult", "NftApplier", "NftError", "render_ops"]
