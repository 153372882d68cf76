"""blame(): kernel substitution finds the culprit, names graph-level effects, and the float64 oracle
says who is right."""

from __future__ import annotations

import importlib
import json
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_ortdiff import OrtRunner, TorchEvaluator, blame, compare, models
from pytest_ortdiff.engine.blame import ort_intermediates

DIMS = {"a": 2, "b": 16, "c": 64}


def _wrong_epsilon_layer_norm(x, scale, bias):
    # close to right: epsilon 1e-1 instead of 1e-5 shifts every output by ~4e-5 relative
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, bias, eps=1e-1)


def test_wrong_but_close_kernel_is_blamed_first() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims=DIMS, seed=1)
    table = blame(model, feeds, kernels={"layer_norm": _wrong_epsilon_layer_norm})
    assert table[0].node == "layer_norm"
    assert table[0].op_type == "LayerNormalization"
    assert table[0].explained > 0.9
    assert table.culprit is table[0]
    # its own (local) error is far above the honest nodes'
    others = [r for r in table if r.node != "layer_norm"]
    assert table[0].local_max_abs > 100 * max(r.local_max_abs for r in others) or max(r.local_max_abs for r in others) == 0
    assert "most to blame: layer_norm (LayerNormalization)" in table.render()
    assert table.first_divergence is not None and table.first_divergence.startswith("layer_norm")


def _add_mul_model():
    return oh.make_model(
        oh.make_graph(
            [oh.make_node("Add", ["x", "y"], ["s"], name="add"), oh.make_node("Mul", ["s", "y"], ["z"], name="mul")],
            "exact",
            [oh.make_tensor_value_info("x", 1, ["n"]), oh.make_tensor_value_info("y", 1, ["n"])],
            [oh.make_tensor_value_info("z", 1, ["n"])],
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", 18)],
    )


def test_no_discrepancy_blames_nothing() -> None:
    model = _add_mul_model()
    feeds = models.random_feeds(model, dims={"n": 100}, seed=0)
    table = blame(model, feeds)
    assert table.gap.is_exact
    assert table.culprit is None
    assert [r.explained for r in table] == [0.0, 0.0]
    assert "no discrepancy: nothing to blame" in table.render()
    assert table.notes == []


def test_multi_output_and_optional_input_substitute() -> None:
    # LayerNormalization without bias (optional input), with Mean and InvStdDev as graph outputs
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("LayerNormalization", ["X", "scale"], ["Y", "mean", "inv"], axis=1, name="ln")],
            "ln3",
            [oh.make_tensor_value_info("X", 1, ["a", 6, 5]), oh.make_tensor_value_info("scale", 1, [6, 5])],
            [oh.make_tensor_value_info("Y", 1, ["a", 6, 5]), oh.make_tensor_value_info("mean", 1, ["a", 1, 1]), oh.make_tensor_value_info("inv", 1, ["a", 1, 1])],
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", 18)],
    )
    feeds = models.random_feeds(model, dims={"a": 3}, seed=0)
    via_ort = TorchEvaluator(model, kernels={("", "LayerNormalization"): "ort"}).run(None, feeds)
    full_ort = OrtRunner(model).run(None, feeds)
    assert [t.shape for t in via_ort] == [(3, 6, 5), (3, 1, 1), (3, 1, 1)]
    for a, b in zip(via_ort, full_ort, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch_only = TorchEvaluator(model).run(None, feeds)
    for a, b in zip(torch_only, full_ort, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_oracle_beats_float16_runtimes_on_cancellation() -> None:
    # (a + b) - a with a = 2048: float16 keeps no bits of b (spacing 2 at 2048), the oracle keeps them all
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("Add", ["a", "b"], ["s"], name="add"), oh.make_node("Sub", ["s", "a"], ["z"], name="sub")],
            "cancel",
            [oh.make_tensor_value_info("a", 10, ["n"]), oh.make_tensor_value_info("b", 10, ["n"])],
            [oh.make_tensor_value_info("z", 10, ["n"])],
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", 18)],
    )
    b = torch.linspace(0.1, 0.9, 64, dtype=torch.float16)
    feeds = {"a": torch.full((64,), 2048.0, dtype=torch.float16), "b": b}
    truth = torch.from_numpy((np.float64(2048.0) + b.double().numpy()) - np.float64(2048.0)).half()
    oracle = TorchEvaluator(model, compute_dtype=torch.float64).run(None, feeds)[0]
    assert oracle.dtype == torch.float64
    torch_fp16 = TorchEvaluator(model).run(None, feeds)[0]
    ort_fp16 = OrtRunner(model).run(None, feeds)[0]
    err_oracle = compare(truth, oracle.half()).max_abs
    err_torch = compare(truth, torch_fp16).max_abs
    err_ort = compare(truth, ort_fp16).max_abs
    assert err_oracle == 0
    assert err_torch > 0.09  # b is lost entirely
    assert err_oracle <= err_ort
    table = blame(model, feeds)
    assert table.oracle["torch"].max_abs == pytest.approx(err_torch)
    assert table.closer_to_oracle in ("onnxruntime", "tie")


def test_cpu_float16_gap_is_explained_by_inserted_casts() -> None:
    model = models.layer_norm_matmul_add(dtype="float16")
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    table = blame(model, feeds)
    if table.gap.is_exact:
        pytest.skip("this onnxruntime build computes float16 MatMul like torch: no gap to explain")
    assert table.closer_to_oracle == "onnxruntime"
    assert any("inserted" in n and "matmul (MatMul) in float32" in n for n in table.notes), table.notes
    assert table.culprit is None
    assert "no single node explains" in table.render()


def test_graph_notes_follow_a_float32_chain_past_the_inserted_casts() -> None:
    # Exp -> ReduceSum -> Div: only Exp and Div read an inserted Cast; ReduceSum reads Exp's float32
    # output, and runs in float32 too
    from pytest_ortdiff.engine.blame import ort_graph_notes

    (note,) = ort_graph_notes(models.fp16_hazards("softmax"))
    if "inserted" not in note:
        pytest.skip("this onnxruntime build has float16 kernels for Exp/ReduceSum/Div on CPU")
    for node in ("exp (Exp)", "sum_exp (ReduceSum)", "normalize (Div)"):
        assert f"{node} in float32" in note, note
    assert ort_graph_notes(models.layer_norm_matmul_add(dtype="float32")) == []


