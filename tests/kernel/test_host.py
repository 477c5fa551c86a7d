"""Every host declares what it can do, and a wrapper keeps it unless it says otherwise.

The assignments to `Host` below are checked by mypy (tests are type-checked): each host
implements the whole protocol with its signatures."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.nftables.fake_stream import StreamingFakeNft
from kubeproxy.kernel.exec import LOCAL, local_run
from kubeproxy.kernel.host import Capability, Commands, Host, Intercepted, Run, host_of
from kubeproxy.lab.netns import NetNS


def _through(proceed: Run, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return proceed(argv, **kw)


def test_each_host_declares_its_capabilities() -> None:
    local: Host = LOCAL
    namespace: Host = NetNS("x")
    fake: Host = FakeNode()
    streaming: Host = StreamingFakeNft()
    assert local is local_run and local.capabilities == frozenset(Capability) and local.netns_path is None
    assert namespace.capabilities == frozenset(Capability) and namespace.netns_path == "/run/netns/x"
    assert fake.capabilities == frozenset() and FakeNode(nft=StreamingFakeNft()).capabilities == {Capability.SPAWN}
    assert streaming.capabilities == {Capability.SPAWN}


def test_a_plain_function_declares_nothing_and_a_wrapper_keeps_what_its_host_declares() -> None:
    ns = NetNS("x")
    assert host_of(ns) is ns
    assert host_of(ns.run) == Commands(ns.run) and host_of(ns.run).capabilities == frozenset()
    kept: Host = Intercepted(ns, _through)
    assert kept.capabilities == frozenset(Capability) and kept.netns_path == ns.netns_path
    fewer = Intercepted(ns, _through, without=frozenset({Capability.ENTER}))
    assert fewer.capabilities == {Capability.CHUNKS, Capability.SPAWN}


def test_a_wrapper_sees_every_command_chunks_included() -> None:
    seen: list[tuple[list[str], str]] = []

    def recording(proceed: Run, argv: Sequence[str], *, input: Any = None, **kw: Any) -> subprocess.CompletedProcess[str]:
        text = input if input is None or isinstance(input, str) else "".join(input)
        seen.append((list(argv), text or ""))
        return proceed(argv, input=text if input is None or isinstance(input, str) else [text], **kw)

    node = FakeNode()
    host = Intercepted(node, recording)
    host.run(["iptables-save"])
    host.run_chunks(["iptables-restore", "-w", "--noflush"], ["*nat\n", ":KUBE-X - [0:0]\n", "COMMIT\n"])
    assert seen == [(["iptables-save"], ""), (["iptables-restore", "-w", "--noflush"], "*nat\n:KUBE-X - [0:0]\nCOMMIT\n")]
    assert ":KUBE-X - [0:0]" in node.run(["iptables-save", "-t", "nat"]).stdout
