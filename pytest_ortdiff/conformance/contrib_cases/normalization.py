"""Conformance cases for onnxruntime's normalization contrib ops (see pytest_ortdiff.contrib_cases): every
attribute and optional input/output of SimplifiedLayerNormalization, the default domain's LayerNormalization
below opset 17, (Skip)(Simplified)LayerNormalization, (Q)EmbedLayerNormalization, GroupNorm, SkipGroupNorm."""

from __future__ import annotations

from functools import partial
from typing import Any

from . import ContribCase
from ._onenode import ELEM, MS, ints, one_node, randn

FLOAT, INT32 = 1, 6
_DTYPES = ("float32", "float16", "bfloat16")


def _simplified(dtype: str, *, axis: int | None = None, epsilon: float | None = None, opset: int = 17, stats: bool = True, shape: tuple[int, ...] = (2, 3, 16)) -> tuple[Any, dict[str, Any]]:
    attrs = {k: v for k, v in (("axis", axis), ("epsilon", epsilon)) if v is not None}
    norm = shape[(axis if axis is not None else -1) % len(shape) :]
    x = randn(*shape, dtype=dtype, seed=1, scale=2.0, shift=0.3)
    scale = randn(*norm, dtype=dtype, seed=2, shift=1.0)
    return one_node(
        "SimplifiedLayerNormalization", "", [("x", x), ("scale", scale)], [("y", ELEM[dtype], len(shape)), ("inv_std_var", FLOAT, len(shape)) if stats else None], attrs, weights=("scale",), opset=opset
    )


def _layer_norm(dtype: str, *, axis: int | None = None, bias: bool = True, stats: bool = True, opset: int = 16) -> tuple[Any, dict[str, Any]]:
    attrs = {"axis": axis} if axis is not None else {}
    shape = (2, 3, 16)
    norm = shape[(axis if axis is not None else -1) % len(shape) :]
    x = randn(*shape, dtype=dtype, seed=3, scale=1.5, shift=-0.2)
    inputs = [("x", x), ("scale", randn(*norm, dtype=dtype, seed=4, shift=1.0)), ("b", randn(*norm, dtype=dtype, seed=5)) if bias else None]
    outputs = [("y", ELEM[dtype], 3), ("mean", FLOAT, 3) if stats else None, ("inv_std_dev", FLOAT, 3) if stats else None]
    return one_node("LayerNormalization", "", inputs, outputs, attrs, weights=("scale", "b"), opset=opset)


