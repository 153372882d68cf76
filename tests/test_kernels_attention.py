"""The transformer-block kernels (Attention, RotaryEmbedding, RMSNormalization) and Einsum on one-node
models, against onnx.reference, onnxruntime where its CPU provider agrees with the spec, and the float64 oracle.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.shape_inference
import pytest
import torch
from kernel_harness import ort_session
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff import models
from pytest_ortdiff.numerics.tensors import to_numpy, to_torch
from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import KernelContext, UnsupportedVariantError, lookup
from pytest_ortdiff.runtimes.kernels.math import matmul
from pytest_ortdiff.runtimes.kernels.nn import attention, normalization

CPU = torch.device("cpu")
NP_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# (rtol, atol) against onnx.reference run on the same inputs in the same dtype. The kernels round where
# the spec's function body does (bfloat16's softmax denominator included), so what is left is summation
# order inside float32 accumulators: far below an ulp of float16/bfloat16, a few ulps of float32.
REF_TOL = {"float32": (1e-5, 1e-6), "float16": (2e-3, 1e-3), "bfloat16": (1e-3, 1e-4)}
# onnxruntime computes float16 attention with float32 inside: up to an ulp or two of float16 apart.
ORT_TOL = {"float32": (1e-5, 1e-6), "float16": (4e-3, 2e-3)}


# -- model building and running -------------------------------------------------------------------


def one_node_model(
    op: str, inputs: dict[str, np.ndarray | None], outputs: list[str], opset: int, **attrs: Any
) -> onnx.ModelProto:
    """`op` on graph inputs named and typed after `inputs` (None = an omitted optional input); outputs
    named in `outputs` ("" = not asked), typed by ONNX shape inference and checked in full."""
    names = list(inputs)
    while names and inputs[names[-1]] is None:
        names.pop()
    while outputs and not outputs[-1]:
        outputs = outputs[:-1]
    node = helper.make_node(
        op, [n if inputs[n] is not None else "" for n in names], outputs, **attrs
    )
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in inputs.items()
        if a is not None
    ]
    graph = helper.make_graph(
        [node], op, graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs if o]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_torch(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], compute_dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    ev = TorchEvaluator(model, compute_dtype=compute_dtype)
    out = ev.run(None, {k: to_torch(v) for k, v in feeds.items()})
    return [to_numpy(t) for t in out]


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # -inf arithmetic in fully masked rows
        return ReferenceEvaluator(model).run(None, feeds)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(model)
    return sess.run(None, feeds)


def assert_outputs_close(
    got: list[np.ndarray], expected: list[np.ndarray], tol: tuple[float, float], names: list[str]
) -> None:
    __tracebackhide__ = True
    assert len(got) == len(expected)
    for name, g, e in zip(names, got, expected, strict=True):
        assert g.dtype == e.dtype, f"{name}: {g.dtype} instead of {e.dtype}"
        assert g.shape == e.shape, f"{name}: {g.shape} instead of {e.shape}"
        np.testing.assert_allclose(
            g.astype(np.float64), e.astype(np.float64), rtol=tol[0], atol=tol[1], err_msg=name
        )


def output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def given(feeds: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """The feeds of the inputs present (the model is built from all of them, None marking the omitted)."""
    return {k: v for k, v in feeds.items() if v is not None}


# -- Attention --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attn:
    """An Attention case: shapes of Q/K/V (3-D ones need q_num_heads/kv_num_heads in attrs) and extras."""

    id: str
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: tuple[int, ...] | None = None
    bool_mask: bool = False
    past: int = 0  # past sequence length: past_key/past_value fed, present_key/present_value asked
    nonpad: tuple[int, ...] | None = None  # nonpad_kv_seqlen (opset 24)
    qk: bool = False  # ask for qk_matmul_output
    opset: int = 23
    attrs: dict[str, Any] = field(default_factory=dict)
    #: why onnxruntime 1.32 is not compared on this case (None: compared)
    no_ort: str | None = None

    def feeds(self, dtype: str, seed: int = 0) -> dict[str, np.ndarray | None]:
        rng = np.random.default_rng(seed)
        np_type = NP_TYPES[dtype]

        def draw(shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
            return (rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32).astype(np_type)

        feeds: dict[str, np.ndarray | None] = {
            "Q": draw(self.q, 2.0),
            "K": draw(self.k, 2.0),
            "V": draw(self.v),
            "attn_mask": None,
            "past_key": None,
            "past_value": None,
            "nonpad_kv_seqlen": None,
        }
        if self.mask is not None:
            if self.bool_mask:
                feeds["attn_mask"] = rng.random(self.mask) < 0.7
            else:
                feeds["attn_mask"] = draw(self.mask)
        if self.past:
            if len(self.k) == 4:
                kv_heads, head, v_head = self.k[1], self.k[3], self.v[3]
            else:
                kv_heads = self.attrs["kv_num_heads"]
                head, v_head = self.k[2] // kv_heads, self.v[2] // kv_heads
            feeds["past_key"] = draw((self.q[0], kv_heads, self.past, head))
            feeds["past_value"] = draw((self.q[0], kv_heads, self.past, v_head))
        if self.nonpad is not None:
            feeds["nonpad_kv_seqlen"] = np.array(self.nonpad, dtype=np.int64)
        return feeds

    def model(self, feeds: dict[str, np.ndarray | None]) -> onnx.ModelProto:
        outputs = ["Y", "present_key" if self.past else "", "present_value" if self.past else ""]
        outputs.append("qk_matmul_output" if self.qk else "")
        return one_node_model("Attention", feeds, outputs, self.opset, **self.attrs)


H3 = {"q_num_heads": 3, "kv_num_heads": 3}
ATTENTION_CASES = [
    Attn("4d", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)),
    Attn("4d-v-head-size", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 10)),
    Attn("4d-scale", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), attrs={"scale": 0.3}),
    Attn("4d-gqa", (2, 6, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)),
    Attn("4d-mqa", (1, 4, 3, 8), (1, 1, 5, 8), (1, 1, 5, 8)),
    Attn("4d-causal-self", (2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8), attrs={"is_causal": 1}),
    Attn("4d-causal-cross", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), attrs={"is_causal": 1}),
    Attn("4d-gqa-causal", (2, 6, 4, 8), (2, 3, 4, 8), (2, 3, 4, 8), attrs={"is_causal": 1}),
    Attn("mask-2d-float", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), mask=(4, 6)),
    Attn("mask-4d-float", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), mask=(2, 3, 4, 6)),
    Attn(
        "mask-3d-heads-bool",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(3, 4, 6),
        bool_mask=True,
    ),
    Attn(
        "mask-4d-bool", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), mask=(2, 1, 4, 6), bool_mask=True
    ),
    # a mask shorter than the keys: the rest is -inf
    Attn(
        "mask-short",
        (1, 2, 3, 8),
        (1, 2, 6, 8),
        (1, 2, 6, 8),
        mask=(3, 4),
        no_ort="onnxruntime 1.32 requires the mask's last dim to be the total sequence length",
    ),
    Attn(
        "mask-causal-float",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(2, 1, 4, 6),
        attrs={"is_causal": 1},
    ),
    Attn(
        "mask-causal-bool",
        (2, 3, 4, 8),
        (2, 3, 4, 8),
        (2, 3, 4, 8),
        mask=(4, 4),
        bool_mask=True,
        attrs={"is_causal": 1},
    ),
    Attn("softcap", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), attrs={"softcap": 1.5}),
    Attn(
        "softcap-mask",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(4, 6),
        attrs={"softcap": 2.0},
    ),
    Attn("past", (2, 3, 4, 8), (2, 3, 4, 8), (2, 3, 4, 8), mask=(4, 9), past=5),
    Attn("past-causal", (2, 3, 4, 8), (2, 3, 4, 8), (2, 3, 4, 8), past=5, attrs={"is_causal": 1}),
    Attn(
        "past-gqa-decode-causal",
        (2, 4, 1, 8),
        (2, 2, 1, 8),
        (2, 2, 1, 8),
        past=7,
        attrs={"is_causal": 1},
    ),
    Attn("3d", (2, 4, 24), (2, 6, 24), (2, 6, 24), attrs=H3),
    Attn(
        "3d-gqa-v-head-size",
        (2, 4, 48),
        (2, 6, 16),
        (2, 6, 20),
        attrs={"q_num_heads": 6, "kv_num_heads": 2},
    ),
    Attn(
        "3d-causal-mask",
        (2, 4, 24),
        (2, 4, 24),
        (2, 4, 24),
        mask=(4, 4),
        attrs={**H3, "is_causal": 1},
    ),
    Attn(
        "3d-past-causal-gqa",
        (2, 3, 32),
        (2, 3, 16),
        (2, 3, 16),
        past=4,
        attrs={"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
    ),
    Attn("qk-mode0", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), mask=(4, 6), qk=True),
    Attn(
        "qk-mode1-softcap",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(4, 6),
        qk=True,
        attrs={"qk_matmul_output_mode": 1, "softcap": 2.0},
    ),
    Attn(
        "qk-mode2-bias",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(4, 6),
        qk=True,
        attrs={"qk_matmul_output_mode": 2, "softcap": 2.0},
    ),
    Attn(
        "qk-mode3-softmax-past",
        (2, 3, 4, 8),
        (2, 3, 4, 8),
        (2, 3, 4, 8),
        mask=(4, 7),
        past=3,
        qk=True,
        attrs={"qk_matmul_output_mode": 3},
    ),
    Attn(
        "qk-mode2-causal-bool",
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        mask=(4, 4),
        bool_mask=True,
        qk=True,
        attrs={"qk_matmul_output_mode": 2, "is_causal": 1},
        no_ort="onnxruntime 1.32 writes the masked scores of mode 2 as the lowest finite float, where the spec's bias is -inf",
    ),
    Attn(
        "softmax-precision-float",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        mask=(4, 6),
        qk=True,
        attrs={"softmax_precision": TensorProto.FLOAT, "qk_matmul_output_mode": 3},
    ),
    Attn("nonpad", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), nonpad=(3, 6), opset=24),
    Attn(
        "nonpad-causal-decode-gqa",
        (2, 4, 1, 8),
        (2, 2, 8, 8),
        (2, 2, 8, 8),
        nonpad=(5, 8),
        opset=24,
        attrs={"is_causal": 1},
    ),
    Attn(
        "nonpad-causal-prefill-mask",
        (2, 2, 3, 8),
        (2, 2, 6, 8),
        (2, 2, 6, 8),
        mask=(2, 1, 3, 6),
        bool_mask=True,
        nonpad=(4, 6),
        opset=24,
        attrs={"is_causal": 1},
    ),
    Attn(
        "window-causal",
        (2, 3, 4, 8),
        (2, 3, 6, 8),
        (2, 3, 6, 8),
        opset=25,
        attrs={"is_causal": 1, "left_window_size": 2},
    ),
    Attn(
        "window-bidirectional",
        (1, 2, 6, 8),
        (1, 2, 6, 8),
        (1, 2, 6, 8),
        opset=25,
        attrs={"left_window_size": 1, "right_window_size": 2},
    ),
    Attn(
        "window-past",
        (2, 2, 3, 8),
        (2, 2, 3, 8),
        (2, 2, 3, 8),
        past=5,
        opset=25,
        attrs={"is_causal": 1, "left_window_size": 3},
    ),
    Attn(
        "window-nonpad-mask",
        (2, 2, 4, 8),
        (2, 2, 8, 8),
        (2, 2, 8, 8),
        mask=(1, 8),
        nonpad=(6, 8),
        opset=25,
        attrs={"is_causal": 1, "left_window_size": 2},
    ),
]
ATTENTION_BY_ID = {c.id: c for c in ATTENTION_CASES}
# a fully masked query row (every key disallowed) yields zeros in Y and in the mode-3 probabilities
FULLY_MASKED = [
    Attn(
        "fully-masked-bool-row",
        (1, 2, 2, 8),
        (1, 2, 2, 8),
        (1, 2, 2, 8),
        mask=(2, 2),
        bool_mask=True,
        qk=True,
        attrs={"qk_matmul_output_mode": 3},
    ),
    # nonpad_kv_seqlen < q length: the leading queries have no key at or before them
    Attn(
        "nonpad-negative-offset",
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        nonpad=(2,),
        opset=24,
        attrs={"is_causal": 1},
    ),
]


def _fully_mask_first_row(c: Attn, feeds: dict[str, np.ndarray | None]) -> None:
    if c.bool_mask:
        mask = feeds["attn_mask"]
        assert mask is not None
        mask[0, :] = False
        mask[1, :] = True


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", ATTENTION_CASES + FULLY_MASKED, ids=lambda c: c.id)
def test_attention_matches_onnx_reference(c: Attn, dtype: str) -> None:
    feeds = c.feeds(dtype)
    _fully_mask_first_row(c, feeds)
    model = c.model(feeds)
    got = run_torch(model, given(feeds))
    assert_outputs_close(
        got, run_reference(model, given(feeds)), REF_TOL[dtype], output_names(model)
    )
    assert np.isfinite(got[0].astype(np.float64)).all()  # fully masked rows are zeros, not NaN


@pytest.mark.parametrize(
    "c",
    [
        ATTENTION_BY_ID[i]
        for i in (
            "4d-causal-cross",
            "mask-causal-float",
            "nonpad",
            "3d-past-causal-gqa",
            "qk-mode3-softmax-past",
        )
    ],
    ids=lambda c: c.id,
)
def test_attention_bfloat16_matches_onnx_reference(c: Attn) -> None:
    """Below an ulp of bfloat16: only a softmax summed in bfloat16, as the reference does, gets there."""
    feeds = c.feeds("bfloat16", seed=1)
    model = c.model(feeds)
    assert_outputs_close(
        run_torch(model, given(feeds)),
        run_reference(model, given(feeds)),
        REF_TOL["bfloat16"],
        output_names(model),
    )


def test_fully_masked_rows_are_zero() -> None:
    c = FULLY_MASKED[0]
    feeds = c.feeds("float32")
    _fully_mask_first_row(c, feeds)
    y, probs = run_torch(c.model(feeds), given(feeds))
    assert np.array_equal(y[:, :, 0], np.zeros_like(y[:, :, 0]))
    assert np.array_equal(probs[:, :, 0], np.zeros_like(probs[:, :, 0]))
    np.testing.assert_allclose(probs[:, :, 1].sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", ATTENTION_CASES, ids=lambda c: c.id)
def test_attention_matches_onnxruntime(c: Attn, dtype: str) -> None:
    if c.no_ort:
        pytest.skip(c.no_ort)
    feeds = c.feeds(dtype, seed=2)
    model = c.model(feeds)
    try:
        expected = run_ort(model, given(feeds))
    except Exception as exc:
        # the sliding windows (left/right_window_size) came after onnxruntime 1.31, the newest onnxruntime-gpu
        if "Unrecognized attribute" not in str(exc):
            raise
        pytest.skip(f"this onnxruntime does not know them: {str(exc).split('Error ')[-1]}")
    assert_outputs_close(run_torch(model, given(feeds)), expected, ORT_TOL[dtype], output_names(model))


def test_attention_qk_mode0_is_the_raw_product_even_with_softcap() -> None:
    """Mode 0 is QK before the softcap, as the spec says and onnxruntime computes (onnx.reference 1.23
    returns the softcapped product for modes 0 and 1 alike)."""
    c = Attn(
        "qk-mode0-softcap",
        (1, 2, 3, 8),
        (1, 2, 5, 8),
        (1, 2, 5, 8),
        qk=True,
        attrs={"softcap": 1.0},
    )
    feeds = c.feeds("float32")
    model = c.model(feeds)
    y, qk = run_torch(model, given(feeds))
    q, k = feeds["Q"].astype(np.float64), feeds["K"].astype(np.float64)  # type: ignore[union-attr]
    np.testing.assert_allclose(qk, q @ k.transpose(0, 1, 3, 2) / math.sqrt(8), rtol=1e-5, atol=1e-6)
    assert np.abs(qk).max() > 1.0  # a softcapped product would stay within (-1, 1)
    assert_outputs_close(
        [y, qk], run_ort(model, given(feeds)), ORT_TOL["float32"], ["Y", "qk_matmul_output"]
    )


def test_attention_oracle_mode_computes_in_float64() -> None:
    """compute_dtype=float64: a float16 model (softmax_precision=float included) runs entirely in float64,
    matching the reference on the same model in double."""
    c = ATTENTION_BY_ID["softmax-precision-float"]
    feeds16 = c.feeds("float16")
    got = run_torch(c.model(feeds16), given(feeds16), compute_dtype=torch.float64)
    assert [g.dtype for g in got] == [np.float64, np.float64]
    feeds64 = {k: None if v is None else v.astype(np.float64) for k, v in feeds16.items()}
    double = Attn(
        c.id,
        c.q,
        c.k,
        c.v,
        c.mask,
        qk=True,
        attrs={**c.attrs, "softmax_precision": TensorProto.DOUBLE},
    )
    expected = run_reference(double.model(feeds64), given(feeds64))
    assert_outputs_close(got, expected, (1e-12, 1e-14), ["Y", "qk_matmul_output"])


@pytest.mark.parametrize(
    "c",
    [ATTENTION_BY_ID[i] for i in ("past-causal", "nonpad-causal-decode-gqa", "window-nonpad-mask")],
    ids=lambda c: c.id,
)
def test_attention_oracle_mode_matches_the_reference_in_double(c: Attn) -> None:
    feeds32 = c.feeds("float32")
    got = run_torch(c.model(feeds32), given(feeds32), compute_dtype=torch.float64)
    feeds64 = {
        k: v.astype(np.float64) if v is not None and v.dtype == np.float32 else v
        for k, v in feeds32.items()
    }
    model64 = c.model(feeds64)
    assert_outputs_close(
        got, run_reference(model64, given(feeds64)), (1e-12, 1e-14), output_names(model64)
    )


def _attention_kernel(opset: int = 23, **attrs: Any) -> attention.Attention:
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs)
    cls = lookup("", "Attention", opset)
    assert cls is not None
    return cls(node, KernelContext(device=CPU, opset=opset))  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"qk_matmul_output_mode": 4}, "qk_matmul_output_mode=4"),
        ({"softmax_precision": TensorProto.INT64}, "softmax_precision=7: not a float type"),
    ],
)
def test_attention_refuses_undefined_variants(attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedVariantError, match=message):
        _attention_kernel(**attrs)


def test_attention_shape_errors_say_what_is_wrong() -> None:
    q, kv = torch.zeros(1, 2, 12), torch.zeros(1, 2, 12)
    with pytest.raises(ValueError, match="needs the q_num_heads and kv_num_heads"):
        _attention_kernel().run(q, kv, kv)
    with pytest.raises(ValueError, match=r"kv heads \(2\) must divide q heads \(3\)"):
        _attention_kernel().run(
            torch.zeros(1, 3, 2, 4), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4)
        )
    with pytest.raises(ValueError, match=r"opset 25\).*must not be set for 4-D"):
        _attention_kernel(25, q_num_heads=2, kv_num_heads=2).run(*(torch.zeros(1, 2, 2, 4),) * 3)
    with pytest.raises(ValueError, match="past_key and past_value must be given together"):
        _attention_kernel().run(*(torch.zeros(1, 2, 2, 4),) * 3, None, torch.zeros(1, 2, 1, 4))


def test_attention_versions() -> None:
    assert lookup("", "Attention", 22) is None
    assert lookup("", "Attention", 23) is attention.Attention
    assert lookup("", "Attention", 24) is attention.Attention
    assert lookup("", "Attention", 25) is attention.Attention25


# -- RotaryEmbedding --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rope:
    id: str
    x: tuple[int, ...]
    cache: tuple[
        int, ...
    ]  # (max_position, dim / 2) with position ids, (batch, seq, dim / 2) without
    positions: bool = True
    attrs: dict[str, Any] = field(default_factory=dict)

    def feeds(self, dtype: str, seed: int = 0) -> dict[str, np.ndarray | None]:
        rng = np.random.default_rng(seed)
        np_type = NP_TYPES[dtype]
        angles = rng.uniform(0, 2 * np.pi, size=self.cache)
        batch, seq = self.x[0], self.x[-2] if len(self.x) == 4 else self.x[1]
        return {
            "input": rng.uniform(-2, 2, size=self.x).astype(np.float32).astype(np_type),
            "cos_cache": np.cos(angles).astype(np.float32).astype(np_type),
            "sin_cache": np.sin(angles).astype(np.float32).astype(np_type),
            "position_ids": rng.integers(0, self.cache[0], size=(batch, seq))
            if self.positions
            else None,
        }

    def model(self, feeds: dict[str, np.ndarray | None]) -> onnx.ModelProto:
        return one_node_model("RotaryEmbedding", feeds, ["output"], 23, **self.attrs)


ROPE_CASES = [
    Rope("4d", (2, 4, 3, 8), (50, 4)),
    Rope("3d-num-heads", (2, 3, 32), (50, 4), attrs={"num_heads": 4}),
    Rope("interleaved", (2, 4, 3, 8), (50, 4), attrs={"interleaved": 1}),
    Rope("partial", (2, 4, 3, 8), (50, 2), attrs={"rotary_embedding_dim": 4}),
    Rope(
        "partial-interleaved-3d",
        (2, 3, 24),
        (20, 2),
        attrs={"rotary_embedding_dim": 4, "interleaved": 1, "num_heads": 2},
    ),
    Rope("no-position-ids", (2, 4, 3, 8), (2, 3, 4), positions=False),
    Rope(
        "no-position-ids-3d-interleaved",
        (2, 3, 16),
        (2, 3, 4),
        positions=False,
        attrs={"num_heads": 2, "interleaved": 1},
    ),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", ROPE_CASES, ids=lambda c: c.id)
def test_rotary_embedding_matches_onnx_reference(c: Rope, dtype: str) -> None:
    feeds = c.feeds(dtype)
    model = c.model(feeds)
    got = run_torch(model, given(feeds))
    # every step rounds in the input's type on both sides: the same bits
    assert_outputs_close(
        got,
        run_reference(model, given(feeds)),
        (0.0, 0.0) if dtype != "float32" else REF_TOL[dtype],
        ["output"],
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", ROPE_CASES, ids=lambda c: c.id)
def test_rotary_embedding_matches_onnxruntime(c: Rope, dtype: str) -> None:
    feeds = c.feeds(dtype, seed=1)
    model = c.model(feeds)
    assert_outputs_close(
        run_torch(model, given(feeds)), run_ort(model, given(feeds)), ORT_TOL[dtype], ["output"]
    )


def test_rotary_embedding_oracle_mode() -> None:
    c = ROPE_CASES[2]
    feeds16 = given(c.feeds("float16"))
    (got,) = run_torch(c.model(feeds16), feeds16, compute_dtype=torch.float64)
    assert got.dtype == np.float64
    feeds64 = {k: v.astype(np.float64) if v.dtype == np.float16 else v for k, v in feeds16.items()}
    np.testing.assert_allclose(got, _rope_float64(feeds64), rtol=1e-14, atol=1e-14)


def _rope_float64(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The interleaved rotation written out in numpy float64 (the reference's RotaryEmbedding takes no double)."""
    x, cos, sin = (
        feeds["input"],
        feeds["cos_cache"][feeds["position_ids"]],
        feeds["sin_cache"][feeds["position_ids"]],
    )
    cos, sin = (
        cos[:, None],
        sin[:, None],
    )  # [batch, 1, seq, dim / 2] against x [batch, heads, seq, head]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = cos * x1 - sin * x2
    out[..., 1::2] = sin * x1 + cos * x2
    return out


