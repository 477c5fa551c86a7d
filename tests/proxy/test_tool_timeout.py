"""A kernel tool that runs out of time is no refusal: on fakes, with a tool that "takes" longer
than its bound on a fake clock (kernel/fake_tool.py's SlowTool), no real wait.

The quarantine holds no Service for it and runs no check; the live loop counts and logs it once,
keeps the rules the kernel had, and retries with the family's bound doubled until the tool
finishes, then goes back to the usual bound. The same in a real kernel: test_tool_timeout_kernel.py.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.iptables.apply import RESTORE_TIMEOUT_BASE, RESTORE_TIMEOUT_PER_LINE
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.backends.nftables.apply import TIMEOUT_PER_LINE as NFT_TIMEOUT_PER_LINE
from kubeproxy.backends.nftables.apply import NftApplier
from kubeproxy.kernel.exec import PATIENCE_CAP, Patience, PatientHost
from kubeproxy.kernel.fake_tool import SlowTool
from kubeproxy.kernel.host import Capability, Feed, Intercepted
from kubeproxy.model.changes import ChangeTracker
from kubeproxy.model.contract import ToolTimeout
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.proxy.quarantine import Quarantine
from tests.backends.nftables.helpers import options, view
from tests.live.served import Body, Source, serve_with
from tests.live.test_live import _service
from tests.live.test_live_fake import CFG, _programmed

Done = subprocess.CompletedProcess[str]
Proceed = Callable[..., Done]  # what an intercept (host.Intercepted) calls to run the command
NFT_BASE = NftApplier.timeout  # the applier's usual bound before its allowance per line


def _commits(argv: Sequence[str]) -> bool:
    """A command that programs rules (not a `--test` / `-c` check, nor a listing)."""
    return ("-restore" in argv[0] and "--test" not in argv) or (argv[0] == "nft" and "-f" in argv and "-c" not in argv)


def _checks(argv: Sequence[str]) -> bool:
    return ("-restore" in argv[0] and "--test" in argv) or (argv[0] == "nft" and "-c" in argv)


def _usual(mode: str, lines: int | None) -> float:
    assert lines is not None
    if mode == "nftables":
        return float(NFT_BASE) + NFT_TIMEOUT_PER_LINE * lines
    return RESTORE_TIMEOUT_BASE + RESTORE_TIMEOUT_PER_LINE * lines


@pytest.fixture(params=["iptables", "nftables"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- Patience and the host that applies it


def test_patience_doubles_to_a_cap_and_resets() -> None:
    p = Patience()
    assert p.bound(60.0) == 60.0
    p.ran_out()
    p.ran_out()
    assert p.bound(60.0) == 240.0
    for _ in range(100):
        p.ran_out()
    assert p.bound(60.0) == PATIENCE_CAP == 3600.0  # a hung tool is still ended
    assert p.bound(5000.0) == 5000.0  # a usual bound above the cap is never shortened
    p.reset()
    assert p.bound(60.0) == 60.0


def test_a_patient_host_lengthens_bounded_tools_only() -> None:
    seen: list[tuple[str, float | None]] = []

    class Recorder:
        capabilities = frozenset({Capability.SPAWN})
        netns_path = "/run/netns/x"

        def run(self, argv: Sequence[str], *, input: str | None = None, check: bool = True,
                timeout: float | None = 7.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
            seen.append((argv[0], timeout))
            return subprocess.CompletedProcess(list(argv), 0, "", "")

        __call__ = run

        def run_chunks(self, argv: Sequence[str], chunks: Any, *, check: bool = True,
                       timeout: float | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
            return self.run(argv, input="".join(chunks), check=check, timeout=timeout)

        def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
            seen.append((argv[0], timeout))
            raise NotImplementedError

    patience = Patience(doublings=1)
    host = PatientHost(Recorder(), patience)
    host.run(["a"], timeout=10.0)
    host.run(["b"])  # no bound given: the host's own default stays
    host.run_chunks(["c"], ["x\n"], timeout=3.0)
    with pytest.raises(NotImplementedError):
        host.spawn(["d"], 4.0)
    assert seen == [("a", 20.0), ("b", 7.0), ("c", 6.0), ("d", 8.0)]
    assert host.capabilities == frozenset({Capability.SPAWN}) and host.netns_path == "/run/netns/x"


# -- the quarantine


def _cluster(ip: str) -> list[dict[str, Any]]:
    return [*_service("web", "10.96.0.10", [ip]), *_service("db", "10.96.0.11", ["10.244.1.11"])]


def test_a_timeout_holds_no_service_and_runs_no_check() -> None:
    node = FakeNode()
    slow = SlowTool(_commits)
    backend = IptablesProxier(run=Intercepted(node, slow))
    quarantine = Quarantine()
    opts = options()
    tracker = ChangeTracker("node-1")
    first = view(_cluster("10.244.1.10"))
    quarantine.program(backend, first, opts, tracker.take(first))
    before = _programmed(node, "iptables")

    slow.seconds = 10_000.0  # far beyond the usual bound
    second = view(_cluster("10.244.1.99"))
    node.iptables.calls.clear()
    with pytest.raises(ToolTimeout) as caught:
        quarantine.program(backend, second, opts, tracker.take(second))
    assert caught.value.tool == "iptables-restore" and caught.value.lines == slow.bounds[-1][1]
    assert len(quarantine) == 0 and quarantine.take_refusals() == []
    assert not any(_checks(argv) for argv in node.iptables.calls)  # no bisection, no --test
    assert _programmed(node, "iptables") == before  # the killed restore committed nothing
    assert quarantine.last_good is first


def test_a_check_that_runs_out_of_time_ends_the_bisection() -> None:
    """A refused sync is bisected; a check that then runs out of time stops it: no Service is
    held on a slow tool's account, and the refusal is still counted as a failed restore."""
    node = FakeNode()
    slow = SlowTool(_checks, seconds=10_000.0)

    def refusing(proceed: Proceed, argv: Sequence[str], **kw: Any) -> Done:
        if _commits(argv):
            return subprocess.CompletedProcess(list(argv), 1, "", "iptables-restore: line 3 failed (injected)")
        return slow(proceed, argv, **kw)

    backend = IptablesProxier(run=Intercepted(node, refusing))
    quarantine = Quarantine()
    v = view(_cluster("10.244.1.10"))
    with pytest.raises(ToolTimeout):
        quarantine.program(backend, v, options(), ChangeTracker("node-1").take(v))
    assert len(slow.bounds) == 1  # the first check ran out of time: no second one
    assert len(quarantine) == 0
    assert [str(e) for e in quarantine.take_refusals()] == ["iptables-restore failed: iptables-restore: line 3 failed (injected)"]


