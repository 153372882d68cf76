"""The layout DESIGN.md promises, checked on the source: the import graph of pytest_ortdiff (read with ast,
nothing imported) runs one way through the layers and has no cycle, only the pytest adapter imports pytest,
and importing the package, the plugin or the core stays light."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_ortdiff"

#: The package's layers, lowest first: a module imports from its own layer and the layers before it, never
#: from one after it (types included: a name imported for type checking is knowledge of its layer all the
#: same). A layer is a subpackage or a module at the package's root; the package's own __init__ (the public
#: names, loaded on first use) stands above them all. docs/architecture.md draws this order.
LAYERS = (
    "progress",  # progress bars for long work: imports nothing of ours
    "numerics",  # what a comparison is: dtypes, tensors, diff, tolerance, results, report, formatting
    "runtimes",  # onnxruntime, the torch evaluator and its kernels; model_io, providers, the run's selection
    "models",  # graph builders, their torch twins, random_feeds
    "engine",  # what the Checker composes: check, blame, baseline, reproducible
    "analyses",  # built on the Checker: fuzz, strategies, precision, align, parity, dynamo
    "reports",  # over many results: matrix, htmlreport, targets
    "plugin",  # the pytest adapter: hooks, fixtures, session
    "conformance",  # onnx's node suite and the contrib ops' cases
    "cli",
    "__main__",
)
#: the only layer that imports pytest
PYTEST_SIDE = "plugin"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (types only: no import at run time)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _imports(name: str, path: Path, modules: Mapping[str, Path], types: bool) -> Iterator[str]:
    """The package's modules that `name` imports anywhere in its code (function bodies too: a lazy import
    is still a dependency; under TYPE_CHECKING too when `types`), resolved against the package."""
    tree = _tree(path)
    skip = set() if types else _type_checking_only(tree)
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


def import_graph(package: Path = PACKAGE, *, types: bool = True) -> dict[str, frozenset[str]]:
    """Module -> the package's modules it imports (with those imported for type checking only, unless
    `types` is False)."""
    if package == PACKAGE:
        return _package_graph(types)
    modules = _modules(package)
    return {name: frozenset(t for t in _imports(name, path, modules, types) if t != name) for name, path in modules.items()}


@functools.cache
def _package_graph(types: bool) -> dict[str, frozenset[str]]:
    """The graph of this checkout's package (parsed once per process)."""
    modules = _modules(PACKAGE)
    return {name: frozenset(t for t in _imports(name, path, modules, types) if t != name) for name, path in modules.items()}


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


def layer(module: str) -> int:
    """The rank of `module`'s layer in LAYERS (the package's __init__: above them all). KeyError for a
    module of the package's root that LAYERS does not place: a new one gets its place there first."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)
    if parts[1] not in LAYERS:
        raise KeyError(f"{module}: pytest_ortdiff/{parts[1]} has no place in LAYERS (tests/test_architecture.py)")
    return LAYERS.index(parts[1])


def upward_imports(graph: Mapping[str, Set[str]]) -> list[str]:
    """Every import from a module to one of a higher layer, as "importer -> imported"."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer(module)


def test_imports_run_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert graph["pytest_ortdiff.plugin.fixtures"] >= {"pytest_ortdiff.engine.check"}
    # types included: the control-flow kernels name their bodies by a Protocol of their own, not the evaluator's class
    assert cycles(graph) == []
    assert not any(m.startswith("pytest_ortdiff.runtimes.evaluator") for m in graph["pytest_ortdiff.runtimes.kernels.controlflow"])


def test_a_cycle_is_found() -> None:
    # the cycle issue 11 named, as it was: fixtures -> strategies -> plugin -> fixtures
    graph = {"fixtures": {"strategies"}, "strategies": {"plugin"}, "plugin": {"fixtures", "session"}, "session": set()}
    assert cycles(graph) == [["fixtures", "plugin", "strategies"]]


