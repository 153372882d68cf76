"""Quantization kernels (ONNX's quantization family): QuantizeLinear, DequantizeLinear,\nDynamicQuantizeLinear.
"""

from __future__ import annotations

__all__: list[str] = []
