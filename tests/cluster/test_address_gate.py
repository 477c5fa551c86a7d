"""Every address of a Service, EndpointSlice or Node passes one gate, per field, on every parse path.

Upstream facts used as fixtures (kubernetes/kubernetes):
- ParseIPSloppy (k8s.io/utils/net) takes leading-zero IPv4 octets and no zone, no spaces;
- Service spec.externalIPs: IsValidIP then ValidateNonSpecialIP (pkg/apis/core/validation/
  validation.go, ValidateService): not unspecified, loopback (127/8, ::1), link-local
  (169.254/16, fe80::/10) or link-local multicast (224.0.0.0/24, ffX2::); 255.255.255.255 and
  224.0.1.1 pass;
- status.loadBalancer.ingress[].ip and spec.clusterIPs: IsValidIP only;
- EndpointSlice addresses (pkg/apis/discovery/validation/validation.go, validateEndpoints):
  IsValidIPv4Address / IsValidIPv6Address of the slice's addressType, then ValidateNonSpecialIP.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeproxy.cluster import typed
from kubeproxy.cluster.checks import CheckCache
from kubeproxy.cluster.manifests import parse_documents
from kubeproxy.cluster.state import build_state
from kubeproxy.cluster.validation import ParseOptions

INJECTION = "fd00::99%1\n-I KUBE-SERVICES 1 -j RETURN\nCOMMIT\n*filter\n-I INPUT 1 -p tcp --dport 22 -j DROP\nCOMMIT\n*nat\n#"


def service(**spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "fd00:96::10", "ports": [{"name": "http", "port": 80}]},
    }  # fmt: skip
    status = spec.pop("status", None)
    obj["spec"].update(spec)
    if status is not None:
        obj["status"] = status
    return obj


def endpoint_slice(address_type: str, *addresses: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": address_type, "endpoints": [{"addresses": list(addresses)}],
        "ports": [{"name": "http", "port": 8080}],
    }  # fmt: skip


def node(address: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]}}  # fmt: skip


def outcomes(obj: dict[str, Any]) -> list[str]:
    """The warnings of the dict path and of the typed (msgspec) path, which must be the same."""
    _, dict_warnings = build_state([copy.deepcopy(obj)])
    item = typed.as_item(copy.deepcopy(obj))
    assert item is not None  # the object is within the schema: the typed path sees it first
    typed_result = typed.parse_item(item, ParseOptions(), CheckCache())
    _, state_warnings = build_state([item])
    assert state_warnings == dict_warnings
    if dict_warnings:
        assert typed_result is None  # the typed path leaves a refusal to the dict path's words
    return dict_warnings


REFUSED_SERVICES = [
    ({"externalIPs": [INJECTION]}, "spec.externalIPs[0]", "not a valid IP address"),
    ({"clusterIP": INJECTION, "clusterIPs": [INJECTION]}, "spec.clusterIPs[0]", "not a valid IP address"),
    ({"clusterIP": "fd00:96::10%eth0", "clusterIPs": ["fd00:96::10%eth0"]}, "spec.clusterIPs[0]", "not a valid IP"),
    ({"status": {"loadBalancer": {"ingress": [{"ip": INJECTION}]}}}, "status.loadBalancer.ingress[0].ip", "not a valid IP"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": ["fd00::%1/64"]}, "spec.loadBalancerSourceRanges[0]", "not a valid"),
    ({"externalIPs": ["127.0.0.1"]}, "spec.externalIPs[0]", "loopback"),
    ({"externalIPs": ["::1"]}, "spec.externalIPs[0]", "loopback"),
    ({"externalIPs": ["0.0.0.0"]}, "spec.externalIPs[0]", "unspecified"),
    ({"externalIPs": ["::"]}, "spec.externalIPs[0]", "unspecified"),
    ({"externalIPs": ["169.254.169.254"]}, "spec.externalIPs[0]", "link-local range"),
    ({"externalIPs": ["fe80::1"]}, "spec.externalIPs[0]", "link-local range"),
    ({"externalIPs": ["224.0.0.1"]}, "spec.externalIPs[0]", "link-local multicast"),
    ({"externalIPs": ["ff02::1"]}, "spec.externalIPs[0]", "link-local multicast"),
    ({"externalIPs": ["::ffff:127.0.0.1"]}, "spec.externalIPs[0]", "loopback"),
    ({"externalIPs": [" 10.0.0.1"]}, "spec.externalIPs[0]", "not a valid IP"),
    ({"externalIPs": ["\u0661\u0660.0.0.1"]}, "spec.externalIPs[0]", "not a valid IP"),
    ({"externalIPs": ["10.0.0.1\x00"]}, "spec.externalIPs[0]", "not a valid IP"),
]


@pytest.mark.parametrize(("spec", "field", "problem"), REFUSED_SERVICES)
def test_a_service_with_a_refused_address_is_skipped_with_a_warning(spec: dict[str, Any], field: str, problem: str) -> None:
    warnings = outcomes(service(**spec))
    assert len(warnings) == 1
    assert warnings[0].startswith(f"skipping Service default/web: {field}: ") and problem in warnings[0]
    assert "\n" not in warnings[0]  # the hostile text is shown quoted, never as a new log line


ACCEPTED_EXTERNAL = [
    ("255.255.255.255", "255.255.255.255"), ("224.0.1.1", "224.0.1.1"), ("ff05::1", "ff05::1"),
    ("010.001.002.003", "10.1.2.3"), ("2001:DB8::0:1", "2001:db8::1"), ("::ffff:10.0.0.1", "10.0.0.1"),
]  # fmt: skip


@pytest.mark.parametrize(("given", "canonical"), ACCEPTED_EXTERNAL)
def test_external_ips_upstream_accepts_are_kept_in_canonical_form(given: str, canonical: str) -> None:
    assert outcomes(service(externalIPs=[given])) == []
    state, _ = build_state([service(externalIPs=[given])])
    (svc,) = state.services.values()
    assert [str(ip) for ip in svc.external_ips] == [canonical]


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.5"])
def test_a_load_balancer_ingress_ip_needs_only_to_be_an_ip(address: str) -> None:
    # Upstream validates status.loadBalancer.ingress[].ip with IsValidIP alone.
    assert outcomes(service(status={"loadBalancer": {"ingress": [{"ip": address}]}})) == []


REFUSED_ENDPOINTS = [
    ("IPv4", "127.0.0.1", "loopback"), ("IPv4", "0.0.0.0", "unspecified"), ("IPv4", "169.254.169.254", "link-local range"),
    ("IPv4", "224.0.0.5", "link-local multicast"), ("IPv4", "127.000.000.001", "loopback"), ("IPv6", "::1", "loopback"),
    ("IPv6", "fe80::1", "link-local range"), ("IPv6", "ff02::2", "link-local multicast"), ("IPv6", INJECTION, "not a valid IP"),
    ("IPv6", "fd00::1%eth0", "not a valid IP"), ("IPv4", "fd00::1", "not an IPv4 address"), ("IPv6", "10.0.0.1", "not an IPv6"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "address", "problem"), REFUSED_ENDPOINTS)
def test_an_endpoint_slice_with_a_refused_address_is_skipped_with_a_warning(family: str, address: str, problem: str) -> None:
    # A valid address first: the refused one must not hide behind the fast path's first look.
    first = "10.0.0.9" if family == "IPv4" else "fd00::9"
    warnings = outcomes(endpoint_slice(family, first, address))
    assert len(warnings) == 1
    assert warnings[0].startswith("skipping EndpointSlice default/web-1: endpoints[0].addresses[1]: ") and problem in warnings[0]


def test_an_endpoint_slice_with_only_the_special_address_is_skipped_on_the_fast_path_too() -> None:
    for address in ("127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.251"):
        warnings = outcomes(endpoint_slice("IPv4", address))
        assert len(warnings) == 1 and "endpoints[0].addresses[0]" in warnings[0]


@pytest.mark.parametrize("address", ["0.1.2.3", "169.253.0.1", "224.0.1.5", "126.255.255.255", "128.0.0.1"])
def test_an_endpoint_next_to_the_special_ranges_is_accepted(address: str) -> None:
    assert outcomes(endpoint_slice("IPv4", address)) == []


@pytest.mark.parametrize("address", [INJECTION, "fd00::2%1", "10.0.0.2 ", "1.2.3.4.5"])
def test_a_node_address_must_be_an_ip(address: str) -> None:
    warnings = outcomes(node(address))
    assert len(warnings) == 1 and warnings[0].startswith("skipping Node node-1: status.addresses[0].address: ")


def test_the_injection_from_a_manifest_file_is_refused_and_the_other_objects_kept() -> None:
    text = f"""
apiVersion: v1
kind: Service
metadata: {{name: evil, namespace: default}}
spec:
  clusterIP: fd00:96::66
  ports: [{{port: 80}}]
  externalIPs: [{INJECTION!r}]
---
apiVersion: v1
kind: Service
metadata: {{name: good, namespace: default}}
spec:
  clusterIP: fd00:96::77
  ports: [{{port: 80}}]
  externalIPs: [fd00::77]
"""
    documents = [raw.obj for raw in parse_documents(text.replace("'", '"'), "evil.yaml")]
    state, warnings = build_state(documents)
    assert [svc.name for svc in state.services.values()] == ["good"]
    assert len(warnings) == 1 and warnings[0].startswith("skipping Service default/evil: spec.externalIPs[0]: ")
