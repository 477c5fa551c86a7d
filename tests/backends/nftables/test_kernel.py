"""The nftables backend in a real kernel: loads, diffs, recovers, and passes real packets.

Every test works in namespaces it creates (tests/conftest.py's `netns`, tests/netfilter/kernel_bed.py).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.backends.nftables.apply import NftApplier
from kubeproxy.backends.nftables.proxier import NftablesProxier
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.lab import netns as L
from kubeproxy.model.contract import FULL_SYNC_PERIOD
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import LocalDetector
from tests.backends.nftables.helpers import NODE, canonical, endpoint, options, options6, port, service, slice_, view
from tests.backends.nftables.test_incremental import random_service
from tests.netfilter.kernel_bed import PROBE, bed

pytestmark = pytest.mark.root


def listing(ns: L.NetNS, family: str = "ip") -> dict[str, Any]:
    return canonical(ns.run(["nft", "-j", "list", "table", family, "kube-proxy"]).stdout)


def fresh_listing(r: NftRendering) -> dict[str, Any]:
    """What a fresh namespace holds after loading the rendering's full text with nft -f."""
    with L.netns("kpf") as ns:
        ns.run(["nft", "-f", "-"], input=r.text())
        return listing(ns, r.family)


def without(table: dict[str, Any], stale: list[tuple[str, str]]) -> dict[str, Any]:
    out = {k: dict(v) for k, v in table.items()}
    for kind, name in stale:
        out["chains" if kind == "chain" else "objects" if kind == "ct timeout" else "sets"].pop(name, None)
    return out


