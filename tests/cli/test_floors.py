"""The package's floors, from the bottom: what every part may use (runtime), the cluster's
objects and where they come from, the node model and the contract, the kernel tools, the modes,
the mode registry, and the application on top (the proxy's loop and servers, the CLI, doctor,
explain, the lab). An import runs down or within a floor, never up, and no two folders import
each other, however indirectly (a module imported only for type checking counts too: it is
still a dependency a reader must follow). netfilter/ reads rule sets and knows no Kubernetes:
it imports nothing of the rest."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.paths import REPO

PACKAGE = REPO / "kubeproxy"
ROOT_INIT = "kubeproxy(__init__)"  # the package itself: its __version__ only, loaded before any module

# Folder -> floor; a folder not listed takes its parent's floor.
FLOORS = {
    ROOT_INIT: 0,
    "kubeproxy.runtime": 0,
    "kubeproxy.cluster": 1,
    "kubeproxy.netfilter": 1,  # dumps, the ruleset model and the tracer: below all that reads them
    "kubeproxy.sources": 2,
    "kubeproxy.model": 2,
    "kubeproxy.kernel": 3,
    "kubeproxy.backends.iptables": 4,
    "kubeproxy.backends.nftables": 4,
    "kubeproxy.backends.ipvs": 4,
    "kubeproxy.backends.userspace": 4,
    "kubeproxy.backends.conntrack": 4,
    "kubeproxy.backends": 5,
    "kubeproxy.proxy": 6,
    "kubeproxy.doctor": 7,
    "kubeproxy.explain": 7,
    "kubeproxy.lab": 7,
    "kubeproxy": 8,  # cli.py, demo_report.py
}


def _modules() -> dict[str, str]:
    """Module name -> its folder (dotted), for every module of the package."""
    out: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        folder = ".".join(parts[:-1])
        if parts == ("kubeproxy", "__init__"):
            out["kubeproxy"] = ROOT_INIT
        elif parts[-1] == "__init__":
            out[".".join(parts[:-1])] = folder
        else:
            out[".".join(parts)] = folder
    return out


def _imported(module: str, path_of: dict[str, str]) -> Iterator[str]:
    """Every kubeproxy module `module` names in an import, at any depth of its code, or as a
    string that is a module's whole name (what `importlib.import_module` is given: the mode
    registry's lazily imported parts, the CLI's lazy commands)."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    # Logger names follow the package's names without importing anything.
    loggers = {id(arg) for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("getLogger")
               for arg in n.args}  # fmt: skip
    docstrings |= loggers
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        yield from (name for name in names if name in path_of and name != module)


def _edges() -> dict[tuple[str, str], list[str]]:
    """(folder, folder it imports) -> the imports that make the edge, between different folders."""
    folder_of = _modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for module, folder in folder_of.items():
        for target in _imported(module, folder_of):
            if folder_of[target] != folder:
                edges.setdefault((folder, folder_of[target]), []).append(f"{module} -> {target}")
    return edges


def _floor(folder: str) -> int:
    while folder not in FLOORS:
        folder = folder.rpartition(".")[0]
        assert folder, "every folder has a floor: add a new top-level folder to FLOORS"
    return FLOORS[folder]


def test_every_import_runs_down_or_within_a_floor() -> None:
    up = {f"{a} (floor {_floor(a)}) -> {b} (floor {_floor(b)})": why[:3]
          for (a, b), why in _edges().items() if _floor(b) > _floor(a)}  # fmt: skip
    assert up == {}


def test_no_two_folders_import_each_other_even_through_others() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in _edges():
        graph.setdefault(a, set()).add(b)
    # A folder that reaches itself again through the graph is in a cycle.
    cycles = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            folder = todo.pop()
            if folder == start:
                cycles[start] = sorted(graph[start])
                break
            if folder not in seen:
                seen.add(folder)
                todo.extend(graph.get(folder, ()))
    assert cycles == {}


def test_netfilter_knows_no_kubernetes() -> None:
    outside = {f"{a} -> {b}": why[:3] for (a, b), why in _edges().items()
               if a.startswith("kubeproxy.netfilter") and not b.startswith("kubeproxy.netfilter") and b != ROOT_INIT}  # fmt: skip
    assert outside == {}


def test_the_check_sees_an_upward_import() -> None:
    """The walk is not blind: the application imports the registry, a floor below it."""
    edges = _edges()
    assert ("kubeproxy.proxy", "kubeproxy.backends") in edges
    assert _floor("kubeproxy.proxy") > _floor("kubeproxy.backends")
    assert _floor("kubeproxy.backends.nftables") == FLOORS["kubeproxy.backends.nftables"]
