"""Optional kernels (ONNX's optional family): an empty optional is None.
"""

from __future__ import annotations

__all__: list[str] = []
