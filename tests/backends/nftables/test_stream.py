"""Large plans streamed into a pipeline of `nft` processes (stream.py, NftApplier._stream).

Without root: the StreamingFakeNft shows that a streamed plan leaves the same table as chunks
sent one after the other, and that whatever fails (nft refuses a chunk, a process stops reading,
an exception while a chunk is written) kills the process still being written to, so none of its
chunk is applied, and the applier reports it as it reports a refused `nft -f`. As root, in a
namespace: a killed stream commits nothing even when its whole text was written, a failure
mid-stream leaves the kernel with exactly the chunks committed before, and error messages read
as nft's own for `-f -`.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.nftables import apply as apply_mod
from kubeproxy.backends.nftables import stream
from kubeproxy.backends.nftables.apply import NftApplier, NftError
from kubeproxy.backends.nftables.diff import chunks, create_plan
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.fake_stream import FakeStream, StreamingFakeNft
from kubeproxy.backends.nftables.render import render
from kubeproxy.backends.nftables.rendered_table import NftRendering
from kubeproxy.kernel import exec as kexec
from kubeproxy.kernel.host import Intercepted
from kubeproxy.lab import netns as L
from kubeproxy.model.contract import ToolTimeout
from tests.backends.nftables.helpers import canonical, options, view
from tests.backends.nftables.test_incremental import random_service

CHUNK = 40  # operations per chunk: a dozen chunks for the rendering below


def _rendering(services: int = 12) -> NftRendering:
    rng = random.Random(5)
    return render(view([o for i in range(services) for o in random_service(rng, i)]), options())


def _streamed(run: Callable[..., subprocess.CompletedProcess[str]]) -> NftApplier:
    return NftApplier("ip", run, chunk_size=CHUNK, stream_min_operations=0)


def _serial(run: Callable[..., subprocess.CompletedProcess[str]]) -> NftApplier:
    return NftApplier("ip", run, chunk_size=CHUNK, stream_min_operations=None)


def test_a_streamed_create_leaves_the_same_table_as_serial_chunks() -> None:
    r = _rendering()
    streamed, serial = StreamingFakeNft(), FakeNft()
    a, b = _streamed(streamed), _serial(serial.run)
    ra, rb = a.apply(r), b.apply(r)
    assert streamed.tables == serial.tables
    assert (ra.mode, ra.operations, ra.invocations, ra.chunks) == (rb.mode, rb.operations, rb.invocations, rb.chunks)
    assert ra.chunks > 3
    assert [s.state for s in streamed.streams] == ["closed"] * ra.chunks
    assert all(s.argv == ["nft", "-f", stream.STREAM_FILE] for s in streamed.streams)


def test_small_plans_are_not_streamed() -> None:
    fake = StreamingFakeNft()
    applier = NftApplier("ip", fake, chunk_size=CHUNK, stream_min_operations=10**9)
    applier.apply(_rendering())
    assert not fake.streams
    assert fake.table() is not None


def _refusing(index: int, **what: Any) -> Callable[[FakeStream], None]:
    seen = [0]

    def on_spawn(s: FakeStream) -> None:
        if seen[0] == index:
            for key, value in what.items():
                setattr(s, key, value)
        seen[0] += 1

    return on_spawn


def test_a_refused_chunk_kills_the_next_one_and_fails_as_a_refused_nft_run() -> None:
    r = _rendering()
    fake = StreamingFakeNft(on_spawn=_refusing(1, refuse="Error: /dev/stdin:3:1-3: boom"))
    applier = _streamed(fake)
    with pytest.raises(NftError, match=r"^nft -f failed: Error: /dev/stdin:3:1-3: boom$"):
        applier.apply(r)
    # chunk 0 committed, chunk 1 refused, chunk 2 (written while chunk 1 was evaluated) killed
    assert [s.state for s in fake.streams] == ["closed", "closed", "killed"]
    assert applier.stats.failures_total == 1
    alone = FakeNft()
    NftApplier("ip", alone.run, chunk_size=CHUNK, stream_min_operations=0)._nft(fake.streams[0].text[0], 0)
    assert fake.tables == alone.tables  # exactly chunk 0
    assert applier._needs_full  # the next sync trusts nothing (the kernel test below runs it)


def test_a_chunk_killed_at_its_deadline_is_a_timeout_not_a_refusal() -> None:
    """The second chunk's nft is killed at its deadline (it stopped reading, committing nothing):
    ToolTimeout, which the quarantine never bisects on, and the next apply is full."""
    fake = StreamingFakeNft(on_spawn=_refusing(1, timed_out=True, stop_reading=True, refuse="Killed"))
    applier = _streamed(fake)
    said = r"^nft did not finish within 300\.\d+ s \(\d+ lines of input\) and was killed$"
    with pytest.raises(ToolTimeout, match=said) as caught:
        applier.apply(_rendering())
    assert not isinstance(caught.value, NftError)
    assert [s.state for s in fake.streams][:2] == ["closed", "closed"]
    assert applier.stats.failures_total == 1 and applier._needs_full


def test_a_process_that_stops_reading_is_reported_with_its_error() -> None:
    fake = StreamingFakeNft(on_spawn=_refusing(0, stop_reading=True, refuse="Error: out of memory"))
    applier = _streamed(fake)
    with pytest.raises(NftError, match="out of memory"):
        applier.apply(_rendering())
    assert [s.state for s in fake.streams] == ["closed"]  # nothing else was started
    assert fake.table() is None


def test_an_exception_while_a_chunk_is_written_kills_its_process() -> None:
    fake = StreamingFakeNft(on_spawn=_refusing(2, raise_on_write=KeyboardInterrupt()))
    applier = _streamed(fake)
    with pytest.raises(KeyboardInterrupt):
        applier.apply(_rendering())
    assert [s.state for s in fake.streams] == ["closed", "closed", "killed"]
    assert applier.stats.failures_total == 0  # not nft's refusal: counted where it is caught
    assert applier._needs_full


def test_an_exception_while_chunks_are_produced_leaves_no_process_open(monkeypatch: pytest.MonkeyPatch) -> None:
    real = chunks

    def failing(*args: Any) -> Iterator[tuple[str, int]]:
        for i, chunk in enumerate(real(*args)):
            if i == 3:
                raise RuntimeError("render failed")
            yield chunk

    monkeypatch.setattr(apply_mod, "chunks", failing)
    fake = StreamingFakeNft()
    applier = _streamed(fake)
    with pytest.raises(RuntimeError, match="render failed"):
        applier.apply(_rendering())
    assert [s.state for s in fake.streams] == ["closed"] * 3  # all complete chunks, each committed
    assert applier._needs_full


def test_errors_about_the_pipe_read_as_errors_about_stdin() -> None:
    text = "add table ip t\nadd chain ip t c\nadd rule ip t c jump nosuch\n"
    err = "/dev/fd/0:3:22-27: Error: Could not process rule: No such file or directory\n"
    assert stream.with_lines(err, text) == (
        "/dev/stdin:3:22-27: Error: Could not process rule: No such file or directory\n"
        "add rule ip t c jump nosuch\n"
        "                     ^^^^^^\n"
    )
    assert stream.with_lines("Error: something else\n", text) == "Error: something else\n"


def test_who_gets_a_spawner() -> None:
    # the hosts that declare they spawn tools, a wrapper that keeps what its host declares, and
    # no plain function (a bound method of a host included: it declares nothing)
    assert stream.spawner(FakeNft().run) is None
    fake = StreamingFakeNft()
    assert stream.spawner(fake) is not None and stream.spawner(fake.run) is None
    assert stream.spawner(kexec.local_run) is not None
    assert stream.spawner(L.NetNS("x")) is not None and stream.spawner(L.NetNS("x").run) is None
    assert stream.spawner(Intercepted(fake, lambda proceed, argv, **kw: proceed(argv, **kw))) is not None


# ------------------------------------------------------------------------------ kernel

root = pytest.mark.root
needs_root = pytest.mark.skipif(not L.have_root(), reason="needs root (network namespaces)")


def _tables(ns: L.NetNS) -> str:
    return ns.run(["nft", "list", "tables"]).stdout


@root
@needs_root
def test_kernel_an_aborted_stream_commits_nothing_even_when_complete() -> None:
    with L.netns("kpstream") as ns:
        spawn = stream.spawner(ns)
        assert spawn is not None
        s = spawn(["-f", stream.STREAM_FILE], 30)
        assert s.write("add table ip aborted\nadd chain ip aborted c\n")
        s.abort()
        ok = spawn(["-f", stream.STREAM_FILE], 30)
        assert ok.write("add table ip committed\n")
        ok.close()
        assert ok.wait() == (0, "")
        assert _tables(ns) == "table ip committed\n"


@root
@needs_root
def test_kernel_errors_match_nft_reading_stdin() -> None:
    text = "add table ip t\nadd chain ip t c\nadd rule ip t c jump nosuch\n"
    with L.netns("kpstream") as ns:
        spawn = stream.spawner(ns)
        assert spawn is not None
        s = spawn(["-f", stream.STREAM_FILE], 30)
        s.write(text)
        s.close()
        rc, err = s.wait()
        direct = ns.run(["nft", "-f", "-"], input=text, check=False)
        assert (rc, err) == (1, direct.stderr)
        assert _tables(ns) == ""


@root
@needs_root
def test_kernel_streamed_create_equals_serial() -> None:
    r = _rendering()
    with L.netns("kpstream") as a, L.netns("kpstream") as b:
        ra, rb = _streamed(a).apply(r), _serial(b).apply(r)
        assert ra.chunks == rb.chunks > 3
        listing = ["nft", "-j", "list", "table", "ip", "kube-proxy"]
        assert canonical(a.run(listing).stdout) == canonical(b.run(listing).stdout)


@root
@needs_root
def test_kernel_a_failure_mid_stream_leaves_only_the_chunks_committed_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worst case: chunk 1's whole text is in its process's pipe when the proxy fails."""
    r = _rendering()
    started: list[stream.NftStream] = []

    def failing_spawner(run: kexec.Runner) -> stream.Spawn | None:
        real = stream.spawner(run)
        assert real is not None

        def spawn(args: Sequence[str], timeout: float) -> stream.NftStream:
            s = real(args, timeout)
            started.append(s)
            if len(started) == 2:
                write = s.write

                def write_then_fail(text: str) -> bool:
                    write(text)
                    raise RuntimeError("render failed")

                s.write = write_then_fail  # type: ignore[method-assign]
            return s

        return spawn

    monkeypatch.setattr(apply_mod, "spawner", failing_spawner)
    first_chunk = next(chunks(create_plan(r).units, "ip kube-proxy", CHUNK))[0]
    with L.netns("kpstream") as ns, L.netns("kpstream") as expected:
        ns.run(["nft", "add", "table", "ip", "other"])
        applier = _streamed(ns)
        with pytest.raises(RuntimeError, match="render failed"):
            applier.apply(r)
        assert isinstance(started[1], stream.ProcessStream) and started[1].proc.returncode == -9
        expected.run(["nft", "add", "table", "ip", "other"])
        expected.run(["nft", "-f", "-"], input=first_chunk)
        got = json.loads(ns.run(["nft", "-j", "list", "ruleset"]).stdout)["nftables"][1:]
        want = json.loads(expected.run(["nft", "-j", "list", "ruleset"]).stdout)["nftables"][1:]
        assert got == want
        # The next apply is full and makes the table whole.
        monkeypatch.setattr(apply_mod, "spawner", stream.spawner)
        assert applier.apply(r).mode == "full"
        _serial(expected).apply(r, full=True)
        listing = ["nft", "-j", "list", "table", "ip", "kube-proxy"]
        assert canonical(ns.run(listing).stdout) == canonical(expected.run(listing).stdout)


