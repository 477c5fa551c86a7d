"""A small typed model of what we put in an nftables table, and its `nft -f` text.

Objects are identified by name (chains, sets and maps, ct timeout objects) or by set name and
key (elements); the applier diffs two renderings object by object. Text follows knftables'
style (`add rule ip kube-proxy CHAIN ...`), which is what upstream's tests print.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from kubeproxy.backends.kernel_text import nft_quoted

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


def quote(text: str) -> str:
    """Every comment we write goes through here (kernel_text: no quote or newline, ≤ 128 bytes)."""
    return nft_quoted(text)


def element_lines(
    verb: str, prefix: str, set_name: str, elements: Iterable[Element], *, keys_only: bool = False
) -> Iterator[str]:
    """`add element` / `delete element` lines for one set, ELEMENTS_PER_LINE at a time."""
    batch: list[str] = []
    for element in elements:
        # Element.text() inlined: this loop runs once per element of a full table.
        key, value, comment = element
        if not keys_only:
            if comment:
                key += f" comment {quote(comment)}"
            if value is not None:
                key = f"{key} : {value}"
        batch.append(key)
        if len(batch) == ELEMENTS_PER_LINE:
            yield f"{verb} element {prefix} {set_name} {{ {', '.join(batch)} }}"
            batch = []
    if batch:
        yield f"{verb} element {prefix} {set_name} {{ {', '.join(batch)} }}"
