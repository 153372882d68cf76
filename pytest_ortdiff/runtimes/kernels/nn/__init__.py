"""Kernels of ONNX's nn family (the ops `onnx.defs.get_schema(op).file` places in onnx/defs/nn)."""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    activation,
    attention,
    conv,
    dropout,
    flatten,
    normalization,
    pool,
    tfidf,
)
