"""Torch kernels for ONNX ops, one module (or package) per ONNX operator family; importing this package
registers them all.

An op's kernel lives where ONNX files its schema: `onnx.defs.get_schema("Conv").file` is
onnx/defs/nn/defs.cc, so Conv is in `kernels/nn/` (conv.py); the big families (math, nn, tensor) are
packages split by topic, the others one module each. tests/test_kernels_layout.py holds the rule.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    contrib,
    controlflow,
    generator,
    logical,
    math,
    nn,
    object_detection,
    optional,
    preview,
    quantization,
    reduction,
    rnn,
    sequence,
    tensor,
    traditionalml,
    training,
)
from .base import (
    REGISTRY,
    Departure,
    Kernel,
    KernelContext,
    UnsupportedVariantError,
    kernel,
    known_ops,
    lookup,
)

__all__ = ["REGISTRY", "Departure", "Kernel", "KernelContext", "UnsupportedVariantError", "kernel", "known_ops", "lookup"]