@pytest.mark.parametrize(
    ("module", "planted", "found"),
    [
        # the upward imports the re-layout cut, planted back
        ("numerics/diff.py", "from ..runtimes.ort import OrtRunner\n", "pytest_ortdiff.numerics.diff -> pytest_ortdiff.runtimes.ort"),
        ("engine/baseline.py", "from .. import __version__\n", "pytest_ortdiff.engine.baseline -> pytest_ortdiff"),
        ("analyses/strategies.py", "def providers():\n    from ..plugin import hooks\n", "pytest_ortdiff.analyses.strategies -> pytest_ortdiff.plugin.hooks"),
        # for type checking only: it counts all the same
        ("numerics/report.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine.check import Checker\n", "pytest_ortdiff.numerics.report -> pytest_ortdiff.engine.check"),
    ],
)
def test_a_planted_upward_import_is_found(tmp_path: Path, module: str, planted: str, found: str) -> None:
    assert upward_imports(_planted(tmp_path, module, planted)) == [found]


def test_a_planted_subgraph_circle_is_found(tmp_path: Path) -> None:
    # the circle the re-layout cut: the control-flow kernels naming the evaluator's Subgraph (for types only)
    graph = _planted(tmp_path, "runtimes/kernels/controlflow.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..evaluator import Subgraph\n")
    assert upward_imports(graph) == []  # (within one layer)
    assert any({"pytest_ortdiff.runtimes.evaluator", "pytest_ortdiff.runtimes.kernels.controlflow"} <= set(c) for c in cycles(graph))


def test_a_module_without_a_layer_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "pytest_ortdiff"
    copy.mkdir()
    (copy / "__init__.py").write_text("")
    (copy / "helpers.py").write_text("")
    with pytest.raises(KeyError, match=r"pytest_ortdiff/helpers has no place in LAYERS"):
        for module in import_graph(copy):
            layer(module)


def _planted(tmp_path: Path, module: str, planted: str) -> dict[str, frozenset[str]]:
    """The package's import graph with `planted` appended to `module` (a path under the package)."""
    source = PACKAGE / module
    copy = tmp_path / source.name  # (the same file name: an __init__.py resolves its imports as a package)
    copy.write_text(source.read_text(encoding="utf-8") + "\n" + planted, encoding="utf-8")
    name = ".".join(["pytest_ortdiff", *Path(module).with_suffix("").parts]).removesuffix(".__init__")
    modules = _modules()
    assert name in modules
    return {**import_graph(), name: frozenset(t for t in _imports(name, copy, modules, True) if t != name)}


def test_only_the_plugin_imports_pytest() -> None:
    """Outside plugin/, no module imports pytest, nor reaches plugin/ through the package's imports: the
    command line and the core run where pytest is not installed (`tox -e merge`)."""
    graph = import_graph(types=False)
    modules = _modules()

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    side = f"pytest_ortdiff.{PYTEST_SIDE}"
    for name, path in modules.items():
        if name == side or name.startswith(side + "."):
            continue
        tree = _tree(path)
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level}
        assert not imported & {"pytest", "_pytest"}, f"{name} imports pytest"
        if name != "pytest_ortdiff":  # (the package's __init__ names none of them)
            assert not {m for m in reach(name) if m == side or m.startswith(side + ".")}, f"{name} reaches the pytest adapter"


def test_imports_stay_light() -> None:
    """One interpreter, four facts: the core leaves pytest out; the plugin (loaded by every pytest run)
    and the package load neither torch nor onnxruntime."""
    code = (
        "import sys\n"
        "import pytest_ortdiff.engine.check, pytest_ortdiff.numerics.results, pytest_ortdiff.runtimes.model_io\n"
        "import pytest_ortdiff.reports.targets, pytest_ortdiff.cli\n"
        "print('pytest' in sys.modules, '_pytest' in sys.modules)\n"
        "import pytest_ortdiff\n"
        "print(any(m in sys.modules for m in ('torch', 'onnxruntime')))\n"
        "import pytest_ortdiff.plugin\n"
        "print(any(m in sys.modules for m in ('torch', 'onnxruntime')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False", "False"], out.stdout + out.stderr


def test_public_names_resolve_after_their_modules_load() -> None:
    """`blame` is a module path and the public function: importing the one must not hide the other."""
    import importlib

    import pytest_ortdiff
    import pytest_ortdiff.engine.blame

    importlib.import_module("pytest_ortdiff.blame")  # binds the module on the package, as any user of the old path does
    blame = importlib.import_module("pytest_ortdiff").blame
    assert callable(blame) and blame.__module__ == "pytest_ortdiff.engine.blame"
    assert all(getattr(pytest_ortdiff, name) is not None for name in pytest_ortdiff.__all__)
    assert pytest_ortdiff.Checker.__module__ == "pytest_ortdiff.engine.check"
