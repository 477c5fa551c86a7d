"""The shortcuts taken for 10k+ services build exactly what the plain code builds.

Each shortcut is checked against the straightforward way on inputs where the two could differ:
the endpoint built slot by slot, the four iptables chain names from one hash, nftables' 8-digit
hash prefix, IPv4 text from inet_ntop, and the exact-type check of `Fields`.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import itertools
from typing import Any

import msgspec
import pytest

from kubeproxy.backends.iptables import names
from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.objects import Endpoint, parse_service, read_endpoints
from kubeproxy.cluster.schema import Endpoint as SchemaEndpoint
from kubeproxy.cluster.state import build_state
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family


@pytest.mark.parametrize("flags", list(itertools.product((True, False), repeat=3)))
def test_endpoint_built_slot_by_slot_equals_the_dataclass(flags: tuple[bool, bool, bool]) -> None:
    ready, serving, terminating = flags
    raw = {"addresses": ["10.1.2.3", "10.1.2.4"], "nodeName": "node-1", "zone": "zone-a",
           "conditions": {"ready": ready, "serving": serving, "terminating": terminating}}
    (fast,) = read_endpoints([msgspec.convert(raw, SchemaEndpoint)], "IPv4", CheckCache())
    plain = Endpoint(AddressText("10.1.2.3"), (AddressText("10.1.2.4"),), *flags, node_name="node-1", zone="zone-a")
    assert fast == plain and repr(fast) == repr(plain) and hash(fast) == hash(plain)


@pytest.mark.parametrize("spn", ["ns/svc:http", "default/kubernetes:https", "a/b", "x/" + "y" * 60 + ":p"])
@pytest.mark.parametrize("proto", ["tcp", "udp", "sctp"])
def test_chains_of_gives_the_four_names_the_single_functions_give(spn: str, proto: str) -> None:
    expected = (
        names.service_chain(spn, proto),
        names.local_chain(spn, proto),
        names.external_chain(spn, proto),
        names.firewall_chain(spn, proto),
    )
    assert names.chains_of(spn, proto) == expected


@pytest.mark.parametrize("text", ["", "ns/svc/tcp/http", "bench/svc-9999/tcp/http__10.0.0.1/8080", "ü" * 40])
def test_base32_of_five_bytes_is_the_prefix_of_the_whole_digest(text: str) -> None:
    digest = hashlib.sha256(text.encode()).digest()
    assert base64.b32encode(digest[:5]).decode() == base64.b32encode(digest).decode()[:8]


def _state(family_ips: list[str]) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i, ip in enumerate(family_ips):
        six = ":" in ip
        objs.append({"kind": "Service", "metadata": {"name": f"s{i}", "namespace": "ns"},
                     "spec": {"clusterIP": "fd00::10" if six else "10.96.0.10", "ipFamilies": ["IPv6" if six else "IPv4"],
                              "ports": [{"name": "p", "port": 80}]}})  # fmt: skip
        objs.append({"kind": "EndpointSlice", "metadata": {"name": f"s{i}-1", "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": f"s{i}"}}, "addressType": "IPv6" if six else "IPv4",
                     "endpoints": [{"addresses": [ip], "nodeName": "n1"}], "ports": [{"name": "p", "port": 8080}]})  # fmt: skip
    return objs


@pytest.mark.parametrize("family", [Family.IPV4, Family.IPV6, "IPv4", "IPv6"])
def test_endpoint_text_is_str_of_the_address_in_both_families(family: str) -> None:
    # Not 0.0.0.0 (an endpoint may not be unspecified) nor ::ffff:1.2.3.4 (IPv4 to upstream's parser).
    ips = ["10.0.0.1", "255.255.255.255", "10.200.3.40", "fd00::1", "2001:db8::a:0:1", "2001:DB8::b"]
    state = build_state(_state(ips))[0]
    view = build_view(state.services.values(), state.slices.values(), family, "n1")  # type: ignore[arg-type]
    got = sorted(e.ip for eps in view.endpoints.values() for e in eps)
    want = sorted(str(ipaddress.ip_address(ip)) for ip in ips if (":" in ip) == (family == "IPv6"))
    assert got == want and view.services


@pytest.mark.parametrize(("value", "problem"), [(True, "expected an integer, got bool"), ("80", "expected an integer, got str")])
def test_exact_type_shortcut_still_refuses_true_and_text_for_a_number(value: object, problem: str) -> None:
    obj = {"kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": value}]}}  # fmt: skip
    with pytest.raises(ObjectError, match=problem):
        parse_service(obj)
