"""Cumulative kernels (ONNX's math family): CumSum and CumProd.
"""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['CumProd', 'CumSum']


class _Cumulative(Kernel):
    """Along the axis given as a scalar input; `exclusive` shifts by one (the identity first), `reverse`
    accumulates from the end."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.exclusive = bool(self.attr("exclusive", 0))
        self.reverse = bool(self.attr("reverse", 0))

    def accumulate(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        raise NotImplementedError

    identity = 0

    def run(self, x: torch.Tensor, axis: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = int(axis)
        if self.reverse:
            x = x.flip(a)
        if self.exclusive:
            n = x.shape[a]
            pad = torch.full_like(x.narrow(a, 0, min(n, 1)), self.identity)
            x = torch.cat([pad, x.narrow(a, 0, max(n - 1, 0))], a)
        y = self.accumulate(x, a)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return (y.flip(a) if self.reverse else y,)


@kernel("CumSum", since=11)
class CumSum(_Cumulative):
    identity = 0

    def accumulate(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.cumsum(x, axis)


@kernel("CumProd", since=26)
class CumProd(_Cumulative):
    identity = 1

    def accumulate(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.cumprod(x, axis)
