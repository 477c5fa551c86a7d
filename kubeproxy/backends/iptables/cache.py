"""Memoisation of the iptables renderer: each service port's rules, reused between renders.

`render(view, opts, cache=...)` asks the cache for every service port's `ServiceRules`; the
cache renders only the ports whose service or endpoints changed (by identity first, then by
value), so a partial sync after a small change costs little even at 10k services.

The cache keeps each port's rules without the text of its own chains (`slim`): that text is
90% of a rendering (29 of 32 MiB at 10k services x 10 endpoints) and only the syncs that write
the port's chains need it, which are the port's own changes (rendered anew anyway) and full
syncs (rare: the first, and after a failure, a flush or a Node change). A port written while
its memo is reused is rendered again for that text; the first sync renders every port once.
"""

from __future__ import annotations

import copy
import itertools
import operator
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions

if TYPE_CHECKING:
    from kubeproxy.backends.iptables.render import ServiceRules


class _Memo(NamedTuple):
    svc: ServicePortInfo | None
    endpoints: list[EndpointInfo] | None  # the view's own entry: None when it had none
    rules: ServiceRules | None


_NO_MEMO = _Memo(None, None, None)
_MEMO_SVC, _MEMO_ENDPOINTS, _MEMO_RULES = (operator.attrgetter(f) for f in ("svc", "endpoints", "rules"))
_SERVICE_OF = operator.attrgetter("service")


def slim(rules: ServiceRules) -> ServiceRules:
    """`rules` without the text of the port's own chains (declarations and rules); counts kept."""
    return rules._replace(chain_decls="", chain_text="")


class RenderCache:
    """Each service port's `ServiceRules` from the previous render, to reuse in the next one.

    Memoisation of `_render_service` and nothing else: an entry is reused only for a service
    port whose ServicePortInfo and endpoints are the same objects as last time, or equal to
    them, under equal options and large-cluster mode (a change of either empties the cache).
    Identity is checked first because it is cheap and, for views from a `ViewBuilder`, holds
    for every unchanged port; views are immutable, so the same objects mean the same rules.
    Use one cache per rule set (IP family).

    At 10k service ports a Python loop touching every port costs more than the few renders a
    small change needs, so the bookkeeping works on whole lists, kept in name order.
    """

    # Beyond this many new service ports a fresh sort beats inserting each into the order.
    _INSERTS = 256

    def __init__(self) -> None:
        self._key: tuple[NodeOptions, bool] | None = None
        self._ports: list[ServicePortName] = []  # the last render's service ports, sorted
        self._memos: list[_Memo] = []  # their memos, in the same order
        self.reused = 0  # service ports taken from the cache by the last render
        self.rendered = 0  # service ports the last render computed (new, or their objects changed)
        # Reused service ports the last render wrote, rendered again for their chains' text.
        self.rewritten = 0

    def rules(
        self,
        view: NodeView,
        key: tuple[NodeOptions, bool],
        render_one: Callable[[ServicePortInfo, list[EndpointInfo]], ServiceRules],
        changed: Collection[tuple[str, str]] | None = None,
    ) -> tuple[list[ServicePortName], list[ServiceRules]]:
        """Every service port of `view` in name order, and its rules, rendered where needed.

        key: everything besides the port and its endpoints that the rules depend on.
        changed: (namespace, name) of the services whose own chains this render writes (None:
            all); their ports' rules come with their chains' text, the others' may be `slim`.
        """
        if key != self._key:
            # A private copy, so that options changed in place still invalidate the cache.
            self._key, self._ports, self._memos = copy.deepcopy(key), [], []
        try:
            return self._rules(view, render_one, changed)
        except BaseException:
            # Half-updated bookkeeping must not outlive the failure: start afresh next time.
            self._key, self._ports, self._memos = None, [], []
            raise

    def _rules(
        self,
        view: NodeView,
        render_one: Callable[[ServicePortInfo, list[EndpointInfo]], ServiceRules],
        changed: Collection[tuple[str, str]] | None,
    ) -> tuple[list[ServicePortName], list[ServiceRules]]:
        services, endpoints = view.services, view.endpoints
        ports, memos = self._ports, self._memos
        svcs = list(map(services.get, ports))
        # Not the same service ports as last time? (`None in svcs` would call each one's __eq__.)
        if len(ports) != len(services) or not all(svcs):
            ports, memos = self._realigned(services)
            svcs = list(map(services.__getitem__, ports))
        eps = list(map(endpoints.get, ports))
        memos = list(memos)
        suspects = itertools.compress(
            itertools.count(),
            map(
                operator.or_,
                map(operator.is_not, svcs, map(_MEMO_SVC, memos)),
                map(operator.is_not, eps, map(_MEMO_ENDPOINTS, memos)),
            ),
        )
        fresh: dict[int, ServiceRules] = {}  # index -> rules with their chains' text
        for i in suspects:
            old, svc, e = memos[i], svcs[i], eps[i]
            if old is not _NO_MEMO and old.svc == svc and (old.endpoints or []) == (e or []):
                memos[i] = _Memo(svc, e, old.rules)  # equal values: remember the new objects
            else:
                rules = fresh[i] = render_one(svc, e or [])  # type: ignore[arg-type]  # every port has its svc
                memos[i] = _Memo(svc, e, slim(rules))
        out: list[ServiceRules] = list(map(_MEMO_RULES, memos))
        for i, rules in fresh.items():
            out[i] = rules
        # Ports whose chains this render writes but whose memo is slim: their text again.
        rewritten = 0
        for i in range(len(ports)) if changed is None else _indices_of(ports, changed):
            if i not in fresh:
                out[i] = render_one(svcs[i], eps[i] or [])  # type: ignore[arg-type]  # every port has its svc
                rewritten += 1
        self._ports, self._memos = ports, memos
        self.reused, self.rendered, self.rewritten = len(ports) - len(fresh), len(fresh), rewritten
        return ports, out

    def _realigned(self, services: Mapping[ServicePortName, ServicePortInfo]) -> tuple[list[ServicePortName], list[_Memo]]:
        """The keys of `services` in order, with the memos of those seen last time (_NO_MEMO for new ones)."""
        known = dict(zip(self._ports, self._memos, strict=True))
        added = services.keys() - known.keys()
        if len(added) > self._INSERTS:
            ports = sorted(services)
        else:
            removed = known.keys() - services.keys()
            ports = [p for p in self._ports if p not in removed] if removed else list(self._ports)
            for port in added:
                insort(ports, port)
        return ports, list(map(known.get, ports, itertools.repeat(_NO_MEMO)))


# Below this many changed services per port, finding their ports by bisection beats a scan.
_BISECT_RATIO = 64


def _indices_of(ports: list[ServicePortName], services: Collection[tuple[str, str]]) -> Iterable[int]:
    """The positions in `ports` (sorted) of the ports of `services`, in order.

    A partial sync names a few services out of 10k: bisection finds them without asking each
    of 10k names for its Service (3 ms). Many changed services: one pass over all of them.
    """
    if len(services) * _BISECT_RATIO > len(ports):
        return itertools.compress(itertools.count(), map(services.__contains__, map(_SERVICE_OF, ports)))
    found: list[int] = []
    for namespace, name in services:
        # The service's first port sorts at or after the name with the smallest port and protocol.
        i = bisect_left(ports, ServicePortName(namespace, name, "", ""))
        while i < len(ports) and ports[i].namespace == namespace and ports[i].name == name:
            found.append(i)
            i += 1
    return sorted(found)
