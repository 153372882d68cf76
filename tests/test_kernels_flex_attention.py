"""The ai.onnx.preview FlexAttention kernel (scale, GQA, softmax_precision, score_mod/prob_mod subgraphs)
against onnx.reference in float32, float16 and float64, and the float64 oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from kernel_harness import (
    FLOAT_TYPES,
    REF_TOL,
    assert_outputs_close,
    one_node_model,
    run_reference,
    run_torch,
)
from onnx import TensorProto, helper

from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels.base import UnsupportedVariantError

PREVIEW = "ai.onnx.preview"
RNG = np.random.default_rng(7)

# onnxruntime 1.32 has no FlexAttention kernel ("not a registered function/op"): onnx.reference only


def _qkv(q_heads: int, kv_heads: int, *, batch: int = 2, q_len: int = 3, kv_len: int = 5, head: int = 4,
         v_head: int = 6) -> dict[str, np.ndarray]:
    return {
        "Q": RNG.standard_normal((batch, q_heads, q_len, head)).astype(np.float32),
        "K": RNG.standard_normal((batch, kv_heads, kv_len, head)).astype(np.float32),
        "V": RNG.standard_normal((batch, kv_heads, kv_len, v_head)).astype(np.float32),
    }


def _causal_mask(elem: int) -> onnx.GraphProto:
    """score_mod: -inf where key position > query position (Where over two Range index vectors)."""
    nodes = [
        helper.make_node("Shape", ["scores"], ["L"], start=2, end=3),
        helper.make_node("Shape", ["scores"], ["S"], start=3, end=4),
        helper.make_node("Squeeze", ["L"], ["l"]),
        helper.make_node("Squeeze", ["S"], ["s"]),
        helper.make_node("Range", ["zero", "l", "one"], ["qi"]),
        helper.make_node("Range", ["zero", "s", "one"], ["ki"]),
        helper.make_node("Unsqueeze", ["qi", "last"], ["qcol"]),
        helper.make_node("GreaterOrEqual", ["qcol", "ki"], ["keep"]),
        helper.make_node("Where", ["keep", "scores", "neg_inf"], ["scores_out"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("last", TensorProto.INT64, [1], [1]),
        helper.make_tensor("neg_inf", elem, [], [-np.inf]),
    ]
    return _graph("causal_mask", nodes, elem, inits, "scores", "scores_out")


def _soft_cap(elem: int, cap: float) -> onnx.GraphProto:
    """score_mod: cap * tanh(scores / cap), Gemma's logit soft-capping."""
    nodes = [
        helper.make_node("Div", ["scores", "cap"], ["d"]),
        helper.make_node("Tanh", ["d"], ["t"]),
        helper.make_node("Mul", ["t", "cap"], ["scores_out"]),
    ]
    return _graph("soft_cap", nodes, elem, [helper.make_tensor("cap", elem, [], [cap])], "scores", "scores_out")


def _prob_scale(elem: int, factor: float) -> onnx.GraphProto:
    """prob_mod: probs * factor (attention dropout's rescaling)."""
    nodes = [helper.make_node("Mul", ["probs", "factor"], ["probs_out"])]
    return _graph("prob_scale", nodes, elem, [helper.make_tensor("factor", elem, [], [factor])], "probs", "probs_out")


def _outer_bias(elem: int) -> onnx.GraphProto:
    """score_mod: scores + bias, where `bias` is a value of the enclosing graph (outer scope)."""
    nodes = [helper.make_node("Add", ["scores", "bias"], ["scores_out"])]
    return _graph("outer_bias", nodes, elem, [], "scores", "scores_out")


def _graph(name: str, nodes: list[onnx.NodeProto], elem: int, inits: list[onnx.TensorProto], i: str,
           o: str) -> onnx.GraphProto:
    dims = ["B", "H", "L", "S"]
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info(i, elem, dims)],
                             [helper.make_tensor_value_info(o, elem, dims)], inits)


Mods = dict[str, Callable[[int], onnx.GraphProto]]


def _model(feeds: dict[str, np.ndarray], dtype: str, mods: Mods, **attrs: Any) -> onnx.ModelProto:
    """The FlexAttention model in `dtype`, its modifier graphs typed in the softmax precision (float32 for
    half inputs unless softmax_precision says otherwise)."""
    elem = attrs.get("softmax_precision") or (TensorProto.DOUBLE if dtype == "float64" else TensorProto.FLOAT)
    graphs = {name: make(elem) for name, make in mods.items()}
    typed = {k: v.astype(FLOAT_TYPES[dtype][1]) if k in "QKV" else v for k, v in feeds.items()}
    return one_node_model("FlexAttention", typed, ["Y"], 26, domain=PREVIEW, **graphs, **attrs)


