"""Elementwise math kernels (ONNX's math family): arithmetic with numpy-style broadcasting, powers,
exponentials, rounding, trigonometry, the variadic Max/Min/Sum/Mean, Mod, Clip, Expand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['Abs', 'Acos', 'Acosh', 'Add', 'Asin', 'Asinh', 'Atan', 'Atanh', 'Ceil', 'Clip', 'Clip11', 'Cos', 'Cosh', 'Div', 'Erf', 'Exp', 'Expand', 'Floor', 'Log', 'Max', 'Mean', 'Min', 'Mod', 'Mul', 'Neg', 'Pow', 'Reciprocal', 'Relu', 'Round', 'Sigmoid', 'Sign', 'Sin', 'Sinh', 'Sqrt', 'Sub', 'Sum', 'Tan', 'Tanh']


def _unary(
    op_type: str, since: int, fn: Callable[[torch.Tensor], torch.Tensor], doc: str = ""
) -> type[Kernel]:
    """A kernel class for a one-input op that is exactly a torch function (a ufunc of the same name)."""

    def run(self: Kernel, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (fn(x),)

    def direct(self: Kernel, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else fn

    cls = type(op_type, (Kernel,), {"run": run, "direct": direct, "__doc__": doc or None, "__module__": __name__})
    return kernel(op_type, since=since)(cls)
Floor = _unary("Floor", 1, torch.floor)
Ceil = _unary("Ceil", 1, torch.ceil)
Round = _unary("Round", 11, torch.round, "Halves round to even, as in numpy and torch.round.")
Sign = _unary("Sign", 9, torch.sign)
Sin = _unary("Sin", 7, torch.sin)
Cos = _unary("Cos", 7, torch.cos)
Tan = _unary("Tan", 7, torch.tan)
Asin = _unary("Asin", 7, torch.asin)
Acos = _unary("Acos", 7, torch.acos)
Atan = _unary("Atan", 7, torch.atan)
Sinh = _unary("Sinh", 9, torch.sinh)
Cosh = _unary("Cosh", 9, torch.cosh)
Asinh = _unary("Asinh", 9, torch.asinh)
Acosh = _unary("Acosh", 9, torch.acosh)
Atanh = _unary("Atanh", 9, torch.atanh)


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


# torch has almost no arithmetic for uint16/uint32/uint64 (comparisons, add, max... raise "not
# implemented for 'UInt32'"). Kernels try torch first (no cost on the common path) and on that error
# compute in int64: exact for uint16/uint32, and for uint64 through its int64 view, bit for bit for
# wrapping ops (add, sub, mul, bitwise, left shift), and for order-dependent ones while values < 2**63.
_UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})


def run_unsigned(
    fn: Callable[..., torch.Tensor],
    *xs: torch.Tensor | None,
    wrapping: bool = False,
    error: Exception | None = None,
) -> torch.Tensor:
    """`fn(*xs)` with uint16/32/64 tensors computed in int64, an integer result given back their dtype.

    `wrapping`: fn only adds, multiplies or moves bits, so uint64 values of 2**63 and more are fine.
    `error`: what torch raised, re-raised when no input is one of these unsigned types.
    """
    dtype = next((x.dtype for x in xs if x is not None and x.dtype in _UNSIGNED), None)
    if dtype is None:
        if error is not None:
            raise error
        return fn(*xs)
    wide = []
    for x in xs:
        if x is None or x.dtype not in _UNSIGNED:
            wide.append(x)
        elif x.dtype == torch.uint64:
            v = x.view(torch.int64)
            if not wrapping and bool((v < 0).any()):
                raise UnsupportedVariantError(
                    "uint64 values of 2**63 and more: torch has no uint64 arithmetic to order or divide them"
                )
            wide.append(v)
        else:
            wide.append(x.to(torch.int64))
    y = fn(*wide)
    if y.dtype != torch.int64:
        return y
    return y.view(torch.uint64) if dtype == torch.uint64 else y.to(dtype)


@kernel("Add", since=7)
class Add(Kernel):
    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.add  # raises on uint16/32/64, then run computes them

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.add(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.add, a, b, wrapping=True, error=exc),)


@kernel("Sub", since=7)
class Sub(Kernel):
    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.sub  # raises on uint16/32/64, then run computes them

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.sub(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.sub, a, b, wrapping=True, error=exc),)


@kernel("Mul", since=7)
class Mul(Kernel):
    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.mul  # raises on uint16/32/64, then run computes them

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.mul(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.mul, a, b, wrapping=True, error=exc),)


@kernel("Div", since=7)
class Div(Kernel):
    """Integer Div truncates toward zero (C semantics, as onnxruntime and onnx.reference do), not floor."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if a.is_floating_point():
            return (torch.div(a, b),)
        try:
            return (torch.div(a, b, rounding_mode="trunc"),)
        except RuntimeError as exc:
            return (run_unsigned(_trunc_div, a, b, error=exc),)


