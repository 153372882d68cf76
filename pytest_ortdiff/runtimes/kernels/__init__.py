"""Torch kernels for ONNX ops, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import elementwise, matmul, normalization, reduce, shape  # noqa: F401  (registration)
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
