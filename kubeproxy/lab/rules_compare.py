"""Two nodes' `iptables-save` made comparable: counters and comments aside, chains as a map (the
order chains are listed in has no meaning to the kernel; the order of rules in a chain has), and
the one part that is node-specific by design, which of a Service's endpoints are this node's own
(the KUBE-SVL- chains), named by role instead of by address.

A local endpoint is named by its pod's name with the node's name replaced by `<node>`: pod
`web-node-a-0` on node-a and pod `web-node-b-0` on node-b are the same role, so two nodes that host
mirror-image pods give equal texts exactly when they treat their own pods alike. An endpoint chain
only a node-own chain jumps to (a Service with internalTrafficPolicy Local writes endpoint chains
for local endpoints only) exists on one node alone: it is renamed by Service and role, and the
pod's address in it named by role.

The chains upstream fills while iterating a Go map of Services (MAP_ORDER_CHAINS) list their
Services in a different order on every sync; there the per-Service rules are sorted by Service,
each Service's own rules kept in their order and the fixed rules (no Service named in their
comment) kept in place. A chain of independent DROPs filled in map order (UNORDERED_CHAINS) is
compared as a set. Every other chain is compared in order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_COUNTERS = re.compile(r"\[\d+:\d+\]$")
_DNAT = re.compile(r"^-A (KUBE-SEP-\S+) .*--to-destination (\S+)")
_SEP_JUMP = re.compile(r"-j (KUBE-SEP-\S+)")
_JUMP = re.compile(r"^-A (\S+) .*-j (KUBE-SEP-\S+)")
_COMMENT = re.compile(r'--comment (?:"([^"]*)"|(\S+))')
_SERVICE_PORT = re.compile(r"^[^/\s]+/\S+$")  # namespace/name[:port], as the rules' comments name them

# (table, chain) that upstream's syncProxyRules writes from inside `range proxier.svcPortMap`
# (pkg/proxy/iptables/proxier.go): their Services come in Go's random map order.
MAP_ORDER_CHAINS = frozenset({
    ("nat", "KUBE-SERVICES"), ("nat", "KUBE-NODEPORTS"),
    ("filter", "KUBE-SERVICES"), ("filter", "KUBE-EXTERNAL-SERVICES"), ("filter", "KUBE-NODEPORTS"),
    ("filter", "KUBE-PROXY-FIREWALL"),
})  # fmt: skip
# (table, chain) whose every rule is an independent DROP appended from inside `range
# proxier.svcPortMap` with no Service named in a comment: upstream's IPVS proxier fills
# KUBE-IPVS-OUT-FILTER from lbNoNodeAccessIPPortProtocolEntries (pkg/proxy/ipvs/proxier.go), so
# its rules come in map order and carry no comment to sort by; their order changes nothing.
UNORDERED_CHAINS = frozenset({("filter", "KUBE-IPVS-OUT-FILTER")})


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


def rule_service(rule: str) -> str | None:
    """The `namespace/name:port` a rule's comment starts with, None for a rule of no Service."""
    match = _COMMENT.search(rule)
    if match is None:
        return None
    words = (match.group(1) if match.group(1) is not None else match.group(2)).split()
    return words[0] if words and _SERVICE_PORT.match(words[0]) else None


def services_sorted(rules: Sequence[str]) -> tuple[str, ...]:
    """`rules` with each run of per-Service rules between two fixed rules sorted by Service
    (stable: a Service's own rules keep their order)."""
    out: list[str] = []
    run: list[str] = []
    for rule in rules:
        if rule_service(rule) is None:
            out += sorted(run, key=lambda r: rule_service(r) or "")
            out.append(rule)
            run = []
        else:
            run.append(rule)
    return tuple(out + sorted(run, key=lambda r: rule_service(r) or ""))


def _own_role(endpoint: str, node_name: str, pods_by_ip: Mapping[str, str]) -> str | None:
    """`pod-role:port` when `endpoint` (ip:port) is a pod of `node_name`, else None."""
    ip, _, port = endpoint.rpartition(":")
    pod = pods_by_ip.get(ip.strip("[]"))
    return f"{pod.replace(node_name, '<node>')}:{port}" if pod is not None and node_name in pod else None


