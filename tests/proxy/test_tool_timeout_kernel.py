"""A real iptables-restore that runs out of time, in a namespace: the rules stay, the retry converges.

The live proxy programs a namespace with iptables-legacy and iptables-nft. For one sync's
restore the test starts the real tool with a bound of BOUND seconds and holds its input back
until the tool is gone: it waits for input, as a slow restore keeps working, until this host's
deadline kills it (kernel/exec.py). Nothing is faked past that point: the proxy sees a real
killed tool. The kernel then still has the first sync's rules, no Service is quarantined and no
`--test` is run, and the retry, with twice its usual bound, programs the change.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from kubeproxy.backends.iptables.apply import restore_timeout
from kubeproxy.kernel.host import Intercepted
from kubeproxy.lab.netns import NetNS
from kubeproxy.proxy.live_loop import LiveProxy
from tests.live.served import Source, serving
from tests.live.test_live import _service
from tests.live.test_live_fake import CFG
from tests.proxy.test_tool_timeout import Done, Proceed

pytestmark = pytest.mark.root

BOUND = 0.2  # seconds the stalled restore is given: it cannot finish, whatever the bound


@dataclass
class Stall:
    """The intercept: the first restore after `arm()` is stalled; each restore's bound is kept,
    and the ruleset as the next restore found it."""

    ns: NetNS
    variant: str
    armed: bool = False
    restores: list[tuple[float | None, str]] = field(default_factory=list)  # (bound, input)
    found: list[str] = field(default_factory=list)  # the ruleset before each restore
    argvs: list[list[str]] = field(default_factory=list)

    def __call__(
        self, proceed: Proceed, argv: Sequence[str], *, input: str | Iterable[str] | None = None, check: bool = True,
        timeout: float | None = None,
    ) -> Done:  # fmt: skip
        self.argvs.append(list(argv))
        if not (argv[0].endswith("-restore") and "--test" not in argv):
            return proceed(argv, input=input, check=check, timeout=timeout)
        text = input if input is None or isinstance(input, str) else "".join(input)
        self.found.append(ruleset(self.ns, self.variant))
        if not self.armed:
            self.restores.append((timeout, text or ""))
            return proceed(argv, input=text, check=check, timeout=timeout)
        self.armed = False
        self.restores.append((BOUND, text or ""))
        return self.ns.run_chunks(argv, _held_until_killed(text or ""), check=check, timeout=BOUND)


def _held_until_killed(text: str) -> Iterator[str]:
    """`text`, once the tool it is written to has exited: pulled by this host's writer right
    after it started the tool, in the thread that started it, whose only child the tool is."""
    children = Path(f"/proc/self/task/{threading.get_native_id()}/children").read_text().split()
    assert len(children) == 1, children
    os.waitid(os.P_PID, int(children[0]), os.WEXITED | os.WNOWAIT)  # until its deadline kills it; left to reap
    yield text


def ruleset(ns: NetNS, variant: str) -> str:
    """nat and filter as iptables-save prints them, without counters and comment lines."""
    out = ns.run([f"iptables-{variant}-save"]).stdout
    return "\n".join(re.sub(r"\[\d+:\d+\]", "", line) for line in out.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_restore_killed_at_its_bound_leaves_the_rules_and_the_retry_converges(
    netns: NetNS, tmp_path: Path, variant: str
) -> None:
    stall = Stall(netns, variant)

    async def main() -> None:
        proxy = LiveProxy(replace(CFG, mode="iptables"), "node-1", run_cmd=Intercepted(netns, stall),
                          iptables_variant=variant, proc_ipv6=tmp_path / "no-ipv6")  # fmt: skip
        source = Source(proxy, _service("web", "10.96.0.10", ["10.244.1.10"]))
        async with serving(proxy, source, 60):
            await asyncio.wait_for(_body(proxy, source), 60)

    async def _body(proxy: LiveProxy, source: Source) -> None:
        assert proxy.syncs == 1 and "10.244.1.10:8080" in ruleset(netns, variant)
        first = ruleset(netns, variant)
        done = len(stall.restores)
        stall.armed = True
        source.publish(*_service("web", "10.96.0.10", ["10.244.1.20"]), *_service("db", "10.96.0.11", ["10.244.1.11"]))
        while "10.244.1.20:8080" not in ruleset(netns, variant):
            await proxy.wait_for_syncs(proxy.syncs + proxy.failed_syncs + 1)
        (stalled_bound, _), (retry_bound, retry_text) = stall.restores[done : done + 2]
        assert stalled_bound == BOUND and proxy.failed_syncs == 1
        assert stall.found[done + 1] == first  # the killed restore left the rules as they were
        assert retry_bound == pytest.approx(2 * restore_timeout(retry_text))  # the retry: twice its usual bound
        assert len(stall.restores) == done + 2  # it converged
        assert "10.244.1.11:8080" in ruleset(netns, variant) and "10.244.1.10:8080" not in ruleset(netns, variant)
        lane = proxy.lanes[0]
        assert len(lane.quarantine) == 0 and lane.patience.doublings == 0
        assert not any("--test" in argv for argv in stall.argvs)  # never a bisection
        failures = proxy.metrics.registry.get_sample_value(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", {"ip_family": "IPv4"}
        )
        assert failures == 1

    asyncio.run(main())
