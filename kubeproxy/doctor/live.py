"""Read a running node for doctor, read-only: rules, sysctls, conntrack counters and entries.

Every command only lists (`iptables-save`, `nft -j list ruleset`, `conntrack -S/-L`, `ip -j addr`);
nothing is written. `netns` runs the same reads inside a network namespace (tests, the lab).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kubeproxy.backends.conntrack.flows import parse_flows
from kubeproxy.doctor.facts import (
    CT_COUNT,
    CT_MAX,
    PORT_RANGE,
    TCP_TIME_WAIT,
    UDP_TIMEOUT,
    NodeFacts,
    parse_conntrack_stats,
    parse_sysctl_value,
)
from kubeproxy.netfilter import iptables_save, nft_json
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.ruleset import ParseError, Ruleset

SYSCTLS = (UDP_TIMEOUT, "net.netfilter.nf_conntrack_udp_timeout_stream", TCP_TIME_WAIT, CT_MAX, CT_COUNT, PORT_RANGE)
IPTABLES_SAVES = ("iptables-save", "iptables-legacy-save", "iptables-nft-save")


class LiveError(RuntimeError):
    pass


@dataclass
class LiveNode:
    ruleset: Ruleset
    rules_source: str
    node: Node
    facts: NodeFacts
    notes: list[str]


def _run(argv: Sequence[str], netns: str | None, timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    full = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    try:
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def read_sysctl(name: str, netns: str | None) -> int | tuple[int, int] | None:
    path = "/proc/sys/" + name.replace(".", "/")
    if netns is None:
        try:
            text = Path(path).read_text()
        except OSError:
            return None
    else:
        proc = _run(["cat", path], netns)
        if proc is None or proc.returncode != 0:
            return None
        text = proc.stdout
    try:
        return parse_sysctl_value(name, text.strip())
    except ValueError:
        return None


def read_rules(netns: str | None) -> tuple[Ruleset, str, list[str]]:
    """The proxy's rules as the node has them: nftables if our table is there, else the iptables
    variant that holds KUBE-SERVICES (legacy and nft iptables keep separate rulesets)."""
    notes: list[str] = []
    nft = _run(["nft", "-j", "list", "ruleset"], netns)
    if nft is not None and nft.returncode == 0 and '"name": "kube-proxy"' in nft.stdout.replace('":"', '": "'):
        try:
            return nft_json.parse(nft.stdout), "nft -j list ruleset", notes
        except ParseError as exc:
            notes.append(f"nft -j list ruleset could not be read ({exc}); reading iptables instead")
    best: tuple[int, str, str] | None = None
    for tool in IPTABLES_SAVES:
        proc = _run([tool], netns)
        if proc is None or proc.returncode != 0:
            continue
        score = (2 if ":KUBE-SERVICES" in proc.stdout else 0) + (1 if "-A " in proc.stdout else 0)
        if best is None or score > best[0]:
            best = (score, tool, proc.stdout)
    if best is None:
        raise LiveError("neither nft nor iptables-save could list the rules (are the tools installed, are we root?)")
    ruleset, source = iptables_save.parse(best[2], family="ip"), best[1]
    # IPv6 rules live in ip6tables, of the same variant (legacy or nft) as the IPv4 ones.
    v6 = _run([best[1].replace("iptables", "ip6tables", 1)], netns)
    if v6 is not None and v6.returncode == 0 and ":KUBE-SERVICES" in v6.stdout:
        try:
            ruleset.tables += iptables_save.parse(v6.stdout, family="ip6").tables
            source += " + " + best[1].replace("iptables", "ip6tables", 1)
        except ParseError as exc:
            notes.append(f"ip6tables rules could not be read ({exc}); IPv6 services not traced")
    return ruleset, source, notes


def read_ipvs(netns: str | None) -> tuple[str, str | None] | None:
    """An IPVS-mode node's `ipvsadm-save -n` and `ipset save` (None if the node has no virtual
    server, or no ipvsadm: then its rules alone are what handles Services)."""
    table = _run(["ipvsadm-save", "-n"], netns)
    if table is None or table.returncode != 0 or not any(ln.startswith("-A ") for ln in table.stdout.splitlines()):
        return None
    sets = _run(["ipset", "save"], netns)
    return table.stdout, sets.stdout if sets is not None and sets.returncode == 0 else None


def read_facts(netns: str | None, *, entries: bool = True) -> NodeFacts:
    facts = NodeFacts()
    for name in SYSCTLS:
        v = read_sysctl(name, netns)
        if v is not None:
            facts.sysctls[name] = v
    stats = _run(["conntrack", "-S"], netns)
    if stats is not None and stats.returncode == 0:
        facts.stats = parse_conntrack_stats(stats.stdout)
    if entries:
        for family in ("ipv4", "ipv6"):
            listing = _run(["conntrack", "-L", "-f", family], netns, timeout=120)
            if listing is not None and listing.returncode == 0:
                facts.flows = (facts.flows or []) + parse_flows(listing.stdout)
    return facts


def read_node(netns: str | None = None, *, entries: bool = True) -> LiveNode:
    ruleset, source, notes = read_rules(netns)
    try:
        node = Node.from_live(netns)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
        raise LiveError(f"cannot read interfaces and routes: {exc}") from None
    facts = read_facts(netns, entries=entries)
    if facts.flows is None:
        notes.append("conntrack -L failed or is missing: current SNAT use unknown")
    return LiveNode(ruleset, source + (f" (netns {netns})" if netns else ""), node, facts, notes)
