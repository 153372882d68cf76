"""The layout DESIGN.md promises, checked on the source: the import graph of pytest_ortdiff (read with ast,
nothing imported) has no cycle, the core imports no pytest, and importing the package, the plugin or the
core stays light."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_ortdiff"

#: the pytest-free core: what the command line and users without pytest run
CORE = (
    "engine.check",
    "numerics.results",
    "runtimes.selection",
    "runtimes.model_io",
    "numerics.formatting",
    "analyses.fuzz",
    "numerics.tolerance",
    "numerics.report",
    "numerics.diff",
    "numerics.dtypes",
    "runtimes.providers",
    "engine.blame",
    "engine.baseline",
    "engine.reproducible",
    "analyses.strategies",
    "cli",
)


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (types only: no import at run time)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The package's modules that `name` imports anywhere in its code (function bodies too: a lazy import
    is still a dependency), resolved against the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    yield sub  # from . import strategies
                elif target in modules:
                    yield target


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the package's modules it imports (parsed once per process)."""
    modules = _modules()
    return {name: frozenset(t for t in _imports(name, path, modules) if t != name) for name, path in modules.items()}


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert "pytest_ortdiff.engine.check" in graph and graph["pytest_ortdiff.plugin.fixtures"] >= {"pytest_ortdiff.engine.check"}
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    # the cycle issue 11 named, as it was: fixtures -> strategies -> plugin -> fixtures
    graph = {"fixtures": {"strategies"}, "strategies": {"plugin"}, "plugin": {"fixtures", "session"}, "session": set()}
    assert cycles(graph) == [["fixtures", "plugin", "strategies"]]


@pytest.mark.parametrize("module", CORE)
def test_the_core_imports_no_pytest(module: str) -> None:
    path = PACKAGE / f"{module.replace('.', '/')}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level}
    assert not imported & {"pytest", "_pytest"}, f"{module}.py imports pytest"
    # and nothing that does, inside the package
    pytest_side = {"pytest_ortdiff.plugin", "pytest_ortdiff.plugin.hooks", "pytest_ortdiff.plugin.fixtures", "pytest_ortdiff.plugin.session"}
    assert not import_graph()[f"pytest_ortdiff.{module}"] & pytest_side


def test_imports_stay_light() -> None:
    """One interpreter, four facts: the core leaves pytest out; the plugin (loaded by every pytest run)
    and the package load neither torch nor onnxruntime."""
    code = (
        "import sys\n"
        "import pytest_ortdiff.engine.check, pytest_ortdiff.numerics.results, pytest_ortdiff.runtimes.model_io, pytest_ortdiff.cli\n"
        "print('pytest' in sys.modules, '_pytest' in sys.modules)\n"
        "import pytest_ortdiff\n"
        "print(any(m in sys.modules for m in ('torch', 'onnxruntime')))\n"
        "import pytest_ortdiff.plugin\n"
        "print(any(m in sys.modules for m in ('torch', 'onnxruntime')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False", "False"], out.stdout + out.stderr


def test_public_names_resolve_after_their_modules_load() -> None:
    """`blame` is a submodule and the public function: importing the one must not hide the other."""
    import importlib

    import pytest_ortdiff

    importlib.import_module("pytest_ortdiff.blame")  # binds the module on the package, as any user of the old path does

    blame = importlib.import_module("pytest_ortdiff").blame
    assert callable(blame) and blame.__module__ == "pytest_ortdiff.engine.blame"
    assert all(getattr(pytest_ortdiff, name) is not None for name in pytest_ortdiff.__all__)
    assert pytest_ortdiff.Checker.__module__ == "pytest_ortdiff.engine.check"
