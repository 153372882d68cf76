"""Normalization kernels (ONNX's nn family): LayerNormalization (with its Mean/InvStdDev outputs),
RMSNormalization.
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from ....dtypes import DType
from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .attention import _EPSILON_DEFAULT, _float_type

__all__ = ['LayerNormalization', 'RMSNormalization']


@kernel("RMSNormalization", since=23)
class RMSNormalization(Kernel):
    """Normalized = X / sqrt(mean(X², axes >= axis) + epsilon) in the stash type, cast to X's type, times Scale."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))
        # an attribute is a float32: so is the default, which matters when the stash type is wider
        self.eps = float(self.attr("epsilon", _EPSILON_DEFAULT))
        self.stash = _float_type(
            ctx, int(self.attr("stash_type", 1)), "RMSNormalization stash_type"
        )

    def run(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dtype != scale.dtype:
            # The function body multiplies Cast(Normalized, to=T) by Scale (of type V): only defined for T == V.
            raise UnsupportedVariantError(
                f"RMSNormalization with X of {x.dtype} and Scale of {scale.dtype}: the spec's body needs one type"
            )
        if not -x.dim() <= self.axis < x.dim():
            raise ValueError(
                f"RMSNormalization axis={self.axis} is out of range for X of rank {x.dim()}"
            )
        axes = tuple(range(self.axis % x.dim(), x.dim()))
        xs = x.to(self.stash)
        rms = torch.sqrt(torch.mean(xs * xs, axes, keepdim=True) + self.eps)
        return ((xs / rms).to(x.dtype) * scale,)


# The precision torch's layer_norm computes in for each input dtype (its "opmath" type): when it equals
# the stash type, F.layer_norm alone honours stash_type.
_OPMATH = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float32,
    torch.float64: torch.float64,
}


@kernel("LayerNormalization", since=17)
class LayerNormalization(Kernel):
    """Y in X's dtype; Mean and InvStdDev in the stash type (compute_dtype in oracle mode), reduced dims kept."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))
        self.eps = float(self.attr("epsilon", 1e-5))
        stash_type = int(self.attr("stash_type", 1))
        try:
            floating = DType(stash_type).is_floating_point
        except ValueError:
            floating = False
        if not floating:
            raise UnsupportedVariantError(
                f"LayerNormalization with stash_type={stash_type}: not a float type"
            )
        self.stash = ctx.torch_dtype(stash_type)
        # Mean/InvStdDev cost a second reduction: only when the graph consumes them.
        self.want_stats = any(node.output[1:])

    def run(
        self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        axis = self.axis if self.axis >= 0 else self.axis + x.dim()
        shape = x.shape[axis:]
        if (
            _OPMATH.get(x.dtype) == self.stash
            and scale.shape == shape
            and (bias is None or bias.shape == shape)
        ):
            y = F.layer_norm(x, shape, scale, bias, self.eps)
        else:
            # The spec's own order: normalize in the stash type, cast back to X's type, then scale and
            # shift in X's type (which also covers Scale/B that merely broadcast to the normalized shape).
            y = F.layer_norm(x.to(self.stash), shape, None, None, self.eps).to(x.dtype) * scale
            if bias is not None:
                y = y + bias
        if not self.want_stats:
            return (y,)
        var, mean = torch.var_mean(
            x.to(self.stash), tuple(range(axis, x.dim())), correction=0, keepdim=True
        )
        return (y, mean, torch.rsqrt(var + self.eps))
