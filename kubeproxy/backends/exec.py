"""Running the kernel tools: the one `Runner` signature every backend takes, and the host's.

Every backend calls its tools through a `run(argv, input=, check=, timeout=)` callable, so the same
code drives the host (`local_run`), a test namespace (`NetNS.run`) or a fake (`FakeNode.run`).
Arguments are a list and input goes on stdin: never a shell.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from kubeproxy.backends.base import SyncError

Runner = Callable[..., subprocess.CompletedProcess[str]]


class CommandError(SyncError):
    """A tool exited non-zero (with `check`) or did not finish within its timeout."""


def local_run(
    argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a tool on this host. A missing binary raises FileNotFoundError (an OSError), as subprocess does."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"{argv[0]} did not finish within {timeout} s") from exc
    if check and proc.returncode != 0:
        raise CommandError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc
