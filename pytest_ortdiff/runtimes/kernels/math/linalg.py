"""Linear-algebra kernels (ONNX's math family): Det.
"""

from __future__ import annotations

__all__: list[str] = []