@root
@needs_root
def test_kernel_a_stream_past_its_deadline_is_killed_and_commits_nothing() -> None:
    with L.netns("kpstream") as ns:
        spawn = stream.spawner(ns)
        assert spawn is not None
        s = spawn(["-f", stream.STREAM_FILE], 1)
        s.write("add table ip late\n")
        assert isinstance(s, stream.ProcessStream)
        s.proc.wait(timeout=30)  # input still open: only the deadline ends it
        s.close()
        with pytest.raises(ToolTimeout, match=r"nft did not finish within 1 s \(1 lines of input\)"):
            s.wait()  # no refusal of its text: the quarantine must not look for a Service to blame
        assert _tables(ns) == ""


def _hostile_but_valid() -> list[dict[str, Any]]:
    """Valid Services that once took a node down, or carry text an attacker chose."""
    from tests.backends.nftables.helpers import endpoint, port, service, slice_

    lb = {"type": "LoadBalancer", "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}
    http = port("http", 80)
    objs = [
        service("default", "everyone", "10.96.200.1", http, loadBalancerSourceRanges=["0.0.0.0/0"], **lb),
        slice_("default", "everyone", [endpoint("10.244.200.1")], ("http", 8080, "TCP")),
        service("default", "overlapping", "10.96.200.2", http, loadBalancerSourceRanges=["10.0.0.0/8", "10.1.0.0/16"],
                **{**lb, "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.8"}]}}}),
        slice_("default", "overlapping", [endpoint("10.244.200.2")], ("http", 8080, "TCP")),
        service("n" * 63, "s" * 63, "10.96.200.3", port("p" * 15, 80)),
        slice_("n" * 63, "s" * 63, [endpoint("10.244.200.3")], ("p" * 15, 8080, "TCP")),
        # Quotes, a newline and nft syntax in an annotation: refused with a warning, never nft text.
        service("default", "quoted", "10.96.200.4", port("dns", 53, "UDP"),
                annotations={"kubeproxy.io/udp-conntrack-timeout": '30s" ;\nflush ruleset'}),
        slice_("default", "quoted", [endpoint("10.244.200.4")], ("dns", 5353, "UDP")),
    ]
    return objs


