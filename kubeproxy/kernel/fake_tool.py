"""What the fake kernel tools (backends/*/fake.py) share: answering a command as a `Runner` does.

A fake records the command, then answers with its output (exit 0) or refuses it (exit 1, the
refusal on stderr as that tool words it); with `check`, a refusal raises as `local_run` raises.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kubeproxy.kernel.exec import CommandError
from kubeproxy.model.contract import ToolTimeout


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


@dataclass
class SlowTool:
    """An intercept (kernel/host.py's `Intercepted`) under which the commands `matches` selects
    "take" `seconds` on a fake clock (`elapsed`), with no real wait: one given a shorter bound
    is killed at its bound as this host kills a real one (ToolTimeout, and the command never
    reaches the fake: nothing of it is committed); any other runs after its time has passed.
    `bounds` records (bound, lines of input) of each selected command."""

    matches: Callable[[Sequence[str]], bool]
    seconds: float = 0.0
    elapsed: float = 0.0
    bounds: list[tuple[float | None, int | None]] = field(default_factory=list)

    def __call__(
        self,
        proceed: Callable[..., subprocess.CompletedProcess[str]],
        argv: Sequence[str],
        *,
        input: str | Iterable[str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        if not self.matches(argv):
            return proceed(argv, input=input, check=check, timeout=timeout)
        if input is not None and not isinstance(input, str):
            input = "".join(input)
        lines = None if input is None else input.count("\n")
        self.bounds.append((timeout, lines))
        if timeout is not None and timeout < self.seconds:
            self.elapsed += timeout
            raise ToolTimeout(argv[0], timeout, lines)
        self.elapsed += self.seconds
        return proceed(argv, input=input, check=check, timeout=timeout)
