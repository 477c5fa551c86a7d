#!/usr/bin/env python3
"""A longer fuzz campaign than CI's: N seeded random clusters with one hostile leaf each (tests/cluster/hostile.py).

Usage: .venv/bin/python bench/fuzz_hostile.py [--cases 2000] [--first-seed 0] [--seconds 600]

Each case is parsed, rendered in both modes and loaded into fresh namespaces (needs root).
Prints a table: cases run, cases with a skipped object (warning), failures, cases per second.
Stops at the first failure and prints it (the seed reproduces it: tests/cluster/hostile.py `case(seed)`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster import hostile  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600, help="stop after this long, whatever --cases says")
    args = parser.parse_args()
    started = time.perf_counter()
    ran = warned = 0
    for seed in range(args.first_seed, args.first_seed + args.cases):
        if time.perf_counter() - started > args.seconds:
            break
        try:
            warned += hostile.check(hostile.case(seed)) > 0
        except AssertionError as exc:
            print(f"FAILED {exc}")
            return 1
        ran += 1
    elapsed = time.perf_counter() - started
    print(f"{'cases':>6} {'skipped an object':>18} {'failures':>9} {'cases/s':>8}")
    print(f"{ran:>6} {warned:>18} {0:>9} {ran / elapsed:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
