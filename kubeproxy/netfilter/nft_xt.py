"""iptables extensions in `nft list ruleset` text: what nft prints for an iptables-nft rule whose
match or target it cannot translate (`xt match recent`, `xt target CHECKSUM`; older nft wrote
`# xt_recent`, `# xt_CHECKSUM`). The options are not printed, so the text cannot be loaded as is
and the rule cannot be evaluated from it: the fragment is taken out before `nft -f` and put back
into the parsed rule as a match the tracer cannot evaluate (both answers) or a target it does not
know, never dropped (a dropped match would make the rule match every packet)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubeproxy.netfilter.ruleset import NMatch, Ruleset, UnknownTarget, Unsupported

_XT = re.compile(r"\bxt (match|target) ([\w.-]+)|# xt_([\w.-]+)")
_TABLE = re.compile(r"^\s*table\s+(\w+)\s+(\S+)\s*\{")
_CHAIN = re.compile(r"^\s*chain\s+(\S+)\s*\{")
# A chain's own declarations, not rules.
_DECLARATION = re.compile(r"^\s*(type\s|policy\s|comment\s|devices\s|\})")


@dataclass(frozen=True)
class XtFragment:
    family: str
    table: str
    chain: str
    index: int  # the rule's position in its chain
    kind: str  # match or target
    name: str


def _depth_change(line: str) -> int:
    """Braces opened minus closed, outside quoted strings."""
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', "", line)
    return outside.count("{") - outside.count("}")


def strip(text: str) -> tuple[str, list[XtFragment]]:
    """The text without its xt fragments (loadable by nft), and where each one was."""
    if "xt match" not in text and "xt target" not in text and "# xt_" not in text:
        return text, []
    out: list[str] = []
    found: list[XtFragment] = []
    depth = 0
    family = table = chain = ""
    chain_depth = -1
    index = -1
    for line in text.splitlines():
        m_table, m_chain = _TABLE.match(line), _CHAIN.match(line)
        at_rule = chain_depth >= 0 and depth == chain_depth and line.strip() and not m_chain
        if m_table and depth == 0:
            family, table = m_table.group(1), m_table.group(2)
        elif m_chain and table:
            chain, chain_depth, index = m_chain.group(1), depth + 1, -1
        elif at_rule and not _DECLARATION.match(line) and (not line.lstrip().startswith("#") or "# xt_" in line):
            index += 1
            hits = list(_XT.finditer(line))
            if hits:
                for h in hits:
                    kind = h.group(1) or ("target" if h.group(3)[:1].isupper() else "match")
                    found.append(XtFragment(family, table, chain, index, kind, h.group(2) or h.group(3)))
                line = _XT.sub("", line)
                # a rule that was nothing but the fragment stays a rule (positions must hold)
                line = line if line.strip() else line + " counter"
        depth += _depth_change(line)
        if chain_depth >= 0 and depth < chain_depth:
            chain_depth = -1
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), found


def restore(rs: Ruleset, found: list[XtFragment]) -> None:
    """Put each fragment back into its rule: a match before the rule's actions, a target last."""
    for f in found:
        table = rs.table(f.table, f.family)
        chain = table.chains.get(f.chain) if table is not None else None
        if chain is None or f.index >= len(chain.rules):
            rs.notes.append(f"xt {f.kind} {f.name} in {f.table} {f.chain} could not be placed back: "
                            "that rule is traced without it")
            continue
        rule = chain.rules[f.index]
        steps = rule.load()
        what = f"xt {f.kind} {f.name} (nft printed it without its options; trace iptables-save's output for it)"
        if f.kind == "target":
            steps.append(UnknownTarget(what))
        else:
            at = next((i for i, s in enumerate(steps) if not isinstance(s, (NMatch, Unsupported))), len(steps))
            steps.insert(at, Unsupported(what))
        rule.text += f" xt {f.kind} {f.name}"
    if found:
        names = sorted({f"xt {f.kind} {f.name}" for f in found})
        rs.notes.append(f"{len(found)} rule steps are iptables extensions nft printed without their options "
                        f"({', '.join(names)}): traced as unknown")
