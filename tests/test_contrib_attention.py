"""onnxruntime's attention contrib ops where onnxruntime cannot check them here (CUDA-only ops and variants,
bfloat16, the GroupQueryAttention inputs its CPU kernel refuses): the torch kernels, in float64 (the oracle),
float32 and bfloat16, against an independent float64 numpy reference of what each op means, written with
explicit loops over batch, head and query from the operator's documentation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from onnx import helper

from pytest_ortdiff.conformance.contrib_cases import ContribCase
from pytest_ortdiff.conformance.contrib_cases.attention import CASES
from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError

#: (rtol, atol) of our kernel against the float64 reference, per dtype
TOL = {"float64": (1e-9, 1e-10), "float32": (2e-5, 2e-6), "float16": (4e-3, 2e-3), "bfloat16": (3e-2, 2e-2)}


def _case(name: str) -> ContribCase:
    return next(c for c in CASES if c.name == name)


def _feeds(case: ContribCase) -> tuple[Any, dict[str, np.ndarray], dict[str, torch.Tensor]]:
    model, feeds = case.build()
    return model, {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in feeds.items()}, feeds


def _ours(model: Any, feeds: dict[str, torch.Tensor], dtype: str | None = None) -> list[np.ndarray]:
    compute = "float64" if dtype == "float64" else None
    outs = TorchEvaluator(model, compute_dtype=compute).run(None, feeds)
    return [o.double().numpy() if o.is_floating_point() else o.numpy() for o in outs]


def _attrs(model: Any) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, allowed: Any, bias: Any = None) -> np.ndarray:
    """out[b, n, s] = sum over allowed keys t of softmax_t(scale q·k_t + bias) v_t, one query at a time;
    allowed(b, n, s, t) -> bool, bias(b, n, s, t) -> float (K/V heads repeated for grouped heads)."""
    batch, heads, seq, _ = q.shape
    group = heads // k.shape[1]
    out = np.zeros((batch, heads, seq, v.shape[-1]))
    for b in range(batch):
        for n in range(heads):
            kn = n // group
            for s in range(seq):
                keys = [t for t in range(k.shape[2]) if allowed(b, n, s, t)]
                scores = np.array([scale * q[b, n, s] @ k[b, kn, t] + (bias(b, n, s, t) if bias else 0.0) for t in keys])
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[b, n, s] = sum(pi * v[b, kn, t] for pi, t in zip(p, keys, strict=True))
    return out


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _merge(x: np.ndarray) -> np.ndarray:
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _rope_pairs(x: np.ndarray, pos: int, dim: int) -> np.ndarray:
    """GPT-J RoPE (consecutive pairs, base 10000) on the first `dim` channels of x [..., H] at `pos`."""
    y = x.copy()
    for i in range(dim // 2):
        theta = pos / 10000 ** (2 * i / dim)
        c, s = math.cos(theta), math.sin(theta)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        y[..., 2 * i], y[..., 2 * i + 1] = a * c - b * s, b * c + a * s
    return y


def _check(ours: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol)


def _dtypes(name: str) -> list[tuple[str, str]]:
    """(case name, dtype to run ours in) for a case's float32 build: the oracle and float32."""
    return [(name, "float64"), (name, "float32")]


# -- Attention: the CUDA-only variants -------------------------------------------------------------------------