def test_rotary_embedding_3d_needs_num_heads() -> None:
    k = lookup("", "RotaryEmbedding", 23)(
        helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"]),
        KernelContext(device=CPU, opset=23),
    )
    with pytest.raises(ValueError, match="needs the num_heads attribute"):
        k.run(torch.zeros(1, 2, 8), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))


# -- RMSNormalization -------------------------------------------------------------------------------

RMS_CASES = [
    ("default-axis", (2, 3, 8), (8,), {}),
    ("axis1", (2, 3, 8), (3, 8), {"axis": 1}),
    ("axis0-epsilon", (3, 5), (3, 5), {"axis": 0, "epsilon": 0.1}),
    ("axis-negative-2", (2, 3, 4, 5), (4, 5), {"axis": -2}),
    ("scale-broadcast", (2, 3, 8), (1, 8), {"axis": -2}),
]


def _rms_feeds(
    x: tuple[int, ...], w: tuple[int, ...], dtype: str, seed: int = 0
) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    np_type = NP_TYPES[dtype]
    return {
        "X": rng.uniform(-3, 3, size=x).astype(np.float32).astype(np_type),
        "scale": rng.uniform(0.5, 1.5, size=w).astype(np.float32).astype(np_type),
    }


def _rms_spec(
    feeds: dict[str, np.ndarray], axis: int, eps: float, stash: type = np.float32
) -> np.ndarray:
    """The spec's function body: in the stash type X / sqrt(mean(X²) + eps), cast to X's type, times scale."""
    x = feeds["X"].astype(stash)
    axes = tuple(range(axis % x.ndim, x.ndim))
    normalized = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + stash(np.float32(eps)))
    return normalized.astype(feeds["X"].dtype) * feeds["scale"]


