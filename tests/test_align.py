"""Two graphs of one function side by side (align.compare_executions) and which onnxruntime optimization
level moved the numbers (align.check_optimization, ortdiff.check_optimization)."""

from __future__ import annotations

import contextlib
import io
import json
import random
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx.reference
import onnxruntime as ort
import pytest
import torch

from pytest_ortdiff import models
from pytest_ortdiff.analyses.align import (
    _GAP,
    Value,
    _align,
    _Features,
    check_optimization,
    compare_executions,
)

# -- the same Llama attention exported by both exporters, once per session -----------------------------


@pytest.fixture(scope="session")
def llama_exports() -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, torch.Tensor]]:
    from real_models import _torchlib_registry_built_once

    module = models.LlamaAttention(hidden=16, heads=2, kv_heads=1).eval()
    x = torch.linspace(-2, 2, 64).reshape(1, 4, 16)
    with warnings.catch_warnings(), _torchlib_registry_built_once():
        warnings.simplefilter("ignore")  # both exporters warn about their own internals
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(module, (x,), dynamo=True, verbose=False)
        assert program is not None
        buf = io.BytesIO()
        torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=18)
    return program.model_proto, onnx.load_from_string(buf.getvalue()), {"hidden_states": x}


def _ops(row: Any) -> tuple[str, str, str]:
    return (row.status, row.a.op_type if row.a is not None else "-", row.b.op_type if row.b is not None else "-")


def test_two_exporters_align_row_by_row(llama_exports) -> None:
    dynamo, torchscript, feeds = llama_exports
    al = compare_executions(dynamo, torchscript, feeds, labels=("dynamo", "torchscript"))
    # pinned: the input (named differently: fed by position), the rotary tables TorchScript computes at run
    # time and dynamo folded into initializers, then q's projection, identical in both
    assert [_ops(r) for r in al.rows[:9]] == [
        ("=", "", ""),
        ("+", "-", "Cos"),
        ("+", "-", "Cast"),
        ("+", "-", "Sin"),
        ("+", "-", "Cast"),
        ("=", "MatMul", "MatMul"),
        ("=", "Reshape", "Reshape"),
        ("=", "Transpose", "Transpose"),
        ("=", "MatMul", "MatMul"),
    ]
    assert (al.rows[0].a.name, al.rows[0].b.name) == ("hidden_states", torchscript.graph.input[0].name)
    # every value of dynamo's graph has its twin in TorchScript's, op for op, and none is off
    assert al.counts()["-"] == 0 and al.divergence is None
    assert all(r.a.op_type == r.b.op_type for r in al.pairs)
    last = al.rows[-1]
    assert last.a.output and last.b.output and last.a.op_type == last.b.op_type == "MatMul"
    # the output pair's error is the two graphs' outputs compared directly
    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (dynamo, torchscript)]
    outs = [s.run(None, {s.get_inputs()[0].name: feeds["hidden_states"].numpy()})[0] for s in sessions]
    assert last.max_abs == pytest.approx(float(np.abs(outs[0] - outs[1]).max()), abs=1e-12)
    text = al.render()
    assert "a = dynamo (39 values), b = torchscript" in text and "000  =  INPUT    float32  1x4x16" in text
    assert json.loads(json.dumps(al.to_dict()))["counts"]["!"] == 0


