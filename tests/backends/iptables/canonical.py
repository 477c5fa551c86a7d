"""Compare iptables-restore texts the way upstream's tests do: independent of service order.

Upstream visits services in random (Go map) order, so its tests sort the restore input before
comparing. We keep the same facts: which chains each table declares, and each chain's rules in
order; in the chains that many services share, rules are grouped by service (stable within one
service), and KUBE-SERVICES' jump to KUBE-NODEPORTS stays last.
"""

from __future__ import annotations

import re
from collections import defaultdict

SHARED_CHAINS = {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL"}
_COMMENT = re.compile(r'--comment (?:"([^"]*)"|(\S+))')
Canonical = dict[str, tuple[frozenset[str], dict[str, list[str]], list[str]]]


def _service_key(rule: str) -> tuple[int, str]:
    m = _COMMENT.search(rule)
    comment = (m.group(1) or m.group(2)) if m else ""
    if comment.startswith("kubernetes service nodeports"):
        return (1, "")
    return (0, comment.split(" ")[0])


def canonical(text: str) -> Canonical:
    """table -> (declared chains, rules per chain, other lines such as -X)."""
    out: Canonical = {}
    table = ""
    chains: set[str] = set()
    rules: dict[str, list[str]] = defaultdict(list)
    other: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            table, chains, rules, other = line[1:], set(), defaultdict(list), []
        elif line == "COMMIT":
            shared = {c: sorted(r, key=_service_key) for c, r in rules.items() if c in SHARED_CHAINS}
            out[table] = (frozenset(chains), {**rules, **shared}, sorted(other))
        elif line.startswith(":"):
            chains.add(line.split()[0][1:])
        elif line.startswith("-A "):
            rules[line.split()[1]].append(line)
        else:
            other.append(line)
    return out


def uncommented(saved: str) -> list[str]:
    """iptables-save's lines without its comments (the time stamps differ from run to run)."""
    return [line for line in saved.splitlines() if not line.startswith("#")]


def diff(expected: str, actual: str) -> str:
    """Human-readable differences between two canonical forms ('' when equal)."""
    a, b = canonical(expected), canonical(actual)
    lines = []
    for table in sorted(set(a) | set(b)):
        if table not in a or table not in b:
            lines.append(f"table {table} only in {'expected' if table in a else 'actual'}")
            continue
        (ca, ra, oa), (cb, rb, ob) = a[table], b[table]
        for chain in sorted(ca - cb):
            lines.append(f"{table}: chain {chain} missing")
        for chain in sorted(cb - ca):
            lines.append(f"{table}: chain {chain} unexpected")
        for chain in sorted(set(ra) | set(rb)):
            if ra.get(chain, []) != rb.get(chain, []):
                lines.append(f"{table} {chain}:")
                lines += [f"  - {r}" for r in ra.get(chain, []) if r not in rb.get(chain, [])]
                lines += [f"  + {r}" for r in rb.get(chain, []) if r not in ra.get(chain, [])]
                if set(ra.get(chain, [])) == set(rb.get(chain, [])):
                    lines.append("  (same rules, different order)")
        if oa != ob:
            lines.append(f"{table}: other lines differ: {oa} vs {ob}")
    return "\n".join(lines)
