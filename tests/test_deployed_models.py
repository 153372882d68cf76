"""The deployed-model corpus (tests/deployed_models.py) through the evaluator, the oracle, blame, precision,
fuzzing and reproducibility, every node on a torch kernel (missing="error"): what onnxruntime's own tool chain
writes runs, and matches onnxruntime, or departs from it by what the report names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import deployed_models as dm
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
import torch

from pytest_ortdiff import Checker, TorchEvaluator
from pytest_ortdiff.engine.check import ToleranceBroken
from pytest_ortdiff.models import set_feed_range, transformer_feeds

Deployed = Callable[[str], Path]

#: forms where onnxruntime departs from the op's meaning on purpose, and what names the departure: MatMulNBits at
#: accuracy_level 4 quantizes its activations to int8 per block (onnxruntime-genai's CPU int4 sets it too)
DEPARTS = {"llama-dynamo-int4acc4": "MatMulNBits", "llama-genai-int4": "MatMulNBits", "qwen2-genai-int4shared": "MatMulNBits"}
#: forms whose onnxruntime session (at its default level) runs fused integer kernels for the QDQ pairs
#: (QLinearMatMul, ...): the graph as written matches; check_optimization names the level that departs
FUSED_BY_ONNXRUNTIME = {"bert-torchscript-qdq"}


def _case_dtype(form: str) -> str:
    """A float16 form with float16 inputs and outputs is a float16 case; keep_io_types' forms are float32 cases
    judged as float16 (their compute dtype)."""
    return "float16" if form.endswith("fp16io") else "float32"


@pytest.mark.parametrize("form", [f for f in dm.DEFAULT if f not in DEPARTS and f not in FUSED_BY_ONNXRUNTIME])
def test_every_deployed_form_runs_on_torch_kernels_and_matches_onnxruntime(form: str, deployed: Deployed) -> None:
    path = deployed(form)
    feeds = dm.feeds(path, batch=2, seq=5)
    result = Checker("CPU", _case_dtype(form)).check(path, feeds)  # missing="error": every node on a torch kernel
    assert result.passed and not result.ran_on_ort
    if "fp16" in form:
        assert result.tolerance == Checker("CPU", "float16").tolerance  # (judged as float16, whatever its I/O)


@pytest.mark.parametrize("form", sorted(DEPARTS))
def test_where_onnxruntime_departs_on_purpose_blame_names_the_op(form: str, deployed: Deployed) -> None:
    """MatMulNBits at accuracy_level 4: onnxruntime computes with int8-quantized activations, the evaluator
    the op's meaning (float activations): the check fails by that much, swapping every MatMulNBits to
    onnxruntime explains most of the gap (each one alone a share of it), the report names the departure, and
    the torch evaluator is the closer to the float64 oracle."""
    path = deployed(form)
    feeds = dm.feeds(path)
    with pytest.raises(ToleranceBroken) as info:
        Checker("CPU", "float32").check(path, feeds, blame=True)
    table = info.value.result.blame
    assert table is not None and table.op_rows[0].op_type == DEPARTS[form] and table.op_rows[0].explained > 0.8
    assert table.closer_to_oracle == "torch"
    assert f"{DEPARTS[form]} accuracy_level=4: onnxruntime quantizes A to int8" in str(info.value)


def test_a_qdq_model_matches_as_written_and_check_optimization_names_the_fusing_level(deployed: Deployed) -> None:
    """quantize_static's QDQ BERT: the graph as written, onnxruntime without optimizations, is the evaluator's
    bit for bit; at its default level onnxruntime runs integer kernels (QLinearMatMul, QLinearAdd) whose
    rounding flips a few outputs by one quantization step, and check_optimization names the level and node."""
    from pytest_ortdiff import OrtRunner
    from pytest_ortdiff.analyses.align import check_optimization

    path = deployed("bert-torchscript-qdq")
    feeds = dm.feeds(path, batch=2, seq=5)
    (ours,) = TorchEvaluator(str(path)).run(None, feeds)
    (as_written,) = OrtRunner(str(path), session_options={"graph_optimization_level": "disable"}).run(None, feeds)
    assert torch.equal(ours, as_written)
    with pytest.raises(ToleranceBroken):
        Checker("CPU", "float32").check(path, feeds)  # onnxruntime's default level: integer kernels
    report = check_optimization(path, feeds)
    culprit = report.culprit
    assert report.levels[0].level == "disable" and report.levels[0].within_tolerance
    assert culprit is not None and culprit.level == "extended" and not culprit.within_tolerance
    assert culprit.culprit is not None and culprit.culprit.op_type.startswith("QLinear")


# -- blame on a planted wrong contrib kernel ------------------------------------------------------------


def _bias_gelu_with_sigmoid(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A BiasGelu written with QuickGelu's sigmoid formula, x * sigmoid(1.702 x): a GELU's likeliest wrong twin."""
    h = x + bias
    return h * torch.sigmoid(1.702 * h)


