"""Sequence kernels (ONNX's sequence family): sequences of tensors as Python lists.
"""

from __future__ import annotations

__all__: list[str] = []
