"""A hostile mode for the test API server: seeded answers no real API server gives.

`ApiServer(hostility=Hostility(seed=7, rate=0.5))` answers that share of the requests for its
resources (lists, watches, gets) with one of the faults below instead of the real answer; the
rest are answered from the store as usual, so a client keeps meeting the truth in between.
`hostility.rate = 0` (or `ApiServer.hostility = None`) makes the server sane again.

Faults (`FAULTS`), each with its own random shape:

- `confused-status`: an error status with a type-confused Status (`code` a list, an object,
  `1e400`, a string; `details.causes` a string; ...);
- `odd-error`: a 4xx/5xx whose body is HTML, empty, not UTF-8, a JSON array, truncated JSON;
- `retry-after`: a 429 or 503 with a `Retry-After` in any form (0, a few seconds, negative,
  an HTTP date, non-ASCII digits, a number past 64 bits);
- `confused-list`: a 200 list of the wrong shape: `metadata` not an object, `items` not a list,
  an item whose metadata or name has the wrong type, a `resourceVersion` that is a number,
  another kind's list or items, a `continue` that is not a string;
- `endless-continue`: pages that each hand out a new `continue` token (`pages` of them, then
  the last one is garbage), the tokens ours: a request carrying one gets the next page;
- `truncated`: a body shorter than its Content-Length, then the connection closes;
- `slow-bytes`: a valid-looking body sent a few bytes at a time for up to `slow_seconds`;
- `confused-frames` (watches): a stream of type-confused watch events (an ERROR whose Status
  code is a list or `1e400`, an event that is an array, a type that is a number, an object that
  is a string, an event of another kind, a bookmark whose resourceVersion is a number);
- `endless-frame` (watches): a watch line that never ends (`endless_bytes` of it, then the
  connection closes);
- `truncated-frame` (watches): half an event, then the connection closes.

No fault is a valid answer that says something false: none deletes or changes an object a
client could trust (an empty but valid list, say, would rightly delete every object). So a
client that refuses every fault keeps its objects, and converges once the server is sane.

`hostility.script(body, watch=True)` answers the next watch (or list) request with exactly
these bytes, with status 200 (a watch's as its stream, ended after them): for a regression test
of one shape, before any random fault is drawn.

Each request draws its fault from `Random(f"{seed}:{n}")`, n counting the server's resource
requests: a seed reproduces a campaign as far as the client's request order does.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeproxy.lab.apiserver.handler import Handler
    from kubeproxy.lab.apiserver.resources import ResourceType

ANY_REQUEST = ("confused-status", "odd-error", "retry-after", "truncated", "slow-bytes")
LIST_ONLY = ("confused-list", "endless-continue")
WATCH_ONLY = ("confused-frames", "endless-frame", "truncated-frame")
FAULTS = ANY_REQUEST + LIST_ONLY + WATCH_ONLY
CONTINUE_PREFIX = "hostile-"

# Values of the wrong type for a field, as JSON text (1e400 cannot be made by an encoder).
CONFUSED = ("[1]", '{"a": 1}', "1e400", '"410"', "true", "-1e400", "[[[[]]]]", "null", "18446744073709551617", "0.5")


@dataclass
class Hostility:
    """Which answers are hostile: `rate` of the resource requests, seeded. See the module doc."""

    seed: int = 0
    rate: float = 0.5
    faults: tuple[str, ...] = FAULTS
    # Sizes and times, small enough for a test, large enough to cross a client's bounds.
    endless_bytes: int = 20 * 1024 * 1024
    pages: int = 50
    slow_seconds: float = 1.0
    served: Counter[str] = field(default_factory=Counter, init=False)
    _requests: int = field(default=0, init=False, repr=False)
    _scripts: dict[bool, deque[bytes]] = field(default_factory=lambda: {True: deque(), False: deque()}, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def script(self, body: bytes, *, watch: bool) -> None:
        """Answer the next watch (or list) request with `body`, before any random fault."""
        with self._lock:
            self._scripts[watch].append(body)

    def draw(self, watch: bool, query: dict[str, str]) -> tuple[str, random.Random, bytes] | None:
        """(the fault for this request, the randomness to shape it with, the scripted body if the
        fault is "scripted"), or None (answer it sanely)."""
        with self._lock:
            n = self._requests
            self._requests += 1
            rate = self.rate
            scripted = self._scripts[watch].popleft() if self._scripts[watch] else None
        rand = random.Random(f"{self.seed}:{n}")
        if scripted is not None:
            return "scripted", rand, scripted
        token = query.get("continue", "")
        if token.startswith(CONTINUE_PREFIX) and not watch:
            fault = "endless-continue"  # a page of an endless list asks for the next one
        elif rand.random() >= rate:
            return None
        else:
            allowed = [f for f in self.faults if f in ANY_REQUEST or (f in WATCH_ONLY) == watch]
            if not allowed:
                return None
            fault = rand.choice(allowed)
        with self._lock:
            self.served[fault] += 1
        return fault, rand, b""


def answer(
    handler: Handler,
    hostility: Hostility,
    fault: str,
    rand: random.Random,
    scripted: bytes,
    rt: ResourceType,
    query: dict[str, str],
) -> None:
    """Write `fault`'s answer to this request; the connection is closed after it."""
    handler.close_connection = True
    if fault == "scripted":
        _send(handler, 200, scripted)
    elif fault == "confused-status":
        code = rand.choice((400, 403, 404, 410, 429, 500, 503, 504))
        _send(handler, code, _confused_status(rand).encode())
    elif fault == "odd-error":
        code = rand.choice((400, 401, 403, 404, 405, 409, 413, 422, 500, 502, 503, 504))
        odd = rand.choice(
            (
                b"<html><body>502 Bad Gateway</body></html>",
                b"",
                b"\xff\xfe\x00not utf-8\x80",
                b"[1, 2, 3]",
                b'{"kind": "Status", "code": ',
                b"null",
                b'"just a string"',
                b'{"kind": "Status", "message": ' + b'"x' * 100_000 + b'"}',
            )
        )
        _send(handler, code, odd, content_type=rand.choice(("application/json", "text/html", "text/plain; charset=bogus")))
    elif fault == "retry-after":
        # Header values go out as latin-1: the Arabic-Indic digit one as its UTF-8 bytes.
        arabic_one = "\u0661".encode().decode("latin-1")
        value = rand.choice(("0", "1", "2", "-3", "1e3", arabic_one, "Wed, 21 Oct 2015 07:28:00 GMT", "99999999999999999999", ""))
        status = '{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", "code": 429}'
        _send(handler, rand.choice((429, 503)), status.encode(), headers={"Retry-After": value})
    elif fault == "confused-list":
        _send(handler, 200, _confused_list(rand, rt).encode())
    elif fault == "endless-continue":
        token = query.get("continue", "")
        page = int(token[len(CONTINUE_PREFIX) :] or 0) if token[len(CONTINUE_PREFIX) :].isdigit() else 0
        if page >= hostility.pages:
            _send(handler, 200, _confused_list(rand, rt).encode())
            return
        meta = f'{{"resourceVersion": "1", "continue": "{CONTINUE_PREFIX}{page + 1}"}}'
        page_text = f'{{"kind": "{rt.kind}List", "apiVersion": "{rt.api_version}", "metadata": {meta}, "items": []}}'
        _send(handler, 200, page_text.encode())
    elif fault == "truncated":
        cut = f'{{"kind": "{rt.kind}List", "apiVersion": "{rt.api_version}", "metadata": {{"resourceVersion": "1"}}, "items": ['
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(cut) + rand.randint(1, 100_000)))
        handler.end_headers()
        handler.wfile.write(cut.encode())
    elif fault == "slow-bytes":
        head = f'{{"kind": "{rt.kind}List", "apiVersion": "{rt.api_version}"'
        data = (head + ', "metadata": {"resourceVersion": ' + rand.choice(CONFUSED)).encode()
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data) + 2))
        handler.end_headers()
        deadline = time.monotonic() + hostility.slow_seconds
        while data and time.monotonic() < deadline:
            handler.wfile.write(data[:3])
            handler.wfile.flush()
            data = data[3:]
            time.sleep(0.02)
    else:
        _watch_fault(handler, hostility, fault, rand, rt)


