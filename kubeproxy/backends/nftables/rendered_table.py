"""The result of a render: every object of our table, plus what an incremental render needs.

A rendering is built from *fragments*, one per service port: the elements it puts in shared sets
and maps, the per-service chains it owns (few services have any) and the shared objects it needs
(for example the selector chain and map for "Cluster policy, 3 endpoints"). Shared objects are
reference counted; an element key claimed by several fragments (a cluster IP with two ports, a
pod behind two services) stays while any claim remains.

An incremental render starts from the previous rendering, takes back the fragments of changed
services and adds their new ones. A rendering keeps no fragment: only what each was made from
(the view's ServicePortInfo and endpoint list, shared with the view), and takes one back by
making it again from those (the same options, so the same fragment), so that the fragments'
tuples are not held twice. It copies only the dictionaries it writes to and records what it
touched, so that the applier's diff looks at those keys only: a one-endpoint change costs a few
keys, not a walk over every element of the table. The bookkeeping (claims and
reference counts) moves to the new rendering; a rendering whose bookkeeping has moved on can
still be printed and applied, but the next incremental render must start from the newest one
(otherwise the renderer falls back to a full render, which is always correct).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from copy import copy
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubeproxy.backends.nftables.table_objects import (
    TABLE,
    TABLE_COMMENT,
    Chain,
    Element,
    ElementMap,
    NftObject,
    NftSet,
    Packed,
    add_lines,
    quote,
    unpack,
)
from kubeproxy.cluster.twins import twin_of
from kubeproxy.model.node_model import EndpointInfo, ServicePortInfo, ServicePortName

K = TypeVar("K")
V = TypeVar("V")
_GONE: Any = object()  # an overlay's mark for a key deleted from its base
COMPACT_MIN = 4096  # an overlay this large (and a quarter of its base) is folded into a new base


class OverlayMap(Mapping[K, V], Generic[K, V]):
    """A mapping that is a read-only `base` plus a small `overlay` of changes (`_GONE`: deleted).

    An incremental render writes a few keys of maps that hold an element per endpoint (the
    selector maps) and must leave its parent's maps as they were: copying each map it writes
    to would cost in proportion to the cluster, not to the change. A child copies only the parent's overlay;
    once the overlay outgrows a quarter of the base (and COMPACT_MIN keys) it is
    folded into a fresh base, so reads stay two dict lookups and the copies stay small.
    The base is never written to: every rendering that shares it sees the same entries.
    """

    __slots__ = ("_len", "base", "overlay")

    def __init__(self, base: Mapping[K, V], overlay: dict[K, V] | None = None, length: int | None = None) -> None:
        self.base = base
        self.overlay: dict[K, V] = overlay if overlay is not None else {}
        self._len = len(base) if length is None else length

    @classmethod
    def over(cls, parent: Mapping[K, V]) -> OverlayMap[K, V]:
        """A writable child of `parent` (which stays as it is)."""
        if isinstance(parent, OverlayMap):
            if len(parent.overlay) > max(COMPACT_MIN, len(parent.base) // 4):
                # A dict's copy in C (an ElementMap's too: its packed dict), then the overlay.
                merged: MutableMapping[K, V] = copy(parent.base)  # type: ignore[arg-type]  # bases are dicts or ElementMaps
                for key, value in parent.overlay.items():
                    if value is _GONE:
                        del merged[key]
                    else:
                        merged[key] = value
                return cls(merged)
            return cls(parent.base, dict(parent.overlay), parent._len)
        return cls(parent)

    def __getitem__(self, key: K) -> V:
        overlay = self.overlay
        if key in overlay:
            value = overlay[key]
            if value is _GONE:
                raise KeyError(key)
            return value
        return self.base[key]

    def get(self, key: K, default: Any = None) -> Any:
        value = self.overlay.get(key, _GONE) if key in self.overlay else self.base.get(key, _GONE)
        return default if value is _GONE else value

    def __contains__(self, key: object) -> bool:
        if key in self.overlay:
            return self.overlay[key] is not _GONE
        return key in self.base

    def __iter__(self) -> Iterator[K]:
        overlay = self.overlay
        for key in self.base:
            if key not in overlay:
                yield key
        for key, value in overlay.items():
            if value is not _GONE:
                yield key

    def __len__(self) -> int:
        return self._len

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:
            self._len += 1
        self.overlay[key] = value

    def pop(self, key: K, default: Any = None) -> Any:
        if key not in self:
            return default
        value = self[key]
        self._len -= 1
        if key in self.base:
            self.overlay[key] = _GONE
        else:
            del self.overlay[key]
        return value


# What a fragment is made from: one service port and its endpoints, as the view had them.
FragmentSource = tuple[ServicePortInfo, Sequence[EndpointInfo]]


@dataclass(frozen=True, slots=True)
class Fragment:
    """What one service port contributes to the table."""

    service: str  # "namespace/name", for warnings
    # per set or map name: its keys and, in the same order, its elements packed (model.Packed)
    elements: tuple[tuple[str, tuple[str, ...], tuple[Packed, ...]], ...] = ()
    chains: tuple[Chain, ...] = ()  # chains only this service port uses (affinity services)
    shared: tuple[Hashable, ...] = ()  # keys of shared objects it needs
    warning: str | None = None
    no_local_internal: bool = False
    no_local_external: bool = False


def _fragment_maker() -> Callable[..., Fragment]:
    """`Fragment(<its fields, in order>)` without the frozen __init__'s `object.__setattr__` per
    field (a full render makes one per service port): a twin class with the same slots is
    filled by plain stores, then made a Fragment by `__class__` assignment, which CPython allows
    only when the two layouts are the same (as model/node_model.py builds the view)."""
    fields = ("service", "elements", "chains", "shared", "warning", "no_local_internal", "no_local_external")
    if tuple(Fragment.__dataclass_fields__) != fields:
        raise TypeError("Fragment's fields changed order: _fragment_maker takes them in order")
    twin = twin_of(Fragment, fields)
    new = object.__new__

    def make(
        service: str,
        elements: tuple[tuple[str, tuple[str, ...], tuple[Packed, ...]], ...],
        chains: tuple[Chain, ...],
        shared: tuple[Hashable, ...],
        warning: str | None,
        no_local_internal: bool,
        no_local_external: bool,
    ) -> Fragment:
        frag: Any = new(twin)  # typed as what it becomes below
        frag.service = service
        frag.elements = elements
        frag.chains = chains
        frag.shared = shared
        frag.warning = warning
        frag.no_local_internal = no_local_internal
        frag.no_local_external = no_local_external
        frag.__class__ = Fragment
        made: Fragment = frag
        return made

    make("", (), (), (), None, False, False)  # a TypeError here, at import, if the layouts ever differ
    return make


new_fragment = _fragment_maker()


@dataclass(frozen=True, slots=True)
class SharedObjects:
    """What a shared key expands to."""

    chains: tuple[Chain, ...] = ()
    sets: tuple[NftSet, ...] = ()
    objects: tuple[NftObject, ...] = ()


@dataclass
class Touched:
    """Names and keys an incremental render may have changed relative to its parent."""

    chains: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)
    elements: dict[str, set[str]] = field(default_factory=dict)


def _rank(e: Element) -> tuple[str, str]:
    return (e.value or "", e.comment or "")


class ElementClaims:
    """Which elements fragments claim, per (set, key). The effective element is the lowest-ranked
    distinct claim, so the result depends only on what is claimed, never on the order of claims.

    Nearly every key has one claim, and then the claim is the element the rendering holds: the
    rendering's own element dict (`d` below, read only here) is the record of it, with no copy
    (a full render makes a claim per element; a second dict of them would double that). Kept
    aside are only repeated claims of the same element (counted) and distinct values for one
    key (two services claiming the same external IP and port: `_many`, whose effective element
    is also the one in `d`).
    """

    def __init__(self) -> None:
        self._count: dict[tuple[str, str], int] = {}  # claims of that same element, when 2 or more
        self._many: dict[tuple[str, str], dict[Element, int]] = {}

    @property
    def shared(self) -> bool:
        """Whether any key has more than one distinct claim."""
        return bool(self._many)

    def add(self, d: Mapping[str, Element], set_name: str, e: Element) -> tuple[Element | None, Element]:
        """Claim e, given the set's elements as they stand; returns (effective before, effective
        after). The caller writes `after` into the set when the two differ."""
        k = e.key
        tk = (set_name, k)
        if self._many:
            many = self._many.get(tk)
            if many is not None:
                before = min(many, key=_rank)
                many[e] = many.get(e, 0) + 1
                return before, min(many, key=_rank)
        cur = d.get(k)
        if cur is None:
            return None, e
        if cur == e:
            self._count[tk] = self._count.get(tk, 1) + 1
            return e, e
        self._many[tk] = {cur: self._count.pop(tk, 1), e: 1}
        return cur, min(cur, e, key=_rank)

    def remove(self, d: Mapping[str, Element], set_name: str, e: Element) -> tuple[Element, Element | None]:
        """Drop one claim of e (see `add`); returns (effective before, effective after)."""
        k = e.key
        tk = (set_name, k)
        if self._many:
            many = self._many.get(tk)
            if many is not None:
                before = min(many, key=_rank)
                n = many[e] - 1
                if n:
                    many[e] = n
                else:
                    del many[e]
                if len(many) == 1:
                    ((only, count),) = many.items()
                    del self._many[tk]
                    if count > 1:
                        self._count[tk] = count
                    return before, only
                return before, min(many, key=_rank)
        cur = d[k]
        if self._count:
            n = self._count.get(tk, 0)
            if n:
                if n > 2:
                    self._count[tk] = n - 1
                else:
                    del self._count[tk]
                return cur, cur
        return cur, None


@dataclass
class IncrementalState:
    """Bookkeeping that lets the next render be incremental; owned by one rendering at a time."""

    options: Any  # what the base objects and shared expansions depend on: renders must agree
    claims: ElementClaims = field(default_factory=ElementClaims)
    refs: Counter[Hashable] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    no_local_internal: int = 0
    no_local_external: int = 0
    owner: object | None = None
    # The service ports of each Service among the sources: made by the first incremental render
    # (one walk), kept up to date from then on, so that later ones find a Service's old ports
    # without walking every source. Tuples, not sets: nearly every Service has one port, and a
    # set of one is several times the size of a tuple of one.
    ports: dict[tuple[str, str], tuple[ServicePortName, ...]] | None = None

    def ports_of(
        self, sources: Mapping[ServicePortName, FragmentSource], service: tuple[str, str]
    ) -> tuple[ServicePortName, ...]:
        if self.ports is None:
            self.ports = index_ports(sources)
        return self.ports.get(service, ())

    def add_port(self, spn: ServicePortName) -> None:
        """Record `spn` among its Service's ports (once), if the index is kept."""
        if self.ports is not None:
            known = self.ports.get(spn.service, ())
            if spn not in known:
                self.ports[spn.service] = (*known, spn)

    def drop_port(self, spn: ServicePortName) -> None:
        if self.ports is not None:
            known = self.ports.get(spn.service)
            if known is not None and spn in known:
                rest = tuple([n for n in known if n != spn])
                if rest:
                    self.ports[spn.service] = rest
                else:
                    del self.ports[spn.service]


