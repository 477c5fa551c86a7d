"""HTTP: one request handler thread per connection, routing to discovery or to a resource
(list, watch, get, create, update, patch, delete); watches are framed here as chunked JSON, one
event per line, and served by `watch.stream`."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import yaml

from kubeproxy.lab.apiserver import discovery, hostile, paging, watch
from kubeproxy.lab.apiserver.admission import FIELD_VALIDATION, admit
from kubeproxy.lab.apiserver.patches import json_patch, merge_patch, strategic_merge_patch
from kubeproxy.lab.apiserver.resources import NAMESPACE, ResourceType, Route, route_of
from kubeproxy.lab.apiserver.selectors import Selector
from kubeproxy.lab.apiserver.status_errors import JSON, ApiError

if TYPE_CHECKING:
    from kubeproxy.lab.apiserver.lifecycle import ApiServer

# One logger for the whole server, whichever module logs.
log = logging.getLogger("kubeproxy.lab.apiserver")


def encode(body: Any) -> bytes:
    """JSON, by msgspec: 10k-object lists in compiled code (the stored dicts as they are, no copy).

    The same JSON values as `json.dumps` (compact, UTF-8 rather than \\u escapes); whatever
    msgspec refuses (an integer past 64 bits, a key that is not a string) goes the general way."""
    try:
        return msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError):
        return json.dumps(body).encode()


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as Go's net/http (so kube-apiserver) sets on every connection: with Nagle on,
    # a watch event written while the previous one waits for the client's delayed ACK sat 40 ms
    # in the kernel (bench/sync.py: the p99 of one change at 10k services was those 40 ms).
    disable_nagle_algorithm = True
    _raw_body: bytes = b""
    server: HttpServer

    # -- plumbing

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.api._track(self.connection, add=False)
        with contextlib.suppress(OSError):  # the client or a test hook already closed the socket
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send_json(self, code: int, body: JSON, warnings: Sequence[str] = (), headers: dict[str, str] | None = None) -> None:
        data = encode(body)
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        for warning in warnings:
            # RFC 7234 warning, code 299 ("miscellaneous persistent warning"), as the real server sends.
            self.send_header("Warning", '299 - "' + warning.replace("\\", "\\\\").replace('"', '\\"') + '"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_openapi_v2(self) -> None:
        """An OpenAPI v2 document without definitions. kubectl reads it only to validate a kind the
        v3 document does not list (one the server does not serve): finding no schema, it leaves the
        object to the server, which then answers as a real one does for an unknown kind. The empty
        protobuf message is zero bytes."""
        self.send_response(200)
        self.send_header("Content-Type", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self) -> Any:
        raw = self._raw_body
        if not raw:
            return None
        ctype = self.headers.get("Content-Type", "")
        try:
            return yaml.safe_load(raw) if "yaml" in ctype else json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise ApiError(400, "BadRequest", f"cannot decode the request body: {e}") from e

    def _dispatch(self) -> None:
        api = self.server.api
        # Read the body first, whatever happens next, so that a keep-alive connection stays in step.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""
        with api.store.cond:
            api.requests.append((self.command, self.path))
            api.user_agents[self.headers.get("User-Agent", "")] += 1
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/openapi/v2" and self.command == "GET":
                self._send_openapi_v2()
                return
            found = discovery.answer(api.resources, api.port, url.path, self.command)
            if found is not None:
                self._send_json(200, found)
                return
            route = route_of(api.resources, url.path)
            if route is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            hostility = api.hostility
            drawn = hostility.draw(query.get("watch") in ("true", "1"), query) if hostility and self.command == "GET" else None
            if hostility is not None and drawn is not None:
                hostile.answer(self, hostility, *drawn, route.rt, query)
                return
            if api._failing is not None:
                code = api._failing
                retry = api._failing_retry_after
                details: JSON = {} if retry is None else {"retryAfterSeconds": retry}
                raise ApiError(code, HTTPStatus(code).phrase.replace(" ", ""), f"injected failure {code}", details)
            self._resource(route, query)
        except ApiError as e:
            retry = e.details.get("retryAfterSeconds")
            # As upstream's ErrorNegotiated: a Status with a retry hint also sets Retry-After.
            headers = {"Retry-After": str(retry)} if isinstance(retry, int) and retry > 0 else {}
            self._send_json(e.code, e.status(), headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # -- resources

    def _resource(self, route: Route, query: dict[str, str]) -> None:
        api, rt = self.server.api, route.rt
        ns = route.namespace or ""
        method = self.command
        if route.name is None:
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._watch(route, query)
            elif method == "GET":
                selector = Selector.parse(query.get("fieldSelector", ""), query.get("labelSelector", ""), rt.kind)
                minimum = watch.minimum_rv(query)
                if minimum is not None:
                    with api.store.cond:
                        api.store.wait_until_fresh(minimum, api.block_timeout)
                page = paging.page_of(query, api.store.compacted_rv)
                shared, rv, last, remaining = api.store.list_page(rt, route.namespace, selector, page.after, page.limit)
                rv = page.rv if page.rv > 0 else rv
                meta: JSON = {"resourceVersion": str(rv)}
                if last is not None:
                    meta["continue"] = paging.encode(rv, last)
                    if selector.empty:
                        meta["remainingItemCount"] = remaining
                # The real server leaves the type to the list's own kind; clients must cope. A
                # shallow copy each: the stored dicts are shared and only encoded (store.py).
                items = [{k: v for k, v in item.items() if k != "kind" and k != "apiVersion"} for item in shared]
                self._send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items})
            elif method == "POST":
                body = self._body()
                obj, warnings = admit(rt, body, None, self._field_validation(query)) if isinstance(body, dict) else (body, [])
                self._check_namespace(rt, ns)
                self._send_json(201, api.store.create(rt, ns, obj, dry_run=self._dry_run(query)), warnings)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection of {rt.plural}")
            return
        name = route.name
        if method == "GET":
            self._send_json(200, api.store.get(rt, ns, name))
        elif method == "PUT":
            body = self._body()
            with api.store.cond:
                obj, warnings = self._admit(rt, body, ns, name, query)
                self._send_json(200, api.store.update(rt, ns, name, obj, dry_run=self._dry_run(query)), warnings)
        elif method == "PATCH":
            self._patch(route, ns, name, query)
        elif method == "DELETE":
            # DeleteOptions: propagation policy and grace period mean nothing here, but kubectl sends
            # a server-side dry run in them (dryRun: [All]) rather than in the query.
            options = self._body()
            in_body = options.get("dryRun") if isinstance(options, dict) else None
            dry_run = self._dry_run(query)
            if in_body is not None:
                dry_run = self._dry_run({"dryRun": ",".join(in_body) if isinstance(in_body, list) else str(in_body)}) or dry_run
            gone = api.store.delete(rt, ns, name, dry_run=dry_run)
            if rt.returns_deleted:
                self._send_json(200, gone)
                return
            group = {"group": rt.group} if rt.group else {}
            details = {"name": name, **group, "kind": rt.plural, "uid": gone["metadata"].get("uid")}
            # A Success Status has neither message, reason nor code (upstream omits them).
            self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _patch(self, route: Route, ns: str, name: str, query: dict[str, str]) -> None:
        store, rt = self.server.api.store, route.rt
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        patch = self._body()
        dry_run = self._dry_run(query)
        with store.cond:
            try:
                current = store.get(rt, ns, name)
            except ApiError:
                if ctype != "application/apply-patch+yaml":
                    raise
                # Server-side apply creates what does not exist yet.
                obj, warnings = admit(rt, patch or {}, None, self._field_validation(query))
                self._check_namespace(rt, ns)
                self._send_json(201, store.create(rt, ns, obj, dry_run=dry_run), warnings)
                return
            if ctype == "application/merge-patch+json":
                patched = merge_patch(current, patch)
            elif ctype in ("application/strategic-merge-patch+json", "application/apply-patch+yaml"):
                patched = strategic_merge_patch(current, patch, rt)
            elif ctype == "application/json-patch+json":
                if not isinstance(patch, list):
                    raise ApiError(400, "BadRequest", "a json patch must be a list of operations")
                patched = json_patch(current, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
            obj, warnings = admit(rt, patched, current, self._field_validation(query))
            self._send_json(200, store.update(rt, ns, name, obj, dry_run=dry_run), warnings)

    def _admit(self, rt: ResourceType, body: Any, ns: str, name: str, query: dict[str, str]) -> tuple[Any, list[str]]:
        """A replacement (PUT) decoded and validated against the stored object it replaces."""
        if not isinstance(body, dict):
            return body, []  # Store.update reports the malformed body
        old = self.server.api.store.get(rt, ns, name) if rt.schema is not None else None
        return admit(rt, body, old, self._field_validation(query))

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        """The real server refuses to create in a namespace that does not exist. Checked for the
        validated kinds only: the proxy's own kinds are created freely by the consumer tests."""
        api = self.server.api
        if rt.schema is None or not rt.namespaced or NAMESPACE not in api.resources:
            return
        try:
            api.store.get(NAMESPACE, "", ns)
        except ApiError:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}) from None

    @staticmethod
    def _dry_run(query: dict[str, str]) -> bool:
        value = query.get("dryRun", "")
        if value not in ("", "All"):
            raise ApiError(400, "BadRequest", f'unsupported dryRun value "{value}": the only accepted value is "All"')
        return value == "All"

    @staticmethod
    def _field_validation(query: dict[str, str]) -> str:
        value = query.get("fieldValidation", "")
        if value not in ("", *FIELD_VALIDATION):
            supported = ", ".join(FIELD_VALIDATION)
            raise ApiError(400, "BadRequest", f'fieldValidation "{value}" is not one of {supported}')
        return value

    def _watch(self, route: Route, query: dict[str, str]) -> None:
        store = self.server.api.store
        watch.check_options(query, self.server.api.watch_list)
        selector = Selector.parse(query.get("fieldSelector", ""), query.get("labelSelector", ""), route.rt.kind)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # This server ends the connection with the watch: saying so keeps a client from sending
        # its next request on a connection about to close.
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        last_bookmark = time.monotonic()
        with store.cond:
            store.watchers += 1
            store.cond.notify_all()
        try:
            watch.stream(
                self.server.api, route, query, selector, bookmarks, deadline, last_bookmark,
                self.connection, self._chunk, self._end_chunks,
            )  # fmt: skip
        finally:
            with store.cond:
                store.watchers -= 1
                store.cond.notify_all()

    def _chunk(self, event: JSON) -> None:
        data = encode(event) + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
