"""FakeNft with streamed transactions (stream.py), for tests without root.

`StreamingFakeNft().run` is FakeNft's; its `spawn` is what `stream.spawner` finds on the object a
runner is bound to, so an applier given `fake.run` streams its large plans into `FakeStream`s:
the text written is applied as one `nft -f -` transaction when the stream is closed, and never
when it is aborted. Every stream is kept in `streams` with what happened to it, so a test can
see which transactions were committed, refused or killed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.nftables.fake import FakeNft


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

    def wait(self) -> tuple[int, str]:
        assert self.result is not None, "wait before close"
        return self.result

    def abort(self) -> None:
        assert self.state == "open", f"abort of a {self.state} stream"
        self.state = "killed"


@dataclass
class StreamingFakeNft(FakeNft):
    streams: list[FakeStream] = field(default_factory=list)
    # Called with each new stream (a test makes one fail to read, say).
    on_spawn: Callable[[FakeStream], None] | None = None

    def spawn(self, args: Sequence[str], timeout: float) -> FakeStream:
        stream = FakeStream(self, ["nft", *args])
        self.calls.append(stream.argv)
        self.streams.append(stream)
        if self.on_spawn is not None:
            self.on_spawn(stream)
        return stream
