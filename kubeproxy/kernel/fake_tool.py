"""What the fake kernel tools (backends/*/fake.py) share: answering a command as a `Runner` does.

A fake records the command, then answers with its output (exit 0) or refuses it (exit 1, the
refusal on stderr as that tool words it); with `check`, a refusal raises as `local_run` raises.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from kubeproxy.kernel.exec import CommandError


class Refused(Exception):
    """The fake's tool refuses the command, as the real one would (it exits 1)."""


def answer(
    calls: list[list[str]],
    argv: Sequence[str],
    reply: Callable[[list[str]], str],
    *,
    check: bool,
    stderr_prefix: str = "",
) -> subprocess.CompletedProcess[str]:
    """Record `argv` in `calls` and run `reply` on it: its text is the output, a `Refused` it
    raises goes to stderr after `stderr_prefix`."""
    args = list(argv)
    calls.append(args)
    try:
        proc = subprocess.CompletedProcess(args, 0, reply(args), "")
    except Refused as exc:
        proc = subprocess.CompletedProcess(args, 1, "", f"{stderr_prefix}{exc}")
    if check and proc.returncode != 0:  # as local_run
        raise CommandError(f"{args[0]} exited {proc.returncode}: {proc.stderr}")
    return proc
