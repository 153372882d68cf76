"""pytest-ortdiff: numerical reproducibility regression testing of ONNX models.

torch evaluator vs onnxruntime vs a float64 oracle, per provider × dtype, with histogram diff reports.
Heavy names (torch, onnxruntime) load on first use, so `import pytest_ortdiff` stays cheap.

The code lives in layers (numerics, runtimes, models, engine, analyses, reports, plugin: docs/architecture.md);
the paths users write (`pytest_ortdiff.precision`, `pytest_ortdiff.align`, `pytest_ortdiff.check`, ...) stay:
each names the module of its layer, the same module object, imported when first asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .numerics.tolerance import Tolerance

if TYPE_CHECKING:
    from . import models
    from .engine.blame import BlameTable, blame
    from .engine.check import Checker
    from .numerics.diff import DiffReport, compare
    from .runtimes.evaluator import TorchEvaluator
    from .runtimes.ort import OrtRunner

__all__ = ["BlameTable", "Checker", "DiffReport", "OrtRunner", "Tolerance", "TorchEvaluator", "blame", "compare", "models"]
__version__ = "0.1.0"

_LAZY = {
    "compare": ("pytest_ortdiff.numerics.diff", "compare"),
    "DiffReport": ("pytest_ortdiff.numerics.diff", "DiffReport"),
    "TorchEvaluator": ("pytest_ortdiff.runtimes.evaluator", "TorchEvaluator"),
    "OrtRunner": ("pytest_ortdiff.runtimes.ort", "OrtRunner"),
    "models": ("pytest_ortdiff.models", None),
    "blame": ("pytest_ortdiff.engine.blame", "blame"),
    "BlameTable": ("pytest_ortdiff.engine.blame", "BlameTable"),
    "Checker": ("pytest_ortdiff.engine.check", "Checker"),
}

#: the module paths of the flat layout -> the modules of the layers that hold them now (a package's
#: submodules follow it: `pytest_ortdiff.precision.keep` is `pytest_ortdiff.analyses.precision.keep`)
MOVED = {
    "pytest_ortdiff.diff": "pytest_ortdiff.numerics.diff",
    "pytest_ortdiff.diff_triton": "pytest_ortdiff.numerics.diff_triton",
    "pytest_ortdiff.tolerance": "pytest_ortdiff.numerics.tolerance",
    "pytest_ortdiff.report": "pytest_ortdiff.numerics.report",
    "pytest_ortdiff.results": "pytest_ortdiff.numerics.results",
    "pytest_ortdiff.dtypes": "pytest_ortdiff.numerics.dtypes",
    "pytest_ortdiff.formatting": "pytest_ortdiff.numerics.formatting",
    "pytest_ortdiff.runtimes.tensors": "pytest_ortdiff.numerics.tensors",
    "pytest_ortdiff.model_io": "pytest_ortdiff.runtimes.model_io",
    "pytest_ortdiff.providers": "pytest_ortdiff.runtimes.providers",
    "pytest_ortdiff.selection": "pytest_ortdiff.runtimes.selection",
    "pytest_ortdiff.check": "pytest_ortdiff.engine.check",
    "pytest_ortdiff.blame": "pytest_ortdiff.engine.blame",
    "pytest_ortdiff.baseline": "pytest_ortdiff.engine.baseline",
    "pytest_ortdiff.reproducible": "pytest_ortdiff.engine.reproducible",
    "pytest_ortdiff.fuzz": "pytest_ortdiff.analyses.fuzz",
    "pytest_ortdiff.strategies": "pytest_ortdiff.analyses.strategies",
    "pytest_ortdiff.precision": "pytest_ortdiff.analyses.precision",
    "pytest_ortdiff.align": "pytest_ortdiff.analyses.align",
    "pytest_ortdiff.parity": "pytest_ortdiff.analyses.parity",
    "pytest_ortdiff.dynamo": "pytest_ortdiff.analyses.dynamo",
    "pytest_ortdiff.matrix": "pytest_ortdiff.reports.matrix",
    "pytest_ortdiff.htmlreport": "pytest_ortdiff.reports.htmlreport",
    "pytest_ortdiff.fixtures": "pytest_ortdiff.plugin.fixtures",
    "pytest_ortdiff.session": "pytest_ortdiff.plugin.session",
    "pytest_ortdiff.contrib_cases": "pytest_ortdiff.conformance.contrib_cases",
}


def moved_to(name: str) -> str | None:
    """Where the module `name` of the flat layout lives now (None: it did not move)."""
    head = name
    while head.startswith("pytest_ortdiff."):
        new = MOVED.get(head)
        if new is not None:
            return new + name[len(head) :]
        head = head.rpartition(".")[0]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module that lives at the new one: one module object under both names (a
    monkeypatch through either is seen by both), imported only when asked for."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("pytest_ortdiff.") or moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(moved_to(spec.name))  # type: ignore[arg-type]
        spec.loader_state = module.__spec__  # (the import system sets the alias's spec on it: put back after)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        alias = module.__spec__
        if alias is not None and alias.loader_state is not None:
            module.__spec__ = alias.loader_state  # its own spec, with its real name


# before the path finder, which would load a second copy from the old path's parent (`runtimes.tensors`);
# once, however often the package is reloaded
if not any(type(f).__qualname__ == _MovedModules.__qualname__ for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    if f"{__name__}.{name}" in MOVED:  # `pytest_ortdiff.precision` without importing it first
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'pytest_ortdiff' has no attribute {name!r}")


class _Package(types.ModuleType):
    """`blame` is both a module path and the public function: once anything imports `pytest_ortdiff.blame`,
    the import system binds that module as the package's `blame`, and `from pytest_ortdiff import blame`
    would return the module. The package keeps the name for the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "blame" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
