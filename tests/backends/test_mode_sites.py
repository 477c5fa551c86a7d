"""The registry is the only place that decides by a mode's name (test_toy_mode.py: a fifth mode
is its own code and one registry entry).

The scan counts the files outside `backends/registry.py` and the modes' own folders that compare
a value with a mode's name. Each one left compares a dump format, a configuration section or a
hop's table kind that happens to share a mode's name, not the proxy mode; or it is one of the
lab's readers of a node's rules, which a new mode's lab bed (not its proxy, render, cleanup,
configuration, metrics or `explain`) would add to.
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
    "proxy/config.py": "KubeProxyConfiguration's sections (iptables, ipvs, nftables), which Mode names per mode",
    "proxy/flags.py": "KubeProxyConfiguration's sections, as upstream's flags set them",
    # The lab's beds read the node's rules by their dump (iptables-save, nft JSON, ipvsadm-save,
    # the relay's state file) and compare against upstream's kube-proxy, which has only its modes.
    "lab/cluster.py": "load_rendered loads iptables-restore text only",
    "lab/node_rules.py": "the reader of each mode's rule dump, for the lab's waits",
    "lab/side_by_side.py": "upstream's IPVS tables beside ours (upstream's own modes only)",
}


EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _mode_names(node: ast.expr) -> set[str]:
    names = set(registry.MODES)
    if isinstance(node, ast.Constant) and node.value in names:
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
    return set()


def _comparing_files() -> dict[str, list[str]]:
    """Files outside the registry and the modes' folders: their comparisons with a mode's name."""
    own = {"backends/registry.py", *(f"backends/{name}/" for name in registry.MODES)}
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in own):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare) or not all(isinstance(op, EQUALITY) for op in node.ops):
                continue
            if any(_mode_names(side) for side in (node.left, *node.comparators)):
                found.setdefault(rel, []).append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_registry_compares_with_a_modes_name() -> None:
    found = _comparing_files()
    unexplained = [line for rel, lines in found.items() if rel not in NOT_THE_MODE for line in lines]
    assert unexplained == [], "read the mode's Mode record instead"
    assert sorted(found) == sorted(NOT_THE_MODE)  # an entry whose comparison went away goes too


def test_the_scan_sees_a_comparison_with_a_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site.py").write_text('def f(mode: str) -> bool:\n    return mode == "nftables"\n')
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _comparing_files() == {"site.py": ["site.py:2: mode == 'nftables'"]}
