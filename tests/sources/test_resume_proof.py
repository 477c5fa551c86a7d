"""Watches cut together (a restarted API server) are resumed and proven together: the
resourceVersions of every resource are one etcd revision, so one resumed watch's event, or the
first resume check's answer on a quiet server, covers the source's other reflectors; a server
that lost its history is still caught by each reflector."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kubeproxy.lab import builders
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.sources.api import RESUME_PROOF_WAIT, ApiSource, ResumeProof
from kubeproxy.sources.backoff import Backoff
from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.events import WatchEvent
from tests.sources.test_api_client_go import until
from tests.sources.test_api_reflector import Delays, NoJitter, run, svc, watching
from tests.sources.test_lost_state import requests_since

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(block_timeout=0.1) as server:
        yield server


def resume_checks(api: ApiServer, mark: int) -> list[str]:
    sent = requests_since(api, mark)
    return [r["path"] for r in sent if r.get("resourceVersionMatch") == "NotOlderThan" and r.get("limit") == "1"]


def watches(api: ApiServer, mark: int) -> list[str]:
    return [r["path"] for r in requests_since(api, mark) if r.get("watch")]


class Names:
    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.changed = asyncio.Event()

    def on_event(self, event: WatchEvent) -> None:
        self.seen.add(event.name)
        self.changed.set()

    async def wait_for(self, name: str) -> None:
        while name not in self.seen:
            self.changed.clear()
            await self.changed.wait()


@contextlib.asynccontextmanager
async def source_of(
    api: ApiServer, tmp_path: Path, names: Names, delays: Delays, proof_wait: float = RESUME_PROOF_WAIT
) -> AsyncIterator[ApiSource]:
    client = connect(load_config(api.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False)
    source = ApiSource(client, "node-a", names.on_event, sleep=delays.sleep, backoff_factory=lambda: Backoff(rand=NoJitter()),
                       proof_wait=proof_wait)  # fmt: skip
    task = asyncio.create_task(source.run())
    try:
        await source.wait_synced()
        await watching(api, len(source.reflectors))
        yield source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


def test_watches_cut_together_are_proven_by_one_event_with_no_check(api: ApiServer, tmp_path: Path) -> None:
    names, delays = Names(), Delays()

    async def main() -> None:
        api.apply(svc("a"))
        api.apply(builders.node("node-a", "10.0.0.1", "10.244.0.0/24"))
        async with source_of(api, tmp_path, names, delays) as source:
            mark = len(api.requests)
            api.drop_watches()
            await until(lambda: len(watches(api, mark)) == len(source.reflectors))  # all resumed
            assert not source.connected
            api.apply(svc("b"))
            await names.wait_for("b")
            # The Service event proves the server's revision for the Node, EndpointSlice and
            # ServiceCIDR reflectors too, whose watches saw nothing.
            await until(lambda: source.connected)
            assert resume_checks(api, mark) == []
            assert len(requests_since(api, mark)) == len(source.reflectors)
            assert [r.lists for r in source.reflectors] == [1] * len(source.reflectors)

    run(main())


def test_a_quiet_server_is_asked_once_per_source(api: ApiServer, tmp_path: Path) -> None:
    """No event and no bookmark within the wait: the first reflector's check covers the others."""
    names, delays = Names(), Delays()

    async def main() -> None:
        api.apply(svc("a"))
        api.apply(builders.node("node-a", "10.0.0.1", "10.244.0.0/24"))
        async with source_of(api, tmp_path, names, delays, proof_wait=0.2) as source:
            mark = len(api.requests)
            api.drop_watches()
            await until(lambda: len(watches(api, mark)) == len(source.reflectors))
            await until(lambda: source.connected)
            assert len(resume_checks(api, mark)) == 1, requests_since(api, mark)
            assert [r.lists for r in source.reflectors] == [1] * len(source.reflectors)
            api.apply(svc("b"))  # the watches that were resumed go on
            await names.wait_for("b")

    run(main())


def test_a_fresh_store_is_still_caught_by_every_reflector(api: ApiServer, tmp_path: Path) -> None:
    """The first check fails (Too large resource version): it proves nothing for the others."""
    names, delays = Names(), Delays()

    async def main() -> None:
        api.apply(svc("a"))
        for n in range(30):  # history, so that the fresh store's versions are well below ours
            api.apply(svc("old", port=1000 + n))
        api.apply(builders.node("node-a", "10.0.0.1", "10.244.0.0/24"))
        async with source_of(api, tmp_path, names, delays, proof_wait=0.2) as source:
            for reflector in source.reflectors:  # the source is synced before its optional ServiceCIDRs are listed
                await reflector.wait_listed(1)
            listed = [r.lists for r in source.reflectors]
            api.restart_with_fresh_store()
            assert api.resource_version < min(int(r.resource_version or 0) for r in source.reflectors)
            api.apply(svc("b"))
            await names.wait_for("b")
            for reflector in source.reflectors:
                await reflector.wait_listed(2)
            assert [r.lists for r in source.reflectors] == [n + 1 for n in listed]

    run(main())


def test_a_proof_covers_older_integer_versions_checked_after_the_failure() -> None:
    proof = ResumeProof()
    assert not proof.covers("5", 0.0)
    proof.record("10", at=7.0)
    assert proof.covers("10", failed_at=6.0) and proof.covers("3", failed_at=6.0)
    assert not proof.covers("11", failed_at=6.0)  # newer than the server was shown to be
    assert not proof.covers("3", failed_at=7.5)  # failed after the check: a later restart
    assert not proof.covers("abc", failed_at=6.0)
    proof.record("not-a-number", at=9.0)
    assert (proof.version, proof.at) == (10, 7.0)
