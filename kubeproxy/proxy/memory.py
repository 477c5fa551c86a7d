"""Give the C heap's free memory back to the operating system (glibc's `malloc_trim`).

The cold start decodes and renders the whole cluster at once: its transient peak (the raw
objects, the rendered text, the restore input) is freed once the first sync is over, but glibc
keeps the freed pages of its heap mapped, so the process's RSS stays near the peak for ever.
`malloc_trim(0)` returns the free pages (also those in the middle of the heap, since glibc 2.8)
to the kernel. Where the C library has no `malloc_trim` (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

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
