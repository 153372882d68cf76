"""keep_float32: the smallest verified keep-in-float32 list. On the T5-like module (tests/t5_like.py: trained-like
scales, padded inputs) exported to ONNX: the list makes the float16 model meet its budget on onnxruntime, is 10x
smaller than the seeds' range-only rule's list (transformer-deploy's, checked against its code's logic) and
smaller than the op-type block list, with an error no worse than theirs; its simulation is the converted model
bit for bit. On small graphs: 1-minimality (checked by onnx.reference), the ends that are not a list, bfloat16,
the report's forms, and the `ortdiff.check_half_precision` check in real pytest runs."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator
from t5_like import T5Like, export_t5_like, t5_feeds

from pytest_ortdiff import TorchEvaluator, compare, models
from pytest_ortdiff.analyses.precision import KeepReport, keep_float32
from pytest_ortdiff.analyses.precision.keep import (
    OP_TYPE_BLOCK_LIST,
    _float32_values,
    _Simulator,
    convert_half,
    range_flagged,
)
from pytest_ortdiff.numerics.tolerance import Tolerance
from pytest_ortdiff.runtimes.ort import OrtRunner

#: small graphs: at most 1 % of elements off by more than 0.01, none by more than 0.1 (outputs about ±3)
BUDGET = {1e-2: 0.01, 0.1: 0.0}
TOL = Tolerance(budget=BUDGET)
#: the T5-like encoder (8 layers, outputs up to about ±8): the seeds' own tolerances for T5 in float16
#: (seeds/001: atol 0.1 for t5-small, 0.5 for t5-large, "rounding errors increase with number of layers"):
#: at most 1 % of elements off by more than 0.1, none by more than 0.5
T5_BUDGET = {0.1: 0.01, 0.5: 0.0}
T5_TOL = Tolerance(budget=T5_BUDGET)
#: the converter's own op_block_list, as far as the T5-like graph goes
DEFAULT_BLOCKED = ("Range", "Min")


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread: the T5-like tensors are tiny, and more threads only contend for the cores
    (several times slower on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def t5() -> tuple[T5Like, onnx.ModelProto, list[dict[str, torch.Tensor]]]:
    module = T5Like()
    with _one_thread():
        return module, export_t5_like(module), t5_feeds(samples=2)


@pytest.fixture(scope="session")
def t5_report(t5: Any) -> KeepReport:
    _, model, feeds = t5
    with _one_thread():
        return keep_float32(model, feeds, tolerance=T5_TOL)


@pytest.fixture(scope="session")
def t5_truth(t5: Any) -> list[torch.Tensor]:
    """The module in eager float64: the oracle, independent of the ONNX graph and the evaluator."""
    module, _, feeds = t5
    wide = copy.deepcopy(module).double()
    with torch.no_grad(), _one_thread():
        return [wide(f["input_ids"], f["attention_mask"]) for f in feeds]


def _broken(
    expected: torch.Tensor, got: torch.Tensor, budget: dict[float, float] = BUDGET
) -> list[Any]:
    report = compare(expected.float(), got.float(), thresholds=sorted(budget))
    return Tolerance(budget=budget).check(report)


def _max_error(expected: torch.Tensor, got: torch.Tensor) -> float:
    d = (got.double() - expected).abs()
    return math.inf if not bool(torch.isfinite(got).all()) else float(d.max())


def test_t5_keep_list_meets_the_budget_on_onnxruntime_and_in_float16_arithmetic(
    t5: Any, t5_truth: list[torch.Tensor], t5_report: KeepReport
) -> None:
    _, _, feeds = t5
    assert t5_report.status == "verified", t5_report.render()
    converted = t5_report.converted_model
    assert converted is not None
    onnx.checker.check_model(converted)
    runner = OrtRunner(converted.SerializeToString())
    half = TorchEvaluator(converted)
    errors = {"ort": 0.0, "half": 0.0}
    with _one_thread():
        for f, truth in zip(feeds, t5_truth, strict=True):
            for key, got in (("ort", runner.run(None, f)[0]), ("half", half.run(None, f)[0])):
                assert _broken(truth, got, T5_BUDGET) == []
                errors[key] = max(errors[key], _max_error(truth, got))
    # the report's errors, measured against the evaluator's float64 oracle, are the eager module's too
    _, ort, arith = t5_report.results[0].outcomes
    assert math.isclose(ort.max_abs, errors["ort"], abs_tol=1e-5) and math.isclose(
        arith.max_abs, errors["half"], abs_tol=1e-5
    )
    # the kept nodes compute in float32 in the converted model: their float inputs are float32 there
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in onnx.shape_inference.infer_shapes(converted).graph.value_info
    }
    for node in converted.graph.node:
        if node.name in t5_report.keep:
            floats = [
                types[x]
                for x in node.input
                if types.get(x) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
            ]
            assert floats and set(floats) == {onnx.TensorProto.FLOAT}, node.name


def test_t5_list_is_ten_times_smaller_than_the_range_only_rule_and_beats_the_op_type_list(
    t5: Any, t5_report: KeepReport
) -> None:
    """Sizes, and each list's converted model in float16 arithmetic against the oracle (the report's numbers:
    the test above and the one below check the report's runtimes against eager float64 and bit for bit).
    The range-only list is the seeds' tool's, nodes flagged and the consumer it keeps with each (checked in
    the next test); find_node_fp32's flags alone are fewer (docs/deployment/half-precision.md gives both figures)."""
    _, model, _ = t5
    ours, by_op, ranged = (
        t5_report.result(m) for m in ("keep_float32", "op-type block list", "range-only rule")
    )
    assert 0 < 10 * t5_report.size <= len(ranged.nodes), t5_report.render()
    assert (
        t5_report.size
        < len(by_op.nodes)
        == sum(n.op_type in OP_TYPE_BLOCK_LIST for n in model.graph.node)
    )
    half = [r.outcomes[2] for r in (ours, by_op, ranged)]
    assert [o.runtime for o in half] == ["float16 arithmetic"] * 3
    assert half[0].passed and half[0].max_abs <= min(half[1].max_abs, half[2].max_abs), (
        t5_report.render()
    )
    assert ours.verified and not by_op.verified
    # the simulation agrees with the converted model for every list
    for r in t5_report.results:
        assert r.outcomes[0].max_abs == r.outcomes[2].max_abs, r.method


