"""Normalization torch kernels: LayerNormalization (with its Mean/InvStdDev outputs), Softmax, LogSoftmax.

Softmax and LogSoftmax change meaning at opset 13 (coerce-to-2-D at `axis` before, one axis after).
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from ...dtypes import DType
from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["LayerNormalization", "LogSoftmax", "LogSoftmax13", "Softmax", "Softmax13"]

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


@kernel("Softmax", since=1)
class Softmax(Kernel):
    """Opsets 1-12: X is coerced to 2-D, [prod(dims < axis), prod(dims >= axis)], and each row normalized."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # flatten(axis) is exactly the coercion (a no-op when axis is the last dim).
        return (torch.softmax(x.flatten(self.axis), -1).reshape(x.shape),)


@kernel("Softmax", since=13)
class Softmax13(Kernel):
    """Opset 13+: normalize along the single dimension `axis` (default -1)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.softmax(x, self.axis),)


@kernel("LogSoftmax", since=1)
class LogSoftmax(Kernel):
    """Opsets 1-12: same 2-D coercion at `axis` (default 1) as Softmax."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log_softmax(x.flatten(self.axis), -1).reshape(x.shape),)


@kernel("LogSoftmax", since=13)
class LogSoftmax13(Kernel):
    """Opset 13+: along the single dimension `axis` (default -1)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log_softmax(x, self.axis),)