def _attention_ref(f: dict[str, np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    n = a["num_heads"]
    qkv = f["input"] @ f["weights"] + f.get("bias", 0.0)
    sizes = a.get("qkv_hidden_sizes", [qkv.shape[-1] // 3] * 3)
    q, k, v = (_heads(t, n) for t in np.split(qkv, np.cumsum(sizes)[:2], axis=-1))
    seq = q.shape[2]
    past = f.get("past")
    share = bool(a.get("past_present_share_buffer", 0))
    p = int(f["past_sequence_length"][0]) if share else (past.shape[3] if past is not None else 0)
    if a.get("do_rotary"):
        dim = int(a.get("rotary_embedding_dim", q.shape[-1]))
        for s in range(seq):
            q[:, :, s] = _rope_pairs(q[:, :, s], p + s, dim)
            k[:, :, s] = _rope_pairs(k[:, :, s], p + s, dim)
    present = None
    if past is not None:
        if share:
            pk, pv = past[0].copy(), past[1].copy()
            pk[:, :, p : p + seq], pv[:, :, p : p + seq] = k, v
            present = np.stack((pk, pv))
            k, v = pk[:, :, : p + seq], pv[:, :, : p + seq]
        else:
            k, v = np.concatenate((past[0], k), axis=2), np.concatenate((past[1], v), axis=2)
            present = np.stack((k, v))
    mask = f.get("mask_index")
    fill = a.get("mask_filter_value", -10000.0)

    def bias(b: int, n_: int, s: int, t: int) -> float:
        if mask is None:
            return 0.0
        return 0.0 if mask[b, 0, p + s, t] else fill  # the 4-D Megatron mask over absolute positions

    def allowed(b: int, n_: int, s: int, t: int) -> bool:
        return not a.get("unidirectional") or t <= p + s

    out = _merge(_attend(q, k, v, a.get("scale", 1 / math.sqrt(q.shape[-1])), allowed, bias))
    return [out] if present is None else [out, present]


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        *_dtypes("Attention-share-buffer[float32]"),
        *_dtypes("Attention-rotary[float32]"),
        *_dtypes("Attention-rotary-dim-past[float32]"),
        *_dtypes("Attention-mask-4d-megatron[float32]"),
    ],
)
def test_attention_cuda_variants_match_reference(name: str, dtype: str) -> None:
    model, f, feeds = _feeds(_case(name))
    ours = _ours(model, feeds, dtype)
    for o, r in zip(ours, _attention_ref(f, _attrs(model)), strict=True):
        _check(o, r, dtype)


def test_attention_4d_mask_filter_value_is_added_not_substituted() -> None:
    """A masked score is scale·q·k + mask_filter_value: with a small filter the masked key still counts."""
    model, f, feeds = _feeds(_case("Attention-mask-4d-megatron[float32]"))
    attrs = _attrs(model)
    model.graph.node[0].attribute.append(helper.make_attribute("mask_filter_value", -1.0))
    ours = _ours(model, feeds, "float64")
    _check(ours[0], _attention_ref(f, {**attrs, "mask_filter_value": -1.0})[0], "float64")
    assert not np.allclose(ours[0], _attention_ref(f, attrs)[0], atol=1e-3)


# -- MultiHeadAttention: packed forms (CUDA only) ----------------------------------------------------------


def _mha_ref(f: dict[str, np.ndarray], a: dict[str, Any]) -> np.ndarray:
    n = a["num_heads"]
    query = f["query"]
    if query.ndim == 5:  # (B, S, N, 3, H)
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    else:
        q = _heads(query, n)
        k, v = (f["key"][:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))  # (B, L, N, 2, H)
    if "bias" in f:
        hq, hk = q.shape[-1], k.shape[-1]
        bq, bk, bv = f["bias"][: n * hq], f["bias"][n * hq : n * (hq + hk)], f["bias"][n * (hq + hk) :]
        q, k, v = q + bq.reshape(n, 1, -1), k + bk.reshape(n, 1, -1), v + bv.reshape(n, 1, -1)
    return _merge(_attend(q, k, v, a.get("scale", 1 / math.sqrt(q.shape[-1])), lambda *_: True))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [*_dtypes("MultiHeadAttention-packed-kv[float32]"), *_dtypes("MultiHeadAttention-packed-qkv[float32]")],
)
def test_mha_packed_forms_match_reference(name: str, dtype: str) -> None:
    model, f, feeds = _feeds(_case(name))
    _check(_ours(model, feeds, dtype)[0], _mha_ref(f, _attrs(model)), dtype)


# -- bfloat16 (CUDA only in onnxruntime) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["MultiHeadAttention-basic[bfloat16]", "MultiHeadAttention-past[bfloat16]", "GroupQueryAttention-decode[bfloat16]",
     "GroupQueryAttention-prompt[bfloat16]", "RotaryEmbedding-3d[bfloat16]", "RotaryEmbedding-4d-interleaved[bfloat16]"],
)
def test_bfloat16_matches_float64_within_its_rounding(name: str) -> None:
    """bfloat16 computed in float32 and rounded once: within bfloat16's rounding of the float64 oracle on
    the same (bfloat16) inputs."""
    model, _, feeds = _feeds(_case(name))
    ours = _ours(model, feeds)
    oracle = _ours(model, feeds, "float64")
    for o, r in zip(ours, oracle, strict=True):
        # one bfloat16 rounding of the result (2^-8 relative), at the outputs' scale
        np.testing.assert_allclose(o, r, rtol=2**-8, atol=2**-8 * float(np.abs(r).max()))


