"""Torch kernels for onnxruntime's attention contrib ops: Attention, MultiHeadAttention, GroupQueryAttention,
RotaryEmbedding, DecoderMasked(MultiHead|Self)Attention, SparseAttention, Packed(MultiHead)Attention, QAttention.

Precision: a node runs in float32 for float16, bfloat16 and float32 inputs (float64 in the oracle), from the
projection through Q·Kᵀ, scale, softcap, bias and masks, softmax and ·V, and each output is rounded once to
the I/O type, as onnxruntime's CPU kernels do. The one exception is a KV cache the node reads back: new
keys/values (rotated, for GroupQueryAttention and SparseAttention) are rounded to the cache's type before
the attention reads them, since that is what the cache holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..nn.attention import rotate

__all__ = [
    "Attention",
    "DecoderMaskedMultiHeadAttention",
    "DecoderMaskedSelfAttention",
    "GroupQueryAttention",
    "MultiHeadAttention",
    "PackedAttention",
    "PackedMultiHeadAttention",
    "QAttention",
    "RotaryEmbedding",
    "SparseAttention",
]

MS = "com.microsoft"

#: the default of every mask_filter_value attribute: what a masked (padding) score gets added
MASK_FILTER_VALUE = -10000.0


# -- shared arithmetic -------------------------------------------------------------------------------


def _wide(t: torch.Tensor) -> torch.dtype:
    """The type attention is computed in: float64 for the oracle's float64, float32 for everything else."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as the I/O type holds it (a value the unfused graph stores), kept in t's wider type for the arithmetic."""
    return t if t.dtype == dtype else t.to(dtype).to(t.dtype)


def _bnsh(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """[batch, seq, heads * head] -> [batch, heads, seq, head]."""
    if x.dim() != 3:
        raise ValueError(f"{what} must be 3-D [batch, sequence, hidden], got shape {list(x.shape)}")
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ValueError(f"{what}: num_heads={heads} does not divide its hidden size {hidden}")
    return x.reshape(b, s, heads, hidden // heads).transpose(1, 2)


def _bsd(x: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, head] -> [batch, seq, heads * head]."""
    b, n, s, h = x.shape
    return x.transpose(1, 2).reshape(b, s, n * h)


