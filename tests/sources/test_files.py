"""The manifest-file source against real files: first pass, edits, removals, bad saves, duplicates, scale."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.cluster import manifests
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.lab import builders
from kubeproxy.sources import files
from kubeproxy.sources.events import WatchEvent
from kubeproxy.sources.files import FileSource

pytestmark = pytest.mark.timeout(90)

Events = asyncio.Queue[WatchEvent]


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def svc(name: str, port: int = 80, ns: str | None = "default") -> dict[str, Any]:
    """A Service; `ns=None` leaves the namespace out, as a hand-written manifest may."""
    obj = builders.service(name, "", [builders.Port("", port, port)])
    if ns is None:
        del obj["metadata"]["namespace"]
    else:
        obj["metadata"]["namespace"] = ns
    return obj


def body(event: WatchEvent) -> dict[str, Any]:
    """The event's object: this source delivers plain dicts."""
    assert isinstance(event.obj, dict)
    return event.obj


def _half(text: str) -> str:
    """Cut inside the second document's mapping, where a YAML parser fails."""
    second = text.index("---")
    return text[: text.index("\n  ", second) + 3] + "[: "


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def write(path: Path, *objs: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    return path


@contextlib.asynccontextmanager
async def following(
    *paths: Path, interval: float = 3600.0, sink: Callable[[WatchEvent], None] | None = None
) -> AsyncIterator[tuple[FileSource, Events]]:
    """A running source, synced. With the default interval only `check()` and `poke()` make it look again."""
    queue: Events = asyncio.Queue()
    source = FileSource(paths, sink or queue.put_nowait, interval=interval)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.wait_synced(), 30)
        yield source, queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def drain(queue: Events) -> list[WatchEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def changes(source: FileSource, queue: Events) -> list[str]:
    """One look at the files: what it delivered to the sink (and returned: the same list)."""
    returned = await source.check()
    delivered = drain(queue)
    assert delivered == returned
    return sorted(str(e) for e in delivered)


async def next_event(queue: Events) -> WatchEvent:
    return await asyncio.wait_for(queue.get(), 10)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kubeproxy.sources.files" and r.levelno >= logging.WARNING]


def test_first_pass_delivers_every_object_as_added_then_synced(tmp_path: Path) -> None:
    folder = tmp_path / "cluster"
    write(folder / "a.yaml", svc("web"), svc("db", ns="data"), node("node-1"))
    write(folder / "sub" / "b.yml", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}})
    slice_list = {
        "apiVersion": "v1",
        "kind": "EndpointSliceList",
        "items": [{"metadata": {"name": "web-abc", "namespace": "default"}, "addressType": "IPv4", "endpoints": []}],
    }
    (folder / "c.json").write_text(json.dumps(slice_list))
    (folder / "notes.txt").write_text("kind: Service\nmetadata: {name: not-a-manifest}\n")
    extra = write(tmp_path / "extra.yaml", svc("api", ns=None))
    seen_synced: list[bool] = []

    async def main() -> None:
        queue: Events = asyncio.Queue()

        def sink(event: WatchEvent) -> None:
            seen_synced.append(source.synced)
            queue.put_nowait(event)

        source = FileSource([folder, extra], sink)
        assert not source.synced
        task = asyncio.create_task(source.run())
        await asyncio.wait_for(source.wait_synced(), 30)
        events = drain(queue)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert sorted(str(e) for e in events) == [
            "ADDED EndpointSlice default/web-abc",
            "ADDED Node node-1",
            "ADDED Service data/db",
            "ADDED Service default/api",  # no namespace in the file: "default", as kubectl would put it
            "ADDED Service default/web",
        ]
        by_name = {e.name: e for e in events}
        assert by_name["web"].obj == svc("web")
        # A list item without kind or apiVersion gets both, as the API source's objects always have them.
        assert body(by_name["web-abc"])["kind"] == "EndpointSlice"
        assert body(by_name["web-abc"])["apiVersion"] == "discovery.k8s.io/v1"
        assert source.synced and source.broken == {}

    run(main())
    assert seen_synced == [False] * 5  # synced only once every object is delivered