# -- GroupQueryAttention: what onnxruntime's CPU kernel refuses -------------------------------------------


def _gqa_model(inputs: dict[str, torch.Tensor | None], **attrs: Any) -> Any:
    from pytest_ortdiff.conformance.contrib_cases.attention import _one_node

    outs = {"output": ("float32", 3), "present_key": (str(inputs["past_key"].dtype).removeprefix("torch."), 4), "present_value": (str(inputs["past_key"].dtype).removeprefix("torch."), 4)}  # type: ignore[union-attr]
    return _one_node("GroupQueryAttention", inputs, outs, attrs)


def _gqa_inputs(seed: int = 0, cache: torch.dtype = torch.float32) -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    inputs: dict[str, torch.Tensor | None] = dict.fromkeys(
        ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache",
         "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight")
    )
    inputs.update(
        query=torch.randn(2, 1, 4 * 8, generator=g), key=torch.randn(2, 1, 2 * 8, generator=g), value=torch.randn(2, 1, 2 * 8, generator=g),
        past_key=torch.randn(2, 2, 4, 8, generator=g).to(cache), past_value=torch.randn(2, 2, 4, 8, generator=g).to(cache),
        seqlens_k=torch.tensor([4, 2], dtype=torch.int32), total_sequence_length=torch.tensor(5, dtype=torch.int32),
    )
    return inputs


def _gqa_ref(f: dict[str, torch.Tensor | None], k_past: np.ndarray, v_past: np.ndarray, q_w: Any = None, k_w: Any = None, eps: float = 1e-6, cache_round: Any = None) -> np.ndarray:
    """Decode step (S = 1) of GroupQueryAttention with 4 query heads on 2 KV heads, T = seqlens_k + 1."""
    q = _heads(f["query"].double().numpy(), 4)  # type: ignore[union-attr]
    k = _heads(f["key"].double().numpy(), 2)  # type: ignore[union-attr]
    v = _heads(f["value"].double().numpy(), 2)  # type: ignore[union-attr]
    if q_w is not None:
        q = q / np.sqrt((q**2).mean(-1, keepdims=True) + eps) * q_w
        k = k / np.sqrt((k**2).mean(-1, keepdims=True) + eps) * k_w
    if cache_round is not None:
        k, v = cache_round(k), cache_round(v)
    totals = [int(t) + 1 for t in f["seqlens_k"]]  # type: ignore[union-attr]
    keys = np.zeros((2, 2, 5, 8))
    values = np.zeros((2, 2, 5, 8))
    for b, t in enumerate(totals):
        keys[b, :, : t - 1], values[b, :, : t - 1] = k_past[b, :, : t - 1], v_past[b, :, : t - 1]
        keys[b, :, t - 1], values[b, :, t - 1] = k[b, :, 0], v[b, :, 0]
    return _merge(_attend(q, keys, values, 1 / math.sqrt(8), lambda b, n, s, j: j < totals[b]))


def test_gqa_qk_norm_weights_match_reference() -> None:
    """q_norm_weight/k_norm_weight (CUDA and WebGPU in onnxruntime): per-head RMS norm of Q and K before the
    cache, with qk_norm_epsilon."""
    inputs = _gqa_inputs()
    g = torch.Generator().manual_seed(1)
    inputs["q_norm_weight"], inputs["k_norm_weight"] = torch.rand(8, generator=g) + 0.5, torch.rand(8, generator=g) + 0.5
    model = _gqa_model(inputs, num_heads=4, kv_num_heads=2, qk_norm_epsilon=1e-3)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    ref = _gqa_ref(inputs, inputs["past_key"].double().numpy(), inputs["past_value"].double().numpy(),  # type: ignore[union-attr]
                   inputs["q_norm_weight"].double().numpy(), inputs["k_norm_weight"].double().numpy(), eps=1e-3)
    _check(_ours(model, feeds, "float64")[0], ref, "float64")
    _check(_ours(model, feeds)[0], ref, "float32")