# -- the live loop


def _run(mode: str, run_cmd: Intercepted, initial: list[dict[str, Any]], body: Body) -> None:
    serve_with(lambda: LiveProxy(replace(CFG, mode=mode), "node-1", run_cmd=run_cmd), initial, body)


def _failures(proxy: LiveProxy, mode: str) -> float | None:
    name = "nftables_sync_failures_total" if mode == "nftables" else "iptables_restore_failures_total"
    return proxy.metrics.registry.get_sample_value(f"kubeproxy_sync_proxy_rules_{name}", {"ip_family": "IPv4"})


NEW = "10.244.1.99"  # the endpoint of the change whose transactions the slow tool takes long over


def _slow_with_the_change(slow: SlowTool) -> Callable[..., Done]:
    """`slow` for the transactions that carry the change (not a stale-chain deletion, say)."""

    def intercept(proceed: Proceed, argv: Sequence[str], **kw: Any) -> Done:
        text = kw.get("input")
        if text is not None and not isinstance(text, str):
            kw["input"] = text = "".join(text)
        return slow(proceed, argv, **kw) if text and NEW in text else proceed(argv, **kw)

    return intercept


def test_the_live_loop_retries_with_a_doubled_bound_until_the_tool_finishes(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    node = FakeNode()
    # It takes long enough that the usual bound (60 s, 300 s for nft, plus 1 ms a line) runs
    # out twice or more, and less than the cap, which a doubled bound reaches.
    slow = SlowTool(_commits, seconds=1_000.0)

    async def body(proxy: LiveProxy, source: Source) -> None:
        lane = proxy.lanes[0]
        before, calls = _programmed(node, mode), len(_calls(node, mode))
        caplog.clear()
        source.publish(*_service("web", "10.96.0.10", [NEW]))
        while NEW not in _programmed(node, mode):
            await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)
            if NEW not in _programmed(node, mode):
                assert _programmed(node, mode) == before  # a killed tool changed nothing
        tried = slow.bounds
        ratios = [bound / _usual(mode, lines) for bound, lines in tried if bound is not None]
        assert len(ratios) == len(tried) >= 3
        assert ratios == pytest.approx([2.0**k for k in range(len(tried))])  # each attempt twice the last's
        assert all(bound < slow.seconds for bound, _ in tried[:-1] if bound) and (tried[-1][0] or 0) >= slow.seconds
        assert slow.elapsed == pytest.approx(sum(b for b, _ in tried[:-1] if b) + slow.seconds)  # fake time only
        timeouts = len(tried) - 1
        assert proxy.failed_syncs == timeouts and _failures(proxy, mode) == timeouts
        assert len(lane.quarantine) == 0 and not any(_checks(argv) for argv in _calls(node, mode)[calls:])
        assert lane.patience.doublings == 0  # the sync that finished reset it
        said = [r for r in caplog.records if "did not finish within" in r.getMessage()]
        assert len(said) == timeouts and all(r.levelno == logging.ERROR for r in said)  # once per timeout
        tool = "nft" if mode == "nftables" else "iptables-restore"
        assert f"{tool} did not finish within {tried[0][0]:g} s ({tried[0][1]} lines of input)" in said[0].getMessage()
        assert not any("looking for the services" in r.getMessage() for r in caplog.records)

    _run(mode, Intercepted(node, _slow_with_the_change(slow)), _cluster("10.244.1.10"), body)


