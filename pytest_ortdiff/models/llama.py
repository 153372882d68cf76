"""Llama attention and a Llama decoder layer, decomposed into opset-18 ops the way exporters
write them, or with the opset-23 `Attention` / `RotaryEmbedding` / `RMSNormalization` ops (`fused=True`).

Both follow transformers' eager Llama: q/k/v projections, rotary embedding (rotate_half, cos/sin computed
in float32 from the positions, then cast), grouped-query heads (k/v repeated `heads // kv_heads` times),
scores `q @ k^T * head_dim**-0.5`, causal mask (bottom-right aligned when there is a cache), softmax in
float32, output projection. Weights are initializers drawn from `seed`; the twins (`LlamaAttention`,
`LlamaDecoderLayer`) hold them as their state dict.

Inputs: `hidden_states` [batch, seq, hidden] in [-2, 2); with a cache (`past` != 0) also `past_key` and
`past_value` [batch, kv_heads, past, head_dim] in [-1, 1). Outputs: `attn_output` (or `output`) [batch,
seq, hidden], and with a cache `present_key` / `present_value` [batch, kv_heads, past + seq, head_dim].
"""

from __future__ import annotations

import math
from typing import Any

import onnx
import torch

from ..numerics.dtypes import DType, dtype_of
from .feeds import set_feed_range
from .mlp import GraphBuilder, OnnxTwin, check_positive, dim, linear_weight, record_builder, uniform

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaRMSNorm", "LlamaSwiGLU", "llama_attention", "llama_decoder_layer"]

_F32 = onnx.TensorProto.FLOAT
_I64 = onnx.TensorProto.INT64


def _check(hidden: int, heads: int, kv_heads: int, opset: int, fused: bool, seq: Any, past: Any) -> int:
    check_positive(hidden=hidden, heads=heads, kv_heads=kv_heads)
    if hidden % heads:
        raise ValueError(f"heads must divide hidden: hidden={hidden}, heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads (grouped-query attention): heads={heads}, kv_heads={kv_heads}")
    head_dim = hidden // heads
    if head_dim % 2:
        raise ValueError(f"the rotary embedding needs an even head_dim = hidden // heads, got {hidden} // {heads} = {head_dim}")
    if opset < 18:
        raise ValueError(f"the Llama builders need opset >= 18, got opset={opset}")
    if fused and opset < 23:
        raise ValueError(f"fused=True uses Attention, RotaryEmbedding and RMSNormalization, which need opset >= 23; got opset={opset}")
    dim(seq, "seq")
    if past != 0:
        dim(past, "past")
    return head_dim


def _inv_freq(head_dim: int, rope_theta: float) -> torch.Tensor:
    """transformers' default rotary frequencies, float32 [head_dim // 2]."""
    return 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float64) / head_dim)).to(torch.float32)


def _attention_weights(gen: torch.Generator, hidden: int, heads: int, kv_heads: int, prefix: str = "") -> dict[str, torch.Tensor]:
    hd = hidden // heads
    return {
        f"{prefix}w_q": linear_weight(gen, (hidden, heads * hd), hidden),
        f"{prefix}w_k": linear_weight(gen, (hidden, kv_heads * hd), hidden),
        f"{prefix}w_v": linear_weight(gen, (hidden, kv_heads * hd), hidden),
        f"{prefix}w_o": linear_weight(gen, (heads * hd, hidden), heads * hd),
    }


