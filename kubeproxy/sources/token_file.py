"""A bearer token read from a file (kubeconfig `tokenFile`, the in-cluster service-account
token), as client-go reads one (v0.37.2 transport/token_source.go: NewCachedFileTokenSource
keeps the token for a minute; a 401 answer makes the next request read the file again).

The 401 goes back to the caller as it is, never re-sent within the same request: over HTTP/2
kube-apiserver ends a connection after answering an unauthenticated request (GOAWAY, the
UnauthenticatedHTTP2DOSMitigation gate, endpoints/filters/authentication.go), so a re-send
fails as a terminated connection and the log would never name the 401. The caller's retry
reads the file again and goes out on a new connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from pathlib import Path

import httpx2

# client-go's period: half the time between a kubelet's refresh of a projected token and its expiry.
REREAD_PERIOD = 60.0


class TokenFileAuth(httpx2.Auth):
    def __init__(self, path: Path, *, period: float = REREAD_PERIOD, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.period = period
        self.clock = clock
        self._token: str | None = None
        self._read_at = 0.0
        self._stale = True  # read the file at the next request

    def bearer(self) -> str:
        """The token, read again when a minute old or after a 401. A file that cannot be read
        keeps the token read before (client-go's "Unable to rotate token"); with none, the
        OSError (naming the file) is the request's error."""
        now = self.clock()
        if self._token is None or self._stale or now - self._read_at >= self.period:
            try:
                self._token = self.path.read_text().strip()
            except OSError:
                if self._token is None:
                    raise
            self._read_at, self._stale = now, False
        return self._token

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.bearer()}"
        response = yield request
        if response.status_code == 401:
            self._stale = True
