"""A restarted API server refuses every request (403) until its RBAC bootstrap has run: what a
source asks meanwhile and after. As client-go's reflector, a refused watch is not asked again but
followed by a watch-list from the last version (which the new server's watch cache serves, where
a resumed watch would meet 410); unlike it, a refused watch-list is not followed by a list (the
same rule refuses it), and the reflectors of one source take turns: one asks per back-off round
and the others take its answer as theirs. The test API server's request log is the evidence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import MAX_ADOPTED, ApiSource, Reflector, RetryTurns, SourceError, services
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
            await until(lambda: all(r.lists == 2 for r in source.reflectors))
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