def _skip(
    op: str,
    dtype: str,
    *,
    skip_shape: tuple[int, ...] | None = None,
    beta: bool = True,
    bias: bool = True,
    outputs: tuple[bool, bool, bool] = (True, True, True),
    shape: tuple[int, ...] = (2, 3, 16),
    epsilon: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    hidden = shape[-1]
    x = randn(*shape, dtype=dtype, seed=6, scale=1.2)
    skip = randn(*(skip_shape or shape), dtype=dtype, seed=7, shift=0.1)
    inputs: list[Any] = [("input", x), ("skip", skip), ("gamma", randn(hidden, dtype=dtype, seed=8, shift=1.0))]
    if op == "SkipLayerNormalization":
        inputs.append(("beta", randn(hidden, dtype=dtype, seed=9)) if beta else None)
    inputs.append(("bias", randn(hidden, dtype=dtype, seed=10, scale=0.5)) if bias else None)
    mean, inv, total = outputs
    rank = len(shape)
    outs = [("output", ELEM[dtype], rank), ("mean", FLOAT, rank) if mean else None, ("inv_std_var", FLOAT, rank) if inv else None, ("input_skip_bias_sum", ELEM[dtype], rank) if total else None]
    attrs = {"epsilon": epsilon} if epsilon is not None else {}
    return one_node(op, MS, inputs, outs, attrs, weights=("gamma", "beta", "bias"))


def _embed(
    dtype: str,
    *,
    segment: bool = True,
    mask: str | None = "right",
    position_ids: tuple[int, int] | None = None,
    outputs: tuple[bool, bool] = (True, True),
    epsilon: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    batch, seq, hidden, vocab = 2, 5, 16, 11
    ids = ints(batch, seq, high=vocab, seed=11)
    inputs: list[Any] = [
        ("input_ids", ids),
        ("segment_ids", ints(batch, seq, high=2, seed=12)) if segment else None,
        ("word_embedding", randn(vocab, hidden, dtype=dtype, seed=13)),
        ("position_embedding", randn(8, hidden, dtype=dtype, seed=14, scale=0.5)),
        ("segment_embedding", randn(2, hidden, dtype=dtype, seed=15, scale=0.5)) if segment else None,
        ("gamma", randn(hidden, dtype=dtype, seed=16, shift=1.0)),
        ("beta", randn(hidden, dtype=dtype, seed=17, scale=0.3)),
    ]
    if mask is not None:
        import torch

        lengths = [5, 3]
        m = torch.tensor([[1 if s < n else 0 for s in range(seq)] for n in lengths], dtype=torch.int32)
        if mask == "holes":  # zeros inside a row: mask_index counts the ones
            m[0, 1] = 0
        inputs.append(("mask", m))
    else:
        inputs.append(None)
    if position_ids is not None:
        rows, _ = position_ids
        inputs.append(("position_ids", ints(rows, seq, high=8, seed=18)))
    index, total = outputs
    outs = [("output", ELEM[dtype], 3), ("mask_index", INT32, 1) if index else None, ("embedding_sum", ELEM[dtype], 3) if total else None]
    attrs = {"epsilon": epsilon} if epsilon is not None else {}
    return one_node("EmbedLayerNormalization", MS, inputs, outs, attrs, weights=("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta"))


def _q_embed(qtype: str, *, segment: bool = True, mask: bool = True) -> tuple[Any, dict[str, Any]]:
    import torch

    batch, seq, hidden, vocab = 2, 4, 16, 9
    lo, hi = (0, 256) if qtype == "uint8" else (-128, 128)
    zp = 128 if qtype == "uint8" else 0

    def table(rows: int, seed: int, name: str, scale: float) -> list[Any]:
        shape = (rows, hidden) if rows else (hidden,)
        return [
            (name, ints(*shape, low=lo, high=hi, seed=seed, dtype=qtype)),
            (f"{name}_scale", torch.tensor(scale, dtype=torch.float32)),
            (f"{name}_zero_point", torch.tensor(zp + (3 if rows else 0), dtype=getattr(torch, qtype))),
        ]

    word, pos, seg = table(vocab, 21, "word", 0.02), table(6, 22, "pos", 0.01), table(2, 23, "seg", 0.015)
    gamma, beta = table(0, 24, "gamma", 0.01), table(0, 25, "beta", 0.002)
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.int32)
    inputs: list[Any] = [
        ("input_ids", ints(batch, seq, high=vocab, seed=26)),
        ("segment_ids", ints(batch, seq, high=2, seed=27)) if segment else None,
        word[0], pos[0], seg[0] if segment else None, gamma[0], beta[0],
        ("mask", m) if mask else None,
        word[1], pos[1], seg[1] if segment else None, gamma[1], beta[1],
        word[2], pos[2], seg[2] if segment else None, gamma[2], beta[2],
    ]  # fmt: skip
    weights = tuple(name for group in (word, pos, seg, gamma, beta) for name, _ in group)
    return one_node("QEmbedLayerNormalization", MS, inputs, [("layernorm_out", FLOAT, 3), ("mask_index_out", INT32, 1)], weights=weights)


def _group_norm(dtype: str, *, skip: str | None = None, bias: bool = True, activation: int = 0, channels_last: int | None = None, gamma_dtype: str = "float32", sum_output: bool = True) -> tuple[Any, dict[str, Any]]:
    n, h, w, c, groups = 2, 4, 3, 8, 4
    last = channels_last is None or channels_last == 1
    shape = (n, h, w, c) if last else (n, c, h, w)
    attrs: dict[str, Any] = {"groups": groups, "activation": activation, "epsilon": 1e-5}
    if channels_last is not None:
        attrs["channels_last"] = channels_last
    inputs: list[Any] = [("X", randn(*shape, dtype=dtype, seed=31, scale=2.0, shift=0.5)), ("gamma", randn(c, dtype=gamma_dtype, seed=32, shift=1.0)), ("beta", randn(c, dtype=gamma_dtype, seed=33))]
    outs: list[Any] = [("Y", ELEM[dtype], 4)]
    op = "GroupNorm"
    if skip is not None:
        op = "SkipGroupNorm"
        skip_shape = {"full": shape, "n11c": (n, 1, 1, c), "nc": (n, c)}[skip]
        inputs.append(("skip", randn(*skip_shape, dtype=dtype, seed=34)))
        inputs.append(("bias", randn(c, dtype=dtype, seed=35, scale=0.3)) if bias else None)
        outs.append(("S", ELEM[dtype], 4) if sum_output else None)
    return one_node(op, MS, inputs, outs, attrs, weights=("gamma", "beta", "bias"))


CASES: list[ContribCase] = []


def _add(name: str, op: str, dtype: str, build: Any, **kw: Any) -> None:
    CASES.append(ContribCase(name, op, dtype, build, **kw))


for _dt in _DTYPES:
    _add(f"SimplifiedLayerNormalization.{_dt}", "SimplifiedLayerNormalization", _dt, partial(_simplified, _dt))
    _add(f"LayerNormalization.opset16.{_dt}", "LayerNormalization", _dt, partial(_layer_norm, _dt))
    _add(f"SkipLayerNormalization.{_dt}", "com.microsoft::SkipLayerNormalization", _dt, partial(_skip, "SkipLayerNormalization", _dt))
    _add(f"SkipSimplifiedLayerNormalization.{_dt}", "com.microsoft::SkipSimplifiedLayerNormalization", _dt, partial(_skip, "SkipSimplifiedLayerNormalization", _dt))

_add("SimplifiedLayerNormalization.axis-2.eps", "SimplifiedLayerNormalization", "float32", partial(_simplified, "float32", axis=-2, epsilon=1e-3))
_add("SimplifiedLayerNormalization.axis1.opset13", "SimplifiedLayerNormalization", "float32", partial(_simplified, "float32", axis=1, opset=13, stats=False))
_add("SimplifiedLayerNormalization.2d.opset21", "SimplifiedLayerNormalization", "float16", partial(_simplified, "float16", opset=21, shape=(6, 32)))
_add("LayerNormalization.opset16.axis1.nobias", "LayerNormalization", "float32", partial(_layer_norm, "float32", axis=1, bias=False))
_add("LayerNormalization.opset13.y-only", "LayerNormalization", "float16", partial(_layer_norm, "float16", stats=False, opset=13))

_SKIP = "com.microsoft::SkipLayerNormalization"
_add("SkipLayerNormalization.skip1sh.eps", _SKIP, "float32", partial(_skip, "SkipLayerNormalization", "float32", skip_shape=(1, 3, 16), epsilon=1e-5))
_add("SkipLayerNormalization.skip-sh", _SKIP, "float16", partial(_skip, "SkipLayerNormalization", "float16", skip_shape=(3, 16), outputs=(False, False, True)))
_add("SkipLayerNormalization.2d.nobeta.nobias", _SKIP, "float32", partial(_skip, "SkipLayerNormalization", "float32", shape=(5, 32), beta=False, bias=False, outputs=(False, False, False)))
_add("SkipLayerNormalization.nobias.sum", _SKIP, "bfloat16", partial(_skip, "SkipLayerNormalization", "bfloat16", bias=False, outputs=(False, False, True)))
_SKIPS = "com.microsoft::SkipSimplifiedLayerNormalization"
_add("SkipSimplifiedLayerNormalization.2d.nobias", _SKIPS, "float32", partial(_skip, "SkipSimplifiedLayerNormalization", "float32", shape=(5, 32), bias=False, outputs=(False, False, True)))
_add("SkipSimplifiedLayerNormalization.skip1sh", _SKIPS, "float16", partial(_skip, "SkipSimplifiedLayerNormalization", "float16", skip_shape=(1, 3, 16), outputs=(False, True, False), epsilon=1e-6))

_EMBED = "com.microsoft::EmbedLayerNormalization"
_add("EmbedLayerNormalization.bert.float32", _EMBED, "float32", partial(_embed, "float32", position_ids=(1, 5)))
_add("EmbedLayerNormalization.distilbert", _EMBED, "float32", partial(_embed, "float32", segment=False, mask=None, outputs=(True, False)))
_add("EmbedLayerNormalization.position_ids-batch.mask-holes", _EMBED, "float32", partial(_embed, "float32", position_ids=(2, 5), mask="holes", epsilon=1e-5))
_add("EmbedLayerNormalization.bert.float16", _EMBED, "float16", partial(_embed, "float16"))

_QEMBED = "com.microsoft::QEmbedLayerNormalization"
_add("QEmbedLayerNormalization.uint8", _QEMBED, "float32", partial(_q_embed, "uint8"))
_add("QEmbedLayerNormalization.int8.noseg.nomask", _QEMBED, "float32", partial(_q_embed, "int8", segment=False, mask=False))

# GroupNorm and SkipGroupNorm: onnxruntime has CUDA kernels only (NHWC, gamma/beta in float32); the layouts
# and types it lacks are checked against a float64 numpy reference in tests/test_contrib_normalization.py
_CUDA = ("CUDA",)
_add("GroupNorm.float32", "com.microsoft::GroupNorm", "float32", partial(_group_norm, "float32"), providers=_CUDA)
_add("GroupNorm.silu", "com.microsoft::GroupNorm", "float16", partial(_group_norm, "float16", activation=1, channels_last=1), providers=_CUDA)
_add("SkipGroupNorm.full.bias.sum", "com.microsoft::SkipGroupNorm", "float16", partial(_group_norm, "float16", skip="full", activation=1), providers=_CUDA)
_add("SkipGroupNorm.nc.nobias", "com.microsoft::SkipGroupNorm", "float32", partial(_group_norm, "float32", skip="nc", bias=False, sum_output=False), providers=_CUDA)
_add("SkipGroupNorm.n11c", "com.microsoft::SkipGroupNorm", "float16", partial(_group_norm, "float16", skip="n11c"), providers=_CUDA)
