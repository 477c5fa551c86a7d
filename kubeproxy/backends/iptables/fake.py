"""An in-memory iptables for tests without root, shipped as knftables ships its Fake.

`FakeIptables().run` has the signature of every `Runner` (argv, input=, check=, timeout=) and
understands what the iptables backend runs: `iptables[-legacy|-nft] -w -t T -S/-N/-X/-F/-C/-I/-D`,
`iptables-save -t T`, `iptables-restore -w --noflush [--counters|--test]` (one atomic commit per
table; a jump to a missing chain, or deleting a chain still jumped to, fails the whole table
as the kernel does), the ip6tables forms, and `nfacct add/get`. Rules are kept as the text they
were given (our renderer writes them in iptables-save's canonical form, MARK's --or-mark aside),
so `-S` and `iptables-save` print them back as the kernel would. tests/backends/iptables/test_proxier.py runs the same
scenarios on this and on a real kernel in a namespace, which keeps it honest.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubeproxy.kernel.fake_tool import Refused, answer
from kubeproxy.model.options import Family

BUILTIN = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
}
# Targets that are not chains: a jump to anything else must name an existing chain.
TARGETS = frozenset(
    {"ACCEPT", "DROP", "RETURN", "REJECT", "MASQUERADE", "DNAT", "SNAT", "MARK", "CONNMARK", "LOG", "NOTRACK", "CT", "REDIRECT"}
)


Table = dict[str, list[str]]  # chain -> its rules, as `-A CHAIN ...` lines


def _empty() -> dict[str, Table]:
    return {t: {c: [] for c in chains} for t, chains in BUILTIN.items()}


@dataclass
class FakeIptables:
    """The iptables state of one network namespace (both families, and nfacct counters)."""

    families: dict[str, dict[str, Table]] = field(default_factory=lambda: {"4": _empty(), "6": _empty()})
    nfacct: dict[str, int] | None = field(default_factory=dict)  # None: the kernel has no nfacct
    calls: list[list[str]] = field(default_factory=list)  # every argv run, for assertions

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return answer(self.calls, argv, lambda args: self._dispatch(args, input), check=check, stderr_prefix=f"{argv[0]}: ")

    # ------------------------------------------------------------------ views for tests
    def tables(self, family: Family = Family.IPV4) -> dict[str, Table]:
        return self.families["6" if family.ipv6 else "4"]

    def rules(self, table: str, chain: str, family: Family = Family.IPV4) -> list[str]:
        return list(self.tables(family)[table][chain])

    # ------------------------------------------------------------------ commands
    def _dispatch(self, argv: list[str], stdin: str | None) -> str:
        tool = argv[0]
        if tool == "nfacct":
            return self._nfacct(argv[1:])
        base = tool.removesuffix("-save").removesuffix("-restore")
        family = "6" if base.startswith("ip6tables") else "4"
        if base not in ("iptables", "iptables-legacy", "iptables-nft", "ip6tables", "ip6tables-legacy", "ip6tables-nft"):
            raise Refused(f"the fake does not know {tool}")
        tables = self.families[family]
        if tool.endswith("-save"):
            return self._save(tables, _option(argv, "-t"))
        if tool.endswith("-restore"):
            if "--noflush" not in argv:
                raise Refused("the fake only restores with --noflush")
            self._restore(tables, stdin or "", commit="--test" not in argv)
            return ""
        return self._command(tables, [a for a in argv[1:] if a != "-w"])

    def _save(self, tables: dict[str, Table], only: str | None) -> str:
        out = []
        for name, table in tables.items():
            if only and name != only:
                continue
            out.append(f"*{name}")
            for chain in table:
                policy = "ACCEPT" if chain in BUILTIN[name] else "-"
                out.append(f":{chain} {policy} [0:0]")
            out.extend(rule for rules in table.values() for rule in rules)
            out.append("COMMIT")
        return "\n".join(out) + "\n"

    def _command(self, tables: dict[str, Table], args: list[str]) -> str:
        table_name = "filter"
        if args[:1] == ["-t"]:
            table_name, args = args[1], args[2:]
        table = tables[table_name]
        verb, chain, rest = args[0], args[1] if len(args) > 1 else "", args[2:]
        if verb in ("-F", "-X") and not chain:  # the whole table, as a firewall reload does
            for name in list(table):
                if verb == "-F":
                    table[name] = []
                elif name not in BUILTIN[table_name]:
                    del table[name]
            return ""
        if verb == "-S" and not chain:  # the whole table: policies, then chains, then rules
            heads = [f"-P {c} ACCEPT" for c in table if c in BUILTIN[table_name]]
            heads += [f"-N {c}" for c in table if c not in BUILTIN[table_name]]
            return "\n".join([*heads, *(rule for rules in table.values() for rule in rules)]) + "\n"
        if verb == "-S":
            if chain not in table:
                raise Refused(f"chain `{chain}' in table `{table_name}' is incompatible or does not exist")
            head = f"-P {chain} ACCEPT" if chain in BUILTIN[table_name] else f"-N {chain}"
            return "\n".join([head, *table[chain]]) + "\n"
        if verb == "-N":
            if chain in table:
                raise Refused("Chain already exists.")
            table[chain] = []
        elif verb in ("-X", "-F"):
            if chain not in table:
                raise Refused("No chain/target/match by that name.")
            if verb == "-F":
                table[chain] = []
            elif table[chain] or _users(table, chain) or chain in BUILTIN[table_name]:
                raise Refused("Directory not empty / Too many links")
            else:
                del table[chain]
        elif verb in ("-C", "-I", "-D", "-A"):
            if chain not in table:
                raise Refused("No chain/target/match by that name.")
            rule = _rule_text(chain, rest)
            present = rule in table[chain]
            if verb in ("-I", "-A"):
                self._check_rule(table, rule)
                table[chain].insert(0 if verb == "-I" else len(table[chain]), _canonical(rule))
            elif not present:
                raise Refused("Bad rule (does a matching rule exist in that chain?).")
            elif verb == "-D":
                table[chain].remove(rule)
        else:
            raise Refused(f"the fake does not know {verb}")
        return ""

    def _restore(self, tables: dict[str, Table], text: str, *, commit: bool) -> None:
        work: Table | None = None
        name = ""
        for n, line in enumerate(text.splitlines(), 1):
            try:
                if not line.strip() or line.startswith("#"):
                    continue
                if line.startswith("*"):
                    name = line[1:].strip()
                    work = {c: list(r) for c, r in tables[name].items()}
                    continue
                if work is None:
                    raise Refused("no table given")
                if line == "COMMIT":
                    if commit:
                        tables[name] = work
                    work = None
                elif line.startswith(":"):
                    chain = line[1:].split()[0]
                    if chain not in BUILTIN[name]:
                        work[chain] = []  # --noflush still flushes a chain it declares
                else:
                    self._restore_line(name, work, line)
            except Refused as exc:
                raise Refused(f"line {n} failed: {exc}") from None

    def _restore_line(self, table_name: str, work: Table, line: str) -> None:
        args = shlex.split(line)
        verb, chain = args[0], args[1] if len(args) > 1 else ""
        if verb in ("-A", "-I"):
            if chain not in work:
                raise Refused(f"chain {chain} does not exist")
            rule = _rule_text(chain, args[2:]) if verb == "-I" else line
            self._check_rule(work, rule)
            if verb == "-A":
                work[chain].append(_canonical(line))
            else:
                work[chain].insert(0, rule)
        elif verb == "-X":
            if chain not in work or chain in BUILTIN[table_name]:
                raise Refused(f"no chain {chain} to delete")
            if _users(work, chain):
                raise Refused(f"chain {chain} is still in use")
            del work[chain]
        elif verb == "-F":
            work[chain] = []
        else:
            raise Refused(f"the fake does not know {verb}")

    @staticmethod
    def _check_rule(table: Table, rule: str) -> None:
        """What the kernel and iptables' extensions would refuse, as far as our rules go."""
        target = _target(rule)
        if target and target not in TARGETS and target not in table:
            raise Refused(f"Couldn't load target `{target}'")
        parts = shlex.split(rule)
        for flag, valid in _VALUES.items():
            if flag in parts and not valid(parts[parts.index(flag) + 1]):
                raise Refused(f"{flag}: bad value `{parts[parts.index(flag) + 1]}'")

    def _nfacct(self, args: list[str]) -> str:
        if self.nfacct is None:
            raise Refused("nfacct: no such file or directory")
        verb, name = args[0], args[1] if len(args) > 1 else ""
        if verb == "add":
            if name in self.nfacct:
                raise Refused("File exists")
            self.nfacct[name] = 0
            return ""
        if verb == "get":
            if name not in self.nfacct:
                raise Refused("No such file or directory")
            return f"{{ pkts = {self.nfacct[name]:020d}, bytes = {0:020d} }} = {name};\n"
        raise Refused(f"the fake does not know nfacct {verb}")


