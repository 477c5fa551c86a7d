#!/usr/bin/env python3
"""Faults of the real API server, ours against upstream's kube-proxy v1.37.2 in the same cluster.

Usage: .venv/bin/python bench/faults_vs_upstream.py [--faults apiserver-restart,etcd-compacted,...] [--rounds 1]

Needs root and upstream's binaries (scripts/upstream; $KUBEPROXY_UPSTREAM_BIN). One side-by-side
bed (lab/side_by_side.py: upstream's control plane, upstream's kube-proxy on node-a, ours on
node-b, iptables mode) is given each fault of lab/server_faults.py in turn, --rounds times. For
each: the seconds from the end of the fault (for the watch-list rows: from the proxies' start)
until the node's rules hold the Service added around the fault, sampled every 0.1 s; whether a
rule was lost on either node meanwhile; whether the two nodes' rules were equal afterwards.
The times are what the fault and the retry schedules make them (a server asking to wait with
Retry-After, a back-off grown while the server was away), one sample each: spread, not speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubeproxy.lab.control_plane import UPSTREAM_BIN_ENV, UPSTREAM_VERSION, upstream_bin
from kubeproxy.lab.netns import have_root
from kubeproxy.lab.server_faults import FAULTS, FaultBed, FaultResult
from kubeproxy.lab.side_by_side import OURS_NODE, UPSTREAM_NODE


def cell(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def table(results: list[FaultResult]) -> list[str]:
    lines = [f"| {'fault':<17} | {'upstream s':>10} | {'ours s':>6} | {'rules lost':>10} | {'equal after':>11} |",
             f"|{'-' * 19}|{'-' * 12}|{'-' * 8}|{'-' * 12}|{'-' * 13}|"]  # fmt: skip
    for r in results:
        lines.append(f"| {r.name:<17} | {cell(r.seconds[UPSTREAM_NODE]):>10} | {cell(r.seconds[OURS_NODE]):>6} |"
                     f" {len(r.lost):>10} | {'yes' if not r.differences else 'NO':>11} |")  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")
    if not have_root():
        print("needs root: network namespaces and netfilter", file=sys.stderr)
        return 2
    bin_dir = upstream_bin()
    if bin_dir is None:
        print(
            f"upstream's {UPSTREAM_VERSION} binaries are missing: run scripts/upstream or set ${UPSTREAM_BIN_ENV}",
            file=sys.stderr,
        )
        return 2
    results: list[FaultResult] = []
    with FaultBed.build(bin_dir) as bed:
        for _ in range(args.rounds):
            for fault in faults:
                result = bed.run(fault)
                results.append(result)
                print(f"{fault}: upstream {cell(result.seconds[UPSTREAM_NODE])} s, ours {cell(result.seconds[OURS_NODE])} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                for line in result.lost[:5] + result.differences[:5]:
                    print(f"  {line}", file=sys.stderr)
    print(f"Faults of kube-apiserver/etcd {UPSTREAM_VERSION}, seconds from the fault's end to the change in the rules:")
    print("\n".join(table(results)))
    return 0 if all(not r.lost and not r.differences for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