def test_by_op_type_swaps_every_node_of_a_type() -> None:
    # two MatMuls: by_op_type swaps both at once and gives one MatMul row
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), oh.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")],
            "two_mm",
            [oh.make_tensor_value_info("x", 1, [4, 64]), oh.make_tensor_value_info("w1", 1, [64, 64]), oh.make_tensor_value_info("w2", 1, [64, 64])],
            [oh.make_tensor_value_info("y", 1, [4, 64])],
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", 18)],
    )
    feeds = models.random_feeds(model, seed=3)
    table = blame(model, feeds)
    assert sorted(r.node for r in table) == ["mm1", "mm2"]
    (row,) = table.by_op_type()
    assert row.op_type == "MatMul"
    if not table.gap.is_exact:
        # both MatMuls on onnxruntime: the torch evaluator is onnxruntime
        assert row.vs_ort == 0 and row.explained == 1.0
    data = json.loads(json.dumps(table.to_dict()))
    assert data["rows"][0]["node"] in ("mm1", "mm2")
    assert "MatMul" in table.render_by_op_type()


def test_ort_intermediates_expose_every_node_output() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    inter = ort_intermediates(model, feeds)
    assert set(inter) == {"norm", "mm", "Z"}
    ev = TorchEvaluator(model).run(None, feeds, intermediates=True)
    for name in ("norm", "mm", "Z"):
        assert compare(ev[name], inter[name]).max_abs < 1e-3


def _chained_resize_model() -> onnx.ModelProto:
    """Two linear Resizes given `sizes`, one feeding the other (a decoder's upsampling stages)."""
    f = onnx.TensorProto.FLOAT
    nodes = [
        oh.make_node("Resize", ["X", "", "", "s1"], ["a"], name="up1", mode="linear"),
        oh.make_node("Mul", ["a", "k"], ["b"], name="scale"),
        oh.make_node("Resize", ["b", "", "", "s2"], ["Y"], name="up2", mode="linear"),
    ]
    inits = [
        oh.make_tensor("s1", onnx.TensorProto.INT64, [4], [1, 1, 7, 9]),
        oh.make_tensor("s2", onnx.TensorProto.INT64, [4], [1, 1, 13, 17]),
        oh.make_tensor("k", f, [], [1.37]),
    ]
    graph = oh.make_graph(nodes, "chained_resize", [oh.make_tensor_value_info("X", f, [1, 1, 4, 5])], [oh.make_tensor_value_info("Y", f, [1, 1, 13, 17])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_an_op_type_swap_reruns_a_resize_given_sizes_on_onnxruntime() -> None:
    """Swapping every Resize runs the second one again on onnxruntime (its input changed), as a one-node
    model: onnxruntime's shape inference refuses a Resize given `sizes` whose inputs have symbolic dims,
    so that model declares the inputs' own shapes. The swap of all of them is onnxruntime's run, exactly."""
    model = _chained_resize_model()
    feeds = {"X": torch.randn(1, 1, 4, 5, generator=torch.Generator().manual_seed(0))}
    table = blame(model, feeds, budget=None)
    resize = next(r for r in table.op_rows if r.node == "Resize")
    assert resize.exact and resize.vs_ort == 0.0 and resize.explained == 1.0
    (ort_y,) = OrtRunner(model).run(None, feeds)
    (mixed,) = TorchEvaluator(model, kernels={"Resize": "ort"}).run(None, feeds)
    assert torch.equal(mixed, ort_y)
    # in the float64 oracle: onnxruntime has no float64 Resize either, so the node runs in float32
    (oracle,) = TorchEvaluator(model, kernels={"Resize": "ort"}, compute_dtype=torch.float64).run(None, feeds)
    assert oracle.dtype == torch.float64 and (oracle - ort_y.double()).abs().max() < 1e-6


def test_an_ort_kernel_keeps_a_bounded_number_of_sessions_per_shape() -> None:
    """Once onnxruntime refused symbolic dims, a session per input shape: the least recently used go."""
    from pytest_ortdiff.runtimes import ort_kernel
    from pytest_ortdiff.runtimes.kernels.base import KernelContext

    model = _chained_resize_model()
    del model.graph.node[1:]
    model.graph.output[0].name = "a"
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 7
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 9
    kernel = ort_kernel.OrtKernel(model.graph.node[0], KernelContext(torch.device("cpu"), 18), {"": 18})
    sizes = torch.tensor([1, 1, 7, 9])
    for width in range(1, ort_kernel._MAX_SESSIONS + 4):
        x = torch.randn(1, 1, 4, width)
        (y,) = kernel.run(x, None, None, sizes)
        assert y.shape == (1, 1, 7, 9)
        if width == 5:  # (the model declares this width)
            (want,) = OrtRunner(model).run(None, {"X": x})
            assert torch.equal(y, want)
    assert kernel._exact_shapes and len(kernel._runners) == ort_kernel._MAX_SESSIONS


@pytest.mark.parametrize("cores", [1, 2, 64])
def test_blame_names_the_checker_problem_of_an_invalid_model(cores: int, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # jobs one after the other, one helper thread, many: the torch run does not wait for the checker's
    # verdict, whose message still comes first
    monkeypatch.setattr(importlib.import_module("pytest_ortdiff.engine.blame"), "_cores", lambda: cores)
    model = _chained_resize_model()
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    model.graph.node[1].input[1] = "missing"
    with pytest.raises(ValueError, match=r"^the model fails onnx\.checker: .*missing.*; fix the graph$"):
        blame(model, {"X": torch.zeros(1, 1, 4, 5)})


BLAME_TEST = """
import pytest
from pytest_ortdiff import models

@pytest.mark.ortdiff(dtypes=["float16"], budget={{0.0: 0.0}})
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={{"a": 2, "b": 16, "c": 64}}, seed=0)
    ortdiff.check(model, feeds{extra})
"""


def test_blame_option_adds_table_to_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b=BLAME_TEST.format(extra=""))
    result = pytester.runpytest("--ortdiff-blame")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*blame: torch evaluator vs onnxruntime CPU float16: gap max abs *",
            "*node * op * explained * vs ort * vs torch * local abs * local ulp*",
            "*against the float64 oracle (in the tested dtype; ULPs at the output's scale):*",
            "*closer to the oracle: onnxruntime*",
        ]
    )


REPORTED_BLAME = """
import pytest
import torch
from pytest_ortdiff import models


def broken(x, scale, bias):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, bias, 1e-5) + 0.5


@pytest.mark.ortdiff(dtypes=["float32"])
def test_planted(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 4, "c": 8}, seed=0)
    ortdiff.check(model, feeds, kernels={("", "LayerNormalization"): broken})


@pytest.mark.ortdiff(dtypes=["float16"], budget={0.0: 0.0})
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 16, "c": 64}, seed=0)
    ortdiff.check(model, feeds)


@pytest.mark.ortdiff(dtypes=["float16"], budget={0.0: 0.1})
def test_oracle(ortdiff):
    # against the float64 oracle onnxruntime passes (5.5 % of the elements off), torch fails (24 %)
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 16, "c": 64}, seed=0)
    ortdiff.check(model, feeds, reference="float64")


@pytest.mark.ortdiff(dtypes=["float32"])
def test_replaced(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 4, "c": 8}, seed=0)
    # a failure with its blame table, then a worse one of the same check without: its row replaces the first
    with pytest.raises(Exception):
        ortdiff.check(model, feeds, kernels={("", "LayerNormalization"): broken})
    ortdiff.check(model, feeds, kernels={("", "LayerNormalization"): lambda x, s, b: broken(x, s, b) + 1.0}, blame=False)
"""


