"""Reduction torch kernels: ReduceSum and ReduceMean, with `axes` as an attribute or (later opsets) an input.

Empty or absent axes reduce everything, unless `noop_with_empty_axes=1` makes the op an identity.
"""

from __future__ import annotations

import onnx
import torch

from .base import Kernel, KernelContext, kernel

__all__ = ["ReduceMean", "ReduceMean18", "ReduceSum", "ReduceSum13"]


def _sum(x: torch.Tensor, axes: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    if axes:
        y = torch.sum(x, axes, keepdims)
    else:
        y = torch.sum(x)
        if keepdims:
            y = y.reshape((1,) * x.dim())
    # torch sums integers into int64; ONNX keeps the input type (wrapping like a same-width sum would).
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _mean(x: torch.Tensor, axes: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    if x.is_floating_point():
        if axes:
            return torch.mean(x, axes, keepdims)
        y = torch.mean(x)
        return y.reshape((1,) * x.dim()) if keepdims else y
    # torch has no integer mean; ONNX's is the integer sum divided by the count, truncated toward zero.
    shape = x.shape
    count = 1
    for a in axes or range(x.dim()):
        count *= shape[a]
    total = torch.sum(x, axes, keepdims) if axes else torch.sum(x)
    if not axes and keepdims:
        total = total.reshape((1,) * x.dim())
    return torch.div(total, count, rounding_mode="trunc").to(x.dtype)


class _ReduceAttr(Kernel):
    """Axes from the `axes` attribute (absent: all)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = tuple(int(a) for a in self.attr("axes", ()))
        self.keepdims = bool(self.attr("keepdims", 1))


class _ReduceInput(Kernel):
    """Axes from the optional second input, an int64 tensor; `noop_with_empty_axes` decides what empty means."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.keepdims = bool(self.attr("keepdims", 1))
        self.noop = bool(self.attr("noop_with_empty_axes", 0))


@kernel("ReduceSum", since=1)
class ReduceSum(_ReduceAttr):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_sum(x, self.axes, self.keepdims),)


@kernel("ReduceSum", since=13)
class ReduceSum13(_ReduceInput):
    def run(self, x: torch.Tensor, axes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        dims = () if axes is None else tuple(axes.tolist())
        if not dims and self.noop:
            return (x,)
        return (_sum(x, dims, self.keepdims),)


@kernel("ReduceMean", since=1)
class ReduceMean(_ReduceAttr):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_mean(x, self.axes, self.keepdims),)


@kernel("ReduceMean", since=18)
class ReduceMean18(_ReduceInput):
    def run(self, x: torch.Tensor, axes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        dims = () if axes is None else tuple(axes.tolist())
        if not dims and self.noop:
            return (x,)
        return (_mean(x, dims, self.keepdims),)
