"""Large transactions streamed into `nft` processes, so that nft parses while we write.

nft 1.0.6 reads `-f -` (`/dev/stdin`) whole into a buffer before it parses, but any other file
name goes through its scanner as it is read: `nft -f /dev/fd/0` parses a pipe while the writer
is still writing. Of the 1.05 s `nft -f` takes for a cold table at 10k services x 10 endpoints
(5.6 MB), about 0.5 s is that parse; the rest (cache, evaluation, the kernel's commit) starts
at end of input. The applier (apply.py) uses this to run its chunks as a pipeline: chunk k+1
is written to (and parsed by) its own process while chunk k's process evaluates and commits;
chunk k+1's input is closed only once chunk k has exited successfully, so the kernel sees the
same transactions in the same order as before.

Safety: closing a process's input is what commits its transaction, so a stream is only ever
closed by `close()`. `abort()` kills the process (SIGKILL) with its input still open: nothing
is committed, whatever was written. `ProcessStream` also kills its process at its deadline.
A host starts the process with `setpriv --pdeathsig KILL` where setpriv is installed (exec.py's
`death_guard`): if the proxy dies while a stream is open (its pipe then closes, which nft would
take for the end of its input), the kernel kills nft too, long before its evaluation of the
partial input could commit.

nft's error messages name the file: `/dev/fd/0:LINE:COLS: Error: ...`, and unlike with
`/dev/stdin` it cannot read the offending line back from a pipe. `wait()` puts the name and
the line (with nft's caret marks) back from the text written, so errors read as before.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubeproxy.kernel.exec import FedProcess, Runner
from kubeproxy.kernel.host import Capability, Feed, host_of
from kubeproxy.model.contract import ToolTimeout

# A chunk of the applier's (STREAM_CHUNK operations) is about 0.5 MB of text.
PIPE_BYTES = 1 << 20
STREAM_FILE = "/dev/fd/0"  # not `-`: nft 1.0.6 would read it whole before parsing
_ERROR_AT = re.compile(r"^/dev/fd/0:(\d+):(\d+)(?:-(\d+))?: ", re.M)


class NftStream(Protocol):
    """One `nft -f` transaction being written."""

    def write(self, text: str) -> bool:
        """Send more input; False when the process no longer reads (it failed: see wait)."""

    def close(self) -> None:
        """End the input: nft evaluates what it read and commits it (unless it refuses it)."""

    def wait(self) -> tuple[int, str]:
        """After `close`: wait for the process; (return code, error text). A process killed at
        its deadline raises ToolTimeout: that is no refusal of its text."""

    def abort(self) -> None:
        """Kill the process with its input still open: nothing of this transaction is committed."""


Spawn = Callable[[Sequence[str], float], NftStream]  # (nft arguments, timeout) -> stream


@dataclass
class ProcessStream:
    """An `nft -f /dev/fd/0` process fed through a pipe; killed at `timeout` seconds."""

    # stderr goes to a file (exec.FedProcess): nft may write a lot of it (it echoes refused
    # lines, up to 1000 elements each) while we are blocked writing its input. A pipe that holds
    # a whole chunk (PIPE_BYTES): the write returns at once and the next chunk's text is made
    # while nft parses this one (a cold 10k table 0.66 -> 0.62 s).
    fed: Feed
    timeout: float
    _lines: list[str] = field(default_factory=list)  # what was written, for error messages

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert isinstance(self.fed, FedProcess), "a process of this host's"
        return self.fed.proc

    def write(self, text: str) -> bool:
        self._lines.append(text)
        return self.fed.write(text)

    def close(self) -> None:
        self.fed.close()

    def wait(self) -> tuple[int, str]:
        rc, _, err = self.fed.wait()
        text = "".join(self._lines) if rc else ""
        self._lines = []
        if self.fed.timed_out:
            raise ToolTimeout("nft", self.timeout, text.count("\n"))
        return (0, err) if rc == 0 else (1, with_lines(err, text))

    def abort(self) -> None:
        self.fed.abort()  # kills nft before its input is closed (see the module doc)
        self._lines = []


def with_lines(err: str, text: str) -> str:
    """nft's errors about `/dev/fd/0` as it prints them about `/dev/stdin`: with the line and marks.

    For a pipe nft prints an empty line where the offending line would be, and no marks."""
    if "/dev/fd/0:" not in err:
        return err
    lines = text.split("\n")
    out: list[str] = []
    got = err.splitlines()
    i = 0
    while i < len(got):
        line = got[i]
        i += 1
        m = _ERROR_AT.match(line)
        if not m:
            out.append(line)
            continue
        out.append(line.replace(STREAM_FILE, "/dev/stdin", 1))
        number, start = int(m[1]), int(m[2])
        end = int(m[3]) if m[3] else start
        if 0 < number <= len(lines):
            if i < len(got) and not got[i]:
                i += 1  # the empty stand-in for the line
            out += [lines[number - 1], " " * (start - 1) + "^" * max(1, end - start + 1)]
    return "\n".join(out) + "\n"


def spawner(run: Runner) -> Spawn | None:
    """How to start a streamed `nft` where `run` runs its tools: on a host that declares it can
    spawn a tool (host.Capability.SPAWN); None otherwise (keep using `run`)."""
    host = host_of(run)
    if Capability.SPAWN not in host.capabilities:
        return None

    def spawn(args: Sequence[str], timeout: float) -> NftStream:
        return ProcessStream(host.spawn(["nft", *args], timeout, pipe_bytes=PIPE_BYTES), timeout)

    return spawn
