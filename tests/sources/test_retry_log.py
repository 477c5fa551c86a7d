"""The reflector's retry line: client-go's wording (tests/fixtures/upstream_operator/
reflector_failed_to_watch.log), short, with the resource, the reason and when it retries."""

from __future__ import annotations

import re

import httpx2

from kubeproxy.sources.api import SourceError
from kubeproxy.sources.retry_log import failed_to_watch, go_type
from tests.paths import TESTS

UPSTREAM = (TESTS / "fixtures" / "upstream_operator" / "reflector_failed_to_watch.log").read_text().splitlines()
SELECTOR = "labelSelector=%21service.kubernetes.io%2Fservice-proxy-name%2C%21service.kubernetes.io%2Fheadless"


def test_worded_as_client_go() -> None:
    # E1128 ... reflector.go:227] "Failed to watch" err="failed to list *v1.ServiceCIDR: ..." ... type="*v1.ServiceCIDR"
    [recorded] = [line for line in UPSTREAM if "ServiceCIDR" in line]
    pattern = r'\] ("Failed to watch") err="(failed to list \*v1\.ServiceCIDR): .*" type="(\*v1\.ServiceCIDR)"$'
    upstream = re.search(pattern, recorded)
    assert upstream is not None
    error = SourceError("https://10.96.0.1:443/apis/networking.k8s.io/v1/servicecidrs?limit=500", 404, "NotFound",
                        "the server could not find the requested resource")  # fmt: skip
    line = failed_to_watch("ServiceCIDR", "networking.k8s.io/v1", error, 1.6)
    assert line.startswith(f'{upstream[1]} err="{upstream[2]}: GET /apis/networking.k8s.io/v1/servicecidrs: 404 NotFound: ')
    assert f'type="{upstream[3]}"' in line


def test_a_refused_connection_is_one_short_line_without_the_encoded_query() -> None:
    request = httpx2.Request("GET", f"https://10.96.0.1:443/api/v1/services?{SELECTOR}&resourceVersion=0")
    error = httpx2.ConnectError("All connection attempts failed", request=request)
    line = failed_to_watch("Service", "v1", error, 2.4)
    assert line == ('"Failed to watch" err="failed to list *v1.Service: GET /api/v1/services: All connection attempts '
                    'failed (ConnectError)" type="*v1.Service" retryIn="2.4s"')
    assert "%21" not in line and len(line) < 160


def test_a_watch_says_watch_and_the_servers_delay_is_named() -> None:
    error = SourceError(f"http://127.0.0.1:8080/api/v1/nodes?watch=true&{SELECTOR}", 429, "TooManyRequests", "")
    line = failed_to_watch("Node", "v1", error, 7, retry_after=7)
    assert line.fields["err"] == "failed to watch *v1.Node: GET /api/v1/nodes: 429 TooManyRequests"
    assert (line.fields["retryIn"], line.fields["retryAfter"]) == ("7s", "7s")


def test_a_long_server_message_is_cut() -> None:
    error = SourceError("http://127.0.0.1:8080/api/v1/nodes", 500, "InternalError", "x" * 5000)
    assert len(failed_to_watch("Node", "v1", error, 1).fields["err"]) < 300


def test_go_type_is_the_version_and_kind() -> None:
    assert (go_type("EndpointSlice", "discovery.k8s.io/v1"), go_type("Service", "v1")) == ("*v1.EndpointSlice", "*v1.Service")
