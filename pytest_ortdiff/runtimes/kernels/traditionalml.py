"""Kernels of ONNX's traditionalml family (domain ai.onnx.ml) that are plain tensor arithmetic:
ArrayFeatureExtractor and Binarizer. The tree, SVM and string ops stay without a kernel (use "ort")."""

from __future__ import annotations

import onnx
import torch

from .base import Kernel, KernelContext, kernel

__all__ = ["ArrayFeatureExtractor", "Binarizer"]

_DOMAIN = "ai.onnx.ml"


@kernel("ArrayFeatureExtractor", since=1, domain=_DOMAIN)
class ArrayFeatureExtractor(Kernel):
    """X[..., indices] along the last axis, indices flattened; a 1-D X gives a [1, n] matrix, as
    onnxruntime's kernel does."""

    def run(self, x: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        idx = indices.reshape(-1).to(torch.int64)
        out = torch.index_select(x, -1, idx)
        shape = (1, idx.numel()) if x.dim() == 1 else (*x.shape[:-1], idx.numel())
        return (out.reshape(shape),)


@kernel("Binarizer", since=1, domain=_DOMAIN)
class Binarizer(Kernel):
    """1 where x > threshold, 0 elsewhere, in x's dtype."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.threshold = float(self.attr("threshold", 0.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ((x > self.threshold).to(x.dtype),)
