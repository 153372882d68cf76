"""Normalization kernels (ONNX's nn family): LayerNormalization (with its Mean/InvStdDev outputs),
RMSNormalization, BatchNormalization, InstanceNormalization, GroupNormalization, LRN, LpNormalization, MVN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from ....numerics.dtypes import DType
from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .attention import _EPSILON_DEFAULT, _float_type

__all__ = [
    "LRN",
    "BatchNormalization14",
    "GroupNormalization18",
    "GroupNormalization21",
    "InstanceNormalization",
    "LayerNormalization",
    "LpNormalization",
    "MeanVarianceNormalization",
    "RMSNormalization",
]


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

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        # fixed Scale and B (initializers): their shape is the normalized one, checked once
        scale, bias = static.get(1), static.get(2)
        if self.want_stats or set(static) - {1, 2} or scale is None or scale.dim() == 0 or (bias is not None and bias.shape != scale.shape):
            return None
        if len(self.node.input) > 2 and self.node.input[2] and bias is None:
            return None  # B is an input of each run
        shape, n, axis, stash, eps, run = scale.shape, scale.dim(), self.axis, self.stash, self.eps, self.run

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            if (axis if axis >= 0 else axis + x.dim()) == x.dim() - n and _OPMATH.get(x.dtype) == stash and x.shape[-n:] == shape:
                return torch.layer_norm(x, shape, scale, bias, eps)
            return run(x, scale, bias)[0]

        return layer_norm

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
            y = torch.layer_norm(x, shape, scale, bias, self.eps)  # F.layer_norm's op, past its Python layer
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


def _wide(x: torch.Tensor) -> torch.dtype:
    """The dtype statistics are computed in: float32 for 16-bit floats (as onnxruntime's CPU kernels do),
    the tensor's own dtype otherwise (float64 in the oracle)."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _per_channel(p: torch.Tensor, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-channel parameter (C,) shaped to broadcast against [N, C, D1, ...]; a per-activation one
    (C, D1, ...) of BatchNormalization's `spatial=0` already broadcasts against [N, ...]."""
    p = p.to(dtype)
    return p.reshape(-1, *([1] * (rank - 2))) if p.dim() == 1 else p


def _batch_norm_inference(
    x: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    wide = _wide(x)
    r = x.dim()
    inv = torch.rsqrt(_per_channel(var, r, wide) + eps) * _per_channel(scale, r, wide)
    y = (x.to(wide) - _per_channel(mean, r, wide)) * inv + _per_channel(bias, r, wide)
    return y.to(x.dtype)


class _BatchNormalizationInference(Kernel):
    """Opsets 1-9: inference only (`is_test=1`, or no training outputs asked); `spatial=0` means
    per-activation Scale/B/mean/var of shape (C, D1, ...)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPSILON_DEFAULT))
        training = any(node.output[1:]) or (self.since < 7 and not int(self.attr("is_test", 0)))
        if training:
            # Before opset 14 the training outputs (saved mean / saved variance) are left undefined
            # by the spec (onnxruntime's inference builds refuse them too).
            raise UnsupportedVariantError(
                f"BatchNormalization (opset {self.since}) in training mode (is_test=0 or mean/var/saved "
                "outputs asked): only inference is defined; export with opset >= 14 for training_mode=1"
            )

    def run(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor,
        mean: torch.Tensor,
        var: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        return (_batch_norm_inference(x, scale, bias, mean, var, self.eps),)


@kernel("BatchNormalization", since=1)
class BatchNormalization1(_BatchNormalizationInference):
    pass


@kernel("BatchNormalization", since=6)
class BatchNormalization6(_BatchNormalizationInference):
    pass


@kernel("BatchNormalization", since=7)
class BatchNormalization7(_BatchNormalizationInference):
    pass


@kernel("BatchNormalization", since=9)
class BatchNormalization9(_BatchNormalizationInference):
    pass


@kernel("BatchNormalization", since=14)
class BatchNormalization14(Kernel):
    """`training_mode=1`: Y normalized by the batch's statistics (population variance), running_mean and
    running_var = input * momentum + batch statistic * (1 - momentum), in their input's dtype."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPSILON_DEFAULT))
        self.momentum = float(self.attr("momentum", torch.tensor(0.9, dtype=torch.float32).item()))
        self.training = bool(self.attr("training_mode", 0))
        if not self.training and any(node.output[1:]):
            raise ValueError(
                "BatchNormalization with training_mode=0 has one output; running_mean/running_var "
                "are only produced with training_mode=1"
            )

    def run(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor,
        mean: torch.Tensor,
        var: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        if not self.training:
            return (_batch_norm_inference(x, scale, bias, mean, var, self.eps),)
        wide = _wide(x)
        axes = (0, *range(2, x.dim()))
        batch_var, batch_mean = torch.var_mean(x.to(wide), axes, correction=0)
        y = _batch_norm_inference(x, scale, bias, batch_mean, batch_var, self.eps)
        stats = torch.promote_types(wide, _wide(mean))
        m = self.momentum
        running_mean = mean.to(stats) * m + batch_mean.to(stats) * (1 - m)
        running_var = var.to(stats) * m + batch_var.to(stats) * (1 - m)
        return (y, running_mean.to(mean.dtype), running_var.to(var.dtype))


@kernel("BatchNormalization", since=15)
class BatchNormalization15(BatchNormalization14):
    """Opset 15 only widens the type constraints (Scale/B and mean/var may differ from X's type)."""


def _instance_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the spatial axes of [N, C, D1, ...], in the wide dtype."""
    wide = _wide(x)
    xs = x.to(wide)
    var, mean = torch.var_mean(xs, tuple(range(2, x.dim())), correction=0, keepdim=True)
    return (xs - mean) * torch.rsqrt(var + eps)


@kernel("InstanceNormalization", since=1)
class InstanceNormalization(Kernel):
    """y = scale * (x - mean) / sqrt(variance + epsilon) + B, statistics per instance per channel."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPSILON_DEFAULT))

    def run(
        self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        if x.dim() < 3:
            raise ValueError(
                f"InstanceNormalization needs X of rank >= 3 ([N, C, D1, ...]), got rank {x.dim()}"
            )
        n = _instance_norm(x, self.eps)
        r = x.dim()
        y = n * _per_channel(scale, r, n.dtype) + _per_channel(bias, r, n.dtype)
        return (y.to(x.dtype),)


@kernel("InstanceNormalization", since=6)
class InstanceNormalization6(InstanceNormalization):
    pass


@kernel("InstanceNormalization", since=22)
class InstanceNormalization22(InstanceNormalization):
    pass


@kernel("GroupNormalization", since=18)
class GroupNormalization18(Kernel):
    """Opset 18: Scale and B hold one value per *group* (the semantics opset 21 deprecated)."""

    per_channel = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPSILON_DEFAULT))
        self.groups = int(self.attr("num_groups", 0))
        if self.groups <= 0:
            raise ValueError("GroupNormalization needs a positive num_groups attribute")
        # Opset 18 has no stash_type: normalize in float32 at least, as onnxruntime does for float16.
        self.stash: torch.dtype | None = (
            _float_type(ctx, int(self.attr("stash_type", 1)), "GroupNormalization stash_type")
            if self.per_channel
            else None
        )

    def run(
        self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        n, c = x.shape[0], x.shape[1]
        if c % self.groups:
            raise ValueError(
                f"GroupNormalization: num_groups={self.groups} does not divide the {c} channels of X"
            )
        want = c if self.per_channel else self.groups
        if scale.numel() != want or bias.numel() != want:
            raise ValueError(
                f"GroupNormalization (opset {self.since}) needs Scale and B of {want} values "
                f"({'one per channel' if self.per_channel else 'one per group'}), got "
                f"{scale.numel()} and {bias.numel()}"
            )
        stash = self.stash if self.stash is not None else _wide(x)
        xg = x.to(stash).reshape(n, self.groups, -1)
        var, mean = torch.var_mean(xg, -1, correction=0, keepdim=True)
        normalized = ((xg - mean) * torch.rsqrt(var + self.eps)).reshape(n, c, -1)
        if self.per_channel:
            # Stage two runs in X's type: the normalized values are cast back first.
            normalized = normalized.to(x.dtype)
            s, b = scale.reshape(c, 1), bias.reshape(c, 1)
        else:
            s = scale.to(stash).repeat_interleave(c // self.groups).reshape(c, 1)
            b = bias.to(stash).repeat_interleave(c // self.groups).reshape(c, 1)
        y = normalized * s + b
        return (y.to(x.dtype).reshape(x.shape),)


@kernel("GroupNormalization", since=21)
class GroupNormalization21(GroupNormalization18):
    """Opset 21: Scale and B per *channel*; the first stage runs in `stash_type`, the second in X's type."""

    per_channel = True


@kernel("LRN", since=1)
class LRN(Kernel):
    """y = x / (bias + alpha / size * sum of x² over the channel window [c - floor((size-1)/2),
    c + ceil((size-1)/2)]) ** beta."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.size = int(self.attr("size", 0))
        if self.size <= 0:
            raise ValueError("LRN needs a positive size attribute")
        self.alpha = float(self.attr("alpha", torch.tensor(1e-4, dtype=torch.float32).item()))
        self.beta = float(self.attr("beta", torch.tensor(0.75, dtype=torch.float32).item()))
        self.bias = float(self.attr("bias", 1.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        wide = _wide(x)
        sq = x.to(wide).square()
        before = (self.size - 1) // 2
        after = self.size - 1 - before
        # F.pad pads the last dims first: move channels last, pad, take sliding windows of `size`.
        padded = F.pad(sq.movedim(1, -1), (before, after))
        window = padded.unfold(-1, self.size, 1).sum(-1).movedim(-1, 1)
        y = x.to(wide) / (self.bias + (self.alpha / self.size) * window) ** self.beta
        return (y.to(x.dtype),)


@kernel("LRN", since=13)
class LRN13(LRN):
    pass


@kernel("LpNormalization", since=1)
class LpNormalization(Kernel):
    """x / ||x||_p along `axis` (p = 1 or 2); a zero norm gives 0, as onnxruntime and onnx.reference do."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))
        self.p = int(self.attr("p", 2))
        if self.p not in (1, 2):
            raise UnsupportedVariantError(f"LpNormalization p={self.p}: the spec allows p=1 or p=2")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        wide = _wide(x)
        xs = x.to(wide)
        norm = torch.linalg.vector_norm(xs, ord=self.p, dim=self.axis, keepdim=True)
        y = torch.where(norm == 0, torch.zeros_like(xs), xs / norm)
        return (y.to(x.dtype),)


@kernel("LpNormalization", since=22)
class LpNormalization22(LpNormalization):
    pass


@kernel("MeanVarianceNormalization", since=9)
class MeanVarianceNormalization(Kernel):
    """(X - E[X]) / (sqrt(Var[X]) + 1e-9) over `axes` (default [0, 2, 3]), the spec's function body."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = tuple(int(a) for a in self.attr("axes", [0, 2, 3]))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        wide = _wide(x)
        xs = x.to(wide)
        # var_mean rather than the body's E[X²] - E[X]²: the same value without the cancellation.
        var, mean = torch.var_mean(xs, self.axes, correction=0, keepdim=True)
        y = (xs - mean) / (torch.sqrt(var) + 1e-9)
        return (y.to(x.dtype),)


@kernel("MeanVarianceNormalization", since=13)
class MeanVarianceNormalization13(MeanVarianceNormalization):
    pass
