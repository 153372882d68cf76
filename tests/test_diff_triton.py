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


# -- what only a compiler shows, and a Triton that cannot compile --------------------------------------


# Compiled for sm_90 in a process of its own: one that imported Triton with TRITON_INTERPRET=1 (this one, on a
# machine without CUDA) holds Triton's own library functions as interpreted ones, which no compile can call.
_COMPILE_FOR_SM90 = """
import json, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from pytest_ortdiff.numerics import diff_triton


class Sm90:  # Triton's CUDA driver as far as warmup asks: an H100/H200 target, nothing to launch on
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")


class Compile:  # kernel[grid](...) compiles (warmup) with the arguments and options given, and keeps the result
    def __init__(self, fn, out): self.fn, self.out = fn, out
    def __getitem__(self, grid): return lambda *args, **meta: self.out.append(self.fn.warmup(*args, grid=grid, **meta))


driver.set_active(Sm90())
compiled = []
squares, stats = diff_triton._make_kernels()
diff_triton._kernels = lambda interpret: (Compile(squares, compiled), Compile(stats, compiled))
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    e = torch.linspace(-3, 3, 3000).to(dtype)
    diff_triton.sum_of_squares(e)  # (outputs never written: compiled, not run)
    diff_triton.stats_pass(e, e.clone(), [0.0, 1e-3, 1.0], 1.0, (1e-2, 1e-2), torch.finfo(dtype).tiny)
json.dump([{"name": k.name, "num_warps": k.metadata.num_warps, "ptx": k.asm["ptx"]} for k in compiled], sys.stdout)
"""


def test_the_compiled_kernels_take_their_launch_options_and_round_as_numpy_on_sm90() -> None:
    """The interpreter runs the kernels in numpy; on a GPU they are compiled, and there two things could differ
    that no CPU run of them shows: an option Triton's CUDA backend does not know fails the launch (KeyError),
    and the PTX decides the rounding. Compiled here for sm_90 (LLVM and the ptxas Triton ships run on the CPU)
    with the arguments and options diff_triton launches them with: the divisions are IEEE (div.rn.f64),
    atol + rtol*|e| is a multiply then an add (no fused multiply-add, as numpy's allclose), and nothing flushes
    subnormals to zero (no .ftz: the float32 subnormals the CPU path keeps)."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout)
    assert [k["name"] for k in compiled] == ["squares", "stats"] * 3
    for k in compiled:
        assert k["num_warps"] == diff_triton.LAUNCH_OPTIONS["num_warps"]
        assert ".ftz" not in k["ptx"], k["name"]
        assert "fma.rn" not in k["ptx"] and "mad.rn" not in k["ptx"], k["name"]
        assert "mul.rn.f64" in k["ptx"] and "add.rn.f64" in k["ptx"], k["name"]
    for k in compiled[1::2]:
        assert "div.rn.f64" in k["ptx"] and "div.full" not in k["ptx"] and "div.approx" not in k["ptx"]


def test_a_triton_that_cannot_compile_leaves_the_torch_path_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare() on CUDA takes the fused pass by default; where Triton imports but cannot compile or launch (no C
    compiler for its launcher, no libcuda it finds), the pass is given up for the process and the torch path
    gives the numbers, the reason kept in `diff_triton.failure()`. Asked for by name, the error is raised."""

    def broken(interpret: bool) -> None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.\nmore")

    monkeypatch.setattr(diff_triton, "_FAILURE", [])
    monkeypatch.setattr(diff_triton, "_kernels", broken)
    # (CPU tensors route as CUDA ones do: the fused pass while it is usable)
    monkeypatch.setattr(diff, "_own_path", lambda e: "triton" if diff_triton.usable() else "torch")
    e, g = _pair(torch.float16, 5000)
    with pytest.raises(RuntimeError, match="C compiler"):
        diff._compare(e, g, path="triton")
    assert diff_triton.failure() is None and diff_triton.usable()
    report = diff._compare(e, g, tolerance=(1e-2, 1e-2))
    assert_same_numbers(report, diff._compare(e, g, tolerance=(1e-2, 1e-2), path="numpy"))
    assert diff_triton.failure() == "RuntimeError: Failed to find C compiler. Please specify via CC environment variable."
    assert not diff_triton.usable()
