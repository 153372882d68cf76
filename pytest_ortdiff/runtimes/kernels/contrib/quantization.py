"""Torch kernels for onnxruntime's quantization contrib ops: MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, the QLinear* family."""

from __future__ import annotations
