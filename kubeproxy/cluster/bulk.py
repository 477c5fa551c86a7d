"""`paused_gc()`: no cyclic garbage collection while a bulk decode allocates its objects.

Decoding 20k objects allocates about a million dicts, lists and objects, none of them garbage;
the collector, triggered every 700 allocations, walks the young ones each time and now and then
the whole heap: a third to a half of the decode time (measured in bench/decode.py). Reference
counting still frees everything as usual; only cycle detection waits until the block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block, if it was enabled; restore it after.

    For bulk work that makes 100k+ small objects none of which can form a cycle (decoding
    objects, rendering nftables elements): each full collection would scan them all (at 10k
    services it took two thirds of a render). Reference counting frees memory as usual meanwhile.
    """
    # Nested or concurrent blocks: only the one that disabled it enables it again, so a block
    # may run with the collector on (slower), never leave it off.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
