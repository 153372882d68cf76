"""If, Loop and Scan in the torch evaluator: their bodies run by the same evaluator (outer-scope values,
loop-carried values, scan outputs), overrides and intermediates inside bodies, and real exports
(torch.cond through the dynamo exporter, a scripted Python loop through the TorchScript exporter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import real_models
import torch
from kernel_harness import (
    REF_TOL,
    assert_outputs_close,
    output_names,
    run_ort,
    run_reference,
    run_torch,
)
from onnx import TensorProto as TP
from onnx import numpy_helper

from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import controlflow  # noqa: F401  (registers If/Loop/Scan until kernels/__init__ does)
from pytest_ortdiff.runtimes.ort_kernel import OrtKernel

NP: dict[int, Any] = {TP.FLOAT: np.float32, TP.FLOAT16: np.float16, TP.DOUBLE: np.float64}
Build = Callable[[int], onnx.ModelProto]


def vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def const(name: str, value: float, elem: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=NP[elem]), name)


def model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 18) -> onnx.ModelProto:
    m = oh.make_model(oh.make_graph(nodes, "g", inputs, outputs, inits or []), opset_imports=[oh.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(m, full_check=True)
    return m


def cast(feeds: dict[str, np.ndarray], elem: int) -> dict[str, np.ndarray]:
    return {k: v.astype(NP[elem]) if v.dtype == np.float32 else v for k, v in feeds.items()}


def agree(build: Build, feeds: dict[str, np.ndarray], *, reference: bool = True) -> list[np.ndarray]:
    """The evaluator on the model built in float32, float16 and (the oracle) float64 against onnxruntime
    and, where `reference`, onnx.reference; returns the float32 outputs."""
    m32 = build(TP.FLOAT)
    names = output_names(m32)
    got = run_torch(m32, feeds)
    assert_outputs_close(got, run_ort(m32, feeds), REF_TOL["float32"], names)
    if reference:
        assert_outputs_close(got, run_reference(m32, feeds), REF_TOL["float32"], names)
    # the oracle computes every body in float64 (body initializers included): it is the float64 model
    oracle = run_torch(m32, feeds, compute_dtype=torch.float64)
    m64, f64 = build(TP.DOUBLE), cast(feeds, TP.DOUBLE)
    expected64 = run_reference(m64, f64) if reference else run_ort(m64, f64)
    assert_outputs_close(oracle, expected64, REF_TOL["float64"], names)
    m16, f16 = build(TP.FLOAT16), cast(feeds, TP.FLOAT16)
    assert_outputs_close(run_torch(m16, f16), run_ort(m16, f16), REF_TOL["float16"], names)
    return got


RNG = np.random.default_rng(0)


# -- If ---------------------------------------------------------------------------------------------


def if_model(elem: int) -> onnx.ModelProto:
    """y = sum(x) > 0 ? x * a + (b > 0 ? x + b : x - b) : x - a; a, b and x come from the main graph, two
    scopes up for the nested If."""
    inner_then = oh.make_graph([oh.make_node("Add", ["x", "b"], ["u_then"], name="inner_add")], "inner_then", [], [vi("u_then", elem, [3, 4])])
    inner_else = oh.make_graph([oh.make_node("Sub", ["x", "b"], ["u_else"], name="inner_sub")], "inner_else", [], [vi("u_else", elem, [3, 4])])
    then = oh.make_graph(
        [
            oh.make_node("Mul", ["x", "a"], ["t1"], name="then_mul"),
            oh.make_node("Greater", ["b", "zero"], ["c2"], name="then_greater"),
            oh.make_node("If", ["c2"], ["u"], then_branch=inner_then, else_branch=inner_else, name="inner_if"),
            oh.make_node("Add", ["t1", "u"], ["y_then"], name="then_add"),
        ],
        "then",
        [],
        [vi("y_then", elem, [3, 4])],
    )
    other = oh.make_graph([oh.make_node("Sub", ["x", "a"], ["y_else"], name="else_sub")], "else", [], [vi("y_else", elem, [3, 4])])
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        oh.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
        oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="outer_if"),
    ]
    return model(nodes, [vi("x", elem, [3, 4]), vi("a", elem, [4]), vi("b", elem, [])], [vi("y", elem, [3, 4])], [const("zero", 0.0, elem)])


@pytest.mark.parametrize(("x_sign", "b"), [(1, 0.5), (1, -0.5), (-1, 0.5)], ids=["then-then", "then-else", "else"])
def test_if_with_outer_scope_values_and_a_nested_if(x_sign: int, b: float) -> None:
    x = (np.abs(RNG.standard_normal((3, 4))) * x_sign).astype(np.float32)
    feeds = {"x": x, "a": RNG.standard_normal(4).astype(np.float32), "b": np.array(b, np.float32)}
    (y,) = agree(if_model, feeds)
    a = feeds["a"]
    expected = x * a + (x + b if b > 0 else x - b) if x_sign > 0 else x - a
    np.testing.assert_allclose(y, expected, rtol=1e-6)


# -- Loop -------------------------------------------------------------------------------------------


def loop_model(elem: int, m: bool = True, cond: bool = True, act: str = "Tanh") -> onnx.ModelProto:
    """h <- act(h * 0.5 + w) + i / 8 (w from the main graph, i the iteration number) while i < 4 (the
    body's cond) and i < M; scan output: the row sums of each iteration's h."""
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["h_in", "half"], ["t"], name="body_mul"),
            oh.make_node("Add", ["t", "w"], ["u"], name="body_add_w"),
            oh.make_node(act, ["u"], ["v"], name="body_act"),
            oh.make_node("Cast", ["i"], ["fi"], to=elem, name="body_cast"),
            oh.make_node("Mul", ["fi", "eighth"], ["di"], name="body_scale_i"),
            oh.make_node("Add", ["v", "di"], ["h_out"], name="body_add_i"),
            oh.make_node("Less", ["i", "four"], ["c_out"], name="body_less"),
            oh.make_node("ReduceSum", ["h_out", "axis1"], ["row_sums"], keepdims=0, name="body_sum"),
        ],
        "body",
        [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("h_in", elem, [2, 3])],
        [vi("c_out", TP.BOOL, []), vi("h_out", elem, [2, 3]), vi("row_sums", elem, [2])],
        [const("half", 0.5, elem), const("eighth", 0.125, elem), numpy_helper.from_array(np.array(4, np.int64), "four"), numpy_helper.from_array(np.array([1], np.int64), "axis1")],
    )
    node = oh.make_node("Loop", ["M" if m else "", "c0" if cond else "", "x"], ["h_final", "sums"], body=body, name="loop")
    inputs = [vi("x", elem, [2, 3]), vi("w", elem, [3])]
    if m:
        inputs.append(vi("M", TP.INT64, []))
    if cond:
        inputs.append(vi("c0", TP.BOOL, []))
    return model([node], inputs, [vi("h_final", elem, [2, 3]), vi("sums", elem, ["n", 2])])


def loop_feeds(m: int | None = 3, cond: bool | None = True) -> dict[str, np.ndarray]:
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32), "w": RNG.standard_normal(3).astype(np.float32)}
    if m is not None:
        feeds["M"] = np.array(m, np.int64)
    if cond is not None:
        feeds["c0"] = np.array(cond)
    return feeds


@pytest.mark.parametrize(
    ("m", "cond", "trips"),
    [(3, None, 3), (None, True, 5), (7, True, 5), (7, False, 0)],
    ids=["M-only", "cond-only", "both", "cond-false-no-trip"],
)
def test_loop(m: int | None, cond: bool | None, trips: int) -> None:
    feeds = loop_feeds(m, cond)
    # onnx.reference runs no iteration without a cond input (`while None`) and cannot stack zero scan
    # outputs (np.vstack([])): onnxruntime is the reference there
    reference = cond is not None and trips > 0
    h, sums = agree(lambda elem: loop_model(elem, m is not None, cond is not None), feeds, reference=reference)
    assert sums.shape == (trips, 2)
    expected = feeds["x"].astype(np.float64)
    for i in range(trips):
        expected = np.tanh(expected * 0.5 + feeds["w"]) + i / 8
    np.testing.assert_allclose(h, expected, rtol=1e-5, atol=1e-6)


def test_loop_neither_m_nor_cond_ends_on_the_body_cond() -> None:
    """Without M and cond the body's cond output still ends the loop, as in onnxruntime (the spec's table
    says it is ignored: that loop would never end)."""
    feeds = loop_feeds(None, None)
    m = loop_model(TP.FLOAT, m=False, cond=False)
    got = run_torch(m, feeds)
    assert got[1].shape == (5, 2)
    assert_outputs_close(got, run_ort(m, feeds), REF_TOL["float32"], output_names(m))


# -- Scan -------------------------------------------------------------------------------------------


def scan_model(elem: int) -> onnx.ModelProto:
    """s <- s + x1[t] * x2[:, L-1-t] (x1 scanned on axis 0, x2 on axis 1 from the end); scan outputs
    s * w (w from the main graph) stacked on axis 1 in reverse, and x1[t] - x2[:, L-1-t] on axis 0."""
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["a", "b"], ["p"], name="scan_mul"),
            oh.make_node("Add", ["s_in", "p"], ["s_out"], name="scan_add"),
            oh.make_node("Mul", ["s_out", "w"], ["y1"], name="scan_scale"),
            oh.make_node("Sub", ["a", "b"], ["y2"], name="scan_sub"),
        ],
        "scan_body",
        [vi("s_in", elem, [3]), vi("a", elem, [3]), vi("b", elem, [3])],
        [vi("s_out", elem, [3]), vi("y1", elem, [3]), vi("y2", elem, [3])],
    )
    node = oh.make_node(
        "Scan",
        ["s0", "x1", "x2"],
        ["s_final", "ys1", "ys2"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, -1],
        scan_input_directions=[0, 1],
        scan_output_axes=[1, 0],
        scan_output_directions=[1, 0],
        name="scan",
    )
    return model(
        [node],
        [vi("s0", elem, [3]), vi("x1", elem, [4, 3]), vi("x2", elem, [3, 4]), vi("w", elem, [3])],
        [vi("s_final", elem, [3]), vi("ys1", elem, [3, 4]), vi("ys2", elem, [4, 3])],
    )


def test_scan_with_axes_and_directions() -> None:
    feeds = {k: RNG.standard_normal(s).astype(np.float32) for k, s in (("s0", 3), ("x1", (4, 3)), ("x2", (3, 4)), ("w", 3))}
    # onnx.reference's Scan implements axis 0 and forward directions only: onnxruntime is the reference
    s, ys1, ys2 = agree(scan_model, feeds, reference=False)
    x1, x2 = feeds["x1"].astype(np.float64), feeds["x2"].astype(np.float64)
    state, y1 = feeds["s0"].astype(np.float64), []
    for t in range(4):
        state = state + x1[t] * x2[:, 3 - t]
        y1.append(state * feeds["w"])
        np.testing.assert_allclose(ys2[t], x1[t] - x2[:, 3 - t], rtol=1e-6)
    np.testing.assert_allclose(s, state, rtol=1e-5)
    np.testing.assert_allclose(ys1, np.stack(y1[::-1], axis=1), rtol=1e-5)


def scan8_model(elem: int) -> onnx.ModelProto:
    body = oh.make_graph(
        [oh.make_node("Add", ["s_in", "x_t"], ["s_out"], name="scan8_add"), oh.make_node("Identity", ["s_out"], ["y"], name="scan8_id")],
        "scan8_body",
        [vi("s_in", elem, [2]), vi("x_t", elem, [2])],
        [vi("s_out", elem, [2]), vi("y", elem, [2])],
    )
    node = oh.make_node("Scan", ["lens", "s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1, directions=[1], name="scan8")
    return model([node], [vi("lens", TP.INT64, [2]), vi("s0", elem, [2, 2]), vi("x", elem, [2, 3, 2])], [vi("s_final", elem, [2, 2]), vi("ys", elem, [2, 3, 2])], opset=8)


def test_scan8_batched_with_sequence_lens_and_reverse_direction() -> None:
    feeds: dict[str, Any] = {"lens": np.array([3, 2], np.int64), "s0": RNG.standard_normal((2, 2)).astype(np.float32), "x": RNG.standard_normal((2, 3, 2)).astype(np.float32)}
    m = scan8_model(TP.FLOAT)
    s, ys = run_torch(m, feeds)
    assert_outputs_close([s, ys], run_ort(m, feeds), REF_TOL["float32"], output_names(m))
    # batch entry 1 runs 2 steps, from position 1 back to 0; its third output row is padding
    x = feeds["x"]
    np.testing.assert_allclose(ys[1], [feeds["s0"][1] + x[1, 1], feeds["s0"][1] + x[1, 1] + x[1, 0], [0, 0]], rtol=1e-6)


# -- overrides and intermediates inside bodies ------------------------------------------------------


@pytest.fixture(scope="module")
def loop_case() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    feeds = loop_feeds(3, True)
    m = loop_model(TP.FLOAT)
    return m, feeds, run_ort(m, feeds)


@pytest.mark.parametrize(
    "key",
    ["body_act", ("", "Tanh"), lambda node: node.op_type == "Tanh"],
    ids=["node-name", "op-type", "predicate"],
)
def test_a_planted_callable_inside_a_loop_body_changes_the_output(loop_case: tuple, key: object) -> None:
    m, feeds, _ = loop_case
    got = run_torch(m, feeds, kernels={key: torch.sigmoid})
    # exactly the model with Sigmoid in the body, as onnxruntime computes it
    sig = loop_model(TP.FLOAT, act="Sigmoid")
    assert_outputs_close(got, run_ort(sig, feeds), REF_TOL["float32"], output_names(m))
    assert not np.allclose(got[0], run_torch(m, feeds)[0], atol=1e-2)


def test_ort_override_of_a_body_node_runs_that_node_on_onnxruntime(loop_case: tuple) -> None:
    m, feeds, ort_out = loop_case
    ev = TorchEvaluator(m, kernels={"body_act": "ort"})
    kinds = {node.name: type(k) for node, k, _ in ev.iter_kernels()}
    assert kinds["body_act"] is OrtKernel and kinds["body_mul"] is not OrtKernel
    got = [t.numpy() for t in ev.run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})]
    assert_outputs_close(got, ort_out, REF_TOL["float32"], output_names(m))


def test_ort_on_the_loop_node_runs_its_whole_body_on_onnxruntime(loop_case: tuple) -> None:
    m, feeds, ort_out = loop_case
    ev = TorchEvaluator(m, kernels={"loop": "ort"})
    body = [(node.name, type(k)) for node, k, _ in ev.iter_kernels() if node.name != "loop"]
    assert len(body) == 8 and all(k is OrtKernel for _, k in body)
    got = [t.numpy() for t in ev.run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})]
    assert_outputs_close(got, ort_out, REF_TOL["float32"], output_names(m))


def test_float64_override_of_a_body_node_keeps_its_declared_dtype(loop_case: tuple) -> None:
    feeds = loop_case[1]
    m16, f16 = loop_model(TP.FLOAT16), cast(feeds, TP.FLOAT16)
    values = TorchEvaluator(m16, kernels={"body_act": "float64"}).run(None, {k: torch.from_numpy(v) for k, v in f16.items()}, intermediates=True)
    assert values["v"].dtype == torch.float16 and values["h_final"].dtype == torch.float16
    assert torch.equal(values["v"], torch.tanh(values["u"].double()).half())


def test_intermediates_hold_the_body_values_of_the_last_iteration(loop_case: tuple) -> None:
    m, feeds, _ = loop_case
    values = TorchEvaluator(m).run(None, {k: torch.from_numpy(v) for k, v in feeds.items()}, intermediates=True)
    assert {"t", "u", "v", "fi", "h_out", "row_sums", "i", "h_in"} <= set(values)
    assert values["i"].item() == 2  # M = 3
    assert torch.equal(values["h_out"], values["h_final"])
    assert torch.equal(values["row_sums"], values["sums"][-1])
    assert torch.equal(values["t"], values["h_in"] * 0.5)
    # the plain run gives the same outputs
    plain = run_torch(m, feeds)
    np.testing.assert_array_equal(values["sums"].numpy(), plain[1])


def test_intermediates_of_if_hold_the_branch_taken() -> None:
    m = if_model(TP.FLOAT)
    feeds = {"x": torch.ones(3, 4), "a": torch.full((4,), 2.0), "b": torch.tensor(-1.0)}
    values = TorchEvaluator(m).run(None, feeds, intermediates=True)
    assert torch.equal(values["t1"], torch.full((3, 4), 2.0))
    assert torch.equal(values["u_else"], torch.full((3, 4), 2.0))  # the nested If took its else branch
    assert "u_then" not in values and "y_else" not in values


def test_a_failing_body_node_is_named_with_where_it_sits(loop_case: tuple) -> None:
    m, feeds, _ = loop_case

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("planted")

    with pytest.raises(RuntimeError, match=r"failed on node 'body_act' \(Tanh\) with inputs u: float32\[2, 3\]: planted \(inside Loop node 'loop'\)$") as info:
        run_torch(m, feeds, kernels={"body_act": broken})
    assert isinstance(info.value.__cause__, ValueError)


# -- real exports -------------------------------------------------------------------------------------


# The modules and their exports come from tests/real_models.py (the real-export catalogue): torch.cond
# through the dynamo exporter (-> If), a scripted data-dependent Python loop with a branch inside through
# the TorchScript exporter (-> Loop with an If in its body).


@pytest.fixture(scope="module")
def cond_export() -> onnx.ModelProto:
    return real_models.export("control_cond", "dynamo")


@pytest.fixture(scope="module")
def loop_export() -> onnx.ModelProto:
    return real_models.export("control_loop", "torchscript")


def _agrees_with_eager_and_onnxruntime(exported: onnx.ModelProto, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    feeds = dict(zip([i.name for i in exported.graph.input], args, strict=True))
    (got,) = TorchEvaluator(exported).run(None, feeds)
    with torch.no_grad():  # eager torch.cond on a module with parameters warns about .grad otherwise
        eager = module(*args)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    (ort,) = run_ort(exported, {k: v.numpy() for k, v in feeds.items()})
    np.testing.assert_allclose(got.numpy(), ort, rtol=1e-5, atol=1e-5)


def test_torch_cond_exported_by_dynamo_runs_as_if(cond_export: onnx.ModelProto) -> None:
    assert "If" in [n.op_type for n in cond_export.graph.node]
    spec = real_models.MODELS["control_cond"]
    for args in spec.all_inputs(torch.float32):  # x and -x: both branches
        _agrees_with_eager_and_onnxruntime(cond_export, spec.module(), args)


def test_scripted_python_loop_exported_by_torchscript_runs_as_loop(loop_export: onnx.ModelProto) -> None:
    assert "Loop" in [n.op_type for n in loop_export.graph.node]
    spec = real_models.MODELS["control_loop"]
    for args in spec.all_inputs(torch.float32):  # 5, 0 and 1 trips
        _agrees_with_eager_and_onnxruntime(loop_export, spec.module(), args)
