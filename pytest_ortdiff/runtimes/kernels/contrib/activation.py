"""Torch kernels for onnxruntime's activation contrib ops: Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd,
BiasSplitGelu, BiasSoftmax.

16-bit inputs are computed in float32 (float64 in the oracle) and rounded once: the fused subgraph's value
without its intermediate roundings (a bias added, then the activation), as onnxruntime's kernels compute.
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .arithmetic import f32, wide_dtype

__all__ = ["BiasAdd", "BiasGelu", "BiasSoftmax", "BiasSplitGelu", "FastGelu", "Gelu", "QuickGelu"]

MS = "com.microsoft"


def _plus_bias(op: str, x: torch.Tensor, bias: torch.Tensor | None, wide: torch.dtype) -> torch.Tensor:
    """x + bias in `wide`, the bias a vector along x's last axis (as every bias of these ops is)."""
    xs = x.to(wide)
    if bias is None:
        return xs
    if bias.dim() != 1 or x.dim() == 0 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"{op}: bias of shape {list(bias.shape)} must be 1-D with the input's last dimension ({x.shape[-1] if x.dim() else 'a scalar input'})")
    return xs + bias.to(wide)


@kernel("Gelu", since=1, domain=MS)
class Gelu(Kernel):
    """x * Φ(x) = 0.5 * x * (1 + erf(x / √2)), the exact Gelu (ONNX's own Gelu-20 with approximate="none")."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.gelu(x.to(wide_dtype(x))).to(x.dtype),)


@kernel("BiasGelu", since=1, domain=MS)
class BiasGelu(Kernel):
    """Gelu(A + B), B a vector along A's last axis: BERT's bias Add and erf Gelu, fused."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.gelu(_plus_bias(self.op_type, a, b, wide_dtype(a, b))).to(a.dtype),)


@kernel("FastGelu", since=1, domain=MS)
class FastGelu(Kernel):
    """0.5 * x * (1 + tanh(√(2/π) * (x + 0.044715 * x³))) of X (+ bias): the tanh form of Gelu that GPT-2's
    gelu_new computes (the op *is* that formula: computed exactly, not approximated once more)."""

    def run(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return (F.gelu(_plus_bias(self.op_type, x, bias, wide_dtype(x, bias)), approximate="tanh").to(x.dtype),)


@kernel("QuickGelu", since=1, domain=MS)
class QuickGelu(Kernel):
    """x * sigmoid(alpha * x), alpha 1.702 by default (CLIP's quick_gelu)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", f32(1.702)))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xs = x.to(wide_dtype(x))
        return ((xs * torch.sigmoid(xs * self.alpha)).to(x.dtype),)


@kernel("BiasAdd", since=1, domain=MS)
class BiasAdd(Kernel):
    """Y = X + bias + skip, X and skip of shape (N, S, C), bias (C): Stable Diffusion's bias and residual
    Adds, fused (onnxruntime runs it on CUDA only)."""

    def run(self, x: torch.Tensor, bias: torch.Tensor, skip: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() != 3 or skip.shape != x.shape:
            raise ValueError(f"BiasAdd: X and skip must both be (N, S, C), got {list(x.shape)} and {list(skip.shape)}")
        wide = wide_dtype(x, bias, skip)
        return ((_plus_bias(self.op_type, x, bias, wide) + skip.to(wide)).to(x.dtype),)


@kernel("BiasSplitGelu", since=1, domain=MS)
class BiasSplitGelu(Kernel):
    """s = X + bias (X of shape (N, S, D), bias (D)); Y = s[..., :D/2] * Gelu(s[..., D/2:]) with the exact
    (erf) Gelu: Stable Diffusion's GEGLU, fused (onnxruntime runs it on CUDA only)."""

    def run(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() != 3 or x.shape[-1] % 2:
            raise ValueError(f"BiasSplitGelu: X must be (N, S, D) with D even, got {list(x.shape)}")
        s = _plus_bias(self.op_type, x, bias, wide_dtype(x, bias))
        left, right = s.chunk(2, dim=-1)
        return ((left * F.gelu(right)).to(x.dtype),)


@kernel("BiasSoftmax", since=1, domain=MS)
class BiasSoftmax(Kernel):
    """Y = softmax(data + bias) over the axes from `axis` on (flattened, as Softmax before opset 13), the
    bias broadcast over the batch (the axes before `axis`, R rows of the bias against N of data): with
    is_inner_broadcast=1 bias row r serves the N/R consecutive data rows from r*N/R on (the axes just before
    `axis` broadcast: a padding mask [B, 1, 1, S] against scores [B, H, S, S]), else the rows r, r+R, r+2R, ...
    (the leading axes broadcast: [H, S, S] for every sample). onnxruntime runs it on CUDA only."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))
        inner = self.attr("is_inner_broadcast")
        if inner is None:
            raise ValueError("BiasSoftmax needs its is_inner_broadcast attribute (required by the schema)")
        self.inner = bool(inner)

    def run(self, data: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not -data.dim() <= self.axis < data.dim():
            raise ValueError(f"BiasSoftmax: axis={self.axis} is out of range for data of rank {data.dim()}")
        axis = self.axis % data.dim()
        elements = data.shape[axis:].numel()
        batch = data.shape[:axis].numel()
        rows = bias.numel() // elements if elements else 0
        if not elements or bias.numel() % elements or not rows or batch % rows:
            raise UnsupportedVariantError(
                f"BiasSoftmax: bias of shape {list(bias.shape)} does not broadcast over data of shape {list(data.shape)} at axis {axis}: "
                f"it must hold a whole number of rows of {elements} elements dividing the {batch} rows of data"
            )
        wide = wide_dtype(data, bias)
        b = bias.to(wide).reshape(rows, elements)
        if self.inner:
            scores = data.to(wide).reshape(rows, batch // rows, elements) + b.unsqueeze(1)
        else:
            scores = data.to(wide).reshape(batch // rows, rows, elements) + b.unsqueeze(0)
        return (torch.softmax(scores, -1).reshape(data.shape).to(data.dtype),)
