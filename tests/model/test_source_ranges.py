"""loadBalancerSourceRanges as the node view takes them, per family: a range of a whole family
(0.0.0.0/0, ::/0) allows every source of that family, as if no range were given (upstream's
newBaseServiceInfo, pkg/proxy/serviceport.go: IsZeroCIDR), so no firewall is written for it."""

from __future__ import annotations

import pytest

from kubeproxy.cluster.objects import parse_service
from kubeproxy.model import node_model
from kubeproxy.model.options import Family
from tests.backends.nftables.helpers import port, service


def _ranges(source_ranges: list[str], family: Family) -> set[tuple[str, ...]]:
    svc = parse_service(service("ns", "lb", "172.30.0.2", port("http", 80), type="LoadBalancer",
                                clusterIPs=["172.30.0.2", "fd00::2"], ipFamilies=["IPv4", "IPv6"],
                                ipFamilyPolicy="RequireDualStack", loadBalancerSourceRanges=source_ranges))  # fmt: skip
    return {tuple(str(c) for c in info.load_balancer_source_ranges) for info in node_model.ports_of_service(svc, family).values()}


@pytest.mark.parametrize(
    ("given", "ipv4", "ipv6"),
    [
        (["10.0.0.0/8", "2001:db8::/32"], ("10.0.0.0/8",), ("2001:db8::/32",)),
        (["10.0.0.0/8", "0.0.0.0/0", "2001:db8::/32"], (), ("2001:db8::/32",)),
        (["10.0.0.0/8", " ::/0 "], ("10.0.0.0/8",), ()),
        (["0.0.0.0/0", "::/0"], (), ()),
    ],
)
def test_a_whole_family_range_allows_every_source_of_that_family(
    given: list[str], ipv4: tuple[str, ...], ipv6: tuple[str, ...]
) -> None:
    assert _ranges(given, Family.IPV4) == {ipv4}
    assert _ranges(given, Family.IPV6) == {ipv6}
