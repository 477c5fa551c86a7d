"""`paused_gc(freeze=True)`: the decoded state goes to the permanent generation.

Frozen objects are never walked by the cyclic collector, so a reference cycle among them would
never be freed: these tests show the model objects form none (dropping a whole state leaves the
collector nothing to find), and that the block collects before it freezes, so garbage made by
other code earlier is not frozen with the state.
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.manifest_load import load
from kubeproxy.cluster.schema import decode_list
from kubeproxy.cluster.state import build_state
from tests.cluster.test_validation_hostile_strings import cluster as hostile_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from render import cluster as bench_cluster  # bench/render.py


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (the frozen objects of a test stay alive
    only as long as they are referenced; unfreezing gives any leftover back to the collector)."""
    gc.unfreeze()
    gc.collect()
    yield
    gc.unfreeze()


def test_a_state_and_its_objects_form_no_cycle(unfrozen: None, tmp_path: Path) -> None:
    objs = [*bench_cluster(50, 4), *hostile_cluster()]
    objs[3]["metadata"]["name"] = "Bad_Name"  # a refused object among them
    state, warnings = build_state(objs)
    assert len(warnings) == 1 and state.services  # the refusal's error makes no cycle either
    assert gc.get_freeze_count() > 0
    loaded = load([_file(tmp_path, objs)])
    assert loaded.state.services == state.services
    alive: list[weakref.ref[Any]] = [weakref.ref(state), weakref.ref(loaded.state), weakref.ref(loaded)]
    del objs, state, loaded
    # Frozen, they were freed by reference counting alone: a cycle would have kept them alive.
    assert [ref() for ref in alive] == [None, None, None]
    gc.unfreeze()
    assert gc.collect() == 0


def test_decoded_list_structs_form_no_cycle(unfrozen: None) -> None:
    items = [{k: v for k, v in o.items() if k != "kind"} for o in bench_cluster(50, 4) if o["kind"] == "EndpointSlice"]
    decoded = decode_list(json.dumps({"kind": "EndpointSliceList", "items": items}).encode())
    assert decoded is not None and len(decoded[1]) == len(items) and gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    del decoded
    # Each struct (and its lists and dicts) left the permanent generation by reference counting.
    assert gc.get_freeze_count() < frozen - 10 * len(items)
    gc.unfreeze()
    assert gc.collect() == 0


def test_the_block_collects_other_garbage_before_it_freezes(unfrozen: None) -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage once the names go
    del a, b
    with paused_gc(freeze=True):
        kept = [Node() for _ in range(10)]
    assert gc.isenabled()
    gc.unfreeze()
    assert gc.collect() == 0, "the cycle was collected before the freeze, not frozen with the block's objects"
    assert len(kept) == 10


def test_an_exception_in_the_block_freezes_nothing(unfrozen: None) -> None:
    with pytest.raises(RuntimeError), paused_gc(freeze=True):
        raise RuntimeError
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def _file(tmp_path: Path, objs: list[dict[str, object]]) -> Path:
    path = tmp_path / "all.json"
    path.write_text(json.dumps({"kind": "List", "items": objs}))
    return path