def test_the_blame_table_reaches_the_json_file_the_html_report_and_junit(pytester: pytest.Pytester, cli: Any) -> None:
    """--ortdiff-blame in a CI job: the failed check's row carries its blame table (the top rows, the module
    scopes, the culprit) into the JSON file, through `merge` into the merged file and its HTML report, the
    markdown of a pull-request comment, and the culprit into the JUnit XML's properties."""
    import xml.etree.ElementTree as ET

    pytester.makepyfile(test_b=REPORTED_BLAME)
    result = pytester.runpytest("--ortdiff-blame", "--ortdiff-json=job.json", "--ortdiff-html=job.html", "--junitxml=junit.xml")
    result.assert_outcomes(failed=4)
    rows = {r["test"]: r for r in json.loads((pytester.path / "job.json").read_text())["results"]}
    props = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")} for case in ET.parse(pytester.path / "junit.xml").iter("testcase")
    }
    # the planted kernel: named, 100 %
    table = rows["test_b.py::test_planted[CPU-float32]"]["blame"]
    assert table["nodes"] == 3 and len(table["rows"]) == 3 and table["estimated"] == 0  # (every row of a graph this small)
    assert table["culprit"] == "layer_norm" and table["rows"][0]["node"] == "layer_norm"
    planted = props["test_planted[CPU-float32]"]
    assert planted["ortdiff.culprit"] == "layer_norm" and planted["ortdiff.blame_top"] == "layer_norm (LayerNormalization) 100 %"
    # (the plugin's own entries, a whole row with its report and table as a repr, are not among them)
    assert all(name.startswith("ortdiff.") for name in planted), sorted(planted)
    # onnxruntime's float16 arithmetic, no node to blame: the table, but no name in JUnit
    lnmm = rows["test_b.py::test_lnmm[CPU-float16]"]["blame"]
    assert lnmm["culprit"] is None and lnmm["closer_to_oracle"] == "onnxruntime"
    assert "ortdiff.blame_top" not in props["test_lnmm[CPU-float16]"] and "ortdiff.culprit" not in props["test_lnmm[CPU-float16]"]
    # against the float64 oracle the table goes on the row that failed: torch's, not onnxruntime's
    assert "blame" not in rows["test_b.py::test_oracle[CPU-float16] [ort vs float64]"]
    assert rows["test_b.py::test_oracle[CPU-float16] [torch vs float64]"]["blame"]["provider"] == "CPU"
    # a row replaced by a worse one without a table takes its table's properties with it
    assert "blame" not in rows["test_b.py::test_replaced[CPU-float32]"]
    assert not {"ortdiff.blame_top", "ortdiff.culprit"} & set(props["test_replaced[CPU-float32]"])
    html = (pytester.path / "job.html").read_text()
    assert html.count("Blame: each node swapped to onnxruntime in turn") == 3 and "most to blame: <code>layer_norm</code>" in html
    # merged, then rendered: the tables are still there
    assert cli("merge", "job.json", "--output", "merged.json", "--html", "merged.html", cwd=pytester.path).returncode == 0
    merged = {r["test"]: r for r in json.loads((pytester.path / "merged.json").read_text())["results"]}
    assert merged["test_b.py::test_planted[CPU-float32]"]["blame"] == table
    assert (pytester.path / "merged.html").read_text().count("Blame: each node swapped to onnxruntime in turn") == 3
    # and in the pull-request comment's details of each failing cell
    md = cli("merge", "job.json", "--matrix", "--markdown", cwd=pytester.path).stdout.replace("\\_", "_")
    assert "  - blame: layer_norm (LayerNormalization) 100 %; closer to the float64 oracle: onnxruntime" in md
    assert "  - blame: no single node explains any of the gap; first node whose output drifts beyond the tolerance: add (Add): max abs" in md


def test_a_blame_table_of_a_large_graph_is_stored_cut_to_its_top_rows() -> None:
    model, feeds, _ = _zoo("llama_decoder_layer")
    table = blame(model, feeds)
    short = table.to_dict(top=5)
    assert short["nodes"] == len(table.rows) > 5 and len(short["rows"]) == 5 and len(short["by_op_type"]) <= 5
    assert short["rows"] == table.to_dict()["rows"][:5] and short["culprit"] == table.to_dict()["culprit"]
    assert short["estimated"] == sum(not r.exact for r in table.rows)


def test_check_against_float64_oracle(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_b=BLAME_TEST.format(extra=', reference="float64"'))
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ortdiff: float64 oracle vs onnxruntime CPU float16: tolerance broken*"])
    result.stdout.fnmatch_lines(["*ortdiff: float64 oracle vs torch evaluator CPU float16: tolerance broken*"])
    result.stdout.fnmatch_lines(["*closer to the float64 oracle: onnxruntime (onnxruntime: max 1 ulp, * elements off; torch: max 1 ulp, * elements off; ULPs at the output's scale)"])
    result.stdout.fnmatch_lines(["test_b.py::test_lnmm[[]CPU-float16[]] [[]ort vs float64[]] * failed"])
    result.stdout.fnmatch_lines(["test_b.py::test_lnmm[[]CPU-float16[]] [[]torch vs float64[]] * failed"])


