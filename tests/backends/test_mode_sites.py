"""The registry is the only place that decides by a mode's name (test_toy_mode.py: a fifth mode
is its own code and one registry entry).

The scan counts the files outside `backends/registry.py` and the modes' own folders that branch
on a mode's name: compare a value with one (`==`, `in`, `.startswith`), match it in a `case`, or
look one up in a table keyed by mode names. Each one left compares a dump format, a
configuration section or a hop's table kind that happens to share a mode's name, not the proxy
mode. The lab is not among them: its beds read a node's rules back with the reader the mode's
record names (`Mode.readback`) and ask the record what the mode lists and needs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kubeproxy.backends import registry

PACKAGE = Path(__file__).resolve().parents[2] / "kubeproxy"

# File: why its comparison with a mode's name is about something else.
NOT_THE_MODE = {
    "doctor/reconstruct.py": "the dump's kind (doctor/core.py's mode_of: an nft or iptables listing), which parser reads it",
    "explain/service_walk.py": "a hop's table kind (the tracer's IPVS hops)",
    "explain/rendered.py": "a render's text format (Mode.render_format)",
    "netfilter/iptables_list.py": "the text of an `iptables -L` command line",
    "netfilter/simulate/engine.py": "a ruleset's source (iptables-save text or nft) and the tracer's IPVS stages",
    "proxy/config.py": "KubeProxyConfiguration's sections (iptables, ipvs, nftables), which Mode names per mode",
    "proxy/flags.py": "KubeProxyConfiguration's sections, as upstream's flags set them",
}


EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _mode_names(node: ast.expr) -> set[str]:
    names = set(registry.MODES)
    if isinstance(node, ast.Constant) and node.value in names:
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
    return set()


def _branches(node: ast.AST) -> bool:
    """Whether `node` decides by a mode's name."""
    if isinstance(node, ast.Compare) and all(isinstance(op, EQUALITY) for op in node.ops):
        return any(_mode_names(side) for side in (node.left, *node.comparators))
    if isinstance(node, ast.MatchValue):  # case "nftables":
        return bool(_mode_names(node.value))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith"):
        return any(_mode_names(arg) for arg in node.args)
    if isinstance(node, ast.Dict):  # {"iptables": ..., "nftables": ...}[mode]: a dispatch table
        return len({name for key in node.keys if key is not None for name in _mode_names(key)}) >= 2
    return False


def _comparing_files() -> dict[str, list[str]]:
    """Files outside the registry and the modes' folders: where they branch on a mode's name."""
    own = {"backends/registry.py", *(f"backends/{name}/" for name in registry.MODES)}
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in own):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _branches(node):
                line = getattr(node, "lineno", 0)
                found.setdefault(rel, []).append(f"{rel}:{line}: {ast.unparse(node)}")
    return found


def test_only_the_registry_compares_with_a_modes_name() -> None:
    found = _comparing_files()
    unexplained = [line for rel, lines in found.items() if rel not in NOT_THE_MODE for line in lines]
    assert unexplained == [], "read the mode's Mode record instead"
    assert sorted(found) == sorted(NOT_THE_MODE)  # an entry whose comparison went away goes too


def test_the_lab_asks_the_record() -> None:
    assert [rel for rel in NOT_THE_MODE if rel.startswith("lab/")] == []


BRANCHES = {
    'mode == "nftables"': "mode == 'nftables'",
    'mode in ("ipvs", "userspace")': "mode in ('ipvs', 'userspace')",
    'mode.startswith("ipvs")': "mode.startswith('ipvs')",
    '{"iptables": 1, "nftables": 2}[mode]': "{'iptables': 1, 'nftables': 2}",
}


@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_the_scan_sees_a_branch_on_a_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, branch: str) -> None:
    (tmp_path / "site.py").write_text(f"def f(mode: str) -> object:\n    return {branch}\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _comparing_files() == {"site.py": [f"site.py:2: {BRANCHES[branch]}"]}


def test_the_scan_sees_a_case_of_a_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site.py").write_text(
        'def f(mode: str) -> int:\n    match mode:\n        case "ipvs":\n            return 1\n    return 0\n'
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _comparing_files() == {"site.py": ["site.py:3: 'ipvs'"]}


def test_the_scan_leaves_a_mode_name_that_decides_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site.py").write_text('DEFAULT = "iptables"\nCOLOURS = {"nftables": "orange", "snat": "red"}\n')
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _comparing_files() == {}