def test_one_changed_object_is_one_modified(tmp_path: Path) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"), svc("b"), svc("c"))

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            write(path, svc("a"), svc("b", port=8080), svc("c"))
            returned = await source.check()
            assert [str(e) for e in returned] == ["MODIFIED Service default/b"]
            assert body(returned[0])["spec"]["ports"][0]["port"] == 8080
            assert drain(queue) == returned
            assert await changes(source, queue) == []  # and nothing more on the next look

    run(main())


def test_object_removed_from_a_file_is_deleted_with_its_last_state(tmp_path: Path) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"), svc("b", port=81))

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            write(path, svc("a"))
            returned = await source.check()
            assert [str(e) for e in returned] == ["DELETED Service default/b"]
            assert returned[0].obj == svc("b", port=81)

    run(main())


def test_removed_file_deletes_all_its_objects_and_comes_back(tmp_path: Path) -> None:
    keep = write(tmp_path / "d" / "keep.yaml", svc("keep"))
    gone = write(tmp_path / "d" / "gone.yaml", svc("x"), svc("y"), node("n1"))
    single = write(tmp_path / "single.yaml", svc("s"))

    async def main() -> None:
        async with following(keep.parent, single) as (source, queue):
            drain(queue)
            gone.unlink()
            single.unlink()  # a PATH given by name that disappears: its objects go too, no error
            assert await changes(source, queue) == [
                "DELETED Node n1",
                "DELETED Service default/s",
                "DELETED Service default/x",
                "DELETED Service default/y",
            ]
            write(single, svc("s"))
            assert await changes(source, queue) == ["ADDED Service default/s"]

    run(main())


