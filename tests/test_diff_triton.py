"""compare()'s fused Triton pass (diff_triton.py, CUDA tensors' own path where Triton is importable) gives the
numbers the numpy path gives, bit for bit (mean_abs within 1e-6), here in Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1): against test_diff's independent reference on drawn pairs, and against the numpy path on
the pairs that matter (special values, which hand over to the torch path; blocks' edges; tolerances). Skips
without Triton (a CPU torch does not bring it: `pip install triton`). On a GPU, tests/test_cuda.py runs it
compiled."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_diff import (
    DEFAULT_THRESHOLDS,
    assert_matches,
    assert_same_numbers,
    pairs,
    reference,
    threshold_sets,
    to_tensor,
    tolerances,
)

from pytest_ortdiff.numerics import diff

pytest.importorskip("triton", reason="Triton is not installed here (a CPU torch does not bring it): pip install triton")

from pytest_ortdiff.numerics import diff_triton

KINDS = ("float16", "bfloat16", "float32")


#: compiled on a GPU; in the interpreter on CPU tensors elsewhere (tests/conftest.py sets TRITON_INTERPRET=1
#: where there is no CUDA, before triton is first imported)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("no CUDA and TRITON_INTERPRET is not set: Triton's kernels cannot run here", allow_module_level=True)


def _triton(e: torch.Tensor, g: torch.Tensor, **kwargs: object) -> diff.DiffReport:
    return diff._compare(e.to(DEVICE), g.to(DEVICE), path="triton", **kwargs)  # type: ignore[arg-type]


def _pair(dtype: torch.dtype, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(n, generator=gen) * 10
    g = e + torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 4
    e, g = e.to(dtype), g.to(dtype)
    e[9], g[9] = 0.0, -0.0  # equal
    e[10], g[10] = 1e-40 if dtype != torch.float16 else 1e-7, 0.0  # a subnormal
    e[11], g[11] = 3.0, -3.0  # opposite signs
    e[12] = g[12]  # a tie of the largest difference cannot sit here, but equal pairs can
    return e, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tolerance", [None, (1e-2, 1e-2), (0.0, 1e-3), (1e-40, 0.5)], ids=["no-tol", "allclose", "rtol-only", "tiny-atol"])
def test_the_fused_pass_gives_the_numpy_paths_numbers(dtype: torch.dtype, tolerance: tuple[float, float] | None) -> None:
    e, g = _pair(dtype, diff_triton.BLOCK * 3 + 17)  # (a partial last block)
    thresholds = [0.0, 1e-45, 1e-3, 1e-2, 0.1, 1.0, 3.5e38, math.inf]
    expected = diff._compare(e, g, thresholds=thresholds, tolerance=tolerance)
    got = _triton(e, g, thresholds=thresholds, tolerance=tolerance)
    assert_same_numbers(got, expected)
    assert got.max_abs > 0 and got.max_ulp > 0 and got.counts[1e-3] > 0


def test_the_first_of_equal_maxima_is_the_one_reported() -> None:
    e = torch.zeros(diff_triton.BLOCK * 2 + 5)
    g = e.clone()
    g[diff_triton.BLOCK + 3] = g[7] = g[diff_triton.BLOCK * 2 + 1] = 0.5
    report = _triton(e, g)
    assert report.argmax == (7,) and report.max_abs == 0.5
    assert_same_numbers(report, diff._compare(e, g))


@pytest.mark.parametrize("special", ["nan", "inf", "overflow"])
def test_special_values_hand_over_to_the_torch_path_with_the_same_numbers(special: str) -> None:
    e, g = _pair(torch.float32, 5000)
    if special == "nan":
        e[100] = float("nan")
    elif special == "inf":
        e[100], g[100] = float("inf"), float("-inf")
    else:
        e[100], g[100] = 3e38, -3e38  # finite, but the difference overflows float32
    report = _triton(e, g, tolerance=(1e-2, 1e-2))
    assert_same_numbers(report, diff._compare(e, g, tolerance=(1e-2, 1e-2)))
    assert report.nan_mismatch + report.inf_mismatch + (report.max_abs == math.inf) >= 1


def test_identical_tensors_and_float64_and_integers() -> None:
    e, _ = _pair(torch.float16, 3000)
    assert _triton(e, e.clone()).is_exact
    x = torch.linspace(-1, 1, 100, dtype=torch.float64)
    assert_same_numbers(_triton(x, x + 1e-9), diff._compare(x, x + 1e-9))  # (float64: the torch path's)
    i = torch.arange(10)
    assert_same_numbers(_triton(i, i.flip(0)), diff._compare(i, i.flip(0)))  # (integers: exact, on the host)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=int(os.environ.get("ORTDIFF_EXAMPLES", "25")), deadline=None)
@given(data=st.data())
def test_matches_the_reference(kind: str, data: st.DataObject) -> None:
    e, g = data.draw(pairs(kind))
    tol = data.draw(tolerances)
    thr = data.draw(threshold_sets)
    report = _triton(to_tensor(e, kind), to_tensor(g, kind), thresholds=thr, tolerance=tol)
    assert_matches(report, reference(e, g, kind, thr, tol), e.shape)
    assert_same_numbers(report, diff._compare(to_tensor(e, kind), to_tensor(g, kind), thresholds=thr, tolerance=tol))


def test_the_default_thresholds_on_a_block_sized_pair_match_the_reference() -> None:
    e, g = (x.numpy() for x in _pair(torch.float32, diff_triton.BLOCK))
    assert_matches(_triton(torch.from_numpy(e), torch.from_numpy(g)), reference(e, g, "float32", DEFAULT_THRESHOLDS, None), e.shape)
    assert np.isfinite(e).all()
