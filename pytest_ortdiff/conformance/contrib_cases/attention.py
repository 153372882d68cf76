"""Conformance cases for onnxruntime's attention contrib ops (see pytest_ortdiff.contrib_cases).

Each case is one node on small random inputs (seeded), in float32 and float16 on the CPU provider; bfloat16
and the CUDA-only ops (DecoderMaskedSelfAttention, PackedAttention, PackedMultiHeadAttention) run on CUDA,
and are checked on the CPU against a float64 numpy reference in tests/test_contrib_attention.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from . import ContribCase

__all__ = ["CASES"]

MS = "com.microsoft"

#: torch dtype name -> onnx element type, for the types these cases feed
_ONNX_TYPE = {
    "float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "float16": 10, "float64": 11, "bfloat16": 16,
    "float8_e4m3fn": 17,
}

Feeds = dict[str, Any]


def _one_node(op: str, inputs: Mapping[str, Any], outputs: Mapping[str, tuple[str, int] | None], attrs: Mapping[str, Any]) -> Any:
    """The one-node com.microsoft model: graph inputs typed after `inputs` (None: an omitted optional
    input), outputs name -> (element type, rank) with symbolic dims (None: an output not asked for)."""
    import onnx
    from onnx import helper

    names = list(inputs)
    while names and inputs[names[-1]] is None:
        names.pop()
    out_names = list(outputs)
    while out_names and outputs[out_names[-1]] is None:
        out_names.pop()
    node = helper.make_node(
        op, [n if inputs[n] is not None else "" for n in names], [n if outputs[n] is not None else "" for n in out_names], domain=MS, **attrs
    )
    graph_inputs = [
        helper.make_tensor_value_info(n, _ONNX_TYPE[str(t.dtype).removeprefix("torch.")], list(t.shape))
        for n, t in inputs.items()
        if t is not None
    ]
    graph_outputs = [
        helper.make_tensor_value_info(n, _ONNX_TYPE[spec[0]], [f"{n}_d{i}" for i in range(spec[1])])
        for n, spec in outputs.items()
        if spec is not None
    ]
    graph = helper.make_graph([node], f"{op}_case", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _randn(gen: Any, *shape: int, dtype: str, scale: float = 1.0) -> Any:
    import torch

    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(getattr(torch, dtype))


def _ints(values: Any, dtype: str = "int32") -> Any:
    import torch

    return torch.tensor(values, dtype=getattr(torch, dtype))


def _gen(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


Outputs = dict[str, tuple[str, int] | None]
Builder = Callable[[str], tuple[dict[str, Any], Outputs, dict[str, Any]]]


def _build(op: str, make: Builder, dtype: str) -> tuple[Any, Feeds]:
    inputs, outputs, attrs = make(dtype)
    model = _one_node(op, inputs, outputs, attrs)
    return model, {k: v for k, v in inputs.items() if v is not None}


CASES: list[ContribCase] = []

#: float32 ULPs allowed between ours and onnxruntime: an attention output is a sum of products that cancel,
#: both sides land within ~4 ulps of the float64 oracle (measured), so up to twice that apart
_F32_ULP = 8.0


def _case(
    name: str,
    op: str,
    make: Builder,
    dtypes: tuple[str, ...] = ("float32", "float16"),
    **kw: Any,
) -> None:
    """Register `make` as one case per dtype: `name[dtype]`, built lazily."""
    for dtype in dtypes:
        # onnxruntime's CPU provider has no bfloat16 attention: those cases run on CUDA
        providers = kw.get("providers") or (("CUDA",) if dtype == "bfloat16" else ("CPU",))
        rest = {k: v for k, v in kw.items() if k != "providers"}
        if dtype == "float32" and op != "RotaryEmbedding":
            rest.setdefault("max_ulp", _F32_ULP)
        CASES.append(
            ContribCase(
                f"{op}-{name}[{dtype}]",
                f"{MS}::{op}",
                dtype,
                functools.partial(_build, op, make, dtype),
                providers=providers,
                **rest,
            )
        )


# -- Attention ------------------------------------------------------------------------------------------


def _attention(
    *,
    batch: int = 2,
    seq: int = 3,
    hidden_in: int = 16,
    heads: int = 2,
    sizes: tuple[int, int, int] = (16, 16, 16),
    bias: bool = True,
    mask: Callable[[Any], Any] | None = None,
    past: int = 0,
    share: int = 0,
    attn_bias: tuple[int, int] | None = None,
    present: bool = False,
    seed: int = 0,
    **attrs: Any,
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        head = sizes[0] // heads
        total = past + seq
        inputs: dict[str, Any] = {
            "input": _randn(g, batch, seq, hidden_in, dtype=dtype),
            "weights": _randn(g, hidden_in, sum(sizes), dtype=dtype, scale=0.3),
            "bias": _randn(g, sum(sizes), dtype=dtype, scale=0.2) if bias else None,
            "mask_index": mask(g) if mask is not None else None,
            "past": None,
            "attention_bias": None,
            "past_sequence_length": None,
        }
        if past or share:
            rows = share or past
            inputs["past"] = _randn(g, 2, batch, heads, rows, head, dtype=dtype)
        if share:
            inputs["past_sequence_length"] = _ints([past])
        if attn_bias is not None:
            inputs["attention_bias"] = _randn(g, attn_bias[0], attn_bias[1], seq, total, dtype=dtype)
        outputs: Outputs = {"output": (dtype, 3)}
        if present or past or share:
            outputs["present"] = (dtype, 5)
        a = {"num_heads": heads, **attrs}
        if sizes[0] != sizes[2] or len(set(sizes)) > 1:
            a["qkv_hidden_sizes"] = list(sizes)
        if share:
            a["past_present_share_buffer"] = 1
        return inputs, outputs, a

    return make


_case("basic", "Attention", _attention())
_case("no-bias-scale", "Attention", _attention(bias=False, scale=0.3), min_onnxruntime="1.32", before="crashes (a segmentation fault) running an Attention without bias")
_case("qkv-hidden-sizes", "Attention", _attention(sizes=(16, 16, 8), hidden_in=12))
_case("mask-1d-end", "Attention", _attention(mask=lambda g: _ints([3, 1])))
_case("mask-1d-end-start", "Attention", _attention(mask=lambda g: _ints([3, 2, 0, 1])))
_case("mask-2d", "Attention", _attention(mask=lambda g: _ints([[1, 1, 0], [0, 1, 1]])))
_case("mask-3d", "Attention", _attention(mask=lambda g: _ints([[[1, 0, 1], [1, 1, 0], [0, 1, 1]], [[1, 1, 1], [0, 0, 1], [1, 0, 0]]])))
_case("mask-filter-value", "Attention", _attention(mask=lambda g: _ints([[1, 1, 0], [0, 1, 1]]), mask_filter_value=-3.0))
_case("unidirectional", "Attention", _attention(unidirectional=1, present=True))
_case("past-unidirectional", "Attention", _attention(past=4, unidirectional=1))
_case("past-decode-mask", "Attention", _attention(past=4, seq=1, unidirectional=1, mask=lambda g: _ints([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])))
_case("share-buffer", "Attention", _attention(past=3, share=6, seq=1, unidirectional=1), providers=("CUDA",))
_case("attention-bias", "Attention", _attention(attn_bias=(2, 2)))
_case("attention-bias-broadcast", "Attention", _attention(attn_bias=(1, 1), mask=lambda g: _ints([3, 2]), unidirectional=1))
# CUDA only: onnxruntime's CPU Attention has no do_rotary, no 4-D mask and no shared past/present buffer
_case("rotary", "Attention", _attention(do_rotary=1, hidden_in=16, sizes=(32, 32, 32), unidirectional=1), providers=("CUDA",))
_case("rotary-dim-past", "Attention", _attention(do_rotary=1, rotary_embedding_dim=32, sizes=(128, 128, 128), past=2, unidirectional=1), providers=("CUDA",))
_case("mask-4d-megatron", "Attention", _attention(past=2, unidirectional=0, mask=lambda g: _ints([[[[1 if j <= i else 0 for j in range(6)] for i in range(6)]]] * 2)), providers=("CUDA",))


# -- MultiHeadAttention ------------------------------------------------------------------------------------


def _mha(
    *,
    batch: int = 2,
    seq: int = 3,
    kv_seq: int | None = None,
    heads: int = 2,
    head: int = 8,
    v_head: int | None = None,
    form: str = "separate",
    bias: bool = False,
    mask: Callable[[Any], Any] | None = None,
    attn_bias: tuple[int, int] | None = None,
    past: int = 0,
    share: int = 0,
    beams: int = 0,
    present: bool = False,
    qk: bool = False,
    seed: int = 1,
    **attrs: Any,
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        L = seq if kv_seq is None else kv_seq
        hv = head if v_head is None else v_head
        d, dv = heads * head, heads * hv
        rows = batch * max(beams, 1)
        inputs: dict[str, Any] = dict.fromkeys(
            ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value", "past_sequence_length", "cache_indirection")
        )
        if form == "packed_qkv":
            inputs["query"] = _randn(g, rows, seq, heads, 3, head, dtype=dtype)
        elif form == "packed_kv":
            inputs["query"] = _randn(g, rows, seq, d, dtype=dtype)
            inputs["key"] = _randn(g, rows, L, heads, 2, head, dtype=dtype)
        elif form == "bnsh_kv":
            inputs["query"] = _randn(g, rows, seq, d, dtype=dtype)
            inputs["key"] = _randn(g, rows, heads, L, head, dtype=dtype)
            inputs["value"] = _randn(g, rows, heads, L, hv, dtype=dtype)
        else:
            inputs["query"] = _randn(g, rows, seq, d, dtype=dtype)
            inputs["key"] = _randn(g, rows, L, d, dtype=dtype)
            inputs["value"] = _randn(g, rows, L, dv, dtype=dtype)
        if bias:
            inputs["bias"] = _randn(g, 2 * d + dv, dtype=dtype, scale=0.5)
        if mask is not None:
            inputs["key_padding_mask"] = mask(g)
        total = past + L
        if attn_bias is not None:
            inputs["attention_bias"] = _randn(g, attn_bias[0], attn_bias[1], seq, total, dtype=dtype)
        if past or share:
            m = share or past
            inputs["past_key"] = _randn(g, rows, heads, m, head, dtype=dtype)
            inputs["past_value"] = _randn(g, rows, heads, m, hv, dtype=dtype)
        if share:
            inputs["past_sequence_length"] = _ints([past])
        if beams:
            inputs["cache_indirection"] = torch_randint(g, beams, (batch, beams, share or past + L))
        with_present = present or past or share
        outputs: Outputs = {
            "output": (dtype, 3),
            "present_key": (dtype, 4) if with_present else None,
            "present_value": (dtype, 4) if with_present else None,
            "qk": (dtype, 4) if qk else None,
        }
        return inputs, outputs, {"num_heads": heads, **attrs}

    return make


def torch_randint(gen: Any, high: int, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.randint(0, high, shape, generator=gen, dtype=torch.int32)


_case("basic", "MultiHeadAttention", _mha())
_case("bias-scale", "MultiHeadAttention", _mha(bias=True, scale=0.2))
_case("cross", "MultiHeadAttention", _mha(kv_seq=5, v_head=4, bias=True))
_case("packed-kv", "MultiHeadAttention", _mha(form="packed_kv", kv_seq=4, bias=True), providers=("CUDA",))
_case("packed-qkv", "MultiHeadAttention", _mha(form="packed_qkv", bias=True), providers=("CUDA",))
_case("bnsh-kv", "MultiHeadAttention", _mha(form="bnsh_kv", kv_seq=5, bias=True, present=True))
_case("mask-1d", "MultiHeadAttention", _mha(kv_seq=4, mask=lambda g: _ints([2, 4])))
_case("mask-2d", "MultiHeadAttention", _mha(kv_seq=4, mask=lambda g: _ints([[1, 0, 1, 1], [0, 1, 1, 0]])))
_case("mask-3d", "MultiHeadAttention", _mha(seq=2, kv_seq=3, mask=lambda g: _ints([[[1, 0, 1], [0, 1, 1]], [[1, 1, 0], [0, 0, 1]]])))
_case("mask-filter-value", "MultiHeadAttention", _mha(kv_seq=4, mask=lambda g: _ints([[1, 0, 1, 1], [0, 1, 1, 0]]), mask_filter_value=-2.5))
_case("attention-bias", "MultiHeadAttention", _mha(kv_seq=4, attn_bias=(2, 2)))
_case("attention-bias-broadcast", "MultiHeadAttention", _mha(kv_seq=4, attn_bias=(1, 2), mask=lambda g: _ints([3, 4])))
_case("past", "MultiHeadAttention", _mha(past=4, bias=True))
_case("past-unidirectional", "MultiHeadAttention", _mha(past=4, unidirectional=1, attn_bias=(2, 1)))
_case("unidirectional", "MultiHeadAttention", _mha(unidirectional=1))
_case("qk", "MultiHeadAttention", _mha(kv_seq=4, qk=True, past=2, mask=lambda g: _ints([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1]])))
_case("qk-no-present", "MultiHeadAttention", _mha(kv_seq=4, qk=True, attn_bias=(1, 2)))
_case("share-buffer", "MultiHeadAttention", _mha(seq=1, past=3, share=6, bias=True))
_case("beam-search", "MultiHeadAttention", _mha(seq=1, past=3, share=6, beams=2, batch=1, bias=True))


# -- GroupQueryAttention -----------------------------------------------------------------------------------


def _rope_caches(rows: int, half: int, dtype: str) -> tuple[Any, Any]:
    import torch

    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(rows, dtype=torch.float64).reshape(-1, 1) * inv
    return torch.cos(angles).to(getattr(torch, dtype)), torch.sin(angles).to(getattr(torch, dtype))


def _gqa(
    *,
    seq: int = 1,
    heads: int = 4,
    kv_heads: int = 2,
    head: int = 16,
    buffer: int = 0,
    seqlens: tuple[int, ...] = (5, 3),
    total: int | None = None,
    packed: bool = False,
    rotary: int = 0,
    position_ids: bool = False,
    attn_bias: tuple[int, int] | None = None,
    head_sink: bool = False,
    query_seqlens: tuple[int, ...] | None = None,
    quant: str = "",
    qk: bool = False,
    past: bool = True,
    seed: int = 2,
    **attrs: Any,
) -> Builder:
    """GroupQueryAttention on `seq` new tokens per entry; entry b holds seqlens[b] tokens after the step
    (seqlens_k = seqlens - 1); the past is a `buffer`-row cache (0: no past input)."""

    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        import torch

        g = _gen(seed)
        batch = len(seqlens)
        t = total if total is not None else max(max(seqlens), buffer if buffer else 0)
        inputs: dict[str, Any] = dict.fromkeys(
            ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache",
             "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens")
        )
        if packed:
            inputs["query"] = _randn(g, batch, seq, (heads + 2 * kv_heads) * head, dtype=dtype)
        else:
            inputs["query"] = _randn(g, batch, seq, heads * head, dtype=dtype)
            inputs["key"] = _randn(g, batch, seq, kv_heads * head, dtype=dtype)
            inputs["value"] = _randn(g, batch, seq, kv_heads * head, dtype=dtype)
        cache = dtype
        if past:
            if quant == "int8":
                inputs["past_key"] = torch.randint(-100, 100, (batch, kv_heads, buffer, head), generator=g, dtype=torch.int8)
                inputs["past_value"] = torch.randint(-100, 100, (batch, kv_heads, buffer, head), generator=g, dtype=torch.int8)
                inputs["k_scale"] = torch.tensor([0.02], dtype=torch.float32)
                inputs["v_scale"] = torch.tensor([0.03], dtype=torch.float32)
                cache = "int8"
            else:
                inputs["past_key"] = _randn(g, batch, kv_heads, buffer, head, dtype=dtype)
                inputs["past_value"] = _randn(g, batch, kv_heads, buffer, head, dtype=dtype)
        inputs["seqlens_k"] = _ints([s - 1 for s in seqlens])
        inputs["total_sequence_length"] = _ints(t)
        if rotary:
            rows = max(t, buffer) + 2
            inputs["cos_cache"], inputs["sin_cache"] = _rope_caches(rows, rotary // 2, dtype)
            if position_ids:
                inputs["position_ids"] = torch.randint(0, rows, (batch, seq), generator=g, dtype=torch.int64)
        if attn_bias is not None:
            inputs["attention_bias"] = _randn(g, attn_bias[0], attn_bias[1], seq, t, dtype=dtype)
        if head_sink:
            inputs["head_sink"] = _randn(g, heads, dtype=dtype)
        if query_seqlens is not None:
            inputs["query_seqlens"] = _ints(list(query_seqlens))
        a = {"num_heads": heads, "kv_num_heads": kv_heads, **attrs}
        if rotary:
            a["do_rotary"] = 1
        if quant:
            a.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
        if qk:
            a.setdefault("qk_output", 1)
        outputs: Outputs = {
            "output": (dtype, 3),
            "present_key": (cache, 4),
            "present_value": (cache, 4),
            "output_qk": (dtype, 4) if qk else None,
        }
        return inputs, outputs, a

    return make


_case("decode", "GroupQueryAttention", _gqa(buffer=4))
_case("decode-static-cache", "GroupQueryAttention", _gqa(buffer=8, total=8, seqlens=(6, 3)))
_case("prompt", "GroupQueryAttention", _gqa(seq=4, buffer=0, seqlens=(4, 4)))
_case("prompt-ragged", "GroupQueryAttention", _gqa(seq=4, buffer=0, seqlens=(4, 2), qk=True))
_case("prompt-no-past", "GroupQueryAttention", _gqa(seq=4, seqlens=(4, 3), past=False))
_case("continue-chunk", "GroupQueryAttention", _gqa(seq=3, buffer=8, total=8, seqlens=(7,)))
_case("packed-qkv", "GroupQueryAttention", _gqa(packed=True, buffer=4))
_case("mqa-scale", "GroupQueryAttention", _gqa(heads=4, kv_heads=1, buffer=4, scale=0.1))
_case("rotary", "GroupQueryAttention", _gqa(buffer=4, rotary=16))
_case("rotary-interleaved-partial", "GroupQueryAttention", _gqa(head=32, buffer=4, rotary=16, rotary_interleaved=1))
_case("rotary-prompt", "GroupQueryAttention", _gqa(seq=4, buffer=0, seqlens=(4, 3), rotary=16, packed=True))
_case("rotary-position-ids", "GroupQueryAttention", _gqa(buffer=4, rotary=16, position_ids=True))
# no padding rows here: with a local window onnxruntime's float32 prompt path places them at P + s, its
# float16 path (and its output_qk path) at the last token T - 1 (as we do); the spec leaves them unspecified
_case("local-window", "GroupQueryAttention", _gqa(seq=6, buffer=0, seqlens=(6, 6), local_window_size=2))
_case("local-window-decode", "GroupQueryAttention", _gqa(buffer=8, total=8, seqlens=(8, 6), local_window_size=3))
_case("softcap", "GroupQueryAttention", _gqa(seq=3, buffer=0, seqlens=(3, 3), softcap=2.0, scale=0.7))
_case("smooth-softmax", "GroupQueryAttention", _gqa(buffer=4, smooth_softmax=1))
_case("head-sink", "GroupQueryAttention", _gqa(seq=3, buffer=0, seqlens=(3, 3), head_sink=True))
_case("attention-bias", "GroupQueryAttention", _gqa(seq=3, buffer=0, seqlens=(3, 3), attn_bias=(2, 4)))
_case("attention-bias-decode", "GroupQueryAttention", _gqa(buffer=4, attn_bias=(1, 1)))
_case("non-causal", "GroupQueryAttention", _gqa(seq=4, buffer=0, seqlens=(4, 2), causal=0))
_case("qk-after-softmax", "GroupQueryAttention", _gqa(buffer=4, qk=True, qk_output=2))
_case(
    "query-seqlens",
    "GroupQueryAttention",
    _gqa(seq=4, buffer=10, total=10, seqlens=(6, 4), query_seqlens=(3, 2)),
    min_onnxruntime="1.32",
    before="has no query_seqlens input (INVALID_GRAPH)",
)
_case("int8-cache", "GroupQueryAttention", _gqa(buffer=4, quant="int8"))


# -- RotaryEmbedding ---------------------------------------------------------------------------------------


def _rotary(
    *, shape: tuple[int, ...] = (2, 3, 32), half: int = 8, rows: int = 12, positions: str = "start", seed: int = 3, **attrs: Any
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        import torch

        g = _gen(seed)
        x = _randn(g, *shape, dtype=dtype)
        batch, seq = shape[0], shape[-2] if len(shape) == 4 else shape[1]
        cos, sin = _rope_caches(rows, half, dtype)
        if positions == "start":
            pos = torch.tensor([3], dtype=torch.int64)
        elif positions == "scalar":
            pos = torch.tensor(2, dtype=torch.int64)
        else:
            pos = torch.randint(0, rows, (batch, seq), generator=g, dtype=torch.int64)
        inputs = {"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin}
        return inputs, {"output": (dtype, len(shape))}, dict(attrs)

    return make


_case("3d-heads", "RotaryEmbedding", _rotary(num_heads=2))
_case("3d-no-num-heads", "RotaryEmbedding", _rotary(half=4))
_case("3d-interleaved-ids", "RotaryEmbedding", _rotary(num_heads=2, interleaved=1, positions="ids"))
_case("4d", "RotaryEmbedding", _rotary(shape=(2, 2, 3, 16), positions="scalar"))
_case("4d-interleaved-ids", "RotaryEmbedding", _rotary(shape=(2, 2, 3, 16), positions="ids", interleaved=1))
_case("partial", "RotaryEmbedding", _rotary(num_heads=2, half=4, rotary_embedding_dim=8, positions="ids"))
_case("scale-packed-batching", "RotaryEmbedding", _rotary(num_heads=2, scale=0.5, is_packed_batching=1, positions="ids"))


# -- DecoderMaskedMultiHeadAttention -----------------------------------------------------------------------


def _dmmha(
    *,
    batch: int = 2,
    heads: int = 2,
    head: int = 16,
    past: int = 3,
    share: int = 0,
    cross: int = 0,
    packed: bool = False,
    bias: bool = False,
    mask: bool = False,
    attn_bias: bool = False,
    beams: int = 0,
    qk: bool = False,
    seed: int = 4,
    **attrs: Any,
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        d = heads * head
        rows = batch * max(beams, 1)
        inputs: dict[str, Any] = dict.fromkeys(
            ("query", "key", "value", "mask_index", "attention_bias", "past_key", "past_value", "past_sequence_length", "beam_width", "cache_indirection", "bias")
        )
        if packed:
            inputs["query"] = _randn(g, rows, 1, 3 * d, dtype=dtype)
        else:
            inputs["query"] = _randn(g, rows, 1, d, dtype=dtype)
            if cross:
                inputs["key"] = _randn(g, rows, heads, cross, head, dtype=dtype)
                inputs["value"] = _randn(g, rows, heads, cross, head, dtype=dtype)
            else:
                inputs["key"] = _randn(g, rows, 1, d, dtype=dtype)
                inputs["value"] = _randn(g, rows, 1, d, dtype=dtype)
        total = cross or past + 1
        if not cross:
            m = share or past
            inputs["past_key"] = _randn(g, rows, heads, m, head, dtype=dtype)
            inputs["past_value"] = _randn(g, rows, heads, m, head, dtype=dtype)
            inputs["past_sequence_length"] = _ints([past])
        if mask:
            inputs["mask_index"] = _ints([[1] * (total - 2) + [0, 1]] * rows)
        if attn_bias:
            inputs["attention_bias"] = _randn(g, rows, heads, 1, total, dtype=dtype)
        if beams:
            inputs["beam_width"] = _ints([beams])
            inputs["cache_indirection"] = torch_randint(g, beams, (batch, beams, share or past + 1))
        if bias:
            inputs["bias"] = _randn(g, 3 * d, dtype=dtype, scale=0.5)
        a = {"num_heads": heads, **attrs}
        if share:
            a["past_present_share_buffer"] = 1
        if qk:
            a["output_qk"] = 1
        outputs: Outputs = {
            "output": (dtype, 3),
            "present_key": (dtype, 4) if not cross else None,
            "present_value": (dtype, 4) if not cross else None,
            "qk": (dtype, 4) if qk else None,
        }
        return inputs, outputs, a

    return make


# onnxruntime's CPU kernel takes self attention only with past_present_share_buffer
_case("self", "DecoderMaskedMultiHeadAttention", _dmmha(share=4))
_case("self-bias-mask", "DecoderMaskedMultiHeadAttention", _dmmha(share=6, bias=True, mask=True, scale=0.3))
# packed QKV fails in onnxruntime 1.32's CPU kernel ("Tensor size (192) != new size (64)"; with a bias:
# "Attempting to broadcast an axis by a dimension other than 1"), and its CUDA kernel wants the shared key
# buffer reordered (B, N, H / x, M, x): the packed form is checked against the numpy reference only
_case("share-buffer-attention-bias", "DecoderMaskedMultiHeadAttention", _dmmha(share=6, attn_bias=True, qk=True))
_case("beam-search", "DecoderMaskedMultiHeadAttention", _dmmha(batch=1, beams=3, share=6, bias=True))
_case("cross", "DecoderMaskedMultiHeadAttention", _dmmha(cross=5, bias=True, mask=True))
_case("cross-qk", "DecoderMaskedMultiHeadAttention", _dmmha(cross=5, qk=True, scale=0.5))


# -- SparseAttention ---------------------------------------------------------------------------------------


def _csr(dense: list[list[list[int]]]) -> tuple[list[list[int]], list[list[int]]]:
    """CSR row pointers and column indices (right-padded with -1) of per-layout block masks."""
    rows, cols = [], []
    for layout in dense:
        r, c = [0], []
        for line in layout:
            c += [j for j, on in enumerate(line) if on]
            r.append(len(c))
        rows.append(r)
        cols.append(c)
    width = max(len(c) for c in cols)
    return rows, [c + [-1] * (width - len(c)) for c in cols]


#: two 4 x 4 block layouts (the schema's example)
_LAYOUTS = [
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]],
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 1]],
]


def _sparse(
    *,
    seq: int = 1,
    heads: int = 4,
    kv_heads: int = 2,
    head: int = 16,
    block: int = 16,
    totals: tuple[int, ...] = (50, 37),
    layouts: int = 2,
    packed: bool = False,
    rotary: bool = False,
    seed: int = 5,
    **attrs: Any,
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        batch = len(totals)
        rows = 4 * block
        inputs: dict[str, Any] = dict.fromkeys(
            ("query", "key", "value", "past_key", "past_value", "block_row_indices", "block_col_indices", "total_sequence_length",
             "key_total_sequence_lengths", "cos_cache", "sin_cache")
        )
        if packed:
            inputs["query"] = _randn(g, batch, seq, (heads + 2 * kv_heads) * head, dtype=dtype)
        else:
            inputs["query"] = _randn(g, batch, seq, heads * head, dtype=dtype)
            inputs["key"] = _randn(g, batch, seq, kv_heads * head, dtype=dtype)
            inputs["value"] = _randn(g, batch, seq, kv_heads * head, dtype=dtype)
        inputs["past_key"] = _randn(g, batch, kv_heads, rows, head, dtype=dtype)
        inputs["past_value"] = _randn(g, batch, kv_heads, rows, head, dtype=dtype)
        r, c = _csr(_LAYOUTS[:layouts])
        inputs["block_row_indices"] = _ints(r)
        inputs["block_col_indices"] = _ints(c)
        inputs["total_sequence_length"] = _ints(max(totals))
        inputs["key_total_sequence_lengths"] = _ints(list(totals))
        if rotary:
            inputs["cos_cache"], inputs["sin_cache"] = _rope_caches(rows, head // 2, dtype)
        a = {"num_heads": heads, "kv_num_heads": kv_heads, "sparse_block_size": block, **attrs}
        if rotary:
            a["do_rotary"] = 1
        return inputs, {"output": (dtype, 3), "present_key": (dtype, 4), "present_value": (dtype, 4)}, a

    return make


# onnxruntime updates the cache in place: present_key/present_value must be past_key/past_value's buffers
_SHARED = (("present_key", "past_key"), ("present_value", "past_value"))
#: onnxruntime 1.32's CPU kernel (sparse_attention_base.h) writes each (batch, head)'s probabilities at a
#: stride of total_sequence_length and reads them back at the entry's own key count: after an entry shorter
#: than the longest, the ·V product reads misplaced probabilities
_RAGGED = (
    "onnxruntime's CPU kernel misplaces the probabilities of batch entries after one with fewer keys than "
    "total_sequence_length (written at a stride of total_sequence_length, read at the entry's own length)"
)
_case("decode", "SparseAttention", _sparse(totals=(50, 50)), shared_buffers=_SHARED)
_case("decode-one-layout-scale", "SparseAttention", _sparse(totals=(37, 37), layouts=1, scale=0.2), shared_buffers=_SHARED)
_case("decode-ragged", "SparseAttention", _sparse(totals=(50, 37)), shared_buffers=_SHARED, departs=_RAGGED)
_case("prompt", "SparseAttention", _sparse(seq=40, totals=(40, 40), packed=True), shared_buffers=_SHARED)
_case("prompt-rotary", "SparseAttention", _sparse(seq=24, totals=(24, 24), rotary=True), shared_buffers=_SHARED)
_case("decode-rotary-interleaved", "SparseAttention", _sparse(totals=(45, 45), rotary=True, rotary_interleaved=1), shared_buffers=_SHARED)


# -- QAttention ------------------------------------------------------------------------------------------


def _qattention(
    *,
    batch: int = 2,
    seq: int = 3,
    hidden_in: int = 16,
    heads: int = 2,
    hidden: int = 16,
    signed_input: bool = False,
    per_column: bool = False,
    zero_points: bool = True,
    mask: Callable[[Any], Any] | None = None,
    past: int = 0,
    seed: int = 6,
    **attrs: Any,
) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        import torch

        g = _gen(seed)
        lo, hi, itype = (-128, 128, torch.int8) if signed_input else (0, 256, torch.uint8)
        inputs: dict[str, Any] = {
            "input": torch.randint(lo, hi, (batch, seq, hidden_in), generator=g).to(itype),
            "weight": torch.randint(-128, 128, (hidden_in, 3 * hidden), generator=g).to(torch.int8),
            "bias": _randn(g, 3 * hidden, dtype=dtype, scale=0.2),
            "input_scale": torch.tensor(0.02, dtype=getattr(torch, dtype)),
            "weight_scale": (torch.rand(3 * hidden, generator=g) * 0.004 + 0.001).to(getattr(torch, dtype))
            if per_column
            else torch.tensor(0.003, dtype=getattr(torch, dtype)),
            "mask_index": mask(g) if mask is not None else None,
            "input_zero_point": torch.tensor(3 if signed_input else 128, dtype=itype) if zero_points else None,
            "weight_zero_point": (torch.randint(-4, 4, (3 * hidden,), generator=g).to(torch.int8) if per_column else torch.tensor(1, dtype=torch.int8))
            if zero_points
            else None,
            "past": _randn(g, 2, batch, heads, past, hidden // heads, dtype=dtype) if past else None,
        }
        outputs: Outputs = {"output": (dtype, 3), "present": (dtype, 5) if past else None}
        return inputs, outputs, {"num_heads": heads, **attrs}

    return make


_case("uint8", "QAttention", _qattention())
_case("per-column", "QAttention", _qattention(per_column=True))
# onnxruntime's CPU kernel takes a uint8 input only
_case("int8-input", "QAttention", _qattention(signed_input=True, per_column=True), providers=("CUDA",))
_case("no-zero-points-mask", "QAttention", _qattention(zero_points=False, mask=lambda g: _ints([2, 3]), scale=0.3))
_case("past-unidirectional", "QAttention", _qattention(past=2, unidirectional=1, mask_filter_value=-50.0, mask=lambda g: _ints([[1, 1, 1, 0, 1], [0, 1, 1, 1, 1]])))


# -- CUDA-only ops: DecoderMaskedSelfAttention, PackedAttention, PackedMultiHeadAttention --------------------


def _dmsa(*, batch: int = 2, heads: int = 2, head: int = 16, past: int = 3, buffer: int = 6, beams: int = 0, mask: bool = False, seed: int = 7, **attrs: Any) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        d = heads * head
        rows = batch * max(beams, 1)
        inputs: dict[str, Any] = {
            "input": _randn(g, rows, 1, d, dtype=dtype),
            "weights": _randn(g, d, 3 * d, dtype=dtype, scale=0.3),
            "bias": _randn(g, 3 * d, dtype=dtype, scale=0.2),
            "mask_index": _ints([[1] * (past - 1) + [0, 1]] * rows) if mask else None,
            "past": _randn(g, 2, rows, heads, buffer, head, dtype=dtype),
            "attention_bias": None,
            "past_sequence_length": _ints([past]),
            "beam_width": _ints([beams]) if beams else None,
            "cache_indirection": torch_randint(g, beams, (batch, beams, buffer)) if beams else None,
        }
        return inputs, {"output": (dtype, 3), "present": (dtype, 5)}, {"num_heads": heads, "past_present_share_buffer": 1, **attrs}

    return make


def _packed(*, op: str, lengths: tuple[int, ...] = (2, 4, 1), seq: int = 4, heads: int = 2, head: int = 8, packed_qkv: bool = False, attn_bias: bool = False, seed: int = 8, **attrs: Any) -> Builder:
    def make(dtype: str) -> tuple[dict[str, Any], Outputs, dict[str, Any]]:
        g = _gen(seed)
        d = heads * head
        count = sum(lengths)
        offsets = [b * seq + s for b, n in enumerate(lengths) for s in range(n)]
        offsets += [b * seq + s for b, n in enumerate(lengths) for s in range(n, seq)]
        cumulative = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        inputs: dict[str, Any]
        if op == "PackedAttention":
            inputs = {"input": _randn(g, count, 12, dtype=dtype), "weights": _randn(g, 12, 3 * d, dtype=dtype, scale=0.3), "bias": _randn(g, 3 * d, dtype=dtype, scale=0.2)}
        elif packed_qkv:
            inputs = {"query": _randn(g, count, heads, 3, head, dtype=dtype), "key": None, "value": None, "bias": _randn(g, 3 * d, dtype=dtype, scale=0.2)}
        else:
            inputs = {"query": _randn(g, count, d, dtype=dtype), "key": _randn(g, count, d, dtype=dtype), "value": _randn(g, count, d, dtype=dtype), "bias": None}
        inputs["token_offset"] = _ints([offsets[i * seq : (i + 1) * seq] for i in range(len(lengths))])
        inputs["cumulative_sequence_length"] = _ints(cumulative)
        inputs["attention_bias"] = _randn(g, 1, heads, seq, seq, dtype=dtype) if attn_bias else None
        return inputs, {"output": (dtype, 2)}, {"num_heads": heads, **attrs}

    return make


_CUDA = ("CUDA",)
_case("step", "DecoderMaskedSelfAttention", _dmsa(), providers=_CUDA)
_case("mask-scale", "DecoderMaskedSelfAttention", _dmsa(mask=True, scale=0.3), providers=_CUDA)
_case("beam-search", "DecoderMaskedSelfAttention", _dmsa(batch=1, beams=2), providers=_CUDA)
_case("rotary", "DecoderMaskedSelfAttention", _dmsa(head=32, do_rotary=1), providers=_CUDA)
_case("basic", "PackedAttention", _packed(op="PackedAttention"), providers=_CUDA)
_case("attention-bias", "PackedAttention", _packed(op="PackedAttention", attn_bias=True, scale=0.4), providers=_CUDA)
_case("separate", "PackedMultiHeadAttention", _packed(op="PackedMultiHeadAttention"), providers=_CUDA)
_case("packed-qkv-bias", "PackedMultiHeadAttention", _packed(op="PackedMultiHeadAttention", packed_qkv=True, attn_bias=True), providers=_CUDA)

# bfloat16: onnxruntime's CPU provider has none of these ops in bfloat16; its CUDA provider has
# MultiHeadAttention, GroupQueryAttention and RotaryEmbedding
_BF16 = ("bfloat16",)
_case("basic", "MultiHeadAttention", _mha(bias=True, attn_bias=(1, 2)), dtypes=_BF16)
_case("past", "MultiHeadAttention", _mha(past=4, unidirectional=1), dtypes=_BF16)
_case("decode", "GroupQueryAttention", _gqa(buffer=8, total=8, seqlens=(6, 3), rotary=16), dtypes=_BF16)
_case("prompt", "GroupQueryAttention", _gqa(seq=4, buffer=0, seqlens=(4, 4), local_window_size=2, softcap=3.0), dtypes=_BF16)
_case("3d", "RotaryEmbedding", _rotary(num_heads=2, positions="ids"), dtypes=_BF16)
_case("4d-interleaved", "RotaryEmbedding", _rotary(shape=(2, 2, 3, 16), interleaved=1), dtypes=_BF16)
