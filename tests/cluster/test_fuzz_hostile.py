"""A bounded, seeded fuzz campaign in CI: one hostile leaf per random cluster (tests/cluster/hostile.py).

Longer campaigns: `.venv/bin/python bench/fuzz_hostile.py --cases 2000`.
"""

from __future__ import annotations

import pytest

from tests.cluster import hostile

pytestmark = pytest.mark.root
CASES = 60


@pytest.mark.parametrize("block", range(6))
def test_hostile_leaves_never_break_parsing_rendering_or_the_kernel(block: int) -> None:
    per_block = CASES // 6
    warned = sum(hostile.check(hostile.case(seed)) > 0 for seed in range(block * per_block, (block + 1) * per_block))
    # The campaign means something only if many of its objects really were bad.
    assert warned >= 1
