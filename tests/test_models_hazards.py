"""fp16_hazards: valid graphs with symbolic dims, evaluated alike by the torch evaluator, onnx.reference and
the eager twin (inf and NaN at the same places), whose float16 run really overflows or underflows where
the float64 oracle does not, and whose DiffReport counts it."""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff import TorchEvaluator, compare, models
from pytest_ortdiff.models import FP16Hazard, fp16_hazards, random_feeds, torch_twin

KINDS = ("pow", "reduce_mean", "softmax", "log", "div")
DIMS = {"batch": 4, "n": 64}
FP16_MAX = 65504.0


def _run(model: onnx.ModelProto, feeds: dict[str, torch.Tensor], **kwargs: object) -> torch.Tensor:
    (y,) = TorchEvaluator(model, **kwargs).run(None, feeds)  # type: ignore[arg-type]
    return y


def _reference(model: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    with np.errstate(all="ignore"):  # the float16 runs overflow on purpose
        (y,) = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})
    return torch.from_numpy(np.asarray(y))


def _assert_same_specials(got: torch.Tensor, expected: torch.Tensor) -> None:
    """NaN, +inf and -inf at exactly the same places."""
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got == math.inf, expected == math.inf)
    assert torch.equal(got == -math.inf, expected == -math.inf)