@pytest.mark.parametrize(("id", "x", "w", "attrs"), RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_rms_normalization_float32_matches_onnx_reference_and_onnxruntime(
    id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    feeds = _rms_feeds(x, w, "float32")
    model = one_node_model("RMSNormalization", feeds, ["Y"], 23, **attrs)
    got = run_torch(model, feeds)  # type: ignore[arg-type]
    assert_outputs_close(got, run_reference(model, feeds), REF_TOL["float32"], ["Y"])  # type: ignore[arg-type]
    assert_outputs_close(got, run_ort(model, feeds), ORT_TOL["float32"], ["Y"])  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("id", "x", "w", "attrs"), RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_rms_normalization_low_precision_follows_the_stash_type(
    id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], dtype: str
) -> None:
    """stash_type=1: normalized in float32 and rounded once, unlike onnx.reference, which squares and
    averages in X's type (a few ulps away: compared loosely)."""
    feeds: dict[str, np.ndarray] = _rms_feeds(x, w, dtype)  # type: ignore[assignment]
    model = one_node_model("RMSNormalization", feeds, ["Y"], 23, **attrs)
    (got,) = run_torch(model, feeds)
    spec = _rms_spec(feeds, attrs.get("axis", -1), attrs.get("epsilon", 1e-5))
    # the products by scale round identically; the float32 part differs by summation order at most
    np.testing.assert_allclose(
        got.astype(np.float64),
        spec.astype(np.float64),
        rtol=2**-7 if dtype == "bfloat16" else 2**-10,
        atol=0,
    )
    (ref,) = run_reference(model, feeds)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=3e-2, atol=3e-2)
    if dtype == "float16":
        (ort_y,) = run_ort(model, feeds)
        np.testing.assert_allclose(
            got.astype(np.float64), ort_y.astype(np.float64), *ORT_TOL["float16"]
        )


