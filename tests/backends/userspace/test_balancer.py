"""Round robin, ClientIP affinity with its timeout (an injected clock) and the retry order."""

from __future__ import annotations

from kubeproxy.backends.userspace.balancer import Balancer, PortTable
from kubeproxy.model.node_model import ServicePortName

WEB = ServicePortName("default", "web", "http", "TCP")
A, B, C = ("10.0.0.1", 80), ("10.0.0.2", 80), ("10.0.0.3", 80)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def balancer(*endpoints: tuple[str, int], affinity: bool = False, timeout: float = 10.0) -> tuple[Balancer, Clock]:
    clock = Clock()
    b = Balancer(clock=clock)
    b.update({WEB: PortTable(WEB, "TCP", endpoints, affinity=affinity, affinity_timeout=timeout)})
    return b, clock


def test_round_robin_over_every_endpoint_in_turn() -> None:
    b, _ = balancer(A, B, C)
    assert [b.next_endpoint(WEB, "192.0.2.1") for _ in range(6)] == [A, B, C, A, B, C]


def test_no_endpoints_and_unknown_ports_give_none() -> None:
    b, _ = balancer()
    assert b.next_endpoint(WEB, "192.0.2.1") is None
    assert b.next_endpoint(ServicePortName("default", "other", "", "TCP"), "192.0.2.1") is None


def test_client_ip_affinity_holds_until_idle_for_the_timeout() -> None:
    b, clock = balancer(A, B, C, affinity=True, timeout=10)
    first = b.next_endpoint(WEB, "192.0.2.1")
    other = b.next_endpoint(WEB, "192.0.2.2")
    assert first != other
    for _ in range(5):
        clock.now += 9  # each use refreshes the pin
        assert b.next_endpoint(WEB, "192.0.2.1") == first
    clock.now += 11
    assert b.next_endpoint(WEB, "192.0.2.1") != first  # expired: round robin picks anew


def test_retry_moves_to_the_next_endpoint_and_re_pins() -> None:
    b, _ = balancer(A, B, C, affinity=True)
    assert b.next_endpoint(WEB, "192.0.2.1") == A
    # A failed to connect: the retry resets affinity, takes the next one and pins it.
    assert b.next_endpoint(WEB, "192.0.2.1", reset_affinity=True) == B
    assert b.next_endpoint(WEB, "192.0.2.1") == B


def test_update_keeps_pins_to_surviving_endpoints_only() -> None:
    b, _ = balancer(A, B, affinity=True)
    assert b.next_endpoint(WEB, "192.0.2.1") == A
    assert b.next_endpoint(WEB, "192.0.2.2") == B
    b.update({WEB: PortTable(WEB, "TCP", (B, C), affinity=True, affinity_timeout=10)})
    assert b.next_endpoint(WEB, "192.0.2.2") == B
    assert b.next_endpoint(WEB, "192.0.2.1") in (B, C)
    b.update({})
    assert b.next_endpoint(WEB, "192.0.2.2") is None


def test_expire_pins() -> None:
    b, clock = balancer(A, B, affinity=True, timeout=5)
    b.next_endpoint(WEB, "192.0.2.1")
    clock.now += 6
    assert b.expire_pins() == 1