def test_blame_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_f="""
        from pytest_ortdiff import models

        def test_a(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 1, "b": 8, "c": 64}, seed=0)
            table = ortdiff.blame(model, feeds)
            assert table.provider == "CPU" and table.dtype == "float32"
            assert {r.node for r in table} == {"layer_norm", "matmul", "add"}
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_blame_and_the_oracle_take_the_ort_overrides_that_a_missing_kernel_needs() -> None:
    """A model with an op without a torch kernel: the kernels={...: "ort"} of docs/writing-tests.md works for blame
    (the float64 oracle too) and for check(reference="float64")."""
    import onnx
    from onnx import TensorProto as TP

    from pytest_ortdiff.plugin.fixtures import OrtDiff

    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("Hardmax", ["r"], ["y"], axis=-1, name="hm")]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    feeds = {"x": torch.tensor([[0.1, 3.0, -1.0], [2.0, 2.5, 0.0]])}
    table = blame(model, feeds, kernels={"hm": "ort"})
    assert [r.node for r in table.rows] and table.gap.is_exact
    assert table.oracle["torch"].max_abs == 0 and table.oracle["onnxruntime"].max_abs == 0
    checker = OrtDiff("CPU", "float32")
    assert checker.check(model, feeds, kernels={"hm": "ort"}, reference="float64").is_exact
    (y,) = checker.run(model, feeds, runtime="float64", kernels={"hm": "ort"})
    assert torch.equal(y, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=y.dtype))


def test_blame_runs_on_a_graph_with_control_flow() -> None:
    # an If node's own local error is its body's; swapping it runs the whole If on onnxruntime
    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto, helper

    from pytest_ortdiff import blame as blame_fn

    out = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3])  # noqa: E731
    then_g = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"], name="then_tanh")], "then", [], [out("t")])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"], name="else_sig")], "else", [], [out("e")])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g, name="if"),
        helper.make_node("Mul", ["y0", "x"], ["y"], name="mul"),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")
    graph = helper.make_graph(nodes, "m", [out("x")], [out("y")], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    table = blame_fn(model, {"x": torch.rand(2, 3, generator=torch.Generator().manual_seed(0))}, provider="CPU")
    rows = {r.node: r for r in table.rows}
    assert set(rows) == {"sum", "gt", "if", "mul"}
    assert rows["if"].local_max_abs == 0.0 and rows["if"].explained == 1.0


# -- the linear-time algorithm against the one-swap-per-node method it replaced ------------------------


def _one_swap_per_node(model, feeds, kernels=None):
    """The old blame: per node a fresh evaluator with that node on onnxruntime, the whole graph run again;
    the local error from the torch kernel and a one-node onnxruntime kernel. Node -> its numbers."""
    import onnx

    from pytest_ortdiff.engine.blame import node_key
    from pytest_ortdiff.runtimes.ort_kernel import OrtKernel

    named = onnx.ModelProto()
    named.CopyFrom(model)
    for i, node in enumerate(named.graph.node):
        node.name = node.name or node_key(node, i)
    kernels = dict(kernels or {})
    base = TorchEvaluator(named, kernels=kernels)
    values = base.run(None, feeds, intermediates=True)
    torch_out = [values[o] for o in base.output_names]
    exposed = ort_intermediates(named, feeds)  # as blame always did: every value a graph output (no fusions)
    ort_out = [exposed[o] for o in base.output_names]
    oracle = TorchEvaluator(named, compute_dtype=torch.float64).run(None, feeds)
    oracle = [o.to(t.dtype) for o, t in zip(oracle, torch_out, strict=True)]
    gap_mean = compare(torch_out, ort_out).mean_abs
    main = [(n, k) for n, k, _ in base.iter_kernels() if any(n is m for m in base.nodes)]
    rows = {}
    for op in {n.op_type for n in named.graph.node}:  # by_op_type: every node of a type swapped at once
        members = [n.name for n in named.graph.node if n.op_type == op]
        if len(members) > 1:
            sub = TorchEvaluator(named, kernels={**kernels, **dict.fromkeys(members, "ort")}, check_model=False).run(None, feeds)
            vs_ort = compare(sub, ort_out)
            explained = 0.0 if gap_mean == 0 else max(0.0, min(1.0, 1.0 - vs_ort.mean_abs / gap_mean))
            rows[("op", op)] = (explained, vs_ort.max_abs, compare(sub, torch_out).max_abs)
    for node, k in main:
        sub = TorchEvaluator(named, kernels={**kernels, node.name: "ort"}, check_model=False).run(None, feeds)
        vs_ort = compare(sub, ort_out)
        explained = 0.0 if gap_mean == 0 else max(0.0, min(1.0, 1.0 - vs_ort.mean_abs / gap_mean))
        local_abs = local_ulp = 0.0
        if not any(a.type in (5, 10) for a in node.attribute):  # GRAPH, GRAPHS
            ins = [values[x] if x else None for x in node.input]
            for name, a, b in zip(node.output, k.run(*ins), OrtKernel(node, k.ctx, base.opsets).run(*ins), strict=False):
                if name and a.shape == b.shape and a.dtype == b.dtype:
                    r = compare(a, b)
                    local_abs, local_ulp = max(local_abs, r.max_abs), max(local_ulp, r.max_ulp)
        o = compare(oracle, sub)
        rows[node.name] = (explained, vs_ort.max_abs, compare(sub, torch_out).max_abs, local_abs, local_ulp, o.max_abs, o.max_ulp)
    return rows


def _zoo(name):
    if name == "lnmm_planted":
        model = models.layer_norm_matmul_add(dtype="float32")
        return model, models.random_feeds(model, dims=DIMS, seed=1), {"layer_norm": _wrong_epsilon_layer_norm}
    if name == "gelu_mlp":
        model = models.gelu_mlp()
        return model, models.random_feeds(model, dims={"batch": 4}, seed=0), None
    model = models.llama_decoder_layer(hidden=32, heads=2, kv_heads=1, intermediate=64)
    return model, models.random_feeds(model, dims={"batch": 1, "seq": 5}, seed=0), None


@pytest.fixture
def one_torch_thread():
    # two torch threads on a machine shared by many processes wait on each other in every small matmul
    # (ms instead of µs); both methods run under the same setting, so their numbers stay comparable
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["lnmm_planted", "gelu_mlp", "llama_decoder_layer"])
def test_rows_equal_the_one_swap_per_node_method(name: str, one_torch_thread: None) -> None:
    # every swap run (budget=None): the old method's table row for row; at the default budget the rows
    # that ran (exact) are still the old method's, the others are estimates without the run's columns
    model, feeds, kernels = _zoo(name)
    old = _one_swap_per_node(model, feeds, kernels)
    table = blame(model, feeds, kernels=kernels)
    for full in (blame(model, feeds, kernels=kernels, budget=None), table):
        assert {r.node for r in full} == {k for k in old if isinstance(k, str)}
        for r in full.by_op_type():
            if ("op", r.op_type) in old and r.exact:
                assert (r.explained, r.vs_ort, r.vs_torch) == old[("op", r.op_type)], r.op_type
        for r in full:
            if not r.exact:
                assert full is table and r.vs_ort is None and r.oracle_max_abs is None
                continue
            assert (r.explained, r.vs_ort, r.vs_torch, r.local_max_abs, r.local_max_ulp, r.oracle_max_abs, r.oracle_max_ulp) == old[r.node], r.node
            if r.skipped:  # bit-identical on onnxruntime: known without running, and it explains nothing
                assert r.explained == 0.0 and r.vs_torch == 0.0 and r.local_max_abs == 0.0
    if kernels:
        assert table[0].node == "layer_norm" and table.culprit is table[0]
    if name == "llama_decoder_layer":
        assert sum(r.skipped for r in table) > len(table) // 3  # shape arithmetic, reshapes, ... are never rerun


# -- the summary per module scope ------------------------------------------------------------------------


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def stack_export():
    import contextlib
    import io
    import warnings

    from real_models import _torchlib_registry_built_once

    torch.manual_seed(0)
    x = torch.randn(2, 4, 16)
    with warnings.catch_warnings(), _torchlib_registry_built_once(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_Stack().eval(), (x,), dynamo=True, verbose=False)
    assert program is not None
    model = program.model_proto
    return model, {model.graph.input[0].name: x}


def test_scope_summary_names_the_layer_of_a_planted_wrong_kernel(stack_export) -> None:
    from pytest_ortdiff.engine.blame import node_scope

    model, feeds = stack_export
    scopes = {n.name: node_scope(n) for n in model.graph.node}
    planted = next(n for n, s in scopes.items() if s == "layers.1.norm")  # layer 1's LayerNormalization
    table = blame(model, feeds, kernels={planted: _wrong_epsilon_layer_norm})
    assert table[0].node == planted and table[0].scope == "layers.1.norm"
    summary = table.by_scope()
    assert summary[0].scope.startswith("layers.1") and summary[0].top_node == planted
    assert summary[0].explained > 0.9
    text = table.render(top=3)
    assert f"  {summary[0].scope}: " in text and "of the gap" in text
    shown = [sc for sc in summary if f"\n  {sc.scope}: " in text]
    assert shown and shown[0] == summary[0]
    for sc in shown:  # "(1 node; ...)", "(9 nodes; ...)"
        assert f"{sc.scope}: {sc.explained * 100:.0f} % of the gap ({sc.nodes} node{'' if sc.nodes == 1 else 's'}; most: {sc.top_node} " in text
    assert "more nodes" in text  # only the top rows, then a count
    # TorchScript exports name scopes by node-name prefixes
    import onnx.helper as oh2

    assert node_scope(oh2.make_node("MatMul", ["a", "b"], ["c"], name="/layers.1/self_attn/MatMul")) == "layers.1.self_attn"
    assert node_scope(oh2.make_node("MatMul", ["a", "b"], ["c"], name="mm")) == ""


def test_over_budget_rows_are_estimates_and_the_planted_kernel_is_still_exact_and_first() -> None:
    # budget=0: the 3 nodes the first-order estimate ranks highest are swapped for real (then any whose
    # estimate of 1 % or more would head the table)
    model, feeds, _ = _zoo("llama_decoder_layer")
    planted = "post_attention_layernorm_sqrt"
    table = blame(model, feeds, kernels={planted: lambda x: torch.sqrt(x) * 1.001}, budget=0)
    assert table[0].node == planted and table[0].exact and table[0].explained > 0.9
    estimated = [r for r in table if not r.exact]
    assert estimated and all(r.vs_ort is None and r.oracle_max_abs is None for r in estimated)
    # the planted node explains it all: every other estimate is under 1 %, and none of them runs
    assert sum(r.exact and not r.skipped for r in table) == 3
    assert table.op_rows[0].exact
    assert "are first-order estimates" in table.render()


def test_the_row_heading_each_table_is_exact_even_where_first_order_misranks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the BERT-like TorchScript export of benchmarks/real_graphs.py at (1, 32): first order puts a MatMul
    # (~5 %) above every node whose swap ran, and the LayerNormalization op type above every op type that
    # ran; their swaps run too, beyond the budget, and give the every-swap table's figures
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import real_graphs
    finally:
        sys.path.pop(0)
    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model = real_graphs.export("bert", "torchscript", cache=False)
    feeds = real_graphs.feeds("bert", 1, 32)
    every = blame(model, feeds, budget=None)
    table = blame(model, feeds)
    assert any(not r.exact for r in table.op_rows) and any(not r.exact for r in table.rows)
    head, op_head = table.rows[0], table.op_rows[0]
    assert head.exact and op_head.exact
    assert head.to_dict() == next(r for r in every.rows if r.node == head.node).to_dict()
    assert op_head.to_dict() == next(r for r in every.op_rows if r.node == op_head.node).to_dict()
    assert "swaps for the rows heading the tables" in table.timings
    # without those swaps estimates would head both tables (what makes this graph the case)
    monkeypatch.setattr(blame_module, "_SETTLE_MIN", 2.0)
    unsettled = blame(model, feeds)
    assert not unsettled.rows[0].exact and unsettled.rows[0].explained > 0.01
    assert not unsettled.op_rows[0].exact and unsettled.op_rows[0].explained > 0.01


def test_a_first_order_wrong_everywhere_still_leaves_exact_rows_heading_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # every node estimated at 40 %, far above any swap's figure: the swaps go on, round after round, until an
    # exact figure heads each table; the culprit is never an estimate
    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model, feeds, _ = _zoo("llama_decoder_layer")
    every = blame(model, feeds, budget=None)
    monkeypatch.setattr(blame_module, "_first_order", lambda *args: dict.fromkeys(range(len(model.graph.node)), 0.4))
    # (the bar, drawn here, counts those swaps too: it ends full)
    import io
    import re

    from pytest_ortdiff import progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    monkeypatch.setattr(progress, "BLAME_MIN_NODES", 1)
    monkeypatch.setenv("ORTDIFF_PROGRESS", "1")
    monkeypatch.setattr(progress, "_stream", out)
    table = blame(model, feeds, budget=0)
    done, total = re.findall(r"(\d+)/(\d+) ", out.getvalue())[-1]
    assert done == total and int(total) > blame_module._SETTLE_MAX
    assert table.rows[0].exact and table.op_rows[0].exact
    assert table.rows[0].to_dict() == every.rows[0].to_dict() and table.op_rows[0].to_dict() == every.op_rows[0].to_dict()
    assert table.culprit is not None and table.culprit.exact
    assert sum(r.exact and not r.skipped for r in table) > blame_module._SETTLE_MAX  # (several rounds)


def test_over_budget_op_types_are_estimated_but_the_first_and_a_generous_budget_runs_them_all() -> None:
    model, feeds, _ = _zoo("llama_decoder_layer")
    planted = "post_attention_layernorm_sqrt"
    kernels = {planted: lambda x: torch.sqrt(x) * 1.001}
    tight = blame(model, feeds, kernels=kernels, budget=0)
    exact_ops = [r for r in tight.op_rows if r.exact and not r.skipped and r.node == r.op_type]
    several = {n.op_type for n in model.graph.node if sum(m.op_type == n.op_type for m in model.graph.node) > 1}
    estimated_ops = [r for r in tight.op_rows if not r.exact]
    assert len([r for r in exact_ops if r.op_type in several]) == 1  # the op type ranked first runs
    assert estimated_ops and all(r.vs_ort is None and r.oracle_max_abs is None for r in estimated_ops)
    # the first-order sum over an op type's nodes, clipped to [0, 1]
    assert all(0.0 <= r.explained <= 1.0 for r in estimated_ops)
    assert "op types are first-order estimates" in tight.render_by_op_type()
    # the op type holding the planted kernel (Sqrt) is the one that ran, and explains the gap
    sqrt = next(r for r in tight.op_rows if r.op_type == "Sqrt")
    assert sqrt.exact and sqrt.explained > 0.9
    # a budget that covers everything: every row exact, equal to budget=None's
    full = blame(model, feeds, kernels=kernels, budget=1e9)
    exact = blame(model, feeds, kernels=kernels, budget=None)
    assert all(r.exact for r in [*full.rows, *full.op_rows])
    assert [r.to_dict() for r in full.op_rows] == [r.to_dict() for r in exact.op_rows]
    assert [r.to_dict() for r in full.rows] == [r.to_dict() for r in exact.rows]


def test_node_costs_weigh_multiply_adds_and_elements() -> None:
    import importlib

    import onnx.helper as oh

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    a, b, w = torch.zeros(2, 8, 16), torch.zeros(16, 32), torch.zeros(4, 3, 3, 3)
    values = {"a": a, "b": b, "y": torch.zeros(2, 8, 32), "x": torch.zeros(1, 3, 10, 10), "w": w, "c": torch.zeros(1, 4, 8, 8)}
    assert blame_module._multiply_adds(oh.make_node("MatMul", ["a", "b"], ["y"]), values) == 2 * 8 * 32 * 16
    values_gemm = {"a": torch.zeros(16, 5), "b": torch.zeros(16, 7), "y": torch.zeros(5, 7)}
    assert blame_module._multiply_adds(oh.make_node("Gemm", ["a", "b"], ["y"], transA=1), values_gemm) == 5 * 7 * 16
    assert blame_module._multiply_adds(oh.make_node("Conv", ["x", "w"], ["c"]), values) == 4 * 8 * 8 * (3 * 3 * 3)
    assert blame_module._multiply_adds(oh.make_node("Add", ["a", "a"], ["y"]), values) == 0
    bits = 0b1011
    costs = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    assert blame_module._weight(bits, costs) == 1 + 2 + 8


def test_local_errors_fall_back_to_one_session_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime refusing the model of every node at once: each node on its own, the same table
    import importlib

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")  # the package's `blame` is the function

    model, feeds, kernels = _zoo("lnmm_planted")
    expected = blame(model, feeds, kernels=kernels)

    class Refusing(OrtRunner):
        def __init__(self, m, **kw):  # type: ignore[no-untyped-def]
            if getattr(getattr(m, "graph", None), "name", "") == "blame_local":
                raise RuntimeError("planted refusal")
            super().__init__(m, **kw)

    monkeypatch.setattr(blame_module, "OrtRunner", Refusing)
    table = blame(model, feeds, kernels=kernels)
    assert [(r.node, r.explained, r.local_max_abs, r.skipped) for r in table] == [(r.node, r.explained, r.local_max_abs, r.skipped) for r in expected]


# -- blame's own statistics: compare()'s numbers without its report ---------------------------------------

_SPECIAL = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-40, -1e-40, 3e38, -3e38, 6e4, -6e4, 1.0, -1.0]


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of one dtype and shape: mostly close values, some equal, some of them NaN, Inf, ±0,
    subnormal or huge (differences that overflow), and sign changes across zero."""
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    value = st.one_of(st.floats(-4, 4), st.sampled_from(_SPECIAL))
    # per element: its expected value, and got equal to it, a little off, or anything
    pairs = draw(st.lists(st.tuples(value, st.sampled_from(["equal", "near", "any"]), value), max_size=24))
    e = [x for x, _, _ in pairs]
    g = [x if how == "equal" else x * (1 + 1e-3) + 1e-4 if how == "near" else y for x, how, y in pairs]
    return torch.tensor(e, dtype=torch.float64).to(dtype), torch.tensor(g, dtype=torch.float64).to(dtype)


