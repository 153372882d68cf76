"""Torch kernels for onnxruntime's matmul contrib ops: FusedMatMul, FusedGemm, FusedConv."""

from __future__ import annotations
