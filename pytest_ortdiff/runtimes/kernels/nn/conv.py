"""Convolution kernels (ONNX's nn family): Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv,\nCol2Im, CausalConvWithState.
"""

from __future__ import annotations

__all__: list[str] = []
