"""Per-element tensor kernels (ONNX's tensor family): Identity, IsNaN, IsInf, Where.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

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
    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        fixed = set(static)
        if fixed == {0}:
            return cast(Callable[..., torch.Tensor], partial(torch.where, static[0]))
        if fixed == {0, 2}:
            cond, other = static[0], static[2]
            return lambda a: torch.where(cond, a, other)
        if fixed == {0, 1}:
            cond, value = static[0], static[1]
            return lambda b: torch.where(cond, value, b)
        if fixed == {1, 2}:
            a, b = static[1], static[2]
            return lambda cond: torch.where(cond, a, b)
        return None

    def run(self, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.where(cond, a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.where, cond, a, b, wrapping=True, error=exc),)