def test_folder_that_becomes_empty_is_just_empty(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    path = write(folder / "a.yaml", svc("a"))

    async def main() -> None:
        async with following(folder) as (source, queue):
            drain(queue)
            path.unlink()
            assert await changes(source, queue) == ["DELETED Service default/a"]
            assert await changes(source, queue) == []
            folder.rmdir()  # even the folder itself: nothing to read is not an error
            assert await changes(source, queue) == []
            write(folder / "new.yaml", svc("b"))
            assert await changes(source, queue) == ["ADDED Service default/b"]

    run(main())


def test_new_files_in_a_folder_are_added(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    write(folder / "a.yaml", svc("a"))

    async def main() -> None:
        async with following(folder) as (source, queue):
            drain(queue)
            write(folder / "deeper" / "b.json", svc("b"))
            (folder / "c.yaml.swp").write_text("editor junk")
            assert await changes(source, queue) == ["ADDED Service default/b"]

    run(main())


BAD_SAVES = {
    "invalid YAML": "kind: Service\nmetadata: {name: a\n",
    "half written": _half(yaml.safe_dump_all([svc("a"), svc("b")])),
    "no kind": yaml.safe_dump_all([svc("a"), {"metadata": {"name": "b"}}]),
    "no name": yaml.safe_dump_all([svc("a"), {"apiVersion": "v1", "kind": "Service", "metadata": {}}]),
    "not an object": yaml.safe_dump_all([svc("a"), ["a", "list"]]),
}


@pytest.mark.parametrize("bad", BAD_SAVES.values(), ids=BAD_SAVES.keys())
def test_bad_save_keeps_the_objects_and_the_fix_gives_only_the_differences(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"), svc("b"), svc("c"))
    caplog.set_level(logging.INFO, logger="kubeproxy.sources.files")

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            path.write_text(bad)
            assert await changes(source, queue) == []
            assert list(source.broken) == [str(path)]
            assert len(warnings := warnings_of(caplog)) == 1 and str(path) in warnings[0]
            assert "keeping the 3 objects" in warnings[0]
            path.write_text(bad)  # saved again, still broken: no second warning
            assert await changes(source, queue) == []
            assert len(warnings_of(caplog)) == 1
            write(path, svc("a"), svc("b", port=8080))
            assert await changes(source, queue) == ["DELETED Service default/c", "MODIFIED Service default/b"]
            assert source.broken == {}

    run(main())


def test_file_broken_from_the_start_gives_nothing_until_fixed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = write(tmp_path / "good.yaml", svc("a"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [Service\n")

    async def main() -> None:
        async with following(good, bad) as (source, queue):
            assert sorted(str(e) for e in drain(queue)) == ["ADDED Service default/a"]
            assert f"{bad}:2" in warnings_of(caplog)[0]  # the file and the line
            write(bad, svc("b"))
            assert await changes(source, queue) == ["ADDED Service default/b"]

    run(main())


def test_same_object_in_two_files_the_later_wins_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = write(tmp_path / "d" / "a.yaml", svc("web", port=1, ns=None))  # no namespace: "default"
    second = write(tmp_path / "d" / "b.yaml", svc("web", port=2))

    async def main() -> None:
        async with following(first.parent) as (source, queue):
            events = drain(queue)
            assert [str(e) for e in events] == ["ADDED Service default/web"]
            assert body(events[0])["spec"]["ports"][0]["port"] == 2
            [warning] = warnings_of(caplog)
            assert str(first) in warning and str(second) in warning and "Service default/web" in warning
            assert await changes(source, queue) == []
            assert len(warnings_of(caplog)) == 1  # once, not at every look
            second.unlink()
            returned = await source.check()
            assert [str(e) for e in returned] == ["MODIFIED Service default/web"]
            assert body(returned[0])["spec"]["ports"][0]["port"] == 1

    run(main())


def test_same_object_twice_in_one_file_the_later_document_wins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "svc.yaml", svc("web", port=1), svc("web", port=2))

    async def main() -> None:
        async with following(path) as (_, queue):
            [event] = drain(queue)
            assert body(event)["spec"]["ports"][0]["port"] == 2
            [warning] = warnings_of(caplog)
            assert f"{path}#1" in warning and f"{path}#2" in warning

    run(main())


def test_kind_list_documents(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"

    def save(port: int) -> None:
        bare = {"metadata": {"name": "c", "namespace": "default"}, "spec": {}}  # as a ServiceList holds them
        write(
            path,
            {"apiVersion": "v1", "kind": "List", "items": [svc("a"), svc("b", port=port)]},
            {"kind": "ServiceList", "items": [bare]},
        )

    save(80)
    by_name: dict[str, WatchEvent] = {}

    async def main() -> None:
        async with following(path) as (source, queue):
            first = drain(queue)
            by_name.update((e.name, e) for e in first)
            assert sorted(str(e) for e in first) == [
                "ADDED Service default/a",
                "ADDED Service default/b",
                "ADDED Service default/c",
            ]
            save(90)
            assert await changes(source, queue) == ["MODIFIED Service default/b"]
        assert {"kind": "Service", "apiVersion": "v1"}.items() <= body(by_name["c"]).items()

    run(main())


def test_missing_path_is_an_error_when_the_source_is_built(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", svc("a"))
    with pytest.raises(ManifestError, match=r"nope\.yaml: no such file or folder"):
        FileSource([tmp_path, tmp_path / "nope.yaml"], lambda e: None)
    with pytest.raises(ManifestError, match="standard input cannot be watched"):
        FileSource(["-"], lambda e: None)


def test_touched_file_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"))
    parsed: list[str] = []
    real = manifests.parse_documents

    def counting(text: str, source: str) -> Any:
        parsed.append(source)
        return real(text, source)

    monkeypatch.setattr(files, "parse_documents", counting)

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            assert parsed == [str(path)]
            os.utime(path)
            assert await changes(source, queue) == []
            assert parsed == [str(path)]

    run(main())


def test_same_size_saves_in_quick_succession_are_all_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves within one tick of the file clock leave the same stat; the racy-mtime re-read catches them.

    Recent kernels hand out fine-grained times to files whose times were just looked at, so the
    test makes the clock coarse itself: whole seconds, as on filesystems with 1 s timestamps.
    """
    real = files._Stat.of

    def whole_seconds(cls: type[files._Stat], path: Path) -> files._Stat:
        st = real(path)
        return dataclasses.replace(st, mtime_ns=st.mtime_ns // 10**9 * 10**9, ctime_ns=st.ctime_ns // 10**9 * 10**9)

    monkeypatch.setattr(files._Stat, "of", classmethod(whole_seconds))
    path = write(tmp_path / "svc.yaml", svc("a", port=10))

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            for port in range(11, 31):
                write(path, svc("a", port=port))
                returned = await source.check()
                assert [(str(e), body(e)["spec"]["ports"][0]["port"]) for e in returned] == [("MODIFIED Service default/a", port)]

    run(main())


def test_a_file_that_changes_while_it_is_read_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"), svc("b"))
    real = manifests.read_text
    torn: list[str] = []

    def racing_writer(p: Path, **kwargs: Any) -> str:
        text = real(p, **kwargs)
        if not torn:  # the first read sees half a save, and the writer is still at it
            torn.append(text[: text.index("---")])
            with p.open("a") as f:
                f.write("# the rest of the save\n")
            return torn[0]
        return text

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            write(path, svc("a"), svc("b"), svc("c"))
            monkeypatch.setattr(files, "read_text", racing_writer)
            assert await changes(source, queue) == []  # not "DELETED b": the torn text is never used
            assert await changes(source, queue) == ["ADDED Service default/c"]
            assert torn and "name: b" not in torn[0]

    run(main())


def test_files_that_cannot_be_listed_keep_their_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "d" / "a.yaml", svc("a"))

    def denied(paths: Any) -> list[Path]:
        raise PermissionError(13, "Permission denied", str(path.parent))

    async def main() -> None:
        async with following(path.parent) as (source, queue):
            drain(queue)
            assert source.connected
            with monkeypatch.context() as m:
                m.setattr(files, "manifest_files", denied)
                assert await changes(source, queue) == []  # not "DELETED a"
                assert await changes(source, queue) == []
                assert not source.connected
            [warning] = warnings_of(caplog)  # once per outage, not at every look
            assert f"{path.parent}: Permission denied" in warning
            write(path, svc("a", port=81))
            assert await changes(source, queue) == ["MODIFIED Service default/a"]
            assert source.connected

    run(main())


def test_run_polls_by_itself(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    path = write(folder / "a.yaml", svc("a"))

    async def main() -> None:
        async with following(folder, interval=0.02) as (_, queue):
            drain(queue)
            write(path, svc("a", port=81))
            assert str(await next_event(queue)) == "MODIFIED Service default/a"
            write(folder / "b.yaml", svc("b"))
            assert str(await next_event(queue)) == "ADDED Service default/b"

    run(main())


def test_poke_looks_at_once(tmp_path: Path) -> None:
    path = write(tmp_path / "a.yaml", svc("a"))

    async def main() -> None:
        async with following(path) as (source, queue):  # an hour between polls: only the poke can do it
            drain(queue)
            write(path, svc("a", port=81))
            source.poke()
            assert str(await next_event(queue)) == "MODIFIED Service default/a"

    run(main())


def test_a_failing_consumer_does_not_stop_the_source(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "a.yaml", svc("a"), svc("b"))
    got: list[str] = []

    def sink(event: WatchEvent) -> None:
        if event.name == "a":
            raise RuntimeError("consumer bug")
        got.append(str(event))

    async def main() -> None:
        async with following(path, sink=sink) as (source, _):
            write(path, svc("a", port=1), svc("b", port=1))
            await source.check()

    run(main())
    assert got == ["ADDED Service default/b", "MODIFIED Service default/b"]
    assert any("consumer bug" in r.getMessage() for r in caplog.records)


def service_yaml(i: int, port: int = 80) -> str:
    return f"---\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: default\nspec:\n  ports:\n  - port: {port}\n"


def test_one_change_in_a_10k_object_file_is_one_event(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("".join(service_yaml(i) for i in range(10_000)))

    async def main() -> None:
        async with following(path) as (source, queue):
            assert queue.qsize() == 10_000
            drain(queue)
            path.write_text("".join(service_yaml(i, 8080 if i == 4242 else 80) for i in range(10_000)))
            assert await changes(source, queue) == ["MODIFIED Service default/svc-4242"]

    run(main())


def test_a_batch_sink_gets_each_round_in_one_call(tmp_path: Path) -> None:
    """A consumer that takes batches gets the first pass in one call, a later edit in another,
    and nothing through the per-event sink."""
    folder = tmp_path / "cluster"
    write(folder / "a.yaml", svc("a"), svc("b"))
    write(folder / "c.yaml", svc("c"))
    batches: list[list[tuple[str, str]]] = []
    singles: list[WatchEvent] = []

    async def main() -> None:
        source = FileSource([folder], singles.append, interval=3600.0,
                            batch_sink=lambda events: batches.append([(e.type, e.name) for e in events]))  # fmt: skip
        task = asyncio.create_task(source.run())
        try:
            await asyncio.wait_for(source.wait_synced(), 30)
            assert batches == [[("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]]
            write(folder / "a.yaml", svc("a", port=81))
            await source.check()
            assert batches[1:] == [[("DELETED", "b"), ("MODIFIED", "a")]]
            await source.check()  # nothing changed: no call at all
            assert len(batches) == 2 and singles == []
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_objects_are_kept_compressed_and_compared_as_before() -> None:
    """Between reads an object is its JSON, compressed against a fixed dictionary: smaller than
    the JSON, decoded back to an equal dict, and equal objects (same key order) give equal bytes,
    so the byte comparison that spares decoding still says "unchanged" exactly when it did."""
    big = svc("web", port=8080) | {"metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}}}
    stored = files._stored(big)
    assert isinstance(stored, bytes) and len(stored) < len(json.dumps(big, separators=(",", ":")))
    assert files._dict(stored) == big
    assert files._stored(json.loads(json.dumps(big))) == stored  # a fresh parse of the same text
    assert files._stored(svc("web", port=8081)) != files._stored(svc("web", port=8080))
    reordered = dict(reversed(list(big.items())))
    assert files._stored(reordered) != stored and files._same(files._stored(reordered), stored)


def test_a_manifest_replaced_by_a_fifo_is_skipped_with_a_warning_and_never_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "svc.yaml", svc("a"), svc("b"))

    async def main() -> None:
        async with following(path) as (source, queue):
            drain(queue)
            path.unlink()
            os.mkfifo(path)  # no writer: a blocking open would wait for one for ever
            assert await changes(source, queue) == []  # its objects stay, as for a bad save
            assert "not a regular file (a FIFO)" in source.broken[str(path)]
            [warning] = warnings_of(caplog)
            assert str(path) in warning and "keeping the 2 objects" in warning
            path.unlink()
            write(path, svc("a"))
            assert await changes(source, queue) == ["DELETED Service default/b"]
            assert source.broken == {}

    run(main())


def test_only_regular_files_are_opened_by_the_watching_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for special, kind in ((fifo, "a FIFO"), (Path("/dev/null"), "a character device")):
        with pytest.raises(ManifestError, match=f"{special}.*not a regular file \\({kind}\\)"):
            manifests.read_text(special, regular_only=True)
    target = write(tmp_path / "real.yaml", svc("a"))
    (tmp_path / "link.yaml").symlink_to(target)  # a mounted ConfigMap's files are symlinks
    assert "name: a" in manifests.read_text(tmp_path / "link.yaml", regular_only=True)
    # Swapped for a FIFO after the stat that saw a regular file: the open does not block and
    # the fstat of what was opened refuses it.
    checks: list[int] = []
    real_check = manifests._require_regular

    def stale_stat(path: Path, mode: int) -> None:
        checks.append(mode)
        if len(checks) > 1:
            real_check(path, mode)

    monkeypatch.setattr(manifests, "_require_regular", stale_stat)
    with pytest.raises(ManifestError, match="a FIFO"):
        manifests.read_text(fifo, regular_only=True)
    assert len(checks) == 2


def test_a_fifo_named_to_an_offline_reader_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    text = yaml.safe_dump(svc("a"))

    def writer() -> None:
        with fifo.open("w") as f:
            f.write(text)

    async def main() -> None:
        written = asyncio.create_task(asyncio.to_thread(writer))
        assert await asyncio.to_thread(manifests.read_text, fifo) == text  # `render --manifests <(kubectl ...)`
        await written

    run(main())
