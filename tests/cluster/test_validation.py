"""Objects are validated as the API server validates them: what it refuses is skipped with a message
naming the object and field, and nothing it accepts is refused (items 3 and 7)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.cluster.state import ClusterState
from kubeproxy.cluster.validation import (
    DEFAULT_NODE_PORT_RANGE,
    ParseOptions,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    label_value,
    options_for,
    parse_port_range,
    qualified_name,
)
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy.config import validate

MANIFESTS = ParseOptions(node_port_range=DEFAULT_NODE_PORT_RANGE)


def service(**meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns", **meta},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
            ],
        },
    }


def endpoint_slice(**meta: Any) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": "web"}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "web-abc12", "namespace": "ns", "labels": labels, **meta},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.1"], "nodeName": "node-1", "zone": "a", "hints": {"forZones": [{"name": "a"}]}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def node(**meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": "a"}, **meta},
        "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
    }


def apply(obj: dict[str, Any], options: ParseOptions = MANIFESTS) -> str | None:
    state = ClusterState(options=options)
    return state.apply(obj)


def with_path(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return out


def test_the_base_objects_are_valid() -> None:
    for obj in (service(), endpoint_slice(), node()):
        assert apply(obj) is None


# --- the string rules, against upstream's own examples --------------------------------------


@pytest.mark.parametrize("value", ["a", "abc", "a-b", "my-name", "123-abc", "0", "a" * 63])
def test_dns1123_label_accepts(value: str) -> None:
    assert dns1123_label(value) is None


@pytest.mark.parametrize("value", ["", "A", "-a", "a-", "a.b", "a_b", "a b", "a" * 64, "é", "a\n", "ａ"])
def test_dns1123_label_refuses(value: str) -> None:
    assert "is not a valid DNS-1123 label" in (dns1123_label(value) or "")


@pytest.mark.parametrize("value", ["a", "a.b", "example.com", "1.2.3.4", "a-b.c-d", ".".join(["a" * 63] * 3) + "." + "a" * 61])
def test_dns1123_subdomain_accepts(value: str) -> None:
    assert len(value) <= 253 and dns1123_subdomain(value) is None


@pytest.mark.parametrize("value", ["", "a..b", ".a", "a.", "A.b", "a_b", "a" * 254, "a/b", "a b"])
def test_dns1123_subdomain_refuses(value: str) -> None:
    assert "is not a valid DNS-1123 subdomain" in (dns1123_subdomain(value) or "")


@pytest.mark.parametrize("value", ["a", "abc-123", "my-name", "a" * 63])
def test_dns1035_label_accepts(value: str) -> None:
    assert dns1035_label(value) is None


@pytest.mark.parametrize("value", ["1a", "123-abc", "-a", "a-", "A", "a.b", "a" * 64, ""])
def test_dns1035_label_refuses(value: str) -> None:
    assert "is not a valid DNS-1035 label" in (dns1035_label(value) or "")


@pytest.mark.parametrize(
    "value",
    ["simple", "now-with-dashes", "1-starts-with-num", "1234", "simple/simple", "now-with-dashes/simple",
     "now-with-dashes/now-with-dashes", "now.with.dots/simple", "now-with.dashes-and.dots/simple",
     "1-num.2-num/3-num", "1234/5678", "1.2.3.4/5678", "Uppercase_Is_OK_123", "example.com/Uppercase_Is_OK_123",
     "requests.storage-foo", "a" * 63, "a" * 253 + "/" + "b" * 63],
)
def test_qualified_name_accepts_upstreams_good_examples(value: str) -> None:
    assert qualified_name(value) is None


@pytest.mark.parametrize(
    "value",
    ["nospecialchars%^=@", "cantendwithadash-", "-cantstartwithadash-", "only/one/slash", "Example.com/abc",
     "example_com/abc", "example.com/", "/simple", "a" * 64, "a" * 254 + "/abc", "a b", "a\nb", ""],
)
def test_qualified_name_refuses_upstreams_bad_examples(value: str) -> None:
    assert "is not a valid qualified name" in (qualified_name(value) or "")


@pytest.mark.parametrize("value", ["", "simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234",
                                   "A", "UPPER", "a_b", "a.b", "a" * 63])
def test_label_value_accepts(value: str) -> None:
    assert label_value(value) is None


@pytest.mark.parametrize("value", ["nospecialchars%^=@", "Tama-nui-te-rā.is.Māori.sun", "\\backslashes\\are\\bad",
                                   "-starts-with-dash", "ends-with-dash-", ".starts.with.dot", "a" * 64, "a b", "a/b"])
def test_label_value_refuses(value: str) -> None:
    assert "is not a valid label value" in (label_value(value) or "")


# --- on objects: refused with the object and field named --------------------------------------


REFUSED = [
    (service(name="Web"), "Service ns/Web: metadata.name: 'Web' is not a valid DNS-1035 label"),
    (service(name="1web"), "Service ns/1web: metadata.name: '1web' is not a valid DNS-1035 label"),
    (service(name="a" * 64), "metadata.name:"),
    (service(name='a"\n-A INPUT -j ACCEPT'), "metadata.name: 'a\"\\n-A INPUT -j ACCEPT' is not a valid DNS-1035 label"),
    (service(namespace="my ns"), "Service 'my ns'/web: metadata.namespace: 'my ns' is not a valid DNS-1123 label"),
    (service(namespace="a.b"), "metadata.namespace: 'a.b' is not a valid DNS-1123 label"),
    (service(labels={"a b": "x"}), "metadata.labels: 'a b' is not a valid qualified name"),
    (service(labels={"app": "a b"}), "metadata.labels[app]: 'a b' is not a valid label value"),
    (service(labels={"app": ["a"]}), "metadata.labels: expected strings"),
    (service(annotations={"bad key!": "x"}), "metadata.annotations: 'bad key!' is not a valid qualified name"),
    (service(annotations={"big": "x" * 300_000}), "metadata.annotations: 300003 bytes"),
    (with_path(service(), ("spec", "ports", 0, "name"), "HTTP"), "spec.ports[0].name: 'HTTP' is not a valid DNS-1123 label"),
    (with_path(service(), ("spec", "ports", 0, "name"), "a" * 64), "spec.ports[0].name:"),
    (with_path(service(), ("spec", "ports", 1, "name"), "http"), "spec.ports[1].name: duplicate port name 'http'"),
    (with_path(service(), ("spec", "ports", 1), {"name": "b", "port": 80, "nodePort": 30081}),
     "spec.ports[1]: duplicate port 80/TCP"),
    (with_path(service(), ("spec", "ports", 1), {"name": "b", "port": 81, "nodePort": 30080}),
     "spec.ports[1].nodePort: duplicate node port 30080/TCP"),
    (with_path(service(), ("spec", "ports", 0, "nodePort"), 53),
     "Service ns/web: spec.ports[0].nodePort: 53 is outside the node port range 30000-32767"),
    (with_path(service(), ("spec", "ports", 0, "nodePort"), 32768), "spec.ports[0].nodePort: 32768 is outside"),
    (with_path(service(), ("spec", "healthCheckNodePort"), 22), "spec.healthCheckNodePort: 22 is outside the node port range"),
    (with_path(with_path(service(), ("spec", "type"), "ClusterIP"), ("spec", "healthCheckNodePort"), None),
     "spec.ports[0].nodePort: may not be used when type is ClusterIP"),
    (endpoint_slice(name="Web_1"), "EndpointSlice ns/Web_1: metadata.name: 'Web_1' is not a valid DNS-1123 subdomain"),
    (endpoint_slice(namespace="NS"), "metadata.namespace: 'NS' is not a valid DNS-1123 label"),
    (endpoint_slice(labels={"kubernetes.io/service-name": "web\n"}),
     "metadata.labels[kubernetes.io/service-name]: 'web\\n' is not a valid label value"),
    (with_path(endpoint_slice(), ("endpoints", 0, "nodeName"), "node 1"),
     "endpoints[0].nodeName: 'node 1' is not a valid DNS-1123 subdomain"),
    (with_path(endpoint_slice(), ("endpoints", 0, "hints", "forZones", 0, "name"), "a;b"),
     "endpoints[0].hints.forZones[0].name: 'a;b' is not a valid label value"),
    (with_path(endpoint_slice(), ("endpoints", 0, "hints", "forZones"), [{"name": f"z{i}"} for i in range(9)]),
     "endpoints[0].hints.forZones: 9 hints, more than the 8 allowed"),
    (with_path(endpoint_slice(), ("endpoints", 0, "hints"), {"forNodes": [{"name": "Node"}]}),
     "endpoints[0].hints.forNodes[0].name: 'Node' is not a valid DNS-1123 subdomain"),
    (with_path(endpoint_slice(), ("ports", 0, "name"), "http}"), "ports[0].name: 'http}' is not a valid DNS-1123 label"),
    (with_path(endpoint_slice(), ("ports",), [{"port": 1}, {"port": 2}]), "ports[1].name: duplicate port name ''"),
    (with_path(endpoint_slice(), ("endpoints", 0, "addresses"), [f"10.0.0.{i}" for i in range(101)]),
     "endpoints[0].addresses: 101 addresses, more than the 100 allowed"),
    (with_path(endpoint_slice(), ("endpoints",), [{"addresses": ["10.0.0.1"]}] * 1001),
     "endpoints: 1001 endpoints, more than the 1000"),
    (node(name="Node-1"), "Node Node-1: metadata.name: 'Node-1' is not a valid DNS-1123 subdomain"),
    (node(labels={"topology.kubernetes.io/zone": "zone a"}), "metadata.labels[topology.kubernetes.io/zone]: 'zone a'"),
    (with_path(node(), ("spec", "taints", 0, "key"), "a b"), "spec.taints[0].key: 'a b' is not a valid qualified name"),
]


@pytest.mark.parametrize(("obj", "message"), REFUSED, ids=[m[:60] for _, m in REFUSED])
def test_refused_with_the_object_and_field_named(obj: dict[str, Any], message: str) -> None:
    warning = apply(obj)
    assert warning is not None and warning.startswith(f"skipping {obj['kind']} ")
    assert message in warning
    assert "\n" not in warning  # a hostile name cannot forge a second log line


# --- and nothing the API server accepts is refused ---------------------------------------------


ACCEPTED = [
    service(name="a" * 63, namespace="0" * 63),  # namespaces are DNS-1123 labels: digits first is fine
    service(labels={"App": "Some_Value.1", "example.com/Key": "", "a" * 253 + "/" + "b" * 63: "c" * 63}),
    service(annotations={"Example.COM/Key": "any text at all: \"quotes\", newlines\n, ;#}"}),  # keys lowercased first
    with_path(service(), ("spec", "ports", 0, "name"), "a" * 63),  # Service port names are DNS-1123 labels, not IANA names
    with_path(service(), ("spec", "ports", 0, "name"), "1-2"),
    with_path(service(), ("spec", "ports"), [{"port": 80}]),  # one port may go unnamed
    with_path(service(), ("spec", "ports"), [{"port": 53, "protocol": "UDP", "name": "u", "nodePort": 30053},
                                             {"port": 53, "protocol": "TCP", "name": "t", "nodePort": 30053}]),
    endpoint_slice(name="web." + "a" * 63 + "." + "b" * 63),  # slice names are subdomains
    endpoint_slice(labels={"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "Controller.X"}),
    with_path(endpoint_slice(), ("ports", 0, "name"), ""),  # unnamed, as for a Service with one unnamed port
    with_path(endpoint_slice(), ("endpoints", 0, "nodeName"), "node-1.example.com"),
    with_path(endpoint_slice(), ("endpoints", 0, "zone"), "Zone A (not validated upstream)"),
    with_path(endpoint_slice(), ("endpoints", 0, "hints", "forZones"), [{"name": "Us-East_1a"}]),
    node(name="ip-10-0-0-1.ec2.internal", labels={"topology.kubernetes.io/zone": "us-east-1a", "kubernetes.io/hostname": "H_1"}),
]


@pytest.mark.parametrize("obj", ACCEPTED)
def test_what_the_api_server_accepts_is_accepted(obj: dict[str, Any]) -> None:
    assert apply(obj) is None


def test_node_port_range_applies_to_manifests_and_only_to_an_api_server_when_given() -> None:
    low = with_path(service(), ("spec", "ports", 0, "nodePort"), 3001)  # upstream's own test objects use 3001
    assert apply(low, ParseOptions()) is None  # library default: not checked
    assert apply(low, options_for(from_api_server=True)) is None  # the API server allocated it from its range
    assert "3001 is outside the node port range 30000-32767" in (apply(low, options_for(from_api_server=False)) or "")
    assert apply(low, options_for(node_port_range="1-32767", from_api_server=False)) is None
    explicit = options_for(node_port_range="5000+999", from_api_server=True)
    assert "outside the node port range 5000-5999" in (apply(low, explicit) or "")


@pytest.mark.parametrize(("text", "expected"), [("30000-32767", (30000, 32767)), (" 1-65535 ", (1, 65535)),
                                                ("30000+2767", (30000, 32767)), ("8080", (8080, 8080))])
def test_parse_port_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_port_range(text) == expected


@pytest.mark.parametrize("text", ["", "a-b", "0-100", "100-50", "1-65536", "30000-", "-5"])
def test_parse_port_range_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="port range"):
        parse_port_range(text)


def test_config_checks_the_range_and_relaxed_service_names_gate() -> None:
    with pytest.raises(ConfigError, match="--service-node-port-range: '1-x' is not a port range"):
        validate(ProxyConfig(service_node_port_range="1-x"))
    # RelaxedServiceNameValidation is GA and locked on at v1.37: the API server admits such names.
    assert apply(service(name="1web"), ProxyConfig().parse_options(from_api_server=True)) is None
    assert apply(service(name="1web"), options_for(from_api_server=True)) is not None


def test_render_refuses_out_of_range_node_ports_unless_the_range_is_widened(tmp_path: Path) -> None:
    import yaml

    dns = with_path(service(), ("spec", "ports", 1, "nodePort"), 53)
    other = with_path(service(), ("metadata", "name"), "other")
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump_all([dns, other]))
    result = CliRunner().invoke(main, ["render", "--manifests", str(path)])
    assert result.exit_code == 0, result.output
    assert "skipping Service ns/web: spec.ports[1].nodePort: 53 is outside the node port range 30000-32767" in result.stderr
    assert "ns/web:dns" not in result.stdout and "ns/other:dns" in result.stdout
    widened = CliRunner().invoke(main, ["render", "--manifests", str(path), "--service-node-port-range", "1-32767"])
    assert widened.exit_code == 0 and "skipping" not in widened.stderr
    # No endpoints: the node port is rejected rather than forwarded, but it is programmed.
    assert "--dst-type LOCAL -m udp -p udp --dport 53 -j REJECT" in widened.stdout
    bad = CliRunner().invoke(main, ["render", "--manifests", str(path), "--service-node-port-range", "x"])
    assert bad.exit_code == 2 and "--service-node-port-range: 'x' is not a port range" in bad.stderr
