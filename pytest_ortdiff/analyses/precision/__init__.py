"""Half precision without surprises: the float16/bfloat16 range audit of a float32 model and the
smallest verified keep-in-float32 list for its conversion.

Names load on first use (torch comes with them), so `import pytest_ortdiff.precision` stays cheap.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .audit import AuditReport, EmptyOutputs, NodeAudit, audit
    from .keep import (
        OP_TYPE_BLOCK_LIST,
        ConversionCheck,
        KeepReport,
        check_conversion,
        convert_half,
        keep_float32,
        range_only_list,
    )

__all__ = [
    "OP_TYPE_BLOCK_LIST",
    "AuditReport",
    "ConversionCheck",
    "EmptyOutputs",
    "KeepReport",
    "NodeAudit",
    "audit",
    "check_conversion",
    "convert_half",
    "keep_float32",
    "range_only_list",
]

#: public name -> (submodule, attribute)
_LAZY = {
    "audit": ("audit", "audit"),
    "AuditReport": ("audit", "AuditReport"),
    "EmptyOutputs": ("audit", "EmptyOutputs"),
    "NodeAudit": ("audit", "NodeAudit"),
    "keep_float32": ("keep", "keep_float32"),
    "KeepReport": ("keep", "KeepReport"),
    **{
        name: ("keep", name)
        for name in (
            "OP_TYPE_BLOCK_LIST",
            "ConversionCheck",
            "check_conversion",
            "convert_half",
            "range_only_list",
        )
    },
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module}":
            raise  # a dependency of it is missing: that is the error to see
        raise AttributeError(
            f"{__name__}.{name} is not available: {__name__}.{module} is not installed"
        ) from None
    value = getattr(mod, attr)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """`audit` is both a submodule and the public function: importing the submodule makes the import
    system bind it on the package, which would hide the function. The package keeps the name for the
    function (as `pytest_ortdiff` does for `blame`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "audit" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
