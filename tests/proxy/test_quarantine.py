"""Quarantine logic without a kernel: bisection over a fake check, and views with held Services."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.model.options import Family
from kubeproxy.proxy.quarantine import Held, Quarantine, isolate
from tests.backends.nftables.helpers import endpoint, port, service, slice_, view


def counting(bad: set[int]) -> tuple[list[frozenset[int]], Callable[[frozenset[int]], bool]]:
    calls: list[frozenset[int]] = []

    def passes(aside: frozenset[int]) -> bool:
        calls.append(aside)
        return bad <= aside

    return calls, passes


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
def test_one_culprit_is_found_in_about_log2_checks(n: int) -> None:
    culprit = random.Random(n).randrange(n)
    calls, passes = counting({culprit})
    assert isolate(list(range(n)), passes) == [culprit]
    assert len(calls) <= 2 + 2 * (n - 1).bit_length()


def test_several_culprits_are_all_found() -> None:
    bad = {3, 50, 51, 99}
    calls, passes = counting(bad)
    assert sorted(isolate(list(range(100)), passes) or []) == sorted(bad)
    assert len(calls) < 100  # far fewer checks than one per service


def test_no_service_to_blame() -> None:
    assert isolate([1, 2, 3], lambda aside: False) is None  # fails even with all set aside


def test_nothing_fails() -> None:
    _, passes = counting(set())
    assert isolate([1, 2, 3], passes) == []
    assert isolate([], passes) == []


def _cluster(web_ips: list[str]) -> list[dict[str, Any]]:
    return [
        service("ns", "web", "172.30.0.1", port("http", 80)),
        slice_("ns", "web", [endpoint(ip) for ip in web_ips], ("http", 80, "TCP")),
        service("ns", "db", "172.30.0.2", port("sql", 5432)),
        slice_("ns", "db", [endpoint("10.0.0.9")], ("sql", 5432, "TCP")),
    ]


def test_a_held_service_keeps_its_last_accepted_version() -> None:
    accepted = view(_cluster(["10.0.0.1"]), Family.IPV4)
    refused = view(_cluster(["10.0.0.1", "10.0.0.66"]), Family.IPV4)
    q = Quarantine()
    q.hold(("ns", "web"), "nft said no", accepted)
    assert ("ns", "web") in q and q.names() == ["ns/web"]
    programmed = q.apply(refused)
    assert programmed.services == accepted.services
    assert programmed.endpoints == accepted.endpoints
    # the others are taken as they are now
    assert q.apply(refused, keys=()).endpoints == refused.endpoints


def test_a_service_never_accepted_is_left_out_and_a_change_releases_it() -> None:
    now = view(_cluster(["10.0.0.1"]), Family.IPV4)
    q = Quarantine()
    q.hold(("ns", "web"), "refused", None)
    assert {n.service for n in q.apply(now).services} == {("ns", "db")}
    assert q.release([("ns", "db")]) == []
    assert q.release([("ns", "web")]) == [("ns", "web")]
    assert len(q) == 0 and q.apply(now) is now


def test_held_of_copies_only_that_services_ports() -> None:
    v = view(_cluster(["10.0.0.1"]), Family.IPV4)
    held = Held.of(("ns", "db"), "x", v)
    assert {n.service for n in held.services} == {("ns", "db")}
    assert {n.service for n in held.endpoints} == {("ns", "db")}
