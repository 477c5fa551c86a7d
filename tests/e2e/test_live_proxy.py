"""`kubeproxy run` in the node namespace, reading manifest files: the scenarios with real packets,
while the proxy (not the test) decides when and what to sync; every one in each proxy mode."""

from __future__ import annotations

import subprocess
import time

import pytest

from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import NODE_IP, ClusterError, MiniCluster, kubeproxy_binary
from kubeproxy.lab.node_rules import MODES
from tests.e2e import scenarios


def _has_run_command() -> bool:
    try:
        return subprocess.run([kubeproxy_binary(), "run", "--help"], capture_output=True, timeout=30).returncode == 0
    except Exception:
        return False


pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not _has_run_command(), reason="`kubeproxy run` is not available yet"),
]


@pytest.fixture(params=MODES)
def proxy_mode(request: pytest.FixtureRequest) -> str:
    """The bed (`cluster`) runs the proxy in this mode and reads its rules."""
    return str(request.param)


@pytest.fixture
def load(cluster: MiniCluster) -> scenarios.Load:
    """Write the objects where the proxy watches; start it on first use; return once the node's rules show them."""
    return scenarios.live_load(cluster, cluster.write_manifests, lambda: cluster.start_proxy(*scenarios.PROXY_ARGS))


@pytest.mark.parametrize("scenario", scenarios.LIVE, ids=lambda f: f.__name__)
def test_live_proxy(cluster: MiniCluster, load: scenarios.Load, scenario: scenarios.Scenario) -> None:
    scenario(cluster, load)


def test_a_change_is_synced_and_reported(cluster: MiniCluster, load: scenarios.Load) -> None:
    web = [service("web", "10.96.0.10", [scenarios.HTTP]), endpoint_slice("web", cluster.backends("a"), [scenarios.HTTP])]
    load(web)
    first = cluster.wait_synced()
    changed = time.time()
    cluster.write_manifests([cluster.node_object(), *web[:1], endpoint_slice("web", cluster.backends("b"), [scenarios.HTTP])])
    assert cluster.wait_synced(after=changed) > first
    cluster.wait_endpoints("default/web:http", scenarios.at(cluster, "b"))
    assert "SyncProxyRules complete" in cluster.proxy_log()


def test_nodeport_addresses_limit_where_health_check_ports_listen(cluster: MiniCluster) -> None:
    # As upstream: with --nodeport-addresses, a healthCheckNodePort listens on the node's addresses
    # in those CIDRs only (here the node IP), not on every address (the default).
    port = Port("http", 80, 8080, node_port=scenarios.NODE_PORT)
    svc = service("shop", "10.96.0.20", [port], type="LoadBalancer", load_balancer_ips=[scenarios.LB_IP],
                  external_traffic_policy="Local", health_check_node_port=scenarios.HEALTH_CHECK_NODE_PORT)  # fmt: skip
    objs = [svc, endpoint_slice("shop", cluster.backends("a"), [port])]
    load = scenarios.live_load(
        cluster,
        cluster.write_manifests,
        lambda: cluster.start_proxy(*scenarios.PROXY_ARGS, "--nodeport-addresses", f"{NODE_IP}/24"),
    )
    load(objs)
    scenarios.answer_eventually(cluster, f"http://{NODE_IP}:{scenarios.HEALTH_CHECK_NODE_PORT}/", 200, weight=1)
    with pytest.raises(ClusterError, match="refused"):
        cluster.http_get(cluster.node, f"http://127.0.0.1:{scenarios.HEALTH_CHECK_NODE_PORT}/")
