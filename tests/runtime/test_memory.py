"""release_free_memory: glibc's malloc_trim after the cold start, a no-op where it is missing."""

from __future__ import annotations

import pytest

from kubeproxy.runtime import memory


def test_reports_the_drop_of_the_resident_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    readings = iter([100 << 20, 40 << 20])
    monkeypatch.setattr(memory, "_resident_bytes", lambda: next(readings))

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    assert memory.release_free_memory(trim) == 60 << 20
    assert calls == [0]  # pad 0: keep nothing spare at the top of the heap


def test_never_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([40 << 20, 41 << 20])  # another thread allocated meanwhile
    monkeypatch.setattr(memory, "_resident_bytes", lambda: next(readings))
    assert memory.release_free_memory(lambda pad: 0) == 0


def test_no_op_without_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "find_malloc_trim", lambda: None)
    monkeypatch.setattr(memory, "_resident_bytes", lambda: pytest.fail("nothing to measure without a trim"))
    assert memory.release_free_memory() == 0


def test_resident_bytes_is_this_process() -> None:
    held = bytearray(64 << 20)  # touched (zeroed) pages: resident
    assert memory._resident_bytes() >= len(held)


def test_gives_back_freed_pages_in_the_middle_of_the_heap() -> None:
    """The cold start's case: most of a large heap freed, a few live objects between the holes,
    so free() alone cannot shrink it (it only returns the top of the heap)."""
    if memory.find_malloc_trim() is None:
        pytest.skip("this C library has no malloc_trim (not glibc)")
    chunks = [bytes(1000) for _ in range(100_000)]  # above pymalloc's 512 bytes: glibc's heap
    kept = chunks[::50]
    del chunks
    released = memory.release_free_memory()
    assert released > 32 << 20, released  # ~95 MiB freed; most of it in whole pages between kept ones
    assert len(kept) == 2000