def _same_numbers(fast: Any, report: Any) -> None:
    assert (fast.max_abs, fast.max_ulp, fast.n, fast.mismatched) == (report.max_abs, report.max_ulp, report.n, bool(report.nan_mismatch or report.inf_mismatch))
    assert fast.mean_abs == report.mean_abs or (np.isnan(fast.mean_abs) and np.isnan(report.mean_abs))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pairs(), _pairs())
def test_blame_statistics_are_compares_numbers(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> None:
    # blame computes a swap's max abs, max ulp and mean abs without compare()'s histogram and report;
    # its rows are compare()'s numbers, bit for bit, so the two must agree exactly, NaN/Inf rules included
    from pytest_ortdiff.engine.blame import _errors

    (e, g), (e2, g2) = a, b
    _same_numbers(_errors(e, g), compare(e, g))
    _same_numbers(_errors([e, e2], [g, g2]), compare([e, e2], [g, g2]))  # a list: compare's aggregate
    assert _errors(e, g, ulp=False, mean=False).max_abs == compare(e, g).max_abs


@pytest.mark.parametrize(("dtype", "n", "threads"), [(torch.float32, 600_001, 2), (torch.float16, 70_001, 1)])
def test_blame_statistics_sum_as_compare_does_across_chunks(dtype: torch.dtype, n: int, threads: int) -> None:
    # compare() sums |e - g| chunk by chunk (float16 in pieces of its casts), a chunk holding a NaN/Inf in
    # float64, over worker ranges merged in order: the mean is compare()'s only in that order
    from pytest_ortdiff.engine.blame import _errors

    gen = torch.Generator().manual_seed(0)
    e = torch.randn(n, generator=gen, dtype=torch.float64)
    g = e + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64)
    e, g = e.to(dtype), g.to(dtype)
    g[n // 2] = float("nan")  # one chunk of the middle takes the exact path
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _same_numbers(_errors(e, g), compare(e, g))
        _same_numbers(_errors(e[:-1], g[:-1]), compare(e[:-1], g[:-1]))
        e2, g2 = e[:-1].reshape(-1, 1000).t(), g[:-1].reshape(-1, 1000).t()  # views, as a Transpose makes
        _same_numbers(_errors(e2, g2), compare(e2, g2))
    finally:
        torch.set_num_threads(before)


def test_local_outputs_are_onnxruntimes_own_node_by_node() -> None:
    # one session for every node (no graph optimizations, Constant nodes decoded by onnx) gives each node
    # the bits OrtKernel's one-node model gives it: what a swap substitutes and the skip decision rests on
    import importlib

    from pytest_ortdiff.runtimes.ort_kernel import OrtKernel

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model, feeds, _ = _zoo("llama_decoder_layer")
    ev = TorchEvaluator(model)
    values = ev.run(None, feeds, intermediates=True, specialise=False)
    graph = blame_module._Graph(ev)
    local = blame_module._local_outputs(model, graph, values, "CPU", ev.opsets)
    assert set(local) == set(range(len(graph.nodes)))
    assert any(n.op_type == "Constant" for n in graph.nodes)
    for i, node in enumerate(graph.nodes):
        alone = OrtKernel(node, graph.kernels[i].ctx, ev.opsets).run(*[values[x] if x else None for x in node.input])
        for a, b in zip(local[i], alone, strict=False):
            assert blame_module._same_bits(a, b.contiguous()), node.name
    # the session made from the declared types before the values exist (what blame does while torch
    # runs) gives the same bits; so does one whose types are wrong for a value (made again from the
    # values), and one missing a value's type (its readers asked on their own)
    typed = dict(ev.value_types)
    wrong = {**typed, graph.nodes[3].input[0]: onnx.TypeProto.Tensor(elem_type=onnx.TensorProto.DOUBLE)}
    partial = {k: v for k, v in typed.items() if k != graph.nodes[5].input[0]}
    for types in (typed, wrong, partial):
        again = blame_module._local_outputs(model, graph, lambda: values, "CPU", ev.opsets, types)
        assert set(again) == set(local)
        assert all(blame_module._same_bits(a, b) for i in local for a, b in zip(local[i], again[i], strict=True))


def test_graph_notes_need_no_session_without_float16(monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime inserts Casts only around float16 values: a float32 graph's table has no notes, and
    # blame builds no session to look for them
    import importlib

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")

    def refuse(*args: Any, **kwargs: Any) -> list[str]:
        raise AssertionError("ort_graph_notes was called for a float32 graph")

    monkeypatch.setattr(blame_module, "ort_graph_notes", refuse)
    model, feeds, kernels = _zoo("lnmm_planted")
    table = blame(model, feeds, kernels=kernels)
    assert not table.gap.is_exact and table.notes == []


def _tanh_chain() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """MatMul/Tanh chain beside one large Softmax (a node modelled well over 10 µs: swaps may run side by
    side), and two dead nodes (Neg -> Exp of the input, which no output needs: the torch run skips them)."""
    r = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array(r.randn(32, 32).astype(np.float32), f"W{i}") for i in range(3)]
    nodes = [
        oh.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        oh.make_node("Tanh", ["h0"], ["t0"], name="tanh0"),
        oh.make_node("MatMul", ["t0", "W1"], ["h1"], name="mm1"),
        oh.make_node("Tanh", ["h1"], ["t1"], name="tanh1"),
        oh.make_node("MatMul", ["t1", "W2"], ["y"], name="mm2"),
        oh.make_node("Softmax", ["z"], ["s"], name="big_softmax"),
        oh.make_node("Neg", ["x"], ["d1"], name="dead1"),
        oh.make_node("Exp", ["d1"], ["d2"], name="dead2"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 32]), oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [4, 100000])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 32]), oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [4, 100000])],
        inits,
    )
    model = oh.make_model(graph, ir_version=9, opset_imports=[oh.make_opsetid("", 18)])
    return model, {"x": r.randn(5, 32).astype(np.float32), "z": r.randn(4, 100000).astype(np.float32)}


