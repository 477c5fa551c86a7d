"""`kubeproxy run` and `kube-proxy` load neither the lab, the doctor nor matplotlib (issue 13)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import kubeproxy.cli, kubeproxy.live, kubeproxy.proxy.server
heavy = sorted(m for m in sys.modules if m.startswith(("kubeproxy.lab", "kubeproxy.doctor", "matplotlib")))
print(",".join(heavy))
"""


def test_the_proxy_imports_no_lab_doctor_or_matplotlib() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_lazy_commands_still_load_on_demand() -> None:
    from click.testing import CliRunner

    from kubeproxy.cli import main

    result = CliRunner().invoke(main, ["dns", "check", "--help"])
    assert result.exit_code == 0 and "fresh source port" in result.output
    result = CliRunner().invoke(main, ["doctor", "--help"])
    assert result.exit_code == 0
