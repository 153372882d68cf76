"""Kernels of ONNX's math family (the ops `onnx.defs.get_schema(op).file` places in onnx/defs/math)."""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    activation,
    cumsum,
    elementwise,
    linalg,
    loss,
    matmul,
    signal,
    softmax,
    topk,
)
