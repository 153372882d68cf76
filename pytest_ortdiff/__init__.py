"""pytest-ortdiff: numerical reproducibility regression testing of ONNX models.

torch evaluator vs onnxruntime vs a float64 oracle, per provider × dtype, with histogram diff reports.
Heavy names (torch, onnxruntime) load on first use, so `import pytest_ortdiff` stays cheap.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from .tolerance import Tolerance

if TYPE_CHECKING:
    from . import models
    from .blame import BlameTable, blame
    from .check import Checker
    from .diff import DiffReport, compare
    from .runtimes.evaluator import TorchEvaluator
    from .runtimes.ort import OrtRunner

__all__ = ["BlameTable", "Checker", "DiffReport", "OrtRunner", "Tolerance", "TorchEvaluator", "blame", "compare", "models"]
__version__ = "0.1.0"

_LAZY = {
    "compare": ("pytest_ortdiff.diff", "compare"),
    "DiffReport": ("pytest_ortdiff.diff", "DiffReport"),
    "TorchEvaluator": ("pytest_ortdiff.runtimes.evaluator", "TorchEvaluator"),
    "OrtRunner": ("pytest_ortdiff.runtimes.ort", "OrtRunner"),
    "models": ("pytest_ortdiff.models", None),
    "blame": ("pytest_ortdiff.blame", "blame"),
    "BlameTable": ("pytest_ortdiff.blame", "BlameTable"),
    "Checker": ("pytest_ortdiff.check", "Checker"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pytest_ortdiff' has no attribute {name!r}")


class _Package(types.ModuleType):
    """`blame` is both a submodule and the public function: once anything imports the submodule, the
    import system binds it as `pytest_ortdiff.blame`, and `from pytest_ortdiff import blame` would return
    the module. The package keeps the name for the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "blame" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