def test_rms_normalization_stash_double_and_oracle_mode() -> None:
    feeds: dict[str, np.ndarray] = _rms_feeds((4, 16), (16,), "float32")  # type: ignore[assignment]
    model = one_node_model("RMSNormalization", feeds, ["Y"], 23, stash_type=TensorProto.DOUBLE)
    (got,) = run_torch(model, feeds)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _rms_spec(feeds, -1, 1e-5, np.float64))
    # oracle mode: the default stash type (float) becomes float64 too
    model = one_node_model("RMSNormalization", feeds, ["Y"], 23)
    (wide,) = run_torch(model, feeds, compute_dtype=torch.float64)
    assert wide.dtype == np.float64
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    x = f64["X"]
    np.testing.assert_allclose(
        wide,
        x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(1e-5).item()) * f64["scale"],
        rtol=1e-15,
        atol=0,
    )


def test_rms_normalization_refusals() -> None:
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], stash_type=TensorProto.INT32)
    with pytest.raises(UnsupportedVariantError, match="stash_type=6: not a float type"):
        normalization.RMSNormalization(node, KernelContext(device=CPU, opset=23))
    k = normalization.RMSNormalization(
        helper.make_node("RMSNormalization", ["x", "w"], ["y"]), KernelContext(device=CPU, opset=23)
    )
    with pytest.raises(
        UnsupportedVariantError, match=re.escape("X of torch.float16 and Scale of torch.float32")
    ):
        k.run(torch.ones(2, 4, dtype=torch.float16), torch.ones(4))