FEATURES = [
    service("ns1", "web", "172.30.0.41", port("http", 80, nodePort=30080), type="NodePort"),
    slice_("ns1", "web", [endpoint("10.180.0.1", NODE), endpoint("10.180.2.1", "node2")], ("http", 80, "TCP")),
    service("ns2", "lb", "172.30.0.42", port("p80", 80, nodePort=30081), type="LoadBalancer", externalTrafficPolicy="Local",
            healthCheckNodePort=30000, externalIPs=["192.168.99.22"], loadBalancerSourceRanges=["203.0.113.0/25"],
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
    slice_("ns2", "lb", [endpoint("10.180.0.2", NODE), endpoint("10.180.2.2")], ("p80", 80, "TCP")),
    service("ns3", "sticky", "172.30.0.43", port("p", 8080, nodePort=30082), type="NodePort", sessionAffinity="ClientIP"),
    slice_("ns3", "sticky", [endpoint("10.180.0.3"), endpoint("10.180.2.3")], ("p", 8080, "TCP")),
    service("ns4", "gone", "172.30.0.44", port("p", 80)),
    service("kube-system", "dns", "172.30.0.10", port("dns", 53, "UDP"), port("dns-tcp", 53),
            annotations={"kubeproxy.io/udp-conntrack-timeout": "5s"}),
    slice_("kube-system", "dns", [endpoint("10.180.0.53")], ("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")),
]  # fmt: skip


@pytest.mark.parametrize("case", ["ipv4", "ipv6", "nodeport-addresses", "no-detector"])
def test_full_rendering_loads_with_nft_f(netns: L.NetNS, case: str) -> None:
    if case == "ipv6":
        objs = [
            service("ns1", "svc1", "fd00:172:30::41", port("p80", 80, nodePort=3001), type="NodePort"),
            slice_("ns1", "svc1", [endpoint("fd00:10:180::1"), endpoint("fd00:10:180::2:1")], ("p80", 80, "TCP"), family="IPv6"),
            service("ns2", "sticky", "fd00:172:30::42", port("p", 80), sessionAffinity="ClientIP",
                    annotations={"kubeproxy.io/udp-conntrack-timeout": "7s"}),
            slice_("ns2", "sticky", [endpoint("fd00:10:180::3")], ("p", 80, "TCP"), family="IPv6"),
            service("ns3", "dns", "fd00:172:30::10", port("dns", 53, "UDP"),
                    annotations={"kubeproxy.io/udp-conntrack-timeout": "7s"}),
        ]  # fmt: skip
        r = render(view(objs, family=Family.IPV6), options6(), service_cidrs=["fd00:172:30::/112"])
    else:
        opts = {
            "ipv4": options(),
            "nodeport-addresses": options(nodeport_match_all=False, nodeport_ips=("192.168.0.2",)),
            "no-detector": options(local_detector=LocalDetector(), masquerade_all=True),
        }[case]
        r = render(view(FEATURES), opts, service_cidrs=["172.30.0.0/16"])
    netns.run(["nft", "-f", "-"], input=r.text())
    got = listing(netns, r.family)
    assert set(got["chains"]) == set(r.chains)
    assert {n: len(c["rules"]) for n, c in got["chains"].items()} == {n: len(c.rules) for n, c in r.chains.items()}
    assert {n: len(s["elem"]) for n, s in got["sets"].items()} == {n: len(r.elements.get(n, {})) for n in r.sets}
    assert set(got["objects"]) == set(r.objects)


def test_applier_sequence_matches_a_fresh_load(netns: L.NetNS) -> None:
    """Changes go through the diff (in small chunks); after each, the kernel holds what a fresh load of
    the same rendering holds, apart from stale objects waiting for deletion; at the end, not even those."""
    rng = random.Random(7)
    n = 12
    objects = {i: random_service(rng, i) for i in range(n)}
    opts = options()
    clock = [0.0]
    applier = NftApplier("ip", netns, chunk_size=40, stale_delay=1.0, clock=lambda: clock[0])
    r = render(view([o for objs in objects.values() for o in objs]), opts)
    first = applier.apply(r)
    assert first.mode == "create" and first.chunks > 1
    modes = []
    for _ in range(12):
        changed = rng.sample(range(n + 2), rng.randrange(1, 4))
        for i in changed:
            if rng.random() < 0.2:
                objects.pop(i, None)
            else:
                objects[i] = random_service(rng, i)
        r = render(view([o for objs in objects.values() for o in objs]), opts, previous=r,
                   changed_services={(f"ns{i % 3}", f"svc{i}") for i in changed})  # fmt: skip
        clock[0] += 0.5
        modes.append(applier.apply(r).mode)
        assert without(listing(netns), applier.stale) == without(fresh_listing(r), applier.stale)
    assert "incremental" in modes
    clock[0] += 5
    final = applier.apply(r)
    assert final.mode == "noop" and final.operations == final.stale_deleted
    assert applier.stale == []
    assert listing(netns) == fresh_listing(r)


def _counting(run: Callable[..., subprocess.CompletedProcess[str]]) -> tuple[list[list[str]], Callable[..., Any]]:
    calls: list[list[str]] = []

    def wrapped(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return run(argv, **kw)

    return calls, wrapped


def test_noop_resync_sends_nothing_and_one_endpoint_is_four_elements(netns: L.NetNS) -> None:
    calls, run = _counting(netns)
    applier = NftApplier("ip", run)
    r = render(view(FEATURES), options())
    applier.apply(r)
    calls.clear()
    again = render(view(FEATURES), options(), previous=r, changed_services=set())
    result = applier.apply(again)
    assert (result.mode, result.operations, result.invocations, calls) == ("noop", 0, 0, [])
    objs = [dict(o) for o in FEATURES]
    objs[1] = slice_("ns1", "web", [endpoint("10.180.0.1", NODE), endpoint("10.180.2.9", "node2")], ("http", 80, "TCP"))
    changed = render(view(objs), options(), previous=again, changed_services={("ns1", "web")})
    result = applier.apply(changed)
    # the endpoint's selector element for the cluster IP and for the NodePort (a remote pod: no hairpin element)
    assert (result.mode, result.invocations, result.operations) == ("incremental", 1, 4)
    assert len(calls) == 1 and calls[0][:2] == ["nft", "-f"]
    assert listing(netns) == fresh_listing(changed)


def test_full_resync_recovers_a_flushed_or_deleted_table(netns: L.NetNS) -> None:
    applier = NftApplier("ip", netns)
    r = render(view(FEATURES), options())
    applier.apply(r)
    assert applier.table_intact()
    netns.run(["nft", "flush", "table", "ip", "kube-proxy"])
    assert not applier.table_intact()
    assert applier.apply(r, full=True).mode == "full"
    assert applier.table_intact()
    assert listing(netns) == fresh_listing(r)
    netns.run(["nft", "delete", "table", "ip", "kube-proxy"])
    assert not applier.table_intact()
    assert applier.apply(r, full=True).mode == "create"
    assert listing(netns) == fresh_listing(r)
    assert applier.cleanup() and not applier.table_intact()


def test_a_sync_an_hour_after_the_last_full_one_is_full_and_repairs_drift(netns: L.NetNS) -> None:
    # Upstream's nftables proxier: doFullSync once time.Since(lastFullSync) > FullSyncPeriod.
    now = [0.0]
    proxier = NftablesProxier(run=netns, clock=lambda: now[0])
    v, opts = view(FEATURES), options()
    one = frozenset({next(iter(v.services)).service})
    assert proxier.sync(v, opts, None).full
    netns.run(["nft", "flush", "chain", "ip", "kube-proxy", "services"])  # edited behind its back
    now[0] = FULL_SYNC_PERIOD
    assert not proxier.sync(v, opts, one).full and not proxier.sync(v, opts, frozenset()).full
    assert not proxier.rules_intact()
    now[0] = FULL_SYNC_PERIOD + 0.5
    report = proxier.sync(v, opts, frozenset())
    assert report.full and listing(netns) == fresh_listing(report.rendering)
    now[0] = 2 * FULL_SYNC_PERIOD
    assert not proxier.sync(v, opts, frozenset()).full  # counted from the last full one


def test_a_restart_fixes_base_chains_drops_leftovers_and_keeps_affinity(netns: L.NetNS) -> None:
    r = render(view(FEATURES), options())
    # What an older version (or someone else) left: a base chain at another priority, a base
    # chain of the layout before kubernetes PR #132456, an unknown chain, set and ct timeout of
    # ours, and a remembered ClientIP affinity entry.
    old = r.text().replace(
        "filter-input { type filter hook input priority 0 ;", "filter-input { type filter hook input priority -110 ;"
    )
    old += "add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }\n"
    old += "add rule ip kube-proxy filter-output-post-dnat ct state new jump cluster-ips-check\n"
    old += "add chain ip kube-proxy service-OLD-ns/old/tcp/p\nadd rule ip kube-proxy service-OLD-ns/old/tcp/p drop\n"
    old += "add set ip kube-proxy leftover { type ipv4_addr ; }\n"
    old += "add ct timeout ip kube-proxy udp-timeout-99s { protocol udp ; l3proto ip ; policy = { unreplied : 99 } ; }\n"
    old += "add element ip kube-proxy affinity { 203.0.113.7 . 12345 timeout 1h }\n"
    netns.run(["nft", "-f", "-"], input=old)
    applier = NftApplier("ip", netns, stale_delay=0)
    assert applier.apply(r).mode == "full"
    got = listing(netns)
    assert got["chains"]["filter-input"]["def"]["prio"] == 0
    assert "leftover" not in got["sets"] and "udp-timeout-99s" not in got["objects"]
    assert got["chains"]["service-OLD-ns/old/tcp/p"]["rules"] == []  # flushed now, deleted next sync
    assert got["chains"]["filter-output-post-dnat"]["rules"] == []
    assert len(got["sets"]["affinity"]["elem"]) == 1
    assert applier.apply(r).stale_deleted == 2
    got = listing(netns)
    assert "service-OLD-ns/old/tcp/p" not in got["chains"] and "filter-output-post-dnat" not in got["chains"]
    got["sets"]["affinity"]["elem"] = []
    assert got == fresh_listing(r)


def test_stale_objects_wait_for_the_delay(netns: L.NetNS) -> None:
    clock = [100.0]
    applier = NftApplier("ip", netns, stale_delay=1.0, clock=lambda: clock[0])
    r1 = render(view(FEATURES), options())
    applier.apply(r1)
    objs = [o for o in FEATURES if o["metadata"]["name"] not in ("sticky", "dns")]
    r2 = render(view(objs), options(), previous=r1, changed_services={("ns3", "sticky"), ("kube-system", "dns")})
    res = applier.apply(r2)
    assert res.stale_flushed > 0 and res.stale_deleted == 0
    stale = applier.stale
    assert ("ct timeout", "udp-timeout-5s") in stale and ("chain", "udp-timeout-5s") in stale
    assert any(kind == "chain" and "/sticky/" in name for kind, name in stale)
    assert "affinity" not in listing(netns)["sets"]  # sets go at once, once no rule uses them
    clock[0] += 0.5
    assert applier.apply(r2).stale_deleted == 0
    clock[0] += 1
    assert applier.apply(r2).stale_deleted == len(stale)
    assert listing(netns) == fresh_listing(r2)


# ------------------------------------------------------------------------------------------
# Real packets: client -- node (our table) -- pods

NODE_VIEW = [
    service("default", "web", "10.96.10.10", port("http", 80, nodePort=30080), type="NodePort"),
    slice_("default", "web", [endpoint("10.244.1.10", "node"), endpoint("10.244.2.10", "node")], ("http", 8080, "TCP")),
    service("default", "solo", "10.96.10.11", port("http", 80)),
    slice_("default", "solo", [endpoint("10.244.1.10", "node")], ("http", 8080, "TCP")),
    service("default", "gone", "10.96.40.40", port("http", 80)),
    service("default", "dns", "10.96.0.10", port("dns", 53, "UDP"), annotations={"kubeproxy.io/udp-conntrack-timeout": "20s"}),
    slice_("default", "dns", [endpoint("10.244.1.3", "node")], ("dns", 53, "UDP")),
    service("default", "mdns", "10.96.0.11", port("mdns", 5353, "UDP")),
    slice_("default", "mdns", [endpoint("10.244.1.3", "node")], ("mdns", 5353, "UDP")),
]  # fmt: skip
NODE_OPTIONS = {"node_name": "node", "node_ip": "172.16.0.1", "local_detector": LocalDetector("ClusterCIDR", ("10.244.0.0/16",))}


def _send(ns: L.NetNS, proto: str, dst: str, count: int, src: str | None = None) -> list[Any]:
    argv = [*PROBE, "send", "--proto", proto, "--dst", dst, "--count", str(count), "--timeout", "0.5"]
    argv += ["--src", src] if src else []
    outcomes: list[Any] = json.loads(ns.run(argv, timeout=60 + count).stdout)  # as Bed.send's
    return outcomes


def test_real_packets_through_cluster_ip_nodeport_hairpin_and_reject() -> None:
    with bed("172.16.0.2/24", ("eth0", "172.16.0.1/24"), ("eth1", "10.244.0.1/16"),
             ["10.244.1.10/16", "10.244.2.10/16", "10.244.1.3/16"]) as b:  # fmt: skip
        applier = NftApplier("ip", b.node)
        applier.apply(render(view(NODE_VIEW, node="node"), options(**NODE_OPTIONS)))
        b.serve(b.backend, "tcp", ["10.244.1.10:8080", "10.244.2.10:8080"])
        b.serve(b.backend, "udp", ["10.244.1.3:53"])
        endpoints = {"10.244.1.10:8080", "10.244.2.10:8080"}

        seen = b.send("tcp", "10.96.10.10:80", 40, timeout=0.5)
        assert {r["dst"] for r in seen} == endpoints  # both endpoints, with 40 tries (odds 2^-39 to miss one)
        assert {r["src"].rsplit(":", 1)[0] for r in seen} == {"10.244.0.1"}  # off-cluster client: masqueraded

        seen = b.send("tcp", "172.16.0.1:30080", 20, timeout=0.5)
        assert {r["dst"] for r in seen} <= endpoints and len(seen) == 20
        assert {r["src"].rsplit(":", 1)[0] for r in seen} == {"10.244.0.1"}

        seen = b.send("tcp", "10.96.10.10:80", 10, timeout=0.5, from_node=True)  # nat-output path
        assert {r["dst"] for r in seen} <= endpoints and len(seen) == 10

        assert b.send("tcp", "10.96.40.40:80", 3, timeout=0.5) == ["refused"] * 3
        assert b.send("tcp", "10.96.10.10:81", 3, timeout=0.5) == ["refused"] * 3  # cluster-ips-check

        # hairpin: a pod that reaches itself through a service sees the node as source (without
        # the masquerade it would answer itself directly and the connection would never open)
        seen = _send(b.backend, "tcp", "10.96.10.11:80", 5, src="10.244.1.10")
        assert seen == [{"dst": "10.244.1.10:8080", "src": r["src"]} for r in seen]
        assert {r["src"].rsplit(":", 1)[0] for r in seen} == {"10.244.0.1"}

        # scale down through the diff: the removed endpoint gets no new connections
        objs = list(NODE_VIEW)
        objs[1] = slice_("default", "web", [endpoint("10.244.2.10", "node")], ("http", 8080, "TCP"))
        r2 = render(view(objs, node="node"), options(**NODE_OPTIONS), previous=applier.applied,
                    changed_services={("default", "web")})  # fmt: skip
        assert applier.apply(r2).mode == "incremental"
        assert {r["dst"] for r in b.send("tcp", "10.96.10.10:80", 10, timeout=0.5)} == {"10.244.2.10:8080"}


def _udp_timeouts(ns: L.NetNS, port: int) -> list[int]:
    out = ns.run(["conntrack", "-L", "-p", "udp", "--orig-port-dst", str(port)], check=False).stdout
    return [int(m.group(1)) for m in re.finditer(r"^udp\s+17\s+(\d+)\s", out, re.M)]


def test_annotated_udp_service_gets_its_own_conntrack_timeout() -> None:
    with bed("172.16.0.2/24", ("eth0", "172.16.0.1/24"), ("eth1", "10.244.0.1/16"), ["10.244.1.3/16"]) as b:
        NftApplier("ip", b.node).apply(render(view(NODE_VIEW, node="node"), options(**NODE_OPTIONS)))
        # The node's default is raised to 120 s so both sides of the comparison keep a wide margin
        # on a slow machine (a 5 s policy once expired before the read, under CI load).
        b.node.run(["sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=120"])
        b.serve(b.backend, "udp", ["10.244.1.3:53", "10.244.1.3:5353"])
        assert all(isinstance(r, dict) for r in b.send("udp", "10.96.0.10:53", 5, timeout=0.5))
        assert all(isinstance(r, dict) for r in b.send("udp", "10.96.0.11:5353", 5, timeout=0.5))
        annotated, other = _udp_timeouts(b.node, 53), _udp_timeouts(b.node, 5353)
    assert len(annotated) == 5 and len(other) == 5
    assert max(annotated) <= 20  # our ct timeout policy (the entry counts down from 20)
    assert min(other) > 20  # the node's default for a replied UDP flow (120 s here)


def test_a_dynamic_set_of_another_type_is_replaced_in_place(netns: L.NetNS) -> None:
    # an `affinity` set of another type: kept as dynamic, it makes the in-place resync fail
    netns.run(
        ["nft", "-f", "-"],
        input="add table ip kube-proxy\nadd set ip kube-proxy affinity { type ipv4_addr ; flags dynamic,timeout ; }\n",
    )
    applier = NftApplier("ip", netns)
    r = render(view(FEATURES), options())
    assert applier.apply(r).mode == "full"  # the table was never deleted
    assert listing(netns) == fresh_listing(r)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