def test_gqa_float8_cache_matches_reference() -> None:
    """A float8e4m3fn cache: the past read as value x scale, the new token stored as float8(k / scale) and
    read back the same way."""
    inputs = _gqa_inputs(cache=torch.float8_e4m3fn)
    inputs["k_scale"], inputs["v_scale"] = torch.tensor([0.5]), torch.tensor([0.25])
    model = _gqa_model(inputs, num_heads=4, kv_num_heads=2, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR")
    feeds = {k: v for k, v in inputs.items() if v is not None}
    k_past = inputs["past_key"].double().numpy() * 0.5  # type: ignore[union-attr]
    v_past = inputs["past_value"].double().numpy() * 0.25  # type: ignore[union-attr]

    def round_k(x: np.ndarray) -> np.ndarray:
        return torch.from_numpy(x / 0.5).to(torch.float8_e4m3fn).double().numpy() * 0.5

    def round_v(x: np.ndarray) -> np.ndarray:
        return torch.from_numpy(x / 0.25).to(torch.float8_e4m3fn).double().numpy() * 0.25

    q = _heads(inputs["query"].double().numpy(), 4)  # type: ignore[union-attr]
    k = round_k(_heads(inputs["key"].double().numpy(), 2))  # type: ignore[union-attr]
    v = round_v(_heads(inputs["value"].double().numpy(), 2))  # type: ignore[union-attr]
    totals = [5, 3]
    keys, values = np.zeros((2, 2, 5, 8)), np.zeros((2, 2, 5, 8))
    for b, t in enumerate(totals):
        keys[b, :, : t - 1], values[b, :, : t - 1] = k_past[b, :, : t - 1], v_past[b, :, : t - 1]
        keys[b, :, t - 1], values[b, :, t - 1] = k[b, :, 0], v[b, :, 0]
    ref = _merge(_attend(q, keys, values, 1 / math.sqrt(8), lambda b, n, s, j: j < totals[b]))
    out, present_k, _ = TorchEvaluator(model).run(None, feeds)
    _check(out.double().numpy(), ref, "float32")
    assert present_k.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(present_k[0, :, 4].double().numpy() * 0.5, k[0, :, 0])


@pytest.mark.parametrize(
    ("attrs", "words"),
    [({"kv_cache_bit_width": 4, "k_quant_type": "PER_TENSOR", "v_quant_type": "PER_TENSOR"}, "4-bit"),
     ({"sliding_window_cache": 1, "local_window_size": 2}, "sliding_window_cache")],
)
def test_gqa_refuses_by_name_what_it_does_not_compute(attrs: dict[str, Any], words: str) -> None:
    inputs = _gqa_inputs()
    model = _gqa_model(inputs, num_heads=4, kv_num_heads=2, **attrs)
    with pytest.raises(UnsupportedVariantError, match=words):
        TorchEvaluator(model)


# -- DecoderMaskedSelfAttention, DecoderMaskedMultiHeadAttention packed, PackedAttention, PackedMultiHeadAttention


def _dmsa_ref(f: dict[str, np.ndarray], a: dict[str, Any], x_chunk: int) -> list[np.ndarray]:
    """One step: keys of the shared buffer live at memory (B, N, H / x, M, x) of past[0]; beams read their
    past rows through cache_indirection."""
    n = a["num_heads"]
    qkv = f["input"] @ f["weights"] + f["bias"]
    q, k, v = (_heads(t, n) for t in np.split(qkv, 3, axis=-1))
    p = int(f["past_sequence_length"][0])
    if a.get("do_rotary"):
        q[:, :, 0], k[:, :, 0] = _rope_pairs(q[:, :, 0], p, q.shape[-1]), _rope_pairs(k[:, :, 0], p, q.shape[-1])
    rows, heads, m, h = f["past"].shape[1:]
    raw = f["past"][0].reshape(rows, heads, h // x_chunk, m, x_chunk)
    key_cache = np.zeros((rows, heads, m, h))
    for t in range(m):
        for c in range(h):
            key_cache[:, :, t, c] = raw[:, :, c // x_chunk, t, c % x_chunk]
    value_cache = f["past"][1]
    indir = f.get("cache_indirection")
    beams = indir.shape[1] if indir is not None else 1
    keys = np.zeros((rows, heads, p + 1, h))
    values = np.zeros((rows, heads, p + 1, h))
    for r in range(rows):
        for t in range(p):
            src = (r // beams) * beams + int(indir[r // beams, r % beams, t]) if indir is not None else r
            keys[r, :, t], values[r, :, t] = key_cache[src, :, t], value_cache[src, :, t]
        keys[r, :, p], values[r, :, p] = k[r, :, 0], v[r, :, 0]
    mask = f.get("mask_index")
    fill = a.get("mask_filter_value", -10000.0)
    out = _attend(q, keys, values, a.get("scale", 1 / math.sqrt(h)), lambda *_: True,
                  (lambda b, n_, s, t: 0.0 if mask[b, t] else fill) if mask is not None else None)
    key_cache[:, :, p], value_new = k[:, :, 0], value_cache.copy()
    value_new[:, :, p] = v[:, :, 0]
    back = np.zeros_like(raw)
    for t in range(m):
        for c in range(h):
            back[:, :, c // x_chunk, t, c % x_chunk] = key_cache[:, :, t, c]
    return [_merge(out), np.stack((back.reshape(rows, heads, m, h), value_new))]


@pytest.mark.parametrize(
    "name",
    ["DecoderMaskedSelfAttention-step[float32]", "DecoderMaskedSelfAttention-mask-scale[float32]",
     "DecoderMaskedSelfAttention-beam-search[float32]", "DecoderMaskedSelfAttention-rotary[float32]",
     "DecoderMaskedSelfAttention-step[float16]"],
)
def test_decoder_masked_self_attention_matches_reference(name: str) -> None:
    case = _case(name)
    model, f, feeds = _feeds(case)
    ours = _ours(model, feeds)
    for o, r in zip(ours, _dmsa_ref(f, _attrs(model), 16 // np.dtype(case.dtype).itemsize), strict=True):
        _check(o, r, case.dtype)
    with pytest.raises(UnsupportedVariantError, match="float64 oracle"):
        TorchEvaluator(model, compute_dtype="float64")


def test_decoder_masked_mha_packed_qkv_matches_reference() -> None:
    """Packed QKV (B, 1, D + D + D_v) with a bias, the plain shared buffer of onnxruntime's CPU kernel."""
    case = _case("DecoderMaskedMultiHeadAttention-self[float32]")
    _, f, feeds = _feeds(case)
    packed = torch.cat((feeds["query"], feeds["key"], feeds["value"]), dim=-1)
    g = torch.Generator().manual_seed(9)
    bias = torch.randn(packed.shape[-1], generator=g)
    from pytest_ortdiff.conformance.contrib_cases.attention import _one_node

    inputs: dict[str, Any] = {"query": packed, "key": None, "value": None, "mask_index": None, "attention_bias": None,
                              "past_key": feeds["past_key"], "past_value": feeds["past_value"],
                              "past_sequence_length": feeds["past_sequence_length"], "beam_width": None, "cache_indirection": None, "bias": bias}
    packed_model = _one_node("DecoderMaskedMultiHeadAttention", inputs, {"output": ("float32", 3), "present_key": ("float32", 4), "present_value": ("float32", 4)},
                             {"num_heads": 2, "past_present_share_buffer": 1})
    ours = _ours(packed_model, {k: v for k, v in inputs.items() if v is not None}, "float64")
    q, k, v = (_heads(t, 2) for t in np.split(packed.double().numpy() + bias.double().numpy(), 3, axis=-1))
    p = int(f["past_sequence_length"][0])
    keys = np.concatenate((f["past_key"][:, :, :p], k), axis=2)
    values = np.concatenate((f["past_value"][:, :, :p], v), axis=2)
    _check(ours[0], _merge(_attend(q, keys, values, 1 / math.sqrt(16), lambda *_: True)), "float64")
    np.testing.assert_allclose(ours[1][:, :, p], k[:, :, 0])
    np.testing.assert_array_equal(ours[1][:, :, p + 1 :], f["past_key"][:, :, p + 1 :])


def _packed_ref(f: dict[str, np.ndarray], a: dict[str, Any], op: str) -> np.ndarray:
    n = a["num_heads"]
    if op == "PackedAttention":
        q, k, v = np.split(f["input"] @ f["weights"] + f["bias"], 3, axis=-1)
    elif f["query"].ndim == 4:  # (token_count, N, 3, H)
        q, k, v = (f["query"][:, :, i].reshape(f["query"].shape[0], -1) for i in range(3))
    else:
        q, k, v = f["query"], f["key"], f["value"]
    if op != "PackedAttention" and "bias" in f:
        q, k, v = q + f["bias"][: q.shape[1]], k + f["bias"][q.shape[1] : 2 * q.shape[1]], v + f["bias"][2 * q.shape[1] :]
    cum = f["cumulative_sequence_length"]
    seq = f["token_offset"].shape[1]
    out = np.zeros_like(q)
    h = q.shape[1] // n
    ab = f.get("attention_bias")
    for b in range(len(cum) - 1):
        rows = range(int(cum[b]), int(cum[b + 1]))
        for i, r in enumerate(rows):
            for head in range(n):
                sl = slice(head * h, (head + 1) * h)
                scores = np.array([a.get("scale", 1 / math.sqrt(h)) * q[r, sl] @ k[t, sl] + (ab[0, head, i, j] if ab is not None else 0.0) for j, t in enumerate(rows)])
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[r, sl] = sum(pj * v[t, sl] for pj, t in zip(p, rows, strict=True))
    assert seq >= max(int(cum[b + 1] - cum[b]) for b in range(len(cum) - 1))
    return out


@pytest.mark.parametrize(
    ("name", "dtype"),
    [*_dtypes("PackedAttention-basic[float32]"), *_dtypes("PackedAttention-attention-bias[float32]"),
     *_dtypes("PackedMultiHeadAttention-separate[float32]"), *_dtypes("PackedMultiHeadAttention-packed-qkv-bias[float32]")],
)
def test_packed_attention_matches_reference(name: str, dtype: str) -> None:
    case = _case(name)
    model, f, feeds = _feeds(case)
    _check(_ours(model, feeds, dtype)[0], _packed_ref(f, _attrs(model), case.op.split("::")[1]), dtype)


# -- QAttention with an int8 input (CUDA only in onnxruntime) ----------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_qattention_int8_input_matches_reference(dtype: str) -> None:
    model, f, feeds = _feeds(_case("QAttention-int8-input[float32]"))
    x = f["input"].astype(np.float64) - f["input_zero_point"].astype(np.float64)
    w = f["weight"].astype(np.float64) - f["weight_zero_point"].astype(np.float64)
    qkv = (x @ w) * (f["input_scale"] * f["weight_scale"]) + f["bias"]
    q, k, v = (_heads(t, 2) for t in np.split(qkv, 3, axis=-1))
    ref = _merge(_attend(q, k, v, 1 / math.sqrt(8), lambda *_: True))
    _check(_ours(model, feeds, dtype)[0], ref, dtype)


# -- refusals name the problem and the fix -------------------------------------------------------------------


def test_mask_forms_onnxruntime_reserves_for_cuda_are_refused_by_name() -> None:
    case = _case("Attention-mask-1d-end[float32]")
    model, _, feeds = _feeds(case)
    feeds["mask_index"] = torch.tensor([3, 1, 0, 0, 3, 3, 4, 4], dtype=torch.int32)  # 3 * batch + 2
    model.graph.input[3].type.tensor_type.shape.dim[0].dim_value = 8
    with pytest.raises(RuntimeError, match=r"3 \* batch_size \+ 2") as info:
        TorchEvaluator(model).run(None, feeds)
    assert isinstance(info.value.__cause__, UnsupportedVariantError)