def _calls(node: FakeNode, mode: str) -> list[list[str]]:
    return node.nft.calls if mode == "nftables" else node.iptables.calls


def test_a_refusal_is_still_narrowed_down_after_a_timeout(mode: str) -> None:
    """A timeout changes nothing for the next refusal: it is bisected, and the Service held."""
    node = FakeNode()
    slow = SlowTool(_commits, seconds=10_000.0)
    slow_change = _slow_with_the_change(slow)
    refused = "10.244.66.66"

    def intercept(proceed: Proceed, argv: Sequence[str], **kw: Any) -> Done:
        text = kw.get("input")
        if text is not None and not isinstance(text, str):  # a full sync's pieces
            kw["input"] = text = "".join(text)
        if text and refused in text and (_commits(argv) or _checks(argv)):
            return subprocess.CompletedProcess(list(argv), 1, "", "refused (injected)")
        return slow_change(proceed, argv, **kw)

    async def body(proxy: LiveProxy, source: Source) -> None:
        source.publish(*_service("web", "10.96.0.10", [NEW]))
        await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)
        assert proxy.failed_syncs >= 1 and len(proxy.lanes[0].quarantine) == 0
        slow.seconds = 0.0
        source.publish(*_service("moody", "10.96.0.12", [refused]))
        while NEW not in _programmed(node, mode) or not len(proxy.lanes[0].quarantine):
            await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)
        assert proxy.lanes[0].quarantine.names() == ["default/moody"]
        assert refused not in _programmed(node, mode)

    _run(mode, Intercepted(node, intercept), _cluster("10.244.1.10"), body)
