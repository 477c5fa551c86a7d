"""The errors the test API server answers with: Status objects, as the real server words them."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


class ApiError(Exception):
    """An error the server answers with a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None, metadata: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self._details = details
        self.metadata = metadata or {}

    def status(self) -> JSON:
        return status_object(self.code, self.reason, self.message, self._details, self.metadata)


def status_object(code: int, reason: str, message: str, details: JSON | None = None, metadata: JSON | None = None) -> JSON:
    """A Status as kube-apiserver encodes it: `details` only where the error has them (a bad
    request or an expired version has none; a missing object names itself)."""
    status: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata or {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        status["details"] = details
    status["code"] = code
    return status


# Upstream's watch cache waits this long for its resourceVersion to reach the one a request asks
# for before it answers "Too large resource version" (blockTimeout), and tells the client to retry
# after this many seconds (resourceVersionTooHighRetrySeconds).
BLOCK_TIMEOUT = 3.0
TOO_LARGE_RETRY_SECONDS = 1


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """What the real server answers for a read from a resourceVersion newer than anything it has
    (storage.NewTooLargeResourceVersionError): a 504 Timeout whose cause says why, with a retry hint.

    A list gets it as the HTTP answer; a watch-list (`sendInitialEvents=true`) gets it as an ERROR
    event inside a 200 stream. A plain watch from such a version gets no error at all: the server
    accepts it and stays silent until its own versions pass the one asked for, as upstream's does.
    """
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": TOO_LARGE_RETRY_SECONDS,
        },
    )
