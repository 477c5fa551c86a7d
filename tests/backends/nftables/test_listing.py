"""What the applier lists of the kernel before a full sync: our table only, without elements.

The listing is `nft -j -t list ruleset FAMILY` filtered to our table (`list table` fetches every
element in nft 1.0.6, seconds at 10k services), so other tables of the family and the other
family's `kube-proxy` table must not leak into it.
"""

from __future__ import annotations

import random

import pytest

from kubeproxy.backends.nftables.apply import NftApplier
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.lab import netns as L
from tests.backends.nftables.helpers import options, view
from tests.backends.nftables.test_incremental import random_service

NEIGHBOURS = [
    "add table ip other",
    "add chain ip other services",
    "add rule ip other services accept",
    "add set ip other cluster-ips { type ipv4_addr ; }",
    "add table ip6 kube-proxy",
    "add chain ip6 kube-proxy extra",
    "add set ip6 kube-proxy extra-set { type ipv6_addr ; }",
]


def _rendering() -> NftRendering:
    rng = random.Random(3)
    return render(view([o for i in range(6) for o in random_service(rng, i)]), options())


def _expected(r: NftRendering) -> dict[str, object]:
    return {
        "chains": {name: len(chain.rules) for name, chain in r.chains.items()},
        "sets": {name: {"kind": s.kind, "dynamic": s.dynamic or name == "affinity"} for name, s in r.sets.items()},
        "objects": sorted(r.objects),
    }


def _normal(listing: dict[str, object]) -> dict[str, object]:
    return {**listing, "objects": sorted(listing.get("objects", []))}  # type: ignore[call-overload]


def test_fake_listing_is_our_table_only() -> None:
    fake = FakeNft()
    applier = NftApplier("ip", fake.run)
    fake.run(["nft", "-f", "-"], input="\n".join(NEIGHBOURS) + "\n")
    assert applier.listing() == {}  # other tables, none of ours
    r = _rendering()
    applier.apply(r)
    assert _normal(applier.listing()) == _expected(r)


root = pytest.mark.root
needs_root = pytest.mark.skipif(not L.have_root(), reason="needs root (network namespaces)")


@root
@needs_root
def test_kernel_listing_is_our_table_only() -> None:
    with L.netns("kplist") as ns:
        applier = NftApplier("ip", ns)
        ns.run(["nft", "-f", "-"], input="\n".join(NEIGHBOURS) + "\n")
        assert applier.listing() == {}
        r = _rendering()
        applier.apply(r)
        assert _normal(applier.listing()) == _expected(r)
        # The next full sync (a restart) works from that listing and leaves the neighbours alone.
        before = ns.run(["nft", "list", "table", "ip", "other"]).stdout
        assert NftApplier("ip", ns).apply(r, full=True).mode == "full"
        assert ns.run(["nft", "list", "table", "ip", "other"]).stdout == before
        assert "extra-set" in ns.run(["nft", "list", "table", "ip6", "kube-proxy"]).stdout