@root
@needs_root
def test_kernel_hostile_but_valid_services_stream_in_with_every_other() -> None:
    """A cold table big enough for the real stream (chunks of STREAM_CHUNK operations, each
    written whole into its nft's 1 MiB pipe) with hostile-but-valid Services among 2,000 others:
    it loads whole, equal to the same table sent serially, and the namespace's other table stays."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from render import cluster as bench_cluster  # bench/render.py's generator

    objs = [*bench_cluster(2000, 10), *_hostile_but_valid()]
    v = view(objs)
    r = render(v, options())
    assert any("quoted" in w and "udp-conntrack-timeout" in w for w in r.warnings)
    with L.netns("kpstream") as ns, L.netns("kpstream") as ref:
        for n in (ns, ref):
            n.run(["nft", "add", "table", "ip", "host-own"])
            n.run(["nft", "add", "chain", "ip", "host-own", "input", "{ type filter hook input priority 0 ; }"])
        streamed = NftApplier("ip", ns).apply(r)
        assert streamed.mode == "create" and streamed.chunks >= 3 and streamed.operations > apply_mod.STREAM_MIN_OPERATIONS
        serial = NftApplier("ip", ref.run, stream_min_operations=None, chunk_size=10**9).apply(r)
        assert serial.chunks == 1
        listing = ["nft", "-j", "list", "table", "ip", "kube-proxy"]
        got = canonical(ns.run(listing).stdout)
        assert got == canonical(ref.run(listing).stdout)
        ruleset = ns.run(["nft", "list", "ruleset"]).stdout
        for text in ("198.51.100.7", "198.51.100.8", "10.244.200.3 . 8080", "10.244.200.4 . 5353", "10.96.7.250"):
            assert text in ruleset, text
        assert "table ip host-own" in ruleset and "flush" not in ruleset
