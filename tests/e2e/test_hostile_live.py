"""200 Services serving real connections while hostile objects come and go (live).

`kubeproxy run --manifests` in the node namespace, in each mode. While a sender in the client
namespace keeps opening connections to every ClusterIP in turn, each hostile object is
published beside the 200 Services and then removed: valid ones the kernel used to refuse
(source ranges covering everything or overlapping, the longest names) and invalid ones that
only a manifest can carry (a name that tries to inject a rule, a NodePort on the node's DNS
port). Not one connection to the other Services may fail, no sync may fail, and /healthz stays
200 throughout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest

from kubeproxy.lab.builders import JSON, Port, endpoint_slice, service
from kubeproxy.lab.cluster import HEALTHZ_BIND, NODE_IP, MiniCluster, poll
from kubeproxy.lab.node_rules import MODES
from tests.e2e import scenarios

pytestmark = pytest.mark.root
SERVICES = 200
HTTP = scenarios.HTTP
LB_IP = "198.51.100.77"


@pytest.fixture(params=MODES)
def proxy_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _crowd(c: MiniCluster) -> list[JSON]:
    out: list[JSON] = []
    for i in range(SERVICES):
        name, ip = f"svc-{i}", f"10.96.{10 + i // 200}.{i % 200 + 1}"
        out += [service(name, ip, [HTTP]), endpoint_slice(name, c.backends("a", "b"), [HTTP])]
    return out


def _hostile(c: MiniCluster) -> dict[str, list[JSON]]:
    def lb(name: str, ranges: list[str], *, namespace: str = "default", port: Port = HTTP, eps: bool = True) -> list[JSON]:
        svc = service(name, "10.96.99.1", [port], namespace=namespace, type="LoadBalancer", load_balancer_ips=[LB_IP],
                      source_ranges=ranges)  # fmt: skip
        svc["spec"]["ports"][0]["nodePort"] = 30999
        return [svc, endpoint_slice(name, c.backends("a") if eps else [], [port], namespace=namespace)]

    injecting = service('evil"\n-A INPUT -j ACCEPT\n#', "10.96.99.2", [HTTP])
    dns_nodeport = service("dns-on-the-node", "10.96.99.3", [Port("dns", 53, 5353, "UDP")], type="NodePort")
    dns_nodeport["spec"]["ports"][0]["nodePort"] = 53
    return {
        "everyone": lb("everyone", ["0.0.0.0/0"]),
        "overlapping": lb("overlapping", ["10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/16", "192.168.0.10/32"]),
        "longest-names": lb("s" + "-y" * 31, ["192.168.0.0/16"], namespace="n" + "-x" * 31, eps=False,
                            port=Port("p" + "-q" * 7, 80, 8080)),
        "rule-injection": [injecting],
        "nodeport-53": [dns_nodeport],
    }  # fmt: skip


def _swept(rounds: list[dict[str, Any]], count: int) -> bool | None:
    return len(rounds) >= count or None


@contextmanager
def _sweeping(c: MiniCluster, dsts: list[str]) -> Iterator[list[dict[str, Any]]]:
    """Sweeps over every destination, back to back, until the block ends; yields their results."""
    rounds: list[dict[str, Any]] = []
    stop = threading.Event()
    errors: list[Exception] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                rounds.append(c.sweep("tcp", c.client, dsts))
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    sender = threading.Thread(target=loop, name="sweep", daemon=True)
    sender.start()
    try:
        yield rounds
    finally:
        stop.set()
        sender.join()
    assert not errors, errors


def test_hostile_objects_never_cost_another_service_a_connection(proxy_mode: str) -> None:
    with MiniCluster.build(pods=("a", "b"), remote_pods=(), proxy_mode=proxy_mode) as c:
        crowd = _crowd(c)
        load = scenarios.live_load(c, c.write_manifests, lambda: c.start_proxy(*scenarios.PROXY_ARGS))
        load(crowd)
        dsts = [f"{svc['spec']['clusterIP']}:80" for svc in crowd if svc["kind"] == "Service"]
        first = c.sweep("tcp", c.client, dsts)
        assert all(isinstance(r, dict) for r in first.values()), first

        for what, objs in _hostile(c).items():
            with _sweeping(c, dsts) as rounds:
                c.write_manifests(objs, filename="hostile.yaml")  # replaces the previous one
                _wait_for_evidence(c, what)
                poll(f"two sweeps after {what}", partial(_swept, rounds, len(rounds) + 2), timeout=60)
            failed = [(dst, r) for sweep in rounds for dst, r in sweep.items() if not isinstance(r, dict)]
            assert rounds and failed == [], (what, failed[:5])
            assert c.http_get(c.client, f"http://{NODE_IP}:{HEALTHZ_BIND.rsplit(':', 1)[1]}/healthz").status == 200
        c.write_manifests([], filename="hostile.yaml")
        poll("the last hostile object gone", lambda: LB_IP not in _rules_text(c) or None, timeout=15)

        log = c.proxy_log()
        assert "sync failed" not in log and "Failed to execute iptables-restore" not in log
        filters = c.node.run(["iptables-save", "-t", "filter"]).stdout
        assert "-A INPUT -j ACCEPT" not in filters


def _rules_text(c: MiniCluster) -> str:
    if c.proxy_mode == "nftables":
        return c.node.run(["nft", "list", "table", "ip", "kube-proxy"]).stdout
    return c.node.run(["iptables-save"]).stdout


def _wait_for_evidence(c: MiniCluster, what: str) -> None:
    """Until the proxy has dealt with the object: its rules are in (valid ones), or it was skipped by name."""
    if what in ("everyone", "overlapping"):  # the client is in their ranges: its connections are answered
        poll(what, lambda: isinstance(c.request("tcp", c.client, f"{LB_IP}:80")[0], dict) or None, timeout=15)
    elif what == "longest-names":  # no endpoints: refused, where before the node had no rule at all
        poll(what, lambda: c.request("tcp", c.client, f"{LB_IP}:80")[0] == "refused" or None, timeout=15)
    else:
        name = "evil" if what == "rule-injection" else "dns-on-the-node"
        poll(f"the warning about {what}", lambda: name in c.proxy_log() or None, timeout=15)