def _find_node_fp32(model: onnx.ModelProto, feeds: list[dict[str, torch.Tensor]]) -> list[str]:
    """transformer-deploy's get_keep_fp32_nodes, its logic as its code writes it, on every float32 node
    output of the float32 model (the evaluator's intermediates): find_node_fp32's test on each input, then
    each flagged node's output mapped to the last node reading it, kept too."""
    producer = {o: n.name for n in model.graph.node for o in n.output}
    keep: list[str] = []
    ev = TorchEvaluator(model)
    for f in feeds:
        for name, t in ev.run(None, f, intermediates=True).items():
            if name not in producer or not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                continue
            tiny = (t < 5.96e-08) & (t > -5.96e-08) & (t != 0)
            out_of_range = torch.any(t > 65504.0) or torch.any(t < -65504.0) or torch.any(tiny)
            if bool(out_of_range) and producer[name] not in keep:
                keep.append(producer[name])
    reader = {x: n.name for n in model.graph.node for x in n.input}
    skip = {v.name for v in [*model.graph.input, *model.graph.output, *model.graph.initializer]}
    children = [
        reader[o]
        for n in model.graph.node
        if n.name in keep
        for o in n.output
        if o not in skip and o in reader
    ]
    return keep + children


def test_t5_range_only_rule_is_transformer_deploys(t5: Any, t5_report: KeepReport) -> None:
    """The range-only list is what the seeds' tool keeps on the same inputs, and it keeps in every layer what
    the float16 model does not need: the padding mask's float32 min (±inf in float16, then exp(-inf) = 0),
    the peaked attention's exp and probabilities below 6e-8, the gelu's tails."""
    _, model, feeds = t5
    with _one_thread():
        reference = _find_node_fp32(model, feeds)
    ranged = t5_report.result("range-only rule")
    assert set(ranged.nodes) == set(reference) and len(ranged.nodes) == len(set(reference))
    assert t5_report.audit is not None
    flagged = set(range_flagged(t5_report.audit))
    assert f"({len(flagged)}: transformer-deploy's find_node_fp32)" in ranged.rule
    layers = range(len(t5[0].blocks))
    needless = {f"/blocks.{i}/attn/{op}" for i in layers for op in ("Add", "Exp", "Div_1")}
    assert needless <= flagged and not needless & set(t5_report.keep)


