"""Upstream's kube-proxy (node-a) and ours (node-b) in IPVS mode against upstream's control plane,
on Debian's kernel booted once under qemu (kubeproxy/lab/vm.py): the host's kernel has no IPVS.

One boot (one control-plane start, both proxies started once) runs guest_side_by_side_ipvs.sh:
the e2e walk every mode shares, the hostile-but-valid objects, every Service deleted, and with
KUBEPROXY_VM_RANDOM=1 a seeded random cluster with churn (guest_side_by_side_ipvs.py), comparing
after each checked step the two nodes' `ipvsadm-save -n`, `ipset save`, kube-ipvs0 addresses and
iptables rules of both families, each node's own addresses named by role (lab/ipvs_compare.py).
Each step is one test here, failing with the differences the guest found after it.
KUBEPROXY_VM_EVERY_STEP=1 checks each of the walk's steps (by default the walk is checked at the
steps whose paths are IPVS's own: TCG makes a step cost tens of seconds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.lab import vm
from kubeproxy.lab.control_plane import UPSTREAM_VERSION, upstream_bin
from kubeproxy.lab.netns import have_root
from tests.vm.guest_side_by_side_ipvs import (
    AFTER_WALK,
    FIRST_STEP_TIMEOUT,
    HEAVY_STEP_TIMEOUT,
    PROBE_TIMEOUT,
    STARTUP_TIMEOUT,
    STEP_TIMEOUT,
    steps,
)

HERE = Path(__file__).parent
REPO = HERE.parents[1]
EVERY_STEP = os.environ.get("KUBEPROXY_VM_EVERY_STEP") == "1"
RANDOM_CLUSTER = os.environ.get("KUBEPROXY_VM_RANDOM") == "1"
STEPS = steps(EVERY_STEP, RANDOM_CLUSTER)
# The pods on the proxy nodes, each with a probe server to start: 4 in the walk, 12 more in the random cluster.
WIRED_PODS = 16 if RANDOM_CLUSTER else 4
# The whole boot: the control plane's start, the pods' probes, every step at its worst (each waiting all of its time).
TIMEOUT = (STARTUP_TIMEOUT + WIRED_PODS * PROBE_TIMEOUT + FIRST_STEP_TIMEOUT + HEAVY_STEP_TIMEOUT * len(AFTER_WALK)
           + STEP_TIMEOUT * (len(STEPS) - 1 - len(AFTER_WALK)) + 300)  # fmt: skip

pytestmark = [pytest.mark.root, pytest.mark.timeout(TIMEOUT + 120)]


@pytest.fixture(scope="module")
def walk() -> dict[str, Any]:
    if not have_root():
        pytest.skip("needs root: the VM's guest runs as root")
    bin_dir = upstream_bin()
    if bin_dir is None:
        message = f"upstream's {UPSTREAM_VERSION} binaries are not built: run scripts/upstream {UPSTREAM_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    words = [word for word, on in (("every", EVERY_STEP), ("random", RANDOM_CLUSTER)) if on]
    files = {"repo_path": str(REPO), "upstream_bin": str(bin_dir), "every": " ".join(words)}
    result = vm.VM(vm.build(), memory_mb=3072).run((HERE / "guest_side_by_side_ipvs.sh").read_text(), files=files,
                                                   timeout=TIMEOUT)  # fmt: skip
    print(f"vm: boot {result.boot_seconds:.1f} s, total {result.total_seconds:.1f} s; {result.output.strip()}")
    print(result.files.get("guest.out", "")[-3000:])
    text = result.files.get("side_by_side_ipvs.json", "")
    if not text:
        pytest.fail(f"the guest wrote no report; its output:\n{result.files.get('guest.out', result.output)[-3000:]}")
    report: dict[str, Any] = json.loads(text)
    print(f"control plane {report.get('control_plane_seconds')} s, with the bed {report.get('startup_seconds')} s; steps: "
          + ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in report["steps"]))  # fmt: skip
    for s in report["steps"]:
        if s["what"]:
            print(f"{s['step']}: {s['what'][:300]}")
    return report


@pytest.mark.parametrize("step", STEPS)
def test_ipvs_state_equal_to_upstream_after(walk: dict[str, Any], step: str) -> None:
    found = {s["step"]: s["differences"] for s in walk["steps"]}
    if step not in found:
        pytest.fail(f"the guest did not reach {step!r}: {walk.get('error') or 'no error reported'}")
    diffs: list[str] = found[step]
    what = next(s["what"] for s in walk["steps"] if s["step"] == step)
    assert not diffs, f"after {step} ({what[:500]}):\n" + "\n".join(diffs)


def test_the_walk_ends_without_error(walk: dict[str, Any]) -> None:
    assert walk["error"] is None, walk["error"]
    assert [s["step"] for s in walk["steps"]] == list(STEPS)
