"""Kernels of ONNX's tensor family (the ops `onnx.defs.get_schema(op).file` places in onnx/defs/tensor)."""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    cast,
    elementwise,
    indexing,
    layout,
    resize,
    shape,
)
