"""Watch streams: the events a watch is owed from a resourceVersion (history, synthetic ADDED
events for "any version" and watch-lists, BOOKMARKs, 410 Expired, injected ERROR events), and
the resourceVersion rules reads share with lists."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kubeproxy.lab.apiserver.resources import Route
from kubeproxy.lab.apiserver.selectors import Selector
from kubeproxy.lab.apiserver.status_errors import JSON, ApiError, status_object
from kubeproxy.lab.apiserver.store import Event

if TYPE_CHECKING:
    from kubeproxy.lab.apiserver.lifecycle import ApiServer


# Seconds before a watch's timeout at which it gets its BOOKMARK (apiserver v0.37.2,
# pkg/storage/cacher/cache_watcher.go: nextBookmarkTime).
PRE_TIMEOUT_BOOKMARK = 2.0


def stream(
    api: ApiServer,
    route: Route,
    query: dict[str, str],
    selector: Selector,
    bookmarks: bool,
    deadline: float | None,
    last_bookmark: float,
    connection: socket.socket,
    send: Callable[[JSON], None],
    end: Callable[[], None],
) -> None:
    """Serve one watch: `send` each event, `end` the stream when the server would end it; return
    without `end` when the connection is cut (a dropped watch, a stopping server)."""
    store, rt = api.store, route.rt
    with store.cond:
        sent_generation = store.bookmark_generation
        error_generation = store.error_generation
        raw_rv = query.get("resourceVersion", "")
        if query.get("sendInitialEvents") in ("true", "1"):
            # A watch-list: the state at least as new as the version asked for, as ADDED events,
            # then a BOOKMARK marking the end of them. The only kind of watch the real server
            # answers with "Too large resource version" (an ERROR event: the stream is open).
            if raw_rv not in ("", "0"):
                try:
                    store.wait_until_fresh(minimum_rv({"resourceVersion": raw_rv}) or 0, api.block_timeout)
                except ApiError as e:
                    send({"type": "ERROR", "object": e.status()})
                    end()
                    return
            items, since = store.list_shared(rt, route.namespace, selector)
            pending = [{"type": "ADDED", "object": obj} for obj in items]
            if bookmarks:
                initial_end = {"resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}
                pending.append(
                    {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": initial_end}}
                )
        elif raw_rv in ("", "0"):
            # "Any version": the current state as synthetic ADDED events, then changes.
            items, since = store.list_shared(rt, route.namespace, selector)
            pending = [{"type": "ADDED", "object": obj} for obj in items]
        else:
            try:
                since = int(raw_rv)
            except ValueError:
                since = -1
            if since < store.compacted_rv:
                message = f"too old resource version: {raw_rv} ({store.compacted_rv})"
                gone = status_object(410, "Expired", message)
                send({"type": "ERROR", "object": gone})
                end()
                return
            # A version newer than the store's is accepted, as upstream's watch cache does:
            # the watch stays silent until the store's versions pass it.
            pending = []
    # Upstream never sends a watch a BOOKMARK older than the version it started from.
    start = since
    # As upstream's cacher, a watch that allows bookmarks and has a timeout gets one shortly
    # before it ends, so the client resumes from as close to now as possible; but only once the
    # store has moved past what the watch was owed when it began (the cacher's watcher drops a
    # bookmark no newer than its initial events).
    pre_timeout = None if deadline is None else deadline - PRE_TIMEOUT_BOOKMARK
    with store.cond:
        owed_at_start = max(start, store.rv)
    while True:
        for event in pending:
            send(event)
        with store.cond:
            pending = []
            while not pending:
                if api._closing or connection in api._dropped:
                    return  # cut mid-stream: no terminating chunk, like a dead server
                if store.error_generation != error_generation and store.error_status is not None:
                    send({"type": "ERROR", "object": store.error_status})
                    end()
                    return
                if since < store.compacted_rv:
                    # The history moved past this watch before it caught up: it must relist.
                    message = f"too old resource version: {since} ({store.compacted_rv})"
                    send({"type": "ERROR", "object": status_object(410, "Expired", message)})
                    end()
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    end()
                    return
                for ev in store.events_after(since):
                    if ev.rt == rt:
                        translated = translate(ev, route.namespace, selector)
                        if translated is not None:
                            pending.append(translated)
                if store.history and store.history[-1].rv > since:
                    since = store.history[-1].rv
                forced = store.bookmark_generation != sent_generation and store.bookmark_rv is not None
                due = api.bookmark_interval is not None and time.monotonic() - last_bookmark >= api.bookmark_interval
                due = due or (pre_timeout is not None and time.monotonic() >= pre_timeout and store.rv > owed_at_start)
                wanted = store.bookmark_generation != sent_generation or due
                if bookmarks and not pending and wanted and (forced or store.rv >= start):
                    rv = store.bookmark_rv if forced and store.bookmark_rv is not None else store.rv
                    since = max(since, rv)
                    bookmark = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}}
                    pending.append({"type": "BOOKMARK", "object": bookmark})
                    pre_timeout = None
                sent_generation = store.bookmark_generation
                if pending:
                    last_bookmark = time.monotonic() if pending[-1]["type"] == "BOOKMARK" else last_bookmark
                    break
                store.cond.wait(timeout=0.2)


_CAUSE_WORDS = {"FieldValueForbidden": "Forbidden", "FieldValueNotSupported": "Unsupported value"}


def check_options(query: dict[str, str], watch_list: bool) -> None:
    """A watch's options as upstream validates them (apimachinery v0.37.2,
    pkg/apis/meta/internalversion/validation: validateWatchOptions): 422 Invalid otherwise, its
    causes in the Status's details as the real server lists them."""
    errors: list[tuple[str, str, str]] = []  # (field, cause reason, message)
    match = query.get("resourceVersionMatch", "")
    initial = "sendInitialEvents" in query
    forbidden = "FieldValueForbidden"
    if initial and match != "NotOlderThan":
        needs = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        errors.append(("resourceVersionMatch", forbidden, needs))
    if initial and not watch_list:
        gate = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
        errors.append(("sendInitialEvents", forbidden, gate))
    if match and not initial:
        alone = "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        errors.append(("resourceVersionMatch", forbidden, alone))
    if match and match != "NotOlderThan":
        errors.append(("resourceVersionMatch", "FieldValueNotSupported", f'"{match}": supported values: "NotOlderThan"'))
    if errors:
        prefixed = [(field, reason, f"{_CAUSE_WORDS[reason]}: {message}") for field, reason, message in errors]
        described = [f"{field}: {message}" for field, _, message in prefixed]
        listed = described[0] if len(described) == 1 else f"[{', '.join(described)}]"
        causes = [{"reason": reason, "message": message, "field": field} for field, reason, message in prefixed]
        details = {"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes}
        raise ApiError(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {listed}', details)


def minimum_rv(query: dict[str, str]) -> int | None:
    """The resourceVersion a list must be at least as new as, or None for "any" (unset or "0").

    `resourceVersionMatch=NotOlderThan` (the default for a set version) and `Exact` both need the
    server to have reached that version; this server keeps no old snapshots, so for `Exact` it
    answers with its current state, which is what the proxy's consumers need of it.
    """
    raw, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    if match not in ("", "NotOlderThan", "Exact"):
        raise ApiError(400, "BadRequest", f'unsupported resourceVersionMatch "{match}"')
    if match and not raw:
        raise ApiError(
            422,
            "Invalid",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        )
    if raw in ("", "0"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(
            400,
            "BadRequest",
            f'invalid resource version: resourceVersion: Invalid value: "{raw}": '
            f'strconv.ParseUint: parsing "{raw}": invalid syntax',
        ) from None


def translate(ev: Event, namespace: str | None, selector: Selector) -> JSON | None:
    """The event a filtered watch sees: an object leaving the filter is DELETED, entering it ADDED."""

    def visible(obj: JSON | None) -> bool:
        if obj is None:
            return False
        in_ns = namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace
        return in_ns and selector.matches(obj)

    was, now = visible(ev.old), visible(ev.obj)
    if ev.type == "DELETED":
        return {"type": "DELETED", "object": ev.obj} if was else None
    if was and now:
        return {"type": ev.type, "object": ev.obj}
    if now:
        return {"type": "ADDED", "object": ev.obj}
    if was:
        return {"type": "DELETED", "object": ev.obj}
    return None
