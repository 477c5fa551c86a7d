"""FakeNft with streamed transactions (stream.py), for tests without root.

A `StreamingFakeNft` is a host (kernel/host.py) that declares it can spawn a tool: an applier
given it streams its large plans into `FakeStream`s: the text written is applied as one
`nft -f -` transaction when the stream is closed, and never when it is aborted. Every stream is
kept in `streams` with what happened to it, so a test can see which transactions were committed,
refused or killed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.kernel.host import Capability


@dataclass
class FakeStream:
    fake: FakeNft
    argv: list[str]
    text: list[str] = field(default_factory=list)
    state: str = "open"  # open | closed (applied or refused) | killed
    result: tuple[int, str] | None = None
    # Set by a test (through `on_spawn`): nft refuses the transaction with this error text; with
    # `stop_reading` it does so before reading all of it (write returns False); `raise_on_write`
    # is raised by write, as any bug or interrupt while a chunk is produced or sent would be.
    refuse: str | None = None
    stop_reading: bool = False
    raise_on_write: BaseException | None = None

    def write(self, text: str) -> bool:
        assert self.state == "open", f"write to a {self.state} stream"
        if self.stop_reading:
            return False
        self.text.append(text)
        if self.raise_on_write is not None:
            raise self.raise_on_write
        return True

    def close(self) -> None:
        assert self.state == "open", f"close of a {self.state} stream"
        self.state = "closed"
        if self.refuse is not None or self.stop_reading:
            self.result = (1, self.refuse or "Error: stopped reading")
            return
        proc = self.fake.run(["nft", "-f", "-"], input="".join(self.text), check=False)
        self.result = (proc.returncode, proc.stderr)

    timed_out: bool = False

    def wait(self) -> tuple[int, str, str]:
        assert self.result is not None, "wait before close"
        return self.result[0], "", self.result[1]

    def abort(self) -> None:
        assert self.state == "open", f"abort of a {self.state} stream"
        self.state = "killed"


@dataclass
class StreamingFakeNft(FakeNft):
    streams: list[FakeStream] = field(default_factory=list)
    # Called with each new stream (a test makes one fail to read, say).
    on_spawn: Callable[[FakeStream], None] | None = None

    capabilities: frozenset[Capability] = frozenset({Capability.SPAWN})
    netns_path: str | None = None

    def __call__(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run(argv, input=input, check=check, timeout=timeout)

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run(argv, input="".join(chunks), check=check, timeout=timeout)

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> FakeStream:
        assert argv[0] == "nft", argv
        stream = FakeStream(self, list(argv))
        self.calls.append(stream.argv)
        self.streams.append(stream)
        if self.on_spawn is not None:
            self.on_spawn(stream)
        return stream