def _softmax(x: torch.Tensor, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis; with `sink` (broadcastable to x[..., :1]) an extra logit that joins the
    denominator and is dropped (smooth softmax: sink 0; head_sink: one per head). A row with every score
    -inf and no sink attends nothing: zeros."""
    m = x.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isneginf(m), torch.zeros((), dtype=x.dtype, device=x.device), m)
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        s = s + torch.exp(sink - m)
    return torch.where(s == 0, torch.zeros((), dtype=x.dtype, device=x.device), e / s)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None = None,
    *,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(softcap(scale · Q·Kᵀ) + bias) · V for Q [B, N, S, H], K [B, N_kv, T, H], V [B, N_kv, T, H_v] in
    one float type (each K/V head serving N / N_kv consecutive Q heads). Returns (output [B, N, S, H_v],
    the scores before softmax, the probabilities)."""
    n, n_kv = q.shape[1], k.shape[1]
    if n != n_kv:
        if n_kv <= 0 or n % n_kv:
            raise ValueError(f"num_heads ({n}) must be a multiple of kv_num_heads ({n_kv})")
        k = k.repeat_interleave(n // n_kv, dim=1)
        v = v.repeat_interleave(n // n_kv, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    probs = _softmax(scores, sink)
    return torch.matmul(probs, v), scores, probs


def _scale(attr: float, head_size: int) -> float:
    """The `scale` attribute, 0 (absent) meaning 1/sqrt(head_size)."""
    return attr if attr else 1.0 / math.sqrt(head_size)


def _neg_inf_where(disallowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(
        disallowed,
        torch.tensor(float("-inf"), dtype=dtype, device=disallowed.device),
        torch.zeros((), dtype=dtype, device=disallowed.device),
    )


def _causal(q_len: int, total: int, past: int, device: torch.device) -> torch.Tensor:
    """[S, T] True where query i (at absolute position past + i) may not see key j (j > past + i)."""
    i = torch.arange(q_len, device=device).reshape(-1, 1)
    j = torch.arange(total, device=device).reshape(1, -1)
    return j > i + past


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _mask_bias(
    mask: torch.Tensor | None,
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    total: int,
    past: int,
    filter_value: float,
    dtype: torch.dtype,
    op: str,
) -> torch.Tensor | None:
    """The additive bias [B, 1, S, T] a mask_index / key_padding_mask means: `filter_value` (mask_filter_value)
    on the masked keys, 0 elsewhere. Forms: 1-D (B) key end positions (right padding), 1-D (2B) end then
    start positions (left padding too), 2-D (B, T) 0/1 per key, 3-D (B, S, T) 0/1 per query and key, 4-D
    (B, 1, M, M) Megatron's 0/1 mask over absolute positions (rows past .. past + S)."""
    if mask is None:
        return None
    device = mask.device
    m = mask.to(torch.int64)
    j = torch.arange(total, device=device)
    shape = list(mask.shape)
    if m.dim() == 1 and shape[0] == batch:
        keep = (j.reshape(1, -1) < m.reshape(-1, 1)).reshape(batch, 1, 1, total)
    elif m.dim() == 1 and shape[0] == 2 * batch:
        end, start = m[:batch].reshape(-1, 1), m[batch:].reshape(-1, 1)
        keep = ((j < end) & (j >= start)).reshape(batch, 1, 1, total)
    elif m.dim() == 1 and shape[0] == 3 * batch + 2:
        raise UnsupportedVariantError(
            f"{op}: mask of shape (3 * batch_size + 2) (key lengths and cumulative query/key starts of "
            "onnxruntime's CUDA padding-free path) is not supported; give the key lengths as a (batch_size) mask"
        )
    elif m.dim() == 2 and shape == [batch, total]:
        keep = (m > 0).reshape(batch, 1, 1, total)
    elif m.dim() == 2 and shape == [batch, kv_len]:
        raise UnsupportedVariantError(
            f"{op}: a 2-D mask of shape (batch_size, kv_sequence_length) = {shape} with a past of {past}: the "
            f"keys it covers are ambiguous; give it for all {total} keys (past and new)"
        )
    elif m.dim() == 3 and shape == [batch, q_len, total]:
        keep = (m > 0).reshape(batch, 1, q_len, total)
    elif m.dim() == 4 and shape[0] == batch and shape[1] == 1 and shape[2] >= past + q_len and shape[3] >= total:
        keep = m[:, :, past : past + q_len, :total] > 0
    else:
        raise ValueError(
            f"{op}: mask of shape {shape} matches none of the forms (batch_size)={batch}, (2 * batch_size), "
            f"(batch_size, total_sequence_length)=({batch}, {total}), (batch_size, sequence_length, "
            f"total_sequence_length)=({batch}, {q_len}, {total}) or (batch_size, 1, max_sequence_length, "
            "max_sequence_length)"
        )
    return torch.where(
        keep,
        torch.zeros((), dtype=dtype, device=device),
        torch.tensor(filter_value, dtype=dtype, device=device),
    )


def _attention_bias(bias: torch.Tensor | None, wide: torch.dtype, what: str, total: int) -> torch.Tensor | None:
    """attention_bias (B or 1, N or 1, S, T) in the compute type, checked to cover the T keys."""
    if bias is None:
        return None
    if bias.dim() != 4:
        raise ValueError(f"{what}: attention_bias must be 4-D (batch or 1, heads or 1, S, T), got {list(bias.shape)}")
    if bias.shape[-1] != total:
        raise ValueError(f"{what}: attention_bias has {bias.shape[-1]} columns, the attention has {total} keys")
    return bias.to(wide)


def _rotary_angles(
    positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, wide: torch.dtype, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin rows at `positions` ([B, S] int) from (max_positions, rotary_dim / 2) caches, in the compute type."""
    if cos_cache.dim() != 2 or sin_cache.shape != cos_cache.shape:
        raise ValueError(
            f"{what}: cos_cache and sin_cache must be 2-D of one shape, got {list(cos_cache.shape)} and {list(sin_cache.shape)}"
        )
    top = int(positions.max()) if positions.numel() else 0
    if top >= cos_cache.shape[0] or (positions.numel() and int(positions.min()) < 0):
        raise ValueError(
            f"{what}: position {top} is outside the cos/sin caches' {cos_cache.shape[0]} rows; give longer caches"
        )
    return cos_cache.to(wide)[positions], sin_cache.to(wide)[positions]


def _rotate_bnsh(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [B, N, S, H] rotated at each (batch, sequence) by cos/sin [B, S, rot / 2]."""
    return rotate(x, cos.unsqueeze(1), sin.unsqueeze(1), 2 * cos.shape[-1], interleaved)


def _theta_caches(positions: int, rotary_dim: int, device: torch.device, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The standard RoPE caches (base 10000): angle p / 10000^(2i / rotary_dim), for the ops that rotate
    without cos/sin inputs (do_rotary of Attention, QAttention, DecoderMaskedSelfAttention: onnxruntime's
    CUDA kernels rotate consecutive pairs, GPT-J style, with these angles)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(positions, device=device, dtype=torch.float64).reshape(-1, 1) * inv.reshape(1, -1)
    return torch.cos(angles).to(wide), torch.sin(angles).to(wide)


def _int(t: torch.Tensor | None, what: str, default: int | None = None) -> int:
    if t is None:
        if default is None:
            raise ValueError(f"{what} is required")
        return default
    if t.numel() != 1:
        raise ValueError(f"{what} must hold one value, got shape {list(t.shape)}")
    return int(t.reshape(()))


def _ints(t: torch.Tensor, what: str, n: int) -> list[int]:
    values = [int(x) for x in t.reshape(-1).tolist()]
    if len(values) != n:
        raise ValueError(f"{what} must hold {n} values (one per batch entry), got shape {list(t.shape)}")
    return values


def _projection(
    x: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor | None,
    sizes: Sequence[int],
    wide: torch.dtype,
) -> list[torch.Tensor]:
    """x · W + b in the compute type, split into Q, K, V (hidden sizes `sizes`)."""
    qkv = torch.matmul(x.to(wide), weights.to(wide))
    if bias is not None:
        qkv = qkv + bias.to(wide)
    return list(qkv.split(list(sizes), dim=-1))


class _FusedBase(Kernel):
    """The attributes every one of these ops reads: num_heads, scale, mask_filter_value, unidirectional."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.num_heads = int(self.attr("num_heads", 0))
        if self.num_heads <= 0:
            raise ValueError(f"{self.op_type}: the num_heads attribute is required and must be positive")
        self.scale_attr = float(self.attr("scale", 0.0))
        self.mask_filter_value = float(self.attr("mask_filter_value", MASK_FILTER_VALUE))
        self.unidirectional = bool(self.attr("unidirectional", 0))


# -- Attention (packed QKV weights, stacked past) ------------------------------------------------------


@kernel("Attention", since=1, domain=MS)
class Attention(_FusedBase):
    """Multi-head self-attention from the packed projection x · W + b (BERT, GPT-2, as fused by
    onnxruntime.transformers.optimizer): Q/K/V hidden sizes from `qkv_hidden_sizes` (or W's columns / 3),
    masks (every mask_index form, `mask_filter_value` added to masked scores), `unidirectional` (causal,
    bottom-right aligned after the past), past/present stacked as (2, B, N, T, H) (with
    `past_present_share_buffer`: a (2, B, N, M, H) buffer written at `past_sequence_length`),
    `attention_bias`, `scale`, and `do_rotary` (RoPE with base 10000 on consecutive pairs of the first
    `rotary_embedding_dim` channels of Q and K, at their absolute positions)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        sizes = self.attr("qkv_hidden_sizes")
        self.qkv_sizes = None if not sizes else [int(s) for s in sizes]
        if self.qkv_sizes is not None and (len(self.qkv_sizes) != 3 or self.qkv_sizes[0] != self.qkv_sizes[1]):
            raise ValueError(f"{self.op_type}: qkv_hidden_sizes must be 3 values with Q's equal to K's, got {self.qkv_sizes}")
        self.share_buffer = bool(self.attr("past_present_share_buffer", 0))
        self.do_rotary = bool(self.attr("do_rotary", 0))
        self.rotary_dim = int(self.attr("rotary_embedding_dim", 0))

    def _sizes(self, weights: torch.Tensor) -> list[int]:
        if self.qkv_sizes is not None:
            sizes = self.qkv_sizes
            if sum(sizes) != weights.shape[-1]:
                raise ValueError(f"{self.op_type}: qkv_hidden_sizes {sizes} do not add up to the weights' {weights.shape[-1]} columns")
        else:
            if weights.shape[-1] % 3:
                raise ValueError(f"{self.op_type}: the weights' {weights.shape[-1]} columns are not divisible by 3; give qkv_hidden_sizes")
            sizes = [weights.shape[-1] // 3] * 3
        for s in sizes:
            if s % self.num_heads:
                raise ValueError(f"{self.op_type}: num_heads={self.num_heads} does not divide the hidden size {s}")
        return sizes

    def run(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask_index: torch.Tensor | None = None,
        past: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        past_sequence_length: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        q, k, v = _projection(x, weights, bias, self._sizes(weights), _wide(x))
        return self.attend(q, k, v, x.dtype, mask_index, past, attention_bias, past_sequence_length)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dtype: torch.dtype,
        mask_index: torch.Tensor | None,
        past: torch.Tensor | None,
        attention_bias: torch.Tensor | None,
        past_sequence_length: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        """The attention after the projection (shared with QAttention and DecoderMaskedSelfAttention):
        Q/K/V [B, S, hidden] in the compute type."""
        n = self.num_heads
        wide = q.dtype
        qh, kh, vh = _bnsh(q, n, "Q"), _bnsh(k, n, "K"), _bnsh(v, n, "V")
        batch, _, q_len, head = qh.shape
        if past is not None and (past.dim() != 5 or past.shape[0] != 2 or past.shape[1] != batch or past.shape[2] != n):
            raise ValueError(f"{self.op_type}: past must be (2, batch_size, num_heads, past_length, head_size), got {list(past.shape)}")
        if self.share_buffer:
            if past is None:
                raise ValueError(f"{self.op_type}: past_present_share_buffer needs the past input (the shared buffer)")
            past_len = _int(past_sequence_length, f"{self.op_type}: past_sequence_length (with past_present_share_buffer)")
            if past_len + q_len > past.shape[3]:
                raise ValueError(f"{self.op_type}: past_sequence_length {past_len} + {q_len} new tokens exceed the buffer's {past.shape[3]} rows")
        else:
            past_len = 0 if past is None else past.shape[3]
        total = past_len + q_len
        if self.do_rotary:
            rot = self.rotary_dim or head
            cos, sin = _theta_caches(total, rot, q.device, wide)
            pos = torch.arange(past_len, total, device=q.device).reshape(1, -1).expand(batch, -1)
            qh = _rotate_bnsh(qh, cos[pos], sin[pos], True)
            kh = _rotate_bnsh(kh, cos[pos], sin[pos], True)
        want_present = len(self.node.output) > 1 and bool(self.node.output[1])
        present = None
        if past is not None:
            pk, pv = past[0].to(wide), past[1].to(wide)
            if self.share_buffer:
                pk, pv = pk.clone(), pv.clone()
                pk[:, :, past_len:total] = kh
                pv[:, :, past_len:total] = vh
                present = torch.stack((pk, pv))
                kh, vh = pk[:, :, :total], pv[:, :, :total]
            else:
                kh, vh = torch.cat((pk, kh), dim=2), torch.cat((pv, vh), dim=2)
        if present is None and want_present:
            if kh.shape[-1] != vh.shape[-1]:
                raise ValueError(f"{self.op_type}: the present output needs Q, K and V of one hidden size")
            present = torch.stack((kh, vh))
        bias = _mask_bias(
            mask_index, batch=batch, q_len=q_len, kv_len=q_len, total=total, past=past_len,
            filter_value=self.mask_filter_value, dtype=wide, op=self.op_type,
        )
        bias = _add(bias, _attention_bias(attention_bias, wide, self.op_type, total))
        if self.unidirectional:
            bias = _add(bias, _neg_inf_where(_causal(q_len, total, past_len, q.device), wide))
        out, _, _ = _attend(qh, kh, vh, _scale(self.scale_attr, head), bias)
        y = _bsd(out).to(dtype)
        return (y, present.to(dtype)) if present is not None else (y,)


# -- MultiHeadAttention and DecoderMaskedMultiHeadAttention ---------------------------------------------


def _split_bias(bias: torch.Tensor | None, q_hidden: int, k_hidden: int, wide: torch.dtype) -> list[torch.Tensor | None]:
    """The projection bias (q_hidden + k_hidden + v_hidden) as its Q, K, V parts in the compute type."""
    if bias is None:
        return [None, None, None]
    b = bias.to(wide)
    return [b[:q_hidden], b[q_hidden : q_hidden + k_hidden], b[q_hidden + k_hidden :]]


def _plus(x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x if b is None else x + b


def _beam_gather(cache: torch.Tensor, indirection: torch.Tensor, length: int, what: str) -> torch.Tensor:
    """The first `length` rows of `cache` [B * beam, N, M, H] as each beam sees them: row t of beam j of
    batch entry b comes from beam cache_indirection[b, j, t]."""
    if indirection.dim() != 3:
        raise ValueError(f"{what}: cache_indirection must be (batch_size, beam_width, max_sequence_length), got {list(indirection.shape)}")
    batch, beam, _ = indirection.shape
    if batch * beam != cache.shape[0]:
        raise ValueError(f"{what}: cache_indirection's {batch} x {beam} beams do not match the cache's {cache.shape[0]} rows")
    src = indirection[:, :, :length].to(torch.int64)  # [B, beam, t]
    rows = (torch.arange(batch, device=cache.device).reshape(-1, 1, 1) * beam + src).reshape(batch * beam, length)
    t = torch.arange(length, device=cache.device).reshape(1, -1).expand(batch * beam, -1)
    # [B * beam, t, N, H] gathered per (row, t), back to [B * beam, N, t, H]
    return cache.transpose(1, 2)[rows, t].transpose(1, 2)


class _MultiHeadBase(_FusedBase):
    """Attention on given Q/K/V (no projection weights): MultiHeadAttention, DecoderMaskedMultiHeadAttention."""

    #: the attribute saying past and present share one (B, N, max_sequence_length, H) buffer (None: the
    #: past_sequence_length input alone says so)
    share_attr: str | None = None

    def _heads(
        self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None, bias: torch.Tensor | None, wide: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """Q [B, N, S, H], K [B, N, L, H], V [B, N, L, H_v] with the projection bias added, and whether K/V
        came as (B, N, L, H) (cross attention on keys already in the cache: no bias for them)."""
        n = self.num_heads
        op = self.op_type
        if query.dim() == 5:  # packed QKV (B, S, N, 3, H)
            if key is not None or value is not None:
                raise ValueError(f"{op}: with packed QKV (a 5-D query) key and value must be omitted")
            if query.shape[2] != n or query.shape[3] != 3:
                raise ValueError(f"{op}: packed QKV must be (batch, seq, num_heads={n}, 3, head), got {list(query.shape)}")
            h = query.shape[-1]
            bq, bk, bv = _split_bias(bias, n * h, n * h, wide)
            parts = [_plus(query[:, :, :, i].reshape(query.shape[0], query.shape[1], n * h).to(wide), b) for i, b in enumerate((bq, bk, bv))]
            return _bnsh(parts[0], n, "query"), _bnsh(parts[1], n, "key"), _bnsh(parts[2], n, "value"), False
        if query.dim() != 3:
            raise ValueError(f"{op}: query must be (batch, seq, hidden) or packed (batch, seq, num_heads, 3, head), got {list(query.shape)}")
        hidden = query.shape[2]
        if key is None:
            raise ValueError(f"{op}: key is required unless the query is packed QKV")
        if key.dim() == 5:  # packed KV (B, L, N, 2, H)
            if value is not None:
                raise ValueError(f"{op}: with packed KV (a 5-D key) value must be omitted")
            if key.shape[2] != n or key.shape[3] != 2:
                raise ValueError(f"{op}: packed KV must be (batch, kv_seq, num_heads={n}, 2, head), got {list(key.shape)}")
            h = key.shape[-1]
            bq, bk, bv = _split_bias(bias, hidden, n * h, wide)
            k = _plus(key[:, :, :, 0].reshape(key.shape[0], key.shape[1], n * h).to(wide), bk)
            v = _plus(key[:, :, :, 1].reshape(key.shape[0], key.shape[1], n * h).to(wide), bv)
            return _bnsh(_plus(query.to(wide), bq), n, "query"), _bnsh(k, n, "key"), _bnsh(v, n, "value"), False
        if value is None:
            raise ValueError(f"{op}: value is required with a 3-D or 4-D key")
        if key.dim() == 4:  # K/V already (B, N, L, H): cross attention on a cache
            if value.dim() != 4 or key.shape[1] != n:
                raise ValueError(f"{op}: 4-D key/value must be (batch, num_heads={n}, kv_seq, head), got {list(key.shape)} and {list(value.shape)}")
            bq, _, _ = _split_bias(bias, hidden, n * key.shape[-1], wide)
            return _bnsh(_plus(query.to(wide), bq), n, "query"), key.to(wide), value.to(wide), True
        bq, bk, bv = _split_bias(bias, hidden, key.shape[2], wide)
        return (
            _bnsh(_plus(query.to(wide), bq), n, "query"),
            _bnsh(_plus(key.to(wide), bk), n, "key"),
            _bnsh(_plus(value.to(wide), bv), n, "value"),
            False,
        )

    def _core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_is_cache: bool,
        dtype: torch.dtype,
        mask: torch.Tensor | None,
        attention_bias: torch.Tensor | None,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
        past_sequence_length: torch.Tensor | None,
        cache_indirection: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        """output, present_key, present_value, qk (the scores before softmax) from heads-first Q/K/V."""
        op = self.op_type
        wide = q.dtype
        batch, _, q_len, head = q.shape
        kv_len = k.shape[2]
        if (past_key is None) != (past_value is None):
            raise ValueError(f"{op}: past_key and past_value must be given together")
        share = past_key is not None and (
            bool(self.attr(self.share_attr, 0)) if self.share_attr else past_sequence_length is not None
        )
        past_len = 0
        present_k, present_v = k, v
        if past_key is not None:
            if kv_is_cache:
                raise ValueError(f"{op}: past_key/past_value cannot be combined with 4-D (cross-attention) key/value")
            pk, pv = past_key.to(wide), past_value.to(wide)  # type: ignore[union-attr]
            if share:
                past_len = _int(past_sequence_length, f"{op}: past_sequence_length (past and present share a buffer)")
                if past_len + kv_len > pk.shape[2]:
                    raise ValueError(f"{op}: past_sequence_length {past_len} + {kv_len} new tokens exceed the buffer's {pk.shape[2]} rows")
                present_k, present_v = pk.clone(), pv.clone()
                present_k[:, :, past_len : past_len + kv_len] = k
                present_v[:, :, past_len : past_len + kv_len] = v
                pk, pv = pk[:, :, :past_len], pv[:, :, :past_len]
            else:
                past_len = pk.shape[2]
            if cache_indirection is not None:
                pk = _beam_gather(pk, cache_indirection, past_len, op)
                pv = _beam_gather(pv, cache_indirection, past_len, op)
            k, v = torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)
            if not share:
                present_k, present_v = k, v
        total = k.shape[2]
        bias = _mask_bias(
            mask, batch=batch, q_len=q_len, kv_len=kv_len, total=total, past=past_len,
            filter_value=self.mask_filter_value, dtype=wide, op=op,
        )
        bias = _add(bias, _attention_bias(attention_bias, wide, op, total))
        if self.unidirectional:
            bias = _add(bias, _neg_inf_where(_causal(q_len, total, total - q_len, q.device), wide))
        out, scores, _ = _attend(q, k, v, _scale(self.scale_attr, head), bias)
        return _bsd(out).to(dtype), present_k.to(dtype), present_v.to(dtype), scores.to(dtype)


@kernel("MultiHeadAttention", since=1, domain=MS)
class MultiHeadAttention(_MultiHeadBase):
    """Self or cross attention on projected Q/K/V: separate (B, S, D) inputs, packed KV (B, L, N, 2, H), packed
    QKV (B, S, N, 3, H), or K/V already heads-first (B, N, L, H) (cross attention on a cache); the projection
    `bias` (added to Q, and to K/V unless heads-first), `key_padding_mask` in every form (1-D key lengths,
    2-D, 3-D: `mask_filter_value` added to masked scores), `attention_bias`, past_key/past_value
    concatenated in front (or, with `past_sequence_length`, one (B, N, M, H) buffer written at that row,
    read through `cache_indirection` for beam search), `unidirectional` (causal, bottom-right aligned),
    `scale`; the `qk` output holds the scores before softmax (scaled, with masks and bias)."""

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        past_sequence_length: torch.Tensor | None = None,
        cache_indirection: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, kv_is_cache = self._heads(query, key, value, bias, _wide(query))
        return self._core(
            q, k, v, kv_is_cache, query.dtype, key_padding_mask, attention_bias, past_key, past_value,
            past_sequence_length, cache_indirection,
        )


# -- GroupQueryAttention -----------------------------------------------------------------------------------


#: KV-cache element types GroupQueryAttention quantizes to: torch dtype -> (lowest, highest) of an integer cache
_INT_CACHE = {torch.int8: (-128, 127)}


class _Tokens(NamedTuple):
    """GroupQueryAttention's bookkeeping per batch entry: T, its tokens after the step (seqlens_k + 1); Q, its
    valid query rows; P = T - Q, the tokens cached before; and total_sequence_length."""

    totals: list[int]
    valid: list[int]
    starts: list[int]
    total_len: int


def _rms_norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMS normalization over the head channels (Qwen3's q_norm/k_norm), x [B, N, S, H]."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(x.dtype)


@kernel("GroupQueryAttention", since=1, domain=MS)
class GroupQueryAttention(Kernel):
    """Grouped-query attention over a KV cache (onnxruntime-genai's decoder layers).

    Batch entry b holds T = seqlens_k[b] + 1 tokens after the step; Q = query_seqlens[b] (default min(S, T))
    of the S query rows are valid, so P = T - Q tokens were cached before. present = the past's first P rows,
    then the new key/value rows (all S of them, or with query_seqlens the Q valid ones), zeros beyond, with
    max(past buffer, total_sequence_length) rows. Query row s sits at position P + s: causal (keys up to it,
    and below T), `local_window_size` (that many keys up to it, its own included), rotary at that position (or at
    `position_ids`) with `cos_cache`/`sin_cache` (halves or `rotary_interleaved` pairs, on the first
    2 x cos_cache.shape[1] channels), `softcap`, `attention_bias` (columns = absolute key positions),
    `smooth_softmax` / `head_sink` (an extra logit 0 / per head in the softmax's denominator), `scale`,
    `q_norm_weight`/`k_norm_weight` (per-head RMS norm before rotary), packed QKV, an int8 or float8 cache
    with `k_scale`/`v_scale` (PER_TENSOR or PER_CHANNEL), and the `output_qk` output (`qk_output`: 1 the
    scores before softmax, 2 the probabilities; 0 outside the keys a row attends). With causal=0 a row
    attends the entry's T keys. Query rows beyond Q (padding) attend as the entry's last token (position
    T - 1) does; with query_seqlens they are zeros (the spec leaves them unspecified; both as onnxruntime).
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        op = self.op_type
        self.num_heads = int(self.attr("num_heads", 0))
        self.kv_num_heads = int(self.attr("kv_num_heads", 0))
        if self.num_heads <= 0 or self.kv_num_heads <= 0 or self.num_heads % self.kv_num_heads:
            raise ValueError(f"{op}: num_heads ({self.num_heads}) must be a positive multiple of kv_num_heads ({self.kv_num_heads})")
        self.scale_attr = float(self.attr("scale", 0.0))
        self.softcap = float(self.attr("softcap", 0.0))
        self.do_rotary = bool(self.attr("do_rotary", 0))
        self.interleaved = bool(self.attr("rotary_interleaved", 0))
        self.window = int(self.attr("local_window_size", -1))
        self.smooth = int(self.attr("smooth_softmax", 0)) == 1
        self.causal = int(self.attr("causal", 1))
        if self.causal not in (0, 1):
            raise ValueError(f"{op}: causal must be 0 or 1, got {self.causal}")
        if not self.causal and self.window > 0:
            raise ValueError(f"{op}: local_window_size must be -1 when causal is 0, got {self.window}")
        self.qk_output = int(self.attr("qk_output", 0))
        if self.qk_output not in (0, 1, 2):
            raise ValueError(f"{op}: qk_output must be 0 (none), 1 (before softmax) or 2 (after), got {self.qk_output}")
        eps = float(self.attr("qk_norm_epsilon", 1e-6))
        self.q_eps = float(self.attr("q_norm_epsilon", eps))
        self.k_eps = float(self.attr("k_norm_epsilon", eps))
        self.k_quant = str(self.attr("k_quant_type", "NONE"))
        self.v_quant = str(self.attr("v_quant_type", "NONE"))
        for kind in (self.k_quant, self.v_quant):
            if kind not in ("NONE", "PER_TENSOR", "PER_CHANNEL"):
                raise ValueError(f"{op}: k_quant_type/v_quant_type must be NONE, PER_TENSOR or PER_CHANNEL, got {kind!r}")
        self.bits = int(self.attr("kv_cache_bit_width", 0))
        if self.bits == 4:
            raise UnsupportedVariantError(f"{op}: a 4-bit KV cache (kv_cache_bit_width=4, two values a byte) is not supported; use an 8-bit or float8 cache")
        if int(self.attr("sliding_window_cache", 0)):
            raise UnsupportedVariantError(
                f"{op}: sliding_window_cache=1 (a window-sized cache that evicts internally) is not supported; "
                "give a full-length cache with local_window_size"
            )

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        seqlens_k: torch.Tensor | None = None,
        total_sequence_length: torch.Tensor | None = None,
        cos_cache: torch.Tensor | None = None,
        sin_cache: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        head_sink: torch.Tensor | None = None,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        q_norm_weight: torch.Tensor | None = None,
        k_norm_weight: torch.Tensor | None = None,
        query_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        op = self.op_type
        dtype, wide, device = query.dtype, _wide(query), query.device
        qh, kh, vh = self._heads(query, key, value, wide)
        batch, q_len, head = query.shape[0], query.shape[1], qh.shape[-1]
        tokens = self._tokens(seqlens_k, total_sequence_length, query_seqlens, batch, q_len)
        # the rows the new tokens are written to, and the positions the rows sit at
        position = torch.tensor(tokens.starts, device=device).reshape(-1, 1) + torch.arange(q_len, device=device).reshape(1, -1)
        if (q_norm_weight is None) != (k_norm_weight is None):
            raise ValueError(f"{op}: q_norm_weight and k_norm_weight are given together")
        if q_norm_weight is not None and k_norm_weight is not None:
            qh = _rms_norm_heads(qh, q_norm_weight, self.q_eps)
            kh = _rms_norm_heads(kh, k_norm_weight, self.k_eps)
        if self.do_rotary:
            if cos_cache is None or sin_cache is None:
                raise ValueError(f"{op}: do_rotary needs cos_cache and sin_cache")
            rot_pos = position if position_ids is None else position_ids.to(device=device, dtype=torch.int64).reshape(batch, q_len)
            cos, sin = _rotary_angles(rot_pos, cos_cache, sin_cache, wide, op)
            if 2 * cos.shape[-1] > head:
                raise ValueError(f"{op}: cos_cache's {cos_cache.shape[1]} columns exceed head_size / 2 = {head // 2}")
            qh = _rotate_bnsh(qh, cos, sin, self.interleaved)
            kh = _rotate_bnsh(kh, cos, sin, self.interleaved)
        # what the node stores and reads back: Q as the I/O type holds it, K/V as the cache holds them
        qh = _rounded(qh, dtype)
        cache_type = self._cache_type(past_key, dtype, k_scale, v_scale)
        present_k, present_v = self._present(kh, vh, head, past_key, past_value, k_scale, v_scale, cache_type, tokens, wide, query_seqlens is not None)
        allowed, bias, sink = self._mask(position, tokens.totals, present_k.shape[2], attention_bias, head_sink, wide)
        out, scores, probs = _attend(qh, present_k, present_v, _scale(self.scale_attr, head), bias, softcap=self.softcap, sink=sink)
        if query_seqlens is not None:
            pad = torch.arange(q_len, device=device).reshape(1, 1, -1, 1) >= torch.tensor(tokens.valid, device=device).reshape(-1, 1, 1, 1)
            out = out.masked_fill(pad, 0.0)
        qk = None
        if self.qk_output:
            chosen = scores if self.qk_output == 1 else probs
            qk = chosen.masked_fill(~allowed, 0.0).to(dtype)
        return (
            _bsd(out).to(dtype),
            self._store(present_k, k_scale, cache_type),
            self._store(present_v, v_scale, cache_type),
            qk,
        )

    def _heads(self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K and V as [B, N, S, H] in the compute type, from the three inputs or the packed QKV query."""
        op, n, nk = self.op_type, self.num_heads, self.kv_num_heads
        if query.dim() != 3:
            raise ValueError(f"{op}: query must be (batch, seq, hidden), got {list(query.shape)}")
        batch, q_len, width = query.shape
        if key is None:
            if value is not None:
                raise ValueError(f"{op}: key and value are both given or both omitted (packed QKV)")
            if width % (n + 2 * nk):
                raise ValueError(f"{op}: packed QKV width {width} is not (num_heads + 2 * kv_num_heads) * head_size")
            head = width // (n + 2 * nk)
            q, k, v = query.split([n * head, nk * head, nk * head], dim=-1)
        else:
            if value is None:
                raise ValueError(f"{op}: key and value are both given or both omitted (packed QKV)")
            q, k, v = query, key, value
            if k.shape[:2] != (batch, q_len) or v.shape != k.shape:
                raise ValueError(f"{op}: key {list(k.shape)} and value {list(v.shape)} must be (batch, seq, kv_hidden) like the query's batch and seq")
        return _bnsh(q.to(wide), n, "query"), _bnsh(k.to(wide), nk, "key"), _bnsh(v.to(wide), nk, "value")

    def _tokens(self, seqlens_k: torch.Tensor | None, total_sequence_length: torch.Tensor | None, query_seqlens: torch.Tensor | None, batch: int, q_len: int) -> _Tokens:
        """Each batch entry's tokens after the step, valid query rows and cached tokens, and the total length."""
        op = self.op_type
        if seqlens_k is None or total_sequence_length is None:
            raise ValueError(f"{op}: seqlens_k and total_sequence_length are required")
        totals = [t + 1 for t in _ints(seqlens_k, f"{op}: seqlens_k", batch)]
        if query_seqlens is not None:
            valid = _ints(query_seqlens, f"{op}: query_seqlens", batch)
        else:
            valid = [min(q_len, t) for t in totals]
        starts = [t - c for t, c in zip(totals, valid, strict=True)]
        for b in range(batch):
            if not (0 <= valid[b] <= min(q_len, totals[b])):
                raise ValueError(f"{op}: query_seqlens[{b}] = {valid[b]} must be in [0, min(sequence_length, seqlens_k + 1)] = [0, {min(q_len, totals[b])}]")
        return _Tokens(totals, valid, starts, _int(total_sequence_length, f"{op}: total_sequence_length"))

    def _cache_type(self, past_key: torch.Tensor | None, dtype: torch.dtype, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.dtype:
        """The KV cache's element type (the past's, else the I/O type), with the scales a quantized one needs."""
        op = self.op_type
        cache_type = past_key.dtype if past_key is not None else dtype
        quantized = not cache_type.is_floating_point or cache_type in (torch.float8_e4m3fn,)
        if quantized and (k_scale is None or v_scale is None or self.k_quant == "NONE" or self.v_quant == "NONE"):
            raise ValueError(f"{op}: a {cache_type} KV cache needs k_scale, v_scale and k_quant_type/v_quant_type")
        if not quantized and cache_type != dtype:
            raise ValueError(f"{op}: past_key is {cache_type}, the query {dtype}")
        if quantized and cache_type not in _INT_CACHE and cache_type != torch.float8_e4m3fn:
            raise UnsupportedVariantError(f"{op}: a {cache_type} KV cache is not supported (int8 and float8e4m3fn are)")
        return cache_type

    def _present(
        self,
        kh: torch.Tensor,
        vh: torch.Tensor,
        head: int,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
        cache_type: torch.dtype,
        tokens: _Tokens,
        wide: torch.dtype,
        valid_only: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """present_key/present_value in the compute type: each entry's cached rows, then its new ones (all of
        them, or the valid ones with query_seqlens: `valid_only`) as the cache stores them, zeros beyond; keys of
        the query's `head` size."""
        op, nk = self.op_type, self.kv_num_heads
        batch, q_len = kh.shape[0], kh.shape[2]
        buffer = 0
        past_k = past_v = None
        if past_key is not None and past_value is not None:
            if past_key.shape != past_value.shape or past_key.dim() != 4 or past_key.shape[:2] != (batch, nk):
                raise ValueError(f"{op}: past_key/past_value must both be (batch, kv_num_heads, length, head), got {list(past_key.shape)} and {list(past_value.shape)}")
            buffer = past_key.shape[2]
            past_k = self._read(past_key, k_scale, wide)
            past_v = self._read(past_value, v_scale, wide)
        elif (past_key is None) != (past_value is None):
            raise ValueError(f"{op}: past_key and past_value are given together")
        rows = max(buffer, tokens.total_len)
        present_k = torch.zeros(batch, nk, rows, head, dtype=wide, device=kh.device)
        present_v = torch.zeros(batch, nk, rows, vh.shape[-1], dtype=wide, device=kh.device)
        new_k = self._store_read(kh, k_scale, cache_type, wide)
        new_v = self._store_read(vh, v_scale, cache_type, wide)
        for b in range(batch):
            p = tokens.starts[b]
            if p > buffer:
                raise ValueError(f"{op}: batch entry {b} has {p} cached tokens (seqlens_k + 1 - new), the past holds {buffer} rows")
            if p and past_k is not None and past_v is not None:
                present_k[b, :, :p] = past_k[b, :, :p]
                present_v[b, :, :p] = past_v[b, :, :p]
            count = min(tokens.valid[b] if valid_only else q_len, rows - p)
            present_k[b, :, p : p + count] = new_k[b, :, :count]
            present_v[b, :, p : p + count] = new_v[b, :, :count]
        return present_k, present_v

    def _mask(
        self, position: torch.Tensor, totals: list[int], rows: int, attention_bias: torch.Tensor | None, head_sink: torch.Tensor | None, wide: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Which keys each query row attends (causal, below T, in the window), the additive bias (-inf where it
        does not, plus attention_bias), and the softmax's sink logit (head_sink, or 0 with smooth_softmax)."""
        op, device = self.op_type, position.device
        batch, q_len = position.shape
        j = torch.arange(rows, device=device).reshape(1, 1, 1, -1)
        limit = torch.tensor(totals, device=device).reshape(batch, 1, 1, 1)
        # a padding row (position >= T) attends as the entry's last token does
        pos = torch.minimum(position.reshape(batch, 1, q_len, 1), limit - 1)
        allowed = j < limit
        if self.causal:
            allowed = allowed & (j <= pos)
        if self.window > 0:  # the window holds local_window_size keys, the row's own included
            allowed = allowed & (j > pos - self.window)
        bias = _neg_inf_where(~allowed, wide)
        if attention_bias is not None:
            if attention_bias.dim() != 4 or attention_bias.shape[-1] > rows:
                raise ValueError(f"{op}: attention_bias must be (batch or 1, num_heads or 1, S, total_sequence_length), got {list(attention_bias.shape)}")
            extra = torch.nn.functional.pad(attention_bias.to(wide), (0, rows - attention_bias.shape[-1]))
            bias = bias + extra
        sink = None
        if head_sink is not None:
            sink = head_sink.to(wide).reshape(1, self.num_heads, 1, 1)
        elif self.smooth:
            sink = torch.zeros((), dtype=wide, device=device)
        return allowed, bias, sink

    def _scale_of(self, scale: torch.Tensor | None, wide: torch.dtype) -> torch.Tensor:
        """k_scale/v_scale: [1] (PER_TENSOR) or [1, kv_num_heads, 1, head] (PER_CHANNEL), broadcast to the cache."""
        if scale is None:
            raise ValueError(f"{self.op_type}: a quantized KV cache needs k_scale and v_scale")
        return scale.to(wide)

    def _read(self, cache: torch.Tensor, scale: torch.Tensor | None, wide: torch.dtype) -> torch.Tensor:
        """The cache's values in the compute type (dequantized: value x scale)."""
        if cache.dtype.is_floating_point and cache.dtype != torch.float8_e4m3fn:
            return cache.to(wide)
        return cache.to(wide) * self._scale_of(scale, wide)

    def _store(self, x: torch.Tensor, scale: torch.Tensor | None, cache_type: torch.dtype) -> torch.Tensor:
        """x as the cache holds it: rounded to its float type, or quantized (x / scale, rounded half to
        even and saturated for int8; cast for float8)."""
        if cache_type.is_floating_point and cache_type != torch.float8_e4m3fn:
            return x.to(cache_type)
        scaled = x / self._scale_of(scale, x.dtype)
        if cache_type in _INT_CACHE:
            lo, hi = _INT_CACHE[cache_type]
            return torch.round(scaled).clamp(lo, hi).to(cache_type)
        return scaled.clamp(-448.0, 448.0).to(cache_type)

    def _store_read(self, x: torch.Tensor, scale: torch.Tensor | None, cache_type: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        return self._read(self._store(x, scale, cache_type), scale, wide)


# -- RotaryEmbedding -------------------------------------------------------------------------------------


@kernel("RotaryEmbedding", since=1, domain=MS)
class RotaryEmbedding(Kernel):
    """RoPE on x (batch, seq, hidden) or (batch, heads, seq, head): the first `rotary_embedding_dim` (default:
    the head size) channels of each head rotated as halves or `interleaved` pairs by the cache rows at
    `position_ids` ((batch, seq) positions, or one start position for consecutive tokens). The head size is
    hidden / `num_heads`, or 2 x cos_cache's columns without num_heads. Unlike onnx's RotaryEmbedding
    (opset 23), position_ids is required and may be a single start, the caches are always 2-D, and a 4-D
    input is (batch, heads, seq, head). `scale` only scales caches onnxruntime would regenerate (it never
    does: values unchanged); `is_packed_batching` changes how onnxruntime's CUDA kernel walks the tokens,
    not the values (its CPU kernel ignores it too)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.num_heads = int(self.attr("num_heads", 0))
        self.rotary_dim = int(self.attr("rotary_embedding_dim", 0))
        self.interleaved = bool(self.attr("interleaved", 0))
        if self.rotary_dim > 0 and self.num_heads <= 0:
            raise ValueError(f"{self.op_type}: num_heads must be given with rotary_embedding_dim")

    def run(
        self, x: torch.Tensor, position_ids: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        wide = _wide(x)
        if x.dim() == 4:
            batch, _, seq, head = x.shape
            xh = x.to(wide)
        elif x.dim() == 3:
            batch, seq, hidden = x.shape
            head = hidden // self.num_heads if self.num_heads > 0 else 2 * cos_cache.shape[-1]
            if head <= 0 or hidden % head:
                raise ValueError(f"{op}: head size {head} does not divide the hidden size {hidden}; give num_heads")
            xh = _bnsh(x.to(wide), hidden // head, op)
        else:
            raise ValueError(f"{op}: input must be 3-D (batch, seq, hidden) or 4-D (batch, heads, seq, head), got {list(x.shape)}")
        rot = self.rotary_dim or head
        if rot % 2 or rot > head or cos_cache.shape[-1] < rot // 2:
            raise ValueError(f"{op}: rotary_embedding_dim {rot} must be even, at most the head size {head} and at most 2 x cos_cache's {cos_cache.shape[-1]} columns")
        if position_ids.numel() == 1:
            start = int(position_ids.reshape(()))
            positions = (start + torch.arange(seq, device=x.device)).reshape(1, -1).expand(batch, -1)
        elif tuple(position_ids.shape) == (batch, seq):
            positions = position_ids.to(torch.int64)
        else:
            raise ValueError(f"{op}: position_ids must be one start position or (batch, seq) = ({batch}, {seq}), got {list(position_ids.shape)}")
        cos, sin = _rotary_angles(positions, cos_cache[:, : rot // 2], sin_cache[:, : rot // 2], wide, op)
        out = _rotate_bnsh(xh, cos, sin, self.interleaved)
        if x.dim() == 3:
            out = _bsd(out)
        return (out.to(x.dtype),)


@kernel("DecoderMaskedMultiHeadAttention", since=1, domain=MS)
class DecoderMaskedMultiHeadAttention(_MultiHeadBase):
    """One decoding step of MultiHeadAttention (Whisper/T5/GPT decoders from onnxruntime's beam search):
    query (B, 1, D) or packed QKV (B, 1, D + D + D_v); self attention with key/value (B, 1, D) appended to
    past_key/past_value (with `past_present_share_buffer`: (B, N, M, H) buffers written at
    `past_sequence_length`), or cross attention with key/value (B, N, L, H); `mask_index` (B, T) 0/1 with
    `mask_filter_value`, `attention_bias`, the projection `bias`, `cache_indirection` (beam search: a past
    row read from the beam it came from), `scale`; `output_qk` asks for the `qk` output (the scaled scores
    before softmax)."""

    share_attr = "past_present_share_buffer"

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask_index: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        past_sequence_length: torch.Tensor | None = None,
        beam_width: torch.Tensor | None = None,
        cache_indirection: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        wide = _wide(query)
        if key is None and value is None and query.dim() == 3:  # packed (B, 1, D + D + D_v)
            width = query.shape[2]
            d = past_key.shape[1] * past_key.shape[3] if past_key is not None else width // 3
            query, key, value = query.split([d, d, width - 2 * d], dim=-1)
        q, k, v, kv_is_cache = self._heads(query, key, value, bias, wide)
        if cache_indirection is not None and beam_width is not None and _int(beam_width, "beam_width") != cache_indirection.shape[1]:
            raise ValueError(f"{self.op_type}: beam_width {_int(beam_width, 'beam_width')} differs from cache_indirection's {cache_indirection.shape[1]} beams")
        return self._core(
            q, k, v, kv_is_cache, query.dtype, mask_index, attention_bias, past_key, past_value,
            past_sequence_length, cache_indirection,
        )


# -- SparseAttention --------------------------------------------------------------------------------------


def _block_mask(rows: torch.Tensor, cols: torch.Tensor, op: str) -> torch.Tensor:
    """The dense [layouts, blocks, blocks] boolean block mask of CSR row pointers [layouts, blocks + 1] and
    column indices [layouts, nnz] (right-padded with anything past each layout's row pointer end)."""
    layouts, blocks = rows.shape[0], rows.shape[1] - 1
    dense = torch.zeros(layouts, blocks, blocks, dtype=torch.bool, device=rows.device)
    r, c = rows.to(torch.int64).tolist(), cols.to(torch.int64).tolist()
    for layout in range(layouts):
        for i in range(blocks):
            for idx in range(r[layout][i], r[layout][i + 1]):
                j = c[layout][idx]
                if not 0 <= j < blocks:
                    raise ValueError(f"{op}: block_col_indices[{layout}][{idx}] = {j} is outside the {blocks} blocks")
                dense[layout, i, j] = True
    return dense


@kernel("SparseAttention", since=1, domain=MS)
class SparseAttention(Kernel):
    """Block-sparse causal attention over a shared KV buffer (Phi-3-small): entry b holds T =
    key_total_sequence_lengths[b] tokens after the step, the S new ones written at rows T - S .. T of
    past_key/past_value (the present outputs: the buffers with those rows replaced); query row s at position
    P + s attends key j when j <= P + s, j < T and the block mask of head h's layout (h mod layouts, from the
    CSR block_row_indices/block_col_indices) holds (position // sparse_block_size, j // sparse_block_size).
    Grouped heads (`kv_num_heads`), packed QKV, `do_rotary` with cos_cache/sin_cache (halves or
    `rotary_interleaved` pairs) at the tokens' positions, `scale`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.num_heads = int(self.attr("num_heads", 0))
        self.kv_num_heads = int(self.attr("kv_num_heads", 0))
        if self.num_heads <= 0 or self.kv_num_heads <= 0 or self.num_heads % self.kv_num_heads:
            raise ValueError(f"{self.op_type}: num_heads ({self.num_heads}) must be a positive multiple of kv_num_heads ({self.kv_num_heads})")
        self.block = int(self.attr("sparse_block_size", 0))
        if self.block <= 0:
            raise ValueError(f"{self.op_type}: sparse_block_size is required and must be positive")
        self.scale_attr = float(self.attr("scale", 0.0))
        self.do_rotary = bool(self.attr("do_rotary", 0))
        self.interleaved = bool(self.attr("rotary_interleaved", 0))

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
        block_row_indices: torch.Tensor,
        block_col_indices: torch.Tensor,
        total_sequence_length: torch.Tensor,
        key_total_sequence_lengths: torch.Tensor,
        cos_cache: torch.Tensor | None = None,
        sin_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        n, nk = self.num_heads, self.kv_num_heads
        dtype, wide, device = query.dtype, _wide(query), query.device
        batch, q_len, width = query.shape
        if key is None or value is None:
            if key is not None or value is not None:
                raise ValueError(f"{op}: key and value are both given or both omitted (packed QKV)")
            head = width // (n + 2 * nk)
            q, k, v = query.split([n * head, nk * head, nk * head], dim=-1)
        else:
            head = width // n
            q, k, v = query, key, value
        qh, kh, vh = _bnsh(q.to(wide), n, "query"), _bnsh(k.to(wide), nk, "key"), _bnsh(v.to(wide), nk, "value")
        totals = _ints(key_total_sequence_lengths, f"{op}: key_total_sequence_lengths", batch)
        starts = [t - min(q_len, t) for t in totals]
        if max(totals) > _int(total_sequence_length, f"{op}: total_sequence_length"):
            raise ValueError(f"{op}: key_total_sequence_lengths {totals} exceed total_sequence_length")
        position = torch.tensor(starts, device=device).reshape(-1, 1) + torch.arange(q_len, device=device).reshape(1, -1)
        if self.do_rotary:
            if cos_cache is None or sin_cache is None:
                raise ValueError(f"{op}: do_rotary needs cos_cache and sin_cache")
            cos, sin = _rotary_angles(position, cos_cache, sin_cache, wide, op)
            qh = _rotate_bnsh(qh, cos, sin, self.interleaved)
            kh = _rotate_bnsh(kh, cos, sin, self.interleaved)
        qh, kh, vh = _rounded(qh, dtype), _rounded(kh, dtype), _rounded(vh, dtype)
        rows = past_key.shape[2]
        present_k, present_v = past_key.to(wide).clone(), past_value.to(wide).clone()
        for b in range(batch):
            count = min(q_len, rows - starts[b])
            present_k[b, :, starts[b] : starts[b] + count] = kh[b, :, :count]
            present_v[b, :, starts[b] : starts[b] + count] = vh[b, :, :count]
        dense = _block_mask(block_row_indices, block_col_indices, op)
        layouts, blocks = dense.shape[0], dense.shape[1]
        if n % layouts:
            raise ValueError(f"{op}: num_heads {n} is not a multiple of the {layouts} layouts")
        if blocks * self.block < rows:
            raise ValueError(f"{op}: the block mask's {blocks} blocks of {self.block} cover fewer than the cache's {rows} rows")
        j = torch.arange(rows, device=device)
        limit = torch.tensor(totals, device=device).reshape(batch, 1, 1, 1)
        pos = torch.minimum(position.reshape(batch, 1, q_len, 1), limit - 1)
        allowed = (j.reshape(1, 1, 1, -1) < limit) & (j.reshape(1, 1, 1, -1) <= pos)
        layout = torch.arange(n, device=device) % layouts  # [N]
        # [N, B, S, T]: the layout's block for (query block, key block)
        sparse = dense[layout.reshape(-1, 1, 1, 1), (pos // self.block).reshape(1, batch, q_len, 1), (j // self.block).reshape(1, 1, 1, -1)]
        allowed = allowed & sparse.permute(1, 0, 2, 3)
        out, _, _ = _attend(qh, present_k, present_v, _scale(self.scale_attr, head), _neg_inf_where(~allowed, wide))
        return _bsd(out).to(dtype), present_k.to(dtype), present_v.to(dtype)


# -- QAttention ---------------------------------------------------------------------------------------------


@kernel("QAttention", since=1, domain=MS)
class QAttention(Attention):
    """Attention on a quantized projection (quantize_dynamic of a BERT/GPT-2 Attention): the integer product
    (input - input_zero_point) · (weight - weight_zero_point), exact, scaled by input_scale x weight_scale
    (per tensor or per column), plus the float bias; then Attention's masks (1-D key end positions, or any
    other mask_index form), past/present, `unidirectional`, `scale`, `mask_filter_value` and `do_rotary`."""

    def run(  # type: ignore[override]
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        input_scale: torch.Tensor,
        weight_scale: torch.Tensor,
        mask_index: torch.Tensor | None = None,
        input_zero_point: torch.Tensor | None = None,
        weight_zero_point: torch.Tensor | None = None,
        past: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        dtype = bias.dtype
        wide = _wide(bias)
        if input_scale.numel() != 1:
            raise ValueError(f"{self.op_type}: input_scale must be a scalar (per-tensor quantization), got {list(input_scale.shape)}")
        xq = x.to(torch.int64)
        if input_zero_point is not None:
            xq = xq - input_zero_point.to(torch.int64).reshape(())
        wq = weight.to(torch.int64)
        if weight_zero_point is not None:
            wq = wq - weight_zero_point.to(torch.int64).reshape(-1)
        # float64 holds every integer product and sum of these sizes exactly (|acc| < 2**53)
        acc = torch.matmul(xq.to(torch.float64), wq.to(torch.float64))
        scale = input_scale.to(wide).reshape(()) * weight_scale.to(wide).reshape(-1)
        qkv = acc.to(wide) * scale + bias.to(wide)
        q, k, v = qkv.split(self._sizes(weight), dim=-1)
        return self.attend(q, k, v, dtype, mask_index, past, None, None)


# -- DecoderMaskedSelfAttention (CUDA only in onnxruntime) -------------------------------------------------


def _key_chunk(dtype: torch.dtype) -> int:
    """x of the reordered key cache (B, N, H / x, M, x): 16 bytes of the model's element type."""
    return 16 // dtype.itemsize


def _key_cache_read(buffer: torch.Tensor, x: int) -> torch.Tensor:
    """(B, N, M, H) keys from a buffer whose memory is (B, N, H / x, M, x) (viewed as (B, N, M, H))."""
    b, n, m, h = buffer.shape
    return buffer.reshape(b, n, h // x, m, x).transpose(2, 3).reshape(b, n, m, h)


def _key_cache_write(keys: torch.Tensor, x: int) -> torch.Tensor:
    """The inverse of _key_cache_read: (B, N, M, H) keys laid out as (B, N, H / x, M, x)."""
    b, n, m, h = keys.shape
    return keys.reshape(b, n, m, h // x, x).transpose(2, 3).reshape(b, n, m, h)


@kernel("DecoderMaskedSelfAttention", since=1, domain=MS)
class DecoderMaskedSelfAttention(Attention):
    """One GPT-2 decoding step (onnxruntime's beam search on CUDA): Attention's packed projection of one token,
    past/present (2, B, N, M, H) sharing one buffer written at `past_sequence_length`, its key half laid out
    (B, N, H / x, M, x) with x = 16 bytes of the element type (as the schema says; without
    `past_present_share_buffer`, a plain (2, B, N, P, H) past), `mask_index` (B, T) 0/1 with
    `mask_filter_value`, `attention_bias`, `cache_indirection` for beam search, `scale`, `do_rotary`.
    The float64 oracle refuses the shared buffer: its key layout depends on the model's element size,
    which a kernel computing in float64 does not see."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        if self.share_buffer and ctx.compute_dtype == torch.float64:
            raise UnsupportedVariantError(
                f"{self.op_type}: the shared key cache is reordered in chunks of 16 bytes of the model's element "
                "type, which the float64 oracle does not see; run this node with kernels={...: 'ort'} in the oracle"
            )

    def run(  # type: ignore[override]
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        bias: torch.Tensor,
        mask_index: torch.Tensor | None,
        past: torch.Tensor,
        attention_bias: torch.Tensor | None,
        past_sequence_length: torch.Tensor,
        beam_width: torch.Tensor | None = None,
        cache_indirection: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        if x.dim() != 3 or x.shape[1] != 1:
            raise ValueError(f"{op}: input must be (batch, 1, hidden): one token a step, got {list(x.shape)}")
        wide = _wide(x)
        q, k, v = _projection(x, weights, bias, self._sizes(weights), wide)
        chunk = _key_chunk(x.dtype) if self.share_buffer else 0
        n = self.num_heads
        qh, kh, vh = _bnsh(q, n, "Q"), _bnsh(k, n, "K"), _bnsh(v, n, "V")
        head = qh.shape[-1]
        past_len = _int(past_sequence_length, f"{op}: past_sequence_length") if self.share_buffer else past.shape[3]
        total = past_len + 1
        if self.do_rotary:
            rot = self.rotary_dim or head
            cos, sin = _theta_caches(total, rot, x.device, wide)
            pos = torch.full((x.shape[0], 1), past_len, device=x.device)
            qh = _rotate_bnsh(qh, cos[pos], sin[pos], True)
            kh = _rotate_bnsh(kh, cos[pos], sin[pos], True)
        pk, pv = past[0].to(wide), past[1].to(wide)
        if chunk:
            pk = _key_cache_read(pk, chunk)
        cache_k, cache_v = pk[:, :, :past_len], pv[:, :, :past_len]
        if cache_indirection is not None:
            if beam_width is not None and _int(beam_width, "beam_width") != cache_indirection.shape[1]:
                raise ValueError(f"{op}: beam_width differs from cache_indirection's {cache_indirection.shape[1]} beams")
            cache_k = _beam_gather(cache_k, cache_indirection, past_len, op)
            cache_v = _beam_gather(cache_v, cache_indirection, past_len, op)
        keys, values = torch.cat((cache_k, kh), dim=2), torch.cat((cache_v, vh), dim=2)
        if self.share_buffer:
            pk, pv = pk.clone(), pv.clone()
            pk[:, :, past_len:total] = kh
            pv[:, :, past_len:total] = vh
            present = torch.stack((_key_cache_write(pk, chunk), pv))
        else:
            present = torch.stack((torch.cat((pk, kh), dim=2), torch.cat((pv, vh), dim=2)))
        bias_ = _mask_bias(
            mask_index, batch=x.shape[0], q_len=1, kv_len=1, total=total, past=past_len,
            filter_value=self.mask_filter_value, dtype=wide, op=op,
        )
        bias_ = _add(bias_, _attention_bias(attention_bias, wide, op, total))
        out, _, _ = _attend(qh, keys, values, _scale(self.scale_attr, head), bias_)
        return _bsd(out).to(x.dtype), present.to(x.dtype)


# -- PackedAttention, PackedMultiHeadAttention (CUDA only in onnxruntime) ----------------------------------


def _unpack(tokens: torch.Tensor, token_offset: torch.Tensor, cumulative: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token_count, ...) real tokens -> (B, S, ...) padded (zeros in the padding), the flat padded index of
    each real token, and the [B, 1, 1, S] mask of the keys each sequence holds."""
    if token_offset.dim() != 2:
        raise ValueError(f"{op}: token_offset must be (batch_size, sequence_length), got {list(token_offset.shape)}")
    batch, seq = token_offset.shape
    lengths = (cumulative[1:] - cumulative[:-1]).to(torch.int64)
    if lengths.numel() != batch:
        raise ValueError(f"{op}: cumulative_sequence_length must have batch_size + 1 = {batch + 1} entries, got {cumulative.numel()}")
    count = tokens.shape[0]
    if int(cumulative[-1]) != count:
        raise ValueError(f"{op}: cumulative_sequence_length ends at {int(cumulative[-1])}, the input has {count} tokens")
    where = token_offset.reshape(-1)[:count].to(torch.int64)
    padded = torch.zeros(batch * seq, *tokens.shape[1:], dtype=tokens.dtype, device=tokens.device)
    padded[where] = tokens
    keep = torch.arange(seq, device=tokens.device).reshape(1, -1) < lengths.reshape(-1, 1)
    return padded.reshape(batch, seq, *tokens.shape[1:]), where, keep.reshape(batch, 1, 1, seq)


def _packed_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, where: torch.Tensor,
    attention_bias: torch.Tensor | None, heads: int, scale: float, op: str,
) -> torch.Tensor:
    """Attention of padded (B, S, D) Q/K/V within each sequence, back to the (token_count, D_v) real tokens."""
    qh, kh, vh = _bnsh(q, heads, "query"), _bnsh(k, heads, "key"), _bnsh(v, heads, "value")
    bias = _add(_neg_inf_where(~keep, q.dtype), _attention_bias(attention_bias, q.dtype, op, q.shape[1]))
    out, _, _ = _attend(qh, kh, vh, _scale(scale, qh.shape[-1]), bias)
    return _bsd(out).reshape(-1, out.shape[1] * out.shape[-1])[where]


@kernel("PackedAttention", since=1, domain=MS)
class PackedAttention(Attention):
    """Attention on padding-free input (token_count, D_in): the tokens of sequence b are rows
    cumulative_sequence_length[b] .. [b + 1], token_offset places them in the padded (B, S) grid; each token
    attends its own sequence's tokens; packed projection weights and bias (`qkv_hidden_sizes`),
    `attention_bias` (B or 1, N or 1, S, S) over padded positions, `scale`."""

    def run(  # type: ignore[override]
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        bias: torch.Tensor,
        token_offset: torch.Tensor,
        cumulative_sequence_length: torch.Tensor,
        attention_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if x.dim() != 2:
            raise ValueError(f"{self.op_type}: input must be (token_count, hidden), got {list(x.shape)}")
        q, k, v = _projection(x, weights, bias, self._sizes(weights), _wide(x))
        qkv, where, keep = _unpack(torch.cat((q, k, v), dim=-1), token_offset, cumulative_sequence_length, self.op_type)
        q, k, v = qkv.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        out = _packed_attend(q, k, v, keep, where, attention_bias, self.num_heads, self.scale_attr, self.op_type)
        return (out.to(x.dtype),)


@kernel("PackedMultiHeadAttention", since=1, domain=MS)
class PackedMultiHeadAttention(_FusedBase):
    """MultiHeadAttention on padding-free tokens: query/key/value (token_count, D) or packed QKV
    (token_count, N, 3, H), the projection `bias`, token_offset/cumulative_sequence_length as for
    PackedAttention, `attention_bias`, `scale`. Each token attends its own sequence, so nothing is ever
    masked by value: `mask_filter_value` has no input to act on."""

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        bias: torch.Tensor | None,
        token_offset: torch.Tensor,
        cumulative_sequence_length: torch.Tensor,
        attention_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        op = self.op_type
        wide = _wide(query)
        n = self.num_heads
        if query.dim() == 4:  # packed (token_count, N, 3, H)
            if key is not None or value is not None:
                raise ValueError(f"{op}: with packed QKV (a 4-D query) key and value must be omitted")
            h = query.shape[-1]
            parts = [query[:, :, i].reshape(query.shape[0], n * h).to(wide) for i in range(3)]
        elif key is not None and value is not None:
            parts = [query.to(wide), key.to(wide), value.to(wide)]
        else:
            raise ValueError(f"{op}: give query, key and value (token_count, hidden), or packed QKV (token_count, num_heads, 3, head)")
        for i, b in enumerate(_split_bias(bias, parts[0].shape[-1], parts[1].shape[-1], wide)):
            parts[i] = _plus(parts[i], b)
        qkv, where, keep = _unpack(torch.cat(parts, dim=-1), token_offset, cumulative_sequence_length, op)
        q, k, v = qkv.split([p.shape[-1] for p in parts], dim=-1)
        out = _packed_attend(q, k, v, keep, where, attention_bias, n, self.scale_attr, op)
        return (out.to(query.dtype),)