def test_t5_needs_a_list_eager_float16_breaks(t5: Any, t5_truth: list[torch.Tensor]) -> None:
    """The module itself in float16 (eager torch, no ONNX involved) breaks the budget: its last norms'
    squares overflow, the rows they normalize become 0. The search has a reason to exist."""
    _, _, feeds = t5
    with torch.no_grad(), _one_thread():
        y = T5Like().half()(feeds[0]["input_ids"], feeds[0]["attention_mask"])
    assert _broken(t5_truth[0], y, T5_BUDGET) and _max_error(t5_truth[0], y) > 1.0


def _simulated_and_converted(
    model: onnx.ModelProto,
    keeps: list[set[str]],
    feeds: dict[str, torch.Tensor],
    half: str = "float16",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each list of `keeps`: keep_float32's simulation of `model` with it in float32, and the model
    converted with it run by the evaluator (`half` nodes in `half`)."""
    floats = _float32_values(model)
    blocked = set(DEFAULT_BLOCKED)
    candidates = frozenset(
        n.name
        for n in model.graph.node
        if n.op_type not in blocked and any(x in floats for x in [*n.input, *n.output])
    )
    sim = _Simulator(model, half, candidates, floats, keep_io_types=True, device="cpu")
    return [
        (
            sim.run(feeds, candidates - keep)[0],
            TorchEvaluator(convert_half(model, keep, dtype=half)).run(None, feeds)[0],
        )
        for keep in keeps
    ]


def test_keep_float32s_simulation_is_the_converted_model_bit_for_bit(
    t5: Any, t5_report: KeepReport
) -> None:
    """The premise of the search: its simulation computes what the model converted with the same list
    computes in float16 arithmetic, bit for bit. On the T5-like model with the list and with no list (NaN
    at the same places) and in bfloat16, where the converter clips the mask's float32 min to the half
    type's max (the evaluator's own "float16" override rounds it to -inf, and 0 * -inf is NaN), and on
    LayerNormalization, whose float32 stash type the converter keeps (that override normalizes in float16
    there). onnxruntime's CPU provider is no such reference: it computes most float16 nodes in float32
    (the report's note counts them)."""
    _, model, feeds = t5
    padded = next(f for f in feeds if not bool(f["attention_mask"].all()))
    with _one_thread():
        pairs = _simulated_and_converted(model, [set(t5_report.keep), set()], padded)
    for simulated, converted in pairs:
        assert torch.equal(simulated.isnan(), converted.isnan()) and torch.equal(
            simulated.nan_to_num(), converted.nan_to_num()
        )
    # bfloat16 too; the mask's float32 min is clipped to bfloat16's max, not rounded to -inf (NaN)
    with _one_thread():
        [(simulated, converted)] = _simulated_and_converted(model, [set()], padded, "bfloat16")
    assert torch.equal(simulated, converted) and not bool(converted.isnan().any())
    ln = models.layer_norm_matmul_add(dtype="float32")
    [(simulated, converted)] = _simulated_and_converted(
        ln, [set()], models.random_feeds(ln, dims={"a": 2, "b": 4, "c": 16}, seed=0)
    )
    assert torch.equal(simulated, converted)
    assert any("onnxruntime's CPU provider computes" in n for n in t5_report.notes)


# -- small graphs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def softmax_case() -> tuple[onnx.ModelProto, list[dict[str, torch.Tensor]], KeepReport]:
    model = models.fp16_hazards("softmax", dtype="float32")
    feeds = [models.random_feeds(model, dims={"batch": 2, "n": 64}, seed=s) for s in range(2)]
    return model, feeds, keep_float32(model, feeds, tolerance=TOL)


def _reference_breaks(
    model: onnx.ModelProto, feeds: list[dict[str, torch.Tensor]], oracle: list[np.ndarray]
) -> bool:
    """onnx.reference (numpy, float16 arithmetic) on the converted model breaks the budget on some input."""
    with np.errstate(all="ignore"):
        got = [
            next(iter(ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in f.items()})))
            for f in feeds
        ]
    return any(
        _broken(torch.from_numpy(o), torch.from_numpy(np.asarray(g)))
        for o, g in zip(oracle, got, strict=True)
    )


