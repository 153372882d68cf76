"""Torch kernels for onnxruntime's normalization contrib ops: SimplifiedLayerNormalization and its own
LayerNormalization (default domain), (Skip)(Simplified)LayerNormalization, (Q)EmbedLayerNormalization,
GroupNorm and SkipGroupNorm.

Statistics and the normalized values are computed in float32 for 16-bit inputs (float64 in the oracle) and
rounded once to the output's type: the value of the subgraph each op fuses, without its intermediate
roundings, which is also how onnxruntime's kernels compute.
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..nn.attention import _float_type
from .arithmetic import f32, wide_dtype

__all__ = [
    "EmbedLayerNormalization",
    "GroupNorm",
    "LayerNormalization1",
    "QEmbedLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipGroupNorm",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
]

MS = "com.microsoft"


#: the defaults of the schemas: 1e-5 for the default-domain ops and GroupNorm, 1e-12 for the Skip/Embed ones
_EPS_5 = f32(1e-5)
_EPS_12 = f32(1e-12)


def _normalize(s: torch.Tensor, first: int, eps: float, simplified: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normalized, mean, inverse standard deviation) of `s` over its axes from `first` on, reduced axes
    kept; `simplified`: RMS normalization, x / sqrt(mean(x²) + eps), whose mean is 0 (nothing is subtracted)."""
    axes = tuple(range(first, s.dim()))
    if simplified:
        ms = s.square().mean(axes, keepdim=True)
        inv = torch.rsqrt(ms + eps)
        return s * inv, torch.zeros_like(ms), inv
    var, mean = torch.var_mean(s, axes, correction=0, keepdim=True)
    inv = torch.rsqrt(var + eps)
    return (s - mean) * inv, mean, inv


def _axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis={axis} is out of range for an input of rank {rank}")
    return axis % rank


def _affine(op: str, what: str, p: torch.Tensor, shape: torch.Size) -> None:
    """onnxruntime's rule: gamma/beta/bias hold exactly the normalized shape's number of values."""
    if p.numel() != shape.numel():
        raise ValueError(f"{op}: {what} has {p.numel()} values, the normalized shape {list(shape)} has {shape.numel()}; give one per normalized element")


