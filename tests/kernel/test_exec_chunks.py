"""`local_run` with its input as pieces: what `subprocess.run` with the joined text gives, and
a producer that fails never lets the tool take a truncated input for a whole one.

Real processes (the Python interpreter as the tool); no root needed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.backends.iptables.apply import restore, restore_timeout
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.backends.iptables.render import render_tables, restore_chunks
from kubeproxy.cluster.manifest_load import load
from kubeproxy.kernel.exec import CommandError, batches, local_run
from kubeproxy.kernel.host import Capability, host_of
from kubeproxy.model.contract import ToolTimeout
from kubeproxy.model.proxy_config import ProxyConfig
from tests.backends.iptables.rules_invariants import parse
from tests.paths import DEMO

ECHO = [sys.executable, "-c", "import sys; d = sys.stdin.read(); sys.stdout.write(d); sys.stderr.write(str(len(d)))"]


@pytest.mark.parametrize(
    "chunks",
    [[], [""], ["a\n"], ["*filter\n", "", ":X - [0:0]\n" * 50_000, "COMMIT\n"], ["é\n", "x" * 300_000, "\n"]],
)
def test_pieces_reach_the_tool_as_the_joined_text_does(chunks: list[str]) -> None:
    text = "".join(chunks)
    whole = local_run(ECHO, input=text)
    streamed = local_run(ECHO, input=iter(chunks))
    assert (streamed.returncode, streamed.stdout, streamed.stderr) == (whole.returncode, whole.stdout, whole.stderr)
    assert streamed.stdout == text


def test_a_refusal_is_reported_as_for_a_text() -> None:
    argv = [sys.executable, "-c", "import sys; sys.stdin.read(1); sys.stderr.write('line 3: bad'); sys.exit(2)"]
    # The tool stops reading: more input than a pipe holds must not block us.
    proc = local_run(argv, input=["x" * 1_000_000] * 3, check=False)
    assert (proc.returncode, proc.stderr) == (2, "line 3: bad")
    with pytest.raises(CommandError, match="exited 2: line 3: bad"):
        local_run(argv, input=["x\n"])


def test_the_timeout_kills_a_tool_that_stops_reading() -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    with pytest.raises(ToolTimeout, match=r"did not finish within 0\.5 s") as caught:
        local_run(argv, input=["x" * 1_000_000] * 4, timeout=0.5)  # blocked writing when it fires
    assert (caught.value.tool, caught.value.bound) == (sys.executable, 0.5)


def test_a_timeout_is_no_refusal_and_says_the_input_size() -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    with pytest.raises(ToolTimeout) as caught:
        local_run(argv, input="a\nb\nc\n", check=False, timeout=0.2)  # without `check` too
    assert not isinstance(caught.value, CommandError) and caught.value.lines == 3
    assert str(caught.value) == f"{sys.executable} did not finish within 0.2 s (3 lines of input) and was killed"


def test_a_failing_producer_kills_the_tool_before_it_sees_the_end_of_its_input(tmp_path: Path) -> None:
    done = tmp_path / "committed"
    # The tool "commits" what it read at the end of its input, as iptables-restore does.
    argv = [sys.executable, "-c", f"import sys; d = sys.stdin.read(); open({str(done)!r}, 'w').write(d)"]

    def pieces() -> Iterator[str]:
        yield "*filter\n" * 100_000  # more than one batch: the tool has read some of it
        raise RuntimeError("bug while rendering")

    with pytest.raises(RuntimeError, match="bug while rendering"):
        local_run(argv, input=pieces())
    assert not done.exists()


def test_batches_keep_order_and_content() -> None:
    chunks = ["a" * 10, "b" * 5, "", "c" * 30, "d"]
    got = list(batches(chunks, size=16))
    assert "".join(got) == "".join(chunks) and got == ["a" * 10 + "b" * 5 + "c" * 30, "d"]


def test_restore_joins_the_pieces_for_a_runner_that_wants_a_text() -> None:
    fake = FakeIptables()
    assert Capability.CHUNKS not in host_of(fake.run).capabilities and Capability.CHUNKS in host_of(local_run).capabilities
    pieces = ["*nat\n", ":KUBE-SERVICES - [0:0]\n", "-A KUBE-SERVICES -j RETURN\n", "COMMIT\n"]
    restore(pieces, fake.run)
    restore_call = next(c for c in fake.calls if c[0] == "iptables-restore")
    assert restore_call == ["iptables-restore", "-w", "--noflush", "--counters"]
    assert fake.tables()["nat"]["KUBE-SERVICES"] == ["-A KUBE-SERVICES -j RETURN"]
    assert restore_timeout(pieces) == restore_timeout("".join(pieces))


@pytest.mark.root
@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_rendering_streamed_into_iptables_restore_loads_as_its_text(netns, variant: str) -> None:  # type: ignore[no-untyped-def]
    # The pieces of a full sync, as the proxier hands them to `local_run` (here through `ip netns
    # exec`, so that the tool runs in the test's namespace): the kernel holds what the text says.
    cfg = ProxyConfig(cluster_cidr=("10.244.0.0/16",))
    result = render_iptables(load([DEMO]).state, cfg, nfacct_counters=())
    _, tables = render_tables(result.view, result.options)
    tool = f"iptables-{variant}-restore"
    proc = local_run(["ip", "netns", "exec", netns.name, tool, "-w", "--noflush"], input=restore_chunks(tables), check=False)
    assert proc.returncode == 0, proc.stderr
    saved = parse(netns.run([f"iptables-{variant}-save"]).stdout)
    for table, (declared, rules) in parse(result.rendered.text).items():
        saved_declared, saved_rules = saved[table]
        assert set(declared) <= set(saved_declared), f"{table}: chains missing after restore"
        for chain, chain_rules in rules.items():
            assert len(saved_rules.get(chain, [])) == len(chain_rules), f"{table} {chain}: rule count differs"



def test_a_large_pipe_takes_a_whole_chunk_before_the_tool_reads(tmp_path: Path) -> None:
    """The nftables stream asks for a pipe that holds a chunk: its write must not wait for the
    reader, or the next chunk's text could not be made while nft parses this one. The tool here
    reads nothing until a file appears; a default 64 KiB pipe blocks the 512 KiB write until then."""
    import threading

    from kubeproxy.kernel.exec import FedProcess

    go = tmp_path / "go"
    tool = [sys.executable, "-c", "import os, sys, time\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            "sys.stdout.write(str(len(sys.stdin.buffer.read())))"]  # fmt: skip
    text = "x" * (512 << 10)
    for pipe_bytes, returns_at_once in [(1 << 20, True), (None, False)]:
        go.unlink(missing_ok=True)
        fed = FedProcess.start(tool, 60, keep_stdout=True, pipe_bytes=pipe_bytes)
        writer = threading.Thread(target=fed.write, args=(text,))
        writer.start()
        writer.join(timeout=10 if returns_at_once else 0.5)
        assert writer.is_alive() is not returns_at_once
        go.touch()  # now the tool reads: everything arrives either way
        writer.join(timeout=30)
        assert not writer.is_alive()
        fed.close()
        rc, out, _ = fed.wait()
        assert (rc, out) == (0, str(len(text)))
