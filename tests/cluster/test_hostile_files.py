"""Hostile manifest files are refused at load time with an error naming them, and never take the
process down; one bad object never costs the other objects of its file (items 5 and 6)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.cluster import manifests
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.manifests import MAX_DEPTH, parse_documents
from kubeproxy.sources.events import WatchEvent
from kubeproxy.sources.files import FileSource

pytestmark = pytest.mark.timeout(60)


def svc(name: str, namespace: Any = "default", port: int = 80) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": f"10.96.0.{port % 250 + 1}", "ports": [{"port": port}]},
    }


def alias_bomb(levels: int = 9) -> str:
    """The billion laughs: under 1 KB of YAML, 9**9 (387 million) strings once expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in itertools.pairwise("abcdefghijklmnop"[:levels]):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    body = "\n".join("  " + line for line in lines)
    return f"apiVersion: v1\nkind: Service\nmetadata: {{name: bomb, namespace: default}}\nspec:\n{body}\n"


def nested_json(levels: int) -> str:
    return json.dumps(svc("deep"))[:-1] + ', "x": ' + "[" * levels + "]" * levels + "}"


HOSTILE = {
    "json 5000 levels": (nested_json(5000), f"nested more than {MAX_DEPTH} levels deep"),
    "json 500 levels": (nested_json(500), f"nested more than {MAX_DEPTH} levels deep"),  # parses, then walks would recurse
    "json 101 levels": (nested_json(MAX_DEPTH), f"nested more than {MAX_DEPTH} levels deep"),
    "yaml flow 5000 levels": ("kind: Service\nx: " + "[" * 5000 + "]" * 5000 + "\n", "exceeded maximum nesting depth"),
    "yaml block 2000 levels": ("kind: Service\n" + "".join(" " * i + f"k{i}:\n" for i in range(2000)), "nesting depth"),
    "yaml 150 levels": ("kind: Service\nx: " + "[" * 150 + "]" * 150 + "\n", f"nested more than {MAX_DEPTH} levels deep"),
    "alias bomb": (alias_bomb(), "YAML aliases expand it to more than 100,000 values"),
    "alias bomb in a list": ("kind: List\nitems:\n- " + alias_bomb().replace("\n", "\n  "), "YAML aliases expand"),
    "recursive alias": ("kind: Service\nmetadata: &m {name: x, self: *m}\n", "refers to a map or list that contains it"),
}