def _node_only_seps(dump: str, node_name: str, pods_by_ip: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Endpoint chains of this node's own pods that only node-own (KUBE-SVL-) chains jump to:
    chain → (its role name, the endpoint it DNATs to)."""
    seps = endpoint_chains(dump)
    sources: dict[str, set[str]] = {}
    services: dict[str, str] = {}
    for line in dump.splitlines():
        line = line.strip()
        if match := _JUMP.match(line):
            sources.setdefault(match.group(2), set()).add(match.group(1))
        if (match := _DNAT.match(line)) and (service := rule_service(line)):
            services[match.group(1)] = service
    found: dict[str, tuple[str, str]] = {}
    for chain, endpoint in seps.items():
        role = _own_role(endpoint, node_name, pods_by_ip)
        if role is not None and all(s.startswith("KUBE-SVL-") for s in sources.get(chain, ())):
            found[chain] = (f"KUBE-SEP-OWN({services.get(chain, '?')}->{role})", endpoint)
    return found


def _rename_node_only_seps(dump: str, node_name: str, pods_by_ip: Mapping[str, str]) -> str:
    renamed = _node_only_seps(dump, node_name, pods_by_ip)
    if not renamed:
        return dump
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, renamed)) + r")(?![\w-])")
    lines = []
    for line in dump.splitlines():
        match = pattern.search(line)
        if match is not None:
            name, endpoint = renamed[match.group(1)]
            ip = endpoint.rpartition(":")[0]
            role = name.rpartition("->")[2].removesuffix(")")
            line = pattern.sub(lambda m: renamed[m.group(1)][0], line)
            line = line.replace(endpoint, role).replace(f" {ip.strip('[]')}/", f" {role.rpartition(':')[0]}/")
        lines.append(line)
    return "\n".join(lines)


def role_named(dump: str, node_name: str, pods_by_ip: Mapping[str, str], drop: Sequence[str] = ()) -> dict[str, Table]:
    """`dump` of node `node_name` with this node's own endpoints named by role (see the module
    docstring), the Services of MAP_ORDER_CHAINS sorted, the rules of UNORDERED_CHAINS sorted, and
    every text of `drop` taken out of every rule (a difference known and checked elsewhere)."""
    dump = _rename_node_only_seps(dump, node_name, pods_by_ip)
    seps = endpoint_chains(dump)

    def role(match: re.Match[str]) -> str:
        chain = match.group(1)
        named = _own_role(seps.get(chain, ""), node_name, pods_by_ip)
        # Not one of this node's own pods: compared as it is.
        return f"-j {chain}" if named is None else f"-j LOCAL-ENDPOINT({named})"

    def local_rule(rule: str) -> str:
        # The rule's comment names the endpoint's address too ("ns/svc:port -> ip:port"), and
        # session affinity's `-m recent --name` the endpoint's chain.
        for match in _SEP_JUMP.finditer(rule):
            endpoint = seps.get(match.group(1), "")
            named = role(match)
            if endpoint and named.startswith("-j LOCAL-ENDPOINT("):
                rule = rule.replace(f"-> {endpoint}", "-> " + named.removeprefix("-j "))
                rule = rule.replace(f"--name {match.group(1)} ", "--name " + named.removeprefix("-j ") + " ")
        return _SEP_JUMP.sub(role, rule)

    def dropped(rule: str) -> str:
        for text in drop:
            rule = rule.replace(text, "")
        return rule

    tables = parse(dump)
    for name, table in tables.items():
        rules = []
        for chain, chain_rules in table.rules:
            named = tuple(dropped(local_rule(r) if chain.startswith("KUBE-SVL-") else r) for r in chain_rules)
            if (name, chain) in UNORDERED_CHAINS:
                named = tuple(sorted(named))
            elif (name, chain) in MAP_ORDER_CHAINS:
                named = services_sorted(named)
            rules.append((chain, named))
        tables[name] = Table(name, table.policies, tuple(rules))
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
