"""ProxyMetrics: upstream's names, types, labels and buckets, per proxy mode, in its own registry."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeproxy.backends import registry
from kubeproxy.model.metrics import NETWORK_PROGRAMMING_BUCKETS, SYNC_BUCKETS, ProxyMetrics

# name → (type, label names) as upstream v1.33+ exposes them (kubernetes.io metrics reference).
COMMON = {
    "kubeproxy_sync_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_network_programming_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_service_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_service_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": ("gauge", {"ip_family", "traffic_policy"}),
    "kubeproxy_proxy_healthz_total": ("counter", {"code"}),
    "kubeproxy_proxy_livez_total": ("counter", {"code"}),
    "kubeproxy_conntrack_reconciler_sync_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_conntrack_reconciler_deleted_entries_total": ("counter", {"ip_family"}),
    # ours: Services whose rules the kernel refused (proxy/quarantine.py)
    "kubeproxy_sync_proxy_rules_quarantined_services": ("gauge", {"ip_family"}),
}
IPTABLES = {
    "kubeproxy_sync_full_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": ("counter", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": ("counter", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_iptables_total": ("gauge", {"ip_family", "table"}),
    "kubeproxy_sync_proxy_rules_iptables_last": ("gauge", {"ip_family", "table"}),
}
NFTABLES = {
    "kubeproxy_sync_full_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": ("counter", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": ("counter", {"ip_family"}),
}
IPVS = {"kubeproxy_sync_proxy_rules_iptables_restore_failures_total": ("counter", {"ip_family"})}


def touch_everything(m: ProxyMetrics) -> None:
    """Use every metric once: labelled series exist only after their first use, in Go as here."""
    v4 = m.for_family("IPv4")
    for histogram in (
        v4.sync_duration,
        v4.sync_full_duration,
        v4.sync_partial_duration,
        v4.network_programming_duration,
        v4.conntrack_reconciler_sync_duration,
    ):
        histogram.observe(0.01)
    for counter in (
        v4.restore_failures_total,
        v4.partial_restore_failures_total,
        v4.nftables_sync_failures_total,
        v4.nftables_cleanup_failures_total,
        v4.conntrack_reconciler_deleted_entries_total,
        m.endpoint_changes_total,
        m.service_changes_total,
    ):
        counter.inc()
    v4.last_timestamp.set(1)
    v4.last_queued_timestamp.set(1)
    m.endpoint_changes_pending.set(1)
    m.service_changes_pending.set(1)
    v4.quarantined_services.set(1)
    v4.iptables_total.labels(table="nat").set(1)
    v4.iptables_last.labels(table="nat").set(1)
    v4.no_local_endpoints_total.labels(traffic_policy="internal").set(1)
    m.proxy_healthz_total.labels(code="200").inc()
    m.proxy_livez_total.labels(code="200").inc()


def exposed(m: ProxyMetrics) -> dict[str, tuple[str, set[str]]]:
    """name → (type, label names) parsed back from the text the /metrics page serves."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        if not family.name.startswith("kubeproxy_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, labels)
    return out


@pytest.mark.parametrize(
    ("mode", "extra"),
    [("iptables", IPTABLES), ("nftables", NFTABLES), ("ipvs", IPVS)],
)
def test_each_mode_exposes_upstreams_set(mode: str, extra: dict[str, tuple[str, set[str]]]) -> None:
    m = registry.proxy_metrics(mode)
    touch_everything(m)
    assert exposed(m) == {**COMMON, **extra}


def test_buckets_are_upstreams() -> None:
    upstream_sync = [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384]
    assert pytest.approx(upstream_sync) == SYNC_BUCKETS
    assert NETWORK_PROGRAMMING_BUCKETS[:4] == [0, 0.25, 0.5, 1]
    assert NETWORK_PROGRAMMING_BUCKETS[61:64] == [59, 60, 65]
    assert NETWORK_PROGRAMMING_BUCKETS[-3:] == [240, 270, 300]
    assert len(NETWORK_PROGRAMMING_BUCKETS) == 1 + 2 + 59 + 12 + 7

    m = ProxyMetrics()
    m.for_family("IPv4").network_programming_duration.observe(61)
    text = m.exposition().decode()
    assert 'kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="60.0"} 0.0' in text
    assert 'kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="65.0"} 1.0' in text


