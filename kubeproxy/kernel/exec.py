"""Running the kernel tools: the one `Runner` signature every backend takes, and this host's.

Every backend calls its tools through a `run(argv, input=, check=, timeout=)` callable, so the same
code drives this host (`LOCAL`, also called `local_run`), a test namespace (the lab's `NetNS`) or
a fake (`FakeNode`): each is a `Host` (host.py). Arguments are a list and input goes on stdin:
never a shell.

This host writes `run_chunks`'s input to the tool as it comes: a full iptables sync at 10k
services is 32 MiB of text, which would otherwise be joined into one string and then encoded
into one more copy, all alive at the proxy's peak.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kubeproxy.kernel.host import Capability, Feed, Host
from kubeproxy.model.contract import SyncError, ToolTimeout

Runner = Callable[..., subprocess.CompletedProcess[str]]

# Chunks are written in batches of about this many characters: one write per small chunk would
# cost a system call each (20k of them for a full sync at 10k services).
BATCH = 256 * 1024


class CommandError(SyncError):
    """A tool exited non-zero (with `check`). One that did not finish within its timeout
    raises `ToolTimeout` (model/contract.py), with or without `check`."""


@dataclass(frozen=True)
class LocalHost:
    """This process's host and network namespace."""

    capabilities: frozenset[Capability] = frozenset({Capability.CHUNKS, Capability.SPAWN, Capability.ENTER})
    netns_path: str | None = None

    def run(
        self, argv: Sequence[str], *, input: str | Iterable[str] | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool. A missing binary raises FileNotFoundError (an OSError), as subprocess does.

        `input` a string, or an iterable of strings written one batch at a time (`run_chunks`).
        """
        try:
            if input is None or isinstance(input, str):
                proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False, timeout=timeout)
            else:
                proc = _run_streamed(list(argv), input, timeout)
        except subprocess.TimeoutExpired as exc:
            lines = input.count("\n") if isinstance(input, str) else None  # streamed: the caller knows
            raise ToolTimeout(argv[0], timeout or 0.0, lines) from exc
        if check and proc.returncode != 0:
            raise CommandError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run(argv, input=chunks, check=check, timeout=timeout)

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        return FedProcess.start([*death_guard(), *argv], timeout, pipe_bytes=pipe_bytes)


LOCAL = LocalHost()
local_run = LOCAL  # the name every backend's default runner goes by


@contextlib.contextmanager
def bounded(tool: str, lines: int | None) -> Iterator[None]:
    """A run inside that ran out of time raises `ToolTimeout` naming `tool` and its `lines` of
    input, whichever host ran it: this one raises ToolTimeout with the bound it was given, a
    lab namespace (`NetNS.run`) subprocess's TimeoutExpired."""
    try:
        yield
    except ToolTimeout as exc:
        raise ToolTimeout(tool, exc.bound, lines) from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolTimeout(tool, exc.timeout, lines) from exc


# A tool that keeps running out of time gets twice its bound on each attempt, up to an hour: a
# restore of 300k lines by iptables-nft took longer than its usual 490 s, while a truly hung tool
# must still be ended. A usual bound already above the cap (millions of lines) is left as it is.
PATIENCE_CAP = 3600.0
_MAX_DOUBLINGS = 32  # any bound of a millisecond or more reaches the cap well before


@dataclass
class Patience:
    """How long one IP family's kernel tools may run: each tool's usual bound for its input,
    doubled for every sync in a row that ran out of time (`ran_out`), to at most `cap`; back
    to the usual bound after a sync that finished (`reset`)."""

    cap: float = PATIENCE_CAP
    doublings: int = 0

    def bound(self, usual: float) -> float:
        if usual >= self.cap:
            return usual
        return min(math.ldexp(usual, self.doublings), self.cap)  # usual x 2^doublings

    def ran_out(self) -> None:
        self.doublings = min(self.doublings + 1, _MAX_DOUBLINGS)

    def reset(self) -> None:
        self.doublings = 0


@dataclass(frozen=True)
class PatientHost:
    """`host` with every bounded tool given `patience.bound(its usual bound)`; a tool run
    without a bound stays without one (and a host's own default bound stays its own). The
    modes compute their usual bounds and never see the patience: a family's lane wraps its
    host in one (proxy/family_lanes.py)."""

    host: Host
    patience: Patience

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.host.capabilities

    @property
    def netns_path(self) -> str | None:
        return self.host.netns_path

    def _bound(self, timeout: float | None) -> dict[str, float]:
        return {} if timeout is None else {"timeout": self.patience.bound(timeout)}

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.host.run(argv, input=input, check=check, **self._bound(timeout))

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.host.run_chunks(argv, chunks, check=check, **self._bound(timeout))

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        return self.host.spawn(argv, None if timeout is None else self.patience.bound(timeout), pipe_bytes=pipe_bytes)


@functools.cache  # whether setpriv is installed: looked up once, not for each spawned tool
def death_guard() -> tuple[str, ...]:
    """A prefix that has the kernel kill the tool if this process dies (`setpriv --pdeathsig`):
    a tool fed through a pipe would otherwise take the closed pipe for the end of its input and
    commit a partial one. Empty where setpriv is not installed."""
    return ("setpriv", "--pdeathsig", "KILL") if shutil.which("setpriv") else ()


def batches(chunks: Iterable[str], size: int = BATCH) -> Iterator[str]:
    """`chunks` joined into strings of about `size` characters or more (a larger chunk alone)."""
    pending: list[str] = []
    length = 0
    for chunk in chunks:
        pending.append(chunk)
        length += len(chunk)
        if length >= size:
            yield "".join(pending)
            pending, length = [], 0
    if pending:
        yield "".join(pending)


def _run_streamed(argv: list[str], chunks: Iterable[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, input="".join(chunks), capture_output=True, text=True)` without the join.

    If producing the chunks raises, the tool is killed before its input is closed: a tool that
    commits what it read at the end of its input (iptables-restore) must not take a truncated
    input for a whole one.
    """
    fed = FedProcess.start(argv, timeout, keep_stdout=True)
    try:
        for batch in batches(chunks):
            if not fed.write(batch):
                break  # it stopped reading: its exit status says why
        fed.close()
        rc, out, err = fed.wait()
    except BaseException:
        fed.abort()
        raise
    if fed.timed_out:
        raise subprocess.TimeoutExpired(argv, timeout or 0.0)
    return subprocess.CompletedProcess(argv, rc, out, err)


@dataclass
class FedProcess:
    """A tool whose input we write as we go, its output in files; killed at its deadline.

    Output goes to files, not pipes, so that a tool writing a lot while we are blocked writing
    its input cannot block us; the deadline kills the tool even while a write is blocked. Closing
    the input is what makes a tool like `nft -f` or `iptables-restore` commit what it read, so
    the input is only ever closed by `close()`: `abort()` kills the tool with it still open.
    """

    proc: subprocess.Popen[bytes]
    out: IO[bytes] | None
    err: IO[bytes]
    timed_out: bool = False
    _timer: threading.Timer | None = None

    @classmethod
    def start(
        cls, argv: list[str], timeout: float | None, *, keep_stdout: bool = False, pipe_bytes: int | None = None
    ) -> FedProcess:
        """`pipe_bytes`: ask for an input pipe that holds that much (at most the system's
        pipe-max-size), so that a write of up to that size returns before the tool has read it."""
        with contextlib.ExitStack() as opened:
            out = opened.enter_context(tempfile.TemporaryFile()) if keep_stdout else None
            err = opened.enter_context(tempfile.TemporaryFile())
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out or subprocess.DEVNULL, stderr=err)
            opened.pop_all()  # the files are the process's now, closed by wait or abort
        fed = cls(proc, out, err)
        if pipe_bytes is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):  # a smaller pipe only makes writes wait for the reader
                fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, min(pipe_bytes, _pipe_max_size()))
        if timeout is not None:
            fed._timer = threading.Timer(timeout, fed._expire)
            fed._timer.daemon = True
            fed._timer.start()
        return fed

    def _expire(self) -> None:
        self.timed_out = True
        self.proc.kill()

    def write(self, text: str) -> bool:
        """False when the tool no longer reads (it exited or was killed)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text.encode())
            return True
        except (BrokenPipeError, ValueError):
            return False

    def close(self) -> None:
        """End the input. A BrokenPipeError: buffered input the tool, already stopped, never read."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def wait(self) -> tuple[int, str, str]:
        """After `close`: (return code, standard output, standard error)."""
        rc = self.proc.wait()
        self._done()
        return rc, _read(self.out) if self.out is not None else "", _read(self.err)

    def abort(self) -> None:
        """Kill the tool with its input still open: whatever it read is never committed."""
        self.proc.kill()
        self.proc.wait()
        self._done()
        self.close()
        for f in (self.out, self.err):
            if f is not None:
                f.close()

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@functools.cache  # a system setting: read once, not for each of a cold sync's nft processes
def _pipe_max_size() -> int:
    try:
        return int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text
