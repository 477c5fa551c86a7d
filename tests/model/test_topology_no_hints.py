"""`categorize` skips the per-endpoint availability check when no topology mode applies.

Without hints every ready endpoint is available, so the shortcut must pick exactly the endpoints
the general filter (`ready and _available(...)`) picks, with hints or without, in every mode.
"""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from kubeproxy.cluster.objects import LABEL_ZONE
from kubeproxy.model.node_model import EndpointInfo, ServicePortInfo, ServicePortName
from kubeproxy.model.topology import _available, categorize, topology_mode

HINTS = st.frozensets(st.sampled_from(("n1", "n2", "z1", "z2")), max_size=2)

endpoints = st.lists(
    st.builds(
        EndpointInfo,
        ip=st.sampled_from(("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")),
        port=st.just(80),
        is_local=st.booleans(),
        ready=st.booleans(),
        serving=st.booleans(),
        terminating=st.booleans(),
        zone_hints=HINTS,
        node_hints=HINTS,
    ),
    max_size=6,
)

service_ports = st.builds(
    ServicePortInfo,
    name=st.just(ServicePortName("ns", "svc", "p", "TCP")),
    cluster_ip=st.just(ipaddress.ip_address("10.96.0.1")),
    port=st.just(80),
    protocol=st.just("TCP"),
    node_port=st.sampled_from((0, 30080)),
    internal_policy_local=st.booleans(),
    external_policy_local=st.booleans(),
)


@given(endpoints, service_ports, st.sampled_from(("z1", "z3")), st.booleans())
def test_cluster_endpoints_are_the_ready_and_available_ones(
    eps: list[EndpointInfo], svc: ServicePortInfo, zone: str, prefer_same_node: bool
) -> None:
    cat = categorize(eps, svc, "n1", {LABEL_ZONE: zone}, prefer_same_node=prefer_same_node)
    if not svc.uses_cluster_endpoints:
        assert cat.cluster == []
        return
    mode = topology_mode(eps, "n1", zone, prefer_same_node=prefer_same_node)
    general = [e for e in eps if e.ready and _available(e, mode, "n1", zone)]
    assert cat.cluster == (general or [e for e in eps if e.serving and e.terminating])