def _trunc_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="trunc")


@kernel("Pow", since=7)
class Pow(Kernel):
    """The output has the base's type; the exponent may have another (int or float) type.

    A one-element exponent is passed to torch as a Python number, as a module's
    `x.pow(2)` or `x ** 0.5` passes it: torch's scalar path (`x * x` for 2, a square root for 0.5, a
    reciprocal for -1, ...) is what eager torch computed before the export, and for 2 what onnxruntime
    computes too. A tensor exponent would take torch's general pow, which differs from both in the last bit
    (79 of 4,096 RMSNorm squares) and costs 5x."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if b.numel() != 1:
            return (_pow(a, b),)
        y = _pow(a, b.item())
        # an exponent of higher rank adds leading axes of 1 (numpy broadcasting)
        return (y if b.dim() <= a.dim() else y.reshape((1,) * (b.dim() - a.dim()) + tuple(a.shape)),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        b = static.get(1)
        if set(static) != {1} or not isinstance(b, torch.Tensor) or b.dim() != 0:
            return None
        e = b.item()  # (read once: the exponent is the same in every run)
        return functools.partial(_pow, e=e)


def _pow(a: torch.Tensor, e: Any) -> torch.Tensor:
    y = torch.pow(a, e)
    # torch promotes (int base ** float exponent -> float); ONNX casts back, truncating like numpy's astype.
    return y if y.dtype == a.dtype else y.to(a.dtype)


@kernel("Sqrt", since=1)
class Sqrt(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.sqrt(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.sqrt


@kernel("Reciprocal", since=1)
class Reciprocal(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.reciprocal(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.reciprocal


@kernel("Neg", since=1)
class Neg(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.neg(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.neg


@kernel("Exp", since=1)
class Exp(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.exp(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.exp


@kernel("Log", since=1)
class Log(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.log


@kernel("Tanh", since=1)
class Tanh(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.tanh(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.tanh


@kernel("Erf", since=9)
class Erf(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.erf(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.erf


@kernel("Sigmoid", since=1)
class Sigmoid(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.sigmoid(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.sigmoid


@kernel("Relu", since=1)
class Relu(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.relu(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.relu


@kernel("Abs", since=1)
class Abs(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.abs(x),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else torch.abs


@kernel("Expand", since=8)
class Expand(Kernel):
    """Bidirectional broadcasting: a 1 in `shape` keeps the input's dim. The result is a view."""

    def run(self, x: torch.Tensor, shape: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.expand(_broadcast(tuple(x.shape), tuple(shape.tolist()))),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1} or static[1] is None:
            return None
        target = tuple(static[1].tolist())
        return lambda x: x.expand(_broadcast(tuple(x.shape), target))


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of two shapes (torch.broadcast_shapes imports sympy on first use: 0.5 s)."""
    n = max(len(a), len(b))
    a2, b2 = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a2, b2, strict=True):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"Expand: shape {list(b)} does not broadcast with the input's shape {list(a)}")
        out.append(y if x == 1 else x)
    return tuple(out)