def index_ports(names: Iterable[ServicePortName]) -> dict[tuple[str, str], tuple[ServicePortName, ...]]:
    """`names` by Service, each Service's in the order met (see `IncrementalState.ports`)."""
    grouped: dict[tuple[str, str], list[ServicePortName]] = {}
    for spn in names:
        grouped.setdefault(spn.service, []).append(spn)
    return {key: tuple(spns) for key, spns in grouped.items()}


@dataclass(frozen=True, eq=False)
class NftRendering:
    """One IP family's complete table, as objects. `text()` is its `nft -f` input."""

    family: str  # "ip" or "ip6": the nftables family and so the table `ip kube-proxy`
    chains: Mapping[str, Chain]
    sets: Mapping[str, NftSet]
    elements: Mapping[str, Mapping[str, Element]]
    objects: Mapping[str, NftObject]
    sources: Mapping[ServicePortName, FragmentSource]  # what each service port's fragment was made from
    warnings: tuple[str, ...]
    no_local_endpoints_internal: int
    no_local_endpoints_external: int
    full: bool  # a full render (no parent)
    token: object = field(default_factory=object, repr=False)
    derived_from: object | None = field(default=None, repr=False)  # the parent's token
    touched: Touched | None = field(default=None, repr=False)
    book: IncrementalState | None = field(default=None, repr=False)

    @property
    def table(self) -> str:
        return f"{self.family} {TABLE}"

    def rule_count(self) -> int:
        return sum(len(c.rules) for c in self.chains.values())

    def element_count(self) -> int:
        return sum(len(e) for e in self.elements.values())

    def lines(self) -> Iterator[str]:
        """`nft -f` input that creates the whole table from nothing."""
        t = self.table
        yield f"add table {t} {{ comment {quote(TABLE_COMMENT)} ; }}"
        for name in sorted(self.objects):
            yield f"add {self.objects[name].kind} {t} {name}{self.objects[name].declaration()}"
        for name in sorted(self.sets):
            s = self.sets[name]
            yield f"add {s.kind} {t} {name}{s.declaration()}"
        for name in sorted(self.chains):
            yield f"add chain {t} {name}{self.chains[name].declaration()}"
        for name in sorted(self.chains):
            for rule in self.chains[name].rules:
                yield f"add rule {t} {name} {rule.body()}"
        for name in sorted(self.elements):
            elements = self.elements[name]
            yield from add_lines(t, name, elements, sorted(elements))

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"


