"""Elementwise torch kernels: arithmetic with numpy broadcasting, activations, Identity and Cast.

Outputs keep the dtype ONNX gives them (the inputs' type, or Cast's `to`); nothing is silently upcast.
"""

from __future__ import annotations

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
]

# Binary ops are registered from opset 7: before it they broadcast only with `broadcast=1` and an
# `axis` attribute, semantics nobody exports any more; such a model finds no kernel instead of a wrong one.


@kernel("Add", since=7)
class Add(Kernel):
    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.add(a, b),)


@kernel("Sub", since=7)
class Sub(Kernel):
    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.sub(a, b),)


@kernel("Mul", since=7)
class Mul(Kernel):
    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.mul(a, b),)


@kernel("Div", since=7)
class Div(Kernel):
    """Integer Div truncates toward zero (C semantics, as onnxruntime and onnx.reference do), not floor."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if a.is_floating_point():
            return (torch.div(a, b),)
        return (torch.div(a, b, rounding_mode="trunc"),)


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