@pytest.mark.parametrize(("text", "problem"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_text_is_refused_with_a_clear_error(text: str, problem: str) -> None:
    with pytest.raises(ManifestError, match=r"^hostile\.yaml") as caught:
        list(parse_documents(text, "hostile.yaml"))
    assert problem in str(caught.value)


def test_the_alias_bomb_is_refused_without_expanding_it() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match="YAML aliases expand"):
            list(parse_documents(alias_bomb(), "bomb.yaml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20  # expanded, it is 387 million strings: gigabytes


def test_what_real_objects_do_is_accepted() -> None:
    # Anchors shared between fields (selector = labels), 100 levels exactly, and a big List.
    shared = "kind: Service\nmetadata: {name: a, labels: &l {app: a}}\nspec: {selector: *l, ports: [{port: 80}]}\n"
    assert [r.obj["spec"]["selector"] for r in parse_documents(shared, "x.yaml")] == [{"app": "a"}]
    assert list(parse_documents(nested_json(MAX_DEPTH - 2), "x.json"))
    items = [svc(f"s{i}", port=i % 60000 + 1) for i in range(20000)]
    assert len(list(parse_documents(yaml.safe_dump({"kind": "List", "items": items[:2000]}), "l.yaml"))) == 2000
    assert len(list(parse_documents(json.dumps({"kind": "List", "items": items}), "l.json"))) == 20000


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(svc("a")) + "#" * 2000)
    monkeypatch.setattr(manifests, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ManifestError, match=r"big\.yaml: bigger than 1,000 bytes, the limit for one manifest file"):
        manifests.read_text(big)


def test_a_small_file_is_read_without_a_buffer_the_size_of_the_limit(tmp_path: Path) -> None:
    # `read(limit + 1)` allocated the whole limit (128 MiB) up front, on every re-read
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(svc("a")))
    tracemalloc.start()
    try:
        text = manifests.read_text(small)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == small.read_text()
    assert peak < 1 << 20, peak


def test_a_file_that_grows_past_its_size_is_read_to_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grown = tmp_path / "grown.yaml"
    grown.write_text("a" * 10)
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> object:  # the size as it was before a writer appended
        st = real_fstat(fd)
        return type("Stat", (), {"st_size": st.st_size - 6})()

    monkeypatch.setattr(os, "fstat", stale_fstat)  # manifests calls it through the os module
    assert manifests.read_text(grown) == "a" * 10


def test_render_skips_the_hostile_file_and_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / "a-bomb.yaml").write_text(alias_bomb())
    (tmp_path / "b-deep.json").write_text(nested_json(5000))
    (tmp_path / "c-good.yaml").write_text(yaml.safe_dump(svc("good")))
    result = CliRunner().invoke(main, ["render", "--manifests", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'a-bomb.yaml'}: YAML aliases expand it to more than" in result.stderr
    assert f"{tmp_path / 'b-deep.json'}: nested more than {MAX_DEPTH} levels deep" in result.stderr
    assert "Traceback" not in result.output and "default/good" in result.stdout


def test_render_skips_one_bad_object_and_keeps_the_rest_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "svcs.yaml"
    path.write_text(yaml.safe_dump_all([svc("a"), svc("b", namespace=5, port=81), svc("c", port=82)]))
    result = CliRunner().invoke(main, ["render", "--manifests", str(path)])
    assert result.exit_code == 0, result.output
    assert "skipping Service b: metadata.namespace: expected a string, got int 5" in result.stderr
    assert "default/a" in result.stdout and "default/c" in result.stdout


# --- the live source: `kubeproxy run --manifests` --------------------------------------------


@contextlib.asynccontextmanager
async def following(*paths: Path) -> AsyncIterator[tuple[FileSource, asyncio.Queue[WatchEvent]]]:
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
    source = FileSource(paths, queue.put_nowait, interval=3600.0)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.wait_synced(), 30)
        yield source, queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def drain(queue: asyncio.Queue[WatchEvent]) -> list[str]:
    out = []
    while not queue.empty():
        out.append(str(queue.get_nowait()))
    return sorted(out)


def test_source_skips_one_bad_object_and_delivers_the_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "svcs.yaml"
    path.write_text(yaml.safe_dump_all([svc("a"), svc("b", namespace=5), {"metadata": {"name": "x"}}, svc("c")]))

    async def scenario() -> None:
        async with following(path) as (source, queue):
            assert drain(queue) == ["ADDED Service default/a", "ADDED Service default/c"]
            warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
            assert f"{path}#2: skipping Service b: metadata.namespace: expected a string, got int 5" in warned
            assert f"{path}#3: skipping a document without kind" in warned
            assert list(source.broken) == [str(path)]
            # Fixed: the object arrives, and the file is whole again.
            path.write_text(yaml.safe_dump_all([svc("a"), svc("b"), svc("c")]))
            await source.check()
            assert drain(queue) == ["ADDED Service default/b"]
            assert source.broken == {}
            # Broken again by an edit: b stays (the bad document may be its new text), a is updated.
            path.write_text(yaml.safe_dump_all([svc("a", port=8080), svc("b", namespace=["x"]), svc("c")]))
            await source.check()
            assert drain(queue) == ["MODIFIED Service default/a"]

    asyncio.run(scenario())


def test_source_refuses_a_hostile_file_and_keeps_every_other_object(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text(yaml.safe_dump(svc("good")))
    hostile = tmp_path / "b.yaml"
    hostile.write_text(yaml.safe_dump(svc("victim")))

    async def scenario() -> None:
        async with following(tmp_path) as (source, queue):
            assert drain(queue) == ["ADDED Service default/good", "ADDED Service default/victim"]
            for text, problem in (
                (alias_bomb(), "YAML aliases expand"),
                (nested_json(5000), "nested more than"),
                (nested_json(500), "nested more than"),
            ):
                hostile.write_text(text)
                assert await source.check() == []  # the last good objects of the file stay
                assert problem in source.broken[str(hostile)]
            (tmp_path / "c.json").write_text(nested_json(5000))  # hostile from the start: nothing, no crash
            assert await source.check() == []
            assert set(source.broken) == {str(hostile), str(tmp_path / "c.json")}

    asyncio.run(scenario())
