"""precision (convert_half, keep_float32, audit, the command) on graphs beyond a plain chain: If and Loop
bodies that read the main graph's values, a graph that lists one output twice, a node onnxruntime has no
float16 kernel for, and feeds for which every output is empty."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from onnx import numpy_helper

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.analyses.precision import keep_float32
from pytest_ortdiff.analyses.precision.keep import (
    OP_TYPE_BLOCK_LIST,
    _default_op_block_list,
    convert_half,
)
from pytest_ortdiff.runtimes.ort import OrtRunner

F = onnx.TensorProto.FLOAT


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _model(graph: onnx.GraphProto, *extra: onnx.OperatorSetIdProto) -> onnx.ModelProto:
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), *extra])
    model.ir_version = 9
    return model


def if_model() -> onnx.ModelProto:
    """x: f32[2,4] -> ReduceSum -> Greater(0) -> If, its branches (Relu / Neg) reading the main graph's x."""
    then = oh.make_graph([oh.make_node("Relu", ["x"], ["t"])], "then", [], [oh.make_tensor_value_info("t", F, (2, 4))])
    other = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [], [oh.make_tensor_value_info("e", F, (2, 4))])
    graph = oh.make_graph(
        [
            oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            oh.make_node("Greater", ["s", "z"], ["c"]),
            oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        ],
        "g",
        [oh.make_tensor_value_info("x", F, (2, 4))],
        [oh.make_tensor_value_info("y", F, (2, 4))],
        initializer=[numpy_helper.from_array(np.array(0, np.float32), "z")],
    )
    return _model(graph)


def loop_model() -> onnx.ModelProto:
    """Loop x3 of v * 2 (a float32 value carried through the body)."""
    body = oh.make_graph(
        [oh.make_node("Identity", ["cond_in"], ["cond_out"]), oh.make_node("Mul", ["v_in", "two"], ["v_out"])],
        "body",
        [
            oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            oh.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("v_in", F, (2, 4)),
        ],
        [oh.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("v_out", F, (2, 4))],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["M", "c0", "x"], ["y"], body=body)],
        "g",
        [oh.make_tensor_value_info("x", F, (2, 4))],
        [oh.make_tensor_value_info("y", F, (2, 4))],
        initializer=[
            numpy_helper.from_array(np.array(3, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "c0"),
            numpy_helper.from_array(np.array(2, np.float32), "two"),
        ],
    )
    return _model(graph)


def _x(seed: int = 0) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))}


# -- control flow --------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [if_model, loop_model], ids=["if", "loop"])
def test_convert_half_keeps_a_body_node_in_float32_inside_its_body(build: Callable[[], onnx.ModelProto]) -> None:
    """onnxruntime's converter writes the Casts around a float32 node of a body (the op-type block list's Relu
    in the If branch, Mul in the Loop body) into the main graph, out of the body's scope: onnxruntime refused
    the model ("Graph output (t) does not exist in the graph") and the evaluator ran into a KeyError.
    convert_half puts them in the body: the model passes onnx.checker, and onnxruntime and the torch evaluator
    run it to the same values as the float32 model's within float16's rounding."""
    model = build()
    ops = sorted(set(_default_op_block_list()) | set(OP_TYPE_BLOCK_LIST))
    converted = convert_half(model, op_block_list=ops)
    onnx.checker.check_model(converted, full_check=True)
    feeds = _x()
    (want,) = TorchEvaluator(model).run(None, feeds)
    (ort,) = OrtRunner(converted.SerializeToString()).run(None, feeds)
    (ev,) = TorchEvaluator(converted).run(None, feeds)
    assert torch.allclose(ort, want, atol=2e-2, rtol=1e-2) and torch.allclose(ev, want, atol=2e-2, rtol=1e-2)
    # the kept node computes in float32 in its body; the Casts around it are there too
    bodies = [g for n in converted.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for g in [a.g]]
    assert not any(n.op_type == "Cast" and n.name.endswith(("_cast_to_fp16_node", "_cast_to_fp32_node")) for n in converted.graph.node)
    assert any(n.op_type in ("Relu", "Mul") for b in bodies for n in b.node)