def test_a_planted_change_is_the_first_divergence(llama_exports) -> None:
    dynamo, torchscript, feeds = llama_exports
    planted = onnx.ModelProto()
    planted.CopyFrom(torchscript)
    node = next(n for n in planted.graph.node if n.name == "/MatMul_1")  # k's projection
    init = next(i for i in planted.graph.initializer if i.name in node.input)
    init.CopyFrom(onh.from_array(onh.to_array(init) * np.float32(1.01), init.name))
    al = compare_executions(dynamo, planted, feeds, labels=("dynamo", "planted"))
    first = al.divergence
    assert first is not None and first.b.node == "/MatMul_1" and first.a.op_type == "MatMul"
    assert all(r.status != "!" for r in al.rows[: al.first_divergence])
    # its error, from onnx's reference runtime (an independent implementation), value for value
    a = onnx.reference.ReferenceEvaluator(dynamo).run([first.a.name], {"hidden_states": feeds["hidden_states"].numpy()})[0]
    b = onnx.reference.ReferenceEvaluator(planted).run([first.b.name], {planted.graph.input[0].name: feeds["hidden_states"].numpy()})[0]
    assert first.max_abs == pytest.approx(float(np.abs(a - b).max()), rel=1e-4)
    assert f"first divergence beyond tolerance: row {al.first_divergence}: a 'matmul_1' (MatMul) vs b '/MatMul_1_output_0' (MatMul)" in al.render(around=2)
    # onnxruntime exposing 2 KiB of values per run, keeping 1 KiB (most pairs recomputed): the same rows
    chunked = compare_executions(dynamo, planted, feeds, chunk_mb=2 / 1024)
    assert [(r.status, r.max_abs) for r in chunked.rows] == [(r.status, r.max_abs) for r in al.rows]
    assert al.runs == (1, 1) and min(chunked.runs) > 4
    # the torch evaluator streams every value in one run (run(observe=...)): the same first divergence
    by_torch = compare_executions(dynamo, planted, feeds, runtime="torch")
    assert by_torch.divergence is not None and by_torch.divergence.b.node == "/MatMul_1" and by_torch.runs == (1, 1)


def test_a_graph_aligns_with_what_onnxruntime_runs_at_level_all(llama_exports) -> None:
    dynamo, _, feeds = llama_exports
    al = compare_executions(dynamo, dynamo, feeds, session_options_b={"graph_optimization_level": "all"})
    # onnxruntime lists the optimized graph's nodes in another order and fuses Transpose+MatMul+Mul into
    # FusedMatMul: every value it still computes is paired with its own, the two it fused away are a's only
    assert al.counts()["+"] == 0 and al.counts()["="] == len(al.pairs) and all(r.a.name == r.b.name for r in al.pairs)
    assert [r.a.op_type for r in al.rows if r.status == "-"] == ["Transpose", "MatMul"]
    assert "FusedMatMul" in {r.b.op_type for r in al.pairs}


def test_float16_conversion_aligns_with_float32() -> None:
    a = models.llama_attention(dtype="float32", hidden=16, heads=2, kv_heads=1)
    b = models.llama_attention(dtype="float16", hidden=16, heads=2, kv_heads=1)
    feeds = models.random_feeds(a, dims={"batch": 1, "seq": 4}, seed=0)  # float32: cast for b
    al = compare_executions(a, b, feeds)
    # every float32 value finds its float16 twin (the builders name nodes alike); only b's casts are extra
    assert al.counts()["-"] == 0 and al.divergence is None
    assert all(r.a.name == r.b.name for r in al.pairs)
    assert {r.b.op_type for r in al.rows if r.status == "+"} == {"Cast"}
    out = al.rows[-1]
    assert (out.a.dtype, out.b.dtype, out.status) == ("float32", "float16", "~")
    ref = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (a, b)]
    x = feeds["hidden_states"].numpy()
    got = [s.run(None, {"hidden_states": x.astype(dt)})[0].astype(np.float32) for s, dt in zip(ref, (np.float32, np.float16), strict=True)]
    assert out.max_abs == pytest.approx(float(np.abs(got[0] - got[1]).max()), abs=1e-12)


# -- the edit distance ------------------------------------------------------------------------------------


def _values(n: int, seed: int) -> list[Value]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        mean, std = r.uniform(-1, 1), r.uniform(0.1, 2)
        op = r.choice(["MatMul", "Add", "Mul", "Softmax"])
        sample = tuple(r.gauss(mean, std) for _ in range(16))
        out.append(Value(i, f"v{seed}_{i}", "result", op, dtype="float32", shape=(8, r.choice([4, 16])), mean=mean, std=std, min=mean - 2 * std, max=mean + 2 * std, abs_mean=abs(mean) + std / 2, sample=sample))
    return out


