"""The nftables renderer, feature by feature (pure: no kernel)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kubeproxy.backends.nftables import naming
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.backends.nftables.table_objects import CtTimeout
from kubeproxy.cluster.addresses import AddressText
from kubeproxy.model.node_model import ServicePortName
from kubeproxy.model.options import Family
from kubeproxy.model.proxy_config import LocalDetector
from tests.backends.nftables.helpers import NODE, endpoint, options, options6, port, service, slice_, view


def values(r: NftRendering, set_name: str) -> dict[str, str | None]:
    return {k: e.value for k, e in r.elements.get(set_name, {}).items()}


def rules(r: NftRendering, chain: str) -> list[str]:
    return [x.body() for x in r.chains[chain].rules]


def web(*eps: dict[str, Any], **spec: object) -> list[dict[str, Any]]:
    return [
        service("ns1", "web", "172.30.0.41", port("http", 80), **spec),
        slice_("ns1", "web", eps, ("http", 80, "TCP")),
    ]


def test_base_chains_hooks_and_priorities_are_upstreams() -> None:
    r = render(view([]), options())
    hooks = {n: (c.base.type, c.base.hook, c.base.priority) for n, c in r.chains.items() if c.base}
    assert hooks == {  # since kubernetes PR #132456: the no-endpoint checks come after DNAT
        "filter-prerouting-pre-dnat": ("filter", "prerouting", -110),
        "filter-output-pre-dnat": ("filter", "output", -110),
        "filter-input": ("filter", "input", 0),
        "filter-forward": ("filter", "forward", 0),
        "filter-output": ("filter", "output", 0),
        "nat-prerouting": ("nat", "prerouting", -100),
        "nat-output": ("nat", "output", -100),
        "nat-postrouting": ("nat", "postrouting", 100),
    }
    assert rules(r, "filter-input") == ["ct state new jump nodeport-endpoints-check", "ct state new jump service-endpoints-check"]
    assert rules(r, "filter-output") == ["ct state new jump service-endpoints-check", "ct state new jump cluster-ips-check"]
    assert rules(r, "filter-output-pre-dnat") == rules(r, "filter-prerouting-pre-dnat") == ["ct state new jump firewall-check"]
    assert rules(r, "masquerading")[1:] == ["mark and 0x4000 == 0 return", "mark set mark xor 0x4000", "masquerade fully-random"]
    assert r.text().startswith('add table ip kube-proxy { comment "rules for kube-proxy" ; }\n')


def test_cluster_ip_dispatches_through_a_shared_selector() -> None:
    r = render(view(web(endpoint("10.180.0.1", NODE), endpoint("10.180.0.2", NODE), endpoint("10.180.0.3"))), options())
    assert values(r, "cluster-ips") == {"172.30.0.41": None}
    assert values(r, "service-ips") == {"172.30.0.41 . tcp . 80": "goto cluster-endpoints-3"}
    assert values(r, "cluster-endpoints-3") == {
        "172.30.0.41 . tcp . 80 . 0": "10.180.0.1 . 80",
        "172.30.0.41 . tcp . 80 . 1": "10.180.0.2 . 80",
        "172.30.0.41 . tcp . 80 . 2": "10.180.0.3 . 80",
    }
    assert rules(r, "cluster-endpoints-3") == [
        "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @cluster-endpoints-3"
    ]
    # hairpin: this node's endpoints only (a remote pod's traffic to a cluster IP is DNATed by its node)
    assert set(values(r, "hairpin")) == {f"10.180.0.{i} . 10.180.0.{i}" for i in (1, 2)}
    # no per-service chain: a service port without affinity costs elements only
    assert not [n for n in r.chains if naming.is_service_chain(n)]
    assert rules(r, "services")[0] == (
        "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
        ' comment "masquerade off-cluster traffic to cluster IPs"'
    )


def test_services_with_equal_endpoint_counts_share_one_selector() -> None:
    objs = web(endpoint("10.180.0.1"), endpoint("10.180.0.2"))
    objs += [
        service("ns2", "api", "172.30.0.42", port("", 443)),
        slice_("ns2", "api", [endpoint("10.180.1.1"), endpoint("10.180.1.2")], ("", 443, "TCP")),
    ]
    r = render(view(objs), options())
    assert [n for n in r.chains if "endpoints-" in n and not n.endswith("check")] == ["cluster-endpoints-2"]
    assert len(values(r, "cluster-endpoints-2")) == 4


def test_no_endpoints_reject_everywhere() -> None:
    objs = [
        service(
            "ns1",
            "svc1",
            "172.30.0.41",
            port("p80", 80, nodePort=3001),
            type="LoadBalancer",
            externalIPs=["192.168.99.11"],
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
        )
    ]
    r = render(view(objs), options())
    assert values(r, "no-endpoint-services") == {
        "172.30.0.41 . tcp . 80": "goto reject-chain",
        "192.168.99.11 . tcp . 80": "goto reject-chain",
        "1.2.3.4 . tcp . 80": "goto reject-chain",
    }
    assert values(r, "no-endpoint-nodeports") == {"tcp . 3001": "goto reject-chain"}
    assert r.elements["no-endpoint-services"]["172.30.0.41 . tcp . 80"].comment == "ns1/svc1:p80"
    assert not values(r, "service-ips") and not values(r, "service-nodeports")


def test_nodeport_external_ip_and_lb_cluster_policy_masquerade() -> None:
    objs = [
        service(
            "ns1",
            "svc1",
            "172.30.0.41",
            port("p80", 80, nodePort=3001),
            type="LoadBalancer",
            externalIPs=["192.168.99.11"],
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
        ),
        slice_("ns1", "svc1", [endpoint("10.180.0.1")], ("p80", 80, "TCP")),
    ]
    r = render(view(objs), options())
    assert values(r, "service-ips")["192.168.99.11 . tcp . 80"] == "goto external-cluster-1"
    assert values(r, "service-ips")["1.2.3.4 . tcp . 80"] == "goto external-cluster-1"
    assert values(r, "service-nodeports") == {"tcp . 3001": "goto nodeport-external-cluster-1"}
    assert rules(r, "external-cluster-1") == ["jump mark-for-masquerade", "goto cluster-endpoints-1"]
    assert rules(r, "nodeport-external-cluster-1") == ["jump mark-for-masquerade", "goto nodeport-cluster-endpoints-1"]
    assert values(r, "nodeport-cluster-endpoints-1") == {"tcp . 3001 . 0": "10.180.0.1 . 80"}
    assert values(r, "cluster-endpoints-1")["1.2.3.4 . tcp . 80 . 0"] == "10.180.0.1 . 80"
    assert (
        rules(r, "services")[-1] == "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
    )


def test_nodeport_addresses_fill_nodeport_ips_without_loopback() -> None:
    r = render(view([]), options(nodeport_match_all=False, nodeport_ips=("192.168.0.2", "127.0.0.1")))
    assert values(r, "nodeport-ips") == {"192.168.0.2": None}
    assert rules(r, "services")[-1] == "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"
    assert rules(r, "nodeport-endpoints-check") == ["ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"]
    assert "nodeport-ips" not in render(view([]), options()).sets  # match-all: upstream deletes the set


def test_external_traffic_policy_local() -> None:
    objs = [
        service(
            "ns2",
            "svc2",
            "172.30.0.42",
            port("p80", 80, nodePort=3001),
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=30000,
            externalIPs=["192.168.99.22"],
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
        ),
        slice_("ns2", "svc2", [endpoint("10.180.0.2"), endpoint("10.180.0.5", NODE)], ("p80", 80, "TCP")),
    ]
    r = render(view(objs), options())
    assert values(r, "service-ips")["1.2.3.4 . tcp . 80"] == "goto external-local-2-1"
    assert rules(r, "external-local-2-1") == [
        'ip saddr 10.0.0.0/8 goto cluster-endpoints-2 comment "short-circuit pod traffic"',
        'fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"',
        'fib saddr type local goto cluster-endpoints-2 comment "short-circuit local traffic"',
        "goto local-endpoints-1",
    ]
    assert values(r, "local-endpoints-1") == {
        "1.2.3.4 . tcp . 80 . 0": "10.180.0.5 . 80",
        "192.168.99.22 . tcp . 80 . 0": "10.180.0.5 . 80",
    }
    assert values(r, "nodeport-local-endpoints-1") == {"tcp . 3001 . 0": "10.180.0.5 . 80"}
    # the cluster IP keeps Cluster policy
    assert values(r, "service-ips")["172.30.0.42 . tcp . 80"] == "goto cluster-endpoints-2"
    # pods of other nodes may reach the NodePort and be short-circuited to themselves: all hairpin
    assert set(values(r, "hairpin")) == {"10.180.0.2 . 10.180.0.2", "10.180.0.5 . 10.180.0.5"}
    # the health check node port is not ours to block: nothing mentions it
    assert "30000" not in r.text()
    assert r.no_local_endpoints_external == 0


def test_external_traffic_policy_local_without_local_endpoints_drops() -> None:
    objs = [
        service(
            "ns2",
            "svc2",
            "172.30.0.42",
            port("p80", 80, nodePort=3001),
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=30000,
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
        ),
        slice_("ns2", "svc2", [endpoint("10.180.0.2")], ("p80", 80, "TCP")),
    ]
    r = render(view(objs), options())
    assert values(r, "no-endpoint-services") == {"1.2.3.4 . tcp . 80": "drop"}
    assert values(r, "no-endpoint-nodeports") == {"tcp . 3001": "drop"}
    assert values(r, "service-ips")["1.2.3.4 . tcp . 80"] == "goto external-local-1-0"
    assert (
        rules(r, "external-local-1-0")[-1]
        == 'fib saddr type local goto cluster-endpoints-1 comment "short-circuit local traffic"'
    )
    assert (r.no_local_endpoints_internal, r.no_local_endpoints_external) == (0, 1)


def test_internal_traffic_policy_local() -> None:
    objs = web(endpoint("10.180.0.1", NODE), endpoint("10.180.2.1", "node2"), internalTrafficPolicy="Local")
    r = render(view(objs), options())
    assert values(r, "service-ips") == {"172.30.0.41 . tcp . 80": "goto local-endpoints-1"}
    assert values(r, "local-endpoints-1") == {"172.30.0.41 . tcp . 80 . 0": "10.180.0.1 . 80"}
    none_local = render(view(web(endpoint("10.180.2.1", "node2"), internalTrafficPolicy="Local")), options())
    assert values(none_local, "no-endpoint-services") == {"172.30.0.41 . tcp . 80": "drop"}
    assert none_local.no_local_endpoints_internal == 1


def test_load_balancer_source_ranges() -> None:
    objs = [
        service(
            "ns5",
            "svc5",
            "172.30.0.45",
            port("p80", 80, nodePort=3002),
            type="LoadBalancer",
            loadBalancerSourceRanges=[" 203.0.113.0/25", "192.168.0.0/24"],
            status={"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}},
        ),
        slice_("ns5", "svc5", [endpoint("10.180.0.3")], ("p80", 80, "TCP")),
    ]
    r = render(view(objs), options())
    spn = ServicePortName("ns5", "svc5", "p80", "TCP")
    chain, allowed = naming.firewall_chain(spn), naming.firewall_set(spn)
    assert values(r, "firewall-ips") == {"5.6.7.8 . tcp . 80": f"goto {chain}"}
    # the node's own IP is in a range: the VIP is an allowed source too (VIP-like load balancers)
    assert set(values(r, allowed)) == {"203.0.113.0/25", "192.168.0.0/24", "5.6.7.8/32"}
    assert rules(r, chain) == [f"ip saddr != @{allowed} drop"]
    # firewall entries exist with or without endpoints, as upstream's
    no_eps = render(view(objs[:1]), options())
    assert values(no_eps, "firewall-ips") == {"5.6.7.8 . tcp . 80": f"goto {chain}"}


@pytest.mark.parametrize(
    ("ranges", "expected"),
    [
        # The node's IP is in 128/1, so the VIP (in 0/1) is added: one interval. (0.0.0.0/0 itself
        # means no firewall at all: tests/model/test_source_ranges.py.)
        (["128.0.0.0/1", "0.0.0.0/1"], {"0.0.0.0/0"}),
        (["10.0.0.0/8", "10.1.0.0/16"], {"10.0.0.0/8"}),
        (["203.0.113.0/25", "203.0.113.128/25"], {"203.0.113.0/24"}),
        (["203.0.113.7/32", "203.0.113.7/32"], {"203.0.113.7/32"}),
    ],
)
def test_source_ranges_become_disjoint_intervals(ranges: list[str], expected: set[str]) -> None:
    """An interval set refuses overlapping elements ("File exists"): valid ranges overlap often."""
    objs = [
        service("ns5", "svc5", "172.30.0.45", port("p80", 80, nodePort=3002), type="LoadBalancer",
                loadBalancerSourceRanges=ranges, status={"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}),
    ]  # fmt: skip
    r = render(view(objs), options())
    assert set(values(r, naming.firewall_set(ServicePortName("ns5", "svc5", "p80", "TCP")))) == expected


def test_client_ip_affinity_keeps_upstream_chains_with_a_shared_set() -> None:
    objs = [
        service(
            "ns5",
            "svc5",
            "172.30.0.45",
            port("p80", 80, nodePort=3002),
            type="NodePort",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
        ),
        slice_("ns5", "svc5", [endpoint("10.180.0.3"), endpoint("10.180.0.4")], ("p80", 80, "TCP")),
    ]
    r = render(view(objs), options())
    svc, ext = "service-HVFWP5L3-ns5/svc5/tcp/p80", "external-HVFWP5L3-ns5/svc5/tcp/p80"
    ep3 = "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"  # upstream's names for the same endpoint
    ep4 = naming.endpoint_chain(next(iter(r.sources)), AddressText("10.180.0.4"), 80)
    id3, id4 = naming.affinity_id(ep3), naming.affinity_id(ep4)
    assert values(r, "service-ips") == {"172.30.0.45 . tcp . 80": f"goto {svc}"}
    assert values(r, "service-nodeports") == {"tcp . 3002": f"goto {ext}"}
    assert rules(r, svc) == [
        f"ip saddr . numgen random mod 1 offset {id3} @affinity goto {ep3}",
        f"ip saddr . numgen random mod 1 offset {id4} @affinity goto {ep4}",
        f"numgen random mod 2 0 goto {ep3}",
        f"goto {ep4}",
    ]
    assert rules(r, ep3) == [
        "ip saddr 10.180.0.3 jump mark-for-masquerade",
        f"update @affinity {{ ip saddr . numgen random mod 1 offset {id3} timeout 10800s }}",
        "meta l4proto tcp dnat to 10.180.0.3:80",
    ]
    assert rules(r, ext) == ["jump mark-for-masquerade", f"goto {svc}"]
    assert r.sets["affinity"].flags == ("dynamic", "timeout")


@pytest.mark.parametrize(
    ("detector", "expected"),
    [
        (LocalDetector("ClusterCIDR", ("10.0.0.0/8",)), "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 jump mark-for-masquerade"),
        (LocalDetector("NodeCIDR", ("10.0.1.0/24",)), "ip daddr @cluster-ips ip saddr != 10.0.1.0/24 jump mark-for-masquerade"),
        (LocalDetector("BridgeInterface", (), "cbr0"), 'ip daddr @cluster-ips iifname != "cbr0" jump mark-for-masquerade'),
        (LocalDetector("InterfaceNamePrefix", (), "veth"), 'ip daddr @cluster-ips iifname != "veth*" jump mark-for-masquerade'),
        (LocalDetector(), None),
    ],
)
def test_local_traffic_detectors(detector: LocalDetector, expected: str | None) -> None:
    r = render(view(web(endpoint("10.180.0.1"))), options(local_detector=detector))
    first = r.chains["services"].rules[0].text
    if expected is None:
        assert first == "ip daddr . meta l4proto . th dport vmap @service-ips"
    else:
        assert first == expected


def test_masquerade_all() -> None:
    r = render(view(web(endpoint("10.180.0.1"))), options(masquerade_all=True))
    assert r.chains["services"].rules[0].text == "ip daddr @cluster-ips jump mark-for-masquerade"


def test_terminating_endpoints_are_the_fallback() -> None:
    objs = web(
        endpoint("10.180.0.1", ready=False, serving=True, terminating=True),
        endpoint("10.180.0.2", ready=False, serving=False, terminating=True),
    )
    r = render(view(objs), options())
    assert values(r, "cluster-endpoints-1") == {"172.30.0.41 . tcp . 80 . 0": "10.180.0.1 . 80"}
    ready = render(
        view(web(endpoint("10.180.0.1", ready=False, serving=True, terminating=True), endpoint("10.180.0.3"))), options()
    )
    assert values(ready, "cluster-endpoints-1") == {"172.30.0.41 . tcp . 80 . 0": "10.180.0.3 . 80"}


def test_topology_zone_hints() -> None:
    objs = web(endpoint("10.180.0.1", zone_hints=["zone-a"]), endpoint("10.180.0.2", zone_hints=["zone-b"]))
    r = render(view(objs), options(node_labels={"topology.kubernetes.io/zone": "zone-a"}))
    assert values(r, "cluster-endpoints-1") == {"172.30.0.41 . tcp . 80 . 0": "10.180.0.1 . 80"}


def test_service_cidrs_drop_unallocated_cluster_ips() -> None:
    r = render(view([]), options(), service_cidrs=["172.30.0.0/16", "fd00:10:96::/112"])
    assert rules(r, "cluster-ips-check") == [
        'ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
        'ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"',
    ]


def test_ipv6() -> None:
    objs = [
        service("ns1", "svc1", "fd00:172:30::41", port("p80", 80, nodePort=3001), type="NodePort"),
        slice_("ns1", "svc1", [endpoint("fd00:10:180::1"), endpoint("fd00:10:180::2:1")], ("p80", 80, "TCP"), family="IPv6"),
    ]
    r = render(view(objs, family=Family.IPV6), options6())
    assert r.family == "ip6" and r.table == "ip6 kube-proxy"
    assert values(r, "cluster-endpoints-2")["fd00:172:30::41 . tcp . 80 . 1"] == "fd00:10:180::2:1 . 80"
    assert rules(r, "cluster-endpoints-2") == [
        "dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 2 map @cluster-endpoints-2"
    ]
    assert rules(r, "services")[-1] == "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports"
    assert r.sets["cluster-ips"].type == "ipv6_addr"


def test_ipv6_affinity_endpoint_dnat_has_brackets() -> None:
    objs = [
        service("ns1", "svc1", "fd00:172:30::41", port("p80", 80), sessionAffinity="ClientIP"),
        slice_("ns1", "svc1", [endpoint("fd00:10:180::1")], ("p80", 80, "TCP"), family="IPv6"),
    ]
    r = render(view(objs, family=Family.IPV6), options6())
    ep = "endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80"  # upstream's name
    assert rules(r, ep)[-1] == "meta l4proto tcp dnat to [fd00:10:180::1]:80"


UDP_DNS = [
    service(
        "kube-system",
        "dns",
        "172.30.0.10",
        port("dns", 53, "UDP", nodePort=30053),
        port("dns-tcp", 53),
        type="NodePort",
        annotations={"kubeproxy.io/udp-conntrack-timeout": "5s"},
    ),
    slice_("kube-system", "dns", [endpoint("10.180.0.53")], ("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")),
]


def test_udp_conntrack_timeout_annotation() -> None:
    r = render(view(UDP_DNS), options())
    timeout = r.objects["udp-timeout-5s"]
    assert isinstance(timeout, CtTimeout) and dict(timeout.policy) == {"unreplied": 5, "replied": 5}
    assert values(r, "udp-timeouts") == {"172.30.0.10 . udp . 53": "goto udp-timeout-5s"}  # not the TCP port
    assert values(r, "udp-timeout-nodeports") == {"udp . 30053": "goto udp-timeout-5s"}
    assert rules(r, "udp-timeout-5s") == ['ct timeout set "udp-timeout-5s"']
    # after conntrack made the entry (-200), before DNAT rewrites the service address (-100)
    base = r.chains["conntrack-prerouting"].base
    assert base is not None and base.priority == -150
    assert rules(r, "conntrack-output") == [
        "ct state new meta l4proto udp ip daddr . meta l4proto . th dport vmap @udp-timeouts",
        "ct state new meta l4proto udp fib daddr type local ip daddr != 127.0.0.0/8"
        " meta l4proto . th dport vmap @udp-timeout-nodeports",
    ]
    assert r.warnings == ()
    assert (
        "add ct timeout ip kube-proxy udp-timeout-5s { protocol udp ; l3proto ip ; policy = { unreplied : 5, replied : 5 } ; }"
        in r.text()
    )


def test_no_annotation_no_conntrack_chains() -> None:
    r = render(view(web(endpoint("10.180.0.1"))), options())
    assert "conntrack-prerouting" not in r.chains and not r.objects and "udp-timeouts" not in r.sets


@pytest.mark.parametrize("value", ["5x", "0s", "-5s", "", "300ms", "1000h"])
def test_invalid_udp_timeout_warns_and_keeps_the_default(value: str) -> None:
    objs = [
        dict(UDP_DNS[0], metadata={**UDP_DNS[0]["metadata"], "annotations": {"kubeproxy.io/udp-conntrack-timeout": value}}),
        UDP_DNS[1],
    ]
    r = render(view(objs), options())
    assert not r.objects and "udp-timeouts" not in r.sets
    assert len(r.warnings) == 1
    assert r.warnings[0].startswith(f"Service kube-system/dns: annotation kubeproxy.io/udp-conntrack-timeout={value!r}: ")
    assert r.warnings[0].endswith("the default UDP conntrack timeout is kept")


def test_timeout_rounds_up_to_whole_seconds() -> None:
    objs = [
        dict(UDP_DNS[0], metadata={**UDP_DNS[0]["metadata"], "annotations": {"kubeproxy.io/udp-conntrack-timeout": "1.5s"}}),
        UDP_DNS[1],
    ]
    assert "udp-timeout-2s" in render(view(objs), options()).objects


def test_two_ports_share_the_cluster_ip_element() -> None:
    objs = [
        service("ns1", "svc", "172.30.0.41", port("a", 80), port("b", 81)),
        slice_("ns1", "svc", [endpoint("10.180.0.1")], ("a", 80, "TCP"), ("b", 81, "TCP")),
    ]
    full = render(view(objs), options())
    assert values(full, "cluster-ips") == {"172.30.0.41": None}
    # drop port b: the cluster IP stays, claimed by port a
    objs2 = [service("ns1", "svc", "172.30.0.41", port("a", 80)), objs[1]]
    inc = render(view(objs2), options(), previous=full, changed_services={("ns1", "svc")})
    assert values(inc, "cluster-ips") == {"172.30.0.41": None}
    assert values(inc, "cluster-endpoints-1") == {"172.30.0.41 . tcp . 80 . 0": "10.180.0.1 . 80"}


def test_text_loads_in_order_definitions_before_use() -> None:
    text = render(view(UDP_DNS + web(endpoint("10.180.0.1"))), options()).text().splitlines()
    first_rule = next(i for i, line in enumerate(text) if line.startswith("add rule"))
    first_element = next(i for i, line in enumerate(text) if line.startswith("add element"))
    assert all(not line.startswith(("add chain", "add set", "add map", "add ct timeout")) for line in text[first_rule:])
    assert first_rule < first_element


def test_renderer_does_not_depend_on_iptables_only_options() -> None:
    v = view(web(endpoint("10.180.0.1")))
    a = render(v, options())
    b = render(v, dataclasses.replace(options(), random_fully=True, nfacct_counters=("x",), conntrack_tcp_liberal=True))
    assert a.text() == b.text()
