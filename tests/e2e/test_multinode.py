"""Three nodes, each running `kubeproxy run` against one API server, with real packets between
them (kubeproxy/lab/multinode): what happens across nodes, in each proxy mode.

One bed per mode for the module (building it and starting three proxies is the slow part);
every test uses its own Service, addresses and pods and removes them when it ends, and the
drain test gives the node back.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kubeproxy.lab.apiserver import ApiError
from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import kubeproxy_binary, poll
from kubeproxy.lab.multinode import MultiNodeCluster
from kubeproxy.lab.multinode.bed import CLIENT_IP, CLIENT_IP6, ROUTER_IP, ROUTER_IP6, DualPod
from kubeproxy.lab.multinode.scenario import LocalService, move_endpoint
from kubeproxy.lab.node_rules import MODES
from kubeproxy.model.options import Family

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]

NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="module", params=MODES)
def bed(request: pytest.FixtureRequest) -> Iterator[MultiNodeCluster]:
    with MultiNodeCluster.build(proxy_mode=str(request.param)) as cluster:
        cluster.start_proxies()
        cluster.wait_synced(timeout=60)
        yield cluster


@contextmanager
def pods(bed: MultiNodeCluster, **where: str) -> Iterator[dict[str, DualPod]]:
    """Pods `name=node`; when the block ends, every pod made during it (these and any the test
    added) is removed, so the next test starts from the same bed."""
    before = set(bed.pods)
    try:
        yield {name: bed.add_pod(name, node) for name, node in where.items()}
    finally:
        for name in set(bed.pods) - before:
            bed.remove_pod(name)


@contextmanager
def published(bed: MultiNodeCluster, svc: dict[str, Any]) -> Iterator[None]:
    """The Service (its slice is the test's to apply), and both deleted at the end."""
    bed.apply(svc)
    try:
        yield
    finally:
        name = svc["metadata"]["name"]
        if _exists(bed, "EndpointSlice", f"{name}-eps"):
            bed.delete("EndpointSlice", f"{name}-eps")
        bed.delete("Service", name)


def _exists(bed: MultiNodeCluster, kind: str, name: str) -> bool:
    try:
        bed.api.get(kind, "default", name)
    except ApiError:
        return False
    return True


def _ips(results: list[Any], key: str) -> list[str]:
    """The `key` ("dst": the pod reached, "src": the source it saw) IPs of answered probes."""
    return [r[key].rpartition(":")[0] for r in results if isinstance(r, dict)]


def test_etp_local_keeps_client_ip_and_lb_never_fails_while_pods_move(bed: MultiNodeCluster) -> None:
    web = LocalService("move", "10.96.0.81", node_port=30081, health_check_node_port=32081)
    with published(bed, web.service()), pods(bed, m1="node-1") as made:
        m1 = made["m1"]
        bed.apply(web.slice(m1.backend()))
        bed.wait_endpoints(web.service_port, {n: [f"{m1.ip}:8080"] for n in NODES})

        # Only the node with the endpoint passes the service's health check (upstream's answer).
        answers = bed.wait_health_checks(32081, {"node-1": 200, "node-2": 503, "node-3": 503})
        assert answers["node-1"].json()["localEndpoints"] == 1
        assert answers["node-2"].json()["localEndpoints"] == 0

        # The client's address is kept, and a node without a local endpoint drops the traffic:
        # the health check is what keeps a load balancer away from it.
        via_node1 = bed.request(bed.client, f"{bed.node('node-1').ip}:30081", count=5)
        assert set(_ips(via_node1, "src")) == {CLIENT_IP}, via_node1
        assert bed.request(bed.client, f"{bed.node('node-2').ip}:30081", count=2, timeout=0.5) == ["timeout"] * 2

        lb = bed.start_lb(30081, health_port=32081, rate=50)
        lb.wait_health({"node-1"})
        start = lb.mark()
        lb.wait_requests(10)
        # Round the nodes: node-1 -> node-2 -> node-3 -> node-1.
        m2 = move_endpoint(bed, lb, web, m1, "m2", "node-2")
        m3 = move_endpoint(bed, lb, web, m2, "m3", "node-3")
        move_endpoint(bed, lb, web, m3, "m4", "node-1")
        end = lb.mark()
        lb.stop()

        requests = lb.requests(start, end)
        counts = lb.per_node(start, end)
        print(
            f"\n[{bed.proxy_mode}] eTP=Local rolling move behind the LB: {len(requests)} requests, "
            f"{len(lb.failures(start, end))} failures, per node {json.dumps(counts, sort_keys=True)}"
        )
        assert lb.failures(start, end) == []
        assert set(counts) == set(NODES), counts  # the traffic followed the pod round the nodes
        # The pods saw the balancer's own address: no node SNATed it.
        assert {r.answer["src"].rpartition(":")[0] for r in requests if r.answer} == {ROUTER_IP}


def test_a_balancer_blind_to_the_service_health_check_fails(bed: MultiNodeCluster) -> None:
    """The control for the test above: a node without a local endpoint drops eTP=Local traffic,
    so a balancer that follows only kube-proxy's /healthz (which every node passes) loses what
    it sends there, and the count shows it."""
    web = LocalService("blind", "10.96.0.86", node_port=30086, health_check_node_port=32086)
    with published(bed, web.service()), pods(bed, b1="node-1") as made:
        bed.apply(web.slice(made["b1"].backend()))
        bed.wait_health_checks(32086, {"node-1": 200, "node-2": 503, "node-3": 503})
        lb = bed.start_lb(30086, proxy_healthz=True, rate=50, timeout=0.3)
        lb.wait_health(set(NODES))
        start = lb.mark()
        lb.wait_requests(15)
        end = lb.mark()
        lb.stop()
        failed = lb.failures(start, end)
        assert {r.node for r in failed} == {"node-2", "node-3"}, failed
        assert {r.error for r in failed} == {"timeout"}
        assert lb.per_node(start, end)["node-1"] > 0


def test_etp_cluster_nodeport_on_a_node_without_the_pod_reaches_a_pod_on_another(bed: MultiNodeCluster) -> None:
    port = Port("http", 80, 8080, node_port=30082)
    svc = service("spread", "10.96.0.82", [port], type="NodePort")
    with published(bed, svc), pods(bed, c1="node-1") as made:
        c1 = made["c1"]
        bed.apply(endpoint_slice("spread", [c1.backend()], [port]))
        bed.wait_endpoints("default/spread:http", {n: [f"{c1.ip}:8080"] for n in NODES})
        for name in ("node-2", "node-3"):
            got = bed.request(bed.client, f"{bed.node(name).ip}:30082", count=5)
            assert _ips(got, "dst") == [c1.ip] * 5, got
            # Cluster policy masquerades to the forwarding node, so the answer returns through it.
            assert set(_ips(got, "src")) == {bed.node(name).ip}, got


def test_internal_traffic_policy_local(bed: MultiNodeCluster) -> None:
    port = Port("http", 80, 8080)
    svc = service("itp", "10.96.0.83", [port], internal_traffic_policy="Local")
    with published(bed, svc), pods(bed, i1="node-1", i2="node-2", x1="node-1", x3="node-3") as made:
        i1, i2 = made["i1"], made["i2"]
        bed.apply(endpoint_slice("itp", [i1.backend(), i2.backend()], [port]))
        bed.wait_endpoints("default/itp:http", {"node-1": [f"{i1.ip}:8080"], "node-2": [f"{i2.ip}:8080"]})
        # node-3 knows the service has endpoints (it no longer rejects it) and has none of its own.
        bed.wait_rules(
            "node-3",
            "default/itp:http with endpoints elsewhere, none here",
            lambda rules: not rules.rejects("default/itp:http") and not rules.endpoints("default/itp:http"),
        )
        from_node1 = bed.request(made["x1"], "10.96.0.83:80", count=20)
        assert _ips(from_node1, "dst") == [i1.ip] * 20, from_node1
        from_node2 = bed.request(i2, "10.96.0.83:80", count=10)
        assert _ips(from_node2, "dst") == [i2.ip] * 10, from_node2
        # No local endpoint: upstream drops, it does not go to another node's.
        from_node3 = bed.request(made["x3"], "10.96.0.83:80", count=3, timeout=0.5)
        assert from_node3 == ["timeout"] * 3, from_node3


def _hinted(bed: MultiNodeCluster, slice_: dict[str, Any], hinted: set[str]) -> dict[str, Any]:
    """`slice_` with each endpoint's zone (its node's, as the EndpointSlice controller writes
    it) and, for the endpoints whose IP is in `hinted`, a forZones hint for that zone."""
    for ep in slice_["endpoints"]:
        ep["zone"] = bed.node(ep["nodeName"]).zone
        if ep["addresses"][0] in hinted:
            ep["hints"] = {"forZones": [{"name": ep["zone"]}]}
    return slice_


def test_topology_hints_keep_traffic_in_zone_and_fall_back_without_them(bed: MultiNodeCluster) -> None:
    port = Port("http", 80, 8080)
    svc = service("zonal", "10.96.0.84", [port], spec={"trafficDistribution": "PreferClose"})
    # node-1 is zone-a; node-2 and node-3 are zone-b.
    with published(bed, svc), pods(bed, t1="node-1", t2="node-2", y1="node-1", y3="node-3") as made:
        t1, t2 = made["t1"], made["t2"]
        bed.apply(_hinted(bed, endpoint_slice("zonal", [t1.backend(), t2.backend()], [port]), {t1.ip, t2.ip}))
        bed.wait_endpoints(
            "default/zonal:http", {"node-1": [f"{t1.ip}:8080"], "node-2": [f"{t2.ip}:8080"], "node-3": [f"{t2.ip}:8080"]}
        )
        in_zone_b = bed.request(made["y3"], "10.96.0.84:80", count=20)
        assert _ips(in_zone_b, "dst") == [t2.ip] * 20, in_zone_b  # node-3 has no pod: zone-b's is on node-2
        in_zone_a = bed.request(made["y1"], "10.96.0.84:80", count=10)
        assert _ips(in_zone_a, "dst") == [t1.ip] * 10, in_zone_a

        # One endpoint without a hint: every node ignores hints and uses both.
        bed.apply(_hinted(bed, endpoint_slice("zonal", [t1.backend(), t2.backend()], [port]), {t1.ip}))
        both = [f"{t1.ip}:8080", f"{t2.ip}:8080"]
        bed.wait_endpoints("default/zonal:http", {n: both for n in NODES})
        fallback = bed.request(made["y3"], "10.96.0.84:80", count=40)
        assert set(_ips(fallback, "dst")) == {t1.ip, t2.ip}, fallback


@pytest.mark.parametrize("deleting", [False, True], ids=["tainted", "deletionTimestamp"])
def test_drained_node_fails_healthz_and_the_lb_leaves_it_before_its_pods_go(bed: MultiNodeCluster, deleting: bool) -> None:
    port = Port("http", 80, 8080, node_port=30085)
    svc = service("drain", "10.96.0.85", [port], type="NodePort")
    with published(bed, svc), pods(bed, d1="node-1", d2="node-2") as made:
        d1, d2 = made["d1"], made["d2"]
        bed.apply(endpoint_slice("drain", [d1.backend(), d2.backend()], [port]))
        bed.wait_endpoints("default/drain:http", {n: [f"{d1.ip}:8080", f"{d2.ip}:8080"] for n in NODES})
        lb = bed.start_lb(30085, proxy_healthz=True, rate=50)
        try:
            lb.wait_health(set(NODES))
            start = lb.mark()
            lb.wait_requests(15)
            drained = time.time()
            bed.drain("node-2", deleting=deleting)
            left = lb.wait_health({"node-1", "node-3"})
            healthz = bed.http_get(bed.lb, bed.node("node-2").healthz_url)
            assert healthz.status == 503, healthz
            assert json.loads(healthz.body)["nodeEligible"] is False, healthz.body
            assert bed.http_get(bed.lb, bed.node("node-1").healthz_url).status == 200

            # Only now do the node's pods go: terminating, out of the slice, deleted.
            bed.apply(endpoint_slice("drain", [d1.backend(), d2.backend(ready=False, terminating=True)], [port]))
            bed.apply(endpoint_slice("drain", [d1.backend()], [port]))
            bed.wait_endpoints("default/drain:http", {n: [f"{d1.ip}:8080"] for n in NODES})
            bed.remove_pod("d2")
            lb.wait_requests(15)
            end = lb.mark()
        finally:
            lb.stop()
            bed.apply(bed.node_object("node-2"))  # back in service for the other tests
        before, after = lb.per_node(start, left.index), lb.per_node(left.index, end)
        print(
            f"\n[{bed.proxy_mode}] drain ({'deletionTimestamp' if deleting else 'taint'}): "
            f"{end - start} requests, {len(lb.failures(start, end))} failures; the LB left node-2 "
            f"{(left.t - drained) * 1000:.0f} ms after the Node changed; before {before}, after {after}"
        )
        assert lb.failures(start, end) == []
        assert before.get("node-2", 0) > 0  # it was in rotation ...
        assert "node-2" not in after  # ... and got nothing once the LB saw its /healthz fail
        assert d2.removed
        # The Node restored, its /healthz passes again (so the next test starts from a healthy bed).
        poll(
            "node-2's /healthz to pass again",
            lambda: bed.http_get(bed.lb, bed.node("node-2").healthz_url).status == 200,
            timeout=15,
        )


# ---- dual-stack nodes: the same across nodes over IPv6, and a dual-stack Service ---------------


@pytest.fixture(scope="module", params=MODES)
def dual(request: pytest.FixtureRequest) -> Iterator[MultiNodeCluster]:
    """A bed whose nodes, pods, client and balancer have IPv6 addresses too (Nodes with both
    InternalIPs and podCIDRs): every proxy programs both families."""
    with MultiNodeCluster.build(proxy_mode=str(request.param), dual_stack=True) as cluster:
        cluster.start_proxies()
        cluster.wait_synced(timeout=60)
        yield cluster


def test_ipv6_etp_local_keeps_client_ip_and_lb_never_fails_while_pods_move(dual: MultiNodeCluster) -> None:
    web = LocalService("move6", "fd00:96::81", node_port=30091, health_check_node_port=32091)
    v6 = Family.IPV6
    with published(dual, web.service()), pods(dual, m1="node-1") as made:
        m1 = made["m1"]
        dual.apply(web.slice(m1.backend(family=v6)))
        dual.wait_endpoints(web.service_port, {n: [m1.endpoint(8080, v6)] for n in NODES}, family=v6)
        answers = dual.wait_health_checks(32091, {"node-1": 200, "node-2": 503, "node-3": 503}, family=v6)
        assert answers["node-1"].json()["localEndpoints"] == 1

        via_node1 = dual.request(dual.client, f"{dual.node_address('node-1', v6)}:30091", count=5)
        assert set(_ips(via_node1, "src")) == {f"[{CLIENT_IP6}]"}, via_node1

        lb = dual.start_lb(30091, health_port=32091, rate=50, family=v6)
        lb.wait_health({"node-1"})
        start = lb.mark()
        m2 = move_endpoint(dual, lb, web, m1, "m2", "node-2")
        move_endpoint(dual, lb, web, m2, "m3", "node-3")
        end = lb.mark()
        lb.stop()
        counts = lb.per_node(start, end)
        print(
            f"\n[{dual.proxy_mode}] IPv6 eTP=Local moves behind the LB: {end - start} requests, "
            f"{len(lb.failures(start, end))} failures, per node {json.dumps(counts, sort_keys=True)}"
        )
        assert lb.failures(start, end) == []
        assert set(counts) == set(NODES), counts
        assert {r.answer["src"].rpartition(":")[0] for r in lb.requests(start, end) if r.answer} == {f"[{ROUTER_IP6}]"}


def test_dual_stack_service_across_nodes_in_both_families(dual: MultiNodeCluster) -> None:
    port = Port("http", 80, 8080, node_port=30092)
    v4, v6 = Family.IPV4, Family.IPV6
    families = {"ipFamilies": [v4.value, v6.value], "ipFamilyPolicy": "RequireDualStack"}
    svc = service("both", "10.96.0.92", [port], type="NodePort", spec={**families, "clusterIPs": ["10.96.0.92", "fd00:96::92"]})
    with published(dual, svc), pods(dual, b1="node-1", caller="node-2") as made:
        b1 = made["b1"]
        dual.apply(
            endpoint_slice("both", [b1.backend()], [port], name="both-ipv4"),
            endpoint_slice("both", [b1.backend(family=v6)], [port], name="both-ipv6", address_type=v6.value),
        )
        try:
            for family in (v4, v6):
                dual.wait_endpoints("default/both:http", {n: [b1.endpoint(8080, family)] for n in NODES}, family=family)
            for family, cluster_ip in ((v4, "10.96.0.92"), (v6, "[fd00:96::92]")):
                # A pod on node-2 to the cluster IP; the client to node-3's NodePort: both reach node-1's pod.
                from_pod = dual.request(made["caller"], f"{cluster_ip}:80", count=5)
                assert _ips(from_pod, "dst") == [_spelled(b1.address(family), family)] * 5, from_pod
                node3 = dual.node_address("node-3", family)
                from_client = dual.request(dual.client, f"{node3}:30092", count=5)
                assert _ips(from_client, "dst") == [_spelled(b1.address(family), family)] * 5, from_client
                assert set(_ips(from_client, "src")) == {node3}, from_client  # masqueraded by node-3
        finally:
            for name in ("both-ipv4", "both-ipv6"):
                dual.delete("EndpointSlice", name)


def _spelled(ip: str, family: Family) -> str:
    """An address as the probe reports it (IPv6 in brackets)."""
    return f"[{ip}]" if family == Family.IPV6 else ip


def test_kubeproxy_lab_cluster_command() -> None:
    """`kubeproxy lab cluster`: the bed, a move behind the balancer, its count; nothing left after."""
    proc = subprocess.run(
        [kubeproxy_binary(), "lab", "cluster", "--moves", "1", "--rate", "20"], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "move 1: web-0 -> web-1 on node-2" in proc.stdout, proc.stdout
    summary = re.search(r"load balancer: (\d+) requests, (\d+) failed", proc.stdout)
    assert summary is not None and int(summary[1]) > 0 and summary[2] == "0", proc.stdout
    netns = set(re.findall(r"netns ([\w-]+)", proc.stdout))
    assert len(netns) == 5, proc.stdout  # three nodes, the client and the balancer
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert netns.isdisjoint(line.split()[0] for line in listed.splitlines() if line.strip()), listed
