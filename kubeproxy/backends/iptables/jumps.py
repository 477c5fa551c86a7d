"""The jumps from the built-in chains into ours (upstream's iptablesJumpChains).

Upstream does not put these in its iptables-restore input: it ensures them one by one with
`iptables -I` (prepend) before a full sync, so that the rest of PREROUTING, INPUT, ... stays
whoever's it is. `with_jumps` appends them to a rendering in the order a node ends up with, for
tools that need a self-contained rule set (the tracer, tests in a fresh namespace).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Jump:
    table: str
    builtin: str
    target: str
    match: str  # conntrack state and comment, as upstream spells them


_NEW = "-m conntrack --ctstate NEW"
_EXTERNAL = f'{_NEW} -m comment --comment "kubernetes externally-visible service portals"'
# Upstream's order of EnsureRule(Prepend, ...) calls: the proxy's jumps, then kubelet's.
ENSURE_ORDER = (
    Jump("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", _EXTERNAL),
    Jump("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", _EXTERNAL),
    Jump("filter", "INPUT", "KUBE-NODEPORTS", '-m comment --comment "kubernetes health check service ports"'),
    Jump("filter", "FORWARD", "KUBE-SERVICES", f'{_NEW} -m comment --comment "kubernetes service portals"'),
    Jump("filter", "OUTPUT", "KUBE-SERVICES", f'{_NEW} -m comment --comment "kubernetes service portals"'),
    Jump("filter", "FORWARD", "KUBE-FORWARD", '-m comment --comment "kubernetes forwarding rules"'),
    Jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", f'{_NEW} -m comment --comment "kubernetes load balancer firewall"'),
    Jump("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", f'{_NEW} -m comment --comment "kubernetes load balancer firewall"'),
    Jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", f'{_NEW} -m comment --comment "kubernetes load balancer firewall"'),
    Jump("nat", "OUTPUT", "KUBE-SERVICES", '-m comment --comment "kubernetes service portals"'),
    Jump("nat", "PREROUTING", "KUBE-SERVICES", '-m comment --comment "kubernetes service portals"'),
    Jump("nat", "POSTROUTING", "KUBE-POSTROUTING", '-m comment --comment "kubernetes postrouting rules"'),
    Jump("filter", "INPUT", "KUBE-FIREWALL", ""),
    Jump("filter", "OUTPUT", "KUBE-FIREWALL", ""),
)
# Upstream's iptablesKubeletJumpChains: ensured in every family, whatever the rules hold.
KUBELET_JUMPS = frozenset(j for j in ENSURE_ORDER if j.target == "KUBE-FIREWALL")


def node_order() -> list[Jump]:
    """The jumps as they stand in each built-in chain after all the prepends: last ensured first."""
    return list(reversed(ENSURE_ORDER))


def rule(jump: Jump) -> str:
    return f"-A {jump.builtin} {jump.match} -j {jump.target}" if jump.match else f"-A {jump.builtin} -j {jump.target}"


def with_jumps(text: str) -> str:
    """`text` plus the jump rules for the chains it declares, appended before each COMMIT.

    Fine for a fresh namespace or a tracer; on a real node use upstream's prepend instead,
    so that rules others placed in the built-in chains keep their order relative to ours.
    """
    out: list[str] = []
    table = ""
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("*"):
            table, declared = line[1:], set()
        elif line.startswith(":"):
            declared.add(line.split()[0][1:])
        elif line == "COMMIT":
            out.extend(rule(j) for j in node_order() if j.table == table and j.target in declared)
        out.append(line)
    return "\n".join(out) + "\n"
