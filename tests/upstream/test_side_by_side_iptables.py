"""Upstream's kube-proxy (node-a) and ours (node-b) in iptables mode against upstream's control
plane: after every step of a scenario, each node's `iptables-save` and `ip6tables-save` equal to
the other's, the node's own endpoints named by role (kubeproxy/lab/side_by_side.py,
lab/rules_compare.py). One scenario has IPv4 Services only, one every IP family policy."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.side_by_side import POD_HOST_NODE, SideBySide
from kubeproxy.lab.side_by_side_walk import FAMILIES, Walk, mirrored, walk

pytestmark = pytest.mark.root


def check(w: Walk, step: str, changed: Collection[str] = ("IPv4",), node_local: Collection[str] = ("lweb-itp",)) -> None:
    diffs = w.bed.await_step(w.expected(), families=FAMILIES, node_local=node_local, changed=changed)
    assert not diffs, f"after {step}:\n" + "\n".join(diffs)


def _services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]

    def port(node_port: int) -> list[builders.Port]:
        return [builders.Port("http", 80, 8080, node_port=node_port)]

    web = {"selector": {"app": "web"}}
    return [
        builders.service("web", "10.96.0.10", http, affinity_timeout=300, spec=web),
        builders.service("web-np", "10.96.0.11", port(30011), type="NodePort", spec=web),
        builders.service("web-lb", "10.96.0.12", port(30012), type="LoadBalancer", load_balancer_ips=["203.0.113.12"], spec=web),
        builders.service("web-ext", "10.96.0.13", http, external_ips=["198.51.100.13"], spec=web),
        builders.service("lweb-local", "10.96.0.14", port(30014), type="LoadBalancer", load_balancer_ips=["203.0.113.14"],
                        external_traffic_policy="Local", health_check_node_port=32014, spec={"selector": {"app": "lweb"}}),
        builders.service("lweb-itp", "10.96.0.15", http, internal_traffic_policy="Local", spec={"selector": {"app": "lweb"}}),
    ]  # fmt: skip


def test_iptables_rules_equal_to_upstream_at_every_step(side_by_side: SideBySide) -> None:
    w = Walk.of(side_by_side, _services())
    walk(w, _services(), lambda step: check(w, step))


def _dual_stack_services() -> list[builders.JSON]:
    http = [builders.Port("http", 80, 8080)]
    v6 = {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}

    def dual(policy: str, ips: list[str], app: str, families: tuple[str, ...] = ("IPv4", "IPv6")) -> dict[str, object]:
        return {"ipFamilyPolicy": policy, "ipFamilies": list(families), "clusterIPs": ips, "selector": {"app": app}}

    def port(node_port: int) -> list[builders.Port]:
        return [builders.Port("http", 80, 8080, node_port=node_port)]

    return [
        builders.service("six", "fd00:10:96::10", http, affinity_timeout=600, spec={**v6, "selector": {"app": "six"}}),
        builders.service("six-lb", "fd00:10:96::11", port(30111), type="LoadBalancer", load_balancer_ips=["2001:db8:1::11"],
                        source_ranges=["2001:db8:2::/64"], external_ips=["2001:db8:3::11"],
                        spec={**v6, "selector": {"app": "six"}}),
        builders.service("prefer", "10.96.1.20", port(30120), type="NodePort",
                        spec=dual("PreferDualStack", ["10.96.1.20", "fd00:10:96::20"], "dual")),
        builders.service("prefer-six-first", "fd00:10:96::21", http,
                        spec=dual("PreferDualStack", ["fd00:10:96::21", "10.96.1.21"], "dual", ("IPv6", "IPv4"))),
        builders.service("require-lb", "10.96.1.22", port(30122), type="LoadBalancer",
                        load_balancer_ips=["203.0.113.22", "2001:db8:1::22"], external_traffic_policy="Local",
                        health_check_node_port=32122, spec=dual("RequireDualStack", ["10.96.1.22", "fd00:10:96::22"], "ldual")),
        builders.service("require-itp", "10.96.1.23", http, internal_traffic_policy="Local", affinity_timeout=60,
                        spec=dual("RequireDualStack", ["10.96.1.23", "fd00:10:96::23"], "ldual")),
    ]  # fmt: skip


def test_dual_stack_rules_equal_to_upstream_at_every_step(side_by_side: SideBySide) -> None:
    both, node_local = FAMILIES, ("require-itp",)
    bed = side_by_side
    w = Walk.of(bed, _dual_stack_services())
    w.add("six-0", POD_HOST_NODE, "six")
    w.add_mirrored("six-1", "six")
    w.add("dual-0", POD_HOST_NODE, "dual")
    w.add("dual-1", POD_HOST_NODE, "dual")
    w.add_mirrored("ldual-0", "ldual")
    w.add("ldual-remote", POD_HOST_NODE, "ldual")
    bed.apply(*_dual_stack_services())
    bed.start_proxies()
    check(w, "the first sync", both, node_local)

    w.add("six-2", POD_HOST_NODE, "six")
    check(w, "an IPv6 pod added", ("IPv6",), node_local)
    w.add_mirrored("ldual-1", "ldual")
    check(w, "a local dual-stack pod added on each node", both, node_local)
    w.set_ready(["dual-0"], False)
    check(w, "a dual-stack pod turned not ready", both, node_local)
    w.terminate(mirrored("ldual-0"))
    check(w, "a local dual-stack pod terminating on each node", both, node_local)
    w.finish(mirrored("ldual-0"))
    check(w, "terminated pods gone", both, node_local)

    w.delete_service("six-lb")
    check(w, "an IPv6 LoadBalancer deleted", ("IPv6",), node_local)
    w.delete_service("require-lb")
    check(w, "a RequireDualStack LoadBalancer deleted", both, node_local)