def _watch_fault(handler: Handler, hostility: Hostility, fault: str, rand: random.Random, rt: ResourceType) -> None:
    handler.send_response(200)
    handler.send_header("Connection", "close")
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()

    def chunk(data: bytes) -> None:
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()

    if fault == "confused-frames":
        for _ in range(rand.randint(1, 4)):
            chunk(_confused_frame(rand, rt).encode() + b"\n")
        if rand.random() < 0.5:
            chunk(b"")  # the stream's end
    elif fault == "endless-frame":
        chunk(b'{"type": "ADDED", "object": {"kind": "' + rt.kind.encode() + b'", "metadata": {"name": "')
        block = b"a" * (1024 * 1024)
        for _ in range(hostility.endless_bytes // len(block)):
            chunk(block)
    else:  # truncated-frame
        chunk(f'{{"type": "ADDED", "object": {{"kind": "{rt.kind}", "metadata": {{"na'.encode())


def _send(
    handler: Handler, code: int, body: bytes, *, content_type: str = "application/json", headers: dict[str, str] | None = None
) -> None:
    handler.send_response(code)
    handler.send_header("Connection", "close")
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _confused_status(rand: random.Random) -> str:
    fields = {
        "kind": '"Status"',
        "apiVersion": '"v1"',
        "status": '"Failure"',
        "reason": rand.choice(('"Expired"', '"Timeout"', "5", "[]")),
        "message": rand.choice(('"too old"', "{}", "1e400")),
        "code": rand.choice(CONFUSED),
        "details": rand.choice(
            ('{"causes": "ResourceVersionTooLarge"}', '{"causes": [5]}', '{"retryAfterSeconds": 1e400}', "[]")
        ),
    }
    # At least the code is confused; some other fields too, at random.
    shown = {k: v for k, v in fields.items() if k == "code" or rand.random() < 0.5}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in shown.items()) + "}"