class Builder:
    """Assembles a rendering, copying the parent's dictionaries only where it writes."""

    def __init__(
        self,
        family: str,
        book: IncrementalState,
        parent: NftRendering | None,
        expand: Callable[[Hashable], SharedObjects],
        remake: Callable[[FragmentSource], Fragment],
    ):
        self.family = family
        self.book = book
        self.parent = parent
        self.expand = expand
        self.remake = remake  # a fragment again from its source, for remove_fragment
        self.touched = Touched() if parent is not None else None
        self.chains: dict[str, Chain] = dict(parent.chains) if parent else {}
        self.sets: dict[str, NftSet] = dict(parent.sets) if parent else {}
        self.objects: dict[str, NftObject] = dict(parent.objects) if parent else {}
        self.elements: dict[str, Mapping[str, Element]] = dict(parent.elements) if parent else {}
        # A full render owns plain dicts; an incremental one layers its few changes over its
        # parent's (see OverlayMap), which it leaves as they were.
        self.sources: dict[ServicePortName, FragmentSource] | OverlayMap[ServicePortName, FragmentSource] = (
            OverlayMap.over(parent.sources) if parent else {}
        )
        self._own: set[str] = set()  # element dicts already copied for this rendering

    # ----------------------------------------------------------------- plain objects
    def put_chain(self, chain: Chain) -> None:
        self._put(self.chains, chain.name, chain, self.touched.chains if self.touched else None)

    def drop_chain(self, name: str) -> None:
        self._put(self.chains, name, None, self.touched.chains if self.touched else None)

    def put_set(self, s: NftSet) -> None:
        self._put(self.sets, s.name, s, self.touched.sets if self.touched else None)

    def drop_set(self, name: str) -> None:
        self._put(self.sets, name, None, self.touched.sets if self.touched else None)
        self.elements.pop(name, None)
        self._own.discard(name)

    def put_object(self, o: NftObject) -> None:
        self._put(self.objects, o.name, o, self.touched.objects if self.touched else None)

    def drop_object(self, name: str) -> None:
        self._put(self.objects, name, None, self.touched.objects if self.touched else None)

    @staticmethod
    def _put(named: dict[str, V], name: str, value: V | None, touched: set[str] | None) -> None:
        """Store `value` under `name` (None: remove it), and note the name for the diff."""
        if value is None:
            named.pop(name, None)
        else:
            named[name] = value
        if touched is not None:
            touched.add(name)

    def set_element(self, set_name: str, key: str, e: Element | None) -> None:
        d = self.elements.get(set_name)
        if set_name not in self._own or d is None:
            d = OverlayMap.over(d) if d is not None else ElementMap()
            self.elements[set_name] = d
            self._own.add(set_name)
        assert isinstance(d, (ElementMap, OverlayMap))
        if e is None:
            d.pop(key, None)
        else:
            d[key] = e
        if self.touched is not None:
            self.touched.elements.setdefault(set_name, set()).add(key)

    # ----------------------------------------------------------------- fragments
    def add_fragment(self, spn: ServicePortName, frag: Fragment, source: FragmentSource) -> None:
        """Add `frag`, which `remake(source)` gives again when it is removed."""
        self.sources[spn] = source
        book = self.book
        book.add_port(spn)
        for key in frag.shared:
            if book.refs[key] == 0:
                objs = self.expand(key)
                for o in objs.objects:
                    self.put_object(o)
                for s in objs.sets:
                    self.put_set(s)
                for c in objs.chains:
                    self.put_chain(c)
            book.refs[key] += 1
        claims = book.claims
        empty: dict[str, Element] = {}
        for set_name, keys, packed in frag.elements:
            if self.parent is None and not claims.shared:
                self._add_fresh(set_name, keys, packed)
                continue
            for key, p in zip(keys, packed, strict=True):
                e = unpack(key, p)
                before, after = claims.add(self.elements.get(set_name, empty), set_name, e)
                if before != after:
                    self.set_element(set_name, key, after)
        for c in frag.chains:
            self.put_chain(c)
        if frag.warning:
            book.warnings[frag.warning] += 1
        book.no_local_internal += frag.no_local_internal
        book.no_local_external += frag.no_local_external

    def _add_fresh(self, set_name: str, keys: tuple[str, ...], packed: tuple[Packed, ...]) -> None:
        """add_fragment's inner loop for a full render: the same as claims.add + set_element,
        without two calls per element (this loop runs once per element of the table), and
        without unpacking: the set's dictionary takes the packed elements as they come."""
        out = self.elements.get(set_name)
        if out is None:
            out = self.elements[set_name] = ElementMap()
            self._own.add(set_name)
        assert isinstance(out, ElementMap)
        raw = out.raw
        if len(keys) > 1:
            # Keys new to the set and distinct among themselves (nearly always): claimed in one go.
            batch = dict(zip(keys, packed, strict=True))
            if len(batch) == len(keys) and raw.keys().isdisjoint(batch):
                raw.update(batch)
                return
        claims = self.book.claims
        for k, p in zip(keys, packed, strict=True):
            if k in raw:
                before, after = claims.add(out, set_name, unpack(k, p))
                if before != after:
                    self.set_element(set_name, k, after)
            else:
                raw[k] = p

    def remove_fragment(self, spn: ServicePortName) -> None:
        frag = self.remake(self.sources.pop(spn))
        book = self.book
        book.drop_port(spn)
        for c in frag.chains:
            self.drop_chain(c.name)
        claims = book.claims
        for set_name, keys, packed in frag.elements:
            d = self.elements[set_name]
            for k, p in zip(keys, packed, strict=True):
                before, after = claims.remove(d, set_name, unpack(k, p))
                if before != after:
                    self.set_element(set_name, k, after)
                    d = self.elements[set_name]  # set_element may have made the set this rendering's own
        for key in frag.shared:
            book.refs[key] -= 1
            if book.refs[key] == 0:
                del book.refs[key]
                objs = self.expand(key)
                for c in objs.chains:
                    self.drop_chain(c.name)
                for s in objs.sets:
                    self.drop_set(s.name)
                for o in objs.objects:
                    self.drop_object(o.name)
        if frag.warning:
            book.warnings[frag.warning] -= 1
            if not book.warnings[frag.warning]:
                del book.warnings[frag.warning]
        book.no_local_internal -= frag.no_local_internal
        book.no_local_external -= frag.no_local_external

    def build(self) -> NftRendering:
        token = object()
        self.book.owner = token
        return NftRendering(
            family=self.family,
            chains=self.chains,
            sets=self.sets,
            elements=self.elements,
            objects=self.objects,
            sources=self.sources,
            warnings=tuple(sorted(self.book.warnings)),
            no_local_endpoints_internal=self.book.no_local_internal,
            no_local_endpoints_external=self.book.no_local_external,
            full=self.parent is None,
            token=token,
            derived_from=self.parent.token if self.parent is not None else None,
            touched=self.touched,
            book=self.book,
        )
