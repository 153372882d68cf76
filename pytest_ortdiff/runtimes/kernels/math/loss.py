"""Loss kernels (ONNX's math family): SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
"""

from __future__ import annotations

__all__: list[str] = []