@pytest.mark.parametrize("band", [None, 3], ids=["full", "band"])
def test_edit_distance_finds_the_insertions_and_deletions(band: int | None) -> None:
    a = _values(60, 0)
    b = list(a)
    extra = _values(2, 1)
    del b[40]  # a's value 40 only in a
    b.insert(10, extra[0])  # only in b, twice
    b.insert(30, extra[1])
    ids: dict[Any, int] = {}
    pairs, cost = _align(_Features(a, ids), _Features(b, ids), band)
    only_a = [i for i, j in pairs if j is None]
    only_b = [b[j].name for i, j in pairs if i is None]
    assert only_a == [40] and only_b == [extra[0].name, extra[1].name]
    assert all(a[i].name == b[j].name for i, j in pairs if i is not None and j is not None)
    assert cost == 3 * _GAP  # three gaps; every pair identical


# -- which optimization level moved the numbers ------------------------------------------------------------


def _layer_norm_gelu() -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """LayerNorm written out (ReduceMean, Sub, Pow, ... : onnxruntime fuses it at "basic"), a MatMul, GELU
    written out (Div, Erf, Add, Mul, Mul: fused into com.microsoft's Gelu at "extended")."""
    rng = np.random.default_rng(0)
    h = 32
    inits = {
        "axes": np.array([-1], np.int64), "two": np.array(2, np.float32), "eps": np.array(1e-5, np.float32),
        "gamma": rng.standard_normal(h).astype(np.float32), "beta": rng.standard_normal(h).astype(np.float32),
        "w": rng.standard_normal((h, h)).astype(np.float32), "sqrt2": np.array(np.sqrt(2), np.float32),
        "one": np.array(1, np.float32), "half": np.array(0.5, np.float32),
    }  # fmt: skip
    nodes = [
        oh.make_node("ReduceMean", ["x", "axes"], ["mu"], name="ln_mean"),
        oh.make_node("Sub", ["x", "mu"], ["d"], name="ln_sub"),
        oh.make_node("Pow", ["d", "two"], ["p"], name="ln_pow"),
        oh.make_node("ReduceMean", ["p", "axes"], ["var"], name="ln_var"),
        oh.make_node("Add", ["var", "eps"], ["var_eps"], name="ln_eps"),
        oh.make_node("Sqrt", ["var_eps"], ["std"], name="ln_sqrt"),
        oh.make_node("Div", ["d", "std"], ["normed"], name="ln_div"),
        oh.make_node("Mul", ["normed", "gamma"], ["scaled"], name="ln_scale"),
        oh.make_node("Add", ["scaled", "beta"], ["ln"], name="ln_shift"),
        oh.make_node("MatMul", ["ln", "w"], ["h"], name="proj"),
        oh.make_node("Div", ["h", "sqrt2"], ["hd"], name="gelu_div"),
        oh.make_node("Erf", ["hd"], ["erf"], name="gelu_erf"),
        oh.make_node("Add", ["erf", "one"], ["erf1"], name="gelu_add"),
        oh.make_node("Mul", ["h", "erf1"], ["he"], name="gelu_mul"),
        oh.make_node("Mul", ["he", "half"], ["y"], name="gelu_half"),
    ]
    graph = oh.make_graph(
        nodes, "ln_gelu", [oh.make_tensor_value_info("x", 1, [4, h])], [oh.make_tensor_value_info("y", 1, [4, h])], [onh.from_array(v, k) for k, v in inits.items()]
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    return model, {"x": torch.from_numpy((rng.standard_normal((4, h)) * 3).astype(np.float32))}


def _session_outputs(model: onnx.ModelProto, feeds: dict[str, torch.Tensor], level: str) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]  # fmt: skip
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {k: v.numpy() for k, v in feeds.items()})[0]


