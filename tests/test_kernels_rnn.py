"""The recurrent kernels (LSTM, GRU, RNN) on one-node models against onnx.reference, onnxruntime and the float64
oracle, every attribute once; and torch.nn.LSTM/GRU exported by the TorchScript exporter against eager torch.

onnx.reference ignores `activations`, `clip`, `sequence_lens` and `input_forget`; onnxruntime's CPU provider
refuses `layout=1` and float64 RNN. Each case is checked against the references that implement it.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from kernel_harness import check_node, given, one_node_model, run_ort, run_reference, run_torch
from onnx import TensorProto, helper
from torch import nn

from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError, lookup

SEQ, BATCH, INPUT, HIDDEN = 4, 3, 3, 5
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
LENS = np.array([4, 0, 2], dtype=np.int32)  # full, empty and partial sequences in one batch


def rnn_feeds(
    op: str,
    directions: int = 1,
    *,
    bias: bool = True,
    lens: np.ndarray | None = None,
    initial: bool = False,
    peepholes: bool = False,
    layout: int = 0,
    seed: int = 0,
) -> dict[str, np.ndarray | None]:
    """Inputs of `op` in the spec's order (None = omitted), weights scaled so the gates are neither
    saturated nor linear."""
    rng = np.random.default_rng(seed)
    g = GATES[op]

    def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    state = (directions, BATCH, HIDDEN) if layout == 0 else (BATCH, directions, HIDDEN)
    feeds: dict[str, np.ndarray | None] = {
        "X": rand(SEQ, BATCH, INPUT) if layout == 0 else rand(BATCH, SEQ, INPUT),
        "W": rand(directions, g * HIDDEN, INPUT, scale=0.6),
        "R": rand(directions, g * HIDDEN, HIDDEN, scale=0.6),
        "B": rand(directions, 2 * g * HIDDEN, scale=0.5) if bias else None,
        "sequence_lens": lens,
        "initial_h": rand(*state) if initial else None,
    }
    if op == "LSTM":
        feeds["initial_c"] = rand(*state) if initial else None
        feeds["P"] = rand(directions, 3 * HIDDEN) if peepholes else None
    return feeds


def rnn_model(
    op: str,
    feeds: Mapping[str, np.ndarray | None],
    *,
    opset: int = 14,
    outputs: list[str] | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    return one_node_model(op, feeds, outputs or OUTPUTS[op], opset, hidden_size=HIDDEN, **attrs)


# -- directions, initial states, bias, peepholes, linear_before_reset: every reference, every dtype ---------

CASES = [
    # (op, direction, feeds options, attributes)
    ("LSTM", "forward", {"bias": False}, {}),
    ("LSTM", "reverse", {"initial": True}, {}),
    ("LSTM", "bidirectional", {"initial": True, "peepholes": True}, {}),
    ("GRU", "forward", {"bias": False}, {}),
    ("GRU", "reverse", {"initial": True}, {"linear_before_reset": 1}),
    ("GRU", "bidirectional", {"initial": True}, {"linear_before_reset": 0}),
    ("RNN", "forward", {"bias": False}, {}),
    ("RNN", "reverse", {"initial": True}, {}),
    ("RNN", "bidirectional", {"initial": True}, {}),
]


@pytest.mark.parametrize(("op", "direction", "options", "attrs"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_directions(op: str, direction: str, options: dict[str, Any], attrs: dict[str, Any]) -> None:
    feeds = rnn_feeds(op, 2 if direction == "bidirectional" else 1, **options)
    model = rnn_model(op, feeds, direction=direction, **attrs)
    # onnxruntime's CPU provider has no float64 RNN: the float64 oracle is checked against onnx.reference.
    # Its float16 is float32 inside, rounded once, as here: a float16 ulp apart at most.
    check_node(model, given(feeds), tol={"float16": (1e-3, 1e-4)})


# -- what onnx.reference ignores: onnxruntime (float32, float16) and the oracle against it ----------------


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_sequence_lens(op: str) -> None:
    """Unequal lengths, an empty sequence among them, both directions: Y zero past each length, Y_h (Y_c)
    the state at the last valid step (zero for the empty sequence)."""
    feeds = rnn_feeds(op, 2, lens=LENS, initial=True, peepholes=True)
    attrs: dict[str, Any] = {"linear_before_reset": 1} if op == "GRU" else {}
    model = rnn_model(op, feeds, direction="bidirectional", **attrs)
    check_node(model, given(feeds), reference="ort")
    y = run_torch(model, given(feeds))[0]
    assert not y[:, :, 1].any() and not y[2:, :, 2].any() and y[:, :, 0].all() and y[:2, :, 2].all()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_clip(op: str) -> None:
    feeds = rnn_feeds(op)
    model = rnn_model(op, feeds, clip=0.4)
    check_node(model, given(feeds), reference="ort")
    unclipped = run_torch(rnn_model(op, feeds), given(feeds))
    assert np.abs(run_torch(model, given(feeds))[0] - unclipped[0]).max() > 0.05  # the clip bit


def test_lstm_input_forget_with_peepholes() -> None:
    feeds = rnn_feeds("LSTM", peepholes=True, initial=True)
    check_node(rnn_model("LSTM", feeds, input_forget=1), given(feeds), reference="ort")


ACTIVATIONS = [
    # every activation of the spec at least once, the alpha/beta lists consumed in order by the activations
    # that take a value; different functions per direction
    ("LSTM", "bidirectional", ["HardSigmoid", "LeakyRelu", "Elu", "Sigmoid", "Affine", "ScaledTanh"], [0.3, 0.2, 0.7, 0.5, 1.5], [0.4, 0.1, 0.8]),
    ("GRU", "bidirectional", ["Sigmoid", "ThresholdedRelu", "HardSigmoid", "Softsign"], [0.2, 0.3], [0.45]),
    ("RNN", "bidirectional", ["Softplus", "Relu"], [], []),
    ("RNN", "forward", ["ScaledTanh"], [0.8], [1.3]),
]


@pytest.mark.parametrize(("op", "direction", "names", "alpha", "beta"), ACTIVATIONS, ids=[f"{a[0]}-{'-'.join(a[2])}" for a in ACTIVATIONS])
def test_activations(op: str, direction: str, names: list[str], alpha: list[float], beta: list[float]) -> None:
    feeds = rnn_feeds(op, 2 if direction == "bidirectional" else 1, initial=True)
    attrs: dict[str, Any] = {"activations": names}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check_node(rnn_model(op, feeds, direction=direction, **attrs), given(feeds), reference="ort")


def test_activation_defaults_are_the_operators() -> None:
    """A missing alpha/beta is the ONNX operator's default (the spec's words). onnxruntime agrees for
    LeakyRelu/HardSigmoid/Elu but uses 0 for ThresholdedRelu (operator: 1) and Affine (operator: 1, 0)."""
    feeds = rnn_feeds("LSTM")
    names = ["HardSigmoid", "ThresholdedRelu", "Affine"]
    ours = run_torch(rnn_model("LSTM", feeds, activations=names), given(feeds))
    spelled_out = rnn_model("LSTM", feeds, activations=names, activation_alpha=[0.2, 1.0, 1.0], activation_beta=[0.5, 0.0])
    for got, expected in zip(ours, run_ort(spelled_out, given(feeds)), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    leaky = rnn_model("RNN", rnn_feeds("RNN"), activations=["LeakyRelu"])
    np.testing.assert_allclose(run_torch(leaky, given(rnn_feeds("RNN")))[0], run_ort(leaky, given(rnn_feeds("RNN")))[0], rtol=1e-5, atol=1e-6)


# -- layout=1 (onnxruntime refuses it), outputs omitted, bfloat16, old opsets -------------------------------


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_batch_first(op: str) -> None:
    feeds = rnn_feeds(op, 2, initial=True, layout=1)
    check_node(rnn_model(op, feeds, direction="bidirectional", layout=1), given(feeds), dtypes=("float32", "float64"), reference="onnx")
    # with sequence lengths (which onnx.reference ignores): the layout-0 run, transposed
    feeds1 = {**feeds, "sequence_lens": LENS}  # in its place among the inputs
    feeds0 = {k: v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") and v is not None else v for k, v in feeds1.items()}
    batch_first = run_torch(rnn_model(op, feeds1, direction="bidirectional", layout=1), given(feeds1))
    seq_first = run_torch(rnn_model(op, feeds0, direction="bidirectional"), given(feeds0))
    np.testing.assert_array_equal(batch_first[0], seq_first[0].transpose(2, 0, 1, 3))
    for a, b in zip(batch_first[1:], seq_first[1:], strict=True):
        np.testing.assert_array_equal(a, b.transpose(1, 0, 2))


@pytest.mark.parametrize(
    ("op", "outputs"),
    [("LSTM", ["", "", "Y_c"]), ("LSTM", ["Y"]), ("GRU", ["", "Y_h"]), ("RNN", ["Y"])],
    ids=["LSTM-Y_c", "LSTM-Y", "GRU-Y_h", "RNN-Y"],
)
def test_omitted_outputs(op: str, outputs: list[str]) -> None:
    feeds = rnn_feeds(op, initial=True)
    check_node(rnn_model(op, feeds, outputs=outputs), given(feeds), dtypes=("float32", "float64"))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_bfloat16_is_float32_rounded_once(op: str) -> None:
    """Opset 22 admits bfloat16 (onnxruntime has no kernel for it): computed in float32, rounded at the end."""
    feeds = given(rnn_feeds(op, 2, lens=LENS, initial=True))
    model = rnn_model(op, feeds, opset=22, direction="bidirectional")
    bf16 = onnx.ModelProto()
    bf16.CopyFrom(model)
    for vi in [*bf16.graph.input, *bf16.graph.output]:
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = TorchEvaluator(bf16).run(None, {k: torch.from_numpy(v).to(torch.bfloat16) if v.dtype == np.float32 else torch.from_numpy(v) for k, v in rounded.items()})
    expected = run_torch(model, rounded)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.bfloat16
        np.testing.assert_array_equal(g.float().numpy(), torch.from_numpy(e).to(torch.bfloat16).float().numpy())


def test_versions_registered_where_the_spec_changed() -> None:
    versions = {"LSTM": [1, 7, 14, 22], "GRU": [1, 3, 7, 14, 22], "RNN": [1, 7, 14, 22]}
    for op, since in versions.items():
        assert [lookup("", op, v).since for v in since] == since  # type: ignore[union-attr]
        assert lookup("", op, 13).since == 7  # type: ignore[union-attr]


@pytest.mark.parametrize(("op", "opset"), [("GRU", 1), ("GRU", 3), ("LSTM", 7), ("RNN", 7)])
def test_old_opsets(op: str, opset: int) -> None:
    """GRU-1 has no linear_before_reset, GRU-3 has it; before 14 no layout. onnxruntime starts at opset 7."""
    feeds = rnn_feeds(op, initial=True)
    attrs: dict[str, Any] = {"linear_before_reset": 1} if (op, opset) == ("GRU", 3) else {}
    if opset < 7:
        # ONNX's shape inference types no output of GRU-1/GRU-3: the outputs are typed here
        present = given(feeds)
        node = helper.make_node(op, [n if n in present else "" for n in feeds], ["Y", "Y_h"], hidden_size=HIDDEN, **attrs)
        graph = helper.make_graph(
            [node],
            op,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in present.items()],
            [
                helper.make_tensor_value_info("Y", TensorProto.FLOAT, [SEQ, 1, BATCH, HIDDEN]),
                helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, BATCH, HIDDEN]),
            ],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        onnx.checker.check_model(model)
    else:
        model = rnn_model(op, feeds, opset=opset, **attrs)
    got = run_torch(model, given(feeds))
    for g, e in zip(got, run_reference(model, given(feeds)), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    if opset >= 7:
        for g, e in zip(got, run_ort(model, given(feeds)), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("attrs", "lens", "error", "match"),
    [
        ({"activations": ["Sigmoid", "Tanh", "Swish"]}, None, UnsupportedVariantError, "activation 'Swish'.*Relu, Tanh"),
        ({"activations": ["Sigmoid", "Tanh", "ScaledTanh"]}, None, UnsupportedVariantError, "ScaledTanh.*explicitly"),
        ({"clip": -1.0}, None, UnsupportedVariantError, "clip=-1.0.*positive"),
        ({"activations": ["Sigmoid", "Tanh"]}, None, ValueError, "takes 3 activations"),
        # raised while running: the evaluator names the node and its inputs around the kernel's message
        ({}, np.array([4, 5, 1], dtype=np.int32), RuntimeError, r"sequence_lens must lie in \[0, 4\]"),
    ],
    ids=["unknown-activation", "scaledtanh-no-default", "clip", "activation-count", "lens-range"],
)
def test_errors_name_the_problem(attrs: dict[str, Any], lens: np.ndarray | None, error: type[Exception], match: str) -> None:
    feeds = rnn_feeds("LSTM", lens=lens)
    with pytest.raises(error, match=match):
        run_torch(rnn_model("LSTM", feeds, **attrs), given(feeds))


# -- real exports: torch.nn.LSTM / GRU through the TorchScript exporter (ONNX LSTM/GRU nodes) ---------------


@pytest.fixture(scope="module", params=["LSTM", "GRU"])
def exported(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, torch.Tensor, list[torch.Tensor]]:
    """A 2-layer bidirectional batch-first nn.LSTM/nn.GRU, its eager outputs (y, h_n[, c_n]) and its export."""
    torch.manual_seed(0)
    module = getattr(nn, request.param)(5, 4, num_layers=2, bidirectional=True, batch_first=True).eval()
    x = torch.randn(2, 3, 5)
    with torch.no_grad():
        y, state = module(x)
    eager = [y, *(state if isinstance(state, tuple) else (state,))]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation notes
        torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=18)  # type: ignore[arg-type]
    model = onnx.load_from_string(buf.getvalue())
    assert sum(n.op_type == request.param for n in model.graph.node) == 2  # one node per layer
    return model, x, eager


def test_real_export_matches_eager_and_onnxruntime(exported: tuple[onnx.ModelProto, torch.Tensor, list[torch.Tensor]]) -> None:
    model, x, eager = exported
    name = model.graph.input[0].name
    ours = TorchEvaluator(model).run(None, {name: x})
    ort = run_ort(model, {name: x.numpy()})
    oracle = TorchEvaluator(model, compute_dtype=torch.float64).run(None, {name: x})
    assert len(ours) == len(eager)
    for got, e, o, wide in zip(ours, eager, ort, oracle, strict=True):
        scale = float(e.abs().max())
        assert got.shape == e.shape
        assert float((got - e).abs().max()) <= 1e-5 * scale
        assert float(np.abs(got.numpy() - o).max()) <= 1e-5 * scale
        assert float((wide - e.double()).abs().max()) <= 1e-5 * scale


def test_initial_state_is_not_broadcast_over_directions() -> None:
    feeds = rnn_feeds("GRU", 2)
    feeds["initial_h"] = np.zeros((1, BATCH, HIDDEN), dtype=np.float32)
    with pytest.raises(RuntimeError, match=r"initial states must have shape \(2, 3, 5\)"):
        run_torch(rnn_model("GRU", feeds, direction="bidirectional"), given(feeds))
