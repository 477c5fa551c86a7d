"""Running the kernel tools: the one `Runner` signature every backend takes, and the host's.

Every backend calls its tools through a `run(argv, input=, check=, timeout=)` callable, so the same
code drives the host (`local_run`), a test namespace (`NetNS.run`) or a fake (`FakeNode.run`).
Arguments are a list and input goes on stdin: never a shell.

`local_run` also takes its input as an iterable of strings (`takes_chunks`), written to the tool
as they come: a full iptables sync at 10k services is 32 MiB of text, which would otherwise be
joined into one string and then encoded into one more copy, all alive at the proxy's peak.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO

from kubeproxy.backends.base import SyncError

Runner = Callable[..., subprocess.CompletedProcess[str]]

# Chunks are written in batches of about this many characters: one write per small chunk would
# cost a system call each (20k of them for a full sync at 10k services).
BATCH = 256 * 1024


class CommandError(SyncError):
    """A tool exited non-zero (with `check`) or did not finish within its timeout."""


def local_run(
    argv: Sequence[str], *, input: str | Iterable[str] | None = None, check: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a tool on this host. A missing binary raises FileNotFoundError (an OSError), as subprocess does.

    `input` a string, or an iterable of strings written one batch at a time.
    """
    try:
        if input is None or isinstance(input, str):
            proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False, timeout=timeout)
        else:
            proc = _run_streamed(list(argv), input, timeout)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"{argv[0]} did not finish within {timeout} s") from exc
    if check and proc.returncode != 0:
        raise CommandError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def takes_chunks(run: Runner) -> bool:
    """Whether `run` takes its input as an iterable of strings (other runners want one string)."""
    return run is local_run


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

    Output goes to files, not pipes, so that a tool writing a lot while we write its input cannot
    block us. The timeout kills the tool even while a write is blocked. If producing the chunks
    raises, the tool is killed before its input is closed: a tool that commits what it read at
    the end of its input (iptables-restore) must not take a truncated input for a whole one.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err)
        expired = threading.Event()
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, _expire, (proc, expired))
            timer.daemon = True
            timer.start()
        try:
            _feed(proc, chunks)
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
        if expired.is_set():
            raise subprocess.TimeoutExpired(argv, timeout or 0.0)
        return subprocess.CompletedProcess(argv, proc.returncode, _read(out), _read(err))


def _feed(proc: subprocess.Popen[bytes], chunks: Iterable[str]) -> None:
    """Write `chunks` to the tool's stdin and close it; a tool that stopped reading is no error
    here (its exit status says why)."""
    stdin = proc.stdin
    assert stdin is not None
    try:
        for batch in batches(chunks):
            stdin.write(batch.encode())
    except BrokenPipeError:
        pass
    except BaseException:
        proc.kill()  # before anything closes its input: see _run_streamed
        raise
    with contextlib.suppress(BrokenPipeError):
        stdin.close()


def _expire(proc: subprocess.Popen[bytes], expired: threading.Event) -> None:
    expired.set()
    proc.kill()


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")