def test_keep_list_is_one_minimal_on_a_small_graph(softmax_case: Any) -> None:
    """Exp / ReduceSum(Exp) without the max subtracted: keep all three nodes, and dropping any one breaks
    the budget in onnx.reference's float16 arithmetic too (an independent runtime), against float64 numpy."""
    model, feeds, report = softmax_case
    assert report.status == "verified" and sorted(report.keep) == ["exp", "normalize", "sum_exp"], (
        report.render()
    )
    oracle = []
    for f in feeds:
        x = f["X"].double().numpy()
        e = np.exp(x)
        oracle.append(e / e.sum(-1, keepdims=True))
    assert not _reference_breaks(convert_half(model, report.keep), feeds, oracle)
    for node in report.keep:
        assert _reference_breaks(convert_half(model, set(report.keep) - {node}), feeds, oracle), (
            node
        )
        assert node in report.why


def test_unreachable_tolerance_and_spent_runs_end_with_a_reason(softmax_case: Any) -> None:
    model, feeds, _ = softmax_case
    exact = keep_float32(model, feeds, tolerance=(0.0, 0.0))
    assert exact.status == "unreachable" and exact.converted_model is None
    assert "cannot be met even with every node in float32" in exact.render()
    with pytest.raises(
        ValueError, match="no converted model to write: the search ended 'unreachable'"
    ):
        exact.write_converted("never.onnx")
    stopped = keep_float32(model, feeds, tolerance=TOL, max_runs=2)
    assert stopped.status == "stopped" and stopped.runs <= 2
    assert "stopped at max_runs=2 evaluator runs" in stopped.render()


def test_report_forms(softmax_case: Any, tmp_path: Any) -> None:
    _, _, report = softmax_case
    data = json.loads(json.dumps(report.to_dict()))
    assert data["keep"] == list(report.keep) and data["size"] == 3 and data["status"] == "verified"
    assert [r["method"] for r in data["results"]] == [
        "keep_float32",
        "op-type block list",
        "range-only rule",
        "no list",
    ]
    text = report.render()
    assert (
        "keep in float32: 3 nodes, 1-minimal" in text
        and "range-only rule" in text
        and "op-type block list" in text
    )
    path = report.write_converted(tmp_path / "half.onnx")
    written = onnx.load(str(path))
    onnx.checker.check_model(written)
    assert {n.name for n in written.graph.node} >= set(report.keep)


def test_bfloat16_keeps_float32s_range() -> None:
    """bfloat16 does not overflow where float16 does: nothing to keep for the float16 overflow hazard; the
    converted model holds bfloat16 weights, and onnxruntime's CPU provider, which has no bfloat16 MatMul or
    Exp, is named as not run rather than failing the search."""
    model = models.fp16_hazards("softmax", dtype="float32")
    feeds = [models.random_feeds(model, dims={"batch": 2, "n": 16}, seed=0)]
    report = keep_float32(model, feeds, dtype="bfloat16", tolerance={"budget": {0.05: 0.0}})
    assert report.status == "nothing to keep" and report.keep == (), report.render()
    ort = report.results[0].outcomes[1]
    assert ort.runtime == "onnxruntime CPU" and (not ort.ran or ort.passed)
    assert "bfloat16 keeps float32's range" in report.render()
    converted = report.converted_model
    assert converted is not None
    assert onnx.TensorProto.BFLOAT16 in {
        vi.type.tensor_type.elem_type for vi in converted.graph.value_info
    }


# -- ortdiff.check_half_precision in real pytest runs ---------------------------------------------------

HALF_TEST = """
import pytest
from pytest_ortdiff import models

@pytest.mark.ortdiff(dtypes=["float32", "float16"], budget={0.01: 0.01, 0.1: 0})
def test_softmax_overflows(ortdiff):
    model = models.fp16_hazards("softmax", dtype="float32")
    feeds = [models.random_feeds(model, dims={"batch": 2, "n": 64}, seed=s) for s in range(2)]
    ortdiff.check_half_precision(model, feeds)

@pytest.mark.ortdiff(dtypes=["float16"])
def test_layer_norm_converts_fine(ortdiff):
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = [models.random_feeds(model, dims={"a": 2, "b": 4, "c": 16}, seed=s) for s in range(2)]
    verdict = ortdiff.check_half_precision(model, feeds, budget={0.05: 0.0})
    assert verdict.passed and verdict.keep is None
"""


def test_check_half_precision_fails_with_the_audit_and_the_keep_list(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(HALF_TEST)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*ortdiff: float16 conversion on CPU: tolerance broken*",
            "*float16 arithmetic: max abs*",
            "*float16 range audit of 'fp16_hazard_softmax'*",
            "*flagged:*",
            "*↳ overflows float16*",
            "*keep in float32: 3 nodes, 1-minimal*",
            "*status: verified*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*SKIPPED*check_half_precision converts a float32 model to float16 or bfloat16; this case is float32*"
        ]
    )


