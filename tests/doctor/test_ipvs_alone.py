"""`doctor --rules --ipvs --ipset-file` without the objects: the Services read back from the
virtual servers and the ipsets (kubeproxy/doctor/reconstruct_ipvs.py) give the findings the
objects would have given, named by their cluster IPs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.cluster.state import build_state
from kubeproxy.doctor.reconstruct_ipvs import from_ipvs
from kubeproxy.explain.rendered import _ipvs_parts, _with_ipvs_jumps
from kubeproxy.netfilter.ipvs import load_into
from kubeproxy.netfilter.node import Node
from tests.doctor.helpers import V6_IFACES, V6_ROUTES, v6_world
from tests.doctor.test_rules_alone import _affinity_and_local_world
from tests.explain.test_explain import NODE


def _doctor(dumps: dict[str, Path], node: list[str], *more: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["doctor", "--rules", str(dumps["iptables"]), "--ipvs", str(dumps["ipvs"]),
                                    "--ipset-file", str(dumps["ipset"]), *node, "--json", *more])
    assert res.exit_code in (0, 1), res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _dumps(tmp_path: Path, objects: list[dict[str, Any]], node: list[str]) -> tuple[str, dict[str, Path]]:
    """The world's manifests and its IPVS render cut into a node's three dumps."""
    world = tmp_path / "world.yaml"
    world.write_text("".join(f"---\n{json.dumps(o)}\n" for o in objects))
    rendered = CliRunner().invoke(main, ["render", "--manifests", str(world), "--proxy-mode", "ipvs", *node[:4]])
    assert rendered.exit_code == 0, rendered.output
    ipsets, rules, table = _ipvs_parts(rendered.stdout)
    out = {"iptables": _with_ipvs_jumps(rules), "ipset": ipsets, "ipvs": table}
    for name, text in out.items():
        (tmp_path / name).write_text(text)
    return str(world), {name: tmp_path / name for name in out}


# the worlds' Service ports and the names the dumps give them
NAMES = {"default/dns:dns (UDP)": "ipvs/ip-10-96-0-53:udp-53 (UDP)",
         "default/dns:dns-tcp (TCP)": "ipvs/ip-10-96-0-53:tcp-53 (TCP)",
         "default/web:http (TCP)": "ipvs/ip-10-96-0-80:tcp-80 (TCP)",
         "default/lb (TCP)": "ipvs/ip-10-96-0-81:tcp-443 (TCP)",
         "default/empty:x (UDP)": "ipvs/ip-10-96-0-82:udp-81 (UDP)",
         "default/dns:dns (UDP, IPv6)": "ipvs/ip-fd00-96--53:udp-53 (UDP, IPv6)"}
V6_NODE = ["--hostname-override", "node-1", "--cluster-cidr", "fd00:244::/48",
           *(f for i in V6_IFACES for f in ("--iface", i)), *(f for r in V6_ROUTES for f in ("--route", r))]
DUAL_NODE = ["--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16,fd00:244::/48", *NODE[4:],
             *V6_NODE[4:]]


def _renamed(findings: list[dict[str, Any]]) -> list[str]:
    out = []
    for f in findings:
        service = f["subject"].removeprefix("Service ")
        out.append(json.dumps({**f, "subject": "Service " + NAMES.get(service, service)}, sort_keys=True))
    return sorted(out)


@pytest.mark.parametrize(("world", "node", "kinds"), [
    (_affinity_and_local_world, NODE, {"snat-capacity", "no-endpoints"}),
    (lambda: v6_world(etp="Local"), V6_NODE, {"snat-capacity"}),
    # the renderer renders the primary family: a dual-stack Service's IPv4 side
    (lambda: v6_world(dual=True), DUAL_NODE, {"snat-capacity"}),
], ids=["v4-affinity-local-lb-empty", "v6-local", "dual-stack-v4-render"])
def test_ipvs_dumps_alone_give_the_findings_the_objects_give(tmp_path: Path, world: Any, node: list[str],
                                                             kinds: set[str]) -> None:
    manifests, dumps = _dumps(tmp_path, world(), node)
    with_objects = _doctor(dumps, node, "--manifests", manifests)
    alone = _doctor(dumps, node)
    # same addresses, endpoints, shares, SNAT bounds and evidence: only the names differ
    assert _renamed(with_objects["findings"]) == _renamed(alone["findings"])
    assert {f["kind"] for f in alone["findings"]} == kinds
    assert alone["inputs"]["frontends_traced"] == with_objects["inputs"]["frontends_traced"]
    assert "read back from the proxy's own rules" in alone["notes"][0]
    assert "name no Service" in alone["notes"][1]


def _render(objects: list[dict[str, Any]], node: list[str], tmp_path: Path) -> tuple[str, str, str]:
    path = tmp_path / "objects.yaml"
    path.write_text("".join(f"---\n{json.dumps(o)}\n" for o in objects))
    rendered = CliRunner().invoke(main, ["render", "--manifests", str(path), "--proxy-mode", "ipvs", *node[:4]])
    assert rendered.exit_code == 0, rendered.output
    return _ipvs_parts(rendered.stdout)


@pytest.mark.parametrize(("world", "node"), [
    (_affinity_and_local_world, NODE), (lambda: v6_world(etp="Local"), V6_NODE), (lambda: v6_world(dual=True), NODE),
], ids=["v4-affinity-local-lb-empty", "v6-local", "dual-stack-v4-render"])
def test_read_back_objects_render_the_same_ipvs_node(tmp_path: Path, world: Any, node: list[str]) -> None:
    """The Services read back from an IPVS render (with the world's Node, whose addresses the
    dumps do not hold) render the same ipsets, iptables rules and virtual servers again."""
    objects = world()
    first = _render(objects, node, tmp_path)
    nodes = [o for o in objects if o["kind"] == "Node"]
    dumped = Node()
    ipvs = load_into(dumped, first[2], first[0])
    assert ipvs is not None
    found = from_ipvs(ipvs, dumped, "node-1")
    again = _render([o for o in found.objects if o["kind"] != "Node"] + nodes, node, tmp_path)
    assert again == first


def test_the_dns_bound_and_endpoints_from_the_dumps_alone(tmp_path: Path) -> None:
    _, dumps = _dumps(tmp_path, _affinity_and_local_world(), NODE)
    alone = _doctor(dumps, NODE)
    (udp,) = [f for f in alone["findings"] if f["subject"] == "Service ipvs/ip-10-96-0-53:udp-53 (UDP)"]
    assert udp["data"]["bound_per_service"] == 6451.2
    assert [e["address"] for e in udp["data"]["endpoints"]] == ["10.244.1.10:53", "10.244.2.11:53", "10.244.2.12:53"]


IPVSADM = """\
-A -u 10.96.0.10:53 -s rr
-a -u 10.96.0.10:53 -r 10.244.1.5:5353 -m -w 1
-a -u 10.96.0.10:53 -r 10.244.2.5:5353 -m -w 1
-a -u 10.96.0.10:53 -r 10.244.2.6:5353 -m -w 0
-A -u 192.168.0.2:30053 -s rr
-a -u 192.168.0.2:30053 -r 10.244.1.5:5353 -m -w 1
-A -t 10.96.0.20:443 -s rr -p 300
-a -t 10.96.0.20:443 -r 10.244.2.9:8443 -m -w 1
-A -t 198.51.100.9:443 -s rr -p 300
-a -t 198.51.100.9:443 -r 10.244.2.9:8443 -m -w 1
-A -t 10.96.0.30:80 -s rr
-A -t 172.16.0.1:8080 -s rr
-a -t 172.16.0.1:8080 -r 10.9.9.9:80 -m -w 1
-A -t [fd00::20]:443 -s rr
-a -t [fd00::20]:443 -r [fd00:244:2::9]:8443 -m -w 1
-A -t [2001:db8::9]:443 -s rr
-a -t [2001:db8::9]:443 -r [fd00:244:2::9]:8443 -m -w 1
"""
IPSETS = """\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
add KUBE-CLUSTER-IP 10.96.0.20,tcp:443
add KUBE-CLUSTER-IP 10.96.0.30,tcp:80
create KUBE-NODE-PORT-UDP bitmap:port range 0-65535
add KUBE-NODE-PORT-UDP 30053
create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535
add KUBE-NODE-PORT-LOCAL-UDP 30053
create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER 198.51.100.9,tcp:443
create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-FW 198.51.100.9,tcp:443
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-SOURCE-CIDR 198.51.100.9,tcp:443,203.0.113.0/24
create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
add KUBE-HEALTH-CHECK-NODE-PORT 30999
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK 10.244.1.5,udp:5353,10.244.1.5
create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-CLUSTER-IP fd00::20,tcp:443
create KUBE-6-LOAD-BALANCER hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOAD-BALANCER 2001:db8::9,tcp:443
create KUBE-6-LOAD-BALANCER-FW hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOAD-BALANCER-FW 2001:db8::9,tcp:443
create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::9,tcp:443,2001:db8:1::/48
"""


def test_a_hand_written_ipvs_node_is_read_back() -> None:
    node = Node.from_flags(ifaces=["eth0=192.168.0.2/24"])
    ipvs = load_into(node, IPVSADM, IPSETS)
    assert ipvs is not None
    found = from_ipvs(ipvs, node, "node-1")
    services = {o["metadata"]["name"]: o["spec"] for o in found.objects if o["kind"] == "Service"}
    assert set(services) == {"ip-10-96-0-10", "ip-10-96-0-20", "ip-10-96-0-30", "ip-fd00--20"}
    dns = services["ip-10-96-0-10"]
    assert (dns["type"], dns["externalTrafficPolicy"], dns["ports"]) == (
        "NodePort", "Local", [{"protocol": "UDP", "port": 53, "name": "udp-53", "nodePort": 30053}])
    # the only Local Service: the health check node port is its
    assert dns["healthCheckNodePort"] == 30999
    lb = services["ip-10-96-0-20"]
    assert (lb["type"], lb["loadBalancerSourceRanges"], lb["sessionAffinityConfig"]) == (
        "LoadBalancer", ["203.0.113.0/24"], {"clientIP": {"timeoutSeconds": 300}})
    assert services["ip-10-96-0-30"]["type"] == "ClusterIP"
    # the IPv6 twin sets (KUBE-6-..., the source-range set's name cut to ipset's 31 characters)
    assert (services["ip-fd00--20"]["type"], services["ip-fd00--20"]["loadBalancerSourceRanges"]) == (
        "LoadBalancer", ["2001:db8:1::/48"])
    # weight 0 (quiesced) is not ready; the Local NodePort's real server is this node's
    (eps,) = [o for o in found.objects if o["kind"] == "EndpointSlice" and o["metadata"]["name"].startswith(
        "ip-10-96-0-10")]
    assert [(e["addresses"], e.get("nodeName")) for e in eps["endpoints"]] == [
        (["10.244.1.5"], "node-1"), (["10.244.2.5"], None)]
    assert eps["ports"] == [{"protocol": "UDP", "port": 5353, "name": "udp-53"}]
    assert any("172.16.0.1:8080/TCP" in n and "in none of the proxy's sets" in n for n in found.notes)
    state, warnings = build_state(found.objects)
    assert not warnings and len(state.services) == 4


def test_without_ipsets_node_addresses_are_nodeports(tmp_path: Path) -> None:
    node = Node.from_flags(ifaces=["eth0=192.168.0.2/24"])
    ipvs = load_into(node, IPVSADM, None)
    assert ipvs is not None
    found = from_ipvs(ipvs, node, "node-1")
    names = sorted(o["metadata"]["name"] for o in found.objects if o["kind"] == "Service")
    # the LB and the stray address read as cluster IPs: without the sets nothing tells them apart
    assert names == ["ip-10-96-0-10", "ip-10-96-0-20", "ip-10-96-0-30", "ip-172-16-0-1", "ip-198-51-100-9",
                     "ip-2001-db8--9", "ip-fd00--20"]
    assert any("no --ipset-file" in n for n in found.notes)


def _explained(dumps: dict[str, Path], service: str, *more: str) -> set[tuple[str, frozenset[tuple[str, float]]]]:
    res = CliRunner().invoke(main, ["explain", service, "--rules", str(dumps["iptables"]), "--ipvs", str(dumps["ipvs"]),
                                    "--ipset-file", str(dumps["ipset"]), *NODE, "--json", *more])
    assert res.exit_code == 0, res.output
    ports = json.loads(res.stdout)["ports"]
    return {(a["address"], frozenset((d["to"], round(d["share"], 6)) for d in a["destinations"]))
            for p in ports for a in p["addresses"]}


def test_explain_reads_an_ipvs_service_back_by_its_cluster_ip(tmp_path: Path) -> None:
    """`explain` on the dumps alone names the Service by its cluster IP and sends each of its
    addresses where the objects do."""
    manifests, dumps = _dumps(tmp_path, _affinity_and_local_world(), NODE)
    alone = _explained(dumps, "ipvs/ip-10-96-0-53")
    assert alone == _explained(dumps, "default/dns", "--manifests", manifests)
    assert {address for address, _ in alone} >= {"10.96.0.53:53", "203.0.113.53:53", "192.168.0.2:30053"}
