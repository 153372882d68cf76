"""Control-flow kernels (ONNX's controlflow family): If, Loop and Scan, their subgraphs run by the evaluator.
"""

from __future__ import annotations

__all__: list[str] = []