def _cast(feeds: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {k: v.astype(FLOAT_TYPES[dtype][1]) if v.dtype == np.float32 else v for k, v in feeds.items()}


def check_flex(feeds: dict[str, np.ndarray], mods: Mods | None = None, dtypes: tuple[str, ...] = ("float32", "float16", "float64"),
               **attrs: Any) -> None:
    """The evaluator vs onnx.reference on the model built in each dtype, and the float64 oracle on the float32
    model vs onnx.reference on the float64 model: the same computation (the modifier graphs' constants are
    exact in float32), so to float64's tolerance."""
    __tracebackhide__ = True
    mods = mods or {}
    for dtype in dtypes:
        model, f = _model(feeds, dtype, mods, **attrs), _cast(feeds, dtype)
        assert_outputs_close(run_torch(model, f), run_reference(model, f), REF_TOL[dtype], ["Y"])
    if "float64" in dtypes and "softmax_precision" not in attrs:
        oracle = run_torch(_model(feeds, "float32", mods, **attrs), feeds, compute_dtype=torch.float64)
        wide = _model(feeds, "float64", mods, **attrs)
        assert_outputs_close(oracle, run_reference(wide, _cast(feeds, "float64")), REF_TOL["float64"], ["Y"])


def test_default_scale_different_head_sizes() -> None:
    check_flex(_qkv(2, 2))


def test_gqa_with_scale() -> None:
    # 6 query heads over 2 K/V heads: query heads 0-2 read K/V head 0, heads 3-5 head 1
    check_flex(_qkv(6, 2), scale=0.3)


def test_gqa_groups_are_contiguous() -> None:
    feeds = _qkv(4, 2)
    got = run_torch(_model(feeds, "float32", {}), feeds)[0]
    repeated = {"Q": feeds["Q"], "K": np.repeat(feeds["K"], 2, axis=1), "V": np.repeat(feeds["V"], 2, axis=1)}
    np.testing.assert_allclose(got, run_torch(_model(repeated, "float32", {}), repeated)[0], rtol=1e-6, atol=1e-7)


def test_score_mod_causal_mask_and_prob_mod() -> None:
    check_flex(_qkv(2, 1, q_len=4, kv_len=4), {"score_mod": _causal_mask, "prob_mod": lambda e: _prob_scale(e, 0.75)})


def test_softmax_precision_double_reaches_the_subgraph() -> None:
    # float32 inputs, softmax (and the soft-cap graph, typed double) in float64
    feeds = _qkv(2, 2)
    check_flex(feeds, {"score_mod": lambda e: _soft_cap(e, 1.5)}, dtypes=("float32", "float16"),
               softmax_precision=TensorProto.DOUBLE)
    model = _model(feeds, "float32", {"score_mod": lambda e: _soft_cap(e, 1.5)}, softmax_precision=TensorProto.DOUBLE)
    values = TorchEvaluator(model).run(None, {n: torch.from_numpy(a) for n, a in feeds.items()}, intermediates=True)
    assert values["scores"].dtype == values["scores_out"].dtype == torch.float64
    assert values["Y"].dtype == torch.float32


def test_float16_softmax_precision() -> None:
    check_flex(_qkv(2, 2), dtypes=("float16",), softmax_precision=TensorProto.FLOAT16)


def _model_by_hand(feeds: dict[str, np.ndarray], node: onnx.NodeProto) -> onnx.ModelProto:
    """A float32 model of `node` over graph inputs `feeds`, none of them necessarily a node input (and no
    shape inference, which a graph the kernel must refuse would fail)."""
    graph = helper.make_graph(
        [node], "flex", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None] * 4)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid(PREVIEW, 1)])


def test_score_mod_reads_the_enclosing_graph() -> None:
    feeds = {**_qkv(2, 2), "bias": RNG.standard_normal((3, 5)).astype(np.float32)}
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW,
                            score_mod=_outer_bias(TensorProto.FLOAT))
    model = _model_by_hand(feeds, node)
    got = run_torch(model, feeds)[0]
    # onnx.reference does not pass outer-scope values to FlexAttention's graphs: numpy in float64
    q, k, v = (feeds[n].astype(np.float64) for n in "QKV")
    s = q @ k.transpose(0, 1, 3, 2) / 2.0 + feeds["bias"]
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)
    # and a run keeping every value keeps the subgraph's too
    values = TorchEvaluator(model).run(None, {n: torch.from_numpy(a) for n, a in feeds.items()}, intermediates=True)
    assert values["scores_out"].shape == (2, 2, 3, 5)


@pytest.mark.parametrize(
    ("feeds", "attrs", "error", "match"),
    [
        # a run-time error reaches the user wrapped in the evaluator's message naming the node and its inputs
        (_qkv(3, 2), {}, RuntimeError, "Q's 3 heads are not a multiple of K/V's 2 heads"),
        (_qkv(2, 2), {"softmax_precision": TensorProto.INT32}, UnsupportedVariantError, "softmax_precision=6"),
    ],
    ids=["gqa-heads", "softmax_precision"],
)
def test_errors_name_the_problem(feeds: dict[str, np.ndarray], attrs: dict[str, Any], error: type[Exception],
                                 match: str) -> None:
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    with pytest.raises(error, match=match):
        run_torch(_model_by_hand(feeds, node), feeds)
