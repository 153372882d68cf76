"""Transformer-block kernels (ONNX's nn family): Attention (opset 23/25), LinearAttention and RotaryEmbedding.
"""

from __future__ import annotations

import math

import onnx
import torch

from ....numerics.dtypes import DType
from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['Attention', 'Attention25', 'LinearAttention', 'RotaryEmbedding', 'rotate']


_EPSILON_DEFAULT = torch.tensor(1e-5, dtype=torch.float32).item()


def _float_type(ctx: KernelContext, onnx_type: int, what: str) -> torch.dtype:
    """The torch dtype of a precision attribute (float64 in oracle mode), refused if not a float type."""
    try:
        floating = DType(onnx_type).is_floating_point
    except ValueError:
        floating = False
    if not floating:
        raise UnsupportedVariantError(f"{what}={onnx_type}: not a float type")
    return ctx.torch_dtype(onnx_type)


@kernel("RotaryEmbedding", since=23)
class RotaryEmbedding(Kernel):
    """X is [batch, heads, seq, head] or [batch, seq, heads * head] (`num_heads` given); the first
    `rotary_embedding_dim` channels of each head rotate, as halves or as interleaved pairs."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.interleaved = bool(self.attr("interleaved", 0))
        self.rotary_dim = int(self.attr("rotary_embedding_dim", 0))
        self.num_heads = int(self.attr("num_heads", 0))

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if x.dim() == 3:
            if self.num_heads <= 0:
                raise ValueError("RotaryEmbedding of a 3-D input needs the num_heads attribute")
            b, s, hidden = x.shape
            if hidden % self.num_heads:
                raise ValueError(
                    f"RotaryEmbedding: num_heads={self.num_heads} does not divide hidden size {hidden}"
                )
            xh = x.reshape(b, s, self.num_heads, hidden // self.num_heads)
            head_axis = 2  # [batch, seq, heads, head]
        elif x.dim() == 4:
            xh = x
            head_axis = 1  # [batch, heads, seq, head]
        else:
            raise ValueError(f"RotaryEmbedding needs a 3-D or 4-D input, got rank {x.dim()}")
        head = xh.shape[-1]
        rot = self.rotary_dim or head
        if rot % 2 or rot > head:
            raise ValueError(
                f"RotaryEmbedding: rotary_embedding_dim={rot} must be even and at most the head size {head}"
            )
        half = rot // 2
        if position_ids is not None:
            cos, sin = cos[position_ids], sin[position_ids]  # [batch, seq, dim / 2]
        if cos.dim() != 3 or sin.dim() != 3:
            raise ValueError(
                "RotaryEmbedding: cos_cache/sin_cache must be 2-D with position_ids, 3-D without"
            )
        if cos.shape[-1] < half or sin.shape[-1] < half:
            raise ValueError(
                f"RotaryEmbedding: cos_cache/sin_cache have {cos.shape[-1]}/{sin.shape[-1]} columns, fewer than rotary_embedding_dim / 2 = {half}"
            )
        # The function body slices the gathered caches to dim / 2 columns.
        cos = cos[..., :half].unsqueeze(head_axis)
        sin = sin[..., :half].unsqueeze(head_axis)
        return (rotate(xh, cos, sin, rot, self.interleaved).reshape(x.shape),)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, interleaved: bool) -> torch.Tensor:
    """The first `rotary_dim` channels of x's last axis rotated by angles whose cos/sin broadcast to
    [..., rotary_dim / 2], as halves (x1 = first half, x2 = second) or interleaved pairs (x1 = even
    channels, x2 = odd); the other channels pass through. Shared by onnx's and onnxruntime's rotary ops."""
    half = rotary_dim // 2
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        x1, x2 = x_rot[..., :half], x_rot[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = torch.stack((real, imag), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((real, imag), dim=-1)
    return torch.cat((rotated, x_pass), dim=-1)


@kernel("Attention", since=23)
class Attention(Kernel):
    """softmax(softcap(Q√s @ (K√s)ᵀ) + bias) @ V per head, in Q's type (softmax in `softmax_precision`).

    The bias gathers a boolean or additive `attn_mask` (padded to the total length with -inf), the
    bottom-right causal frontier, the `nonpad_kv_seqlen` padding (opset 24) and, from opset 25, the
    sliding window; a query row with no key allowed yields zeros. K/V heads are repeated for
    grouped-query attention; past_key/past_value are concatenated in front of K/V into the present outputs.
    """

    #: opset 25 forbids q_num_heads/kv_num_heads with 4-D inputs and adds left/right_window_size
    opset25 = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.is_causal = bool(self.attr("is_causal", 0))
        q_heads, kv_heads = self.attr("q_num_heads"), self.attr("kv_num_heads")
        self.q_heads = None if q_heads is None else int(q_heads)
        self.kv_heads = None if kv_heads is None else int(kv_heads)
        scale = self.attr("scale")
        self.scale = None if scale is None else float(scale)
        self.softcap = float(self.attr("softcap", 0.0))
        precision = self.attr("softmax_precision")
        self.softmax_dtype = (
            None
            if precision is None
            else _float_type(ctx, int(precision), "Attention softmax_precision")
        )
        self.mode = int(self.attr("qk_matmul_output_mode", 0))
        if self.mode not in (0, 1, 2, 3):
            raise UnsupportedVariantError(
                f"Attention qk_matmul_output_mode={self.mode}: the spec defines modes 0 (QK), 1 (softcapped), "
                "2 (softcapped + bias) and 3 (softmax)"
            )
        self.left = int(self.attr("left_window_size", -1))
        self.right = int(self.attr("right_window_size", -1))
        if self.left < -1 or self.right < -1:
            raise ValueError(
                f"Attention window sizes must be -1 or nonnegative, got left={self.left}, right={self.right}"
            )
        self.want_qk = len(node.output) > 3 and bool(node.output[3])

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        nonpad_kv_seqlen: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if (past_key is None) != (past_value is None):
            raise ValueError("Attention: past_key and past_value must be given together")
        if nonpad_kv_seqlen is not None and past_key is not None:
            raise ValueError(
                "Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value"
            )
        rank = q.dim()
        if rank not in (3, 4) or k.dim() != rank or v.dim() != rank:
            raise ValueError(
                f"Attention needs Q, K, V all 3-D or all 4-D, got ranks {q.dim()}, {k.dim()}, {v.dim()}"
            )
        if rank == 3:
            if self.q_heads is None or self.kv_heads is None:
                raise ValueError(
                    "Attention with 3-D Q/K/V needs the q_num_heads and kv_num_heads attributes"
                )
            q = _heads_first(q, self.q_heads, "Q")
            k = _heads_first(k, self.kv_heads, "K")
            v = _heads_first(v, self.kv_heads, "V")
        elif self.opset25 and (self.q_heads is not None or self.kv_heads is not None):
            raise ValueError(
                "Attention (opset 25): q_num_heads and kv_num_heads must not be set for 4-D inputs"
            )
        dtype = q.dtype
        if past_key is not None:
            k = torch.cat((past_key, k), dim=2)
            v = torch.cat((past_value, v), dim=2)  # type: ignore[arg-type]
        present_key, present_value = k, v
        batch, q_heads, q_len, head = q.shape
        kv_heads, total = k.shape[1], k.shape[2]
        if v.shape[1] != kv_heads:
            raise ValueError(f"Attention: K has {kv_heads} heads, V has {v.shape[1]}")
        if q_heads != kv_heads:
            if q_heads % kv_heads:
                raise ValueError(
                    f"Attention: kv heads ({kv_heads}) must divide q heads ({q_heads})"
                )
            # each kv head serves q_heads // kv_heads consecutive q heads: [h0, h0, h1, h1, ...]
            k = k.repeat_interleave(q_heads // kv_heads, dim=1)
            v = v.repeat_interleave(q_heads // kv_heads, dim=1)

        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(head)
        # Q and K are each scaled by sqrt(scale), rounded to Q's type, as the function body does.
        root = torch.tensor(math.sqrt(scale), dtype=dtype, device=q.device)
        qk = torch.matmul(q * root, (k * root).transpose(-1, -2))
        raw = qk
        if self.softcap > 0:
            cap = torch.tensor(self.softcap, dtype=dtype, device=q.device)
            qk = torch.tanh(qk / cap) * cap
        capped = qk

        past_len = past_key.shape[2] if past_key is not None else 0
        bias = self._bias(
            attn_mask, nonpad_kv_seqlen, batch, q_len, total, past_len, dtype, q.device
        )
        if bias is not None:
            qk = qk + bias

        scores = qk if self.softmax_dtype is None else qk.to(self.softmax_dtype)
        probs = _softmax(scores)
        if bias is not None:
            # A row whose bias is all -inf attends nothing: zeros, decided on the bias, not the (maybe NaN) scores.
            empty = torch.isneginf(bias.amax(dim=-1, keepdim=True))
            probs = torch.where(
                empty, torch.zeros((), dtype=probs.dtype, device=probs.device), probs
            )
        probs = probs.to(dtype)

        common = torch.promote_types(dtype, v.dtype)
        y = torch.matmul(probs.to(common), v.to(common)).to(dtype)
        if rank == 3:
            y = y.transpose(1, 2).reshape(batch, q_len, -1)
        outputs: tuple[torch.Tensor, ...] = (y, present_key, present_value)
        if self.want_qk:
            outputs += ((raw, capped, qk, probs)[self.mode],)
        return outputs

    def _bias(
        self,
        attn_mask: torch.Tensor | None,
        nonpad: torch.Tensor | None,
        batch: int,
        q_len: int,
        total: int,
        past_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor | None:
        """The additive bias broadcastable to [batch, heads, q_len, total], or None when nothing is masked."""
        neg_inf = torch.tensor(float("-inf"), dtype=dtype, device=device)
        zero = torch.zeros((), dtype=dtype, device=device)
        bias = None
        if attn_mask is not None:
            pad = total - attn_mask.shape[-1]
            if pad < 0:
                raise ValueError(
                    f"Attention: attn_mask's last dim ({attn_mask.shape[-1]}) exceeds the total sequence length {total}"
                )
            if attn_mask.dtype == torch.bool:
                bias = torch.where(attn_mask, zero, neg_inf)
            else:
                bias = attn_mask.to(dtype)
            if pad:
                # the keys beyond a short mask are disallowed
                bias = torch.nn.functional.pad(bias, (0, pad), value=float("-inf"))

        # Structural constraints, as one boolean "allowed" over [q_len, total] or [batch, 1, q_len, total].
        allowed = None
        i = torch.arange(q_len, device=device).reshape(q_len, 1)
        j = torch.arange(total, device=device).reshape(1, total)
        offset: int | torch.Tensor
        if nonpad is not None:  # an external cache (never with past_key): per-batch offsets
            offset = (nonpad.to(device=device, dtype=torch.int64).reshape(-1) - q_len).reshape(
                -1, 1, 1, 1
            )
        else:
            offset = past_len
        position = i + offset  # absolute position of each query: bottom-right aligned
        if self.is_causal:
            allowed = j <= position
        if self.left >= 0:
            allowed = _and(allowed, position - j <= self.left)
        if self.right >= 0:
            allowed = _and(allowed, j - position <= self.right)
        if nonpad is not None:
            valid = j < nonpad.to(device=device, dtype=torch.int64).reshape(-1, 1, 1, 1)
            allowed = _and(allowed, valid)
        if allowed is not None:
            structural = torch.where(allowed, zero, neg_inf)
            bias = structural if bias is None else bias + structural
        return bias


@kernel("Attention", since=25)
class Attention25(Attention):
    """Opset 25: the sliding window (`left_window_size`, `right_window_size`), composed with the rest of the bias."""

    opset25 = True


def _and(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a & b


def _heads_first(t: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """[batch, seq, heads * head] -> [batch, heads, seq, head]."""
    b, s, hidden = t.shape
    if heads <= 0 or hidden % heads:
        raise ValueError(f"Attention: {heads} heads do not divide {what}'s hidden size {hidden}")
    return t.reshape(b, s, heads, hidden // heads).transpose(1, 2)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis in x's type, each step rounded to it; an all -inf row gives zeros, not NaN.

    A bfloat16 denominator is summed in bfloat16, one key after the other: "softmax in bfloat16" taken
    literally, and what onnx.reference (numpy reducing with ml_dtypes' bfloat16 add) computes. torch
    would accumulate in float32 and land an ulp of bfloat16 away, beyond the ONNX suite's tolerance.
    (numpy sums float16 in float32, as torch does, so float16 needs nothing special.)
    """
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros((), dtype=x.dtype, device=x.device), m)
    e = torch.exp(x - m)
    if x.dtype == torch.bfloat16:
        s = e[..., :1]
        for t in range(1, e.shape[-1]):
            s = s + e[..., t : t + 1]
    else:
        s = e.sum(dim=-1, keepdim=True)
    s = torch.where(s == 0, torch.ones((), dtype=x.dtype, device=x.device), s)
    return e / s


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _heads(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """[B, T, H*D] -> [B, H, T, D]."""
    if x.dim() != 3:
        raise ValueError(f"LinearAttention: {what} must be [B, T, H*D]; got shape {list(x.shape)}")
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"LinearAttention: {what}'s last dim {hd} is not a multiple of {heads} heads")
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


