"""Kernels of the ai.onnx.preview domain: FlexAttention.
"""

from __future__ import annotations

__all__: list[str] = []