def test_observations_change_the_text() -> None:
    m = registry.proxy_metrics("iptables")
    m.for_family("IPv4").sync_duration.observe(0.003)
    m.service_changes_total.inc(4)
    m.for_family("IPv4").iptables_total.labels(table="filter").set(12)
    text = m.exposition().decode()
    assert 'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 0.0' in text
    assert 'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1.0' in text
    assert 'kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1.0' in text
    assert "kubeproxy_sync_proxy_rules_service_changes_total 4.0" in text
    assert "# TYPE kubeproxy_sync_proxy_rules_service_changes_total counter" in text
    assert 'kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="filter"} 12.0' in text
    assert "_created" not in text  # Go's client writes no creation-time series
    assert "process_cpu_seconds_total" in text


def test_each_family_has_its_own_series() -> None:
    m = ProxyMetrics()
    v4, v6 = m.for_family("IPv4"), m.for_family("IPv6")
    assert m.for_family("IPv6") is v6  # one binding per family
    v6.sync_duration.observe(1)
    v4.sync_duration.observe(1)
    v4.sync_duration.observe(2)
    v4.no_local_endpoints_total.labels(traffic_policy="external").set(2)
    get = m.registry.get_sample_value
    assert get("kubeproxy_sync_proxy_rules_duration_seconds_count", {"ip_family": "IPv6"}) == 1
    assert get("kubeproxy_sync_proxy_rules_duration_seconds_count", {"ip_family": "IPv4"}) == 2
    assert get("kubeproxy_sync_proxy_rules_no_local_endpoints_total", {"ip_family": "IPv4", "traffic_policy": "external"}) == 2
    assert get("kubeproxy_sync_proxy_rules_no_local_endpoints_total", {"ip_family": "IPv6", "traffic_policy": "external"}) is None
    with pytest.raises(ValueError, match="ip_family 'ipv4'"):
        m.for_family("ipv4")


def test_a_sync_is_recorded_by_kind_in_the_modes_that_expose_it() -> None:
    """Full and partial sync durations: upstream's iptables and nftables modes register and
    observe them (pkg/proxy/metrics/metrics.go, nftables/proxier.go's deferred observation)."""
    full = SimpleNamespace(full=True, rule_counts={}, written_rule_counts={}, no_local_endpoints_internal=0,
                           no_local_endpoints_external=1)  # fmt: skip
    partial = SimpleNamespace(**{**vars(full), "full": False})
    for mode in ("iptables", "nftables", "ipvs"):
        m = registry.proxy_metrics(mode)
        v6 = m.for_family("IPv6")
        v6.record_sync(full, 0.5, 1000.0, [2.0])
        v6.record_sync(partial, 0.003, 1001.0, [])
        text = m.exposition().decode()
        exposed = mode != "ipvs"
        assert ('kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1.0' in text) is exposed
        assert ('kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1.0' in text) is exposed
        assert ('kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 1.0' in text) is exposed
        assert 'kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2.0' in text
        assert 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1001.0' in text
        assert 'kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 1.0' in text
        assert 'ip_family="IPv4"' not in text


def test_instances_are_independent() -> None:
    # Each owns its registry: two proxies (or tests) in one process do not collide or share counts.
    a, b = ProxyMetrics(), ProxyMetrics()
    a.service_changes_total.inc()
    assert a.registry.get_sample_value("kubeproxy_sync_proxy_rules_service_changes_total") == 1
    assert b.registry.get_sample_value("kubeproxy_sync_proxy_rules_service_changes_total") == 0


def test_nfacct_counters_are_read_at_scrape_time() -> None:
    counts = {"ct_state_invalid_dropped_pkts": 3}

    def read(name: str) -> int | None:
        if name == "localhost_nps_accepted_pkts":
            raise OSError("nfacct: not found")
        return counts.get(name)

    m = registry.proxy_metrics("iptables", nfacct=read)
    assert m.registry.get_sample_value("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == 3
    counts["ct_state_invalid_dropped_pkts"] = 5
    assert m.registry.get_sample_value("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == 5
    # A counter that cannot be read is left out; the scrape still works.
    assert "kubeproxy_iptables_localhost_nodeports_accepted_packets_total" not in m.exposition().decode()
    # Only iptables mode has them, as upstream.
    nft = registry.proxy_metrics("nftables", nfacct=read)
    assert "kubeproxy_iptables_ct_state_invalid_dropped_packets_total" not in nft.exposition().decode()