def _confused_list(rand: random.Random, rt: ResourceType) -> str:
    kind, version = f'"{rt.kind}List"', f'"{rt.api_version}"'
    meta, items = '{"resourceVersion": "1"}', "[]"
    which = rand.randrange(8)
    if which == 0:
        meta = rand.choice(CONFUSED)
    elif which == 1:
        items = rand.choice(('{"a": 1}', '"items"', "5"))
    elif which == 2:
        items = "[" + rand.choice(("5", '"svc"', '{"metadata": 5}', '{"metadata": {"name": 5}}', '{"metadata": {}}', "[]")) + "]"
    elif which == 3:
        # (Not a string: `"410"` is a valid version, and an empty list at it a valid answer.)
        meta = '{"resourceVersion": ' + rand.choice([c for c in CONFUSED if not c.startswith('"')]) + "}"
    elif which == 4:
        kind = rand.choice(('"PodList"', '"Status"', "7", '"List"'))
    elif which == 5:
        items = '[{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "intruder", "namespace": "default"}}]'
    elif which == 6:
        # (Not null: a list whose continue is null has ended, and an empty one is valid.)
        meta = '{"resourceVersion": "1", "continue": ' + rand.choice([c for c in CONFUSED if c != "null"]) + "}"
    else:
        version = rand.choice(('"apps/v1"', "1e400", "[]"))
    return f'{{"kind": {kind}, "apiVersion": {version}, "metadata": {meta}, "items": {items}}}'


def _confused_frame(rand: random.Random, rt: ResourceType) -> str:
    obj = f'{{"kind": "{rt.kind}", "apiVersion": "{rt.api_version}", "metadata": {{"name": "x", "resourceVersion": "1"}}}}'
    return rand.choice(
        (
            '{"type": "ERROR", "object": {"kind": "Status", "code": ' + rand.choice(CONFUSED) + "}}",
            '{"type": "ERROR", "object": ' + _confused_status(rand) + "}",
            '{"type": "ERROR", "object": "gone"}',
            "[" + obj + "]",
            '{"type": 7, "object": ' + obj + "}",
            '{"type": "ADDED", "object": "a string"}',
            '{"type": "ADDED", "object": {"kind": "' + rt.kind + '", "metadata": [1]}}',
            '{"type": "MODIFIED", "object": {"kind": "' + rt.kind + '", "metadata": {"name": ["x"]}}}',
            '{"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "x", "namespace": "default"}}}',
            '{"type": "BOOKMARK", "object": {"kind": "' + rt.kind + '", "metadata": {"resourceVersion": 5}}}',
            '{"type": "SOMETHING", "object": ' + obj + "}",
            '{"type": "ADDED", "object": {"kind": "' + rt.kind + '", "metadata": {"name": "x"}} ',
            "\x00\xff not json",
        )
    )
