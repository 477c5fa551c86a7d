"""A small typed model of what we put in an nftables table, and its `nft -f` text.

Objects are identified by name (chains, sets and maps, ct timeout objects) or by set name and
key (elements); the applier diffs two renderings object by object. Text follows knftables'
style (`add rule ip kube-proxy CHAIN ...`), which is what upstream's tests print.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView, Mapping, MutableMapping
from dataclasses import dataclass
from itertools import islice
from typing import ClassVar, NamedTuple

from kubeproxy.kernel.kernel_text import nft_quoted

TABLE = "kube-proxy"
TABLE_COMMENT = "rules for kube-proxy"
# Elements per `add element` line: keeps lines (and nft's parser buffers) bounded.
ELEMENTS_PER_LINE = 1000


@dataclass(frozen=True, slots=True)
class BaseHook:
    """What makes a chain a base chain: its type, netfilter hook and priority."""

    type: str  # filter | nat
    hook: str  # prerouting | input | forward | output | postrouting
    priority: int


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    comment: str | None = None

    def body(self) -> str:
        return self.text + (f" comment {quote(self.comment)}" if self.comment else "")


@dataclass(frozen=True, slots=True)
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()
    base: BaseHook | None = None
    comment: str | None = None

    def declaration(self) -> str:
        """What `add chain` takes after the name (without the rules)."""
        parts = []
        if self.base is not None:
            parts.append(f"type {self.base.type} hook {self.base.hook} priority {self.base.priority} ;")
        if self.comment:
            parts.append(f"comment {quote(self.comment)} ;")
        return " { " + " ".join(parts) + " }" if parts else ""


@dataclass(frozen=True, slots=True)
class NftSet:
    """A named set or map. `type` is the text after `type`/`typeof` (with `: data` for maps)."""

    name: str
    kind: str  # "set" | "map"
    type: str
    typeof: bool = False
    flags: tuple[str, ...] = ()
    size: int | None = None
    comment: str | None = None

    @property
    def dynamic(self) -> bool:
        """Filled by the packet path (`update @set`): never flushed by a resync."""
        return "dynamic" in self.flags

    def declaration(self) -> str:
        parts = [f"{'typeof' if self.typeof else 'type'} {self.type} ;"]
        if self.flags:
            parts.append(f"flags {','.join(self.flags)} ;")
        if self.size is not None:
            parts.append(f"size {self.size} ;")
        if self.comment:
            parts.append(f"comment {quote(self.comment)} ;")
        return " { " + " ".join(parts) + " }"


class Element(NamedTuple):
    """A set or map element. A tuple, not a dataclass: a 10k-service table has 200k of them."""

    key: str
    value: str | None = None
    comment: str | None = None

    def text(self) -> str:
        out = self.key
        if self.comment:
            out += f" comment {quote(self.comment)}"
        if self.value is not None:
            out += f" : {self.value}"
        return out


# An element as a set's dictionary holds it (its key is the dictionary's key): "" for a key
# alone, its value for a map element without a comment, else the Element itself. A 10k-service
# table has 120k elements and nearly all are map elements whose value text is shared (one
# `ip . port` per endpoint): a tuple for each was 7.7 MiB.
Packed = str | Element
NO_VALUE = ""  # never a map value: nft's grammar has no empty value


def pack(value: str | None, comment: str | None) -> Packed:
    if comment:
        return Element("", value, comment)  # the key is the dictionary's: not kept twice
    return NO_VALUE if value is None else value


def unpack(key: str, packed: Packed) -> Element:
    if type(packed) is str:
        return Element(key, packed or None)
    assert isinstance(packed, Element)
    return Element(key, packed.value, packed.comment)


class ElementMap(MutableMapping[str, Element]):
    """One set's elements by key, held packed (see `Packed`); reads give Elements."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Packed] | None = None) -> None:
        self.raw: dict[str, Packed] = {} if raw is None else raw

    def __getitem__(self, key: str) -> Element:
        return unpack(key, self.raw[key])

    def get(self, key: str, default: Element | None = None) -> Element | None:  # type: ignore[override]
        packed = self.raw.get(key)
        return default if packed is None else unpack(key, packed)

    def __setitem__(self, key: str, e: Element) -> None:
        self.raw[key] = pack(e.value, e.comment)

    def __delitem__(self, key: str) -> None:
        del self.raw[key]

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def keys(self) -> KeysView[str]:
        return self.raw.keys()  # the dict's own view: isdisjoint and set operations in C

    def __copy__(self) -> ElementMap:
        return ElementMap(self.raw.copy())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ElementMap):
            return self.raw == other.raw
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable


@dataclass(frozen=True, slots=True)
class CtTimeout:
    """An nftables `ct timeout` object: conntrack timeouts for the flows a rule assigns it to."""

    name: str
    protocol: str
    l3proto: str
    policy: tuple[tuple[str, int], ...]
    kind: ClassVar[str] = "ct timeout"  # as `nft add` names it, beside a set's "set" or "map"

    def declaration(self) -> str:
        policy = ", ".join(f"{state} : {seconds}" for state, seconds in self.policy)
        return f" {{ protocol {self.protocol} ; l3proto {self.l3proto} ; policy = {{ {policy} }} ; }}"


@dataclass(frozen=True, slots=True)
class NftCounter:
    """A named nftables `counter`: rules count into it by name, and a scrape reads it by name."""

    name: str
    kind: ClassVar[str] = "counter"

    def declaration(self) -> str:
        return ""


# Stateful objects of the table, by name: their names never collide (ours are distinct by prefix).
NftObject = CtTimeout | NftCounter


def quote(text: str) -> str:
    """Every comment we write goes through here (kernel_text: no quote or newline, ≤ 128 bytes)."""
    return nft_quoted(text)


def element_lines(
    verb: str, prefix: str, set_name: str, elements: Iterable[Element], *, keys_only: bool = False
) -> Iterator[str]:
    """`add element` / `delete element` lines for one set, ELEMENTS_PER_LINE at a time."""
    if keys_only:
        return _lines(verb, prefix, set_name, (element[0] for element in elements))
    return _lines(verb, prefix, set_name, map(Element.text, elements))


def add_lines(prefix: str, set_name: str, d: Mapping[str, Element], keys: Iterable[str]) -> Iterator[str]:
    """`add element` lines for `keys` of the set `d`, as element_lines writes them; read straight
    from an ElementMap's packed form (a full table's 120k elements, each unpacked, were 50 ms)."""
    if not isinstance(d, ElementMap):
        return element_lines("add", prefix, set_name, map(d.__getitem__, keys))
    raw = d.raw
    # Element.text() of the unpacked element, written without unpacking it: a 10k-Service table
    # has 120k elements, 20k of them with a comment.
    texts = (
        (f"{key} : {p}" if p else key)
        if isinstance(p := raw[key], str)
        else f"{key} comment {quote(p.comment)} : {p.value}"
        if p.comment and p.value is not None
        else p._replace(key=key).text()
        for key in keys
    )
    return _lines("add", prefix, set_name, texts)


def _lines(verb: str, prefix: str, set_name: str, texts: Iterable[str]) -> Iterator[str]:
    """Elements' texts, ELEMENTS_PER_LINE to a line."""
    it = iter(texts)
    while batch := list(islice(it, ELEMENTS_PER_LINE)):
        yield f"{verb} element {prefix} {set_name} {{ {', '.join(batch)} }}"
