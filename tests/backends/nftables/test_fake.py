"""The package's FakeNft against the kernel: the same transactions, the same outcome.

The applier scenarios run on the fake without root (milliseconds); the root tests run the same
sequences in a namespace and compare what the applier sees (`listing()`, element counts), and
check that both refuse the same bad transactions and that `nft -c` changes neither.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.backends.nftables.apply import NftApplier, NftError
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.proxier import NftablesProxier
from kubeproxy.backends.nftables.render import render
from kubeproxy.lab import netns as L
from tests.backends.nftables.helpers import options, view
from tests.backends.nftables.test_incremental import random_service
from tests.backends.nftables.test_kernel import FEATURES

Run = Callable[..., subprocess.CompletedProcess[str]]


def _element_counts(run: Run, fake: FakeNft | None) -> dict[str, int]:
    if fake is not None:
        table = fake.table()
        return {name: len(s.elements) for name, s in table.sets.items()} if table else {}
    import json

    doc = json.loads(run(["nft", "-j", "list", "table", "ip", "kube-proxy"]).stdout)
    out = {}
    for item in doc["nftables"]:
        for kind in ("set", "map"):
            if kind in item:
                out[item[kind]["name"]] = len(item[kind].get("elem", []))
    return out


def _sequence(run: Run, fake: FakeNft | None) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """Random changes through the applier (small chunks, stale objects): what it sees after each."""
    rng = random.Random(11)
    objects = {i: random_service(rng, i) for i in range(10)}
    clock = [0.0]
    applier = NftApplier("ip", run, chunk_size=40, stale_delay=1.0, clock=lambda: clock[0])
    r = render(view([o for objs in objects.values() for o in objs]), options())
    applier.apply(r)
    seen = [(applier.listing(), _element_counts(run, fake))]
    for _ in range(10):
        changed = rng.sample(range(12), rng.randrange(1, 4))
        for i in changed:
            if rng.random() < 0.2:
                objects.pop(i, None)
            else:
                objects[i] = random_service(rng, i)
        r = render(view([o for objs in objects.values() for o in objs]), options(), previous=r,
                   changed_services={(f"ns{i % 3}", f"svc{i}") for i in changed})  # fmt: skip
        clock[0] += 0.6
        applier.apply(r)
        seen.append((applier.listing(), _element_counts(run, fake)))
    clock[0] += 5
    assert applier.apply(r).mode == "noop"
    assert applier.stale == []
    seen.append((applier.listing(), _element_counts(run, fake)))
    return seen


def test_the_applier_sequence_runs_on_the_fake() -> None:
    fake = FakeNft()
    seen = _sequence(fake.run, fake)
    assert all(listing["chains"] for listing, _ in seen)
    assert any(counts.get("service-ips") for _, counts in seen)


@pytest.mark.root
def test_the_fake_and_the_kernel_see_the_same_sequence(netns: L.NetNS) -> None:
    fake = FakeNft()
    assert _sequence(fake.run, fake) == _sequence(netns, None)


BAD = {
    "overlapping intervals": "add set ip kube-proxy s { type ipv4_addr ; flags interval ; }\n"
    "add element ip kube-proxy s { 10.0.0.0/8, 10.1.0.0/16 }\n",
    "a missing element": "add set ip kube-proxy s { type ipv4_addr ; }\ndelete element ip kube-proxy s { 10.0.0.1 }\n",
    "a long comment": f'add chain ip kube-proxy c {{ comment "{"x" * 129}" ; }}\n',
    "a missing set": "add chain ip kube-proxy c\nadd rule ip kube-proxy c ip saddr @nothing drop\n",
    "a missing chain": "add map ip kube-proxy m { type ipv4_addr : verdict ; }\n"
    "add element ip kube-proxy m { 10.0.0.1 : goto nowhere }\n",
    "a busy chain": "add chain ip kube-proxy c\nadd chain ip kube-proxy d\n"
    "add rule ip kube-proxy d jump c\ndelete chain ip kube-proxy c\n",
    "a map key again": "add map ip kube-proxy m { type ipv4_addr : verdict ; }\nadd chain ip kube-proxy c\n"
    "add element ip kube-proxy m { 10.0.0.1 : drop }\nadd element ip kube-proxy m { 10.0.0.1 : goto c }\n",
}
GOOD = "add table ip kube-proxy\nadd chain ip kube-proxy keep\n"


def _outcome(run: Run, text: str) -> tuple[int, int, bool]:
    """(nft -c, nft -f) return codes, and whether the table is still as before."""
    run(["nft", "-f", "-"], input=GOOD)
    before = run(["nft", "-j", "-t", "list", "table", "ip", "kube-proxy"]).stdout
    checked = run(["nft", "-c", "-f", "-"], input=text, check=False).returncode
    applied = run(["nft", "-f", "-"], input=text, check=False).returncode
    kept = run(["nft", "-j", "-t", "list", "table", "ip", "kube-proxy"]).stdout == before
    return checked, applied, kept


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_fake_refuses_what_the_kernel_refuses(case: str) -> None:
    assert _outcome(FakeNft().run, BAD[case]) == (1, 1, True)


@pytest.mark.root
@pytest.mark.parametrize("case", sorted(BAD))
def test_the_kernel_refuses_these_too(netns: L.NetNS, case: str) -> None:
    checked, applied, _ = _outcome(netns, BAD[case])
    assert (checked, applied) == (1, 1)


def test_proxier_sees_a_deleted_table_and_check_changes_nothing_on_the_fake() -> None:
    fake = FakeNft()
    proxier = NftablesProxier(run=fake.run)
    v, opts = view(FEATURES), options()
    assert proxier.rules_intact()  # nothing synced yet: nothing to lose
    assert proxier.sync(v, opts, None).full and proxier.rules_intact()
    fake.run(["nft", "delete", "table", "ip", "kube-proxy"])
    assert not proxier.rules_intact()
    assert proxier.sync(v, opts, None).full and proxier.rules_intact()  # the full sync the live loop asks for
    snapshot = repr(fake.tables)
    assert proxier.check(v, opts) is None and repr(fake.tables) == snapshot


def test_a_refused_apply_leaves_the_table_on_the_fake() -> None:
    fake = FakeNft()
    applier = NftApplier("ip", fake.run)
    applier.apply(render(view(FEATURES), options()))
    snapshot = repr(fake.tables)

    def refusing(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["nft", "-f"]:
            kw = {**kw, "input": kw.get("input", "") + "add element ip kube-proxy nothing { 1.2.3.4 }\n"}
        return fake.run(argv, **kw)

    applier.run = refusing
    with pytest.raises(NftError):
        applier.apply(render(view(FEATURES[:2]), options()), full=True)
    assert repr(fake.tables) == snapshot  # never deleted to start over