def _case(kind: str, dtype: str, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    model = fp16_hazards(kind, dtype=dtype)
    return model, random_feeds(model, dims=DIMS, seed=seed)


# -- the graphs ---------------------------------------------------------------------------------------


def _dims(vi: onnx.ValueInfoProto) -> list[object]:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_graph_passes_the_full_checker_with_symbolic_dims(kind: str, dtype: str) -> None:
    model = fp16_hazards(kind, dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    x_dims = ["batch", "n", 2] if kind == "pow" else ["batch", "n"]
    assert [(vi.name, _dims(vi)) for vi in inferred.graph.input] == [("X", x_dims)]
    assert [(vi.name, _dims(vi)) for vi in inferred.graph.output] == [("Y", ["batch", "n"])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype != "bfloat16" else onnx.TensorProto.BFLOAT16
    # every floating value, intermediates included, is in the model's dtype: the hazard is computed there
    floating = [vi for vi in [*inferred.graph.value_info, *inferred.graph.output] if vi.type.tensor_type.elem_type != onnx.TensorProto.INT64]
    assert floating and {vi.type.tensor_type.elem_type for vi in floating} == {elem}
    # every intermediate's shape is inferred, each dim named or fixed
    shapes = [vi.type.tensor_type.shape for vi in inferred.graph.value_info]
    assert shapes and all(d.dim_param or d.HasField("dim_value") for s in shapes for d in s.dim)
    assert {d.dim_param for s in shapes for d in s.dim if d.dim_param} == {"batch", "n"}


def test_the_ops_of_each_kind() -> None:
    ops = {k: [n.op_type for n in fp16_hazards(k).graph.node if n.op_type != "Constant"] for k in KINDS}
    assert ops == {
        "pow": ["Pow", "ReduceSum", "Sqrt"],
        "reduce_mean": ["Pow", "ReduceMean", "Add", "Sqrt", "Div"],
        "softmax": ["Exp", "ReduceSum", "Div"],
        "log": ["Mul", "Log"],
        "div": ["Pow", "ReduceSum", "Sqrt", "Div"],
    }
    assert fp16_hazards.kinds == KINDS  # type: ignore[attr-defined]


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
@pytest.mark.parametrize("kind", KINDS)
def test_opset_is_honoured(kind: str, opset: int) -> None:
    model = fp16_hazards(kind, dtype="float32", opset=opset)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    onnx.checker.check_model(model, full_check=True)
    feeds = random_feeds(model, dims={"batch": 2, "n": 8}, seed=0)
    torch.testing.assert_close(_run(model, feeds), _reference(model, feeds), atol=1e-6, rtol=1e-5)


def test_reduce_mean_axes_are_an_attribute_before_opset_18() -> None:
    (node,) = [n for n in fp16_hazards("reduce_mean", opset=17).graph.node if n.op_type == "ReduceMean"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"axes": [-1], "keepdims": 1}
    assert len(node.input) == 1
    (node,) = [n for n in fp16_hazards("reduce_mean", opset=18).graph.node if n.op_type == "ReduceMean"]
    assert len(node.input) == 2


def test_fixed_dims() -> None:
    model = fp16_hazards("pow", batch=3, n=5)
    assert _dims(model.graph.input[0]) == [3, 5, 2]
    assert _dims(model.graph.output[0]) == [3, 5]
    assert tuple(random_feeds(model)["X"].shape) == (3, 5, 2)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=re.escape("unknown fp16 hazard kind 'exp'; valid: pow, reduce_mean, softmax, log, div")):
        fp16_hazards("exp")
    with pytest.raises(ValueError, match=re.escape("fp16_hazards needs opset >= 13 (ReduceSum with axes as an input), got opset=12")):
        fp16_hazards("softmax", opset=12)
    with pytest.raises(ValueError, match=re.escape("dim 'n' must be >= 1, got 0")):
        fp16_hazards("softmax", n=0)
    with pytest.raises(ValueError, match=re.escape("unknown fp16 hazard kind 'exp'; valid: pow")):
        FP16Hazard("exp")


def test_feed_ranges_are_recorded_and_documented() -> None:
    ranges = {k: {p.key: p.value for p in fp16_hazards(k).metadata_props}["ortdiff.range.X"] for k in KINDS}
    assert ranges == {"pow": "-400.0,400.0", "reduce_mean": "-400.0,400.0", "softmax": "-20.0,20.0", "log": "-0.0001,0.0001", "div": "-0.0001,0.0001"}
    assert "float16 hazard for X in [-20, 20): exp(x) > 65504 for x > 11.09" in fp16_hazards("softmax").doc_string
    x = random_feeds(fp16_hazards("softmax"), dims=DIMS, seed=0)["X"]
    assert x.dtype == torch.float16 and x.min() >= -20 and x.max() < 20


def test_builder_metadata_and_declared_dims() -> None:
    assert models.builder_info(fp16_hazards("log", dtype="float32", n=8)) == ("fp16_hazards", {"kind": "log", "dtype": "float32", "opset": 18, "batch": "batch", "n": 8})
    assert fp16_hazards.dims == {"batch": (1, 8), "n": (1, 256)}  # type: ignore[attr-defined]
    assert fp16_hazards.constraints == ()  # type: ignore[attr-defined]
    assert {"FP16Hazard", "fp16_hazards"} <= set(models.__all__)


# -- three evaluations agree, specials included ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_evaluator_matches_onnx_reference(kind: str, dtype: str) -> None:
    model, feeds = _case(kind, dtype)
    got, expected = _run(model, feeds), _reference(model, feeds)
    assert got.dtype == expected.dtype == getattr(torch, dtype)
    _assert_same_specials(got, expected)
    finite = got.isfinite()
    tol = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-12}[dtype]
    torch.testing.assert_close(got[finite], expected[finite], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_twin_matches_the_evaluator(kind: str, dtype: str) -> None:
    model, feeds = _case(kind, dtype)
    twin = torch_twin(model)
    assert isinstance(twin, FP16Hazard) and twin.kind == kind
    with torch.no_grad():
        out = twin(**feeds)
    got = _run(model, feeds)
    assert out.dtype == got.dtype and out.shape == got.shape
    _assert_same_specials(out, got)
    finite = got.isfinite()
    tol = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}[dtype]
    torch.testing.assert_close(out[finite], got[finite], atol=tol, rtol=tol)


# -- the hazard happens in float16, and only there ---------------------------------------------------------


def _fp16_and_oracle(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X as fed, float16 output, float64 oracle, oracle cast to float16) for the float16 graph."""
    model, feeds = _case(kind, "float16", seed)
    y16 = _run(model, feeds)
    oracle = _run(model, feeds, compute_dtype=torch.float64)
    assert oracle.dtype == torch.float64
    # the true outputs are finite and fit float16: whatever goes wrong is the float16 computation
    assert oracle.isfinite().all() and oracle.abs().max() < FP16_MAX
    return feeds["X"].double(), y16, oracle, oracle.to(torch.float16)


@pytest.mark.parametrize("seed", [0, 1])
def test_pow_overflows_to_inf(seed: int) -> None:
    _, y, oracle, _ = _fp16_and_oracle("pow", seed)
    # +inf exactly where re**2 + im**2 passes float16's max (sqrt(65504) = 255.94; float16 rounding of
    # the squares blurs the boundary by a few tenths), the true magnitude finite and at most 566
    assert y.isnan().sum() == 0 and (y == -math.inf).sum() == 0
    assert (oracle[y == math.inf] > 255.5).all()
    assert (y[oracle > 256.5] == math.inf).all()
    assert 0.5 < (y == math.inf).double().mean() < 0.85  # about 68 % of the pairs
    assert oracle.max() < 566
    torch.testing.assert_close(y[y.isfinite()].double(), oracle[y.isfinite()], atol=0.25, rtol=1e-3)


def test_reduce_mean_wipes_rows_to_zero() -> None:
    x, y, oracle, _ = _fp16_and_oracle("reduce_mean")
    assert y.isfinite().all()  # no NaN or Inf: the damage is silent
    overflowing_rows = (x.abs() > 256).any(-1)
    assert overflowing_rows.all()  # every row of 64 holds an |x| > 256
    assert (y == 0).all()
    assert (oracle != 0).all() and oracle.abs().max() < 1.85
    assert oracle.abs().max() > 1.7


def test_softmax_without_max_subtraction_gives_nan() -> None:
    x, y, oracle, _ = _fp16_and_oracle("softmax")
    # exp(x) >= 65520 rounds to inf for x >= ln(65520) = 11.09: inf / inf = NaN there
    assert torch.equal(y.isnan(), x > math.log(65520))
    assert y.isnan().sum() == 50
    # every row of 64 logits in [-20, 20) holds one, so every row sums to inf: the rest of it is 0
    assert y.isnan().any(-1).all()
    assert (y[~y.isnan()] == 0).all()
    assert (oracle >= 0).all() and (oracle <= 1).all() and (oracle.to(torch.float16) != 0).sum() == 97
    torch.testing.assert_close(oracle.sum(-1), torch.ones(4, dtype=torch.float64))


def test_log_of_underflowed_squares_is_minus_inf() -> None:
    x, y, oracle, _ = _fp16_and_oracle("log")
    assert (x.abs() < 1.73e-4).all() and (x != 0).all()
    assert (y == -math.inf).all()
    assert oracle.max() < -18.4 and oracle.min() > -34


def test_div_by_an_underflowed_norm_is_inf() -> None:
    x, y, oracle, _ = _fp16_and_oracle("div")
    assert torch.equal(y, torch.where(x > 0, math.inf, -math.inf).to(y.dtype))
    assert (oracle.abs() <= 1).all()
    torch.testing.assert_close((oracle**2).sum(-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_same_feeds_are_harmless_with_float32_range(kind: str, dtype: str) -> None:
    model, feeds = _case(kind, dtype)
    y = _run(model, feeds)
    oracle = _run(model, feeds, compute_dtype=torch.float64)
    assert y.isfinite().all() and (y != 0).all()
    tol = {"float32": 1e-5, "bfloat16": 2e-2}[dtype]
    torch.testing.assert_close(y.double(), oracle, atol=tol, rtol=tol)


# -- the DiffReport counts it ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "nan", "inf"), [("pow", 0, 176), ("reduce_mean", 0, 0), ("softmax", 50, 0), ("log", 0, 256), ("div", 0, 256)])
def test_compare_counts_nan_and_inf_mismatches(kind: str, nan: int, inf: int) -> None:
    _, y, _, oracle16 = _fp16_and_oracle(kind)
    assert oracle16.isfinite().all()
    report = compare(oracle16, y)
    assert (report.nan_mismatch, report.inf_mismatch) == (nan, inf)
    assert (report.nan_mismatch, report.inf_mismatch) == (int(y.isnan().sum()), int(y.isinf().sum()))
    # mismatched specials count as exceeding every threshold of the histogram
    assert report.counts[100.0] >= nan + inf
    assert f"NaN mismatch {nan}   Inf mismatch {inf}" in report.render()
    if kind == "reduce_mean":
        # no specials, but every element is off: x / inf = 0 against values up to 1.84
        assert report.counts[0.0] == 256 and report.counts[1.0] == 111
        assert report.max_abs == pytest.approx(1.84, abs=0.01)
    # and the other way round (oracle as got) counts the same
    swapped = compare(y, oracle16)
    assert (swapped.nan_mismatch, swapped.inf_mismatch) == (nan, inf)


def test_compare_sees_no_mismatch_in_float32() -> None:
    for kind in KINDS:
        model, feeds = _case(kind, "float32")
        report = compare(_run(model, feeds, compute_dtype=torch.float64).float(), _run(model, feeds))
        assert (report.nan_mismatch, report.inf_mismatch) == (0, 0), kind
        assert report.max_abs < 1e-4, kind
