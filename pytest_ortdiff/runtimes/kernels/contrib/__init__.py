"""Torch kernels for onnxruntime's contrib ops (domain com.microsoft, and its internal ops in the default
domain), one module per family as onnxruntime's own kernels group them; importing this package registers them.

Each kernel computes what the op means (its spec in onnxruntime's ContribOperators.md, or the subgraph the
fusion replaced), in float32, float16, bfloat16 and float64 (the oracle); where onnxruntime's kernel departs
from that meaning on purpose, the kernel's docstring says how.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    activation,
    attention,
    layout,
    matmul,
    normalization,
    quantization,
)

#: the domain of onnxruntime's contrib ops
MS_DOMAIN = "com.microsoft"
