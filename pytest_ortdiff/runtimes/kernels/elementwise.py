"""Elementwise torch kernels: arithmetic with numpy broadcasting, activations, Identity and Cast.

Outputs keep the dtype ONNX gives them (the inputs' type, or Cast's `to`); nothing is silently upcast.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import torch

from ...dtypes import DType
from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "Abs",
    "Add",
    "Cast",
    "Cast19",
    "Div",
    "Erf",
    "Exp",
    "Identity",
    "Log",
    "Mul",
    "Neg",
    "Pow",
    "Reciprocal",
    "Relu",
    "Sigmoid",
    "Sqrt",
    "Sub",
    "Tanh",
    "run_unsigned",
]

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


# Binary ops are registered from opset 7: before it they broadcast only with `broadcast=1` and an
# `axis` attribute, semantics nobody exports any more; such a model finds no kernel instead of a wrong one.


@kernel("Add", since=7)
class Add(Kernel):
    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.add(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.add, a, b, wrapping=True, error=exc),)


@kernel("Sub", since=7)
class Sub(Kernel):
    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.sub(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(torch.sub, a, b, wrapping=True, error=exc),)


@kernel("Mul", since=7)
class Mul(Kernel):
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
    """The output has the base's type; the exponent may have another (int or float) type."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.pow(a, b)
        # torch promotes (int base ** float exponent -> float); ONNX casts back, truncating like numpy's astype.
        return (y if y.dtype == a.dtype else y.to(a.dtype),)


# Unary ops: opset 1 versions differ from 6 only by the legacy `consumed_inputs` attribute, which
# changes nothing about the result, so one kernel serves from opset 1.


@kernel("Sqrt", since=1)
class Sqrt(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.sqrt(x),)


@kernel("Reciprocal", since=1)
class Reciprocal(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.reciprocal(x),)


@kernel("Neg", since=1)
class Neg(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.neg(x),)


@kernel("Exp", since=1)
class Exp(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.exp(x),)


@kernel("Log", since=1)
class Log(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log(x),)


@kernel("Tanh", since=1)
class Tanh(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.tanh(x),)


@kernel("Erf", since=9)
class Erf(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.erf(x),)


@kernel("Sigmoid", since=1)
class Sigmoid(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.sigmoid(x),)


@kernel("Relu", since=1)
class Relu(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.relu(x),)


@kernel("Abs", since=1)
class Abs(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.abs(x),)


@kernel("Identity", since=1)
class Identity(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x,)


def _cast_target(to: int, ctx: KernelContext) -> torch.dtype:
    try:
        DType(to)
    except ValueError:
        name = (
            onnx.TensorProto.DataType.Name(to)
            if to in onnx.TensorProto.DataType.values()
            else str(to)
        )
        if name.startswith("FLOAT8"):
            why = "float8 rounding and `saturate` are not implemented by these kernels"
        elif name == "STRING":
            why = "strings are not tensors in torch"
        else:
            why = "torch has no arithmetic for it here"
        raise UnsupportedVariantError(f"Cast to {name}: {why}") from None
    # Float targets go through the context, so that in oracle mode a Cast to float16 stays float64.
    return ctx.torch_dtype(to)


@kernel("Cast", since=6)
class Cast(Kernel):
    """float -> int truncates toward zero and float -> bool is `!= 0`: torch's `.to` does both, as ONNX says."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.to = _cast_target(int(self.attr("to")), ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.to(self.to),)


@kernel("Cast", since=19)
class Cast19(Cast):
    """Opset 19 adds `saturate`, which only affects float8 targets, and those Cast refuses."""

