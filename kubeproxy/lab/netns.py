"""Network namespaces for test beds: create, run commands inside, wire with veth, always remove.

Everything that programs netfilter in tests or demos does it inside a namespace made here,
never in the host's own ruleset.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from kubeproxy.kernel.exec import LOCAL
from kubeproxy.kernel.host import Capability, Feed

_counter = itertools.count()


class NetnsError(RuntimeError):
    """A command inside a namespace failed; the message carries its stderr."""


def have_root() -> bool:
    return os.geteuid() == 0


@dataclass
class NetNS:
    """A named network namespace (`ip netns add`), with loopback up: a host (kernel/host.py)
    whose tools run under `ip netns exec`, and that in-process kernel access enters."""

    name: str
    _children: list[subprocess.Popen[str]] = field(default_factory=list, repr=False)
    capabilities: frozenset[Capability] = field(default=frozenset(Capability), init=False, repr=False)

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    @property
    def netns_path(self) -> str:
        """The namespace's file: in-process kernel access (kernel/libnft.py) enters it through this."""
        return f"/run/netns/{self.name}"

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = 60,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(argv), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise NetnsError(f"[{self.name}] {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = LOCAL.run_chunks(self.argv(argv), chunks, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise NetnsError(f"[{self.name}] {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        return LOCAL.spawn(self.argv(argv), timeout, pipe_bytes=pipe_bytes)

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start a long-running process inside; it is killed when the namespace is removed."""
        kwargs.setdefault("text", True)
        child: subprocess.Popen[str] = subprocess.Popen(self.argv(argv), **kwargs)  # type: ignore[call-overload]
        self._children.append(child)
        return child

    def delete(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)
        self._children.clear()
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)


def create(prefix: str = "kp") -> NetNS:
    name = f"{prefix}-{os.getpid()}-{next(_counter)}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    ns = NetNS(name)
    ns.run(["ip", "link", "set", "lo", "up"])
    return ns


@contextmanager
def netns(prefix: str = "kp") -> Iterator[NetNS]:
    """A fresh namespace for the duration of the block; removed (with its processes) afterwards."""
    ns = create(prefix)
    try:
        yield ns
    finally:
        ns.delete()


# A killed process still tears down its memory on its own CPU time: a niced kube-apiserver on a
# loaded machine took over 30 s. The wait bounds a hang, it synchronises nothing.
KILLED_EXIT_TIMEOUT = 120.0


def stop_process(proc: subprocess.Popen[str], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` s (a process that has exited is left as it is)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(max(timeout, KILLED_EXIT_TIMEOUT))


def ip_batch(ns: NetNS, commands: Sequence[str]) -> None:
    """Several `ip` commands in one process: building a pod takes one spawn instead of five."""
    ns.run(["ip", "-batch", "-"], input="\n".join(commands) + "\n")


def link(a: NetNS, a_if: str, a_cidr: str, b: NetNS, b_if: str, b_cidr: str) -> None:
    """Wire two namespaces with a veth pair and give each end an address (`10.1.0.1/24` form)."""
    tmp_a, tmp_b = f"v{os.getpid() % 10000}a{next(_counter)}", f"v{os.getpid() % 10000}b{next(_counter)}"
    subprocess.run(
        ["ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b], check=True, capture_output=True
    )
    for tmp, ns, ifname, cidr in ((tmp_a, a, a_if, a_cidr), (tmp_b, b, b_if, b_cidr)):
        subprocess.run(["ip", "link", "set", tmp, "netns", ns.name], check=True, capture_output=True)
        ns.run(["ip", "link", "set", tmp, "name", ifname])
        ns.run(["ip", "addr", "add", cidr, "dev", ifname])
        ns.run(["ip", "link", "set", ifname, "up"])
