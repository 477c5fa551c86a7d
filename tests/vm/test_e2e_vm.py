"""The e2e scenarios with real packets on Debian's 6.1 kernel, booted once under qemu (kubeproxy/lab/vm.py).

One boot runs guest_e2e.sh: pytest inside the guest runs every scenario of tests/e2e/scenarios.py
plus graceful termination (guest_e2e.py) in ipvs mode (the host's kernel has no IPVS), and in
iptables and nftables modes (Debian's kernel is older than the host's: a real user's kernel)
every one but HOST_KERNEL_ENOUGH, and in ipvs mode the hostile addresses of guest_hostile.py;
then the host's own live suite
(tests/e2e/test_live_proxy.py) for the tests guest_e2e.py does not cover. Each writes a JUnit
XML file; here each (mode, scenario) is one test that passes when the guest's did, and otherwise
fails with the guest's message, so a failure names the scenario.

KUBEPROXY_VM_E2E_MODES (default "ipvs,iptables,nftables") and KUBEPROXY_VM_E2E_SELECT (a pytest
-k expression) narrow the batch when working on one scenario; KUBEPROXY_VM_E2E_LIVE=1 adds
test_live_proxy.py's own two tests (a bed each).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeproxy.lab import vm
from tests.e2e import scenarios

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODES = tuple(m for m in os.environ.get("KUBEPROXY_VM_E2E_MODES", "ipvs,iptables,nftables").split(",") if m)
SELECT = os.environ.get("KUBEPROXY_VM_E2E_SELECT", "")
# test_live_proxy.py's own tests (its scenarios run in guest_e2e.py), in the modes it has: each
# builds its own bed and proxy (~2-3 min under TCG), so only with KUBEPROXY_VM_E2E_LIVE=1.
LIVE_TESTS = ("test_a_change_is_synced_and_reported", "test_nodeport_addresses_limit_where_health_check_ports_listen")
LIVE_MODES = tuple(m for m in MODES if m != "ipvs") if os.environ.get("KUBEPROXY_VM_E2E_LIVE") == "1" else ()
SCENARIOS = [f.__name__ for f in scenarios.LIVE] + ["graceful_termination"]
# Not run in iptables and nftables modes here: tests/e2e runs them in those modes on the host's
# kernel, and what they add to the other scenarios is the proxy's own work, not the kernel's: the
# health servers' HTTP answers, and incremental syncs under traffic (their rules are the DNAT of
# cluster_ip_from_a_pod, committed as one nf_tables transaction in both kernels). In those modes
# they take a third of the guest's time (its JUnit times under TCG: 71 s of iptables' 186 s, 41
# of nftables' 118; endpoints_scale_under_traffic alone 51 and 25). ipvs mode runs them all.
HOST_KERNEL_ENOUGH = ("endpoints_scale_under_traffic", "health_check_node_port", "healthz_from_the_client")
CASES = [(m, s) for m in MODES for s in SCENARIOS if m == "ipvs" or s not in HOST_KERNEL_ENOUGH]
# guest_e2e.py's hostile-address scenario runs in the ipvs bed only: tests/e2e has it on the host's kernel for the others.
HOSTILE_MODES = tuple(m for m in MODES if m == "ipvs")
TIMEOUT = 3600.0  # the whole boot; measured: see the report printed by the fixture

# The first test waits for the whole boot: pytest-timeout (300 s in pyproject) must allow it.
pytestmark = [pytest.mark.root, pytest.mark.timeout(TIMEOUT + 120)]


@dataclass(frozen=True)
class Outcome:
    passed: bool
    message: str
    seconds: float = 0.0  # the guest's time for it (its bed's set-up counts in its mode's first)
    skipped: bool = False  # by the guest (a test for some modes only): neither passed nor failed


@dataclass(frozen=True)
class Batch:
    result: vm.VMResult
    outcomes: dict[str, Outcome]  # "mode-scenario" (guest_e2e.py) or "mode-test" (test_live_proxy.py)

    def outcome(self, key: str) -> Outcome:
        if key not in self.outcomes:
            pytest.fail(f"the guest reported nothing for {key}; its output:\n{self.result.output[-3000:]}\n"
                        f"{self.result.files.get('e2e.out', '')[-3000:]}")
        return self.outcomes[key]


def parse_junit(text: str) -> dict[str, Outcome]:
    """{"mode-scenario": outcome} from pytest's JUnit XML; the test ids are `name[mode-scenario]`."""
    out: dict[str, Outcome] = {}
    if not text.strip():
        return out
    for case in ET.fromstring(text).iter("testcase"):
        name = case.get("name", "")
        if "[" not in name:
            continue
        params = name[name.index("[") + 1 : name.rindex("]")]
        # guest_e2e.py's are name[mode-scenario]; test_live_proxy.py's own tests name[mode]
        key = params if name.startswith("test_scenario") else f"{params}-{name[: name.index('[')]}"
        problems = [e for e in case if e.tag in ("failure", "error", "skipped")]
        message = "\n".join(f"{e.tag}: {e.get('message', '')}\n{e.text or ''}" for e in problems)
        skipped = bool(problems) and all(e.tag == "skipped" for e in problems)
        out[key] = Outcome(not problems, message, float(case.get("time", "0") or 0), skipped)
    return out


