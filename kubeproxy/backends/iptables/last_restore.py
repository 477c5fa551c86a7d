"""What the last successful restore wrote to our shared chains, so a partial sync can leave them out.

A partial sync rewrites the own chains of the services that changed and, as upstream does, every
shared chain (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, the filter chains) whole. At
10k services KUBE-SERVICES alone is 10k rules, and iptables-nft-restore spends ~1 s rewriting
it for a change that did not touch it (an endpoint moved).

Upstream always rewrites them. Leaving an unchanged one out is compatible because the restore
runs with `--noflush`: a chain the text neither declares nor appends to is left exactly as it
is in the kernel, and it holds what our last restore put there (we only leave out chains whose
text is byte for byte what that restore wrote). Anything that breaks that premise goes back to
writing everything: a full sync (the syncPeriod one, or after the canary says the tables were
flushed) and any failed restore, which `forget` clears.

Only non-service chains are tracked: the service chains are already left out by the render
(`changed_services`), and tracking 200k of them would cost memory for nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kubeproxy.backends.iptables.names import SERVICE_CHAIN_PREFIXES, is_service_chain

ChainKey = tuple[str, str]  # (table, chain)


@dataclass(frozen=True)
class Filtered:
    """A restore text with the unchanged shared chains left out, and what to remember if it succeeds."""

    text: str
    skipped: tuple[str, ...]  # "table/chain" left out
    # The digests when they were worked out with the filtering; None: from the text, once asked for.
    known_digests: dict[ChainKey, bytes] | None
    # The text as pieces to join, when it was given so (`filter_chunks`); `text` is "" then.
    chunks: Sequence[str] | None = None

    @property
    def restore_input(self) -> str | Sequence[str]:
        return self.text if self.chunks is None else self.chunks

    @cached_property
    def digests(self) -> dict[ChainKey, bytes]:
        """Every tracked chain of the full text, as written or kept.

        A full sync leaves nothing out, so it needs them only once its restore has succeeded
        (`AppliedChains.applied`): worked out then, they are off the path to the kernel's
        rules (0.1 s of a cold sync at 10k services).
        """
        if self.known_digests is not None:
            return self.known_digests
        pieces = [self.text] if self.chunks is None else self.chunks
        tracked = _tracked_lines_of(pieces)
        if tracked is None:
            tracked = _general_chains("".join(pieces))[1]
        return {key: _digest(lines) for key, lines in tracked.items()}


def _digest(lines: list[str]) -> bytes:
    # A digest rather than the text: KUBE-SERVICES at 10k services is ~2 MB we need not keep.
    return hashlib.blake2b("\n".join(lines).encode(), digest_size=16).digest()


def _tracked_chain(line: str) -> str | None:
    """The chain a `:CHAIN` declaration or `-A CHAIN` rule belongs to, if it is one we track."""
    if line.startswith(":"):
        chain = line[1:].split(" ", 1)[0]
    elif line.startswith("-A "):
        chain = line[3:].split(" ", 1)[0]
    else:
        return None  # COMMIT, *table, -X, -I: always written
    return None if is_service_chain(chain) else chain


# The `*table` lines and the lines of tracked chains (a `:CHAIN` or `-A CHAIN` line whose chain
# is not a service chain), found by the regex engine: a full sync's text at 10k services is
# 320k lines of which ~10k are tracked, and a Python loop over all of them (or a list of them)
# costs 0.3 s and 80 MiB. Chain as `_tracked_chain` takes it: up to the first space.
_NOT_SERVICE = r"(?!" + "|".join(map(re.escape, SERVICE_CHAIN_PREFIXES)) + r")"
_TRACKED = r"(?:\*(?P<table>[^\n]*)|(?::|-A )" + _NOT_SERVICE + r"(?P<chain>[^ \n]*)[^\n]*)"
_TRACKED_LINE = re.compile(r"^" + _TRACKED + r"$", re.MULTILINE)
# The same lines after the first: found from their line break, a literal the regex engine skips
# to, where `^` makes it try every position of the text (0.2 s instead of 0.06 s for 32 MiB).
_TRACKED_NEXT_LINE = re.compile(r"\n(?P<line>" + _TRACKED + r")(?=\n|\Z)")
# Line breaks `str.splitlines` knows besides "\n" (ASCII ones; non-ASCII text takes the general path).
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"


def _tracked_lines_of(chunks: Iterable[str]) -> dict[ChainKey, list[str]] | None:
    """Each tracked chain's lines in the text the chunks make, in order, as the general path
    groups them; None if it has line breaks other than "\n" (that path's `splitlines` would cut
    it otherwise) or a chunk is not whole lines (a line cut between two chunks would be two here)."""
    table = ""
    chains: dict[ChainKey, list[str]] = {}
    whole = True  # the chunks so far end with a whole line
    for chunk in chunks:
        if not chunk:
            continue
        if not whole or not chunk.isascii() or any(c in chunk for c in _OTHER_BREAKS):
            return None
        whole = chunk.endswith("\n")
        first = _TRACKED_LINE.match(chunk)
        for m, line in itertools.chain(
            [] if first is None else [(first, first.group())],
            ((m, m.group("line")) for m in _TRACKED_NEXT_LINE.finditer(chunk)),
        ):
            chain = m.group("chain")
            if chain is None:
                table = m.group("table")
            else:
                chains.setdefault((table, chain), []).append(line)
    return chains


def _general_chains(text: str) -> tuple[list[tuple[ChainKey | None, str]], dict[ChainKey, list[str]]]:
    """Every line of `text` with the tracked chain it belongs to (None: always written), and
    each tracked chain's lines in order."""
    table = ""
    keyed: list[tuple[ChainKey | None, str]] = []
    chains: dict[ChainKey, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        chain = _tracked_chain(line)
        key = None if chain is None else (table, chain)
        if key is not None:
            chains.setdefault(key, []).append(line)
        keyed.append((key, line))
    return keyed, chains


@dataclass
class AppliedChains:
    """Digests of the shared chains as the kernel holds them after our last successful restore."""

    _applied: dict[ChainKey, bytes] = field(default_factory=dict)

    def filter(self, text: str, *, full: bool) -> Filtered:
        """`text` without the shared chains the kernel already holds unchanged (none on a full sync)."""
        if full:  # nothing is left out: only the digests are wanted, after the restore
            return Filtered(text, (), None)
        return self._filter(text, full=full)

    def filter_chunks(self, chunks: Sequence[str], *, full: bool) -> Filtered:
        """`filter("".join(chunks))`; a full sync's chunks are kept as they are, not joined."""
        if full:
            return Filtered("", (), None, chunks)
        return self.filter("".join(chunks), full=full)

    def _filter(self, text: str, *, full: bool) -> Filtered:
        """The general path: every line keyed by its chain."""
        keyed, chains = _general_chains(text)
        digests = {key: _digest(lines) for key, lines in chains.items()}
        # A chain is only skipped if its declaration line is in the text: one the text appends
        # to without declaring (not something render writes) is not ours to second-guess.
        skip = (
            set()
            if full
            else {k for k, d in digests.items() if self._applied.get(k) == d and chains[k][0].startswith(":")}
        )
        if not skip:
            return Filtered(text, (), digests)
        out = [line for key, line in keyed if key not in skip]
        return Filtered("\n".join(out) + "\n", tuple(sorted(f"{t}/{c}" for t, c in skip)), digests)

    def applied(self, result: Filtered, *, full: bool) -> None:
        """The restore of `result.text` succeeded: the kernel now holds `result.digests`."""
        if full:
            self._applied = dict(result.digests)
        else:
            self._applied.update(result.digests)

    def forget(self) -> None:
        """A restore failed (or the tables were flushed): the next sync writes every chain."""
        self._applied.clear()
