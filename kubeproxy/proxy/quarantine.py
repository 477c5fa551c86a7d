"""Quarantine: a Service the kernel refuses is set aside, and every other Service stays in sync.

Upstream kube-proxy retries a failed sync forever, so one object whose rules the kernel refuses
(an nft set that will not take its ranges, a comment that is too long) freezes every change on
the node, and in nftables mode can cost the whole table. Here a failed sync is narrowed down to
the Services that cause it:

- `isolate` finds them by bisection over the candidates (the Services the failed sync changed;
  all of them after a failed full sync), asking the backend to *check* a rule set without
  applying it (`nft -c`, `iptables-restore --test`), so the kernel keeps what it had meanwhile;
- `Quarantine` holds them with the kernel's message. A held Service keeps the rules of its last
  version that the kernel accepted (or none, if it never had one), so the node never has fewer
  working rules than before the bad change; it is tried again as soon as its objects change
  (fixed, or deleted);
- a tool that ran out of time (`ToolTimeout`) refused nothing: it is never bisected on, which
  would only run the slow tool again and again; the sync fails and the live loop retries it.

`isolate` and `substitute` are pure logic over a `passes` callable and views;
`Quarantine.program` runs them with a backend's check and sync (in the live loop's worker thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from kubeproxy.model.contract import SyncError, ToolTimeout
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServiceKey, ServicePortInfo, ServicePortName
from kubeproxy.runtime.logs import kv

if TYPE_CHECKING:
    from kubeproxy.model.changes import Changes
    from kubeproxy.model.contract import Backend, SyncReport
    from kubeproxy.model.options import NodeOptions

log = logging.getLogger("kubeproxy.proxy")

K = TypeVar("K", bound=Hashable)


def isolate(candidates: Sequence[K], passes: Callable[[frozenset[K]], bool]) -> list[K] | None:
    """The candidates to set aside so that `passes(set_aside)` holds, found by bisection.

    `passes(S)` answers whether the rule set without (or with the last good version of) the
    candidates in S is accepted. Returns None when even setting every candidate aside fails:
    the fault is elsewhere (the kernel, the tool, another program's rules). Otherwise the
    candidates are put back half by half, and a half that makes the check fail is split until
    single culprits remain: at most 2 + 2·log2(n) checks for one culprit among n.
    """
    aside = frozenset(candidates)
    if not passes(aside):
        return None
    culprits: list[K] = []

    def put_back(group: Sequence[K], known_to_fail: bool = False) -> bool:
        """Put `group` back where the check allows; True if it holds a culprit."""
        nonlocal aside
        if not known_to_fail:
            trial = aside - frozenset(group)
            if passes(trial):
                aside = trial
                return False
        if len(group) == 1:
            culprits.append(group[0])
            return True
        half = len(group) // 2
        first_has_one = put_back(group[:half])
        # The whole group failed: if its first half went back cleanly, the second must fail.
        put_back(group[half:], known_to_fail=not first_has_one)
        return True

    if candidates:
        put_back(list(candidates))
    return culprits


@dataclass(frozen=True)
class Held:
    """One quarantined Service: why, and the rules of its last accepted version."""

    reason: str
    services: dict[ServicePortName, ServicePortInfo]
    endpoints: dict[ServicePortName, list[EndpointInfo]]

    @classmethod
    def of(cls, key: ServiceKey, reason: str, last_good: NodeView | None) -> Held:
        """`key` as `last_good` (the view the kernel last accepted) had it; empty if it had none."""
        if last_good is None:
            return cls(reason, {}, {})
        ports = last_good.ports_of(key)
        return cls(
            reason,
            {n: last_good.services[n] for n in ports if n in last_good.services},
            {n: last_good.endpoints[n] for n in ports if n in last_good.endpoints},
        )


@dataclass
class Quarantine:
    """One family's Services set aside by `isolate`, keyed by (namespace, name), and the view
    the kernel last accepted."""

    held: dict[ServiceKey, Held] = field(default_factory=dict)
    last_good: NodeView | None = None
    # Refusals `program` worked around, each a failed restore for the metrics: counted by the
    # event loop (`take_refusals`), not by the worker thread that met them.
    refusals: list[SyncError] = field(default_factory=list)

    def __contains__(self, key: object) -> bool:
        return key in self.held

    def __len__(self) -> int:
        return len(self.held)

    def names(self) -> list[str]:
        return [f"{ns}/{name}" for ns, name in sorted(self.held)]

    def hold(self, key: ServiceKey, reason: str, last_good: NodeView | None) -> None:
        """Set `key` aside; its version in `last_good` (the view the kernel last accepted) stays."""
        self.held[key] = Held.of(key, reason, last_good)

    def release(self, changed: Iterable[ServiceKey]) -> list[ServiceKey]:
        """Services whose objects changed leave quarantine: the next sync tries them again."""
        out = [key for key in changed if key in self.held]
        for key in out:
            del self.held[key]
        return out

    def apply(self, view: NodeView, keys: Collection[ServiceKey] | None = None) -> NodeView:
        """`view` with the held Services (or only `keys`) replaced by their last accepted version."""
        keys = self.held.keys() if keys is None else keys
        if not keys:
            return view
        return substitute(view, {key: self.held.get(key) for key in keys})

    def take_refusals(self) -> list[SyncError]:
        refusals, self.refusals = self.refusals, []
        return refusals

    def program(self, backend: Backend, view: NodeView, opts: NodeOptions, changes: Changes) -> tuple[SyncReport, NodeView]:
        """Program `view` through `backend`; if the kernel refuses it, hold the Services it
        refuses and program the rest.

        Returns the report and the view actually programmed (held Services as the kernel last
        accepted them). Raises the kernel's error when no Service is to blame (the check fails
        even with every candidate set aside), and a ToolTimeout as it comes.
        """
        programmed = self.apply(view)
        try:
            report = backend.sync(programmed, opts, changes.changed_services)
        except ToolTimeout:
            raise
        except SyncError as exc:
            refused = exc
        else:
            self.last_good = programmed
            return report, programmed
        # A failed partial sync names its suspects; after a failed full sync every Service is one.
        suspects = [key for key in sorted(view.by_service if changes.full else changes.services) if key not in self]
        last_good = self.last_good
        log.warning(kv("Rules refused, looking for the services that cause it", suspects=len(suspects), err=refused))

        def passes(aside: frozenset[ServiceKey]) -> bool:
            trial = substitute(programmed, {key: Held.of(key, "", last_good) for key in aside})
            return backend.check(trial, opts) is None

        try:
            culprits = isolate(suspects, passes)
        except ToolTimeout:
            self.refusals.append(refused)  # a failed restore all the same, counted with the timeout
            raise
        if not culprits:
            raise refused
        self.refusals.append(refused)
        reason = str(refused).strip()
        for key in culprits:
            self.hold(key, reason, last_good)
            log.warning(
                kv(
                    "Service quarantined: the kernel refuses its rules; it keeps its last accepted rules until it changes",
                    service=f"{key[0]}/{key[1]}",
                    ipFamily=opts.family,
                    err=reason,
                )
            )
        programmed = self.apply(view)
        report = backend.sync(programmed, opts, None)
        self.last_good = programmed
        return report, programmed


def substitute(view: NodeView, replacements: dict[ServiceKey, Held | None]) -> NodeView:
    """`view` with each Service in `replacements` replaced (None: left out)."""
    services = dict(view.services)
    endpoints = dict(view.endpoints)
    for key in replacements:
        for name in view.ports_of(key):
            services.pop(name, None)
            endpoints.pop(name, None)
    for held in replacements.values():
        if held is not None:
            services.update(held.services)
            endpoints.update(held.endpoints)
    return NodeView(services, endpoints)
