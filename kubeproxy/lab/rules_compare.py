"""Two nodes' `iptables-save` made comparable: counters and comments aside, chains as a map (the
order chains are listed in has no meaning to the kernel; the order of rules in a chain has), and
the one part that is node-specific by design, which of a Service's endpoints are this node's own
(the KUBE-SVL- chains), named by role instead of by address.

A local endpoint is named by its pod's name with the node's name replaced by `<node>`: pod
`web-node-a-0` on node-a and pod `web-node-b-0` on node-b are the same role, so two nodes that host
mirror-image pods give equal texts exactly when they treat their own pods alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_COUNTERS = re.compile(r"\[\d+:\d+\]$")
_DNAT = re.compile(r"^-A (KUBE-SEP-\S+) .*--to-destination (\S+)")
_SEP_JUMP = re.compile(r"-j (KUBE-SEP-\S+)")


@dataclass(frozen=True)
class Table:
    name: str
    policies: tuple[tuple[str, str], ...]  # (chain, policy) for every chain, sorted by chain
    rules: tuple[tuple[str, tuple[str, ...]], ...]  # (chain, its rules in order), sorted by chain


def parse(dump: str) -> dict[str, Table]:
    """`iptables-save` text as tables of chains (comments and counters dropped)."""
    tables: dict[str, Table] = {}
    name = ""
    policies: dict[str, str] = {}
    rules: dict[str, list[str]] = {}
    for raw in dump.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            name, policies, rules = line[1:], {}, {}
        elif line.startswith(":"):
            chain, policy, *_ = line[1:].split()
            policies[chain] = policy
            rules.setdefault(chain, [])
        elif line.startswith("-A "):
            rules.setdefault(line.split()[1], []).append(line)
        elif line == "COMMIT":
            tables[name] = Table(name, tuple(sorted(policies.items())), tuple(sorted((c, tuple(r)) for c, r in rules.items())))
    return tables


def endpoint_chains(dump: str) -> dict[str, str]:
    """KUBE-SEP- chain → the `ip:port` it DNATs to."""
    found: dict[str, str] = {}
    for line in dump.splitlines():
        match = _DNAT.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def role_named(dump: str, node_name: str, pods_by_ip: Mapping[str, str], drop: Sequence[str] = ()) -> dict[str, Table]:
    """`dump` of node `node_name` with the endpoints its KUBE-SVL- chains jump to named by role,
    and every text of `drop` taken out of every rule (a difference known and checked elsewhere)."""
    seps = endpoint_chains(dump)

    def role(match: re.Match[str]) -> str:
        chain = match.group(1)
        endpoint = seps.get(chain, "")
        ip = endpoint.rsplit(":", 1)[0].strip("[]")
        pod = pods_by_ip.get(ip)
        if pod is None or node_name not in pod:
            return f"-j {chain}"  # not one of this node's own pods: compared as it is
        return f"-j LOCAL-ENDPOINT({pod.replace(node_name, '<node>')}:{endpoint.rsplit(':', 1)[1]})"

    def local_rule(rule: str) -> str:
        # The rule's comment names the endpoint's address too ("ns/svc:port -> ip:port").
        for match in _SEP_JUMP.finditer(rule):
            endpoint = seps.get(match.group(1), "")
            named = role(match)
            if endpoint and named.startswith("-j LOCAL-ENDPOINT("):
                rule = rule.replace(f"-> {endpoint}", "-> " + named.removeprefix("-j "))
        return _SEP_JUMP.sub(role, rule)

    def dropped(rule: str) -> str:
        for text in drop:
            rule = rule.replace(text, "")
        return rule

    tables = parse(dump)
    for name, table in tables.items():
        rules = tuple(
            (chain, tuple(dropped(local_rule(r) if chain.startswith("KUBE-SVL-") else r) for r in chain_rules))
            for chain, chain_rules in table.rules
        )
        tables[name] = Table(name, table.policies, rules)
    return tables


def differences(left: Mapping[str, Table], right: Mapping[str, Table], left_name: str, right_name: str) -> list[str]:
    """Every table, chain policy and chain whose rules differ, each with both sides; [] when equal."""
    out: list[str] = []
    for table in sorted(set(left) | set(right)):
        a, b = left.get(table), right.get(table)
        if a is None or b is None:
            out.append(f"table {table}: only in {left_name if b is None else right_name}")
            continue
        if a.policies != b.policies:
            only_a = sorted(set(a.policies) - set(b.policies))
            only_b = sorted(set(b.policies) - set(a.policies))
            out.append(f"{table}: chains only in {left_name}: {only_a}; only in {right_name}: {only_b}")
        rules_a, rules_b = dict(a.rules), dict(b.rules)
        for chain in sorted(set(rules_a) & set(rules_b)):
            if rules_a[chain] != rules_b[chain]:
                out.append(
                    f"{table} {chain}:\n  {left_name}:\n    "
                    + "\n    ".join(rules_a[chain])
                    + f"\n  {right_name}:\n    "
                    + "\n    ".join(rules_b[chain])
                )
    return out