@pytest.mark.parametrize("build", [if_model, loop_model], ids=["if", "loop"])
def test_keep_float32_on_control_flow_gives_an_audit_and_a_verified_list(build: Callable[[], onnx.ModelProto]) -> None:
    """keep_float32 crashed on any If or Loop model (the op-type block list's conversion: `KeyError:
    'graph_input_cast_0_cast_to_fp32'`, `torch kernel Cast failed on node 'v_in_cast_to_fp32_node'`)."""
    report = keep_float32(build(), [_x(0), _x(1)])
    assert report.status == "nothing to keep" and report.verified, report.render()
    assert report.audit is not None and report.audit.nodes
    assert all(o.ran for r in report.results for o in r.outcomes), report.render()
    assert report.converted_model is not None
    onnx.checker.check_model(report.converted_model, full_check=True)


def test_keep_float32_keeps_the_nodes_of_a_branch_that_overflows() -> None:
    """A branch x * 1e6 * 1e-6 overflows float16 in its first Mul: the list keeps both Muls of the branch,
    and the model converted with it meets the tolerance on onnxruntime and in float16 arithmetic."""
    then = oh.make_graph(
        [oh.make_node("Mul", ["x", "big"], ["a"], name="up"), oh.make_node("Mul", ["a", "small"], ["t"], name="down")],
        "then",
        [],
        [oh.make_tensor_value_info("t", F, (2, 4))],
    )
    model = if_model()
    model.graph.node[2].attribute[1 if model.graph.node[2].attribute[0].name == "else_branch" else 0].g.CopyFrom(then)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(-100, np.float32), "z"))  # always then
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.array(1e6, np.float32), "big"), numpy_helper.from_array(np.array(1e-6, np.float32), "small")]
    )
    onnx.checker.check_model(model)
    report = keep_float32(model, [_x(0), _x(1)])
    assert report.status == "verified" and sorted(report.keep) == ["down", "up"], report.render()
    assert report.result("no list").error == float("inf")
    converted = report.converted_model
    assert converted is not None
    onnx.checker.check_model(converted, full_check=True)
    (got,) = OrtRunner(converted.SerializeToString()).run(None, _x(2))
    assert torch.allclose(got, _x(2)["x"], atol=1e-2, rtol=1e-2)


