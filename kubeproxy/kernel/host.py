"""Where a backend's kernel tools run: this host (`exec.LOCAL`), a network namespace (the lab's
`NetNS`) or a fake node (`FakeNode`).

A `Host` runs a tool (`run`, or calling the host itself: a host is a `Runner`), runs one with its
input written as it is made (`run_chunks`), starts one to feed as we go (`spawn`), and names the
namespace file in-process kernel access enters (`netns_path`: libnftables, ctnetlink). What it
can do beyond `run` it declares in `capabilities`; callers ask those, never the object's type.
A backend given a plain function as its runner (`host_of` makes it a `Commands`) runs every tool
as a whole process with its input joined: a wrapper that should keep streaming and in-process
libnftables wraps the host with `Intercepted`, which keeps what the host declares.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable


class Capability(StrEnum):
    CHUNKS = "chunks"  # run_chunks writes the chunks as they come (otherwise: joined, then run)
    SPAWN = "spawn"  # spawn starts a tool to feed as we go
    ENTER = "enter"  # netns_path names a kernel namespace this process may enter (None: its own)


NO_CAPABILITIES: frozenset[Capability] = frozenset()


class Feed(Protocol):
    """A tool being fed its input (exec.FedProcess for a real one). Closing the input is what
    makes a tool like `nft -f` commit: only `close` does; `abort` kills it with the input open."""

    timed_out: bool

    def write(self, text: str) -> bool:
        """False when the tool no longer reads (it exited or was killed)."""
        ...

    def close(self) -> None: ...

    def wait(self) -> tuple[int, str, str]:
        """After `close`: (return code, standard output, standard error)."""
        ...

    def abort(self) -> None: ...


@runtime_checkable
class Host(Protocol):
    @property
    def capabilities(self) -> frozenset[Capability]: ...

    @property
    def netns_path(self) -> str | None: ...

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]: ...

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]: ...

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        """Start `argv` to be fed (with SPAWN; NotImplementedError otherwise). `pipe_bytes`: an
        input pipe that holds that much, so a write that size returns before the tool reads it."""
        ...

    def __call__(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]: ...


Run = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Commands:
    """A plain runner as a host that declares nothing beyond running a command."""

    runner: Run
    capabilities: frozenset[Capability] = NO_CAPABILITIES
    netns_path: str | None = None

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.runner(argv, input=input, check=check, timeout=timeout)

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.runner(argv, input="".join(chunks), check=check, timeout=timeout)

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        raise NotImplementedError(f"{self.runner!r} cannot spawn a tool")


@dataclass(frozen=True)
class Intercepted:
    """`host` with each command going through `intercept(proceed, argv, input=, check=, timeout=)`
    (a test's injected refusal, a bench's counter), which calls `proceed` with the same options to
    run it on the host: `input` is a string, None, or (from `run_chunks`) an iterable of strings.
    Everything else is the host's, its capabilities too but those the wrapper gives up: `without`
    ENTER, say, so that in-process libnftables does not go around `intercept`."""

    host: Host
    intercept: Callable[..., subprocess.CompletedProcess[str]]
    without: frozenset[Capability] = NO_CAPABILITIES

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.host.capabilities - self.without

    @property
    def netns_path(self) -> str | None:
        return self.host.netns_path

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.intercept(self.host.run, argv, input=input, check=check, timeout=timeout)

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        def proceed(
            argv: Sequence[str], *, input: Iterable[str], check: bool = True, timeout: float | None = None
        ) -> subprocess.CompletedProcess[str]:
            return self.host.run_chunks(argv, input, check=check, timeout=timeout)

        return self.intercept(proceed, argv, input=chunks, check=check, timeout=timeout)

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        return self.host.spawn(argv, timeout, pipe_bytes=pipe_bytes)


def host_of(run: Run | Host) -> Host:
    """`run` if it is a host, else a `Commands` declaring no capabilities."""
    return run if isinstance(run, Host) else Commands(run)
