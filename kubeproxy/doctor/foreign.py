"""Rules that change what the proxy decided: foreign DNAT or drops ahead of it, missing jumps,
stale chains, and rules of others that jump into the proxy's per-service chains."""

from __future__ import annotations

from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables.jumps import ENSURE_ORDER
from kubeproxy.doctor.address_probe import Probe, hostport, is_dnat, is_drop, ours
from kubeproxy.doctor.findings import Finding
from kubeproxy.model.node_model import NodeView
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.ruleset import Nat, Ruleset

_SEP = "KUBE-SEP-"


def _where(table: str, chain: str, line: int) -> str:
    return f"{table} {chain}" + (f" line {line}" if line else "")


def foreign_rule_findings(probes: list[Probe], view: NodeView) -> list[Finding]:
    """A rule outside the proxy's chains that DNATs or drops a service's new flows."""
    dnat: dict[tuple[str, str, int, str], list[str]] = {}
    dnat_targets: dict[tuple[str, str, int, str], set[str]] = {}
    endpoints_of: dict[tuple[str, str, int, str], set[str]] = {}
    drops: dict[tuple[str, str, int, str], list[str]] = {}
    for p in probes:
        eps = {e.address for e in view.endpoints.get(p.name, [])}
        for o in p.outcomes:
            for h in o.path:
                if ours(h):
                    continue
                key = (h.table, h.chain, h.line, h.text or f"policy {o.verdict}")
                if is_dnat(h) and o.dnat is not None:
                    dnat.setdefault(key, []).append(f"{p.name} {p.frontend}")
                    ip, port = o.dnat
                    dnat_targets.setdefault(key, set()).add(hostport(ip, port or p.frontend.port, p.frontend.v6))
                    endpoints_of.setdefault(key, set()).update(eps)
                    break
                if (is_drop(h) or (h.rule == "policy" and o.verdict in ("DROP", "REJECT"))) and eps:
                    drops.setdefault(key, []).append(f"{p.name} {p.frontend}")
                    break
    out: list[Finding] = []
    for key, hits in sorted(dnat.items()):
        table, chain, line, text = key
        targets = dnat_targets[key]
        stray = sorted(targets - endpoints_of[key])
        severity = "critical" if stray else "warning"
        title = ("DNATs service traffic before the proxy's rules" +
                 (f" to {', '.join(stray)}, which is not an endpoint of the service" if stray else
                  ": the proxy's rules never see these flows (endpoint changes, affinity and policies are bypassed)"))
        fixes = [
            "remove the rule and let the proxy's rules handle the service, with externalTrafficPolicy: Local "
            "if the point of the rule was to keep the client's address (no SNAT)",
            "or, if the rule must stay, take the address out of the Service so that the two do not disagree",
        ]
        out.append(Finding(severity, "foreign-dnat", _where(table, chain, line), title,
                           [f"rule: {text}", *(f"catches {h}" for h in hits[:20]),
                            f"DNAT to {', '.join(sorted(targets))}"],
                           fixes, {"table": table, "chain": chain, "line": line, "rule": text,
                                   "services": hits, "dnat_to": sorted(targets)}))
    for key, hits in sorted(drops.items()):
        table, chain, line, text = key
        out.append(Finding("critical", "foreign-drop", _where(table, chain, line),
                           "drops new flows to a service that has endpoints",
                           [f"rule: {text}", *(f"drops {h}" for h in hits[:20])],
                           ["remove or narrow the rule (the proxy's own drops and rejects live in KUBE- chains)"],
                           {"table": table, "chain": chain, "line": line, "rule": text, "services": hits}))
    return out


def jump_findings(ruleset: Ruleset) -> list[Finding]:
    """iptables: a jump the proxy installs in a built-in chain is missing although its chain is there."""
    if ruleset.source == "nft-json":
        return []
    out: list[Finding] = []
    seen: set[tuple[str, str, str]] = set()
    for j in ENSURE_ORDER:
        if (j.table, j.builtin, j.target) in seen:
            continue
        seen.add((j.table, j.builtin, j.target))
        table = ruleset.table(j.table)
        if table is None or j.target not in table.chains:
            continue
        # A built-in chain always exists in the kernel; a dump may leave out an empty one.
        builtin_rules = table.chains[j.builtin].rules if j.builtin in table.chains else []
        if any(r.target == j.target for r in builtin_rules):
            continue
        if not table.chains[j.target].rules and (j.table, j.target) != ("nat", "KUBE-SERVICES"):
            continue  # a jump to an empty chain changes nothing (older layouts leave some empty)
        severity = "critical" if j.table == "nat" else "warning"
        why = ("no service address is translated for packets" if j.target == "KUBE-SERVICES" and j.table == "nat"
               else "packets marked for SNAT are not masqueraded" if j.target == "KUBE-POSTROUTING"
               else f"the rules in {j.target} are never reached")
        where = "arriving at" if j.builtin == "PREROUTING" else "sent by" if j.builtin == "OUTPUT" else "through"
        out.append(Finding(severity, "missing-jump", f"{j.table} {j.builtin}",
                           f"no jump to {j.target}: {why} ({where} the node)",
                           [f"{j.target} exists in table {j.table} with {len(table.chains[j.target].rules)} rule(s); "
                            f"{j.builtin} has {len(builtin_rules)} rule(s), none jumping to it"],
                           [f"restart the proxy (it ensures the jump at every sync): iptables -t {j.table} -I "
                            f"{j.builtin} {j.match} -j {j.target}".replace("  ", " ")],
                           {"table": j.table, "chain": j.builtin, "target": j.target}))
    return out


