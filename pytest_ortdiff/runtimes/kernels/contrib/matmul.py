"""Torch kernels for onnxruntime's matmul contrib ops: FusedMatMul (and TransposeMatMul, its older name),
FusedGemm and FusedConv, the products onnxruntime's graph optimizer fuses a Transpose, a scale or an
activation into.

16-bit operands are multiplied in float32 (float64 in the oracle) and the result rounded once, after the
scale, bias and activation: the fused subgraph's value without its intermediate roundings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..math.matmul import Gemm
from ..nn.conv import _conv, _ConvAttrs
from .arithmetic import f32, wide_dtype

__all__ = ["FusedConv", "FusedGemm", "FusedMatMul", "TransposeMatMul"]

MS = "com.microsoft"


def _floats_only(op: str, *tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and not t.is_floating_point():
            raise UnsupportedVariantError(f"{op} on {t.dtype} tensors: the torch kernel computes floating-point products only")


# activation name -> (its parameters in order, their defaults (None: required), the function of x and them);
# the defaults are those of the ONNX op of that name
_ACTIVATIONS: dict[str, tuple[tuple[str, ...], tuple[float | None, ...], Callable[..., torch.Tensor]]] = {
    "Relu": ((), (), F.relu),
    "Tanh": ((), (), torch.tanh),
    "Sigmoid": ((), (), torch.sigmoid),
    "Softsign": ((), (), F.softsign),
    "Softplus": ((), (), F.softplus),
    "LeakyRelu": (("alpha",), (f32(0.01),), lambda x, a: F.leaky_relu(x, a)),
    "HardSigmoid": (("alpha", "beta"), (f32(0.2), f32(0.5)), lambda x, a, b: torch.clamp(x * a + b, 0.0, 1.0)),
    "Clip": (("min", "max"), (float("-inf"), float("inf")), lambda x, lo, hi: torch.clamp(x, lo, hi)),
    "Elu": (("alpha",), (1.0,), lambda x, a: F.elu(x, a)),
    "Celu": (("alpha",), (1.0,), lambda x, a: F.celu(x, a)),
    "Selu": (("alpha", "gamma"), (1.67326319217681884765625, 1.05070102214813232421875), lambda x, a, g: F.elu(x, a) * g),
    "ThresholdedRelu": (("alpha",), (1.0,), lambda x, a: torch.where(x > a, x, torch.zeros_like(x))),
    "ParametricSoftplus": (("alpha", "beta"), (None, None), lambda x, a, b: a * F.softplus(x * b)),
    "ScaledTanh": (("alpha", "beta"), (None, None), lambda x, a, b: a * torch.tanh(x * b)),
}


def _activation(op: str, name: str, allowed: Sequence[str], params: Mapping[str, float]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation `name` with its parameters (from `params`, else the ONNX op's defaults)."""
    if name not in allowed:
        raise UnsupportedVariantError(f"{op} activation={name!r}: onnxruntime's {op} takes {', '.join(allowed)}")
    names, defaults, fn = _ACTIVATIONS[name]
    values = []
    for p, default in zip(names, defaults, strict=True):
        value = params.get(p, default)
        if value is None:
            raise ValueError(f"{op} activation={name!r} needs its {p} parameter")
        values.append(value)
    return lambda x: fn(x, *values)


def _product_operand(x: torch.Tensor, trans: bool, trans_batch: bool) -> torch.Tensor:
    """A FusedMatMul operand as the product sees it: `trans_batch` moves its first axis to the second-last
    place ([d0, b1, .., bk, d_last] -> [b1, .., bk, d0, d_last]), `trans` swaps its last two; a vector as is."""
    if x.dim() < 2:
        return x
    if trans_batch:
        x = x.movedim(0, -2)
    return x.transpose(-1, -2) if trans else x


@kernel("FusedMatMul", since=1, domain=MS)
class FusedMatMul(Kernel):
    """Y = alpha * matmul(A', B'), A' and B' the inputs with their last two axes swapped (transA/transB)
    and their first axis moved behind the batch axes (transBatchA/transBatchB): a MatMul with the
    Transposes and the scale (Mul/Div by a constant) around it folded in."""

    batch_transposes = True

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        self.trans_batch_a = bool(self.attr("transBatchA", 0)) and self.batch_transposes
        self.trans_batch_b = bool(self.attr("transBatchB", 0)) and self.batch_transposes

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _floats_only(self.op_type, a, b)
        wide = wide_dtype(a, b)
        y = torch.matmul(_product_operand(a.to(wide), self.trans_a, self.trans_batch_a), _product_operand(b.to(wide), self.trans_b, self.trans_batch_b))
        if self.alpha != 1.0:
            y = y * self.alpha
        return (y.to(a.dtype),)


@kernel("TransposeMatMul", since=1, domain=MS)
class TransposeMatMul(FusedMatMul):
    """FusedMatMul's older name (transA, transB, alpha; no batch transposes), kept by onnxruntime for the
    models written with it."""

    batch_transposes = False


@kernel("FusedGemm", since=1, domain=MS)
class FusedGemm(Gemm):
    """Y = activation(alpha * A' B' + beta * C): Gemm and the activation after it, its parameters given as
    activation_alpha, activation_beta, activation_gamma."""

    ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Elu", "Celu", "Selu", "Softplus", "Softsign", "ThresholdedRelu", "ParametricSoftplus", "ScaledTanh")

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        params = {p: float(v) for p in ("alpha", "beta", "gamma") if (v := self.attr(f"activation_{p}")) is not None}
        self.activation = _activation(self.op_type, str(self.attr("activation", "")), self.ACTIVATIONS, params)

    def direct(self, static: dict[int, Any]) -> Callable[..., Any] | None:
        return None  # (Gemm's shortcuts leave the activation out)

    def run(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        _floats_only(self.op_type, a, b, c)
        wide = wide_dtype(a, b, c)
        (y,) = super().run(a.to(wide), b.to(wide), None if c is None else c.to(wide))
        return (self.activation(y).to(a.dtype),)


@kernel("FusedConv", since=1, domain=MS)
class FusedConv(_ConvAttrs):
    """Y = activation(Conv(X, W, B) + Z): Conv, the residual Add (Z, optional) and the activation after it,
    its parameters listed in activation_params (LeakyRelu: alpha; Clip: min, max; HardSigmoid: alpha, beta)."""

    ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        name = str(self.attr("activation", ""))
        listed = [float(v) for v in self.attr("activation_params", [])]
        names = _ACTIVATIONS[name][0] if name in _ACTIVATIONS else ()
        if listed and len(listed) != len(names):
            raise ValueError(f"FusedConv activation={name!r} takes {len(names)} activation_params ({', '.join(names) or 'none'}), got {listed}")
        self.activation = _activation(self.op_type, name, self.ACTIVATIONS, dict(zip(names, listed, strict=False)))

    def run(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, z: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        _floats_only(self.op_type, x, w, b, z)
        strides, pads, dilations = self.geometry(x, w)
        ct = wide_dtype(x, w, b, z)  # (16-bit: float32 on CUDA too, so that Z and the activation see the exact sum)
        y = _conv(x.to(ct), w.to(ct), None if b is None else b.to(ct), strides, pads, dilations, self.group, self.op_type)
        if z is not None:
            y = y + z.to(ct)
        return (self.activation(y).to(x.dtype),)
