"""Every path users write keeps working: each `pytest_ortdiff...` name the README, the docs, the examples and the
benchmarks write (imports, dotted names, `python -m ...`) and DESIGN.md's public table resolves, and a path of
the flat layout names the very module of its layer (one object: a monkeypatch through either is seen by both)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import pytest_ortdiff

ROOT = Path(__file__).resolve().parent.parent
#: where users read paths (docs/_incoming/ holds pages not yet merged into the site: not read)
SOURCES = sorted(
    [ROOT / "README.md"]
    + [p for p in (ROOT / "docs").rglob("*.md") if "_incoming" not in p.parts]
    + sorted((ROOT / "examples").glob("*.py"))
    + sorted((ROOT / "benchmarks").glob("*.py"))
    + sorted((ROOT / "benchmarks").glob("*.sh"))
)
#: DESIGN.md's table of public names (the file lives outside the repository)
DESIGN = (
    "pytest_ortdiff.compare",
    "pytest_ortdiff.DiffReport",
    "pytest_ortdiff.Tolerance",
    "pytest_ortdiff.TorchEvaluator",
    "pytest_ortdiff.OrtRunner",
    "pytest_ortdiff.blame",
    "pytest_ortdiff.BlameTable",
    "pytest_ortdiff.Checker",
    "pytest_ortdiff.models.layer_norm_matmul_add",
    "pytest_ortdiff.models.random_feeds",
    "pytest_ortdiff.precision.audit",
    "pytest_ortdiff.precision.keep_float32",
    "pytest_ortdiff.align.compare_executions",
    "pytest_ortdiff.align.check_deployment",
    "pytest_ortdiff.parity.check_export",
    "pytest_ortdiff.dynamo.ort_backend",
    "pytest_ortdiff.strategies.dims",
    "pytest_ortdiff.plugin.ortdiff",
    "pytest_ortdiff.conformance.main",
    "pytest_ortdiff.contrib_cases.all_cases",
)

_FROM = re.compile(r"from\s+(pytest_ortdiff(?:\.\w+)*)\s+import\s+(\([^)]*\)|[\w ,]+)")
_DOTTED = re.compile(r"(?<![\w.])pytest_ortdiff(?:\.[A-Za-z_]\w*)+")
_RUN = re.compile(r"python -m (pytest_ortdiff(?:\.\w+)*)")


def _written() -> tuple[list[str], list[str]]:
    """The dotted paths the sources write (an import's names as `module.name`), and the modules they run."""
    paths: set[str] = set(DESIGN)
    runs: set[str] = {"pytest_ortdiff", "pytest_ortdiff.conformance"}
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        for module, names in _FROM.findall(text):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.split(" as ")[0].strip()
                if name and name != "*":
                    paths.add(f"{module}.{name}")
        paths.update(_DOTTED.findall(text))
        runs.update(_RUN.findall(text))
    return sorted(paths), sorted(runs)


PATHS, RUNS = _written()


def resolve(path: str) -> Any:
    """The object `path` names: its longest importable prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(path)


def test_the_sources_write_paths() -> None:
    # (a regex that found nothing would pass every case below)
    assert len(PATHS) > 80 and "pytest_ortdiff.precision.audit" in PATHS and "pytest_ortdiff.fixtures.OrtDiffFailure" in PATHS and "pytest_ortdiff.analyses.align.Alignment" in PATHS


@pytest.mark.parametrize("path", PATHS)
def test_a_written_path_resolves(path: str) -> None:
    assert resolve(path) is not None


@pytest.mark.parametrize("module", RUNS)
def test_a_written_module_runs(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: python -m {module}"), out.stderr


@pytest.mark.parametrize(("old", "new"), sorted(pytest_ortdiff.MOVED.items()))
def test_an_old_path_is_the_module_of_its_layer(old: str, new: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__name__ == new and module.__spec__.name == new
    assert sys.modules[old] is module
    if old.rpartition(".")[2] not in ("blame",):  # (the package keeps `blame` for the function)
        assert resolve(old) is module


def test_a_submodule_of_a_moved_package_is_one_module_too() -> None:
    assert importlib.import_module("pytest_ortdiff.precision.keep") is importlib.import_module("pytest_ortdiff.analyses.precision.keep")
    assert importlib.import_module("pytest_ortdiff.contrib_cases.attention") is importlib.import_module("pytest_ortdiff.conformance.contrib_cases.attention")
    assert pytest_ortdiff.moved_to("pytest_ortdiff.precision.keep") == "pytest_ortdiff.analyses.precision.keep"
    assert pytest_ortdiff.moved_to("pytest_ortdiff.models") is None


def test_a_monkeypatch_through_either_path_is_seen_by_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_ortdiff.engine.check as engine_check

    monkeypatch.setattr("pytest_ortdiff.check.missing_ops", "patched")
    assert engine_check.missing_ops == "patched"
    monkeypatch.setattr(engine_check, "row_for", "also")
    assert importlib.import_module("pytest_ortdiff.check").row_for == "also"


def test_the_old_paths_load_on_first_use() -> None:
    """`import pytest_ortdiff` imports none of the moved modules but the light ones the package reads
    itself; an old path loads its module when asked for, and torch only with it."""
    code = (
        "import sys, pytest_ortdiff\n"
        "print(sorted(m for m in pytest_ortdiff.MOVED.values() if m in sys.modules))\n"
        "import pytest_ortdiff.results, pytest_ortdiff.matrix\n"
        "print('torch' in sys.modules, 'pytest_ortdiff.numerics.results' in sys.modules)\n"
        "from pytest_ortdiff import strategies\n"
        "print(strategies.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["['pytest_ortdiff.numerics.dtypes', 'pytest_ortdiff.numerics.formatting', 'pytest_ortdiff.numerics.tolerance']", "False True", "pytest_ortdiff.analyses.strategies"]


def test_the_plugin_entry_point_holds_the_hooks_and_fixtures() -> None:
    """pytest's entry point loads `pytest_ortdiff.plugin` and registers what is on it."""
    import pytest_ortdiff.plugin as plugin

    hooks = {name for name in dir(plugin) if name.startswith("pytest_")}
    assert hooks == {"pytest_addoption", "pytest_configure", "pytest_unconfigure", "pytest_generate_tests", "pytest_itemcollected", "pytest_runtest_setup", "pytest_runtest_call"}
    assert all(callable(getattr(plugin, name)) for name in ("ortdiff", "ort_provider", "ort_dtype", "_ortdiff_case"))
    assert isinstance(plugin, types.ModuleType) and plugin.__file__ is not None and plugin.__file__.endswith("plugin/__init__.py")