def chain_findings(ruleset: Ruleset, view: NodeView | None) -> list[Finding]:
    """Stale per-service chains, and rules of others that jump into them (iptables dumps)."""
    if ruleset.source == "nft-json":
        return []
    out: list[Finding] = []
    expected: set[str] = set()
    if view is not None:
        for name in view.services:
            spn = str(name)
            proto = name.protocol.lower()
            expected |= {f(spn, proto) for f in (names.service_chain, names.local_chain,
                                                  names.external_chain, names.firewall_chain)}
    for table in ruleset.tables:
        referenced: dict[str, list[str]] = {}
        for chain in table.chains.values():
            for r in chain.rules:
                if r.target.startswith("KUBE-"):
                    referenced.setdefault(r.target, []).append(chain.name)
        for chain in table.chains.values():
            if not names.is_service_chain(chain.name):
                continue
            refs = referenced.get(chain.name, [])
            outside = sorted({c for c in refs if not c.startswith("KUBE-")})
            if outside:
                out.append(Finding("warning", "outside-reference", f"{table.name} {chain.name}",
                                   f"jumped to from chains the proxy does not own ({', '.join(outside)})",
                                   [f"{c} -> {chain.name}" for c in outside],
                                   ["the proxy renames and deletes its per-service chains when endpoints change: "
                                    "jump to the service address instead (or KUBE-SERVICES)"],
                                   {"table": table.name, "chain": chain.name, "from": outside}))
            if not chain.rules and not refs:
                continue  # declared and empty: a hand-edited copy, nothing routes through it
            if not refs:
                out.append(Finding("info", "stale-chain", f"{table.name} {chain.name}",
                                   "no rule jumps to it (left behind; the proxy removes such chains at its next full sync)",
                                   [f"{len(chain.rules)} rule(s)" + (f", e.g. {chain.rules[0].text}" if chain.rules else "")],
                                   ["restart the proxy or run `kubeproxy cleanup` on a node where it no longer runs"],
                                   {"table": table.name, "chain": chain.name}))
            elif view is not None and not chain.name.startswith(_SEP) and chain.name not in expected:
                out.append(Finding("warning", "stale-chain", f"{table.name} {chain.name}",
                                   "routes traffic for a service port the objects do not have",
                                   [f"jumped to from {', '.join(sorted(set(refs)))}",
                                    *(f"e.g. {r.text}" for r in chain.rules[:1])],
                                   ["check that the objects given are the cluster's; a proxy that stopped syncing "
                                    "leaves such chains in place"],
                                   {"table": table.name, "chain": chain.name}))
    return out


def bypass_findings(ruleset: Ruleset) -> list[Finding]:
    """Without the objects: a DNAT outside the proxy's chains in a nat hook where the proxy's
    KUBE-SERVICES chain lives (iptables dumps). What it catches never meets the proxy's rules."""
    if ruleset.source == "nft-json":
        return []
    out: list[Finding] = []
    for table in ruleset.tables:
        if table.name != "nat" or "KUBE-SERVICES" not in table.chains:
            continue
        for chain in table.chains.values():
            if chain.name.startswith("KUBE-") or chain.name in ("POSTROUTING", "INPUT"):
                continue
            for rule in chain.rules:
                dnat = next((s for s in rule.load() if isinstance(s, Nat) and s.kind == "dnat"), None)
                if dnat is None:
                    continue
                to = (A.fmt_ip(dnat.addr, dnat.v6) if isinstance(dnat.addr, int) else "an address from a map") + (
                    f":{dnat.port}" if isinstance(dnat.port, int) else "")
                out.append(Finding(
                    "warning", "foreign-dnat", _where(table.name, chain.name, rule.line),
                    f"DNATs to {to} outside the proxy's rules: the flows it catches never meet them (endpoint "
                    "changes, affinity and traffic policies are bypassed)",
                    [f"rule: {rule.text}", "judged from the rules alone: give --manifests or --kubeconfig to see "
                                           "which Services it catches"],
                    ["remove the rule and let the proxy's rules handle the service, with externalTrafficPolicy: Local "
                     "if the point of the rule was to keep the client's address (no SNAT)"],
                    {"table": table.name, "chain": chain.name, "line": rule.line, "rule": rule.text, "dnat_to": [to]}))
    return out
