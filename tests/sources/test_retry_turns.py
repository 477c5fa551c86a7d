"""A restarted API server refuses every request (403) until its RBAC bootstrap has run: what a
source asks meanwhile and after. As client-go's reflector, a refused watch is not asked again but
followed by a watch-list from the last version (which the new server's watch cache serves, where
a resumed watch would meet 410); unlike it, a refused watch-list is not followed by a list (the
same rule refuses it), and the reflectors of one source take turns: one asks per back-off round
and the others take its answer as theirs. The test API server's request log is the evidence."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import (
    INITIAL_EVENTS_END,
    MAX_ADOPTED,
    ApiSource,
    Reflector,
    RetryTurns,
    SourceError,
    service_cidrs,
    services,
)
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from tests.sources.test_api_client_go import WATCH_LIST, resumed, until, without_timeout
from tests.sources.test_api_reflector import Delays, NoJitter, reflecting, run, svc, take, watching
from tests.sources.test_lost_state import requests_since

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(block_timeout=0.1) as server:
        yield server


def test_a_resumed_watch_refused_is_followed_by_a_watch_list_from_its_version(api: ApiServer, tmp_path: Path) -> None:
    def recover(attempt: int) -> None:
        if attempt == 2:
            api.fail_with(None)

    delays = Delays(on_sleep=recover)

    async def main() -> None:
        async with reflecting(api, tmp_path, sleep=delays.sleep, watch_list=True) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            api.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            last = str(api.resource_version)
            mark = len(api.requests)
            api.fail_with(403)
            api.drop_watches()
            await until(lambda: reflector.lists == 2)
            assert reflector.connected
            watch = {"watch": "true", "resourceVersion": last, "allowWatchBookmarks": "true"}
            watch_list = {**WATCH_LIST, "resourceVersion": last}
            # The resumed watch and the watch-list are refused (no list after it: the same rule
            # refuses it); the watch-list asked again once the server lets us read is answered.
            assert without_timeout(requests_since(api, mark)) == [watch, watch_list, watch_list]
            assert queue.empty()  # nothing changed meanwhile: nothing delivered again

    run(main())
    assert delays.delays == [0.8, 1.6]


def test_a_source_asks_about_once_per_round_while_every_resource_is_refused(api: ApiServer, tmp_path: Path) -> None:
    rounds = 24  # back-off waits of the source's 4 reflectors, taken or spent asking

    def recover(attempt: int) -> None:
        if attempt == rounds:
            api.fail_with(None)

    delays = Delays(on_sleep=recover)

    async def main() -> None:
        api.apply(svc("a"))
        client = connect(load_config(api.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
        source = ApiSource(client, "node-a", lambda event: None, sleep=delays.sleep,
                           backoff_factory=lambda: Backoff(rand=NoJitter()))  # fmt: skip
        task = asyncio.create_task(source.run())
        try:
            await source.wait_synced()
            await watching(api, len(source.reflectors))
            mark = len(api.requests)
            api.fail_with(403)
            api.drop_watches()
            # Awaited, not polled under a 10 s bound: 24 rounds of refusals outlast that on a loaded machine.
            await asyncio.gather(*(r.wait_listed(2) for r in source.reflectors))
            sent = requests_since(api, mark)
            refused, answered = sent[: -len(source.reflectors)], sent[-len(source.reflectors) :]
            # Each reflector's own watch (cut or resumed) is refused once; after that about one
            # request per round for the source, where each reflector alone would ask each round.
            assert len(refused) <= len(source.reflectors) + rounds // 2, refused
            assert sorted(r["path"] for r in answered) == sorted(r.spec.path for r in source.reflectors)
            assert all(r.get("sendInitialEvents") == "true" and r.get("resourceVersion") for r in answered), answered
            assert source.connected
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.aclose()

    run(main())
    assert len(delays.delays) >= rounds


def test_another_reflectors_failure_is_taken_only_when_newer_and_at_most_max_adopted_times() -> None:
    """A failure met before this reflector's own is old news: it asks. A newer one is taken as its
    own (a 403 then means a watch-list next), MAX_ADOPTED times in a row at most, then it asks
    itself, so that a resource refused alone cannot keep another from asking; a retry in flight
    is waited for, and once the server answered it, it asks at once."""
    delays = Delays()

    async def main() -> None:
        turns = RetryTurns()
        async with httpx2.AsyncClient() as client:  # never used: no request is made here
            reflector = Reflector(client, services(), lambda event: None, sleep=delays.sleep, retry_turns=turns)
            reflector._must_list = False
            reflector._server_failing = True
            refused = SourceError("/apis/discovery.k8s.io/v1/endpointslices", 403, "Forbidden", "endpointslices is forbidden")
            turns.record(refused, 1.0)
            reflector._failed_at = 1.0
            assert not await reflector._took_another_failure()  # its own failure: it asks
            assert turns.in_flight()
            reflector._settle_turn()
            for taken in range(MAX_ADOPTED):
                turns.record(refused, 2.0 + taken)
                assert await reflector._took_another_failure()
                assert reflector._must_list
            turns.record(refused, 10.0)
            assert not await reflector._took_another_failure()  # MAX_ADOPTED in a row: it asks
            reflector._settle_turn()

            turns.record(refused, 11.0)
            turn = turns.take()  # another reflector's retry, in flight
            deciding = asyncio.create_task(reflector._took_another_failure())
            await asyncio.sleep(0)
            assert not deciding.done()
            turns.record(None, 12.0)  # it was answered
            turn.set_result(None)
            assert not await deciding

    asyncio.run(main())
    assert len(delays.delays) == MAX_ADOPTED


def test_the_resumed_watch_goes_first_when_the_server_answers(api: ApiServer, tmp_path: Path) -> None:
    """No refusal: a cut watch resumed at once, as before (no turn is waited for)."""

    async def main() -> None:
        async with reflecting(api, tmp_path, watch_list=True) as (reflector, queue):
            await reflector.wait_synced()
            await watching(api)
            api.apply(svc("a"))
            assert await take(queue, 1) == [("ADDED", "a")]
            mark = len(api.requests)
            api.drop_watches()
            await resumed(api, mark)
            api.apply(svc("b"))
            assert await take(queue, 1) == [("ADDED", "b")]
            assert [r.get("sendInitialEvents") for r in requests_since(api, mark)] == [None]
            assert reflector.lists == 1

    run(main())


def test_a_resource_refused_alone_delays_another_reflectors_retry_by_at_most_max_adopted_rounds() -> None:
    """Service CIDRs are refused (403) on every request, Services' first request met a refused
    connection: each time the Services reflector wakes from a back-off, a newer refusal of the
    CIDRs is there to take as its own. It takes MAX_ADOPTED of them in a row, then asks itself."""
    services_asked: list[dict[str, str]] = []
    waits_before: list[int] = []  # the Services reflector's back-off waits before each of its requests
    cidrs_refused = asyncio.Event()
    ended = {"resourceVersion": "5", "annotations": {INITIAL_EVENTS_END: "true"}}
    end = {"type": "BOOKMARK", "object": {"kind": "Service", "apiVersion": "v1", "metadata": ended}}

    def answer(req: httpx2.Request) -> httpx2.Response:
        if req.url.path == service_cidrs().path:
            cidrs_refused.set()
            forbidden = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                         "message": "servicecidrs.networking.k8s.io is forbidden"}  # fmt: skip
            return httpx2.Response(403, json=forbidden)
        services_asked.append(dict(req.url.params))
        waits_before.append(len(services_delays))
        if len(services_asked) == 1:
            raise httpx2.ConnectError("connection refused", request=req)
        if req.url.params.get("sendInitialEvents"):
            return httpx2.Response(200, content=json.dumps(end).encode() + b"\n")
        return httpx2.Response(200, content=b"")  # the watch after it: ended at once, backed off

    async def after_a_newer_refusal(delay: float) -> None:
        """The Services reflector's sleep: over once the CIDRs were refused again meanwhile."""
        services_delays.append(delay)
        cidrs_refused.clear()
        await cidrs_refused.wait()

    services_delays: list[float] = []
    cidrs_delays = Delays()

    async def main() -> None:
        turns = RetryTurns()
        client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="http://api")
        reflectors = [
            Reflector(client, services(), lambda event: None, sleep=after_a_newer_refusal, retry_turns=turns, watch_list=True),
            Reflector(client, service_cidrs(), lambda event: None, sleep=cidrs_delays.sleep, retry_turns=turns, watch_list=True),
        ]  # fmt: skip
        tasks = [asyncio.create_task(r.run()) for r in reflectors]
        try:
            async with asyncio.timeout(20):  # without the limit it would take the CIDRs' refusals for ever
                await reflectors[0].wait_synced()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.aclose()

    run(main())
    # Its own back-off after the refused connection, then MAX_ADOPTED taken, then its request.
    assert waits_before[:2] == [0, 1 + MAX_ADOPTED]
    assert [r.get("sendInitialEvents") for r in services_asked[:2]] == ["true", "true"]
    assert len(cidrs_delays.delays) >= MAX_ADOPTED
