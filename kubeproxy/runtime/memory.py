"""The memory of a process the proxy owns, around its cold start: the garbage collector and
the C heap's free pages.

`ColdStartHeap` (used when the proxy owns its process: `run_until_signalled`): the cold start
makes a million long-lived objects (20k parsed objects, the view, the render caches) and no
garbage worth collecting, so the cyclic collector is paused until the first sync is over (as
`cluster.bulk` does for one decode), and then `gc.freeze()` moves everything alive to the
permanent generation: a later collection walks only what changed since, not the million
objects again (a full collection at 10k services took 0.2-0.5 s, paid by whichever change was
waiting). The price: a reference cycle that was already garbage at that moment (a few asyncio
and HTTP objects of the start-up) is frozen with the rest and never freed, once; collecting
first would cost the full walk this avoids. Objects frozen and dropped later are freed by
reference counting.

`release_free_memory` gives the C heap's free memory back to the operating system (glibc's
`malloc_trim`). The cold start decodes and renders the whole cluster at once: its transient peak (the raw
objects, the rendered text, the restore input) is freed once the first sync is over, but glibc
keeps the freed pages of its heap mapped, so the process's RSS stays near the peak for ever.
`malloc_trim(0)` returns the free pages (also those in the middle of the heap, since glibc 2.8)
to the kernel. Where the C library has no `malloc_trim` (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.proxy")

_STATM = "/proc/self/statm"


def _resident_bytes() -> int:
    """The process's resident set (0 where /proc is missing: the release is then reported as 0)."""
    try:
        with open(_STATM, encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    fn: Callable[[int], int] = trim
    return fn


def release_free_memory(trim: Callable[[int], int] | None = None) -> int:
    """Return the C heap's free pages to the kernel; the bytes by which the RSS went down (>= 0).

    `trim` is glibc's malloc_trim by default (looked up on each call: this runs once after the
    first sync, not on a hot path); pass another for tests. A no-op returning 0 where it is missing.
    """
    if trim is None:
        trim = find_malloc_trim()
    if trim is None:
        return 0
    before = _resident_bytes()
    trim(0)
    return max(0, before - _resident_bytes())


@dataclass
class ColdStartHeap:
    """The collector paused for the cold start, then frozen and resumed (see the module doc)."""

    paused: bool = False

    def pause(self) -> None:
        # Whoever turned the collector off before (the start-up's imports, cli.py), it stays off
        # until the first sync is over and then goes on.
        gc.disable()
        self.paused = True

    def settle(self) -> None:
        """After the first sync (successful or not: a collector paused while syncs keep failing
        would let their garbage pile up): freeze what the cold start made, collect as usual, and
        give the pages the cold start's peak freed back to the kernel (bench/memory.py --trim)."""
        if self.paused:
            self.paused = False
            gc.freeze()
            gc.enable()
            log.info(kv("Returned freed heap memory to the system", bytes=release_free_memory()))

    def resume(self) -> None:
        """Stopped before the first sync: the collector goes on, nothing frozen."""
        if self.paused:
            self.paused = False
            gc.enable()
