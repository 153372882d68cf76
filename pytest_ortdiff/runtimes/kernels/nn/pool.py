"""Pooling kernels (ONNX's nn family): MaxPool, AveragePool, LpPool, the global pools, MaxUnpool, MaxRoiPool.
"""

from __future__ import annotations

__all__: list[str] = []
