"""An API server outage of 3 × the health timeout against a live proxy and a namespace's kernel.

Upstream's health is the proxier's freshness against the updates it was given; an outage queues
none, so /healthz and /livez stay 200 throughout (a control-plane blip must not take every node
out of its load balancers, nor restart every proxy). The rules stay as programmed, and the outage
shows where an operator looks: a warning, `kubeproxy_source_out_of_sync`, the body's `source`
field, and a line at default verbosity once the source is back. Then a change converges.

The outage lasts 3 × the health timeout (2 × syncPeriod) of real time: that length is the
behaviour under test. Everything else awaits what the proxy does (log lines, metric values,
syncs, rules).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.netns import NetNS
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.proxy.source_watch import METRIC
from kubeproxy.runtime.logs import STARTUP_LOGGER
from tests.live.test_live import CFG, _dnats_to, _get, _port, _service, _until, _with_proxy, mode, server  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

HEALTH_TIMEOUT = 2 * CFG.sync_period
OUTAGE = 3 * HEALTH_TIMEOUT
LOST = "Source out of sync"
BACK = "Source back in sync"


def _ruleset(netns: NetNS, mode: str) -> str:  # noqa: F811
    """Every rule in the namespace, as the mode's own dump prints it."""
    if mode == "nftables":
        return netns.run(["nft", "list", "ruleset"]).stdout
    text = netns.run(["iptables-save"]).stdout
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def _metric(proxy: LiveProxy) -> float | None:
    _, text = _get(f"http://127.0.0.1:{_port(proxy, 'metrics')}/metrics")
    for line in text.splitlines():
        if line.startswith(METRIC + " "):
            return float(line.split()[-1])
    return None


def _source_field(proxy: LiveProxy) -> object:
    _, text = _get(f"http://127.0.0.1:{_port(proxy, 'healthz')}/healthz")
    return json.loads(text).get("source")


@dataclass
class Poller:
    """Asks /healthz and /livez, one after the other, until stopped: every answer, with its time."""

    port: int
    answers: list[tuple[float, str, int, dict[str, Any]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            for path in ("/healthz", "/livez"):
                status, text = _get(f"http://127.0.0.1:{self.port}{path}")
                self.answers.append((time.monotonic(), path, status, json.loads(text)))
            self.stop.wait(0.05)  # pacing only: the proxy shares two cores with the rest


def test_an_api_outage_of_three_health_timeouts_keeps_health_and_rules(
    netns: NetNS,
    server: ApiServer,  # noqa: F811
    tmp_path: Path,
    mode: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)

    def logged(message: str) -> list[logging.LogRecord]:
        return [r for r in list(caplog.records) if message in r.getMessage()]

    async def body(proxy: LiveProxy) -> None:
        for obj in _service("fresh", "10.96.7.7", ["10.244.1.77"]):
            server.apply(obj)
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.77"), "the new endpoint's DNAT rule")
        assert await asyncio.to_thread(_metric, proxy) == 0.0
        assert await asyncio.to_thread(_source_field, proxy) == {"inSync": True}
        before = _ruleset(netns, mode)

        poller = Poller(_port(proxy, "healthz"))
        polling = asyncio.create_task(asyncio.to_thread(poller.run))
        try:
            server.stop()
            stopped = time.monotonic()
            syncs = proxy.syncs
            await _until(proxy, lambda: bool(logged(LOST)), "the warning that the source is out of sync")
            await _until(proxy, lambda: _metric(proxy) == 1.0, f"{METRIC} to be 1")
            # Syncs during the outage (a change queued before it, the hourly one) must keep the
            # rules, and each is a chance for health to turn.
            for _ in range(2):
                done = proxy.syncs + proxy.failed_syncs
                proxy.runner.run()
                await asyncio.wait_for(proxy.wait_for_syncs(done + 1), OUTAGE)
            left = OUTAGE - (time.monotonic() - stopped)
            if left > 0:
                await asyncio.sleep(left)  # the outage's length is what is under test
            during = _ruleset(netns, mode)
            outage_syncs = proxy.syncs - syncs
        finally:
            poller.stop.set()
            await polling
        ended = time.monotonic()
        server.start()
        # A real server sends every watch a bookmark within a minute; this one's, sent as soon as the
        # four watches are back, is what proves to the proxy that the server kept its history.
        await asyncio.to_thread(server.wait_for_watches, 4)
        server.bookmark()

        assert during == before  # the syncs kept the rules exactly as they were
        assert outage_syncs >= 2 and proxy.failed_syncs == 0
        answers = [a for a in poller.answers if stopped <= a[0] <= ended]
        # Asked throughout: no gap as long as the health timeout, from the stop to the restart.
        times = [stopped, *(t for t, *_ in answers), ended]
        assert max(b - a for a, b in itertools.pairwise(times)) < HEALTH_TIMEOUT, "polled throughout the outage"
        bad = [(round(t - stopped, 2), path, status, doc) for t, path, status, doc in answers if status != 200]
        assert not bad, bad
        assert all(doc["healthy"] is True for _, _, _, doc in answers)
        assert all(doc.get("nodeEligible") is (True if path == "/healthz" else None) for _, path, _, doc in answers)
        shown = [doc["source"] for _, path, _, doc in answers if path == "/healthz"]
        assert {"inSync": True} not in shown[len(shown) // 2 :], "the body shows the lost source"
        assert all(s == {"inSync": True} or s["inSync"] is False for s in shown)

        (lost,) = logged(LOST)
        assert lost.levelno == logging.WARNING
        await _until(proxy, lambda: bool(logged(BACK)), "the line that the source is back")
        (back,) = logged(BACK)
        assert back.name == STARTUP_LOGGER and back.levelno == logging.INFO  # shown at default verbosity
        assert await asyncio.to_thread(_metric, proxy) == 0.0
        assert await asyncio.to_thread(_source_field, proxy) == {"inSync": True}

        server.apply(_service("fresh", "10.96.7.7", ["10.244.1.78"])[1])
        await _until(proxy, lambda: _dnats_to(netns, mode, "10.244.1.78"), "a change after the outage")
        assert not _dnats_to(netns, mode, "10.244.1.77")
        print(f"{mode}: {len(answers)} answers in a {ended - stopped:.1f}s outage, {outage_syncs} syncs, all 200")

    asyncio.run(_with_proxy(netns, server, tmp_path, mode, body))
