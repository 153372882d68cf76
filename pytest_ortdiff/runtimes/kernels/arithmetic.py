"""Elementwise arithmetic beyond elementwise.py: rounding, trigonometry, IsNaN/IsInf, the variadic
Max/Min/Sum/Mean, Mod, Clip and CastLike. Outputs keep the inputs' dtype, as ONNX says.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import torch

from .base import Kernel, KernelContext, kernel
from .elementwise import run_unsigned

__all__ = [
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "CastLike",
    "Ceil",
    "Clip",
    "Clip11",
    "Cos",
    "Cosh",
    "Floor",
    "IsInf",
    "IsNaN",
    "Max",
    "Mean",
    "Min",
    "Mod",
    "Round",
    "Sign",
    "Sin",
    "Sinh",
    "Sum",
    "Tan",
]


@kernel("CastLike", since=15)
class CastLike(Kernel):
    """Cast to the second input's dtype (float64 in oracle mode, where every float is); `saturate` is float8's."""

    def run(self, x: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.to(like.dtype),)


# -- more unary math ------------------------------------------------------------------------------


def _unary(
    op_type: str, since: int, fn: Callable[[torch.Tensor], torch.Tensor], doc: str = ""
) -> type[Kernel]:
    """A kernel class for a one-input op that is exactly a torch function (a ufunc of the same name)."""

    def run(self: Kernel, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (fn(x),)

    cls = type(op_type, (Kernel,), {"run": run, "__doc__": doc or None, "__module__": __name__})
    return kernel(op_type, since=since)(cls)


Floor = _unary("Floor", 1, torch.floor)
Ceil = _unary("Ceil", 1, torch.ceil)
Round = _unary("Round", 11, torch.round, "Halves round to even, as in numpy and torch.round.")
Sign = _unary("Sign", 9, torch.sign)
Sin = _unary("Sin", 7, torch.sin)
Cos = _unary("Cos", 7, torch.cos)
Tan = _unary("Tan", 7, torch.tan)
Asin = _unary("Asin", 7, torch.asin)
Atan = _unary("Atan", 7, torch.atan)
Sinh = _unary("Sinh", 9, torch.sinh)
Cosh = _unary("Cosh", 9, torch.cosh)
Asinh = _unary("Asinh", 9, torch.asinh)
Atanh = _unary("Atanh", 9, torch.atanh)
IsNaN = _unary("IsNaN", 9, torch.isnan)


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


# -- variadic -------------------------------------------------------------------------------------


def _fold(fn: Callable[..., torch.Tensor], xs: tuple[torch.Tensor, ...], wrapping: bool) -> torch.Tensor:
    y = xs[0]
    for x in xs[1:]:
        try:
            y = fn(y, x)
        except RuntimeError as exc:
            y = run_unsigned(fn, y, x, wrapping=wrapping, error=exc)
    return y


@kernel("Max", since=6)
class Max(Kernel):
    """Elementwise maximum of any number of inputs (broadcasting from opset 8); NaN propagates."""

    def run(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_fold(torch.maximum, xs, False),)


@kernel("Min", since=6)
class Min(Kernel):
    def run(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_fold(torch.minimum, xs, False),)


@kernel("Sum", since=6)
class Sum(Kernel):
    def run(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_fold(torch.add, xs, True),)


@kernel("Mean", since=6)
class Mean(Kernel):
    """The sum divided by the number of inputs, in the inputs' (floating) type."""

    def run(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = _fold(torch.add, xs, True)
        return (y / len(xs) if len(xs) > 1 else y,)


@kernel("Mod", since=10)
class Mod(Kernel):
    """`fmod=0`: the remainder has the divisor's sign (Python's %, floats too from opset 28);
    `fmod=1`: C's fmod, the dividend's sign."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.fn = torch.fmod if int(self.attr("fmod", 0)) else torch.remainder

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (self.fn(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(self.fn, a, b, error=exc),)


@kernel("Clip", since=6)
class Clip(Kernel):
    """Opsets 6-10: bounds in `min`/`max` attributes (defaults: the float32 range)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.lo = float(self.attr("min", -3.4028234663852886e38))
        self.hi = float(self.attr("max", 3.4028234663852886e38))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.clamp(x, self.lo, self.hi),)


@kernel("Clip", since=11)
class Clip11(Kernel):
    """Opset 11+: bounds in optional scalar inputs; min > max gives max everywhere (numpy's clip too)."""

    def run(
        self, x: torch.Tensor, lo: torch.Tensor | None = None, hi: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        if lo is None and hi is None:  # no bounds: the identity (torch.clamp refuses)
            return (x,)
        try:
            return (torch.clamp(x, lo, hi),)
        except RuntimeError as exc:
            return (run_unsigned(torch.clamp, x, lo, hi, error=exc),)
