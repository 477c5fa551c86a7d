"""The renderer's shortcuts give what the plain formulas give (10k services in well under 0.5 s).

Each shortcut is checked against the general computation it replaces: chain names encoded many at
a time against one at a time and against the standard library's base32, the precomputed statistic
matches against the formula, the C formatting of IPv4 addresses against ipaddress's, and the line
counts kept beside the text blocks against the lines of the text. Byte-identity of whole renders
is the job of the golden and upstream fixtures (test_render_golden, test_upstream_fixtures).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables.render import _STATISTIC, _ip_text, _probability, _statistic_args, render
from kubeproxy.cluster.addresses import CheckedIPv4, CheckedIPv6
from tests.backends.iptables.test_render_cache import golden_rendering
from tests.backends.iptables.test_render_golden import SCENARIOS

DIGESTS = st.binary(min_size=32, max_size=32)
# Around the point where encoding many at once takes over, and around the chunk size.
COUNTS = st.sampled_from((0, 1, names._MANY_FROM - 1, names._MANY_FROM, 10, names._SLOTS - 1, names._SLOTS, names._SLOTS + 1))


@given(
    st.one_of(
        st.lists(DIGESTS, max_size=3 * names._SLOTS + 5),
        COUNTS.flatmap(lambda n: st.lists(DIGESTS, min_size=n, max_size=n)),
    )
)
def test_base32_of_many_digests_is_each_ones_base32(digests: list[bytes]) -> None:
    expected = [base64.b32encode(digest).decode()[:16] for digest in digests]
    assert names._base32_16_many(digests) == expected
    assert [names._base32_16(digest) for digest in digests] == expected


def test_base32_of_extreme_digests() -> None:
    # All bits set and none: the masks must neither drop nor leak a bit between slots.
    for digests in ([b"\xff" * 32] * 70, [b"\x00" * 32] * 70, [b"\xff" * 32, b"\x00" * 32] * 35):
        assert names._base32_16_many(digests) == [base64.b32encode(d).decode()[:16] for d in digests]


@given(
    st.text(max_size=80),
    st.sampled_from(("tcp", "udp", "sctp")),
    COUNTS.flatmap(lambda n: st.lists(st.text(max_size=50), min_size=n, max_size=n)),
)
def test_endpoint_chains_name_each_endpoint_as_endpoint_chain(spn: str, proto: str, endpoints: list[str]) -> None:
    chains = names.endpoint_chains(spn, proto, endpoints)
    assert chains == [names.endpoint_chain(spn, proto, endpoint) for endpoint in endpoints]
    for chain, endpoint in zip(chains, endpoints, strict=True):
        digest = hashlib.sha256((spn + proto + endpoint).encode()).digest()
        assert chain == "KUBE-SEP-" + base64.b32encode(digest).decode()[:16]


def test_known_upstream_endpoint_chain_names() -> None:
    # TestOverallIPTablesRules (upstream pkg/proxy/iptables/proxier_test.go), ns1/svc1:p80's endpoint.
    assert names.endpoint_chains("ns1/svc1:p80", "tcp", ["10.180.0.1:80"]) == ["KUBE-SEP-SXIVWICOYRO3J4NJ"]
    many = names.endpoint_chains("ns1/svc1:p80", "tcp", ["10.180.0.1:80"] * (names._MANY_FROM + 1))
    assert set(many) == {"KUBE-SEP-SXIVWICOYRO3J4NJ"}


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, len(_STATISTIC) - 1, len(_STATISTIC), len(_STATISTIC) + 3])
def test_statistic_args_follow_the_formula_in_and_beyond_the_table(n: int) -> None:
    expected = [f" -m statistic --mode random --probability {_probability(n - i)}" if i < n - 1 else "" for i in range(n)]
    assert list(_statistic_args(n)) == expected


@given(st.ip_addresses())
def test_ip_text_is_str_of_the_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    checked = CheckedIPv4(ip) if isinstance(ip, ipaddress.IPv4Address) else CheckedIPv6(ip)
    assert _ip_text(checked) == str(ip)


@pytest.mark.parametrize("name", SCENARIOS)
def test_rule_counts_are_the_lines_of_the_text(name: str) -> None:
    """The counts kept beside each service's text blocks (two rules per endpoint string) add up."""
    golden = golden_rendering(name)
    rendered = render(golden.view, golden.options)
    tables: dict[str, list[str]] = {}
    table = ""
    for line in rendered.text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        tables.setdefault(table, []).append(line)
    assert rendered.filter_rules == sum(line.startswith("-A ") for line in tables["filter"])
    assert rendered.nat_rules == sum(line.startswith("-A ") for line in tables["nat"])
    declared = {line.split()[0][1:] for line in tables["nat"] if line.startswith(":")}
    assert rendered.nat_chains <= declared
    assert rendered.nat_chains == {c for c in declared if names.is_service_chain(c)}


@pytest.mark.parametrize("name", SCENARIOS)
def test_nat_chains_are_the_same_whether_computed_for_cleanup_or_on_demand(name: str) -> None:
    golden = golden_rendering(name)
    view, opts = golden.view, golden.options
    lazy = render(view, opts)
    assert "nat_chains" not in vars(lazy)  # nothing built until asked for
    swept = render(view, opts, existing_nat_chains={"KUBE-SEP-STALESTALESTALE"})
    assert "nat_chains" in vars(swept)  # built for the stale-chain sweep, and kept
    assert swept.deleted_chains == ("KUBE-SEP-STALESTALESTALE",)
    assert lazy.nat_chains == swept.nat_chains == frozenset(c for chains in lazy.service_chains for c in chains)
