"""`kubeproxy run` watching an API server, driven by the real `kubectl`: the test API server and
kubectl run in the node namespace (the server binds 127.0.0.1 there), the proxy reads it through
--kubeconfig, and the scenarios' objects arrive by `kubectl apply -f` / `kubectl delete -f`."""

from __future__ import annotations

import json
import shutil

import pytest

from kubeproxy.lab.builders import endpoint_slice, service
from kubeproxy.lab.cluster import MiniCluster
from kubeproxy.lab.node_rules import MODES
from tests.e2e import scenarios
from tests.e2e.test_live_proxy import _has_run_command

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (CI installs it)"),
    pytest.mark.skipif(not _has_run_command(), reason="`kubeproxy run` is not available yet"),
]

# One of each kind of outcome; test_live_proxy.py runs them all with manifest files.
SUBSET: list[scenarios.Scenario] = [
    scenarios.cluster_ip_from_a_pod,
    scenarios.node_port_local_policy_keeps_the_client,
    scenarios.no_endpoints_is_refused,
    scenarios.endpoints_scale_under_traffic,
    scenarios.udp_flow_moves_to_the_new_pod,
    scenarios.health_check_node_port,
]


@pytest.fixture(params=MODES)
def proxy_mode(request: pytest.FixtureRequest) -> str:
    """The bed (`cluster`) runs the proxy in this mode and reads its rules."""
    return str(request.param)


@pytest.fixture
def load(cluster: MiniCluster) -> scenarios.Load:
    """kubectl applies the objects (and deletes the ones dropped since); the proxy starts on first use."""
    kubeconfig = cluster.start_apiserver()
    return scenarios.live_load(
        cluster, cluster.kubectl_apply, lambda: cluster.start_proxy(*scenarios.PROXY_ARGS, kubeconfig=kubeconfig)
    )


@pytest.mark.parametrize("scenario", SUBSET, ids=lambda f: f.__name__)
def test_live_proxy_with_kubectl(cluster: MiniCluster, load: scenarios.Load, scenario: scenarios.Scenario) -> None:
    scenario(cluster, load)
    assert cluster.proxy is not None and isinstance(cluster.proxy.args, list) and "--kubeconfig" in cluster.proxy.args


def test_kubectl_edits_reach_the_rules(cluster: MiniCluster, load: scenarios.Load) -> None:
    """What an operator does by hand, each step checked in the node's rules and with packets:
    patch a slice to scale out, delete the slice, delete the service."""
    http = scenarios.HTTP
    web = service("web", "10.96.0.10", [http])
    load([web, endpoint_slice("web", cluster.backends("a"), [http])])
    caller = cluster.pods["c"]
    assert scenarios.destinations(cluster.request("tcp", caller, "10.96.0.10:80", count=5)) == scenarios.at(cluster, "a")

    b = cluster.pods["b"]
    endpoint = {"addresses": [b.ip], "nodeName": b.node_name, "conditions": {"ready": True}}
    patch = json.dumps([{"op": "add", "path": "/endpoints/-", "value": endpoint}])
    assert "patched" in cluster.kubectl("patch", "endpointslice", "web-eps", "--type=json", "-p", patch).stdout
    cluster.wait_endpoints("default/web:http", scenarios.at(cluster, "a", "b"))
    got = cluster.request("tcp", caller, "10.96.0.10:80", count=scenarios.BOTH)
    assert scenarios.destinations(got) == scenarios.at(cluster, "a", "b"), got

    # the slice left out: kubectl_apply deletes it (`kubectl delete -f`), and the service is refused at once
    load([web])
    assert cluster.kubectl("get", "endpointslices", "-o", "name").stdout == ""
    assert cluster.request("tcp", caller, "10.96.0.10:80", count=2, timeout=5) == ["refused"] * 2

    assert 'service "web" deleted' in cluster.kubectl("delete", "service", "web").stdout
    # nothing of it left: no chain, rule, map element or comment of default/web
    cluster.wait_rules("no rules for web", lambda rules: not rules.mentions("default/web"))
