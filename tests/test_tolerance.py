"""Tolerance: per-dtype defaults and dicts, numpy allclose semantics (against numpy.isclose), the budget
and its message, max ULP, NaN/Inf rules, validation messages, and hypothesis properties."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_ortdiff import Tolerance, compare
from pytest_ortdiff.numerics.diff import DEFAULT_THRESHOLDS
from pytest_ortdiff.numerics.tolerance import Violation

# -- resolution ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "atol", "rtol"),
    [("float32", 1e-4, 1e-4), ("float16", 1e-2, 1e-2), ("bfloat16", 5e-2, 5e-2), ("float64", 1e-7, 1e-7), ("int64", 0.0, 0.0), ("bool", 0.0, 0.0)],
)
def test_defaults_per_dtype(dtype: str, atol: float, rtol: float) -> None:
    tol = Tolerance().for_dtype(dtype)
    assert (tol.atol, tol.rtol, tol.max_ulp, tol.budget) == (atol, rtol, None, None)
    assert tol.allclose == (atol, rtol)
    assert tol.dtype == dtype


@pytest.mark.parametrize("spelling", ["float16", "fp16", "half", torch.float16, np.dtype("float16"), 10])
def test_for_dtype_accepts_any_spelling(spelling: object) -> None:
    assert Tolerance().for_dtype(spelling).allclose == (1e-2, 1e-2)


def test_for_dtype_accepts_numpy_scalar_types() -> None:
    assert Tolerance().for_dtype(np.float16).allclose == (1e-2, 1e-2)


def test_per_dtype_dicts_resolve() -> None:
    tol = Tolerance(atol={"float16": 0.5, "float32": 1e-4}, max_ulp={"fp16": 8}, budget={"float16": {1e-2: 0.001, 1.0: 0}, "float32": {1e-3: 0.0}})
    half = tol.for_dtype("float16")
    assert (half.atol, half.rtol, half.max_ulp, half.budget) == (0.5, 0.0, 8, {1e-2: 0.001, 1.0: 0})
    assert half.thresholds == (1e-2, 1.0)
    single = tol.for_dtype("float32")
    assert (single.atol, single.rtol, single.max_ulp, single.budget) == (1e-4, 0.0, None, {1e-3: 0.0})


def test_stated_rules_replace_the_defaults() -> None:
    tol = Tolerance(max_ulp=4).for_dtype("float16")
    assert (tol.atol, tol.rtol, tol.max_ulp) == (None, None, 4)
    assert tol.allclose is None
    # one of atol/rtol given: the other is 0, as in numpy with an explicit atol
    assert Tolerance(rtol=1e-3).for_dtype("float32").allclose == (0.0, 1e-3)


def test_unresolved_per_dtype_allclose_asks_for_for_dtype() -> None:
    with pytest.raises(ValueError, match=re.escape("per-dtype tolerance: call .for_dtype(dtype) first")):
        _ = Tolerance(atol={"float16": 0.5}, rtol=0.0).allclose


def test_merged_prefers_the_other_when_it_states_rules() -> None:
    marker = Tolerance(atol=1.0)
    call = Tolerance(max_ulp=2)
    assert marker.merged(call) is call
    assert marker.merged(Tolerance()) is marker
    assert marker.merged(None) is marker


def test_describe() -> None:
    assert Tolerance(budget={1e-2: 0.001, 1.0: 0}).describe() == "budget >0.01: 0.10 %, >1: 0 %"
    assert Tolerance(atol=1e-3, rtol=1e-3, max_ulp=4).describe() == "atol=0.001 rtol=0.001; max_ulp=4"
    assert Tolerance().describe() == "defaults"


# -- allclose: numpy semantics -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize(("atol", "rtol"), [(1e-3, 1e-3), (0.0, 1e-2), (1e-2, 0.0), (0.05, 0.1)])
def test_allclose_count_matches_numpy_isclose(dtype: type, atol: float, rtol: float) -> None:
    rng = np.random.default_rng(0)
    e = (rng.normal(size=20_000) * rng.choice([0.01, 1.0, 100.0], size=20_000)).astype(dtype)
    g = (e.astype(np.float64) + rng.normal(size=20_000) * rng.choice([1e-4, 1e-3, 1e-2, 0.1], size=20_000)).astype(dtype)
    # numpy's rule, |a - b| <= atol + rtol * |b| with b the expected side, in float64
    outside = int(np.count_nonzero(~np.isclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)))
    assert 0 < outside < 20_000  # the data straddles the boundary
    tol = Tolerance(atol=atol, rtol=rtol).for_dtype(np.dtype(dtype).name)
    report = compare(e, g, tolerance=tol.allclose)
    assert report.out_of_tolerance == outside
    (v,) = tol.check(report)
    assert v.rule == "allclose"
    head = re.escape(f"{outside:,} of 20,000 elements (") + r"\d+\.\d\d %" + re.escape(f") exceed atol={atol:.3g} + rtol={rtol:.3g}*|expected|; worst at (")
    assert re.match(head, v.message), v.message


def test_allclose_passes_inside_and_names_the_worst_element() -> None:
    e = torch.tensor([1.0, 2.0, 4.0, 8.0])
    g = torch.tensor([1.001, 2.0, 4.5, 8.0])
    tol = Tolerance(atol=1e-3, rtol=1e-3)
    (v,) = tol.check(compare(e, g, tolerance=tol.allclose))
    assert str(v) == "1 of 4 elements (25.00 %) exceed atol=0.001 + rtol=0.001*|expected|; worst at (2): expected 4, got 4.5 (|diff| 0.5)"
    loose = Tolerance(atol=0.5, rtol=0.0)
    assert loose.check(compare(e, g, tolerance=loose.allclose)) == []


@pytest.mark.parametrize(
    ("dtype", "expected", "got", "line"),
    [
        # values that round to the same 3 digits are printed until they differ (shortest round trip)
        (torch.float32, 69.2, "up2", "worst at (3): expected 69.2, got 69.20001 (|diff| 1.53e-05)"),
        (torch.float16, 22.5, "up1", "worst at (3): expected 22.5, got 22.52 (|diff| 0.0156)"),
        (torch.bfloat16, 1.0, "up1", "worst at (3): expected 1, got 1.01 (|diff| 0.00781)"),
        (torch.float64, 0.1, "up1", "worst at (3): expected 0.1, got 0.10000000000000002 (|diff| 1.39e-17)"),
        (torch.float32, 1.0, math.nan, "worst at (3): expected 1, got nan (NaN/Inf mismatch)"),
        (torch.float16, -math.inf, 2.0, "worst at (3): expected -inf, got 2 (NaN/Inf mismatch)"),
    ],
)
def test_violation_line_prints_values_that_differ(dtype: torch.dtype, expected: float, got: object, line: str) -> None:
    e = torch.tensor([0.0, 0.0, 0.0, expected], dtype=dtype)
    g = e.clone()
    g[3] = _ulps_up(e[3:4], int(got[2:]))[0] if isinstance(got, str) else got
    tol = Tolerance(atol=0.0, rtol=0.0)
    violations = tol.check(compare(e, g, tolerance=tol.allclose))
    (allclose,) = [v for v in violations if v.rule == "allclose"]
    assert allclose.message == f"1 of 4 elements (25.00 %) exceed atol=0 + rtol=0*|expected|; {line}"


def test_allclose_needs_the_report_made_with_it() -> None:
    tol = Tolerance(atol=1e-3, rtol=1e-3)
    report = compare(torch.ones(3), torch.ones(3))
    expected = "this report was computed for tolerance None, not (atol, rtol)=(0.001, 0.001): call compare(expected, got, tolerance=(0.001, 0.001))"
    with pytest.raises(ValueError, match=re.escape(expected)):
        tol.check(report)


# -- budget ---------------------------------------------------------------------------------------------


def test_budget_violation_message_format() -> None:
    n = 2_359_296  # 2 x 1024 x 1152, the seed's output
    e = torch.zeros(n)
    g = e.clone()
    g[:1234] = 0.5
    report = compare({"Z": e}, {"Z": g}, thresholds=[0.0, 0.01, 1.0])
    assert report.counts == {0.0: 1234, 0.01: 1234, 1.0: 0}
    (v,) = Tolerance(budget={0.01: 0.0001, 1.0: 0}).check(report)
    assert v == Violation("budget", "1,234 of 2,359,296 elements (0.05 %) exceed 0.01; budget allows 0.01 %", "Z")
    assert str(v) == "Z: 1,234 of 2,359,296 elements (0.05 %) exceed 0.01; budget allows 0.01 %"


def test_budget_each_line_judged() -> None:
    e = torch.zeros(1000)
    g = e.clone()
    g[:10] = 0.05  # 1 % above 1e-2
    g[10:12] = 2.0  # 0.2 % above 1 (and above 1e-2)
    report = compare(e, g)
    assert Tolerance(budget={1e-2: 0.012, 1.0: 0.002}).check(report) == []
    violations = Tolerance(budget={1e-2: 0.01, 1.0: 0.0}).check(report)
    assert [v.message for v in violations] == [
        "12 of 1,000 elements (1.20 %) exceed 0.01; budget allows 1.00 %",
        "2 of 1,000 elements (0.20 %) exceed 1; budget allows 0 %",
    ]
    assert {v.rule for v in violations} == {"budget"}


def test_budget_threshold_missing_from_the_histogram() -> None:
    report = compare(torch.zeros(4), torch.ones(4))
    assert 0.02 not in DEFAULT_THRESHOLDS
    with pytest.raises(ValueError, match=re.escape("budget threshold 0.02 is not in the report's histogram; pass thresholds including it to compare()")):
        Tolerance(budget={0.02: 0.5}).check(report)


def test_budget_equal_to_the_actual_share_passes() -> None:
    failing = []
    for n in range(1, 61):
        e = torch.zeros(n)
        for c in range(1, n + 1):
            g = e.clone()
            g[:c] = 1.0
            if Tolerance(budget={0.1: c / n}).check(compare(e, g)):
                failing.append((c, n))
    assert failing == []


# -- max ULP --------------------------------------------------------------------------------------------


def _ulps_up(x: torch.Tensor, k: int) -> torch.Tensor:
    for _ in range(k):
        x = torch.nextafter(x, torch.full_like(x, math.inf))
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_max_ulp(dtype: torch.dtype) -> None:
    # every element in the binade of the output's scale (RMS 5.07 -> 4): the ULPs max_ulp judges are the raw ones
    e = torch.tensor([4.0, -5.0, 6.0], dtype=dtype)
    g = e.clone()
    g[1] = _ulps_up(e[1:2], 3)[0]  # -5 moved 3 ULPs towards zero
    report = compare(e, g)
    assert report.max_ulp == 3
    (v,) = Tolerance(max_ulp=2).check(report)
    assert (v.rule, v.message) == ("max_ulp", "max ULP error 3 exceeds max_ulp=2")
    assert Tolerance(max_ulp=3).check(report) == []


# -- NaN and Inf ------------------------------------------------------------------------------------------

LOOSE = [Tolerance(budget={1.0: 1.0}), Tolerance(max_ulp=1e30), Tolerance(atol=1e30, rtol=1e30)]


@pytest.mark.parametrize("tol", LOOSE, ids=["budget", "max_ulp", "allclose"])
def test_nan_mismatch_always_violates(tol: Tolerance) -> None:
    e = torch.tensor([1.0, float("nan"), float("nan"), 4.0])
    g = torch.tensor([1.0, 2.0, float("nan"), float("nan")])
    report = compare(e, g, tolerance=tol.allclose)
    violations = tol.check(report)
    nan = [v for v in violations if v.rule == "nan"]
    assert [v.message for v in nan] == ["2 of 4 elements are NaN on one side only"]


@pytest.mark.parametrize("tol", LOOSE, ids=["budget", "max_ulp", "allclose"])
def test_inf_mismatch_always_violates(tol: Tolerance) -> None:
    inf = float("inf")
    e = torch.tensor([inf, inf, -inf, 1.0])
    g = torch.tensor([inf, -inf, 5.0, inf])
    report = compare(e, g, tolerance=tol.allclose)
    inf_v = [v for v in tol.check(report) if v.rule == "inf"]
    assert [v.message for v in inf_v] == ["3 of 4 elements are infinite on one side only (or of opposite sign)"]


def test_nan_with_nan_and_same_inf_are_equal() -> None:
    inf, nan = float("inf"), float("nan")
    e = torch.tensor([nan, inf, -inf, 1.0])
    g = e.clone()
    tol = Tolerance(atol=0.0, rtol=0.0, max_ulp=0, budget={0.0: 0.0})
    assert tol.check(compare(e, g, tolerance=tol.allclose)) == []


def test_integers_compare_exactly_by_default() -> None:
    e = torch.tensor([1, 2, 3], dtype=torch.int64)
    tol = Tolerance().for_dtype("int64")
    assert tol.check(compare(e, e.clone(), tolerance=tol.allclose)) == []
    (v,) = tol.check(compare(e, torch.tensor([1, 2, 4]), tolerance=tol.allclose))
    assert (v.rule, v.message) == ("exact", "1 of 3 elements differ; integer outputs compare exactly; worst at (2): expected 3, got 4")


INT_TOLERANCES = [
    Tolerance(atol=1e-4, rtol=1e-2, dtype="float32"),
    Tolerance(atol=10.0, rtol=1.0),
    Tolerance(max_ulp=100),
    Tolerance(budget={0.0: 1.0}),
    Tolerance(atol={"int64": 5.0}, rtol={"int64": 0.5}),
    Tolerance(),
]


@pytest.mark.parametrize("tol", INT_TOLERANCES, ids=["float32-resolved", "loose", "max_ulp", "budget", "per-dtype-int64", "defaults"])
def test_integer_outputs_compare_exactly_whatever_the_tolerance(tol: Tolerance) -> None:
    # DESIGN.md: integer and bool outputs compare exactly; atol/rtol/max_ulp/budget are for floats
    e = {"idx": np.array([500, 7, 3], dtype=np.int64)}
    g = {"idx": np.array([504, 7, 3], dtype=np.int64)}
    report = compare(e, g, tolerance=(1e-4, 1e-2))
    (v,) = tol.check(report)
    assert v == Violation("exact", "1 of 3 elements differ; integer outputs compare exactly; worst at (0): expected 500, got 504", "idx")
    assert tol.check(compare(e, {"idx": e["idx"].copy()}, tolerance=(1e-4, 1e-2))) == []
    # the report need not carry the tolerance's allclose count: integers are judged on their own
    assert [x.rule for x in tol.check(compare(e, g))] == ["exact"]


def test_every_integer_element_that_differs_is_counted() -> None:
    e = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    g = torch.tensor([[2, 3, 4], [4, 5, 9]], dtype=torch.int32)
    (v,) = Tolerance(atol=100.0, rtol=1.0).check(compare(e, g, tolerance=(100.0, 1.0)))
    assert v.message == "4 of 6 elements differ; integer outputs compare exactly; worst at (1, 2): expected 6, got 9"


def test_bool_outputs_compare_exactly() -> None:
    e = torch.tensor([True, False, True, True])
    g = torch.tensor([True, True, True, False])
    (v,) = Tolerance(atol=1.0, rtol=1.0, budget={0.5: 1.0}).check(compare({"mask": e}, {"mask": g}, tolerance=(1.0, 1.0)))
    assert str(v) == "mask: 2 of 4 elements differ; bool outputs compare exactly; worst at (1): expected False, got True"


@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint8", "bool"])
def test_for_dtype_of_integers_and_bool_is_exact(dtype: str) -> None:
    tol = Tolerance(atol=1e-4, rtol=1e-2, max_ulp=8, budget={1e-2: 0.5}).for_dtype(dtype)
    assert (tol.atol, tol.rtol, tol.max_ulp, tol.budget, tol.dtype) == (0.0, 0.0, None, None, dtype)
    assert Tolerance(atol={"float32": 1e-4}).for_dtype(dtype).allclose == (0.0, 0.0)


def test_mixed_float_and_integer_outputs_float_tolerance_for_floats_only() -> None:
    tol = Tolerance(atol=1e-2, rtol=0.0).for_dtype("float32")
    e = {"y": torch.tensor([1.0, 2.0, 3.0]), "idx": torch.tensor([2, 0], dtype=torch.int64)}
    g = {"y": torch.tensor([1.005, 2.0, 3.0]), "idx": torch.tensor([2, 0], dtype=torch.int64)}
    assert tol.check(compare(e, g, tolerance=tol.allclose)) == []
    g["idx"] = torch.tensor([2, 1], dtype=torch.int64)
    g["y"] = torch.tensor([1.5, 2.0, 3.0])
    violations = tol.check(compare(e, g, tolerance=tol.allclose))
    assert [(v.output, v.rule) for v in violations] == [("y", "allclose"), ("idx", "exact")]


# -- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"atol": -1e-3}, ValueError, "atol must be a non-negative number or a dict {dtype: number}, got -0.001"),
        ({"rtol": float("nan")}, ValueError, "rtol must be a non-negative number or a dict {dtype: number}, got nan"),
        ({"max_ulp": -1}, ValueError, "max_ulp must be a non-negative number or a dict {dtype: number}, got -1"),
        ({"atol": True}, ValueError, "atol must be a non-negative number"),
        ({"atol": "0.1"}, ValueError, "atol must be a non-negative number or a dict {dtype: number}, got '0.1'"),
        ({"atol": {"float17": 0.1}}, ValueError, "atol: unknown dtype 'float17'; valid: float32, float16, bfloat16, float64"),
        ({"atol": {"float16": -1}}, ValueError, "atol must be a non-negative number"),
        ({"budget": {1e-2: 1.5}}, ValueError, "budget fraction for 0.01 must be between 0 and 1 (0.001 = 0.1 %), got 1.5"),
        ({"budget": {1e-2: -0.1}}, ValueError, "budget fraction for 0.01 must be between 0 and 1"),
        ({"budget": {-1.0: 0.1}}, ValueError, "budget threshold must be >= 0, got -1.0"),
        ({"budget": {1e-2: "lots"}}, ValueError, "budget must map thresholds to fractions, e.g. {1e-2: 0.001}"),
        ({"budget": [1e-2]}, TypeError, "budget must be a dict {threshold: fraction}, e.g. {1e-2: 0.001, 1.0: 0}; got [0.01]"),
        ({"budget": {"float17": {1e-2: 0.1}}}, ValueError, "unknown dtype 'float17'; valid: float32, float16, bfloat16, float64"),
        ({"budget": {"float16": {1e-2: 2.0}}}, ValueError, "budget fraction for 0.01 must be between 0 and 1"),
        # issue 12, item 2: an empty budget is a tolerance with no rule, under which any error passes
        ({"budget": {}}, ValueError, "budget={} states no rule, so any error would pass: give thresholds, e.g. budget={1e-2: 0.001, 1.0: 0}, or leave budget out"),
        ({"budget": {"float32": {}}}, ValueError, "budget['float32'] is empty, so any float32 error would pass: give thresholds, e.g. {1e-2: 0.001, 1.0: 0}, or leave float32 out"),
    ],
)
def test_validation_messages(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        Tolerance(**kwargs)


# -- properties ---------------------------------------------------------------------------------------

_finite32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=12))
    e = draw(hnp.arrays(np.float32, shape, elements=_finite32))
    g = draw(hnp.arrays(np.float32, shape, elements=_finite32))
    # mostly small perturbations of e, some elements replaced outright
    keep = draw(hnp.arrays(np.bool_, shape))
    noise = draw(hnp.arrays(np.float32, shape, elements=st.floats(-1 / 64, 1 / 64, width=32)))
    return e, np.where(keep, e + noise * np.abs(e), g).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(pairs())
def test_own_max_abs_as_atol_passes(data: tuple[np.ndarray, np.ndarray]) -> None:
    e, g = data
    report = compare(e, g)
    tol = Tolerance(atol=report.max_abs, rtol=0.0)
    judged = compare(e, g, tolerance=tol.allclose)
    assert judged.out_of_tolerance == 0
    assert tol.check(judged) == []
    assert Tolerance(max_ulp=report.max_ulp_floored).check(report) == []  # (max_ulp judges the ULPs at the output's scale)
    if report.max_abs > 0:
        # just below it fails, on exactly the elements numpy says
        tighter = Tolerance(atol=float(np.nextafter(np.float32(report.max_abs), np.float32(0))), rtol=0.0)
        assert tighter.check(compare(e, g, tolerance=tighter.allclose))


@settings(max_examples=60, deadline=None)
@given(pairs(), st.floats(1e-12, 1.0))
def test_budget_at_or_above_the_actual_share_passes(data: tuple[np.ndarray, np.ndarray], extra: float) -> None:
    e, g = data
    report = compare(e, g)
    n = report.n
    for t in report.thresholds:
        share = report.counts[t] / n
        assert Tolerance(budget={t: min(1.0, share + extra)}).check(report) == []
        if report.counts[t]:
            below = report.counts[t] - 1
            assert Tolerance(budget={t: below / n}).check(report), f"{below}/{n} must not allow {report.counts[t]} elements above {t}"


def test_per_dtype_rules_fall_back_to_defaults_for_the_dtypes_they_do_not_name() -> None:
    """atol={"float16": 0.5} says nothing about float32: float32 keeps its default allclose, it is
    not left without any rule (a test would pass whatever the error)."""
    tol = Tolerance(atol={"float16": 0.5})
    assert tol.for_dtype("float16").allclose == (0.5, 0.0)
    single = tol.for_dtype("float32")
    assert single.allclose == Tolerance().for_dtype("float32").allclose == (1e-4, 1e-4)
    assert not single.is_empty
    # a rule that does apply to float32 (here the budget) is kept as the only one
    only_budget = Tolerance(atol={"float16": 0.5}, budget={1e-2: 0.0}).for_dtype("float32")
    assert only_budget.allclose is None and only_budget.budget == {1e-2: 0.0}


# -- issue 14 (4): the element a tolerance line shows is outside the tolerance ----------------------


def test_allclose_line_shows_a_nan_mismatch_not_an_element_within_tolerance() -> None:
    """25 of 128 NaN where 0.5 is expected, and one finite element off by 9.75e-05 (within atol): the
    line named that finite element; it must name a violating one, the first mismatch, as such."""
    e = torch.zeros(16, 8)
    e[::2] = 0.5
    g = e.clone()
    g[1, 0] = 9.75e-05
    nan_at = [(r, c) for r in range(0, 16, 2) for c in range(8)][:25]
    for r, c in nan_at:
        g[r, c] = math.nan
    tol = Tolerance(atol=0.01, rtol=0.01)
    report = compare(e, g, tolerance=tol.allclose)
    assert report.argmax == (1, 0)  # the max abs error over finite pairs: inside the tolerance
    allclose = next(v for v in tol.check(report) if v.rule == "allclose")
    first = nan_at[0]
    assert allclose.message == f"25 of 128 elements (19.53 %) exceed atol=0.01 + rtol=0.01*|expected|; worst at {first}: expected 0.5, got nan (NaN/Inf mismatch)"


def test_allclose_line_shows_the_largest_finite_violation_beside_mismatches() -> None:
    e = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    g = torch.tensor([math.nan, 2.5, 3.75, 4.0, 100.9])  # 100.9 is the max abs, inside rtol=1 %
    tol = Tolerance(atol=0.0, rtol=0.01)
    report = compare(e, g, tolerance=tol.allclose)
    assert report.argmax == (4,)
    # numpy: |e - g| > rtol*|e| for 2.5 and 3.75 (and the NaN); the larger |diff| is 0.75
    outside = ~np.isclose(g.numpy(), e.numpy(), rtol=0.01, atol=0.0)
    assert outside.tolist() == [True, True, True, False, False]
    allclose = next(v for v in tol.check(report) if v.rule == "allclose")
    assert allclose.message.endswith("; worst at (2): expected 3, got 3.75 (|diff| 0.75)")
    # a report stored before outside_at existed still names its max abs element
    old = report.to_dict()
    for key in ("outside_at", "expected_at_outside", "got_at_outside"):
        old[key] = None
    from pytest_ortdiff.numerics.diff import DiffReport

    assert next(v for v in tol.check(DiffReport.from_dict(old)) if v.rule == "allclose").message.endswith("worst at (4): expected 100, got 100.9 (|diff| 0.9)")
