"""The node view's fast constructors make exactly what the dataclass constructors make.

`model/node_model.py` builds ServicePortName, ServicePortInfo and EndpointInfo without their frozen
__init__ (see `_twin`). Here each maker is compared with its constructor, and `build_view` with
a straightforward reference built from the constructors alone, on a cluster with what the
fast loops could get wrong: several ports per slice, IPv6, an endpoint listed by two slices
(the local copy wins), conditions and hints, headless and ExternalName Services.
"""

from __future__ import annotations

import copy
import ipaddress
import pickle
from collections.abc import Iterable
from typing import Any

import pytest

from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.objects import EndpointSlice, Service
from kubeproxy.cluster.state import build_state
from kubeproxy.model import node_model
from kubeproxy.model.node_model import EndpointInfo, ServicePortInfo, ServicePortName, build_view
from kubeproxy.model.options import Family
from tests.backends.nftables.helpers import endpoint, port, service, slice_

NODE = "node-a"


def test_the_fast_port_name_is_the_constructed_one() -> None:
    fast = node_model._new_port_name("ns", "web", "http", "TCP")
    made = ServicePortName("ns", "web", "http", "TCP")
    assert type(fast) is ServicePortName
    assert fast == made and hash(fast) == hash(made) and fast.service == made.service == ("ns", "web")
    assert str(fast) == str(made) and repr(fast) == repr(made)
    assert not fast < made and not made < fast
    assert pickle.loads(pickle.dumps(fast)) == made and copy.copy(fast) == made
    assert {fast: 1}[made] == 1
    with pytest.raises(AttributeError):
        fast.port = "other"  # type: ignore[misc]  # still frozen


def test_the_fast_port_info_is_the_constructed_one() -> None:
    name = ServicePortName("ns", "web", "http", "TCP")
    values: dict[str, Any] = {
        "name": name,
        "cluster_ip": ipaddress.ip_address("172.30.0.1"),
        "port": 80,
        "protocol": "TCP",
        "node_port": 30080,
        "external_ips": (ipaddress.ip_address("192.168.9.9"),),
        "load_balancer_vips": (ipaddress.ip_address("1.2.3.4"),),
        "load_balancer_source_ranges": (ipaddress.ip_network("10.0.0.0/8"),),
        "health_check_node_port": 32000,
        "client_ip_affinity": True,
        "sticky_max_age_seconds": 60,
        "internal_policy_local": True,
        "external_policy_local": True,
        "annotations": {"a": "b"},
    }
    fast = node_model._new_port_info(*values.values())
    made = ServicePortInfo(**values)
    assert type(fast) is ServicePortInfo and fast == made and repr(fast) == repr(made)
    with pytest.raises(AttributeError):
        fast.port = 81  # type: ignore[misc]  # frozen: the assignment must raise


def _objects() -> list[dict[str, Any]]:
    two_ports = [("http", 80, "TCP"), ("dns", 53, "UDP")]
    return [
        service("ns1", "web", "172.30.0.1", port("http", 80), port("dns", 53, "UDP"), type="NodePort",
                externalIPs=["192.168.9.9", "2001:db8::9"], externalTrafficPolicy="Local", sessionAffinity="ClientIP",
                ipFamilies=["IPv4", "IPv6"], clusterIPs=["172.30.0.1", "fd00::1"], ipFamilyPolicy="PreferDualStack"),
        # One endpoint in both slices: remote in the first, local in the second (the local copy wins).
        slice_("ns1", "web", [endpoint("10.1.0.2", "node-b"), endpoint("10.1.0.1", NODE),
                              endpoint("10.1.0.3", "node-b", ready=False, serving=True, terminating=True)], *two_ports),
        slice_("ns1", "web", [endpoint("10.1.0.2", NODE, zone_hints=["z1"]), endpoint("10.1.0.10")], *two_ports, n=2),
        slice_("ns1", "web", [endpoint("fd00:10::2", NODE), endpoint("fd00:10::1")], *two_ports, n=3, family="IPv6"),
        service("ns2", "lb", "172.30.0.2", port("", 443), type="LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/8"],
                status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}, {"ip": "1.2.3.5", "ipMode": "Proxy"}]}}),
        slice_("ns2", "lb", [endpoint("10.2.0.1", "node-b")], ("", 8443, "TCP")),
        slice_("ns2", "lb", [], ("", 8443, "TCP"), n=2),  # an empty slice adds no port of its own
        service("ns3", "headless", "None", port("x", 1)),
        slice_("ns3", "headless", [endpoint("10.3.0.1")], ("x", 1, "TCP")),
        service("ns3", "ext", "", type="ExternalName", externalName="example.com"),
    ]  # fmt: skip


