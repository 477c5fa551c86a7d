"""From two renderings to the nft commands that turn one into the other (pure).

A plan is a list of *units*: commands that must reach the kernel in the same transaction (a
chain's flush and its new rules; the delete and re-add of an element whose value changed).
Units are ordered so that every prefix of the plan is a consistent table, which is what lets
the applier cut a large plan into several `nft -f` runs:

  1. new ct timeout objects, sets and maps, chains (their declarations)
  2. rules of new and changed chains (flush + add)
  3. new elements, then changed ones, then removed ones (a moved service gets its new
     selector elements before its service-ips entry points at them, and loses the old ones last)
  4. chains nothing uses any more: flushed now, deleted by the applier in a later sync (map
     elements may have pointed at them, and before kernel 6.2 the kernel notices the last
     reference going only a moment later; upstream waits for the same reason); sets and maps
     nothing uses: deleted now, after the chains whose rules used them were flushed (as upstream
     deletes stale affinity sets); ct timeout objects: deleted later, with their chains.

Phases 1 and 2 form one unit: nft 1.0.6 cannot add a rule that uses an existing `typeof` map
whose data is `ip daddr . th dport` ("conflicting protocols specified: ip vs. th"), so a
selector's rule must be created in the transaction that creates its map. Only elements, which
are nearly all of a large plan, are cut into chunks.

When the new rendering was rendered incrementally from the old one, only what it touched is
compared; otherwise everything is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.backends.nftables.table_objects import ELEMENTS_PER_LINE, TABLE_COMMENT, Element, add_lines, element_lines, quote


class NeedsFullSync(Exception):
    """The change cannot be made in place (a base chain's hook or a set's type changed)."""


class ElementOp(NamedTuple):
    verb: str  # add | delete
    set_name: str
    element: Element


class Batch(NamedTuple):
    """Ready-made lines standing for `weight` operations (a full load's elements)."""

    text: str
    weight: int


Op = str | ElementOp | Batch
Unit = tuple[Op, ...]


def weight(unit: Unit) -> int:
    return sum(op.weight if isinstance(op, Batch) else 1 for op in unit)


@dataclass
class Plan:
    units: list[Unit] = field(default_factory=list)
    # To delete in a later sync: (kind, name) with kind chain | ct timeout.
    stale: list[tuple[str, str]] = field(default_factory=list)

    @property
    def operations(self) -> int:
        return sum(weight(u) for u in self.units)


class _Declared(Protocol):
    """A set, map or ct timeout object: declared once, never altered in place."""

    @property
    def kind(self) -> str: ...

    def declaration(self) -> str: ...


def _declare_new(
    head: list[Op], t: str, names: Iterable[str], old: Mapping[str, _Declared], new: Mapping[str, _Declared]
) -> None:
    """Add to `head` the declaration of each of `names` that `new` has and `old` has not; one whose
    declaration changed needs a full sync (nft cannot alter a set's type or an object in place)."""
    for name in names:
        o, n = old.get(name), new.get(name)
        if n is not None and o is None:
            head.append(f"add {n.kind} {t} {name}{n.declaration()}")
        elif n is not None and o != n:
            raise NeedsFullSync(f"{n.kind} {name} changed")


def plan(old: NftRendering, new: NftRendering) -> Plan:
    """Commands that turn the table `old` describes into `new` (same family)."""
    t = new.table
    p = Plan()
    head: list[Op] = []  # phases 1 and 2: one unit
    if new.derived_from is old.token and new.touched is not None:
        tc = new.touched
        chains: Iterable[str] = tc.chains
        sets: Iterable[str] = tc.sets
        objects: Iterable[str] = tc.objects
        element_sets: dict[str, set[str] | None] = dict(tc.elements)
    else:
        chains = old.chains.keys() | new.chains.keys()
        sets = old.sets.keys() | new.sets.keys()
        objects = old.objects.keys() | new.objects.keys()
        element_sets = dict.fromkeys(old.elements.keys() | new.elements.keys())

    chains, sets, objects = sorted(chains), sorted(sets), sorted(objects)
    _declare_new(head, t, objects, old.objects, new.objects)
    _declare_new(head, t, sets, old.sets, new.sets)
    changed_chains = []
    for name in chains:
        oc, nc = old.chains.get(name), new.chains.get(name)
        if nc is None:
            continue
        if oc is None:
            head.append(f"add chain {t} {name}{nc.declaration()}")
        elif oc.base != nc.base:
            raise NeedsFullSync(f"base chain {name} changed")
        elif oc.comment != nc.comment:
            raise NeedsFullSync(f"chain {name} comment changed")
        if oc is None or oc.rules != nc.rules:
            changed_chains.append((name, oc is not None))
    for name, existed in changed_chains:
        if existed:
            head.append(f"flush chain {t} {name}")
        head.extend(f"add rule {t} {name} {r.body()}" for r in new.chains[name].rules)
    if head:
        p.units.append(tuple(head))

    adds: list[Unit] = []
    changes: list[Unit] = []
    deletes: list[Unit] = []
    for set_name in sorted(element_sets):
        if set_name not in new.sets:
            continue  # the set goes: flushed below, deleted later
        od = old.elements.get(set_name, {})
        nd = new.elements.get(set_name, {})
        keys = element_sets[set_name]
        candidates = sorted(od.keys() | nd.keys()) if keys is None else sorted(keys)
        for key in candidates:
            o_el, n_el = od.get(key), nd.get(key)
            if o_el == n_el:
                continue
            if o_el is None:
                assert n_el is not None
                adds.append((ElementOp("add", set_name, n_el),))
            elif n_el is None:
                deletes.append((ElementOp("delete", set_name, o_el),))
            else:
                changes.append((ElementOp("delete", set_name, o_el), ElementOp("add", set_name, n_el)))
    p.units += adds + changes + deletes

    for name in chains:
        if name in old.chains and name not in new.chains:
            p.units.append((f"flush chain {t} {name}",))
            p.stale.append(("chain", name))
    for name in sets:
        os_ = old.sets.get(name)
        if os_ is not None and name not in new.sets:
            p.units.append((f"delete {os_.kind} {t} {name}",))
    for name in objects:
        if name in old.objects and name not in new.objects:
            p.stale.append((old.objects[name].kind, name))
    return p


def create_plan(new: NftRendering) -> Plan:
    """Commands that build the table from nothing, in the same phases."""
    t = new.table
    p = Plan()
    head: list[Op] = [f"add table {t} {{ comment {quote(TABLE_COMMENT)} ; }}"]
    head.extend(f"add {o.kind} {t} {name}{o.declaration()}" for name, o in sorted(new.objects.items()))
    head.extend(f"add {new.sets[name].kind} {t} {name}{new.sets[name].declaration()}" for name in sorted(new.sets))
    head.extend(f"add chain {t} {name}{new.chains[name].declaration()}" for name in sorted(new.chains))
    for name in sorted(new.chains):
        head.extend(f"add rule {t} {name} {r.body()}" for r in new.chains[name].rules)
    p.units.append(tuple(head))
    for set_name in sorted(new.elements):
        d = new.elements[set_name]
        keys = sorted(d)
        for i in range(0, len(keys), ELEMENTS_PER_LINE):
            part = keys[i : i + ELEMENTS_PER_LINE]
            (line,) = add_lines(t, set_name, d, part)
            p.units.append((Batch(line, len(part)),))
    return p


def chunks(units: Iterable[Unit], table: str, limit: int) -> Iterator[tuple[str, int]]:
    """`nft -f` texts of at most about `limit` operations each (a unit is never split)."""
    batch: list[Op] = []
    size = 0
    for unit in units:
        w = weight(unit)
        if batch and size + w > limit:
            yield render_ops(batch, table), size
            batch, size = [], 0
        batch.extend(unit)
        size += w
    if batch:
        yield render_ops(batch, table), size


def render_ops(ops: list[Op], table: str) -> str:
    """Text for a list of operations; runs of element operations on one set share lines."""
    out: list[str] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if isinstance(op, str):
            out.append(op)
            i += 1
            continue
        if isinstance(op, Batch):
            out.append(op.text)
            i += 1
            continue
        pairs = _replacements(ops, i)
        if pairs:
            # delete k1, add k1, delete k2, add k2, ...: within one transaction the deletes
            # may all come first, so each verb gets a few long lines instead of many short ones.
            out.extend(element_lines("delete", table, op.set_name, (ops[k].element for k in pairs), keys_only=True))  # type: ignore[union-attr]
            out.extend(element_lines("add", table, op.set_name, (ops[k + 1].element for k in pairs)))  # type: ignore[union-attr]
            i = pairs[-1] + 2
            continue
        j = i
        run: list[Element] = []
        while j < len(ops):
            nxt = ops[j]
            if not isinstance(nxt, ElementOp) or nxt.verb != op.verb or nxt.set_name != op.set_name:
                break
            run.append(nxt.element)
            j += 1
        out.extend(element_lines(op.verb, table, op.set_name, run, keys_only=op.verb == "delete"))
        i = j
    return "\n".join(out) + "\n"


def _replacements(ops: list[Op], i: int) -> list[int]:
    """Start indexes of consecutive (delete k, add k) pairs on one set, from i on (at least two)."""
    out: list[int] = []
    first = ops[i]
    assert isinstance(first, ElementOp)
    while i + 1 < len(ops):
        d, a = ops[i], ops[i + 1]
        if not (
            isinstance(d, ElementOp)
            and isinstance(a, ElementOp)
            and d.verb == "delete"
            and a.verb == "add"
            and d.set_name == first.set_name
            and a.set_name == first.set_name
            and d.element.key == a.element.key
        ):
            break
        out.append(i)
        i += 2
    return out if len(out) >= 2 else []