def test_blame_names_a_planted_wrong_contrib_kernel(deployed: Deployed) -> None:
    """ViT after onnxruntime's optimizer (BiasGelu, SkipLayerNormalization), its BiasGelu kernel swapped for a
    sigmoid one: the check fails and blame's culprit is that node, explaining the gap."""
    path = deployed("vit-torchscript-opt")
    model = onnx.load(str(path))
    gelu = next(n for n in model.graph.node if n.op_type == "BiasGelu")
    feeds = dm.feeds(path, batch=2)
    Checker("CPU", "float32").check(path, feeds)  # (the real kernels pass)
    with pytest.raises(ToleranceBroken) as info:
        Checker("CPU", "float32").check(path, feeds, kernels={("com.microsoft", "BiasGelu"): _bias_gelu_with_sigmoid}, blame=True)
    table = info.value.result.blame
    assert table is not None and table.culprit is not None
    assert (table.culprit.node, table.culprit.op_type) == (gelu.name, "BiasGelu") and table.culprit.explained > 0.9


# -- the float64 oracle on an int4 model ------------------------------------------------------------------


def _dequantized_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each MatMulNBits (4 bits, symmetric, no zero points) replaced by MatMul on its weight
    dequantized by numpy in float64 (exact: a 4-bit integer times a float32 scale), kept in float64 behind a
    Cast: the oracle computes in float64 what the int4 weights mean."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = {i.name: nh.to_array(i) for i in out.graph.initializer}
    nodes = []
    for node in out.graph.node:
        if node.op_type != "MatMulNBits":
            nodes.append(node)
            continue
        attrs = {a.name: a.i for a in node.attribute}
        assert len(node.input) == 3 and attrs["bits"] == 4, "a symmetric int4 MatMulNBits without zero points"
        packed, scales = init[node.input[1]], init[node.input[2]].astype(np.float64)
        n, blocks, _ = packed.shape
        nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, attrs["block_size"]).astype(np.float64)
        w = ((nibbles - 8.0) * scales.reshape(n, blocks, 1)).reshape(n, -1)[:, : attrs["K"]].T
        name = f"{node.name}.dequantized"
        out.graph.initializer.append(nh.from_array(np.ascontiguousarray(w), name))
        nodes += [oh.make_node("Cast", [name], [f"{name}.f"], to=onnx.TensorProto.FLOAT), oh.make_node("MatMul", [node.input[0], f"{name}.f"], list(node.output))]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_the_oracle_of_an_int4_model_is_its_weights_dequantized_in_float64(deployed: Deployed) -> None:
    """The float64 oracle of Llama's int4 form equals, to float64's rounding, the oracle of the same graph with
    numpy's float64 dequantization of every MatMulNBits; onnxruntime and the torch evaluator are each judged
    against it, no node on onnxruntime."""
    path = deployed("llama-dynamo-int4")
    feeds = dm.feeds(path, batch=2, seq=5)
    checker = Checker("CPU", "float32")
    (oracle,) = checker.oracle(path, feeds)
    (twin,) = TorchEvaluator(_dequantized_twin(onnx.load(str(path))), compute_dtype=torch.float64, check_model=False).run(None, feeds)
    assert oracle.dtype == torch.float64
    torch.testing.assert_close(oracle, twin, atol=1e-12, rtol=1e-12)
    result = checker.check(path, feeds, reference="float64")
    assert len(result.judgements) == 2 and not result.ran_on_ort and result.closer in ("onnxruntime", "torch", "tie")


