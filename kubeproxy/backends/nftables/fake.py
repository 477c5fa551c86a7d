"""An in-memory nft for tests without root, shipped as knftables ships its Fake.

`FakeNft().run` has the signature of every `Runner` and understands what the nftables backend
runs: `nft -f -` (one atomic transaction: a refused line leaves the table as it was), `nft -c -f -`
(checked, never applied), `nft -j list chain`, `nft -j [-t] list table`, `nft delete table`. It
parses the text we write (knftables' style: `add table/chain/rule/set/map/element/ct timeout`,
`flush chain`, `delete ...`) and refuses what the kernel refuses for our kind of table:

- a rule, element verdict or `ct timeout set` naming a chain, set, map or object that does not
  exist; deleting a chain, set or object something still uses ("Device or resource busy": for a
  chain, a jump/goto from another chain's rule or a map element; its own rules go with it);
- a base chain added again with another hook or priority ("Operation not supported") or
  another type, or a regular chain added again as a base chain ("File exists");
- an element that overlaps another in an interval set, or a map key added again with another
  value ("File exists"); deleting an element, chain or set that is not there;
- a comment of more than 128 characters; a set added again with another type.

Elements and rules are kept as text, as they were written. tests/backends/nftables/test_fake.py and
test_fake_vs_kernel.py run the same transactions and applier scenarios (random changes, an
interrupted create, a restart) on this and on a real kernel in a namespace, which keeps it honest.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubeproxy.kernel.fake_tool import Refused, answer
from kubeproxy.kernel.kernel_text import NFT_COMMENT_MAX


@dataclass
class _Set:
    kind: str  # set | map
    declaration: str
    flags: tuple[str, ...]
    elements: dict[str, str | None] = field(default_factory=dict)  # key -> value (maps)

    @property
    def interval(self) -> bool:
        return "interval" in self.flags


@dataclass
class _Chain:
    declaration: str
    rules: list[str] = field(default_factory=list)


@dataclass
class _Table:
    declaration: str = ""
    chains: dict[str, _Chain] = field(default_factory=dict)
    sets: dict[str, _Set] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)  # ct timeout or counter name -> declaration
    object_kinds: dict[str, str] = field(default_factory=dict)  # name -> "ct timeout" / "counter"


_BLOCK = re.compile(r"\{(.*)\}\s*$", re.S)
_COMMENT = re.compile(r'comment "([^"]*)"')
_REFS = re.compile(r"(?:jump|goto)\s+(\S+)")
_SET_REFS = re.compile(r"@([^\s,}]+)")
_TIMEOUT_REF = re.compile(r'ct timeout set "([^"]+)"')
_COUNTER_REF = re.compile(r'counter name "([^"]+)"')


@dataclass
class FakeNft:
    """The nftables state of one network namespace."""

    tables: dict[tuple[str, str], _Table] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return answer(self.calls, argv, lambda args: self._dispatch(args[1:], input or ""), check=check, stderr_prefix="Error: ")

    # ------------------------------------------------------------------ commands
    def _dispatch(self, args: list[str], stdin: str) -> str:
        as_json = "-j" in args
        checking = "-c" in args
        args = [a for a in args if a not in ("-j", "-t", "-c")]
        if args[:2] == ["-f", "-"]:
            work = copy.deepcopy(self.tables)
            for n, line in enumerate(stdin.splitlines(), 1):
                if line.strip():
                    try:
                        self._statement(work, line.strip())
                    except Refused as exc:
                        raise Refused(f"/dev/stdin:{n}: {exc}\n{line[:300]}") from None
            if not checking:
                self.tables = work
            return ""
        if args[:2] == ["delete", "table"]:
            key = (args[2], args[3])
            if key not in self.tables:
                raise Refused("No such file or directory")
            del self.tables[key]
            return ""
        if args[:1] == ["list"] and as_json:
            return self._list_json(args[1:])
        if args[:2] == ["list", "ruleset"]:
            return self._list_text(args[2] if len(args) > 2 else None)
        raise Refused(f"the fake does not know `nft {' '.join(args)}`")

    def _statement(self, tables: dict[tuple[str, str], _Table], line: str) -> None:
        for comment in _COMMENT.findall(line):
            if len(comment) > NFT_COMMENT_MAX:
                raise Refused(f"comment too long, {NFT_COMMENT_MAX} characters maximum allowed")
        words = line.split()
        verb, kind = words[0], words[1]
        if kind == "ct":  # `ct timeout`
            kind, words = "ct timeout", [verb, "ct timeout", *words[3:]]
        family, table_name = words[2], words[3]
        key = (family, table_name)
        if kind == "table":
            if verb == "add":
                tables.setdefault(key, _Table(_block(line)))
            elif verb == "delete" and tables.pop(key, None) is None:
                raise Refused("No such file or directory")
            return
        table = tables.get(key)
        if table is None:
            raise Refused("No such file or directory (table)")
        name = words[4]
        if kind == "chain":
            self._chain(table, verb, name, _block(line))
        elif kind == "rule":
            body = line.split(None, 5)[5]
            if name not in table.chains:
                raise Refused(f"No such file or directory (chain {name})")
            self._check_refs(table, body)
            table.chains[name].rules.append(body)
        elif kind in ("set", "map"):
            self._set(table, verb, kind, name, _block(line))
        elif kind == "element":
            self._elements(table, verb, name, _block(line))
        elif kind in ("ct timeout", "counter"):
            if verb == "add":
                old = table.objects.setdefault(name, _block(line))
                table.object_kinds.setdefault(name, kind)
                if old != _block(line):
                    raise Refused(f"File exists ({kind})")
            elif verb == "delete":
                if name not in table.objects:
                    raise Refused("No such file or directory")
                if any(f'"{name}"' in r for c in table.chains.values() for r in c.rules):
                    raise Refused("Device or resource busy")
                del table.objects[name]
                table.object_kinds.pop(name, None)
        else:
            raise Refused(f"the fake does not know `{verb} {kind}`")

    @staticmethod
    def _chain(table: _Table, verb: str, name: str, declaration: str) -> None:
        if verb == "add":
            old = table.chains.get(name)
            if old is None:
                table.chains[name] = _Chain(declaration)
            elif _hook(declaration) and not _hook(old.declaration):
                raise Refused("File exists (a regular chain cannot become a base chain)")
            elif _hook(declaration) and _chain_type(old.declaration) != _chain_type(declaration):
                raise Refused("File exists (a base chain's type cannot change)")
            elif _hook(declaration) and _hook(old.declaration) != _hook(declaration):
                raise Refused("Operation not supported (a base chain's hook or priority cannot change)")
            return  # the same chain again, or a declaration without a hook: taken, the chain stays
        if name not in table.chains:
            raise Refused(f"No such file or directory (chain {name})")
        if verb == "flush":
            table.chains[name].rules = []
        elif verb == "delete":
            # The kernel deletes a chain's own rules with it (and what they referenced is then
            # free in the same transaction); only a jump/goto from elsewhere keeps it busy.
            if _chain_users(table, name):
                raise Refused("Device or resource busy")
            del table.chains[name]

    @staticmethod
    def _set(table: _Table, verb: str, kind: str, name: str, declaration: str) -> None:
        if verb == "add":
            old = table.sets.get(name)
            flags = tuple(re.findall(r"flags ([\w,]+)", declaration)[0].split(",")) if "flags " in declaration else ()
            if old is None:
                table.sets[name] = _Set(kind, declaration, flags)
            elif _type(old.declaration) != _type(declaration) or old.kind != kind:
                raise Refused("File exists (set of another type)")
            return
        if name not in table.sets:
            raise Refused(f"No such file or directory ({kind} {name})")
        if verb == "flush":
            table.sets[name].elements.clear()
        elif verb == "delete":
            if any(_uses(r, name) for c in table.chains.values() for r in c.rules):
                raise Refused("Device or resource busy")
            del table.sets[name]

    def _elements(self, table: _Table, verb: str, name: str, block: str) -> None:
        s = table.sets.get(name)
        if s is None:
            raise Refused(f"No such file or directory (set {name})")
        for raw in _split_elements(block):
            elem_key, value = _element(raw)
            if verb == "delete":
                if elem_key not in s.elements:
                    raise Refused(f"No such file or directory (element {elem_key})")
                del s.elements[elem_key]
                continue
            if value is not None:
                self._check_refs(table, value)
            if elem_key in s.elements:
                if s.elements[elem_key] != value:
                    raise Refused(f"File exists (element {elem_key})")
                continue
            if s.interval and any(_overlap(elem_key, other) for other in s.elements):
                raise Refused("Could not process rule: File exists (interval overlaps)")
            s.elements[elem_key] = value

    @staticmethod
    def _check_refs(table: _Table, text: str) -> None:
        for chain in _REFS.findall(text):
            if chain not in table.chains:
                raise Refused(f"Could not process rule: No such file or directory (chain {chain})")
        for name in _SET_REFS.findall(text):
            if name not in table.sets:
                raise Refused(f"Could not process rule: No such file or directory (set {name})")
        for name in _TIMEOUT_REF.findall(text):
            if name not in table.objects:
                raise Refused(f"Could not process rule: No such file or directory (ct timeout {name})")
        for name in _COUNTER_REF.findall(text):
            if table.object_kinds.get(name) != "counter":
                raise Refused(f"Could not process rule: No such file or directory (counter {name})")

    # ------------------------------------------------------------------ listings
    def _list_text(self, family: str | None) -> str:
        """`list ruleset [FAMILY]` in nft's layout (declarations, set elements, chains' rules),
        not byte for byte: what a test reads is which tables, elements and rules there are."""
        out: list[str] = []
        for (fam, name), table in self.tables.items():
            if family is not None and fam != family:
                continue
            out += [f"table {fam} {name} {{", *([f"\t{table.declaration}"] if table.declaration else [])]
            for set_name, s in table.sets.items():
                out += [f"\t{s.kind} {set_name} {{", f"\t\t{s.declaration}"]
                if s.elements:
                    shown = (k if v is None else f"{k} : {v}" for k, v in s.elements.items())
                    out.append(f"\t\telements = {{ {', '.join(shown)} }}")
                out.append("\t}")
            for chain_name, chain in table.chains.items():
                out += [f"\tchain {chain_name} {{", *(f"\t\t{line}" for line in [chain.declaration, *chain.rules] if line)]
                out.append("\t}")
            out.append("}")
        return "\n".join(out) + "\n" if out else ""

    def _list_json(self, args: list[str]) -> str:
        if args[0] == "ruleset":  # `list ruleset FAMILY`: each table of the family, as `list table` lists it
            tables = [json.loads(self._list_json(["table", f, t]))["nftables"][1:] for f, t in self.tables if f == args[1]]
            return json.dumps({"nftables": [{"metainfo": {"json_schema_version": 1}}, *(i for t in tables for i in t)]})
        what, family, table_name = args[0], args[1], args[2]
        table = self.tables.get((family, table_name))
        if table is None:
            raise Refused("No such file or directory")
        items: list[dict[str, object]] = [{"metainfo": {"json_schema_version": 1}}]
        base = {"family": family, "table": table_name}
        if what == "chain":
            name = args[3]
            if name not in table.chains:
                raise Refused("No such file or directory")
            chains = {name: table.chains[name]}
        else:
            items.append({"table": {"family": family, "name": table_name}})
            chains = table.chains
            for set_name, s in table.sets.items():
                flags = [f for f in s.flags if f]
                items.append({s.kind: {**base, "name": set_name, **({"flags": flags} if flags else {})}})
            for obj in table.objects:
                items.append({table.object_kinds.get(obj, "ct timeout"): {**base, "name": obj}})
        for name, chain in chains.items():
            items.append({"chain": {**base, "name": name}})
            items.extend({"rule": {**base, "chain": name, "expr": [], "text": r}} for r in chain.rules)
        return json.dumps({"nftables": items})

    # ------------------------------------------------------------------ views for tests
    def table(self, family: str = "ip", name: str = "kube-proxy") -> _Table | None:
        return self.tables.get((family, name))


def _block(line: str) -> str:
    m = _BLOCK.search(line)
    return m.group(1).strip() if m else ""


def _hook(declaration: str) -> str:
    m = re.search(r"hook (\w+) priority (-?\d+)", declaration)
    return m.group(0) if m else ""


def _chain_type(declaration: str) -> str:
    m = re.search(r"\btype (\w+) hook ", declaration)
    return m.group(1) if m else ""


def _type(declaration: str) -> str:
    return declaration.split(";", 1)[0].strip()


def _uses(rule: str, set_name: str) -> bool:
    return set_name in _SET_REFS.findall(rule)


def _chain_users(table: _Table, chain: str) -> bool:
    in_rules = any(chain in _REFS.findall(r) for c in table.chains.values() for r in c.rules)
    in_maps = any(v is not None and chain in _REFS.findall(v) for s in table.sets.values() for v in s.elements.values())
    return in_rules or in_maps


def _split_elements(block: str) -> list[str]:
    """`a, b comment "x, y" : goto c` → the elements, not splitting inside quotes."""
    out: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in block:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        out.append("".join(current).strip())
    return out


def _element(raw: str) -> tuple[str, str | None]:
    without_comment = _COMMENT.sub("", raw)
    if " : " in without_comment:
        key, value = without_comment.split(" : ", 1)
        return " ".join(key.split()), " ".join(value.split())
    return " ".join(without_comment.split()), None


def _overlap(a: str, b: str) -> bool:
    try:
        na, nb = ipaddress.ip_network(a, strict=False), ipaddress.ip_network(b, strict=False)
    except ValueError:
        return False
    return na.version == nb.version and na.overlaps(nb)