def _number(text: str) -> bool:
    try:
        int(text, 0)
    except ValueError:
        return False
    return True


def _probability(text: str) -> bool:
    try:
        return 0.0 <= float(text) <= 1.0
    except ValueError:
        return False


# Option values the fake checks as iptables' extensions do (a wrong mark is a classic failure).
_VALUES = {
    "--set-xmark": lambda v: all(_number(p) for p in v.split("/")),
    "--mark": lambda v: all(_number(p) for p in v.split("/")),
    "--probability": _probability,
}


def _canonical(rule: str) -> str:
    """The rule as iptables-save prints it back, for what our rules need: MARK's --or-mark."""
    parts = rule.split(" ")
    if "--or-mark" in parts:
        i = parts.index("--or-mark")
        mark = hex(int(parts[i + 1], 0))
        parts[i : i + 2] = ["--set-xmark", f"{mark}/{mark}"]
    return " ".join(parts)


def _option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _rule_text(chain: str, args: list[str]) -> str:
    """A rule given as arguments, written back as iptables-save would (quoting words with spaces)."""
    return " ".join(["-A", chain, *(f'"{a}"' if " " in a else a for a in args)])


def _target(rule: str) -> str:
    parts = shlex.split(rule)
    for flag in ("-j", "-g"):
        if flag in parts:
            return parts[parts.index(flag) + 1]
    return ""


def _users(table: Table, chain: str) -> list[str]:
    return [r for rules in table.values() for r in rules if _target(r) == chain]