# -- oracle, blame, precision, fuzz and reproducibility with no op sent to onnxruntime ----------------


@pytest.mark.parametrize("form", ["bert-torchscript-opt", "llama-genai-int4", "t5-torchscript-opt"])
def test_the_oracle_blame_and_reproducibility_run_every_node_on_torch(form: str, deployed: Deployed) -> None:
    path = deployed(form)
    feeds = dm.feeds(path)
    checker = Checker("CPU", "float32")
    oracle_ev = checker.evaluator(checker.prepare(path, feeds), runtime="float64")
    assert not oracle_ev.ops_run_by_ort
    for out in oracle_ev.run(None, feeds):
        assert out.dtype in (torch.float64, torch.int64, torch.int32) and bool(torch.isfinite(out.double()).all())
    table = checker.blame(path, feeds)
    assert len(table.rows) == len(onnx.load(str(path), load_external_data=False).graph.node)
    # (onnxruntime's own optimization levels move a MatMul's bits: threads and repeats are the question here)
    report = checker.check_reproducible(path, feeds, runs=2, vary=("threads",))
    assert report.reproducible


def test_the_precision_audit_and_keep_list_run_on_an_optimized_graph(deployed: Deployed) -> None:
    """BERT after onnxruntime's optimizer, its fused contrib nodes audited for float16 and converted by the
    keep-in-float32 search: no traceback, every node audited, the keep list verified on onnxruntime."""
    from pytest_ortdiff.analyses import precision

    path = deployed("bert-torchscript-opt")
    feeds = [dm.feeds(path, seed=s) for s in range(2)]
    audit = precision.audit(path, feeds)
    audited = {n.op_type for n in audit.nodes}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"} <= audited
    keep = precision.keep_float32(path, feeds, tolerance={"budget": {1e-2: 0.01}})
    assert keep.status in ("verified", "nothing to keep")


def test_fuzz_runs_an_optimized_graph_over_batch_and_sequence(deployed: Deployed) -> None:
    path = deployed("bert-torchscript-opt")
    model = onnx.load(str(path))
    set_feed_range(model, "input_ids", 0, dm.VOCAB)
    set_feed_range(model, "attention_mask", 1, 2)  # (ones: a mask of 0..9 means nothing)
    set_feed_range(model, "token_type_ids", 0, 2)
    checker = Checker("CPU", "float32")
    from pytest_ortdiff.analyses.fuzz import fuzz

    result = fuzz(checker, model, dims={"batch": (1, 3), "sequence": (1, 16)}, max_examples=5)
    assert result.examples == 5


def test_decoder_feeds_with_past_run_on_torch_kernels(deployed: Deployed) -> None:
    """onnxruntime-genai's decode step (one new token after 6 cached ones) in the evaluator, matching onnxruntime."""
    path = deployed("llama-genai-fp32")
    feeds = transformer_feeds(path, batch=2, sequence=1, past=6)
    result = Checker("CPU", "float32").check(path, feeds)
    assert result.passed and not result.ran_on_ort
    assert result.outputs["present.0.key"].shape == (2, 2, 7, 16)


def test_quantize_linear_of_nan_saturates_low_as_onnxruntime_does() -> None:
    """quantize_static's QDQ Llama (TorchScript) quantizes NaN attention probabilities (the float32-min mask
    through QDQ): onnxruntime gives the type's lowest value whatever the zero point; the kernel gave 127 for a
    zero point of -128 (NaN's undefined int64 conversion, INT64_MIN, plus -128, wrapped round)."""
    from pytest_ortdiff import OrtRunner

    for elem, zp in ((onnx.TensorProto.INT8, -128), (onnx.TensorProto.INT8, 5), (onnx.TensorProto.UINT8, 7)):
        graph = oh.make_graph(
            [oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], "q", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [300])],
            [oh.make_tensor_value_info("y", elem, [300])], [oh.make_tensor("s", onnx.TensorProto.FLOAT, [], [0.1]), oh.make_tensor("z", elem, [], [zp])],
        )
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=9)
        x = {"x": torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 1.0] * 60)}
        (ours,) = TorchEvaluator(model).run(None, x)
        (expected,) = OrtRunner(model).run(None, x)
        assert torch.equal(ours, expected), (elem, zp, ours[:5], expected[:5])
