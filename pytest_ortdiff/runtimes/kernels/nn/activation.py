"""Shrink (ONNX files it in the nn family).
"""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['Shrink']


@kernel("Shrink", since=9)
class Shrink(Kernel):
    """x + bias below -lambd, x - bias above lambd, 0 between; integer inputs are computed in float64
    and cast back (truncating), as the reference does."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.bias = float(self.attr("bias", 0.0))
        self.lambd = float(self.attr("lambd", 0.5))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w = x if x.is_floating_point() else x.double()
        zero = torch.zeros((), dtype=w.dtype, device=w.device)
        y = torch.where(w < -self.lambd, w + self.bias, torch.where(w > self.lambd, w - self.bias, zero))
        return (y if y.dtype == x.dtype else y.to(x.dtype),)
