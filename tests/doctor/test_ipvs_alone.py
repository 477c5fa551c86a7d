"""`doctor --rules --ipvs --ipset-file` without the objects: the Services read back from the
virtual servers and the ipsets (kubeproxy/doctor/reconstruct_ipvs.py) give the findings the
objects would have given, named by their cluster IPs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.cluster.state import build_state
from kubeproxy.doctor.reconstruct_ipvs import from_ipvs
from kubeproxy.netfilter.ipvs import load_into
from kubeproxy.netfilter.node import Node
from tests.explain.test_explain import NODE, _ipvs_dumps, _world


def _doctor(dumps: dict[str, Path], *more: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["doctor", "--rules", str(dumps["iptables"]), "--ipvs", str(dumps["ipvs"]),
                                    "--ipset-file", str(dumps["ipset"]), *NODE, "--json", *more])
    assert res.exit_code in (0, 1), res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


# the world's Service ports (tests/doctor/test_rules_alone.py) and the names the dumps give them
NAMES = {"default/dns:dns (UDP)": "ipvs/ip-10-96-0-53:udp-53 (UDP)",
         "default/dns:dns-tcp (TCP)": "ipvs/ip-10-96-0-53:tcp-53 (TCP)",
         "default/web:http (TCP)": "ipvs/ip-10-96-0-80:tcp-80 (TCP)",
         "default/lb (TCP)": "ipvs/ip-10-96-0-81:tcp-443 (TCP)",
         "default/empty:x (UDP)": "ipvs/ip-10-96-0-82:udp-81 (UDP)"}


def _renamed(findings: list[dict[str, Any]]) -> list[str]:
    out = []
    for f in findings:
        service = f["subject"].removeprefix("Service ")
        out.append(json.dumps({**f, "subject": "Service " + NAMES.get(service, service)}, sort_keys=True))
    return sorted(out)


def test_ipvs_dumps_alone_give_the_findings_the_objects_give(tmp_path: Path) -> None:
    world = str(_world(tmp_path))
    dumps = _ipvs_dumps(tmp_path, world)
    with_objects = _doctor(dumps, "--manifests", world)
    alone = _doctor(dumps)
    # same addresses, endpoints, shares, SNAT bounds and evidence: only the names differ
    assert _renamed(with_objects["findings"]) == _renamed(alone["findings"])
    assert {f["kind"] for f in alone["findings"]} == {"snat-capacity", "no-endpoints"}
    assert alone["inputs"]["frontends_traced"] == with_objects["inputs"]["frontends_traced"]
    assert "read back from the proxy's own rules" in alone["notes"][0]
    assert "name no Service" in alone["notes"][1]
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
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
"""


def test_a_hand_written_ipvs_node_is_read_back() -> None:
    node = Node.from_flags(ifaces=["eth0=192.168.0.2/24"])
    ipvs = load_into(node, IPVSADM, IPSETS)
    assert ipvs is not None
    found = from_ipvs(ipvs, node, "node-1")
    services = {o["metadata"]["name"]: o["spec"] for o in found.objects if o["kind"] == "Service"}
    assert set(services) == {"ip-10-96-0-10", "ip-10-96-0-20", "ip-10-96-0-30"}
    dns = services["ip-10-96-0-10"]
    assert (dns["type"], dns["externalTrafficPolicy"], dns["ports"]) == (
        "NodePort", "Local", [{"protocol": "UDP", "port": 53, "name": "udp-53", "nodePort": 30053}])
    lb = services["ip-10-96-0-20"]
    assert (lb["type"], lb["loadBalancerSourceRanges"], lb["sessionAffinityConfig"]) == (
        "LoadBalancer", ["203.0.113.0/24"], {"clientIP": {"timeoutSeconds": 300}})
    assert services["ip-10-96-0-30"]["type"] == "ClusterIP"
    # weight 0 (quiesced) is not ready; the Local NodePort's real server is this node's
    (eps,) = [o for o in found.objects if o["kind"] == "EndpointSlice" and o["metadata"]["name"].startswith(
        "ip-10-96-0-10")]
    assert [(e["addresses"], e.get("nodeName")) for e in eps["endpoints"]] == [
        (["10.244.1.5"], "node-1"), (["10.244.2.5"], None)]
    assert eps["ports"] == [{"protocol": "UDP", "port": 5353, "name": "udp-53"}]
    assert any("172.16.0.1:8080/TCP" in n and "in none of the proxy's sets" in n for n in found.notes)
    state, warnings = build_state(found.objects)
    assert not warnings and len(state.services) == 3


def test_without_ipsets_node_addresses_are_nodeports(tmp_path: Path) -> None:
    node = Node.from_flags(ifaces=["eth0=192.168.0.2/24"])
    ipvs = load_into(node, IPVSADM, None)
    assert ipvs is not None
    found = from_ipvs(ipvs, node, "node-1")
    names = sorted(o["metadata"]["name"] for o in found.objects if o["kind"] == "Service")
    # the LB and the stray address read as cluster IPs: without the sets nothing tells them apart
    assert names == ["ip-10-96-0-10", "ip-10-96-0-20", "ip-10-96-0-30", "ip-172-16-0-1", "ip-198-51-100-9"]
    assert any("no --ipset-file" in n for n in found.notes)
