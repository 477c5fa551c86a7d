"""Invariants every rendered iptables rule set must satisfy, whatever the scenario."""

from __future__ import annotations

import re
from collections import defaultdict
from fractions import Fraction

from kubeproxy.backends.iptables.names import is_service_chain

BUILTIN_CHAINS = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
BUILTIN_TARGETS = {"ACCEPT", "DROP", "REJECT", "RETURN", "DNAT", "SNAT", "MASQUERADE", "MARK", "LOG"}
_PROB = re.compile(r"--probability (\S+)")


def parse(text: str) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    tables: dict[str, tuple[list[str], dict[str, list[str]]]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            declared: list[str] = []
            rules: dict[str, list[str]] = defaultdict(list)
            tables[line[1:]] = (declared, rules)
        elif line.startswith(":"):
            declared.append(line.split()[0][1:])
        elif line.startswith("-A "):
            rules[line.split()[1]].append(line)
    return tables


def _jump(rule: str) -> str | None:
    parts = rule.split()
    for flag in ("-j", "-g"):
        if flag in parts:
            return parts[parts.index(flag) + 1]
    return None


def check_invariants(text: str) -> None:
    for table, (declared, rules) in parse(text).items():
        assert len(declared) == len(set(declared)), f"{table}: a chain is declared twice"
        for chain in rules:
            assert chain in declared or chain in BUILTIN_CHAINS, f"{table}: rules appended to undeclared chain {chain}"
        targets = set()
        for chain, chain_rules in rules.items():
            for rule in chain_rules:
                target = _jump(rule)
                if target and target not in BUILTIN_TARGETS:
                    assert target in declared, f"{table}: {chain} jumps to undeclared {target}"
                    targets.add(target)
        for chain in declared:
            if is_service_chain(chain):
                assert chain in targets, f"{table}: {chain} is declared but nothing jumps to it"
        for chain, chain_rules in rules.items():
            if chain.startswith(("KUBE-SVC-", "KUBE-SVL-")):
                _check_equal_shares(chain, chain_rules)


def _check_equal_shares(chain: str, rules: list[str]) -> None:
    """Following the statistic rules in order must give every endpoint the same share."""
    dispatch = [r for r in rules if (_jump(r) or "").startswith("KUBE-SEP-") and "--rcheck" not in r]
    remaining = Fraction(1)
    shares = []
    for i, rule in enumerate(dispatch):
        m = _PROB.search(rule)
        if m is None:
            assert i == len(dispatch) - 1, f"{chain}: an unconditional endpoint rule is not last"
            shares.append(remaining)
            remaining = Fraction(0)
        else:
            p = Fraction(m.group(1))
            shares.append(remaining * p)
            remaining -= remaining * p
    if not shares:
        return
    assert remaining == 0, f"{chain}: {remaining} of traffic matches no endpoint"
    expected = Fraction(1, len(shares))
    for share in shares:
        # %0.10f rounding: each share is within n * 1e-10 of 1/n.
        assert abs(share - expected) < Fraction(len(shares), 10**10), f"{chain}: unequal shares {shares}"