# -- Einsum -----------------------------------------------------------------------------------------

EINSUM_CASES = [
    ("transpose", "ij->ji", [(3, 4)]),
    ("sum", "ij->i", [(3, 4)]),
    ("diagonal", "ii->i", [(4, 4)]),
    ("trace-implicit", "ii", [(4, 4)]),
    ("batch-diagonal-spaces", "...ii ->...i", [(3, 5, 5)]),
    ("inner-implicit", "i,i", [(5,), (5,)]),
    ("outer", "i,j->ij", [(3,), (4,)]),
    ("batch-matmul", "bij, bjk -> bik", [(5, 2, 3), (5, 3, 4)]),
    ("broadcast-ellipsis", "...ij,...jk->...ik", [(2, 1, 3, 4), (2, 3, 4, 2)]),
    # implicit output: labels seen once, in ASCII order, so upper case first: "Ca"
    ("implicit-case-order", "ab,bC", [(2, 3), (3, 4)]),
    ("three-operands", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bilinear", "bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("scalar", "->", [()]),
]


def _einsum_feeds(
    shapes: list[tuple[int, ...]], dtype: str, seed: int = 0
) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    if dtype in ("int32", "int64", "uint8"):
        return {f"x{i}": rng.integers(0, 7, size=s).astype(dtype) for i, s in enumerate(shapes)}
    return {
        f"x{i}": np.asarray(rng.uniform(-2, 2, size=s)).astype(np.float32).astype(NP_TYPES[dtype])
        for i, s in enumerate(shapes)
    }


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int32", "uint8"])
@pytest.mark.parametrize(
    ("id", "equation", "shapes"), EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES]
)
def test_einsum_matches_onnx_reference(
    id: str, equation: str, shapes: list[tuple[int, ...]], dtype: str
) -> None:
    feeds = _einsum_feeds(shapes, dtype)
    model = one_node_model("Einsum", feeds, ["y"], 12, equation=equation)
    got = run_torch(model, feeds)  # type: ignore[arg-type]
    expected = run_reference(model, feeds)  # type: ignore[arg-type]
    if dtype.startswith(("int", "uint")):
        assert got[0].dtype == expected[0].dtype
        np.testing.assert_array_equal(got[0], expected[0])
    else:
        # float16 contracts in float32 here, in float16 steps in numpy: an ulp or two apart
        assert_outputs_close(
            got, expected, (2e-3, 2e-3) if dtype == "float16" else REF_TOL[dtype], ["y"]
        )


