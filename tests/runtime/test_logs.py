"""What the log shows of the HTTP client: client-go's request lines start at -v=6."""

from __future__ import annotations

import io
import logging

import pytest

from kubeproxy.runtime import logs


@pytest.mark.parametrize(("verbosity", "shown"), [(0, False), (2, False), (5, False), (6, True), (8, True)])
def test_http_client_request_lines_appear_from_v6_as_client_gos(verbosity: int, shown: bool) -> None:
    stream = io.StringIO()
    logs.setup(verbosity, "text", stream)
    try:
        logging.getLogger("httpx2").info('HTTP Request: GET https://10.0.0.1:6443/api/v1/services "HTTP/1.1 200 OK"')
        logging.getLogger("kubeproxy.proxy").warning("a warning is always shown")
    finally:
        logs.setup(0, "text")
    text = stream.getvalue()
    assert "a warning is always shown" in text
    assert ("HTTP Request: GET" in text) is shown


def test_http_client_warnings_are_shown_at_any_verbosity() -> None:
    stream = io.StringIO()
    logs.setup(0, "text", stream)
    try:
        logging.getLogger("httpcore2.connection").warning("connection reset")
    finally:
        logs.setup(0, "text")
    assert "connection reset" in stream.getvalue()
