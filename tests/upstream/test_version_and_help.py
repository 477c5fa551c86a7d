"""What an operator reads from `kube-proxy`: ours against upstream's own binary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from kubeproxy.proxy.flags import HELP_DEFAULTS


def _run(exe: Path | str, *args: str) -> str:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, check=True, timeout=60).stdout


OURS = Path(sys.executable).with_name("kube-proxy")


def test_version_line_and_raw_fields_are_upstreams(upstream_binaries: Path) -> None:
    theirs, ours = _run(upstream_binaries / "kube-proxy", "--version"), _run(OURS, "--version")
    assert ours.split(" (kubeproxy ")[0] == theirs.strip()
    raw_fields = [re.findall(r"(\w+):\"", _run(exe, "--version=raw")) for exe in (upstream_binaries / "kube-proxy", OURS)]
    assert raw_fields[0] == raw_fields[1]


def test_help_defaults_are_upstreams(upstream_binaries: Path) -> None:
    help_text = _run(upstream_binaries / "kube-proxy", "--help")
    theirs = dict(re.findall(r"^\s+--([a-z0-9-]+) .*\(default (.*)\)$", help_text, re.M))
    assert theirs == HELP_DEFAULTS