@pytest.mark.parametrize(("id", "equation", "shapes"), EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_bfloat16_opset28(id: str, equation: str, shapes: list[tuple[int, ...]]) -> None:
    """bfloat16 enters Einsum at opset 28; both sides contract in float32 and round once."""
    feeds = _einsum_feeds(shapes, "bfloat16")
    model = one_node_model("Einsum", feeds, ["y"], 28, equation=equation)
    assert_outputs_close(run_torch(model, feeds), run_reference(model, feeds), (1e-3, 1e-6), ["y"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("id", "equation", "shapes"), EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES]
)
def test_einsum_matches_onnxruntime(id: str, equation: str, shapes: list[tuple[int, ...]]) -> None:
    if id == "implicit-case-order":
        pytest.skip(
            "onnxruntime 1.32 rejects upper-case labels in an implicit-mode equation ('ab,bC')"
        )
    feeds = _einsum_feeds(shapes, "float32", seed=1)
    model = one_node_model("Einsum", feeds, ["y"], 12, equation=equation)
    assert_outputs_close(run_torch(model, feeds), run_ort(model, feeds), (1e-5, 1e-5), ["y"])  # type: ignore[arg-type]


def test_einsum_oracle_mode() -> None:
    feeds = _einsum_feeds([(5, 2, 3), (5, 3, 4)], "float16")
    model = one_node_model("Einsum", feeds, ["y"], 12, equation="bij,bjk->bik")
    (got,) = run_torch(model, feeds, compute_dtype=torch.float64)  # type: ignore[arg-type]
    assert got.dtype == np.float64
    np.testing.assert_allclose(
        got,
        np.einsum("bij,bjk->bik", *(v.astype(np.float64) for v in feeds.values())),
        rtol=1e-15,
        atol=1e-15,
    )  # type: ignore[union-attr]


def test_einsum_operand_count_is_checked() -> None:
    k = matmul.Einsum(
        helper.make_node("Einsum", ["a"], ["y"], equation="ij,jk->ik"),
        KernelContext(device=CPU, opset=12),
    )
    with pytest.raises(ValueError, match="2 operand terms, got 1 inputs"):
        k.run(torch.zeros(2, 3))


# -- the fused Llama builders -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "builder", [models.llama_attention, models.llama_decoder_layer], ids=lambda b: b.__name__
)
def test_fused_llama_matches_the_decomposed_graph(builder: Any, dtype: str) -> None:
    """RMSNormalization/RotaryEmbedding/Attention(softmax_precision=float) compute what the opset-18
    decomposition computes, rounding included; the float64 oracle of both agree to float64 resolution."""
    fused = builder(dtype=dtype, opset=23, fused=True, past=3)
    decomposed = builder(dtype=dtype, opset=23, fused=False, past=3)
    feeds = models.random_feeds(fused, dims={"batch": 2, "seq": 5}, seed=0)
    for compute_dtype, tol in (
        (None, {"float32": 1e-6, "float16": 2e-3, "bfloat16": 2e-2}[dtype]),
        (torch.float64, 1e-13),
    ):
        a = TorchEvaluator(fused, compute_dtype=compute_dtype).run(None, feeds)
        b = TorchEvaluator(decomposed, compute_dtype=compute_dtype).run(None, feeds)
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype
            torch.testing.assert_close(x, y, rtol=tol, atol=tol)


