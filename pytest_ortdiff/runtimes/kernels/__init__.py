"""Torch kernels for ONNX ops, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    activation,
    aggregate,
    arithmetic,
    attention,
    elementwise,
    generators,
    indexing,
    layout,
    logic,
    matmul,
    normalization,
    reduce,
    shape,
)
from .base import (
    REGISTRY,
    Kernel,
    KernelContext,
    UnsupportedVariantError,
    kernel,
    known_ops,
    lookup,
)

__all__ = ["REGISTRY", "Kernel", "KernelContext", "UnsupportedVariantError", "kernel", "known_ops", "lookup"]
