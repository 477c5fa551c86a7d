#!/usr/bin/env python3
"""A longer hostile-API campaign than CI's: the real `kube-proxy` against a seeded hostile API server.

Usage: .venv/bin/python bench/fuzz_api.py [--cases 20] [--first-seed 100] [--faults 40] [--seconds 1800]

Each case (tests/sources/api_campaign.py) runs kube-proxy in a fresh namespace (needs root), in
iptables and nftables mode by turns, while the server answers a share of its requests with
faults; it checks that the process never exits, never loses a programmed rule, and programs
exactly the server's Services once the server is sane. Prints a table: cases run, hostile
answers served, failures, Services added meanwhile, the highest peak RSS of kube-proxy and the
longest time to converge; then how often each fault was served. Stops at the first failure and
prints it (the seed and mode reproduce it: `run_case(seed, mode, ...)`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sources.api_campaign import Case, run_case  # noqa: E402

MODES = ("iptables", "nftables")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--faults", type=int, default=40, help="hostile answers served per case")
    parser.add_argument("--seconds", type=float, default=1800, help="stop after this long, whatever --cases says")
    args = parser.parse_args()
    started = time.perf_counter()
    cases: list[Case] = []
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.cases):
            if time.perf_counter() - started > args.seconds:
                break
            mode = MODES[seed % 2]
            try:
                cases.append(run_case(seed, mode, faults=args.faults, log=Path(tmp) / f"kube-proxy-{seed}.log"))
            except AssertionError as exc:
                failures += 1
                print(f"FAILED seed {seed} {mode}: {exc}")
                break
    served: Counter[str] = Counter()
    for case in cases:
        served.update(case.served)
    elapsed = time.perf_counter() - started
    header = ("cases", "hostile answers", "failures", "Services added", "peak RSS MiB", "converged ≤ s", "minutes")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (6, 16, 9, 15, 13, 14, 8), strict=True)))
    print(
        f"{len(cases):>6} {sum(served.values()):>16} {failures:>9} {sum(c.added for c in cases):>15}"
        f" {max((c.peak_rss_mib for c in cases), default=0):>13.1f} {max((c.converged_seconds for c in cases), default=0):>14.1f}"
        f" {elapsed / 60:>8.1f}"
    )
    print()
    print(f"{'fault':<18} {'served':>7}")
    for fault, count in sorted(served.items(), key=lambda kv: -kv[1]):
        print(f"{fault:<18} {count:>7}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