class _LayerNorm(Kernel):
    """The default-domain LayerNormalization (before ONNX's own in opset 17) and SimplifiedLayerNormalization:
    Y (Scale's type) = normalize(X over axes >= axis) * Scale (+ B), Mean and InvStdDev in `stash_type`."""

    simplified = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))
        self.eps = float(self.attr("epsilon", _EPS_5))
        self.stash = _float_type(ctx, int(self.attr("stash_type", 1)), f"{node.op_type} stash_type")

    def run(self, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        axis = _axis(op, self.axis, x.dim())
        shape = x.shape[axis:]
        _affine(op, "Scale", scale, shape)
        wide = torch.promote_types(wide_dtype(x, scale, bias), self.stash)
        normalized, mean, inv = _normalize(x.to(wide), axis, self.eps, self.simplified)
        y = normalized * scale.to(wide).reshape(shape)
        if bias is not None and not self.simplified:
            _affine(op, "B", bias, shape)
            y = y + bias.to(wide).reshape(shape)
        stats = (inv,) if self.simplified else (mean, inv)
        return (y.to(scale.dtype), *(s.to(self.stash) for s in stats))


@kernel("LayerNormalization", since=1)
class LayerNormalization1(_LayerNorm):
    """onnxruntime's own LayerNormalization in the default domain, which models exported below opset 17
    carry (ONNX's, since 17, has its kernel in nn): Y in Scale's type, Mean and InvStdDev in `stash_type`."""


@kernel("SimplifiedLayerNormalization", since=1)
class SimplifiedLayerNormalization(_LayerNorm):
    """RMSNorm (LLaMA, T5), which onnxruntime's optimizer and genai's builder write into the default domain:
    Y = X / sqrt(mean(X², axes >= axis) + epsilon) * scale; inv_std_var in `stash_type`."""

    simplified = True

    def run(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return super().run(x, scale)


class _SkipLayerNorm(Kernel):
    """s = input + skip (+ bias); output = normalize(s over the last axis) * gamma (+ beta); mean and
    inv_std_var in float32 (float64 in the oracle) with the last axis kept as 1; input_skip_bias_sum = s."""

    simplified = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPS_12))
        if self.eps < 0:
            raise ValueError(f"{node.op_type}: epsilon={self.eps} is negative")
        self.stats_dtype = ctx.torch_dtype(onnx.TensorProto.FLOAT)

    def _run(
        self,
        x: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor | None,
        bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        if x.dim() not in (2, 3):
            raise ValueError(f"{op}: input must be 3-D (batch, sequence, hidden) or 2-D (tokens, hidden), got shape {list(x.shape)}")
        if skip.shape != x.shape and not (skip.dim() in (2, 3) and skip.numel() > 0 and skip.shape[-2:] == x.shape[-2:] and (skip.dim() == 2 or skip.shape[0] == 1)):
            raise ValueError(f"{op}: skip of shape {list(skip.shape)} must be the input's {list(x.shape)}, (1, sequence, hidden) or (sequence, hidden)")
        shape = x.shape[-1:]
        for what, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if p is not None:
                _affine(op, what, p, shape)
        wide = wide_dtype(x, skip, gamma, beta, bias)
        s = x.to(wide) + skip.to(wide)
        if bias is not None:
            s = s + bias.to(wide).reshape(shape)
        normalized, mean, inv = _normalize(s, x.dim() - 1, self.eps, self.simplified)
        y = normalized * gamma.to(wide).reshape(shape)
        if beta is not None:
            y = y + beta.to(wide).reshape(shape)
        return (y.to(x.dtype), mean.to(self.stats_dtype), inv.to(self.stats_dtype), s.to(x.dtype))


@kernel("SkipLayerNormalization", since=1, domain=MS)
class SkipLayerNormalization(_SkipLayerNorm):
    """BERT's residual Add + LayerNormalization, fused (inputs: input, skip, gamma, beta, bias)."""

    def run(
        self,
        x: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return self._run(x, skip, gamma, beta, bias)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS)
class SkipSimplifiedLayerNormalization(_SkipLayerNorm):
    """LLaMA's residual Add + RMSNorm, fused (inputs: input, skip, gamma, bias): output = s / sqrt(mean(s²)
    + epsilon) * gamma; `mean` is 0, the mean RMSNorm subtracts (the schema lists the output for both ops)."""

    simplified = True

    def run(
        self,
        x: torch.Tensor,
        skip: torch.Tensor,
        gamma: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return self._run(x, skip, gamma, None, bias)


def _rows(op: str, table: torch.Tensor, ids: torch.Tensor, what: str) -> torch.Tensor:
    """table[ids], an index outside the table named (onnxruntime refuses it too)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise ValueError(f"{op}: {what} holds {int(ids.min())}..{int(ids.max())}, outside the table's {table.shape[0]} rows")
    return table[ids.long()]


def _embed_layer_norm(
    op: str,
    eps: float,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor | None,
    word: torch.Tensor,
    position: torch.Tensor,
    segment: torch.Tensor | None,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(LayerNorm(word[ids] + position[position_ids] + segment[segment_ids]) * gamma + beta, the mask's
    count of ones per row, the sum before normalization); position_ids default to 0..sequence-1."""
    if input_ids.dim() != 2:
        raise ValueError(f"{op}: input_ids must be 2-D (batch, sequence), got shape {list(input_ids.shape)}")
    if (segment_ids is None) != (segment is None):
        raise ValueError(f"{op}: segment_ids and segment_embedding come together; give both or neither")
    batch, seq = input_ids.shape
    hidden = word.shape[-1]
    for what, t in (("position_embedding", position), ("segment_embedding", segment)):
        if t is not None and (t.dim() != 2 or t.shape[1] != hidden):
            raise ValueError(f"{op}: {what} of shape {list(t.shape)} must be 2-D with the word embedding's {hidden} columns")
    for what, t in (("segment_ids", segment_ids), ("mask", mask)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{op}: {what} of shape {list(t.shape)} must be input_ids' {list(input_ids.shape)}")
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device).unsqueeze(0)
    elif position_ids.dim() != 2 or position_ids.shape[1] != seq or position_ids.shape[0] not in (1, batch):
        raise ValueError(f"{op}: position_ids of shape {list(position_ids.shape)} must be ({batch} or 1, {seq})")
    wide = wide_dtype(word, position, segment, gamma, beta)
    s = _rows(op, word.to(wide), input_ids, "input_ids") + _rows(op, position.to(wide), position_ids, "the position ids")
    if segment is not None and segment_ids is not None:
        s = s + _rows(op, segment.to(wide), segment_ids, "segment_ids")
    normalized, _, _ = _normalize(s, 2, eps, False)
    y = normalized * gamma.to(wide).reshape(hidden) + beta.to(wide).reshape(hidden)
    if mask is None:
        mask_index = torch.zeros(batch, dtype=torch.int32, device=input_ids.device)
    else:
        # the number of ones per row: the sequence length without its right padding (onnxruntime counts them)
        mask_index = (mask == 1).sum(-1, dtype=torch.int32)
    return y.to(out_dtype), mask_index, s.to(out_dtype)


@kernel("EmbedLayerNormalization", since=1, domain=MS)
class EmbedLayerNormalization(Kernel):
    """BERT's embedding layer, fused: inputs input_ids, segment_ids, word/position/segment embeddings, gamma,
    beta, mask, position_ids; outputs the normalized embeddings, mask_index (int32, the mask's count of ones
    per row; zeros without a mask) and embedding_sum (the sum before normalization)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPS_12))

    def run(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor | None,
        word: torch.Tensor,
        position: torch.Tensor,
        segment: torch.Tensor | None,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return _embed_layer_norm(self.op_type, self.eps, input_ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids, word.dtype)


def _dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
    return (q.to(wide) - zero_point.to(wide)) * scale.to(wide)


@kernel("QEmbedLayerNormalization", since=1, domain=MS)
class QEmbedLayerNormalization(EmbedLayerNormalization):
    """EmbedLayerNormalization on int8/uint8 tables, gamma and beta, each dequantized as (q - zero_point) *
    scale; outputs the normalized embeddings (float) and mask_index."""

    def run(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor | None,
        word_q: torch.Tensor,
        position_q: torch.Tensor,
        segment_q: torch.Tensor | None,
        gamma_q: torch.Tensor,
        beta_q: torch.Tensor,
        mask: torch.Tensor | None,
        word_scale: torch.Tensor,
        position_scale: torch.Tensor,
        segment_scale: torch.Tensor | None,
        gamma_scale: torch.Tensor,
        beta_scale: torch.Tensor,
        word_zp: torch.Tensor,
        position_zp: torch.Tensor,
        segment_zp: torch.Tensor | None,
        gamma_zp: torch.Tensor,
        beta_zp: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        group = (segment_ids, segment_q, segment_scale, segment_zp)
        if any(t is None for t in group) and any(t is not None for t in group):
            raise ValueError("QEmbedLayerNormalization: segment_ids, segment_embedding, its scale and zero point come together; give all four or none")
        wide = wide_dtype(word_scale)
        segment = None if segment_q is None or segment_scale is None or segment_zp is None else _dequantize(segment_q, segment_scale, segment_zp, wide)
        y, mask_index, _ = _embed_layer_norm(
            self.op_type,
            self.eps,
            input_ids,
            segment_ids,
            _dequantize(word_q, word_scale, word_zp, wide),
            _dequantize(position_q, position_scale, position_zp, wide),
            segment,
            _dequantize(gamma_q, gamma_scale, gamma_zp, wide),
            _dequantize(beta_q, beta_scale, beta_zp, wide),
            mask,
            None,
            word_scale.dtype,
        )
        return (y, mask_index)


class _GroupNorm(Kernel):
    """y = gamma * (x - mean) / sqrt(var + epsilon) + beta, statistics per sample per group of channels,
    then SiLU when activation=1; channels last ([N, H, W, C], the default) or first ([N, C, H, W])."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.eps = float(self.attr("epsilon", _EPS_5))
        groups = self.attr("groups")
        activation = self.attr("activation")
        if groups is None or activation is None:
            raise ValueError(f"{node.op_type} needs its groups and activation attributes (both required by the schema)")
        self.groups = int(groups)
        self.activation = int(activation)
        if self.groups <= 0:
            raise ValueError(f"{node.op_type}: groups={self.groups} must be positive")
        if self.activation not in (0, 1):
            raise UnsupportedVariantError(f"{node.op_type} activation={self.activation}: the schema defines 0 (none) and 1 (SiLU)")
        self.channels_last = bool(self.attr("channels_last", 1))

    def _run(self, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, skip: torch.Tensor | None, bias: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        if x.dim() < 3:
            raise ValueError(f"{op}: X must be [N, H, W, C] (channels_last=1) or [N, C, H, W], got shape {list(x.shape)}")
        c = x.shape[-1] if self.channels_last else x.shape[1]
        if c % self.groups:
            raise ValueError(f"{op}: groups={self.groups} does not divide the {c} channels of X")
        for what, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if p is not None and p.numel() != c:
                raise ValueError(f"{op}: {what} has {p.numel()} values, X has {c} channels; give one per channel")
        wide = wide_dtype(x, gamma, beta, skip, bias)
        s = x.to(wide)
        if skip is not None:
            if skip.dim() == 2:  # (N, C): one value per sample and channel
                skip = skip.reshape(skip.shape[0], *([1] * (x.dim() - 2)), c) if self.channels_last else skip.reshape(*skip.shape, *([1] * (x.dim() - 2)))
            try:
                s = s + skip.to(wide)
            except RuntimeError:
                raise ValueError(f"{op}: skip of shape {list(skip.shape)} does not broadcast to X's {list(x.shape)}; give X's shape, (N, 1, 1, C) or (N, C)") from None
            if bias is not None:
                per_channel = (c,) if self.channels_last else (c, *([1] * (x.dim() - 2)))
                s = s + bias.to(wide).reshape(per_channel)
        cf = s.movedim(-1, 1) if self.channels_last else s  # channels first: [N, C, ...]
        n = cf.shape[0]
        grouped = cf.reshape(n, self.groups, -1)
        var, mean = torch.var_mean(grouped, -1, correction=0, keepdim=True)
        normalized = ((grouped - mean) * torch.rsqrt(var + self.eps)).reshape(cf.shape)
        per_channel = (c, *([1] * (x.dim() - 2)))
        y = normalized * gamma.to(wide).reshape(per_channel) + beta.to(wide).reshape(per_channel)
        if self.activation == 1:
            y = F.silu(y)
        if self.channels_last:
            y = y.movedim(1, -1)
        return (y.to(x.dtype), s.to(x.dtype))


@kernel("GroupNorm", since=1, domain=MS)
class GroupNorm(_GroupNorm):
    """Stable Diffusion's GroupNorm (+ SiLU), fused: inputs X, gamma, beta (onnxruntime runs it on CUDA only)."""

    def run(self, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._run(x, gamma, beta, None, None)[:1]


@kernel("SkipGroupNorm", since=1, domain=MS)
class SkipGroupNorm(_GroupNorm):
    """s = X + skip (X's shape, (N, 1, 1, C) or (N, C)) + bias; Y = GroupNorm(s) (+ SiLU); S = s (onnxruntime
    runs it on CUDA only)."""

    def run(
        self,
        x: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        skip: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return self._run(x, gamma, beta, skip, bias)
