"""rest_client_requests_total and rest_client_request_duration_seconds, fed by the client that
connect() builds, against the test API server; names, help, labels and buckets as upstream
kube-proxy v1.37.2 exposes them (tests/fixtures/upstream_operator/metrics_component.txt)."""

from __future__ import annotations

import asyncio
import itertools
import re

from prometheus_client import CollectorRegistry, generate_latest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.client_metrics import RestClientMetrics, host_label
from kubeproxy.sources.connection import connect, load_config
from tests.paths import TESTS

UPSTREAM = (TESTS / "fixtures" / "upstream_operator" / "metrics_component.txt").read_text().splitlines()


def scrape(registry: CollectorRegistry) -> list[str]:
    return generate_latest(registry).decode().splitlines()


def exercise(apiserver: ApiServer, registry: CollectorRegistry) -> None:
    ticks = itertools.count(step=0.01)  # each request takes 10 ms of the fake clock
    metrics = RestClientMetrics(registry, apiserver.url, clock=lambda: next(ticks))

    async def main() -> None:
        client = connect(load_config(master=apiserver.url))
        metrics.attach(client)
        async with client:
            assert (await client.get("/api/v1/nodes")).status_code == 200
            assert (await client.get("/api/v1/nodes")).status_code == 200
            assert (await client.get("/apis/networking.k8s.io/v1/nothing")).status_code == 404
            params = {"watch": "true", "timeoutSeconds": "1"}
            async with client.stream("GET", "/api/v1/nodes", params=params) as watch:
                assert watch.status_code == 200

    asyncio.run(main())


def test_counts_by_code_method_and_host_and_times_all_but_watches(apiserver: ApiServer) -> None:
    registry = CollectorRegistry()
    exercise(apiserver, registry)
    host = f"127.0.0.1:{apiserver.port}"
    lines = scrape(registry)
    assert f'rest_client_requests_total{{code="200",host="{host}",method="GET"}} 3.0' in lines  # two lists, one watch
    assert f'rest_client_requests_total{{code="404",host="{host}",method="GET"}} 1.0' in lines
    assert f'rest_client_request_duration_seconds_count{{host="{host}",verb="GET"}} 3.0' in lines
    assert f'rest_client_request_duration_seconds_bucket{{host="{host}",le="0.005",verb="GET"}} 0.0' in lines
    assert f'rest_client_request_duration_seconds_bucket{{host="{host}",le="0.025",verb="GET"}} 3.0' in lines


def test_help_labels_and_buckets_are_upstreams(apiserver: ApiServer) -> None:
    registry = CollectorRegistry()
    exercise(apiserver, registry)
    ours = scrape(registry)
    for name in ("rest_client_requests_total", "rest_client_request_duration_seconds"):
        for kind in ("HELP", "TYPE"):
            [line] = [line for line in UPSTREAM if line.startswith(f"# {kind} {name} ")]
            assert line in ours

    def shape(lines: list[str], series: str) -> set[tuple[str, ...]]:
        found = set()
        for line in lines:
            if line.startswith(series + "{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                found.add(tuple(sorted(labels)) + ((f"le={float(labels['le'])}",) if "le" in labels else ()))
        return found

    for series in ("rest_client_requests_total", "rest_client_request_duration_seconds_bucket"):
        assert shape(ours, series) == shape(UPSTREAM, series)  # label names, and every bucket boundary


def test_host_label_is_host_and_port_as_written() -> None:
    assert host_label("https://10.96.0.1:443") == "10.96.0.1:443"
    assert host_label("https://user@api.example:6443/prefix") == "api.example:6443"
    assert host_label("http://127.0.0.1:18080") == "127.0.0.1:18080"
