"""`paused_gc()`: no cyclic garbage collection while a bulk decode allocates its objects.

Decoding 20k objects allocates about a million dicts, lists and objects, none of them garbage;
the collector, triggered every 700 allocations, walks the young ones each time and now and then
the whole heap: a third to a half of the decode time (measured in bench/decode.py). Reference
counting still frees everything as usual; only cycle detection waits until the block ends.

`paused_gc(freeze=True)` also ends the block with `gc.freeze()`: the objects the block made and
kept (400k at 10k services) all sit in the youngest generation when it ends, so the very next
young collection would walk every one of them (0.1 s) to find no garbage; frozen, they are in the
permanent generation, which no collection walks. They are still freed by reference counting when
the state drops them (a relist, a deletion, the process ending); only a reference cycle among
frozen objects would never be freed, and the model objects form none (tests/cluster/
test_bulk_freeze.py collects after dropping a whole state and finds nothing). So that no other
code's garbage is frozen with them, the block starts with a collection of the unfrozen heap
(2 ms after the imports; what an earlier freeze moved out is not walked again), unless an
outer block has paused the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc(*, freeze: bool = False) -> Iterator[None]:
    """Disable the cyclic collector inside the block, if it was enabled; restore it after.

    For bulk work that makes 100k+ small objects none of which can form a cycle (decoding
    objects, rendering nftables elements): each full collection would scan them all (at 10k
    services it took two thirds of a render). Reference counting frees memory as usual meanwhile.

    `freeze`: for blocks whose objects outlive them (a decoded state): collect first, then
    freeze everything alive when the block ends without an exception (see the module docstring).
    """
    # Nested or concurrent blocks: only the one that disabled it enables it again, so a block
    # may run with the collector on (slower), never leave it off.
    was_enabled = gc.isenabled()
    if freeze and was_enabled:
        # Not inside an outer pause (`kubeproxy render`, the proxy's cold start): its owner
        # decided when to collect, and freezes or exits soon after.
        gc.collect()
    gc.disable()
    try:
        yield
        if freeze:
            gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
