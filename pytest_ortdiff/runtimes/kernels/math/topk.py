"""TopK (ONNX's math family): the k largest or smallest values along an axis, and their indices.
"""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, kernel
from ..reduction import _orderable

__all__ = ['TopK', 'TopK10']


def _topk(x: torch.Tensor, k: int, axis: int, largest: bool) -> tuple[torch.Tensor, ...]:
    # A stable sort breaks ties by the lower index, as the spec asks; torch.topk promises no order.
    key = _orderable(x)
    values, indices = torch.sort(key, dim=axis, descending=largest, stable=True)
    # for unsigned types the sorted keys are x's values widened to int64 (torch cannot gather uint64)
    return values.narrow(axis, 0, k).to(x.dtype), indices.narrow(axis, 0, k)


@kernel("TopK", since=1)
class TopK(Kernel):
    """Opsets 1-9: `k` attribute, largest first."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.k = int(self.attr("k"))
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _topk(x, self.k, self.axis, True)


@kernel("TopK", since=10)
class TopK10(Kernel):
    """Opset 10+: `k` is an input; 11 adds `largest` and `sorted` (results come sorted either way)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))
        self.largest = bool(self.attr("largest", 1))

    def run(self, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _topk(x, int(k.reshape(-1)[0]), self.axis, self.largest)
