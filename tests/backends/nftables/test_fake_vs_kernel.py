"""FakeNft against the kernel where a chain is deleted: after an interrupted create, on a restart.

A full sync over a table this applier did not build (after its create was interrupted, or after
a restart) deletes the base chains and re-adds them, so a table left by an older version gets
the current hooks and priorities (apply.py `_full_text`). The kernel deletes a chain together
with its own rules and refuses only when a jump/goto from elsewhere still uses it; the fake used
to refuse any chain that had rules ("Device or resource busy"), so the proxy could not recover
from an interrupted create on the fake while it does on the kernel.

Each scenario runs without root on the fake (with the kernel's answer written down, learned from
nft 1.0.6 on Linux 6.x in a namespace) and, as root, on the kernel and the fake side by side:
same accept/refuse and the same table afterwards, compared as the applier sees it (chains with
rule counts, sets with element counts, objects), as test_fake.py does.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kubeproxy.backends.nftables.apply import NftApplier, NftError
from kubeproxy.backends.nftables.diff import chunks, create_plan
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.lab import netns as L
from tests.backends.nftables.helpers import options, view
from tests.backends.nftables.test_incremental import random_service

Run = Callable[..., subprocess.CompletedProcess[str]]
CHUNK = 40  # operations per `nft -f` run: four chunks for the 12 services below


# ------------------------------------------------------------------ what a table looks like


def _shape(run: Run, fake: FakeNft | None, table: str = "kube-proxy") -> dict[str, Any]:
    """{"chains": {name: rules}, "sets": {name: elements}, "objects": [names]}, {} without the table.

    The fake lists rules as text and sets without elements, so its elements are counted from
    its state; everything else comes from `nft -j list table` on both.
    """
    proc = run(["nft", "-j", "list", "table", "ip", table], check=False)
    if proc.returncode != 0:
        return {}
    out: dict[str, Any] = {"chains": {}, "sets": {}, "objects": []}
    for obj in json.loads(proc.stdout)["nftables"]:
        ((kind, body),) = obj.items()
        if kind == "chain":
            out["chains"].setdefault(body["name"], 0)
        elif kind == "rule":
            out["chains"][body["chain"]] = out["chains"].get(body["chain"], 0) + 1
        elif kind in ("set", "map"):
            out["sets"][body["name"]] = len(body.get("elem", []))
        elif kind == "ct timeout":
            out["objects"].append(body["name"])
    if fake is not None:
        state = fake.table("ip", table)
        assert state is not None
        out["sets"] = {name: len(s.elements) for name, s in state.sets.items()}
    out["objects"].sort()
    return out


# ------------------------------------------------------------------ single transactions

SETUP = """add table ip t
add chain ip t base { type nat hook prerouting priority -100 ; }
add chain ip t a
add chain ip t b
add chain ip t c
add set ip t s { type ipv4_addr ; }
add map ip t m { type ipv4_addr : verdict ; }
add ct timeout ip t to { protocol udp ; l3proto ip ; policy = { unreplied : 10, replied : 20 } ; }
add rule ip t base jump a
add rule ip t a ip saddr @s jump b
add rule ip t a ip daddr vmap @m
add rule ip t b ct timeout set "to"
add element ip t m { 10.0.0.1 : goto c }
add element ip t s { 10.0.0.2 }
"""

# text on top of SETUP -> does the kernel take it (nft 1.0.6, Linux 6.x, in a namespace)
CASES: dict[str, tuple[str, bool]] = {
    "a base chain with rules, used by nothing": ("delete chain ip t base\n", True),
    "a chain with rules, used by a jump": ("delete chain ip t a\n", False),
    "a chain without rules, used by a map element": ("delete chain ip t c\n", False),
    "a chain whose user is flushed first": ("flush chain ip t a\ndelete chain ip t b\n", True),
    "a chain whose user is flushed after": ("delete chain ip t b\nflush chain ip t a\n", False),
    "a chain whose user was deleted before": ("delete chain ip t base\ndelete chain ip t a\n", True),
    "a set whose user chain was deleted": ("delete chain ip t base\ndelete chain ip t a\ndelete set ip t s\n", True),
    "a set still used": ("delete set ip t s\n", False),
    "an object whose user chain was deleted": (
        "delete chain ip t base\ndelete chain ip t a\ndelete chain ip t b\ndelete ct timeout ip t to\n",
        True,
    ),
    "a chain whose map element is deleted first": ("delete element ip t m { 10.0.0.1 }\ndelete chain ip t c\n", True),
    "a chain whose map is flushed first": ("flush map ip t m\ndelete chain ip t c\n", True),
    "a base chain deleted and re-added with another priority": (
        "delete chain ip t base\nadd chain ip t base { type nat hook prerouting priority -99 ; }\nadd rule ip t base jump a\n",
        True,
    ),
    "a base chain re-added with another priority": (
        "add chain ip t base { type nat hook prerouting priority -99 ; }\n",
        False,
    ),
    "a base chain re-added with another type": ("add chain ip t base { type filter hook prerouting priority -100 ; }\n", False),
    "a base chain re-added with another type and priority": (
        "add chain ip t base { type filter hook prerouting priority -99 ; }\n",
        False,
    ),
    "a regular chain re-added as a base chain": ("add chain ip t a { type nat hook prerouting priority -100 ; }\n", False),
    "a base chain re-added without a hook": ('add chain ip t base { comment "x" ; }\n', True),
    "a base chain re-added with another policy": (
        "add chain ip t base { type nat hook prerouting priority -100 ; policy drop ; }\n",
        True,
    ),
    "a jump to a chain deleted before": ("delete chain ip t base\ndelete chain ip t a\nadd rule ip t c jump a\n", False),
}


def _transaction(run: Run, fake: FakeNft | None, text: str) -> tuple[bool, dict[str, Any]]:
    """Whether `nft -f` takes `text` on top of SETUP, and the table after it."""
    run(["nft", "-f", "-"], input=SETUP)
    taken = run(["nft", "-f", "-"], input=text, check=False).returncode == 0
    return taken, _shape(run, fake, "t")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_deletes_as_the_kernel_does(case: str) -> None:
    text, kernel_takes_it = CASES[case]
    fake, untouched = FakeNft(), FakeNft()
    taken, after = _transaction(fake.run, fake, text)
    assert taken is kernel_takes_it
    if not taken:  # one transaction: nothing of it applied
        assert after == _transaction(untouched.run, untouched, "")[1]


@pytest.mark.root
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_deletes_as_the_fake_does(netns: L.NetNS, case: str) -> None:
    text, kernel_takes_it = CASES[case]
    fake = FakeNft()
    kernel = _transaction(netns, None, text)
    assert kernel[0] is kernel_takes_it
    assert kernel == _transaction(fake.run, fake, text)


# ------------------------------------------------------------------ an interrupted create


def _rendering(seed: int, services: int = 12) -> NftRendering:
    rng = random.Random(seed)
    return render(view([o for i in range(services) for o in random_service(rng, i)]), options())


@dataclass
class _Interrupting:
    """A runner that lets `allowed` transactions through, then refuses every one (once armed)."""

    run: Run
    allowed: int
    sent: int = 0
    armed: bool = True

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if self.armed and argv[:2] == ["nft", "-f"]:
            if self.sent >= self.allowed:
                return subprocess.CompletedProcess(argv, 1, "", "Error: interrupted (test)\n")
            self.sent += 1
        return self.run(argv, **kw)


def _recovery(run: Run, fake: FakeNft | None, committed: int) -> list[Any]:
    """The create stops after `committed` chunks; then the syncs a proxy would run next."""
    r1, r2 = _rendering(5), _rendering(6, services=8)
    clock = [0.0]
    gate = _Interrupting(run, committed)
    applier = NftApplier("ip", gate, chunk_size=CHUNK, stale_delay=1.0, clock=lambda: clock[0],
                         stream_min_operations=None)  # fmt: skip
    seen: list[Any] = []
    with pytest.raises(NftError, match="interrupted"):
        applier.apply(r1)
    seen.append(("interrupted", _shape(run, fake)))
    gate.armed = False
    for r in (r1, r2, r2):  # the full sync that repairs it; a change (stale chains); their deletion
        try:
            result = applier.apply(r)
            seen.append((result.mode, result.stale_flushed, result.stale_deleted, _shape(run, fake)))
        except NftError:  # the two word their refusals differently: whether, not how
            seen.append(("refused",))
        clock[0] += 2.0
    # A restart over the table: the new applier recreates the base chains as well.
    again = NftApplier("ip", run, chunk_size=CHUNK, stream_min_operations=None)
    seen.append((again.apply(r1).mode, _shape(run, fake)))
    return seen


def _chunk_count() -> int:
    return len(list(chunks(create_plan(_rendering(5)).units, "ip kube-proxy", CHUNK)))


@pytest.mark.parametrize("committed", range(4))
def test_the_fake_recovers_from_an_interrupted_create(committed: int) -> None:
    assert _chunk_count() == 4  # so that `committed` covers every place a create can stop
    fake = FakeNft()
    seen = _recovery(fake.run, fake, committed)
    first = "full" if committed else "create"  # no chunk committed: no table to repair
    assert [step[0] for step in seen] == ["interrupted", first, "incremental", "noop", "full"]
    whole = FakeNft()
    NftApplier("ip", whole.run, chunk_size=CHUNK).apply(_rendering(5))
    want, got = _shape(whole.run, whole), seen[-1][1]
    # The restart's table is the one a create makes, and the chains of r2 it lacks wait, flushed,
    # to be deleted by a later sync (stale).
    stale = {name: rules for name, rules in got["chains"].items() if name not in want["chains"]}
    assert stale and not any(stale.values())
    assert {**got, "chains": {n: c for n, c in got["chains"].items() if n not in stale}} == want


@pytest.mark.root
@pytest.mark.parametrize("committed", range(4))
def test_the_kernel_recovers_as_the_fake_does(netns: L.NetNS, committed: int) -> None:
    fake = FakeNft()
    assert _recovery(netns, None, committed) == _recovery(fake.run, fake, committed)
