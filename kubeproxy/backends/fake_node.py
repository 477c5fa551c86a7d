"""One fake node for tests without root: every kernel tool the proxy runs, in memory.

A `FakeNode` is a host (kernel/host.py) that sends each command to the fake of its tool:
iptables, ip6tables, their -save/-restore and nfacct to `FakeIptables`, nft to `FakeNft`,
conntrack and `ip` (local routes) to `FakeConntrack`, ipvsadm, ipset and kube-ipvs0 to
`FakeIpvs`, and the tools of a registered mode that brings its own fakes to those; the
reconciler reads and prunes its `conntrack` table. It spawns `nft` where its nft fake can
(a `StreamingFakeNft`). A `LiveProxy(run_cmd=FakeNode())` runs every mode's sync, check and
cleanup without a kernel.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.conntrack.fake import FakeConntrack
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.ipvs.fake import FakeIpvs
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.fake_stream import StreamingFakeNft
from kubeproxy.backends.registry import MODES, FakeTool
from kubeproxy.kernel.host import NO_CAPABILITIES, Capability, Feed


@dataclass
class FakeNode:
    iptables: FakeIptables = field(default_factory=FakeIptables)
    nft: FakeNft = field(default_factory=FakeNft)
    conntrack: FakeConntrack = field(default_factory=lambda: FakeConntrack(local=["127.0.0.1", "192.168.0.2"]))
    ipvs: FakeIpvs = field(default_factory=FakeIpvs)
    # The fakes of tools a registered mode brings along (its `fake_tools`), asked first.
    extra: list[FakeTool] = field(default_factory=lambda: [make() for m in MODES.values() for make in m.fake_tools])

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        for fake in self.extra:
            if fake.handles(argv):
                return fake.run(argv, input=input, check=check, timeout=timeout)
        tool = argv[0]
        if tool == "nft":
            return self.nft.run(argv, input=input, check=check, timeout=timeout)
        if self.ipvs.handles(argv):
            return self.ipvs.run(argv, input=input, check=check, timeout=timeout)
        if tool in ("conntrack", "ip"):
            return self.conntrack(argv, input=input, check=check, timeout=timeout)
        return self.iptables.run(argv, input=input, check=check, timeout=timeout)

    __call__ = run

    def run_chunks(
        self, argv: Sequence[str], chunks: Iterable[str], *, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run(argv, input="".join(chunks), check=check, timeout=timeout)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return frozenset({Capability.SPAWN}) if isinstance(self.nft, StreamingFakeNft) else NO_CAPABILITIES

    @property
    def netns_path(self) -> str | None:
        return None

    def spawn(self, argv: Sequence[str], timeout: float | None, *, pipe_bytes: int | None = None) -> Feed:
        if not isinstance(self.nft, StreamingFakeNft) or argv[0] != "nft":
            raise NotImplementedError(f"the fake node spawns only nft, with a StreamingFakeNft: {argv}")
        return self.nft.spawn(argv, timeout, pipe_bytes=pipe_bytes)