def test_swaps_side_by_side_give_the_serial_table(one_torch_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # swap threads run torch with the caller's thread count: in a fresh thread OpenMP/MKL would be at their
    # defaults and a small MatMul would take another path (other bits: tanh0 explained 0.49 instead of 0.60)
    import importlib

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model, feeds = _tanh_chain()

    def rows(t: Any) -> list[tuple[Any, ...]]:
        return [(r.node, r.explained, r.vs_ort, r.vs_torch, r.oracle_max_abs) for r in t.rows] + [(r.op_type, r.explained, r.vs_ort) for r in t.op_rows]

    monkeypatch.setattr(blame_module, "_PARALLEL_NODE_NS", float("inf"))
    serial = rows(blame(model, feeds, budget=None))
    monkeypatch.setattr(blame_module, "_PARALLEL_NODE_NS", 0.0)
    workers = blame_module._swap_workers(8, 1.0)
    for _ in range(3):
        assert rows(blame(model, feeds, budget=None)) == serial, f"{workers} swap threads"


def test_where_torch_takes_every_core_the_jobs_run_in_the_callers_thread_with_the_same_table(one_torch_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's threads taking every core: onnxruntime's sessions, the oracle, the drifts and the local errors
    # run one after the other in blame's own thread, not in a pool; with one core to spare, in one helper
    # thread but the local outputs; the table is the same (same thread count)
    import importlib
    import threading

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model, feeds = _tanh_chain()
    ran_in: set[str] = set()
    drifts = blame_module._drifts

    def spy(*args: Any) -> Any:
        ran_in.add(threading.current_thread().name)
        return drifts(*args)

    local_in: set[str] = set()
    local_job = blame_module._local_job

    def local_spy(*args: Any) -> Any:
        local_in.add(threading.current_thread().name)
        return local_job(*args)

    monkeypatch.setattr(blame_module, "_drifts", spy)
    monkeypatch.setattr(blame_module, "_local_job", local_spy)
    monkeypatch.setattr(blame_module, "_cores", lambda: 64)  # cores to spare: the jobs in threads
    threaded = blame(model, feeds, budget=None)
    assert ran_in and all(name.startswith("ortdiff-blame") for name in ran_in)
    assert local_in and all(name.startswith("ortdiff-blame") for name in local_in)
    ran_in.clear()
    local_in.clear()
    # one core beside torch's thread: one helper thread (the drifts), the local outputs in blame's own
    monkeypatch.setattr(blame_module, "_cores", lambda: 2)
    one = blame(model, feeds, budget=None)
    assert ran_in and all(name.startswith("ortdiff-blame") for name in ran_in)
    assert local_in == {threading.current_thread().name}
    ran_in.clear()
    monkeypatch.setattr(blame_module, "_cores", lambda: 1)  # torch's one thread takes the one core
    serial = blame(model, feeds, budget=None)
    assert ran_in == {threading.current_thread().name}
    for other in (threaded, one):
        assert [r.to_dict() for r in serial.rows] == [r.to_dict() for r in other.rows]
        assert [r.to_dict() for r in serial.op_rows] == [r.to_dict() for r in other.op_rows]
        assert serial.first_divergence == other.first_divergence and serial.oracle == other.oracle


def test_local_outputs_session_made_before_the_torch_run_leaves_out_dead_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    # shape inference types the dead nodes' values, which the torch run never computes: they are left out
    # of the session made from the declared types (no second session made from the values), and the rows
    # are those of the values' own session
    import importlib

    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model, feeds = _tanh_chain()
    made: list[bool] = []
    combined = blame_module._combined_session

    def spy(m: Any, graph: Any, picked: Any, provider: str, known: Any, values: Any) -> Any:
        made.append(known is not None)
        return combined(m, graph, picked, provider, known, values)

    monkeypatch.setattr(blame_module, "_combined_session", spy)
    table = blame(model, feeds)
    assert made == [True]
    ev = TorchEvaluator(model)
    values = ev.run(None, feeds, intermediates=True, specialise=False)
    assert "d1" not in values and "d1" in ev.value_types
    graph = blame_module._Graph(ev)
    typed = blame_module._local_outputs(model, graph, lambda: values, "CPU", ev.opsets, ev.value_types)
    plain = blame_module._local_outputs(model, graph, values, "CPU", ev.opsets)
    assert set(typed) == set(plain) and all(blame_module._same_bits(a, b) for i in plain for a, b in zip(plain[i], typed[i], strict=True))
    assert {r.node for r in table if r.node.startswith("dead")} == {"dead1", "dead2"}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_one_helper_thread_gives_the_serial_table_on_a_real_export(exporter: str, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 cores, torch on one thread: one helper thread (the every-value run, drifts, oracle), the local outputs
    # in blame's own thread; on the Llama-like exports of benchmarks/real_graphs.py the table, exact rows,
    # estimates, first drift and oracle verdict are those of the same jobs run one after the other
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import real_graphs
    finally:
        sys.path.pop(0)
    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")
    model = real_graphs.export("llama", exporter)
    feeds = real_graphs.feeds("llama", 1, 16)
    planted = {"Softmax": lambda x, axis=-1: (torch.softmax(x, dim=axis) * 1.001,)}  # a wrong kernel of ours
    monkeypatch.setattr(blame_module, "_cores", lambda: 2)
    assert blame_module._helper_threads() == 1
    one = blame(model, feeds, kernels=planted, budget=0)
    monkeypatch.setattr(blame_module, "_cores", lambda: 1)
    serial = blame(model, feeds, kernels=planted, budget=0)
    assert one.culprit is not None and one.culprit.op_type == "Softmax" and one.culprit.exact
    assert one.op_rows[0].node == "Softmax" and one.op_rows[0].explained > 0.9
    assert any(not r.exact for r in one.rows)  # (a budget of 0: estimates and exact rows both)
    assert [r.to_dict() for r in one.rows] == [r.to_dict() for r in serial.rows]
    assert [r.to_dict() for r in one.op_rows] == [r.to_dict() for r in serial.op_rows]
    assert one.first_divergence == serial.first_divergence and one.oracle == serial.oracle
    assert one.culprit.node == serial.culprit.node


def test_a_note_naming_many_nodes_is_cut_and_wrapped() -> None:
    """Issue 30: blame's note was one line naming every node onnxruntime runs in float32 (hundreds on a real
    graph): five are named, then "and N more", and the rendered note wraps."""
    import onnx.helper as oh

    nodes, x = [], "X"
    for i in range(8):  # eight float16 MatMuls: onnxruntime's CPU runs each in float32 between inserted Casts
        nodes.append(oh.make_node("MatMul", [x, f"W{i}"], [f"Y{i}"], name=f"matmul_{i}"))
        x = f"Y{i}"
    weights = [oh.make_tensor_value_info(f"W{i}", onnx.TensorProto.FLOAT16, [16, 16]) for i in range(8)]
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT16, [4, 16]), *weights], [oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT16, [4, 16])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    g = torch.Generator().manual_seed(0)
    feeds = {"X": torch.rand(4, 16, generator=g).half(), **{f"W{i}": (torch.rand(16, 16, generator=g) / 4).half() for i in range(8)}}
    table = blame(model, feeds)
    if not table.notes:
        pytest.skip("this onnxruntime build computes float16 MatMul like torch: nothing inserted")
    (note,) = table.notes
    assert "matmul_0 (MatMul) in float32, matmul_1 (MatMul) in float32, " in note and "matmul_4 (MatMul) in float32 and 3 more:" in note
    text = table.render()
    wrapped = text[text.index("note: ") :].splitlines()
    assert len(wrapped) > 1 and all(len(line) <= 110 for line in wrapped), wrapped


def test_graph_notes_in_a_full_temporary_directory_cost_the_notes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29, item 11 (the same fault in blame): the notes read onnxruntime's loaded graph from a temporary
    directory; when none can be made there are no notes, and no OSError in place of the blame table."""
    import errno
    import tempfile

    from pytest_ortdiff.engine.blame import ort_graph_notes

    def full(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    assert ort_graph_notes(models.fp16_hazards("softmax")) == []


def test_blames_threads_take_the_callers_cuda_device_with_its_context_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """blame's helper and swap threads run torch on CUDA too: a new thread has no CUDA context current, and its
    first cuBLAS call would warn (an error under filterwarnings=error). Each thread binds the caller's device
    first (here CUDA is stood in for: what the threads call is recorded)."""
    import threading

    from pytest_ortdiff.engine import blame as blame_module

    seen: list[tuple[str, object]] = []

    class Stream:
        def query(self) -> bool:
            seen.append(("query", threading.current_thread().name))
            return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.append(("set_device", d)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: Stream())
    with blame_module._started_pool(2, "ortdiff-test") as pool:
        threads = set(pool.map(lambda _: (threading.current_thread().name, torch.get_num_threads()), range(8)))
    assert [s for s in seen if s[0] == "set_device"] == [("set_device", 1)] * 2
    queried = [name for kind, name in seen if kind == "query"]
    assert len(set(queried)) == 2 and all(str(name).startswith("ortdiff-test") for name in queried)
    assert {n for _, n in threads} == {torch.get_num_threads()}


def test_scope_summary_where_no_scope_explains_anything_is_one_line(stack_export) -> None:
    """A new user's float16 blame printed the heading 'by module scope' and then only '... 8 more scopes, 8 of
    them explaining 0 %': no rows under it. Where no scope explains a share, one line says so."""
    import dataclasses

    model, feeds = stack_export
    from pytest_ortdiff.engine.blame import node_scope

    planted = next(n.name for n in model.graph.node if node_scope(n) == "layers.1.norm")
    table = blame(model, feeds, kernels={planted: _wrong_epsilon_layer_norm})
    nothing = dataclasses.replace(table, rows=[dataclasses.replace(r, explained=0.0) for r in table.rows])
    scopes = nothing.by_scope()
    assert scopes and all(s.explained == 0 for s in scopes)
    text = nothing.render(top=3)
    assert f"by module scope: none of the {len(scopes)} scopes explains any of the gap (no node's swap alone closes a share of it)" in text.splitlines()
    assert "more scopes" not in text and "by module scope (" not in text