def _attention_state(hidden: int, heads: int, kv_heads: int, rope_theta: float, dtype: Any, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.to(dtype_of(dtype).torch) for k, v in _attention_weights(gen, hidden, heads, kv_heads).items()}
    w["inv_freq"] = _inv_freq(hidden // heads, rope_theta)
    return w


def _decoder_state(hidden: int, heads: int, kv_heads: int, intermediate: int, rope_theta: float, dtype: Any, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = _attention_weights(gen, hidden, heads, kv_heads, "self_attn.")
    w["input_layernorm.weight"] = uniform(gen, (hidden,), 0.5, 1.5)
    w["post_attention_layernorm.weight"] = uniform(gen, (hidden,), 0.5, 1.5)
    w["mlp.w_gate"] = linear_weight(gen, (hidden, intermediate), hidden)
    w["mlp.w_up"] = linear_weight(gen, (hidden, intermediate), hidden)
    w["mlp.w_down"] = linear_weight(gen, (intermediate, hidden), intermediate)
    w = {k: v.to(dtype_of(dtype).torch) for k, v in w.items()}
    w["self_attn.inv_freq"] = _inv_freq(hidden // heads, rope_theta)
    return w


# -- graph pieces -----------------------------------------------------------------------------------


def _scalar_dim(g: GraphBuilder, x: str, axis: int, name: str) -> str:
    """The size of `x` along `axis` as an int64 scalar: Shape(start, end) -> Squeeze."""
    return g.op("Squeeze", g.op("Shape", x, name=f"{name}_shape", start=axis, end=axis + 1), name=name)


def _attention_graph(g: GraphBuilder, x: str, p: str, hidden: int, heads: int, kv_heads: int, fused: bool, has_past: bool) -> tuple[str, str | None, str | None]:
    """Nodes of Llama attention on `x` [b, s, hidden]; weights `{p}w_q`... and `{p}inv_freq` already
    initializers. Returns (output [b, s, hidden], present_key, present_value)."""
    hd = hidden // heads
    dt = g.dtype
    low = dt != DType.FLOAT32  # cos/sin and softmax computed in float32, as transformers does

    # positions: past_len .. past_len + seq - 1
    seq_len = _scalar_dim(g, x, 1, f"{p}seq_len")
    zero, one = g.const(0, _I64, name=f"{p}zero"), g.const(1, _I64, name=f"{p}one")
    if has_past:
        past_len = _scalar_dim(g, "past_key", 2, f"{p}past_len")
        total_len = g.op("Add", past_len, seq_len, name=f"{p}total_len")
        positions = g.op("Range", past_len, total_len, one, name=f"{p}positions")
    else:
        past_len, total_len = zero, seq_len
        positions = g.op("Range", zero, seq_len, one, name=f"{p}positions")

    q = g.op("MatMul", x, f"{p}w_q", name=f"{p}q_proj")
    k = g.op("MatMul", x, f"{p}w_k", name=f"{p}k_proj")
    v = g.op("MatMul", x, f"{p}w_v", name=f"{p}v_proj")

    if fused:
        # RotaryEmbedding with a cos/sin cache over positions 0 .. total-1, indexed by position_ids [b, s]
        all_pos = g.op("Cast", g.op("Range", zero, total_len, one, name=f"{p}cache_positions"), to=_F32, name=f"{p}cache_positions_f")
        freqs = g.op("Mul", g.op("Unsqueeze", all_pos, g.const([1], _I64, name=f"{p}ax1"), name=f"{p}pos_col"), f"{p}inv_freq", name=f"{p}freqs")
        cos = g.op("Cos", freqs, name=f"{p}cos_cache")
        sin = g.op("Sin", freqs, name=f"{p}sin_cache")
        if low:
            cos = g.op("Cast", cos, to=dt.onnx, name=f"{p}cos_cache_cast")
            sin = g.op("Cast", sin, to=dt.onnx, name=f"{p}sin_cache_cast")
        batch = g.op("Shape", x, name=f"{p}batch", start=0, end=1)
        pos_shape = g.op("Concat", batch, g.const([1], _I64, name=f"{p}one_1d"), name=f"{p}position_ids_shape", axis=0)
        position_ids = g.op("Expand", g.op("Unsqueeze", positions, g.const([0], _I64, name=f"{p}ax0"), name=f"{p}pos_row"), pos_shape, name=f"{p}position_ids")
        q = g.op("RotaryEmbedding", q, cos, sin, position_ids, name=f"{p}rope_q", num_heads=heads)
        k = g.op("RotaryEmbedding", k, cos, sin, position_ids, name=f"{p}rope_k", num_heads=kv_heads)
        attrs: dict[str, Any] = {"is_causal": 1, "q_num_heads": heads, "kv_num_heads": kv_heads, "scale": 1.0 / math.sqrt(hd)}
        if low:
            attrs["softmax_precision"] = _F32
        if has_past:
            y, pk, pv = g.op("Attention", q, k, v, "", "past_key", "past_value", name=f"{p}attention", outputs=3, **attrs)
        else:
            y, pk, pv = g.op("Attention", q, k, v, name=f"{p}attention", **attrs), None, None
        return g.op("MatMul", y, f"{p}w_o", name=f"{p}o_proj"), pk, pv

    # cos/sin [s, head_dim], in float32 from the positions, then cast
    pos_f = g.op("Cast", positions, to=_F32, name=f"{p}positions_f")
    freqs = g.op("Mul", g.op("Unsqueeze", pos_f, g.const([1], _I64, name=f"{p}ax1"), name=f"{p}pos_col"), f"{p}inv_freq", name=f"{p}freqs")
    emb = g.op("Concat", freqs, freqs, name=f"{p}emb", axis=-1)
    cos, sin = g.op("Cos", emb, name=f"{p}cos"), g.op("Sin", emb, name=f"{p}sin")
    if low:
        cos = g.op("Cast", cos, to=dt.onnx, name=f"{p}cos_cast")
        sin = g.op("Cast", sin, to=dt.onnx, name=f"{p}sin_cast")

    def heads_first(t: str, n: int, name: str) -> str:  # [b, s, n*hd] -> [b, n, s, hd]
        r = g.op("Reshape", t, g.const([0, 0, n, hd], _I64, name=f"{name}_shape"), name=f"{name}_reshape")
        return g.op("Transpose", r, name=f"{name}_heads", perm=[0, 2, 1, 3])

    start, mid = g.const([0], _I64, name=f"{p}rot_start"), g.const([hd // 2], _I64, name=f"{p}rot_mid")
    end, last = g.const([hd], _I64, name=f"{p}rot_end"), g.const([-1], _I64, name=f"{p}last_axis")

    def rope(t: str, name: str) -> str:  # t * cos + rotate_half(t) * sin
        x1 = g.op("Slice", t, start, mid, last, name=f"{name}_x1")
        x2 = g.op("Slice", t, mid, end, last, name=f"{name}_x2")
        rot = g.op("Concat", g.op("Neg", x2, name=f"{name}_neg"), x1, name=f"{name}_rotate_half", axis=-1)
        return g.op("Add", g.op("Mul", t, cos, name=f"{name}_cos"), g.op("Mul", rot, sin, name=f"{name}_sin"), name=f"{name}_rope")

    q = rope(heads_first(q, heads, f"{p}q"), f"{p}q")
    k = rope(heads_first(k, kv_heads, f"{p}k"), f"{p}k")
    v = heads_first(v, kv_heads, f"{p}v")
    pk = pv = None
    if has_past:
        k = pk = g.op("Concat", "past_key", k, name=f"{p}present_key", axis=2)
        v = pv = g.op("Concat", "past_value", v, name=f"{p}present_value", axis=2)
    n_rep = heads // kv_heads
    if n_rep > 1:  # repeat_kv: [b, kv, t, hd] -> [b, kv, n_rep, t, hd] -> [b, heads, t, hd]
        ax2 = g.const([2], _I64, name=f"{p}ax2")
        rep = g.const([1, 1, n_rep, 1, 1], _I64, name=f"{p}n_rep")
        back = g.const([0, heads, -1, hd], _I64, name=f"{p}kv_shape")
        k = g.op("Reshape", g.op("Expand", g.op("Unsqueeze", k, ax2, name=f"{p}k_unsqueeze"), rep, name=f"{p}k_expand"), back, name=f"{p}k_repeat")
        v = g.op("Reshape", g.op("Expand", g.op("Unsqueeze", v, ax2, name=f"{p}v_unsqueeze"), rep, name=f"{p}v_expand"), back, name=f"{p}v_repeat")

    kt = g.op("Transpose", k, name=f"{p}k_t", perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", q, kt, name=f"{p}qk"), g.const(1.0 / math.sqrt(hd), name=f"{p}scale"), name=f"{p}scores")
    # causal: key position j > query position i (absolute, past included) is masked with -inf
    kpos = g.op("Range", zero, total_len, one, name=f"{p}key_positions") if has_past else positions
    mask = g.op(
        "Greater",
        g.op("Unsqueeze", kpos, g.const([0], _I64, name=f"{p}ax0"), name=f"{p}key_row"),
        g.op("Unsqueeze", positions, g.const([1], _I64, name=f"{p}ax1b"), name=f"{p}query_col"),
        name=f"{p}causal_mask",
    )
    masked = g.op("Where", mask, g.const(float("-inf"), name=f"{p}neg_inf"), scores, name=f"{p}masked_scores")
    if low:
        masked = g.op("Cast", masked, to=_F32, name=f"{p}scores_f32")
    probs = g.op("Softmax", masked, name=f"{p}softmax", axis=-1)
    if low:
        probs = g.op("Cast", probs, to=dt.onnx, name=f"{p}probs_cast")
    ctx = g.op("MatMul", probs, v, name=f"{p}context")
    ctx = g.op("Reshape", g.op("Transpose", ctx, name=f"{p}context_t", perm=[0, 2, 1, 3]), g.const([0, 0, heads * hd], _I64, name=f"{p}merge_shape"), name=f"{p}merge_heads")
    return g.op("MatMul", ctx, f"{p}w_o", name=f"{p}o_proj"), pk, pv


def _rms_norm_graph(g: GraphBuilder, x: str, weight: str, eps: float, fused: bool, name: str) -> str:
    """transformers' LlamaRMSNorm: in float32, x * rsqrt(mean(x^2) + eps), cast back, times weight."""
    if fused:
        return g.op("RMSNormalization", x, weight, name=name, axis=-1, epsilon=eps, stash_type=1)
    low = g.dtype != DType.FLOAT32
    xf = g.op("Cast", x, to=_F32, name=f"{name}_cast") if low else x
    sq = g.op("Pow", xf, g.const(2.0, _F32, name=f"{name}_two"), name=f"{name}_pow")
    var = g.op("ReduceMean", sq, g.const([-1], _I64, name=f"{name}_axes"), name=f"{name}_mean", keepdims=1)
    std = g.op("Sqrt", g.op("Add", var, g.const(eps, _F32, name=f"{name}_eps"), name=f"{name}_add_eps"), name=f"{name}_sqrt")
    normed = g.op("Mul", xf, g.op("Reciprocal", std, name=f"{name}_rsqrt"), name=f"{name}_normalize")
    if low:
        normed = g.op("Cast", normed, to=g.dtype.onnx, name=f"{name}_cast_back")
    return g.op("Mul", normed, weight, name=name)


def _io(g: GraphBuilder, hidden: int, kv_heads: int, hd: int, batch: Any, seq: Any, past: Any) -> tuple[str, bool]:
    x = g.input("hidden_states", [dim(batch, "batch"), seq, hidden])
    if past != 0:
        g.input("past_key", [batch, kv_heads, past, hd])
        g.input("past_value", [batch, kv_heads, past, hd])
    return x, past != 0


def _present_dim(seq: Any, past: Any) -> Any:
    """The cache length after this step: an int when both are fixed, else a symbolic name "past+seq"."""
    if isinstance(seq, int) and isinstance(past, int):
        return seq + past
    return f"{past}+{seq}"


def _finish(model: onnx.ModelProto, has_past: bool) -> None:
    set_feed_range(model, "hidden_states", -2.0, 2.0)
    if has_past:
        set_feed_range(model, "past_key", -1.0, 1.0)
        set_feed_range(model, "past_value", -1.0, 1.0)


# -- builders ---------------------------------------------------------------------------------------


def llama_attention(
    *,
    dtype: Any = "float32",
    opset: int = 18,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    seq: int | str = "seq",
    past: int | str = 0,
    batch: int | str = "batch",
    rope_theta: float = 10000.0,
    fused: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """Llama attention with grouped-query heads (`heads // kv_heads` query heads per k/v head).

    `seq`, `batch`: a name keeps the dim symbolic, an int fixes it. `past`: 0 = no KV cache; a name (e.g.
    "past") or an int adds `past_key` / `past_value` inputs and `present_key` / `present_value` outputs.
    `fused=True` (opset >= 23): `RotaryEmbedding` + `Attention` instead of the decomposition. Twin:
    `LlamaAttention`.
    """
    hd = _check(hidden, heads, kv_heads, opset, fused, seq, past)
    g = GraphBuilder("llama_attention", dtype)
    x, has_past = _io(g, hidden, kv_heads, hd, batch, seq, past)
    for k, v in _attention_state(hidden, heads, kv_heads, rope_theta, dtype, seed).items():
        g.initializer(k, v)
    y, pk, pv = _attention_graph(g, x, "", hidden, heads, kv_heads, fused, has_past)
    g.output(y, "attn_output", [batch, seq, hidden])
    if has_past:
        assert pk is not None and pv is not None
        g.output(pk, "present_key", [batch, kv_heads, _present_dim(seq, past), hd])
        g.output(pv, "present_value", [batch, kv_heads, _present_dim(seq, past), hd])
    model = g.model(opset)
    _finish(model, has_past)
    record_builder(model, "llama_attention", {"dtype": dtype_of(dtype).short, "opset": opset, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "seq": seq, "past": past, "batch": batch, "rope_theta": rope_theta, "fused": fused, "seed": seed})
    return model


_LLAMA_CONSTRAINTS = ("hidden % heads == 0", "heads % kv_heads == 0", "(hidden // heads) % 2 == 0")
llama_attention.dims = {"hidden": (2, 128), "heads": (1, 8), "kv_heads": (1, 8), "past": (0, 16), "batch": (1, 3), "seq": (1, 16)}  # type: ignore[attr-defined]
llama_attention.build_dims = ("hidden", "heads", "kv_heads", "past")  # type: ignore[attr-defined]
llama_attention.constraints = _LLAMA_CONSTRAINTS  # type: ignore[attr-defined]


def llama_decoder_layer(
    *,
    dtype: Any = "float32",
    opset: int = 18,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seq: int | str = "seq",
    past: int | str = 0,
    batch: int | str = "batch",
    rms_eps: float = 1e-6,
    rope_theta: float = 10000.0,
    fused: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """One Llama decoder layer: h = x + attention(RMSNorm(x)); output = h + down(silu(gate(n)) * up(n))
    with n = RMSNorm(h). Same dims and cache as `llama_attention`; `fused=True` (opset >= 23) also uses
    `RMSNormalization`. Twin: `LlamaDecoderLayer`."""
    hd = _check(hidden, heads, kv_heads, opset, fused, seq, past)
    check_positive(intermediate=intermediate)
    g = GraphBuilder("llama_decoder_layer", dtype)
    x, has_past = _io(g, hidden, kv_heads, hd, batch, seq, past)
    for k, v in _decoder_state(hidden, heads, kv_heads, intermediate, rope_theta, dtype, seed).items():
        g.initializer(k, v)
    n1 = _rms_norm_graph(g, x, "input_layernorm.weight", rms_eps, fused, "input_layernorm")
    a, pk, pv = _attention_graph(g, n1, "self_attn.", hidden, heads, kv_heads, fused, has_past)
    h = g.op("Add", x, a, name="residual_attn")
    n2 = _rms_norm_graph(g, h, "post_attention_layernorm.weight", rms_eps, fused, "post_attention_layernorm")
    gate = g.op("MatMul", n2, "mlp.w_gate", name="mlp.gate_proj")
    silu = g.op("Mul", gate, g.op("Sigmoid", gate, name="mlp.sigmoid"), name="mlp.silu")
    up = g.op("MatMul", n2, "mlp.w_up", name="mlp.up_proj")
    down = g.op("MatMul", g.op("Mul", silu, up, name="mlp.gated"), "mlp.w_down", name="mlp.down_proj")
    y = g.op("Add", h, down, name="residual_mlp")
    g.output(y, "output", [batch, seq, hidden])
    if has_past:
        assert pk is not None and pv is not None
        g.output(pk, "present_key", [batch, kv_heads, _present_dim(seq, past), hd])
        g.output(pv, "present_value", [batch, kv_heads, _present_dim(seq, past), hd])
    model = g.model(opset)
    _finish(model, has_past)
    record_builder(model, "llama_decoder_layer", {"dtype": dtype_of(dtype).short, "opset": opset, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "intermediate": intermediate, "seq": seq, "past": past, "batch": batch, "rms_eps": rms_eps, "rope_theta": rope_theta, "fused": fused, "seed": seed})
    return model


llama_decoder_layer.dims = {**llama_attention.dims, "intermediate": (1, 256)}  # type: ignore[attr-defined]
llama_decoder_layer.build_dims = ("hidden", "heads", "kv_heads", "intermediate", "past")  # type: ignore[attr-defined]
llama_decoder_layer.constraints = _LLAMA_CONSTRAINTS  # type: ignore[attr-defined]


# -- eager twins ------------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(OnnxTwin, builder="llama_attention"):
    """Eager twin of `llama_attention` (transformers' eager LlamaAttention with a position-derived
    rotary embedding and causal mask): `forward(hidden_states, past_key=None, past_value=None)`."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2, rope_theta: float = 10000.0, dtype: Any = "float32", seed: int = 0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        state = _attention_state(hidden, heads, kv_heads, rope_theta, dtype, seed)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            setattr(self, name, torch.nn.Parameter(state[name], requires_grad=False))
        self.register_buffer("inv_freq", state["inv_freq"])

    # declared for the type checker: setattr above makes them Parameters, register_buffer a Tensor
    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    inv_freq: torch.Tensor

    def forward(self, hidden_states: torch.Tensor, past_key: torch.Tensor | None = None, past_value: torch.Tensor | None = None) -> Any:
        b, s, _ = hidden_states.shape
        dt, hd = hidden_states.dtype, self.head_dim
        past_len = past_key.shape[2] if past_key is not None else 0
        positions = torch.arange(past_len, past_len + s, device=hidden_states.device)
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)
        q = (hidden_states @ self.w_q).view(b, s, self.heads, hd).transpose(1, 2)
        k = (hidden_states @ self.w_k).view(b, s, self.kv_heads, hd).transpose(1, 2)
        v = (hidden_states @ self.w_v).view(b, s, self.kv_heads, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if past_key is not None and past_value is not None:
            k = torch.cat((past_key, k), dim=2)
            v = torch.cat((past_value, v), dim=2)
        present_key, present_value = k, v
        n_rep = self.heads // self.kv_heads
        if n_rep > 1:
            t = k.shape[2]
            k = k[:, :, None].expand(b, self.kv_heads, n_rep, t, hd).reshape(b, self.heads, t, hd)
            v = v[:, :, None].expand(b, self.kv_heads, n_rep, t, hd).reshape(b, self.heads, t, hd)
        scores = (q @ k.transpose(2, 3)) * torch.tensor(1.0 / math.sqrt(hd), dtype=dt)
        key_positions = torch.arange(k.shape[2], device=hidden_states.device)
        mask = key_positions[None, :] > positions[:, None]
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores.to(torch.float32), dim=-1).to(dt)
        out = (probs @ v).transpose(1, 2).reshape(b, s, self.heads * hd) @ self.w_o
        if past_key is None:
            return out
        return out, present_key, present_value


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm."""

    def __init__(self, hidden: int, eps: float = 1e-6, dtype: Any = "float32") -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=dtype_of(dtype).torch), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class LlamaSwiGLU(torch.nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), weights in MatMul layout."""

    def __init__(self, hidden: int, intermediate: int, dtype: Any = "float32") -> None:
        super().__init__()
        dt = dtype_of(dtype).torch
        self.w_gate = torch.nn.Parameter(torch.zeros(hidden, intermediate, dtype=dt), requires_grad=False)
        self.w_up = torch.nn.Parameter(torch.zeros(hidden, intermediate, dtype=dt), requires_grad=False)
        self.w_down = torch.nn.Parameter(torch.zeros(intermediate, hidden, dtype=dt), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x @ self.w_gate
        return ((gate * torch.sigmoid(gate)) * (x @ self.w_up)) @ self.w_down


class LlamaDecoderLayer(OnnxTwin, builder="llama_decoder_layer"):
    """Eager twin of `llama_decoder_layer`: `forward(hidden_states, past_key=None, past_value=None)`."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 128, rms_eps: float = 1e-6, rope_theta: float = 10000.0, dtype: Any = "float32", seed: int = 0) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(hidden, heads, kv_heads, rope_theta, dtype, seed)
        self.input_layernorm = LlamaRMSNorm(hidden, rms_eps, dtype)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, rms_eps, dtype)
        self.mlp = LlamaSwiGLU(hidden, intermediate, dtype)
        self.load_state_dict(_decoder_state(hidden, heads, kv_heads, intermediate, rope_theta, dtype, seed))

    def forward(self, hidden_states: torch.Tensor, past_key: torch.Tensor | None = None, past_value: torch.Tensor | None = None) -> Any:
        attn = self.self_attn(self.input_layernorm(hidden_states), past_key, past_value)
        a, present = (attn, None) if past_key is None else (attn[0], attn[1:])
        h = hidden_states + a
        out = h + self.mlp(self.post_attention_layernorm(h))
        return out if present is None else (out, *present)
