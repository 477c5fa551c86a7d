"""A mode's `kubeproxy render` output read back as the tracer's input: what the node would hold.

The offline renderers print what each kernel tool is given, each family under its own header
(`# iptables-restore (IPv4)`, `# ===== IPv6 =====`); IPVS mode's text has its ipset, iptables and
`ipvsadm-save -n` parts under headers of their own.
"""

from __future__ import annotations

import re

from kubeproxy.netfilter import iptables_save, nft_json
from kubeproxy.netfilter.ipvs import IpvsState, load_into
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.ruleset import Ruleset

_FAMILY_HEADER = re.compile(r"^# (?:===== (IPv4|IPv6) =====|(?:ip6?tables-restore) \((IPv4|IPv6)\))$", re.M)
_IPVS_PARTS = ("# ipset restore -exist\n", "# iptables-restore --noflush\n", "# ipvsadm-restore (ipvsadm-save -n)\n",
               "# ip addr add ")


def _by_family(text: str) -> list[tuple[str, str]]:
    """(nft family, text) per family section; a text without headers is one IPv4 section."""
    heads = list(_FAMILY_HEADER.finditer(text))
    if not heads:
        return [("ip", text)]
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append(("ip6" if (m.group(1) or m.group(2)) == "IPv6" else "ip", text[m.end() + 1:end]))
    return out


def _ipvs_parts(text: str) -> tuple[str, str, str]:
    """(ipset input, iptables-restore input, ipvsadm-save text) of one family's section."""
    cuts = [text.find(p) for p in _IPVS_PARTS]
    if any(c < 0 for c in cuts[:3]):
        raise ValueError("not `kubeproxy render --proxy-mode ipvs` output: its three parts are not all there")
    ends = [cuts[1], cuts[2], cuts[3] if cuts[3] >= 0 else len(text)]
    ipsets, rules, ipvsadm = (text[cuts[i] + len(_IPVS_PARTS[i]):ends[i]] for i in range(3))
    return ipsets, rules, ipvsadm


def _with_ipvs_jumps(text: str) -> str:
    """The IPVS render's iptables input with the jumps the proxy inserts into the built-in chains
    (each with `-I`, so a fresh chain holds them last-inserted first)."""
    from kubeproxy.backends.ipvs.render import JUMPS

    out: list[str] = []
    table, declared = "", set[str]()
    for line in text.splitlines():
        if line.startswith("*"):
            table, declared = line[1:], set()
        elif line.startswith(":"):
            declared.add(line.split()[0][1:])
        elif line == "COMMIT":
            out += [j.rule() for j in reversed(JUMPS) if j.table == table and j.target in declared]
        out.append(line)
    return "\n".join(out) + "\n"


def read_render(text: str, fmt: str, node: Node) -> tuple[Ruleset, IpvsState | None]:
    """The ruleset (and IPVS table) the render's text programs, by its format (a mode's
    `render_format`); IPVS's ipsets and bound addresses go into `node`. nft text is read by `nft`
    in a throwaway namespace (root)."""
    if fmt == "nft":
        return nft_json.parse_text(text), None
    if fmt not in ("iptables-save", "ipvs"):
        raise ValueError(f"rendered rules of format {fmt or 'unknown'!r}: explain reads nft, iptables-save and ipvs text")
    ruleset = Ruleset("iptables-save", [])
    ipvs: IpvsState | None = None
    for family, section in _by_family(text):
        if fmt == "ipvs":
            ipsets, section, ipvsadm = _ipvs_parts(section)
            section = _with_ipvs_jumps(section)
            got = load_into(node, ipvsadm, ipsets)
            if got is not None:
                ipvs = got if ipvs is None else IpvsState({**ipvs.services, **got.services})
        ruleset.tables += iptables_save.parse(section, family=family).tables
    return ruleset, ipvs