# -- LinearAttention and TensorScatter (the KV-cache write) ------------------------------------------


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize(("q_heads", "kv_heads", "past", "per_dim_decay"), [(2, 2, False, False), (4, 2, True, True)])
def test_linear_attention_matches_onnx_reference(
    rule: str, q_heads: int, kv_heads: int, past: bool, per_dim_decay: bool
) -> None:
    from kernel_harness import check_node
    from kernel_harness import one_node_model as node_model

    rng = np.random.default_rng(3)
    b, t, d_k, d_v = 2, 3, 4, 5
    f = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)  # noqa: E731
    inputs: dict[str, np.ndarray | None] = {
        "q": f(b, t, q_heads * d_k),
        "k": f(b, t, kv_heads * d_k),
        "v": f(b, t, kv_heads * d_v),
        "past": f(b, kv_heads, d_k, d_v) if past else None,
        "decay": (-np.abs(f(b, t, kv_heads * d_k if per_dim_decay else kv_heads)))
        if rule.startswith("gated")
        else None,
        "beta": np.abs(f(b, t, kv_heads)) if "delta" in rule else None,
    }
    model = node_model(
        "LinearAttention", inputs, ["y", "state"], 27,
        q_num_heads=q_heads, kv_num_heads=kv_heads, update_rule=rule,
    )  # fmt: skip
    # opset 27 is newer than onnxruntime 1.32's: onnx.reference alone, which computes in float32 even
    # for float64 inputs (hence the float64 tolerance)
    check_node(
        model, given(inputs), dtypes=("float32", "float64"), reference="onnx",
        tol={"float64": (1e-5, 1e-6)},
    )  # fmt: skip


@pytest.mark.parametrize(("mode", "write"), [("linear", None), ("linear", [0, 2]), ("circular", [3, 5])])
def test_tensor_scatter_writes_the_cache(mode: str, write: list[int] | None) -> None:
    from kernel_harness import check_node
    from kernel_harness import one_node_model as node_model

    rng = np.random.default_rng(4)
    past = rng.uniform(-1, 1, size=(2, 3, 6, 4)).astype(np.float32)
    update = rng.uniform(-1, 1, size=(2, 3, 2, 4)).astype(np.float32)
    inits = {} if write is None else {"w": np.array(write, dtype=np.int64)}
    model = node_model(
        "TensorScatter", {"past": past, "update": update, "w": None}, ["y"], 24, initializers=inits, mode=mode
    )
    check_node(model, {"past": past, "update": update}, dtypes=("float32", "float64"), reference="onnx")
    got = run_torch(model, {"past": past, "update": update})[0]
    start = write or [0, 0]
    for i in range(2):
        for s in range(2):
            np.testing.assert_array_equal(got[i, :, (start[i] + s) % 6], update[i, :, s])
