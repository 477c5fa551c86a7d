"""Incremental renders equal full renders, and the diff sends only what changed (pure)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from kubeproxy.backends.nftables import rendered_table
from kubeproxy.backends.nftables.diff import ElementOp, chunks, create_plan, plan, weight
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering, OverlayMap
from kubeproxy.model.node_model import NodeView
from tests.backends.nftables.helpers import NODE, endpoint, options, port, service, slice_, view


def same(a: NftRendering, b: NftRendering) -> None:
    assert dict(a.chains) == dict(b.chains)
    assert dict(a.sets) == dict(b.sets)
    assert {k: dict(v) for k, v in a.elements.items() if v} == {k: dict(v) for k, v in b.elements.items() if v}
    assert dict(a.objects) == dict(b.objects)
    assert a.warnings == b.warnings
    assert (a.no_local_endpoints_internal, a.no_local_endpoints_external) == (
        b.no_local_endpoints_internal,
        b.no_local_endpoints_external,
    )
    assert a.text() == b.text()


def random_service(rng: random.Random, i: int, shared_addresses: bool = False) -> list[dict[str, Any]]:
    ns, name = f"ns{i % 3}", f"svc{i}"
    kind = rng.choice(["ClusterIP", "NodePort", "LoadBalancer"])
    spec: dict[str, Any] = {"type": kind}
    ports = [port("p", 80 + rng.randrange(3), rng.choice(["TCP", "UDP"]))]
    if rng.random() < 0.3:
        ports.append(port("q", 8080))
    if kind != "ClusterIP":
        for j, p in enumerate(ports):
            p["nodePort"] = 30000 + i * 4 + j
        if rng.random() < 0.5:
            spec["externalTrafficPolicy"] = "Local"
            spec["healthCheckNodePort"] = 32000 + i
    if kind == "LoadBalancer":
        lb = f"1.2.3.{rng.randrange(2) if shared_addresses else i}"
        spec["status"] = {"loadBalancer": {"ingress": [{"ip": lb}]}}
        if rng.random() < 0.5:
            spec["loadBalancerSourceRanges"] = ["203.0.113.0/25"]
    if rng.random() < 0.3:
        spec["externalIPs"] = [f"192.168.99.{rng.randrange(2) if shared_addresses else i}"]
    if rng.random() < 0.2:
        spec["internalTrafficPolicy"] = "Local"
    if rng.random() < 0.25:
        spec["sessionAffinity"] = "ClientIP"
    if rng.random() < 0.3:
        spec["annotations"] = {"kubeproxy.io/udp-conntrack-timeout": rng.choice(["5s", "10s", "bogus"])}
    eps = []
    for e in range(rng.randrange(0, 5)):
        cond: dict[str, Any] = {}
        if rng.random() < 0.2:
            cond = {"ready": False, "serving": rng.random() < 0.5, "terminating": True}
        # a pod may back two services: the shared hairpin element must survive either leaving
        ip = f"10.180.{rng.randrange(3)}.{rng.randrange(1, 6)}" if rng.random() < 0.3 else f"10.181.{i}.{e + 1}"
        eps.append(endpoint(ip, rng.choice([NODE, "node2", None]), **cond))
    objs = [service(ns, name, f"172.30.{i // 200}.{i % 200 + 1}", *ports, **spec)]
    if eps or rng.random() < 0.5:
        objs.append(slice_(ns, name, eps, *[(p["name"], p["port"], p["protocol"]) for p in ports]))
    return objs


@pytest.mark.parametrize("seed", range(12))
def test_incremental_equals_full_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    n = 14
    objects = {i: random_service(rng, i) for i in range(n)}
    opts = options()
    prev = render(view([o for objs in objects.values() for o in objs]), opts)
    for _ in range(25):
        changed = rng.sample(range(n + 3), rng.randrange(1, 4))
        for i in changed:
            if rng.random() < 0.2:
                objects.pop(i, None)
            else:
                objects[i] = random_service(rng, i)
        v = view([o for objs in objects.values() for o in objs])
        keys = {(f"ns{i % 3}", f"svc{i}") for i in changed}
        inc = render(v, opts, previous=prev, changed_services=keys)
        full = render(v, opts)
        assert not inc.full
        same(inc, full)
        # the touched-keys diff finds exactly what a full comparison finds
        fast = plan(prev, inc)
        slow = plan(prev, full)
        assert sorted(map(str, (op for u in fast.units for op in u))) == sorted(map(str, (op for u in slow.units for op in u)))
        assert sorted(fast.stale) == sorted(slow.stale)
        prev = inc


@pytest.mark.parametrize("seed", range(8))
def test_incremental_equals_full_when_services_share_addresses(seed: int) -> None:
    """Several services claim one external address and port with different values (the claims'
    `_many`), and the rendering an incremental render starts from is left as it was."""
    rng = random.Random(1000 + seed)
    n = 10
    objects = {i: random_service(rng, i, shared_addresses=True) for i in range(n)}
    opts = options()
    prev = render(view([o for objs in objects.values() for o in objs]), opts)
    for _ in range(25):
        changed = rng.sample(range(n + 2), rng.randrange(1, 4))
        for i in changed:
            if rng.random() < 0.2:
                objects.pop(i, None)
            else:
                objects[i] = random_service(rng, i, shared_addresses=True)
        v = view([o for objs in objects.values() for o in objs])
        before = prev.text(), {k: dict(d) for k, d in prev.elements.items()}
        inc = render(v, opts, previous=prev, changed_services={(f"ns{i % 3}", f"svc{i}") for i in changed})
        same(inc, render(v, opts))
        assert (prev.text(), {k: dict(d) for k, d in prev.elements.items()}) == before
        prev = inc


def _two_services(n_eps: int) -> list[dict[str, Any]]:
    return [
        service("ns1", "web", "172.30.0.41", port("http", 80)),
        slice_("ns1", "web", [endpoint(f"10.180.0.{i + 1}", NODE) for i in range(n_eps)], ("http", 80, "TCP")),
        service("ns2", "db", "172.30.0.42", port("sql", 5432)),
        slice_("ns2", "db", [endpoint("10.180.1.1")], ("sql", 5432, "TCP")),
    ]


def test_no_change_plans_nothing() -> None:
    r = render(view(_two_services(3)), options())
    again = render(view(_two_services(3)), options(), previous=r, changed_services=set())
    assert plan(r, again).units == []
    assert plan(r, render(view(_two_services(3)), options())).units == []  # full comparison too


def test_one_endpoint_replaced_is_two_element_pairs() -> None:
    r = render(view(_two_services(3)), options())
    objs = _two_services(3)
    objs[1]["endpoints"][2] = endpoint("10.180.0.9", NODE)
    new = render(view(objs), options(), previous=r, changed_services={("ns1", "web")})
    ops = [op for u in plan(r, new).units for op in u]
    element_ops = [op for op in ops if isinstance(op, ElementOp)]
    assert element_ops == ops
    assert sorted((op.verb, op.set_name, op.element.key) for op in element_ops) == [
        ("add", "cluster-endpoints-3", "172.30.0.41 . tcp . 80 . 2"),
        ("add", "hairpin", "10.180.0.9 . 10.180.0.9"),
        ("delete", "cluster-endpoints-3", "172.30.0.41 . tcp . 80 . 2"),
        ("delete", "hairpin", "10.180.0.3 . 10.180.0.3"),
    ]


def test_scaling_moves_a_service_to_another_selector_in_a_safe_order() -> None:
    r = render(view(_two_services(1)), options())
    new = render(view(_two_services(2)), options(), previous=r, changed_services={("ns1", "web")})
    p = plan(r, new)
    flat = [f"{op.verb} {op.set_name} {op.element.key}" if isinstance(op, ElementOp) else str(op) for u in p.units for op in u]
    # the new selector exists and is filled before service-ips points at it; the old entries go last
    assert (
        flat.index("add map ip kube-proxy cluster-endpoints-2" + new.sets["cluster-endpoints-2"].declaration())
        < flat.index("add cluster-endpoints-2 172.30.0.41 . tcp . 80 . 1")
        < flat.index("add service-ips 172.30.0.41 . tcp . 80")
        < flat.index("delete cluster-endpoints-1 172.30.0.41 . tcp . 80 . 0")
    )
    assert p.stale == []  # db still uses cluster-endpoints-1


def test_unused_chains_are_flushed_then_stale_and_unused_maps_deleted() -> None:
    r = render(view(_two_services(2)), options())
    new = render(view(_two_services(3)), options(), previous=r, changed_services={("ns1", "web")})
    p = plan(r, new)
    assert p.stale == [("chain", "cluster-endpoints-2")]
    flat = [op for u in p.units for op in u if isinstance(op, str)]
    # the map goes in the same transaction, after the rule that used it
    assert flat.index("flush chain ip kube-proxy cluster-endpoints-2") < flat.index(
        "delete map ip kube-proxy cluster-endpoints-2"
    )


def test_incremental_from_an_older_rendering_falls_back_to_full() -> None:
    r1 = render(view(_two_services(1)), options())
    r2 = render(view(_two_services(2)), options(), previous=r1, changed_services={("ns1", "web")})
    assert not r2.full
    r3 = render(view(_two_services(3)), options(), previous=r1, changed_services={("ns1", "web")})
    assert r3.full  # r1's bookkeeping moved on to r2
    same(r3, render(view(_two_services(3)), options()))
    assert render(view(_two_services(3)), options(masquerade_all=True), previous=r2, changed_services=set()).full


def test_chunks_respect_the_limit_and_never_split_a_unit() -> None:
    objs = []
    for i in range(30):
        objs += [
            service("ns", f"s{i}", f"172.30.1.{i + 1}", port("p", 80)),
            slice_("ns", f"s{i}", [endpoint(f"10.180.{i}.{e}") for e in range(1, 4)], ("p", 80, "TCP")),
        ]
    p = create_plan(render(view(objs), options()))
    texts = list(chunks(p.units, "ip kube-proxy", 25))
    assert sum(n for _, n in texts) == p.operations
    biggest = max(weight(u) for u in p.units)
    assert all(n <= max(25, biggest) for _, n in texts)
    assert len(texts) > 3
    # a chain's rules always travel with it
    for text, _ in texts:
        for line in text.splitlines():
            if line.startswith("flush chain"):
                chain = line.split()[-1]
                assert f"add rule ip kube-proxy {chain} " in text


def test_layered_map_acts_as_a_dict_and_leaves_its_parent_alone() -> None:
    """Incremental renders layer their writes over the parent's maps (rendered_table.OverlayMap): a child
    reads, iterates and counts as a copied dict would, and the parent never changes."""
    rng = random.Random(7)
    base = {f"k{i}": i for i in range(50)}
    parent: Mapping[str, int] = base
    expected = dict(base)
    for _ in range(60):
        snapshot = dict(parent)
        child = OverlayMap.over(parent)
        for _ in range(rng.randrange(1, 12)):
            key = f"k{rng.randrange(70)}"
            if rng.random() < 0.4:
                assert child.pop(key) == expected.pop(key, None)
            else:
                child[key] = expected[key] = rng.randrange(1000)
        assert dict(child) == expected and len(child) == len(expected) and sorted(child) == sorted(expected)
        for key in (f"k{i}" for i in range(70)):
            assert (key in child) == (key in expected) and child.get(key) == expected.get(key)
        assert dict(parent) == snapshot  # the parent is as it was
        parent = child


@pytest.mark.parametrize("seed", range(4))
def test_incremental_equals_full_when_layers_are_folded(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny compaction threshold, overlays are folded into fresh bases every few renders:
    the result still equals a full render and the parent rendering is left as it was."""
    monkeypatch.setattr(rendered_table, "COMPACT_MIN", 2)
    rng = random.Random(2000 + seed)
    n = 12
    objects = {i: random_service(rng, i) for i in range(n)}
    opts = options()
    prev = render(view([o for objs in objects.values() for o in objs]), opts)
    for _ in range(20):
        changed = rng.sample(range(n), rng.randrange(1, 4))
        for i in changed:
            objects[i] = random_service(rng, i)
        v = view([o for objs in objects.values() for o in objs])
        before = prev.text()
        inc = render(v, opts, previous=prev, changed_services={(f"ns{i % 3}", f"svc{i}") for i in changed})
        same(inc, render(v, opts))
        assert prev.text() == before
        prev = inc


def test_indexed_view_and_scanned_view_render_the_same() -> None:
    """The incremental render finds a changed Service's ports through the view's index when the
    view has it (the live proxy's) and by a walk otherwise: both give the same rendering."""
    rng = random.Random(11)
    objects = {i: random_service(rng, i) for i in range(10)}
    opts = options()
    first = view([o for objs in objects.values() for o in objs])
    objects[3] = random_service(rng, 3)
    keys = {("ns0", "svc3")}
    renders = []
    for indexed in (False, True):
        base = render(first, opts)
        v = view([o for objs in objects.values() for o in objs])
        if indexed:
            v = NodeView.with_index(v.services, v.endpoints, v.by_service)
        assert ("by_service" in v.__dict__) == indexed
        renders.append(render(v, opts, previous=base, changed_services=keys))
    same(renders[0], renders[1])
    assert renders[0].text() == renders[1].text()
