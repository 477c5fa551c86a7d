"""`kubeproxy run` and `kube-proxy` load neither the lab, the doctor nor matplotlib, and need
nothing but the base install's dependencies (the node image has no lab extra)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO

PROBE = """
import sys
import kubeproxy.cli, kubeproxy.proxy.live_loop, kubeproxy.proxy.kube_proxy
heavy = sorted(m for m in sys.modules if m.startswith(("kubeproxy.lab", "kubeproxy.doctor", "matplotlib")))
print(",".join(heavy))
"""


def test_the_proxy_imports_no_lab_doctor_or_matplotlib() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_lazy_commands_still_load_on_demand() -> None:
    from click.testing import CliRunner

    from kubeproxy.cli import main

    result = CliRunner().invoke(main, ["dns", "check", "--help"])
    assert result.exit_code == 0 and "fresh source port" in result.output
    result = CliRunner().invoke(main, ["doctor", "--help"])
    assert result.exit_code == 0


def _optional(node: ast.Try) -> bool:
    """A `try: import x / except ImportError:` block: the module works without x."""
    names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def _imports(module: str) -> Iterator[str]:
    """Every module `module` may import at run time: any depth of its code, not under
    `if TYPE_CHECKING:` and not in an optional-import `try`."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (name for child in node.orelse for name in walk(child))
            return
        if isinstance(node, ast.Try) and _optional(node):
            return
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            yield from walk(child)

    yield from walk(ast.parse(path.read_text()))


def _is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def proxy_closure(*roots: str) -> tuple[set[str], set[str]]:
    """(kubeproxy modules, other top-level modules) reachable from `roots` through `_imports`."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name.split(".")[0] != "kubeproxy":
            outside.add(name.split(".")[0])
            continue
        if name in seen or not _is_module(name):
            continue
        seen.add(name)
        todo.extend(".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))
        todo.extend(_imports(name))
    return seen, outside - set(sys.stdlib_module_names)


def _distribution(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", requirement)[0]).lower()


def test_the_proxys_import_closure_needs_no_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_distribution(dep) for dep in project["dependencies"]}
    provided_by = metadata.packages_distributions()
    modules, third_party = proxy_closure("kubeproxy.proxy.kube_proxy", "kubeproxy.proxy.live_loop")
    # Each third-party module the proxy can import comes with a base dependency (or one of theirs).
    needs = {module: {_distribution(d) for d in provided_by.get(module, [])} for module in third_party}
    reachable = set(base)
    pending = list(base)
    while pending:
        try:
            requirements = metadata.requires(pending.pop()) or []
        except metadata.PackageNotFoundError:  # a dependency whose marker excludes this Python
            continue
        for requirement in requirements:
            if "extra ==" not in requirement and (dist := _distribution(requirement)) not in reachable:
                reachable.add(dist)
                pending.append(dist)
    assert {module: dists for module, dists in needs.items() if not dists & reachable} == {}
    assert not any(m.startswith(("kubeproxy.lab", "kubeproxy.doctor", "kubeproxy.demo_report")) for m in modules)
    # The walk sees what it should: the API client and the config loader are in the closure.
    assert {"httpx2", "pydantic", "yaml", "prometheus_client"} <= third_party


def test_a_lab_command_without_the_lab_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from kubeproxy.cli import main

    rich_users = ("rich.", "kubeproxy.demo_report", "kubeproxy.lab.tables")
    for name in [m for m in sys.modules if m == "rich" or m.startswith(rich_users)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # as if not installed: importing it fails
    result = CliRunner().invoke(main, ["demo", "--offline"])
    assert result.exit_code == 1
    assert "`kubeproxy demo` needs rich, from kubeproxy's lab extra: pip install 'kubeproxy[lab]'" in result.output
    assert "Traceback" not in result.output


def test_the_backends_do_not_import_the_application() -> None:
    # The contract, the registry, the fakes and every mode's folder sit below the application
    # that runs them: none of them reaches the CLI, the flags, kube-proxy's server or the live loop.
    files = (ROOT / "kubeproxy" / "backends").rglob("*.py")
    modules, _ = proxy_closure(*(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in files))
    application = {
        "kubeproxy.cli",
        "kubeproxy.proxy.live_loop",
        "kubeproxy.proxy.event_intake",
        "kubeproxy.proxy.status_servers",
        "kubeproxy.proxy.kube_proxy",
        "kubeproxy.proxy.flags",
        "kubeproxy.proxy.family_lanes",
        "kubeproxy.proxy.runner",
        "kubeproxy.proxy.health",
        "kubeproxy.proxy.snat_watch",
    }
    assert "kubeproxy.backends.registry" in modules and "kubeproxy.backends.nftables.proxier" in modules
    assert modules & application == set()
