"""Object-detection kernels (ONNX's object_detection family): RoiAlign and NonMaxSuppression.
"""

from __future__ import annotations

__all__: list[str] = []
