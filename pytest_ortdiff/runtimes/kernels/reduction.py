"""Reduction kernels (ONNX's reduction family): Reduce* with `axes` as an attribute or (later opsets)
an input, ArgMax and ArgMin. A reduction over an empty set gives its identity (-inf for Max, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .math.elementwise import run_unsigned

__all__ = ['ArgMax', 'ArgMin', 'ReduceL1', 'ReduceL2', 'ReduceL118', 'ReduceL218', 'ReduceLogSum', 'ReduceLogSum18', 'ReduceLogSumExp', 'ReduceLogSumExp18', 'ReduceMax', 'ReduceMax18', 'ReduceMean', 'ReduceMean18', 'ReduceMin', 'ReduceMin18', 'ReduceProd', 'ReduceProd18', 'ReduceSum', 'ReduceSum13', 'ReduceSumSquare', 'ReduceSumSquare18']


def _orderable(x: torch.Tensor) -> torch.Tensor:
    """x, or for uint16/32/64 (which torch cannot compare) an int64 tensor with the same order."""
    if x.dtype in (torch.uint16, torch.uint32):
        return x.to(torch.int64)
    if x.dtype == torch.uint64:
        v = x.view(torch.int64)
        if bool((v < 0).any()):
            raise UnsupportedVariantError("ordering uint64 values of 2**63 and more: torch cannot")
        return v
    return x


Reducer = Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]


def _empty_fill(x: torch.Tensor, kind: str) -> float | int | bool:
    """The identity of a Max/Min reduction over nothing, in x's dtype."""
    if x.dtype == torch.bool:
        return kind == "min"
    if x.is_floating_point():
        return float("inf") if kind == "min" else float("-inf")
    info = torch.iinfo(x.dtype)
    return info.max if kind == "min" else info.min


def _max(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    return _extreme(x, dims, keepdims, "max")


def _min(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    return _extreme(x, dims, keepdims, "min")


def _extreme(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool, kind: str) -> torch.Tensor:
    if any(x.shape[d] == 0 for d in dims):
        shape = [1 if (d in dims or d - x.dim() in dims) else n for d, n in enumerate(x.shape)]
        y = torch.full(shape, _empty_fill(x, kind), dtype=x.dtype, device=x.device)
        return y if keepdims else y.squeeze(dims)
    fn = torch.amax if kind == "max" else torch.amin
    try:
        return fn(x, dims, keepdims)
    except RuntimeError as exc:
        return run_unsigned(lambda v: fn(v, dims, keepdims), x, error=exc)


def _prod(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    y = x
    for d in sorted((d + x.dim() if d < 0 else d for d in dims), reverse=True):
        y = torch.prod(y, d, keepdim=keepdims)
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _sum(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    y = torch.sum(x, dims, keepdims)
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _l1(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    return _sum(torch.abs(x), dims, keepdims)


def _l2(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    y = torch.sqrt(torch.sum(x * x, dims, keepdims))
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _sum_square(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    return _sum(x * x, dims, keepdims)


def _log_sum(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    y = torch.log(torch.sum(x, dims, keepdims))
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _log_sum_exp(x: torch.Tensor, dims: tuple[int, ...], keepdims: bool) -> torch.Tensor:
    if not x.is_floating_point():
        return torch.logsumexp(x.double(), dims, keepdims).to(x.dtype)
    if any(x.shape[d] == 0 for d in dims):  # logsumexp of nothing: log(0)
        return _log_sum(x, dims, keepdims)
    return torch.logsumexp(x, dims, keepdims)


class _ReduceAttr(Kernel):
    """Opsets before 18: axes in an attribute (absent: all)."""

    reducer: Reducer

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = tuple(int(a) for a in self.attr("axes", ()))
        self.keepdims = bool(self.attr("keepdims", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dims = self.axes or tuple(range(x.dim()))
        return (type(self).reducer(x, dims, self.keepdims),)


class _ReduceInput(Kernel):
    """Opset 18+: axes in an optional int64 input; empty axes reduce all unless `noop_with_empty_axes`."""

    reducer: Reducer

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.keepdims = bool(self.attr("keepdims", 1))
        self.noop = bool(self.attr("noop_with_empty_axes", 0))

    def run(self, x: torch.Tensor, axes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        dims = () if axes is None else tuple(axes.tolist())
        if not dims:
            if self.noop:
                return (x,)
            dims = tuple(range(x.dim()))
        return (type(self).reducer(x, dims, self.keepdims),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1} or static[1] is None:
            return None
        dims = tuple(static[1].tolist())
        if not dims:
            return None  # all axes (of the input's rank) or none: run decides
        reducer, keepdims = type(self).reducer, self.keepdims
        return lambda x: reducer(x, dims, keepdims)


def _reduce_pair(
    op_type: str, reducer: Reducer, input_since: int = 18
) -> tuple[type[Kernel], type[Kernel]]:
    """The two kernels of a reduction: axes as an attribute (opset 1 on), as an input (`input_since` on:
    13 for ReduceSum, 18 for the others)."""
    attr_cls = type(op_type, (_ReduceAttr,), {"reducer": staticmethod(reducer), "__module__": __name__})
    input_cls = type(
        f"{op_type}{input_since}",
        (_ReduceInput,),
        {"reducer": staticmethod(reducer), "__module__": __name__},
    )
    return kernel(op_type, since=1)(attr_cls), kernel(op_type, since=input_since)(input_cls)


ReduceMax, ReduceMax18 = _reduce_pair("ReduceMax", _max)


ReduceMin, ReduceMin18 = _reduce_pair("ReduceMin", _min)


ReduceProd, ReduceProd18 = _reduce_pair("ReduceProd", _prod)


ReduceL1, ReduceL118 = _reduce_pair("ReduceL1", _l1)


ReduceL2, ReduceL218 = _reduce_pair("ReduceL2", _l2)


ReduceLogSum, ReduceLogSum18 = _reduce_pair("ReduceLogSum", _log_sum)


ReduceLogSumExp, ReduceLogSumExp18 = _reduce_pair("ReduceLogSumExp", _log_sum_exp)


ReduceSumSquare, ReduceSumSquare18 = _reduce_pair("ReduceSumSquare", _sum_square)


class _Arg(Kernel):
    """Index (int64) of the first extreme along `axis`, or the last with `select_last_index=1` (opset 12+)."""

    largest = True

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))
        self.keepdims = bool(self.attr("keepdims", 1))
        self.last = bool(self.attr("select_last_index", 0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        x = _orderable(x)
        fn = torch.argmax if self.largest else torch.argmin
        if not self.last:
            return (fn(x, self.axis, self.keepdims),)
        i = fn(x.flip(self.axis), self.axis, self.keepdims)
        return (x.shape[self.axis] - 1 - i,)


@kernel("ArgMax", since=1)
class ArgMax(_Arg):
    largest = True


@kernel("ArgMin", since=1)
class ArgMin(_Arg):
    largest = False


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


ReduceSum, ReduceSum13 = _reduce_pair("ReduceSum", _sum, input_since=13)
ReduceMean, ReduceMean18 = _reduce_pair("ReduceMean", _mean)