def _reference(services: Iterable[Service], slices: Iterable[EndpointSlice], family: Family) -> node_model.NodeView:
    """build_view as the model describes it, with the constructors and nothing clever."""
    version = 6 if family == Family.IPV6 else 4
    ports: dict[ServicePortName, ServicePortInfo] = {}
    for svc in services:
        for name, info in node_model.ports_of_service(svc, family).items():
            built = ServicePortInfo(**{f: getattr(info, f) for f in ServicePortInfo.__dataclass_fields__})
            ports[ServicePortName(name.namespace, name.name, name.port, name.protocol)] = built
    by_port: dict[ServicePortName, dict[str, EndpointInfo]] = {}
    for eps in slices:
        if eps.address_type != family:
            continue
        for p in eps.ports:
            bucket = by_port.setdefault(ServicePortName(eps.namespace, eps.service_name, p.name, p.protocol), {})
            for ep in eps.endpoints:
                ip = ipaddress.ip_address(ep.addresses[0])
                if ip.version != version:
                    continue
                local = ep.node_name == NODE
                ep_info = EndpointInfo(
                    AddressText(str(ip)), p.port, local, ep.ready, ep.serving, ep.terminating, ep.zone_hints, ep.node_hints
                )
                if ep_info.address not in bucket or local:
                    bucket[ep_info.address] = ep_info
    endpoints = {name: sorted(b.values(), key=lambda e: e.address) for name, b in by_port.items() if b}
    return node_model.NodeView(ports, endpoints)


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
def test_build_view_equals_the_reference(family: Family) -> None:
    state, warnings = build_state(_objects())
    assert not warnings, warnings
    got = build_view(state.services.values(), state.slices.values(), family, NODE)
    want = _reference(state.services.values(), state.slices.values(), family)
    assert got.services == want.services
    assert got.endpoints == want.endpoints
    assert [list(map(repr, e)) for e in got.endpoints.values()] == [list(map(repr, e)) for e in want.endpoints.values()]
    # equal is not enough where it matters: the flags the endpoint's address text carries
    for eps in got.endpoints.values():
        for e in eps:
            assert type(e) is EndpointInfo and e.address == (f"[{e.ip}]:{e.port}" if ":" in e.ip else f"{e.ip}:{e.port}")
    if family == Family.IPV4:
        web = got.endpoints[ServicePortName("ns1", "web", "http", "TCP")]
        assert [(e.ip, e.is_local, e.zone_hints) for e in web if e.ip == "10.1.0.2"] == [("10.1.0.2", True, frozenset({"z1"}))]
        assert len(got.endpoints[ServicePortName("ns1", "web", "dns", "UDP")]) == 4
        lb = got.services[ServicePortName("ns2", "lb", "", "TCP")]
        assert lb.load_balancer_vips == (ipaddress.ip_address("1.2.3.4"),) and lb.load_balancer_source_ranges
    else:
        assert [e.ip for e in got.endpoints[ServicePortName("ns1", "web", "http", "TCP")]] == ["fd00:10::1", "fd00:10::2"]


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6])
def test_the_view_shares_the_slices_address_text_and_makes_ip_port_only_when_asked(family: Family) -> None:
    # Memory at 10k x 10: one text per endpoint, held by the slice and the view alike,
    # and no `ip:port` text in nftables mode, which never reads it.
    from kubeproxy.backends.nftables.render import render as render_nft
    from tests.backends.nftables.helpers import options, options6

    state, _ = build_state(_objects())
    view = build_view(state.services.values(), state.slices.values(), family, NODE)
    texts = {id(ep.address) for s in state.slices.values() for ep in s.endpoints}
    infos = [e for eps in view.endpoints.values() for e in eps]
    assert infos and all(id(e.ip) in texts for e in infos)
    render_nft(view, options6() if family == Family.IPV6 else options())
    assert all(e._address is None for e in infos)
    assert [e.address for e in infos] == [node_model.address_text(e) for e in infos]
    assert all(e._address is e.address for e in infos)  # made once, then kept
