"""Resampling kernels (ONNX's tensor family): Resize, Upsample, GridSample, AffineGrid.
"""

from __future__ import annotations

__all__: list[str] = []
