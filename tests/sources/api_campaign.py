"""The hostile-API campaign against the real `kube-proxy` process, shared by the CI test
(tests/sources/test_api_hostile_live.py) and the longer run (bench/fuzz_api.py).

One case: in a fresh network namespace, the test API server (its socket inside the namespace)
serves a few Services; `kube-proxy --master` programs them in the namespace's kernel. Then the
server turns hostile (`Hostility(seed, rate)`: type-confused Statuses and lists, frames that never
end, endless continue tokens, odd error bodies, Retry-After, slow and truncated bodies) while
Services keep being added and watches keep being cut (so that new requests keep meeting it).
Throughout: the process lives and every rule programmed before stays (sampled each round).
Then the server is sane again: the rules must become exactly the Services the server holds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.lab import netns as L
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.apiserver.hostile import Hostility
from kubeproxy.lab.multinode.control import start_in
from tests.live.test_live import _rules, _service

KUBE_PROXY = str(Path(sys.executable).parent / "kube-proxy")
INITIAL = 4
# Converging after the server is sane may wait out one back-off at its cap (30 s, full jitter:
# up to 60 s, as client-go's reflector) and then a wait before a relist.
CONVERGE_SECONDS = 100.0


@dataclass
class Case:
    seed: int
    mode: str
    faults: int = 0
    served: Counter[str] = field(default_factory=Counter)
    added: int = 0
    samples: int = 0
    peak_rss_mib: float = 0.0
    converged_seconds: float = 0.0
    failure: str = ""


def _endpoint(n: int) -> str:
    return f"10.244.{50 + n // 200}.{n % 200 + 1}"


def _targets(ns: L.NetNS, mode: str) -> set[str]:
    """Every address the rules DNAT port 8080 to."""
    pattern = r"(\d+\.\d+\.\d+\.\d+) \. 8080" if mode == "nftables" else r"--to-destination (\d+\.\d+\.\d+\.\d+):8080"
    return set(re.findall(pattern, _rules(ns, mode)))


def _programmed(ns: L.NetNS, mode: str, endpoints: list[str]) -> list[str]:
    targets = _targets(ns, mode)
    return [ep for ep in endpoints if ep in targets]


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f if ":" in line)


def _peak_rss_mib(pid: int) -> float:
    return int(_status(pid)["VmHWM"].split()[0]) / 1024


def _wait(what: str, cond: Callable[[], bool], timeout: float, proc: subprocess.Popen[str]) -> float:
    """Poll `cond()` until it holds (the kernel has no event to await); seconds taken."""
    started = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"kube-proxy exited ({proc.returncode}) waiting for {what}")
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def run_case(seed: int, mode: str, *, faults: int, rate: float = 0.5, log: Path) -> Case:
    """One case; raises AssertionError naming what failed. `faults`: hostile answers to serve."""
    case = Case(seed, mode)
    hostility = Hostility(seed=seed, rate=0.0, slow_seconds=0.5)
    server = ApiServer(hostility=hostility, bookmark_interval=1.0)
    with L.netns("kph") as ns:
        url = start_in(ns, server)
        try:
            endpoints = []
            for n in range(INITIAL):
                endpoints.append(_endpoint(n))
                for obj in _service(f"s{n}", f"10.96.50.{n + 1}", [endpoints[-1]]):
                    server.apply(obj)
            with log.open("w") as stderr:
                argv = [KUBE_PROXY, f"--master={url}", "--hostname-override=node-1", f"--proxy-mode={mode}",
                        "--cluster-cidr=10.244.0.0/16", "--oom-score-adj=0", "--iptables-min-sync-period=0s"]  # fmt: skip
                proc = ns.popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
                try:
                    _campaign(case, ns, server, hostility, proc, endpoints, faults, rate)
                finally:
                    L.stop_process(proc, 10)
            text = log.read_text(errors="replace")
            for sign in ("Traceback", "(a defect)"):
                assert sign not in text, f"seed {seed} {mode}: {sign!r} in kube-proxy's log {log}"
            assert proc.returncode == 0, f"seed {seed} {mode}: kube-proxy exited {proc.returncode} on SIGTERM"
        finally:
            server.stop()
    return case


def _campaign(
    case: Case,
    ns: L.NetNS,
    server: ApiServer,
    hostility: Hostility,
    proc: subprocess.Popen[str],
    endpoints: list[str],
    faults: int,
    rate: float,
) -> None:
    initial = list(endpoints)
    _wait("the first rules", lambda: len(_programmed(ns, case.mode, initial)) == INITIAL, 30, proc)
    hostility.rate = rate
    n = INITIAL
    while sum(hostility.served.values()) < faults:
        assert proc.poll() is None, f"kube-proxy exited ({proc.returncode}) under a hostile server"
        kept = _programmed(ns, case.mode, initial)
        assert kept == initial, f"rules lost under a hostile server: {sorted(set(initial) - set(kept))}"
        case.samples += 1
        endpoints.append(_endpoint(n))
        for obj in _service(f"s{n}", f"10.96.{50 + n // 200}.{n % 200 + 1}", [endpoints[-1]]):
            server.apply(obj)  # the truth keeps changing while the server misbehaves
        n += 1
        if n % 2 == 0:
            server.drop_watches()  # healthy watches would otherwise ask for nothing more
        case.peak_rss_mib = _peak_rss_mib(proc.pid)
        time.sleep(0.2)  # pacing the changes, not a synchronisation
    hostility.rate = 0.0
    case.faults = sum(hostility.served.values())
    case.served = Counter(hostility.served)
    case.added = n - INITIAL
    case.converged_seconds = _wait(
        "the rules of every Service once the server is sane",
        lambda: _programmed(ns, case.mode, endpoints) == endpoints,
        CONVERGE_SECONDS,
        proc,
    )
    # Exactly those: no rule for anything the server never held.
    stray = _targets(ns, case.mode) - set(endpoints)
    assert not stray, f"DNAT rules to addresses the server never held: {sorted(stray)}"
    case.peak_rss_mib = _peak_rss_mib(proc.pid)
