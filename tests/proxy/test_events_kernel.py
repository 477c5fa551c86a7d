"""The Events `kube-proxy` writes, side by side with upstream v1.37.2's binary.

Each proxy runs in its own network namespace against our test API server (its socket in that
namespace), with a Node named n1; the test waits for the Events to be stored. Upstream's client
is told to send JSON (`--kube-api-content-type`): the test server does not speak protobuf.
Upstream writes one Event at start, `Starting` about the Node (its `KubeProxyDefaultMode`
warning is recorded before its broadcaster starts and never reaches the server); ours must be
the same Event, field for field but the name's timestamp and the time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab.apiserver import EVENT, ApiServer, Selector
from kubeproxy.lab.multinode.control import start_in
from kubeproxy.lab.netns import netns, stop_process

pytestmark = pytest.mark.root

KUBE_PROXY = str(Path(sys.executable).parent / "kube-proxy")
UPSTREAM = Path("/var/cache/kubeproxy-upstream/v1.37.2/bin/kube-proxy")
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.1.0.2"}]}}  # fmt: skip
# What the server sets or what carries the moment: not the writer's to match.
VARYING = ("name", "uid", "creationTimestamp", "resourceVersion", "generation")


def _events(server: ApiServer) -> list[dict[str, Any]]:
    items, _ = server.store.list(EVENT, None, Selector())
    return items


def _await(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition, not a guess at how long it takes


def _events_of(argv: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """The Events a proxy started with `argv` writes once it is up (its own namespace and server)."""
    with netns("kpev") as ns:
        server = ApiServer()
        start_in(ns, server)
        try:
            server.apply(NODE)
            kubeconfig = server.write_kubeconfig(tmp_path / f"{ns.name}.kubeconfig")
            log = tmp_path / f"{ns.name}.log"
            with log.open("w") as err:
                proc = ns.popen([*argv, f"--kubeconfig={kubeconfig}", "--hostname-override=n1", "--proxy-mode=iptables"],
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
            try:
                _await(f"{argv[0]}'s Starting event",
                       lambda: proc.poll() is not None or any(e.get("reason") == "Starting" for e in _events(server)))
                events = _events(server)
            finally:
                stop_process(proc, 10)
            assert events, log.read_text()[-3000:]
            return events
        finally:
            server.stop()


def _comparable(event: dict[str, Any]) -> dict[str, Any]:
    out = dict(event)
    meta = {k: v for k, v in out.pop("metadata").items() if k not in VARYING}
    out.pop("eventTime")
    for key in ("deprecatedSource", "deprecatedFirstTimestamp", "deprecatedLastTimestamp"):
        out.pop(key, None)  # the zero values Go's encoder writes: the API server drops them too
    out.pop("apiVersion", None)
    out.pop("kind", None)
    return {"metadata": meta, **out}


@pytest.mark.skipif(not UPSTREAM.exists(), reason="upstream's kube-proxy is not built here (scripts/upstream)")
def test_our_starting_event_is_upstreams(tmp_path: Path) -> None:
    theirs = _events_of([str(UPSTREAM), "--kube-api-content-type=application/json"], tmp_path)
    ours = _events_of([KUBE_PROXY], tmp_path)
    assert [e["reason"] for e in theirs] == ["Starting"]
    assert [_comparable(e) for e in ours] == [_comparable(e) for e in theirs]
    for event in ours:
        name, _, stamp = event["metadata"]["name"].partition(".")
        assert name == "n1" and int(stamp, 16) > 0  # <node>.<unix nanoseconds in hex>, as client-go names it