def test_write_converted_under_a_full_disk_keeps_the_model_that_was_there(
    softmax_case: Any, tmp_path: Any, file_size_limit: Any
) -> None:
    """Issue 29, item 2: the write fails midway (the file-size limit, as a full disk): the model that was at
    the path survives byte for byte, and no temporary file stays; without the fault the new model replaces it."""
    import errno

    _, _, report = softmax_case
    out = tmp_path / "half.onnx"
    old = b"the model that was there\n" * 100
    out.write_bytes(old)
    assert report.converted_model is not None
    with file_size_limit(report.converted_model.ByteSize() // 2), pytest.raises(OSError) as caught:
        report.write_converted(out)
    assert caught.value.errno in (errno.EFBIG, errno.ENOSPC)
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.onnx"]
    assert report.write_converted(out) == out
    assert onnx.load(str(out)) == report.converted_model
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.onnx"]


@contextmanager
def _full_temporary_directory(file_size_limit: Any) -> Iterator[None]:
    """Files written inside a tempfile.TemporaryDirectory fail past 64 bytes (as in a full temporary directory):
    onnxruntime cannot write the graph it loads there, the fault issue 29's item 11 hit."""
    import tempfile

    real = tempfile.TemporaryDirectory

    @contextmanager
    def full(*args: Any, **kwargs: Any) -> Iterator[str]:
        with real(*args, **kwargs) as tmp, file_size_limit(64):
            yield tmp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "TemporaryDirectory", full)
        yield


NOT_TOLD = "not told whether onnxruntime's CPU provider computes some float16 nodes in float32: reading the graph it loads needs a file in the temporary directory, which failed ("


def test_a_full_temporary_directory_costs_a_note_not_the_search(softmax_case: Any, file_size_limit: Any) -> None:
    """Issue 29, item 11: the note on onnxruntime's float32 upcasts needs a temporary file; when it cannot be
    written the note says so in a line, and the search's result is the one found without the fault."""
    model, feeds, report = softmax_case
    with _full_temporary_directory(file_size_limit):
        degraded = keep_float32(model, feeds, tolerance=TOL)
    assert (degraded.status, degraded.keep, degraded.converted_model) == (report.status, report.keep, report.converted_model)
    (note,) = [n for n in degraded.notes if n.startswith("not told")]
    assert note.startswith(NOT_TOLD) and note.endswith("); free space there or point TMPDIR elsewhere to have this note")
    assert f"note: {note}" in degraded.render()


def test_precision_command_with_a_full_temporary_directory_prints_the_list(cli: Any, tmp_path: Any, file_size_limit: Any) -> None:
    path = tmp_path / "softmax.onnx"
    onnx.save(models.fp16_hazards("softmax", dtype="float32"), str(path))
    with _full_temporary_directory(file_size_limit):
        result = cli("precision", str(path), "--dim", "batch=2", "--dim", "n=64", "--samples", "2", "--budget", "0.01:0.01,0.1:0")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "keep in float32: 3 nodes, 1-minimal" in result.stdout and "status: verified" in result.stdout
    assert f"note: {NOT_TOLD}" in result.stdout


def test_precision_command_whose_write_fails_prints_the_list_first(cli: Any, tmp_path: Any, file_size_limit: Any) -> None:
    """The converted model cannot be written (the file-size limit, as a full disk): the finished search is on
    stdout all the same, the error names the path, and the file that was there is untouched."""
    path = tmp_path / "softmax.onnx"
    onnx.save(models.fp16_hazards("softmax", dtype="float32"), str(path))
    out = tmp_path / "half.onnx"
    onnx.save(models.fp16_hazards("softmax", dtype="float16"), str(out))  # (an earlier conversion: a model, so replaceable)
    before = out.read_bytes()
    with file_size_limit(64):
        result = cli("precision", str(path), "--dim", "batch=2", "--dim", "n=64", "--samples", "2", "--budget", "0.01:0.01,0.1:0", "--write-converted", str(out))
    assert result.returncode == 2
    assert "keep in float32: 3 nodes, 1-minimal" in result.stdout and "status: verified" in result.stdout
    assert result.stderr.startswith(f"error: --write-converted {out}: ") and "(the list above stands; what was at that path is untouched)" in result.stderr
    assert out.read_bytes() == before
