"""Per-element tensor kernels (ONNX's tensor family): Identity, IsNaN, IsInf, Where.
"""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, kernel
from ..math.elementwise import run_unsigned

__all__ = ['Identity', 'IsInf', 'IsNaN', 'Where']


@kernel("IsNaN", since=9)
class IsNaN(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.isnan(x),)


@kernel("IsInf", since=10)
class IsInf(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.negative = bool(self.attr("detect_negative", 1))
        self.positive = bool(self.attr("detect_positive", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.negative and self.positive:
            return (torch.isinf(x),)
        if self.negative:
            return (torch.isneginf(x),)
        if self.positive:
            return (torch.isposinf(x),)
        return (torch.zeros(x.shape, dtype=torch.bool, device=x.device),)


@kernel("Identity", since=1)
class Identity(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x,)


@kernel("Where", since=9)
class Where(Kernel):
    def run(self, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.where(cond, a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.where, cond, a, b, wrapping=True, error=exc),)