@pytest.fixture(scope="module")
def batch() -> Batch:
    image = vm.build()
    live_select = " or ".join(LIVE_TESTS) if LIVE_MODES and not SELECT else ""
    if live_select:
        live_select = f"({live_select}) and ({' or '.join(LIVE_MODES)})"
    left_out = " or ".join(f"{m}-{s}" for m in MODES for s in SCENARIOS if (m, s) not in CASES)
    select = SELECT or (f"not ({left_out})" if left_out else "")
    files = {"repo_path": str(REPO), "modes": ",".join(MODES), "select": select, "live_select": live_select}
    result = vm.VM(image).run((HERE / "guest_e2e.sh").read_text(), files=files, timeout=TIMEOUT)
    print(f"vm e2e batch: boot {result.boot_seconds:.1f} s, total {result.total_seconds:.1f} s; {result.output.strip()}")
    for name in ("e2e.out", "live.out"):
        print(result.files.get(name, "")[-2500:])
    outcomes = parse_junit(result.files.get("e2e.xml", "")) | parse_junit(result.files.get("live.xml", ""))
    for mode in MODES:
        mine = {k: o for k, o in outcomes.items() if k.startswith(f"{mode}-") and not o.skipped}
        passed, seconds = sum(o.passed for o in mine.values()), sum(o.seconds for o in mine.values())
        print(f"{mode}: {passed}/{len(mine)} passed in {seconds:.0f} s: "
              + ", ".join(f"{k.removeprefix(mode + '-')} {o.seconds:.0f}" for k, o in mine.items()))
    return Batch(result, outcomes)


@pytest.mark.parametrize(("mode", "scenario"), CASES)
def test_scenario_in_the_vm(batch: Batch, mode: str, scenario: str) -> None:
    if SELECT and f"{mode}-{scenario}" not in batch.outcomes:
        pytest.skip(f"not selected by KUBEPROXY_VM_E2E_SELECT={SELECT!r}")
    got = batch.outcome(f"{mode}-{scenario}")
    assert got.passed, f"{scenario} in {mode} mode, in the VM:\n{got.message}\n" + _proxy_log(batch, mode)


@pytest.mark.parametrize("mode", HOSTILE_MODES)
def test_hostile_addresses_in_the_vm(batch: Batch, mode: str) -> None:
    """guest_hostile.py: the refused and injected addresses reach none of ipvsadm, ipset, kube-ipvs0, iptables."""
    if SELECT and f"{mode}-test_hostile_addresses" not in batch.outcomes:
        pytest.skip(f"not selected by KUBEPROXY_VM_E2E_SELECT={SELECT!r}")
    got = batch.outcome(f"{mode}-test_hostile_addresses")
    assert got.passed, f"hostile addresses in {mode} mode, in the VM:\n{got.message}\n" + _proxy_log(batch, mode)


if LIVE_MODES:  # defined only when asked for, so that CI shows no skipped kernel test

    @pytest.mark.parametrize("mode", LIVE_MODES)
    @pytest.mark.parametrize("test", LIVE_TESTS)
    def test_live_suite_in_the_vm(batch: Batch, mode: str, test: str) -> None:
        if SELECT:
            pytest.skip(f"KUBEPROXY_VM_E2E_SELECT={SELECT!r} runs guest_e2e.py's scenarios only")
        got = batch.outcome(f"{mode}-{test}")
        assert got.passed, f"tests/e2e/test_live_proxy.py::{test}[{mode}] in the VM:\n{got.message}"


def _proxy_log(batch: Batch, mode: str) -> str:
    log = batch.result.files.get(f"proxy-{mode}.log", "")
    return "proxy log (tail):\n" + "\n".join(log.splitlines()[-40:]) if log else ""
