"""The client's rate limit (client-go's token bucket: every request but watches) and User-Agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.runtime.version import KUBERNETES_VERSION
from kubeproxy.sources.connection import USER_AGENT, ConnectionConfigError, connect, load_config
from kubeproxy.sources.throttle import TokenBucket

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """An injected sleep that records instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def test_the_bucket_spends_the_burst_then_one_token_every_1_over_qps() -> None:
    """x/time/rate as client-go uses it: `burst` at once, then requests `1/qps` apart, each
    waiting its turn; idle time refills up to `burst`, not beyond."""
    clock = Clock()
    bucket = TokenBucket(5.0, 10, clock=clock)
    assert [bucket.reserve() for _ in range(10)] == [0.0] * 10
    assert [round(bucket.reserve(), 6) for _ in range(3)] == [0.2, 0.4, 0.6]
    clock.now += 0.6  # the three taken ahead are due now; nothing saved up
    assert round(bucket.reserve(), 6) == 0.2
    clock.now += 60.0
    assert [bucket.reserve() for _ in range(10)] == [0.0] * 10
    assert round(bucket.reserve(), 6) == 0.2
    for qps, burst in ((0.0, 10), (-1.0, 10), (5.0, 0)):
        with pytest.raises(ValueError, match="rate limit needs"):
            TokenBucket(qps, burst)


def test_a_cancelled_wait_gives_its_token_back_unless_later_ones_were_reserved() -> None:
    """x/time's Reservation.CancelAt: the token of a cancelled wait is restored, less the tokens
    reserved after it, so a cancelled request does not delay the ones queued behind it."""
    clock = Clock()

    async def main() -> None:
        asleep = asyncio.Event()

        async def forever(delay: float) -> None:
            asleep.set()
            await asyncio.Event().wait()

        bucket = TokenBucket(5.0, 10, clock=clock, sleep=forever)
        for _ in range(10):
            bucket.reserve()
        waiting = asyncio.create_task(bucket.wait())  # due in 0.2 s
        await asleep.wait()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert round(bucket.reserve(), 6) == 0.2  # its token, given back
        asleep.clear()
        waiting = asyncio.create_task(bucket.wait())  # due in 0.4 s
        await asleep.wait()
        assert round(bucket.reserve(), 6) == 0.6  # reserved after it
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert round(bucket.reserve(), 6) == 0.8  # nothing to give back: 0.6 was reserved later

    asyncio.run(main())


def test_lists_wait_for_tokens_and_watches_do_not(tmp_path: Path) -> None:
    clock = Clock()
    sleeps = Sleeps()

    async def main() -> None:
        with ApiServer() as api:
            client = connect(load_config(api.write_kubeconfig(tmp_path / "kubeconfig")), trust_env=False, qps=0)
            TokenBucket(5.0, 10, clock=clock, sleep=sleeps).attach(client)
            try:
                for _ in range(12):
                    assert (await client.get("/api/v1/services")).status_code == 200
                assert [round(d, 6) for d in sleeps.delays] == [0.2, 0.4]
                params = {"watch": "true", "timeoutSeconds": "1"}
                for _ in range(3):
                    async with client.stream("GET", "/api/v1/services", params=params) as resp:
                        assert resp.status_code == 200
                assert len(sleeps.delays) == 2  # no watch waited
                await client.post("/api/v1/namespaces/default/events", json={})
                assert len(sleeps.delays) == 3  # a write did
            finally:
                await client.aclose()

    asyncio.run(main())


def test_connect_limits_with_kube_proxys_defaults_and_names_the_client(tmp_path: Path) -> None:
    async def main() -> None:
        with ApiServer() as api:
            config = load_config(api.write_kubeconfig(tmp_path / "kubeconfig"))
            client = connect(config, trust_env=False)
            try:
                hooks = client.event_hooks["request"]
                owner = getattr(hooks[0], "__self__", None)
                assert len(hooks) == 1 and isinstance(owner, TokenBucket)
                assert (owner.qps, owner.burst) == (5.0, 10)
                await client.get("/api/v1/services")
            finally:
                await client.aclose()
            assert api.user_agents == {USER_AGENT: 1}
            unlimited = connect(config, trust_env=False, qps=0)
            assert unlimited.event_hooks["request"] == []
            await unlimited.aclose()
            with pytest.raises(ConnectionConfigError, match=r"burst \(0\) >= 1"):
                connect(config, trust_env=False, burst=0)

    asyncio.run(main())
    # Upstream's shape (command/version (os/arch) build): kube-proxy first, then who we are.
    product, platform, ours = USER_AGENT.split(" ")
    assert product == f"kube-proxy/{KUBERNETES_VERSION}"
    assert platform.startswith("(linux/") and ours.startswith("kubeproxy/")
