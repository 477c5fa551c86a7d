"""The change tracker: touched services, no-op filtering, full-sync triggers, conntrack inputs."""

from __future__ import annotations

from typing import Any

from kubeproxy.cluster.state import ClusterState
from kubeproxy.lab import builders
from kubeproxy.model.changes import Changes, ChangeTracker, StaleEndpoint
from kubeproxy.model.node_model import NodeView, ServicePortName, build_view
from kubeproxy.model.options import Family

NODE = "node-a"


def service(
    name: str, ip: str, *, proto: str = "UDP", port: int = 53, ns: str = "ns", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return builders.service(name, ip, [builders.Port("p", port, 5353, proto)], namespace=ns, labels=labels or {})


def endpoint_slice(
    name: str, svc: str, ips: list[str], *, proto: str = "UDP", serving: bool = True, ns: str = "ns"
) -> dict[str, Any]:
    backends = [builders.Backend(ip, "", ready=serving, serving=serving) for ip in ips]
    return builders.endpoint_slice(svc, backends, [builders.Port("p", 53, 5353, proto)], namespace=ns, name=name)


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


class Harness:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.tracker = ChangeTracker(node_name=NODE)

    def apply(self, obj: dict[str, Any], deleted: bool = False) -> None:
        assert self.tracker.apply(self.state, obj, deleted=deleted) is None

    def view(self) -> NodeView:
        return build_view(self.state.services.values(), self.state.slices.values(), Family.IPV4, NODE)

    def take(self) -> Changes:
        return self.tracker.take(self.view())


def primed() -> Harness:
    h = Harness()
    h.apply(service("dns", "172.30.0.10"))
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.1", "10.0.0.2"]))
    h.apply(service("web", "172.30.0.20", proto="TCP", port=80))
    first = h.take()
    assert first.full and first.changed_services is None
    return h


def test_nothing_changed_is_an_empty_partial_sync() -> None:
    h = primed()
    changes = h.take()
    assert not changes.full and changes.changed_services == frozenset()


def test_resync_of_identical_objects_is_not_a_change() -> None:
    h = primed()
    h.apply(service("dns", "172.30.0.10"))
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.1", "10.0.0.2"]))
    assert h.take().services == frozenset()


def test_change_that_does_not_reach_the_node_model_is_dropped() -> None:
    h = primed()
    h.apply(service("dns", "172.30.0.10", labels={"team": "infra"}))  # labels do not shape rules
    assert h.take().services == frozenset()


def test_slice_change_marks_its_service() -> None:
    h = primed()
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.1", "10.0.0.3"]))
    assert h.take().services == {("ns", "dns")}


def test_add_then_delete_between_syncs_cancels_out() -> None:
    h = primed()
    h.apply(service("tmp", "172.30.0.99"))
    h.apply(service("tmp", "172.30.0.99"), deleted=True)
    assert h.take().services == frozenset()


def test_deleted_service_is_a_change_and_releases_its_udp_cluster_ip() -> None:
    h = primed()
    h.apply(service("dns", "172.30.0.10"), deleted=True)
    h.apply(service("web", "172.30.0.20", proto="TCP", port=80), deleted=True)
    changes = h.take()
    assert changes.services == {("ns", "dns"), ("ns", "web")}
    assert changes.deleted_udp_cluster_ips == {"172.30.0.10"}  # TCP has no conntrack to clear


def test_relabelled_slice_changes_both_services() -> None:
    h = primed()
    h.apply(service("dns2", "172.30.0.11"))
    h.take()
    h.apply(endpoint_slice("dns-1", "dns2", ["10.0.0.1", "10.0.0.2"]))
    assert h.take().services == {("ns", "dns"), ("ns", "dns2")}


def test_removed_and_no_longer_serving_udp_endpoints_are_stale() -> None:
    h = primed()
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.2", "10.0.0.4"]))
    port = ServicePortName("ns", "dns", "p", "UDP")
    assert h.take().deleted_udp_endpoints == {StaleEndpoint(port, "10.0.0.1", "10.0.0.1:5353")}

    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.2", "10.0.0.4"], serving=False))
    stale = h.take().deleted_udp_endpoints
    assert {e.ip for e in stale} == {"10.0.0.2", "10.0.0.4"}


def test_endpoints_that_never_served_leave_nothing_stale() -> None:
    h = primed()
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.7"], serving=False))
    h.take()
    h.apply(endpoint_slice("dns-1", "dns", []))
    assert h.take().deleted_udp_endpoints == frozenset()


def test_udp_service_going_from_zero_to_some_serving_endpoints_is_newly_active() -> None:
    h = primed()
    h.apply(endpoint_slice("dns-1", "dns", []))
    h.take()
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.9"]))
    changes = h.take()
    assert changes.newly_active_udp_services == {ServicePortName("ns", "dns", "p", "UDP")}
    assert changes.deleted_udp_endpoints == frozenset()


def test_tcp_endpoint_changes_need_no_conntrack_cleanup() -> None:
    h = primed()
    h.apply(endpoint_slice("web-1", "web", ["10.0.1.1"], proto="TCP"))
    h.take()
    h.apply(endpoint_slice("web-1", "web", ["10.0.1.2"], proto="TCP"))
    changes = h.take()
    assert changes.services == {("ns", "web")}
    assert not changes.deleted_udp_endpoints and not changes.newly_active_udp_services


def test_this_nodes_changes_force_a_full_sync_other_nodes_do_not() -> None:
    h = primed()
    h.apply(node({"topology.kubernetes.io/zone": "a"}))
    assert h.take().full
    other = node({"x": "y"})
    other["metadata"]["name"] = "node-b"
    h.apply(other)
    assert not h.take().full


def test_failed_sync_asks_for_a_full_one_and_bad_objects_change_nothing() -> None:
    h = primed()
    h.tracker.request_full_sync()
    assert h.take().full
    assert h.tracker.apply(h.state, {"kind": "Service", "metadata": {}}) is not None
    bad = service("dns", "not-an-ip")
    assert h.tracker.apply(h.state, bad) is not None  # rejected: the old Service stays
    assert h.take() == h.tracker.take(h.view()) and h.take().services == frozenset()


def _first_sync_cluster(h: Harness) -> None:
    """Services of both protocols, with serving, non-serving and no endpoints, a slice whose
    Service is missing, a headless Service, and a slice labelled for another namespace's name."""
    h.apply(service("dns", "172.30.0.10"))
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.1", "10.0.0.2"]))
    h.apply(service("idle", "172.30.0.11"))
    h.apply(endpoint_slice("idle-1", "idle", ["10.0.0.3"], serving=False))
    h.apply(service("empty", "172.30.0.12"))
    h.apply(service("web", "172.30.0.20", proto="TCP", port=80))
    h.apply(endpoint_slice("web-1", "web", ["10.0.0.4"], proto="TCP"))
    h.apply(endpoint_slice("orphan-1", "orphan", ["10.0.0.5"]))
    h.apply(service("dns", "172.30.0.30", ns="other"))
    h.apply(endpoint_slice("dns-1", "dns", ["10.0.1.1"], ns="other", serving=False))
    headless = service("headless", "None")
    h.apply(headless)


def test_the_first_take_gives_what_the_general_path_gives() -> None:
    fast, general = Harness(), Harness()
    _first_sync_cluster(fast)
    _first_sync_cluster(general)
    general.tracker._synced = NodeView({}, {})  # the general path, from an empty previous view
    got, want = fast.take(), general.take()
    assert got == want
    assert got.services == {("ns", "dns"), ("ns", "idle"), ("ns", "empty"), ("ns", "web"), ("ns", "orphan"), ("other", "dns")}
    assert {n.service for n in got.newly_active_udp_services} == {("ns", "dns"), ("ns", "orphan")}
    # Both trackers are then in the same place: the next changes are the same too.
    for h in (fast, general):
        h.apply(endpoint_slice("dns-1", "dns", ["10.0.0.1"]))
        h.apply(service("web", "172.30.0.20", proto="TCP", port=80, ns="ns"), deleted=True)
    assert fast.take() == general.take()
