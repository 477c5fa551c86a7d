"""The API client's metrics as client-go names and labels them, fed by HTTP event hooks.

- `rest_client_requests_total{code,host,method}`: every answer, by HTTP status.
- `rest_client_request_duration_seconds{host,verb}`: from sending a request to its answer's head,
  with client-go's buckets; watches are left out, as client-go observes only its ordinary
  requests (a watch's answer lasts as long as the watch).

`host` is the API server's host:port as the connection's URL names it (client-go uses the
request URL's host). A request that gets no answer at all (connection refused, timeout) raises in
the caller and is not counted here (client-go counts it with code `<error>`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx2
from prometheus_client import CollectorRegistry, Counter, Histogram

# client-go's (k8s.io/component-base/metrics/prometheus/restclient) buckets, as upstream exposes them.
DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

def host_label(server: str) -> str:
    """`https://10.96.0.1:443` → `10.96.0.1:443`: the URL's host and port as written."""
    return urlsplit(server).netloc.rpartition("@")[2]


class RestClientMetrics:
    """The two metrics in `registry`, for the client of the API server at `server`."""

    def __init__(self, registry: CollectorRegistry, server: str, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.host = host_label(server)
        self._clock = clock
        self._sent: weakref.WeakKeyDictionary[httpx2.Request, float] = weakref.WeakKeyDictionary()
        self.requests_total = Counter(
            "rest_client_requests_total",
            "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "host", "method"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "rest_client_request_duration_seconds",
            "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
            ["host", "verb"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )

    def attach(self, client: httpx2.AsyncClient) -> None:
        """Count and time `client`'s requests from now on (through its public event hooks)."""
        hooks = client.event_hooks
        client.event_hooks = {
            "request": [*hooks.get("request", []), self._on_request],
            "response": [*hooks.get("response", []), self._on_response],
        }

    async def _on_request(self, request: httpx2.Request) -> None:
        self._sent[request] = self._clock()

    async def _on_response(self, response: httpx2.Response) -> None:
        request = response.request
        self.requests_total.labels(code=str(response.status_code), host=self.host, method=request.method).inc()
        sent = self._sent.pop(request, None)
        if sent is not None and not _is_watch(request):
            self.request_duration.labels(host=self.host, verb=request.method).observe(max(0.0, self._clock() - sent))


def _is_watch(request: httpx2.Request) -> bool:
    return request.url.params.get("watch") in ("true", "1")