def test_precision_command_on_an_if_model(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _save(if_model(), tmp_path / "if.onnx")
    out = tmp_path / "if16.onnx"
    result = cli("precision", str(path), "--write-converted", str(out))
    assert result.returncode == 0, result.stderr
    assert "float16 range audit of 'g'" in result.stdout and "status: nothing to keep" in result.stdout
    assert "not run" not in result.stdout
    (got,) = OrtRunner(str(out)).run(None, _x())
    assert torch.allclose(got, TorchEvaluator(if_model()).run(None, _x())[0], atol=1e-2)


# -- an output listed twice ----------------------------------------------------------------------------


def dup_out_model() -> onnx.ModelProto:
    """x -> Relu -> y, the graph listing y twice (valid ONNX: compare and diff take it)."""
    out = oh.make_tensor_value_info("y", F, (2, 4))
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g", [oh.make_tensor_value_info("x", F, (2, 4))], [out, out])
    return _model(graph)


@pytest.mark.parametrize("ops", [None, ["Relu"]], ids=["converted", "kept"])
def test_convert_half_writes_one_cast_for_an_output_listed_twice(ops: list[str] | None) -> None:
    """keep_io_types makes the converter write one Cast per entry of the output list (`graph_output_cast0`
    and `graph_output_cast1`, both writing y, the first reading a value nothing writes): convert_half keeps
    the one whose input is computed; both entries still come out, on onnxruntime and in the evaluator."""
    converted = convert_half(dup_out_model(), op_block_list=ops)
    onnx.checker.check_model(converted, full_check=True)
    assert [o.name for o in converted.graph.output] == ["y", "y"]
    assert sum("y" in n.output for n in converted.graph.node) == 1
    feeds = _x()
    want = torch.relu(feeds["x"])
    for got in (OrtRunner(converted.SerializeToString()).run(None, feeds), TorchEvaluator(converted).run(None, feeds)):
        assert len(got) == 2 and all(torch.allclose(g, want, atol=1e-2) for g in got)


def test_precision_command_on_an_output_listed_twice(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Was exit 2: "value 'y' is the output of 2 nodes ...: onnxruntime 1.31's convert_float_to_float16 writes
    one such Cast per consumer: convert with onnxruntime >= 1.32", on onnxruntime 1.32 too."""
    result = cli("precision", str(_save(dup_out_model(), tmp_path / "dup_out.onnx")))
    assert result.returncode == 0, result.stderr
    assert "status: nothing to keep" in result.stdout and "not run" not in result.stdout


def test_two_writers_of_an_output_are_not_blamed_on_onnxruntime_131() -> None:
    """The evaluator's one line for a value written twice names onnxruntime 1.31's converter only where its
    graph is what 1.31 writes (identical Casts): for the Casts of an output listed twice it names what wrote
    them and the fix."""
    import copy

    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(copy.deepcopy(dup_out_model()), keep_io_types=True)
    with pytest.raises(ValueError, match=r"'y' is the output of 2 nodes \('graph_output_cast0' \(Cast\), 'graph_output_cast1' \(Cast\)\)") as info:
        TorchEvaluator(converted, check_model=False)
    assert "1.31" not in str(info.value) and "lists twice" in str(info.value) and "convert_half" in str(info.value)


# -- a node onnxruntime has no float16 kernel for --------------------------------------------------------


def cdist_model() -> onnx.ModelProto:
    """One com.microsoft::CDist node: no torch kernel (missing="ort" runs it on onnxruntime), and its schema
    takes float and double only ("Type 'tensor(float16)' of input parameter ... is invalid")."""
    graph = oh.make_graph(
        [oh.make_node("CDist", ["x", "x"], ["y"], domain="com.microsoft")],
        "g",
        [oh.make_tensor_value_info("x", F, (3, 4))],
        [oh.make_tensor_value_info("y", F, (3, 3))],
    )
    return _model(graph, oh.make_opsetid("com.microsoft", 1))


def test_keep_float32_keeps_a_node_onnxruntime_cannot_compute_in_float16() -> None:
    """missing="ort": the simulation ran CDist in float16 on onnxruntime, which refused it (a RuntimeError out
    of keep_float32). The node stays float32 in every list, the report says why, and the lists verify."""
    feeds = [{"x": torch.randn(3, 4, generator=torch.Generator().manual_seed(s))} for s in range(2)]
    report = keep_float32(cdist_model(), feeds, missing="ort")
    assert report.verified and report.status == "nothing to keep", report.render()
    assert "CDist_0" in report.always_float32 and "CDist_0" not in report.keep
    assert all(o.ran and o.passed for r in report.results for o in r.outcomes), report.render()
    assert any("cannot compute in float16: 'CDist_0' (com.microsoft::CDist)" in n for n in report.notes), report.notes
    converted = report.converted_model
    assert converted is not None
    assert [n.op_type for n in converted.graph.node if n.name == "CDist_0"] == ["CDist"]
    (got,) = OrtRunner(converted.SerializeToString()).run(None, feeds[0])
    assert torch.allclose(got, torch.cdist(feeds[0]["x"], feeds[0]["x"]) ** 2, atol=1e-4)  # (sqeuclidean, its default)


def test_precision_and_blame_commands_on_a_node_onnxruntime_cannot_compute_in_float16(cli: Callable[..., Any], tmp_path: Path) -> None:
    """`precision --missing ort` keeps CDist in float32 and says so (was a RuntimeError traceback); `blame
    --dtype float16` on the model converted with every node is one error line, as `compare` gives for it."""
    path = _save(cdist_model(), tmp_path / "cdist.onnx")
    result = cli("precision", str(path), "--missing", "ort")
    assert result.returncode == 0, result.stderr
    assert "note: kept in float32 in every list: 1 node run on onnxruntime (missing='ort') that it cannot compute in float16" in result.stdout
    compare = cli("compare", str(path), "--missing", "ort", "--dtype", "float16")
    blame = cli("blame", str(path), "--missing", "ort", "--dtype", "float16")
    for r in (compare, blame):
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(f"error: onnxruntime cannot run {path}: ") and "Type 'tensor(float16)'" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_checker_blame_raises_what_check_raises_when_onnxruntime_refuses_the_model() -> None:
    """Checker.blame raised the evaluator's RuntimeError around the node run on onnxruntime; it raises
    OrtRunError (check's error for onnxruntime refusing a model) with onnxruntime's first line."""
    from pytest_ortdiff.analyses.precision.keep import convert_half
    from pytest_ortdiff.engine.check import Checker, OrtRunError

    converted = convert_half(cdist_model(), op_block_list=[])
    feeds = {"x": torch.randn(3, 4, generator=torch.Generator().manual_seed(0))}
    checker = Checker("CPU", "float16")
    with pytest.raises(OrtRunError) as check:
        checker.check(converted, feeds, missing="ort")
    with pytest.raises(OrtRunError) as blame:
        checker.blame(converted, feeds, missing="ort")
    for info in (check, blame):
        assert "Type 'tensor(float16)' of input parameter" in info.value.detail and "\n" not in info.value.detail


# -- nothing to compare ----------------------------------------------------------------------------------


def relu_model(rows: int | str = 0) -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", F, (rows, 4))],
        [oh.make_tensor_value_info("y", F, (rows, 4))],
    )
    return _model(graph)


EMPTY = r"compared 0 elements: every output is empty \(y: float32\[0x4\]\) for the feeds given \(empty: x \[0, 4\]\); feed a non-empty input"


def test_keep_float32_audit_and_check_conversion_on_empty_outputs_raise_nothing_compared() -> None:
    """x: f32[0,4] -> Relu: keep_float32 said "nothing to keep ... meets the tolerance" (verified, a converted
    model) having compared nothing. keep_float32, check_conversion and audit raise EmptyOutputs, a
    NothingCompared (as Checker.check raises for it) and a ValueError, naming the outputs and the empty feeds."""
    from pytest_ortdiff.analyses.precision import EmptyOutputs, audit
    from pytest_ortdiff.analyses.precision.keep import check_conversion
    from pytest_ortdiff.engine.check import NothingCompared

    model, feeds = relu_model(0), {"x": torch.zeros(0, 4)}
    for run in (keep_float32, check_conversion, audit):
        with pytest.raises(EmptyOutputs, match=f"^{run.__name__}: {EMPTY}") as info:
            run(model, [feeds, feeds])
        assert isinstance(info.value, NothingCompared) and isinstance(info.value, ValueError)
        assert "\n" not in str(info.value)


def test_keep_float32_with_one_non_empty_input_compares_that_one() -> None:
    """Outputs empty for some inputs only: the others are compared, and the search runs."""
    model = relu_model("n")
    report = keep_float32(model, [{"x": torch.zeros(0, 4)}, _x()])
    assert report.verified and report.status == "nothing to keep", report.render()


def test_precision_command_on_a_zero_size_input_is_no_pass(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Was exit 0, "nothing to keep", and the converted model written."""
    out = tmp_path / "zero16.onnx"
    result = cli("precision", str(_save(relu_model(0), tmp_path / "zero.onnx")), "--write-converted", str(out))
    assert result.returncode == 1 and not out.exists()  # (as compare: a check that compared nothing fails, 1)
    assert result.stderr.startswith("error: keep_float32: compared 0 elements: every output is empty (y: float32[0x4])"), result.stderr
    assert "not a pass" in result.stderr and result.stderr.count("\n") == 1
    assert "nothing to keep" not in result.stdout
