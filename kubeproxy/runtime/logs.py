"""Logging as upstream's kube-proxy prints it: klog's text format, or component-base's JSON.

Text (`--logging-format=text`, the default), one line per message:

    I1125 10:29:33.123456   12345 server.go:123] "Using iptables proxy" ipFamily="IPv4"

severity letter, month and day, time with microseconds, the pid right-aligned in 7 columns,
file:line of the caller, then the message: a structured message (`kv`) is quoted and followed by
key="value" pairs as klog's InfoS writes them (strings quoted, numbers and booleans bare).

JSON (`--logging-format=json`), one object per line, as component-base's zap encoder writes:

    {"ts":1764066573.123,"caller":"app/server.go:123","msg":"Using iptables proxy","v":0,"ipFamily":"IPv4"}

Verbosity (`-v`, logging.verbosity) maps onto Python's levels: errors and warnings always; the
start-up messages (upstream's V(0) information) always; other information at -v 1 and 2;
debug at -v 3 and above.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

STARTUP_LOGGER = "kubeproxy.startup"  # V(0) information: shown whatever the verbosity
# The HTTP client's own loggers. client-go logs a request line (method, URL, status, time) at
# -v=6 and headers and bodies above that; at lower verbosities these would flood the log.
HTTP_CLIENT_LOGGERS = ("httpx2", "httpcore2", "h2", "h11", "hpack")
HTTP_REQUEST_VERBOSITY = 6
_HANDLER_NAME = "kubeproxy-klog"


class Structured(str):
    """A message with key/value pairs: prints as klog's text, keeps the parts for JSON."""

    msg: str
    fields: dict[str, Any]

    def __new__(cls, msg: str, fields: dict[str, Any]) -> Structured:
        text = " ".join([_quote(msg), *(f"{key}={_klog_value(value)}" for key, value in fields.items())])
        obj = super().__new__(cls, text)
        obj.msg = msg
        obj.fields = fields
        return obj


def kv(message: str, **fields: Any) -> Structured:
    """A structured log message, `"Message" key="value" ...` as klog's InfoS writes it."""
    return Structured(message, fields)


def _quote(text: str) -> str:
    # Go's %q for the common case: JSON string escaping gives the same quotes and escapes.
    return json.dumps(text, ensure_ascii=False)


def _klog_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return "<nil>"
    if isinstance(value, list | tuple):
        return "[" + " ".join(_klog_value(v) for v in value) + "]"
    return _quote(str(value))


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def _verbosity_of(record: logging.LogRecord) -> int:
    """The klog V level a Python record stands for (information only)."""
    if record.name == STARTUP_LOGGER or record.levelno >= logging.WARNING:
        return 0
    return 2 if record.levelno >= logging.INFO else 4


class KlogTextFormatter(logging.Formatter):
    def __init__(self, pid: int | None = None) -> None:
        super().__init__()
        self.pid = os.getpid() if pid is None else pid

    def format(self, record: logging.LogRecord) -> str:
        letter = "F" if record.levelno >= logging.CRITICAL else "E" if record.levelno >= logging.ERROR else (
            "W" if record.levelno >= logging.WARNING else "I"
        )
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        header = (
            f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} "
            f"{self.pid:>7} {record.filename}:{record.lineno}] "
        )
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return header + text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        module = record.pathname.replace(os.sep, "/").rsplit("/", 2)
        caller = "/".join(module[-2:]) + f":{record.lineno}"
        out: dict[str, Any] = {"ts": round(record.created, 6), "caller": caller}
        message = record.msg
        if isinstance(message, Structured) and not record.args:
            out["msg"] = message.msg
            fields = message.fields
        else:
            out["msg"] = record.getMessage()
            fields = {}
        if record.levelno < logging.ERROR:
            out["v"] = _verbosity_of(record)
        for key, value in fields.items():
            if key not in out:
                out[key] = _json_value(value)
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record comes (click's test runner swaps it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def python_level(verbosity: int) -> int:
    return logging.WARNING if verbosity <= 0 else logging.INFO if verbosity <= 2 else logging.DEBUG


def setup(verbosity: int = 0, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every log record to `stream` (stderr) in `fmt`, filtered by `verbosity`.

    Replaces the handler an earlier call installed (the command line calls it once, then again
    when --config changes the format or verbosity); handlers others installed (pytest's) stay.
    """
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else KlogTextFormatter())
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(python_level(verbosity))
    # Upstream prints its start-up information at V(0): always.
    logging.getLogger(STARTUP_LOGGER).setLevel(logging.INFO)
    http_level = (
        logging.WARNING if verbosity < HTTP_REQUEST_VERBOSITY
        else logging.INFO if verbosity < HTTP_REQUEST_VERBOSITY + 2
        else logging.DEBUG
    )
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(http_level)