def test_check_optimization_names_the_level_and_the_fused_node() -> None:
    model, feeds = _layer_norm_gelu()
    report = check_optimization(model, feeds)
    # onnxruntime itself, level by level: which levels change the bits, and by how much
    outs = {lv: _session_outputs(model, feeds, lv) for lv in ("disable", "basic", "extended", "all")}
    levels = list(outs)
    for prev, cur, change in zip(levels[:-1], levels[1:], report.levels[1:], strict=True):
        bits = int((outs[prev].view(np.int32) != outs[cur].view(np.int32)).sum())
        assert (change.level, change.bits_vs_previous) == (cur, bits)
        assert change.vs_previous.max_abs == float(np.abs(outs[prev] - outs[cur]).max())
        assert change.vs_unoptimized.max_abs == float(np.abs(outs["disable"] - outs[cur]).max())
    assert [c.level for c in report.moved] == ["basic", "extended"]
    basic, extended = report.moved
    assert basic.culprit.op_type == "LayerNormalization"
    assert basic.culprit.replaces == ("ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add")
    assert (extended.culprit.domain, extended.culprit.op_type) == ("com.microsoft", "Gelu")
    assert extended.culprit.replaces == ("Div", "Erf", "Add", "Mul", "Mul")
    # the first changed pair of each level is the fused node's output against the node it replaced
    assert (basic.first_changed_pair().a.op_type, basic.first_changed_pair().b.op_type) == ("Add", "LayerNormalization")
    assert (extended.first_changed_pair().a.name, extended.first_changed_pair().b.op_type) == ("y", "Gelu")
    assert report.passed and report.culprit is basic  # within float32's default tolerance
    strict = check_optimization(model, feeds, levels=("disable", "basic"), tolerance=(0.0, 0.0))
    assert not strict.passed and strict.culprit.level == "basic" and strict.levels[1].violations
    text = strict.render()
    assert "'basic' moves" in text and "produced by: LayerNormalization 'ln_scale/LayerNormFusion/'" in text
    assert json.loads(json.dumps(report.to_dict()))["culprit_level"] == "basic"


def test_fixture_check_optimization(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_opt="""
        import numpy as np, onnx, onnx.helper as oh, onnx.numpy_helper as onh, torch
        import pytest

        def build():
            rng = np.random.default_rng(0)
            nodes = [
                oh.make_node("Div", ["x", "sqrt2"], ["hd"]), oh.make_node("Erf", ["hd"], ["erf"]),
                oh.make_node("Add", ["erf", "one"], ["erf1"]), oh.make_node("Mul", ["x", "erf1"], ["he"]),
                oh.make_node("Mul", ["he", "half"], ["y"]),
            ]
            inits = [onh.from_array(np.array(v, np.float32), k) for k, v in {"sqrt2": np.sqrt(2), "one": 1, "half": 0.5}.items()]
            graph = oh.make_graph(nodes, "gelu", [oh.make_tensor_value_info("x", 1, [4, 32])], [oh.make_tensor_value_info("y", 1, [4, 32])], inits)
            model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
            return model, {"x": torch.from_numpy((rng.standard_normal((4, 32)) * 3).astype(np.float32))}

        def test_within(ortdiff):
            report = ortdiff.check_optimization(*build())
            assert report.passed and report.culprit.level == "extended"

        @pytest.mark.ortdiff(atol=0, rtol=0)
        def test_bitwise(ortdiff):
            ortdiff.check_optimization(*build(), levels=("disable", "extended"))
        """
    )
    result = pytester.runpytest("--ortdiff-reports")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff.check_optimization: gelu on CPU, tolerance atol=0 rtol=0: 'extended' moves * output elements (BEYOND tolerance) by com.microsoft:Gelu*",
            "*produced by: com.microsoft:Gelu*(replaces Div, Erf, Add, Mul, Mul)",
        ]
    )
    result.stdout.fnmatch_lines(["*test_bitwise* [[]optimization[]]  *failed*"])


def test_bad_arguments_name_the_fix(llama_exports) -> None:
    dynamo, torchscript, feeds = llama_exports
    with pytest.raises(ValueError, match=r"feeds for a: 2 value\(s\) given by position, a has 1 input"):
        compare_executions(dynamo, torchscript, [feeds["hidden_states"]] * 2)
    with pytest.raises(ValueError, match="runtime='torch' runs the graph with the torch evaluator: leave them out"):
        compare_executions(dynamo, torchscript, feeds, runtime="torch", session_options_a={"graph_optimization_level": "all"})
    with pytest.raises(ValueError, match=r"levels: \['fast'\]; valid: disable, basic, extended, all"):
        check_optimization(dynamo, feeds, levels=("disable", "fast"))
