"""A seeded fuzzer of cluster objects: valid random clusters with one object made hostile.

One leaf (a string, number, list or object) somewhere in one object is replaced with a value an
attacker who can create objects, or write a manifest, might try: strings that would end a rule
or a quote, out-of-range and mistyped numbers, addresses of every odd kind, huge lists. Whatever
comes out, the pipeline must hold: parsing never raises (a bad object is a warning naming it),
both renderers produce text the kernel loads, nothing lands outside our own chains and table.
Used by tests/cluster/test_fuzz_hostile.py (bounded, in CI) and bench/fuzz_hostile.py (longer runs).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubeproxy.backends.iptables.apply import restore
from kubeproxy.backends.iptables.render import render as render_iptables
from kubeproxy.backends.nftables.render import render as render_nft
from kubeproxy.cluster.state import build_state
from kubeproxy.lab import netns as L
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family
from tests.backends.nftables.helpers import NODE, options
from tests.backends.nftables.test_incremental import random_service

STRINGS = [
    'a"\n-A INPUT -j ACCEPT\n#', "x\nCOMMIT\n*filter\n-A INPUT -j DROP", "sp ace", "}; flush ruleset #", "-A", "COMMIT",
    "nul\x00byte", "ünïcødé", "q" * 65536, "", " ", "a" * 64, "a" * 254, "UPPER", "-lead", "trail-", "dou--ble",
    "010.001.002.003", "::ffff:10.0.0.1", "0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1", "fe80::1%eth0",
    "10.0.0.0/0", "0.0.0.0/0", "::/0", "10.0.0.1/33", "1.2.3.4 ", " 1.2.3.4", "Local", "ClientIP", "UDP", "SCTP",
    "99999999999999999999", "-1", "1e9", "5s", "-5s", "1000000000s", "0s",
]  # fmt: skip
NUMBERS = [-1, 0, 1, 22, 53, 1023, 30000, 32767, 32768, 65535, 65536, 2**31, 2**63, True, False, 1.5]
SHAPES: list[Any] = [None, [], {}, "", 0, [None], [{}], {"": ""}]


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def hostile_value(rng: random.Random, old: Any) -> Any:
    roll = rng.random()
    if isinstance(old, list) and old and roll < 0.15:
        return [copy.deepcopy(old[0]) for _ in range(rng.choice([2, 100, 3000]))]
    if roll < 0.55:
        return rng.choice(STRINGS)
    if roll < 0.8:
        return rng.choice(NUMBERS)
    return copy.deepcopy(rng.choice(SHAPES))


@dataclass
class Case:
    seed: int
    objects: list[dict[str, Any]]
    mutated: str  # which object and field, for the failure message

    def describe(self) -> str:
        return f"seed {self.seed}: {self.mutated}"


def case(seed: int) -> Case:
    rng = random.Random(seed)
    objects = [obj for i in range(rng.randrange(2, 7)) for obj in random_service(rng, i)]
    target = rng.choice(objects)
    paths = [p for p in _leaves(target) if p and p[0] in ("metadata", "spec", "status", "endpoints", "ports", "addressType")]
    path = rng.choice(paths)
    old = _get(target, path)
    new = hostile_value(rng, old)
    _set(target, path, new)
    if rng.random() < 0.1:  # an unknown field too: ignored, as the API server's decoder would
        target["x-unknown"] = rng.choice(STRINGS)
    shown = json.dumps(new)[:80]
    return Case(seed, objects, f"{target.get('kind')} {'.'.join(map(str, path))} = {shown}")


def check(c: Case) -> int:
    """Parse, render in both modes and load each into a fresh namespace; returns the warnings count.

    Raises AssertionError (with the case) when anything breaks.
    """
    state, warnings = build_state(c.objects)  # must not raise
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, NODE)
    opts = options()
    ipt = render_iptables(view, opts).text
    nft = render_nft(view, opts).text()
    with L.netns("kpz") as ns:
        try:
            restore(ipt, ns)
        except Exception as exc:
            raise AssertionError(f"{c.describe()}: iptables-restore refused: {exc}") from exc
        saved = ns.run(["iptables-save"]).stdout
        stray = [line for line in saved.splitlines() if line.startswith("-A ") and not line.split()[1].startswith("KUBE-")]
        assert not stray, f"{c.describe()}: rules outside our chains: {stray[:3]}"
    with L.netns("kpz") as ns:
        proc = ns.run(["nft", "-f", "-"], input=nft, check=False)
        assert proc.returncode == 0, f"{c.describe()}: nft refused: {proc.stderr[:500]}"
        tables = [line for line in ns.run(["nft", "list", "tables"]).stdout.splitlines() if line.strip()]
        assert tables == ["table ip kube-proxy"], f"{c.describe()}: tables {tables}"
    return len(warnings)