@kernel("LinearAttention", since=27)
class LinearAttention(Kernel):
    """The recurrence of linear attention run token by token (the spec's definition; `chunk_size` is a
    tuning hint with no effect on values), in float32 (float64 in oracle mode), GQA by head groups."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.rule = str(self.attr("update_rule", "gated_delta"))
        if self.rule not in _UPDATE_RULES:
            raise UnsupportedVariantError(f"LinearAttention with update_rule={self.rule!r}: the spec defines {', '.join(_UPDATE_RULES)}")
        self.q_heads = int(self.attr("q_num_heads", 0))
        self.kv_heads = int(self.attr("kv_num_heads", 0))
        if self.q_heads <= 0 or self.kv_heads <= 0 or self.q_heads % self.kv_heads:
            raise ValueError(f"LinearAttention: q_num_heads ({self.q_heads}) must be a positive multiple of kv_num_heads ({self.kv_heads})")
        self.scale = float(self.attr("scale", 0.0))
        self.gated = self.rule in ("gated", "gated_delta")
        self.delta = self.rule in ("delta", "gated_delta")

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        past_state: torch.Tensor | None = None,
        decay: torch.Tensor | None = None,
        beta: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if self.gated != (decay is not None):
            raise ValueError(f"LinearAttention: update_rule {self.rule!r} {'needs' if self.gated else 'forbids'} the decay input")
        if self.delta != (beta is not None):
            raise ValueError(f"LinearAttention: update_rule {self.rule!r} {'needs' if self.delta else 'forbids'} the beta input")
        wide = torch.float64 if query.dtype == torch.float64 else torch.float32
        q = _heads(query, self.q_heads, "query").to(wide)
        k = _heads(key, self.kv_heads, "key").to(wide)
        v = _heads(value, self.kv_heads, "value").to(wide)
        b, _, t, d_k = q.shape
        d_v = v.shape[-1]
        g = None
        if decay is not None:
            if decay.shape[-1] == self.kv_heads:
                g = decay.reshape(b, t, self.kv_heads, 1).transpose(1, 2).to(wide)
            else:
                g = _heads(decay, self.kv_heads, "decay").to(wide)  # [B, H, T, d_k]
        bt = None
        if beta is not None:
            bt = beta.reshape(b, t, beta.shape[-1], 1).transpose(1, 2).to(wide)
        if past_state is not None:
            if tuple(past_state.shape) != (b, self.kv_heads, d_k, d_v):
                raise ValueError(f"LinearAttention: past_state {list(past_state.shape)} is not [{b}, {self.kv_heads}, {d_k}, {d_v}]")
            state = past_state.to(wide)
            state_dtype = past_state.dtype
        else:
            state = torch.zeros(b, self.kv_heads, d_k, d_v, dtype=wide, device=q.device)
            state_dtype = query.dtype
        scale = self.scale if self.scale else 1.0 / math.sqrt(d_k)
        group = self.q_heads // self.kv_heads
        outs = []
        for i in range(t):  # the recurrence: each token's state depends on the previous one
            k_t, v_t = k[:, :, i], v[:, :, i]
            if g is not None:
                state = state * torch.exp(g[:, :, i]).unsqueeze(-1)
            if bt is not None:
                retrieved = torch.einsum("bhdm,bhd->bhm", state, k_t)
                v_t = bt[:, :, i] * (v_t - retrieved)
            state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            read = state if group == 1 else state.repeat_interleave(group, dim=1)
            outs.append(scale * torch.einsum("bhd,bhdm->bhm", q[:, :, i], read))
        out = torch.stack(outs, dim=2) if outs else q.new_zeros(b, self.q_heads, 0, d_v)
        y = out.transpose(1, 2).reshape(b, t, self.q_heads * d_v)
        return (y.to(query.dtype), state.to(state_dtype))
