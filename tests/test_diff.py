"""compare() / DiffReport against an independent float64 numpy reference of the documented semantics.

The reference (`reference()` below) shares no code with pytest_ortdiff.numerics.diff: it computes |e - g| in the
work dtype (float32 for float16/bfloat16/float32, float64 for float64 and 32/64-bit ints), then every
comparison in float64, NaN/Inf rules with explicit masks and ULP distances with Python integers.
The implementation is run four ways against it (`PATHS`): the numpy path CPU tensors take, the same
in five chunks (chunk and worker-range boundaries, the fast path and the special-value path meet in
one tensor), and the torch path CUDA tensors take, run here on CPU tensors, whole and in four chunks.
Everything but mean_abs (summation order) must agree exactly, max_rel included: both sides divide
the same float64 numbers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_ortdiff.numerics import diff
from pytest_ortdiff.numerics.diff import DEFAULT_THRESHOLDS, DiffReport, ShapeMismatchError, compare

# ORTDIFF_EXAMPLES=2000 for a long hunt; the default keeps the file under ~20 s
SETTINGS = settings(max_examples=int(os.environ.get("ORTDIFF_EXAMPLES", "50")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

FLOAT_KINDS = ("float16", "bfloat16", "float32", "float64")
KINDS = (*FLOAT_KINDS, "int32", "bool")
# smallest positive normal of each float dtype (denominator floor of the relative error); ints: 1
TINY = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}
NBITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
NP_DTYPE = {"float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "float64": np.float64, "int32": np.int32, "bool": np.bool_}


# ------------------------------------------------------------------------------------------------
# the reference


def _work(kind: str) -> Any:
    return np.float64 if kind in ("float64", "int32") else np.float32


def _bits(x: np.ndarray, kind: str) -> np.ndarray:
    """IEEE bit patterns as non-negative integers: int64 up to 32 bits, Python ints (object) for 64
    (bfloat16 values are held in float32 arrays)."""
    x = x.reshape(-1)
    if kind == "float16":
        return x.view(np.uint16).astype(np.int64)
    if kind == "bfloat16":
        return x.astype(np.float32).view(np.uint32).astype(np.int64) >> 16
    if kind == "float32":
        return x.view(np.uint32).astype(np.int64)
    return np.array([int(b) for b in x.view(np.uint64)], dtype=object)


def _ordered(bits: Any, nbits: int) -> Any:
    """sign-magnitude -> integers increasing with the value (+0 and -0 both 0); works elementwise."""
    mag = bits & ((1 << (nbits - 1)) - 1)
    return np.where(bits >> (nbits - 1) != 0, -mag, mag)


def reference(e: np.ndarray, g: np.ndarray, kind: str, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, tol: tuple[float, float] | None = None) -> dict[str, Any]:
    e = np.ascontiguousarray(e).reshape(-1)
    g = np.ascontiguousarray(g).reshape(-1)
    n = e.size
    floating = kind in FLOAT_KINDS
    with np.errstate(all="ignore"):
        ew, gw = e.astype(_work(kind)), g.astype(_work(kind))
        d = np.abs(ew - gw).astype(np.float64)  # rounded in the work dtype, then exact in float64
        e64 = ew.astype(np.float64)
        if floating:
            en, gn = np.isnan(e64), np.isnan(gw.astype(np.float64))
            ei, gi = np.isinf(e64), np.isinf(gw.astype(np.float64))
            same_inf = ei & gi & (ew == gw)
            nan_mis = en != gn
            inf_mis = (ei | gi) & ~same_inf & ~en & ~gn
        else:
            nan_mis = inf_mis = same_inf = en = gn = np.zeros(n, bool)
        mis = nan_mis | inf_mis
        equal = (en & gn) | same_inf
        d[mis | equal] = 0.0
        fp = ~mis  # the "finite pairs": everything but mismatches
        counted = np.where(mis, np.inf, d)
        counts = {float(t): int(np.count_nonzero(counted > t)) for t in sorted(set(map(float, thresholds)))}
        if fp.any():
            max_abs = float(d[fp].max())
            argmax = int(np.flatnonzero(fp & (d == max_abs))[0])
        else:
            max_abs, argmax = 0.0, 0
        if max_abs == 0 and mis.any():
            argmax = int(np.flatnonzero(mis)[0])
        tiny = TINY.get(kind, 1.0)
        rel = np.where(d > 0, d / np.maximum(np.abs(e64), tiny), 0.0)
        max_rel = float(rel.max()) if n else 0.0
        if floating:
            nb = NBITS[kind]
            dist = np.abs(_ordered(_bits(e, kind), nb) - _ordered(_bits(g, kind), nb))
            max_ulp = float(max(dist[d > 0].tolist(), default=0))  # Python ints: exact, then rounded once
        else:
            max_ulp = max_abs
        oot = None
        if tol is not None:
            atol, rtol = tol
            oot = int(np.count_nonzero(mis | (fp & (d > atol + rtol * np.abs(e64)))))
        mean_abs = float(d.sum()) / n if n else 0.0
    return {
        "n": n,
        "counts": counts,
        "max_abs": max_abs,
        "argmax_flat": argmax if n else None,
        "max_rel": max_rel,
        "max_ulp": max_ulp,
        "mean_abs": mean_abs,
        "nan_mismatch": int(nan_mis.sum()),
        "inf_mismatch": int(inf_mis.sum()),
        "out_of_tolerance": oot,
        "e_at": float(e[argmax]) if n else None,
        "g_at": float(g[argmax]) if n else None,
    }


def _same_float(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


def assert_matches(report: DiffReport, ref: dict[str, Any], shape: tuple[int, ...]) -> None:
    where = f"report={report.to_dict()}\nreference={ref}"
    assert report.n == ref["n"], where
    assert report.shape == tuple(shape), where
    assert dict(report.counts) == ref["counts"], where
    assert report.max_abs == ref["max_abs"], where
    assert report.max_ulp == ref["max_ulp"], where
    assert report.nan_mismatch == ref["nan_mismatch"], where
    assert report.inf_mismatch == ref["inf_mismatch"], where
    assert report.out_of_tolerance == ref["out_of_tolerance"], where
    if ref["argmax_flat"] is None:
        assert report.argmax is None, where
    else:
        expected_index = tuple(int(i) for i in np.unravel_index(ref["argmax_flat"], shape)) if shape else ()
        assert report.argmax == expected_index, where
        assert _same_float(report.expected_at_max, ref["e_at"]), where
        assert _same_float(report.got_at_max, ref["g_at"]), where
    assert report.max_rel == ref["max_rel"], where  # both in float64 from the same |e - g|
    assert math.isclose(report.mean_abs, ref["mean_abs"], rel_tol=1e-5, abs_tol=1e-30), where


# ------------------------------------------------------------------------------------------------
# inputs


def to_tensor(x: np.ndarray, kind: str) -> torch.Tensor:
    t = torch.from_numpy(np.array(x, copy=True, order="C"))  # (ascontiguousarray makes 0-d 1-d)
    return t.to(torch.bfloat16) if kind == "bfloat16" else t


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (by torch), held in float32."""
    t = torch.from_numpy(np.array(x, dtype=np.float32, copy=True, order="C"))
    return t.to(torch.bfloat16).to(torch.float32).numpy()


def _elements(kind: str, special: bool) -> st.SearchStrategy[Any]:
    if kind == "int32":
        return st.integers(-(2**31), 2**31 - 1)
    if kind == "bool":
        return st.booleans()
    width = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}[kind]
    wide = st.floats(width=width, allow_nan=special, allow_infinity=special, allow_subnormal=True)
    if kind == "float16":
        return wide
    # most real values are moderate; mix in the extremes the wide strategy finds
    return st.one_of(st.floats(-4, 4, width=width), wide)


def _step(x: np.ndarray, k: np.ndarray, kind: str) -> np.ndarray:
    """x moved by k representable values (k may be negative), by bit arithmetic on the magnitude."""
    nb = NBITS[kind]
    lim = (1 << (nb - 1)) - 1
    o = np.clip(_ordered(_bits(x, kind), nb) + k.reshape(-1).astype(np.int64).astype(object if nb == 64 else np.int64), -lim, lim)
    bits = np.where(o >= 0, o, (-o) | (1 << (nb - 1)))
    if nb == 64:
        return np.array([int(b) for b in bits], dtype=np.uint64).view(np.float64).reshape(x.shape)
    if kind == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
    return bits.astype({16: np.uint16, 32: np.uint32}[nb]).view(x.dtype).reshape(x.shape)


@st.composite
def pairs(draw: st.DrawFn, kind: str, *, special: bool = True, max_side: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(expected, got) of one kind: independent values, shared values (NaN==NaN, ±0, Inf) and near
    values a few ULPs apart, with sign flips."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side))
    dtype = NP_DTYPE[kind]
    elems = _elements(kind, special)
    e = draw(hnp.arrays(dtype, shape, elements=elems))
    other = draw(hnp.arrays(dtype, shape, elements=elems))
    if kind == "bfloat16":
        e, other = bf16_round(e), bf16_round(other)
    mode = draw(st.sampled_from(["independent", "shared", "near"]))
    if mode == "independent":
        return e, other
    same = draw(hnp.arrays(np.bool_, shape))
    g = np.where(same, e, other).astype(dtype)
    if kind in FLOAT_KINDS:
        if mode == "near":
            k = draw(hnp.arrays(np.int64, shape, elements=st.integers(-3, 3) | st.integers(-40000, 40000)))
            g = np.where(same, _step(e, k, kind), other).astype(dtype)
        flip = draw(hnp.arrays(np.bool_, shape))
        g = np.where(flip, -g, g).astype(dtype)  # -0 vs +0, -NaN vs NaN, x vs -x
    return e, g


tolerances = st.none() | st.tuples(
    st.sampled_from([0.0, 5e-324, 1e-40, 1e-5, 1e-3, 1e-2, 0.5]) | st.floats(0, 10),
    st.sampled_from([0.0, 1e-6, 1e-3, 1e-2, 0.5]) | st.floats(0, 2),
)
threshold_sets = st.just(DEFAULT_THRESHOLDS) | st.lists(
    st.sampled_from([0.0, 1e-45, 1e-30, 1e-7, 0.1, 0.3, 1.0, 1e10, 3.5e38, 1e300, math.inf]) | st.floats(0, 100), min_size=1, max_size=6
)


#: code path -> the internal arguments of `diff._compare` that select it ("chunks": into that many)
PATH_ARGS: dict[str, dict[str, Any]] = {
    "numpy": {},  # what compare() does with CPU tensors
    "numpy-chunks": {"path": "numpy", "chunks": 5},
    "torch": {"path": "torch"},  # what compare() does with CUDA tensors
    "torch-chunks": {"path": "torch", "chunks": 4},
}
PATHS = tuple(PATH_ARGS)


def run(code_path: str, expected: Any, got: Any, **kwargs: Any) -> DiffReport:
    """compare(expected, got, **kwargs) on one code path of PATHS (a `chunk` in kwargs wins)."""
    args = {**PATH_ARGS[code_path], **kwargs}
    chunks = args.pop("chunks", None)
    if chunks and "chunk" not in args:
        n = expected.numel() if isinstance(expected, torch.Tensor) else np.size(expected)
        args["chunk"] = max(1, -(-n // chunks))  # chunk boundaries in any tensor
    return diff._compare(expected, got, **args)


def without_mean(r: DiffReport) -> dict[str, Any]:
    out = r.to_dict()
    out.pop("mean_abs")
    for o in out.get("outputs", ()):
        o.pop("mean_abs")
    return out


def assert_same_numbers(a: DiffReport, b: DiffReport) -> None:
    """Every field equal; mean_abs up to summation order."""
    assert without_mean(a) == without_mean(b)
    assert math.isclose(a.mean_abs, b.mean_abs, rel_tol=1e-6, abs_tol=1e-30) or (math.isinf(a.mean_abs) and a.mean_abs == b.mean_abs)


# ------------------------------------------------------------------------------------------------
# property tests against the reference


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=st.data())
def test_matches_reference(kind: str, data: st.DataObject) -> None:
    e, g = data.draw(pairs(kind))
    tol = data.draw(tolerances)
    thr = data.draw(threshold_sets)
    ref = reference(e, g, kind, thr, tol)
    reports = {p: run(p, to_tensor(e, kind), to_tensor(g, kind), thresholds=thr, tolerance=tol) for p in PATHS}
    for code_path, report in reports.items():
        assert report.dtype == kind, code_path
        assert report.thresholds == tuple(sorted(set(map(float, thr)))), code_path
        assert_matches(report, ref, e.shape)
    # the torch path (CUDA's) and the numpy path (CPU's) agree on every field
    assert_same_numbers(reports["torch-chunks"], reports["numpy"])


@pytest.mark.parametrize("kind", FLOAT_KINDS)
@SETTINGS
@given(data=st.data())
def test_finite_values_match_reference(kind: str, data: st.DataObject) -> None:
    """Without NaN/Inf every chunk takes the fast path (the one real outputs take)."""
    e, g = data.draw(pairs(kind, special=False, max_side=12))
    tol = data.draw(tolerances)
    ref = reference(e, g, kind, DEFAULT_THRESHOLDS, tol)
    for code_path in PATHS:
        assert_matches(run(code_path, to_tensor(e, kind), to_tensor(g, kind), tolerance=tol), ref, e.shape)


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=st.data())
def test_self_compare_is_exact(kind: str, data: st.DataObject) -> None:
    e, _ = data.draw(pairs(kind))
    for code_path in PATHS:
        r = run(code_path, to_tensor(e, kind), to_tensor(e.copy(), kind), tolerance=(0.0, 0.0))
        assert r.is_exact, code_path
        assert r.max_abs == r.max_rel == r.max_ulp == r.mean_abs == 0, code_path
        assert r.nan_mismatch == r.inf_mismatch == r.out_of_tolerance == 0, code_path
        assert set(r.counts.values()) <= {0}, code_path
        assert r.n == e.size


@pytest.mark.parametrize("kind", FLOAT_KINDS)
@SETTINGS
@given(data=st.data())
def test_counts_are_non_increasing_in_the_threshold(kind: str, data: st.DataObject) -> None:
    e, g = data.draw(pairs(kind))
    thr = data.draw(st.lists(st.floats(0, 1e6), min_size=1, max_size=8))
    r = compare(to_tensor(e, kind), to_tensor(g, kind), thresholds=thr)
    values = [r.counts[t] for t in r.thresholds]
    assert values == sorted(values, reverse=True)
    assert values[0] <= r.n
    # a mismatch exceeds every threshold
    assert values[-1] >= r.nan_mismatch + r.inf_mismatch


# ------------------------------------------------------------------------------------------------
# the chunked CPU path on tensors larger than a chunk


def _perturbed(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Like two runtimes' outputs: most elements 0-3 ULP apart, a few far off, some exact zeros."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    x[rng.random(n) < 0.01] = 0.0
    e = bf16_round(x) if kind == "bfloat16" else x.astype(NP_DTYPE[kind])
    k = rng.integers(-3, 4, n)
    g = _step(e, k, kind) if kind != "float64" else e + e * 1e-15 * k
    far = rng.choice(n, 20, replace=False)
    g[far] = e[far] + rng.standard_normal(20).astype(g.dtype)
    return e, bf16_round(g) if kind == "bfloat16" else g.astype(e.dtype)


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "float32"])
def test_chunked_path_matches_reference_across_chunks(kind: str) -> None:
    n = 3 * diff._CHUNK + 12345
    e, g = _perturbed(kind, n, seed=1)
    # the worst element, a NaN mismatch and a sign flip near zero sit in later chunks
    last = 3 * diff._CHUNK + 100
    g[last] = e[last] + 50
    g[2 * diff._CHUNK + 7] = np.nan
    e[diff._CHUNK + 3], g[diff._CHUNK + 3] = 2**-10, -(2**-10)
    if kind == "bfloat16":
        g = bf16_round(g)
    tol = (1e-2, 1e-2)
    ref = reference(e, g, kind, DEFAULT_THRESHOLDS, tol)
    for code_path in ("numpy", "torch"):
        r = run(code_path, to_tensor(e, kind), to_tensor(g, kind), tolerance=tol, chunk=diff._CHUNK)
        assert_matches(r, ref, e.shape)
        assert r.argmax == (last,)
        assert r.nan_mismatch == 1


def test_chunked_path_3d_float16_argmax_in_last_chunk() -> None:
    shape = (3, 257, 1031)  # not a multiple of the chunk size
    e, g = _perturbed("float16", math.prod(shape), seed=2)
    e, g = e.reshape(shape), g.reshape(shape)
    g[2, 256, 1030] = e[2, 256, 1030] + np.float16(200)
    r = compare(torch.from_numpy(e), torch.from_numpy(g), tolerance=(1e-3, 1e-3))
    assert r.argmax == (2, 256, 1030)
    assert_matches(r, reference(e, g, "float16", DEFAULT_THRESHOLDS, (1e-3, 1e-3)), shape)


def test_first_occurrence_of_the_max_wins_across_chunks() -> None:
    n = 2 * diff._CHUNK + 10
    e = np.zeros(n, np.float32)
    g = np.zeros(n, np.float32)
    g[[5, diff._CHUNK + 1, 2 * diff._CHUNK + 3]] = 2.0
    for code_path in ("numpy", "torch"):
        r = run(code_path, torch.from_numpy(e), torch.from_numpy(g), chunk=diff._CHUNK)
        assert r.argmax == (5,), code_path
        assert r.counts[1.0] == 3, code_path


def test_concurrent_compares_share_the_worker_pool() -> None:
    pairs_ = [_perturbed("float16", 2 * diff._CHUNK + 999, seed=s) for s in range(4)]
    tensors = [(torch.from_numpy(e), torch.from_numpy(g)) for e, g in pairs_]
    alone = [compare(e, g, tolerance=(1e-3, 1e-3)).to_dict() for e, g in tensors]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda p: compare(*p, tolerance=(1e-3, 1e-3)).to_dict(), tensors))
    assert together == alone


# ------------------------------------------------------------------------------------------------
# the torch path (CUDA's) gives the numpy path's numbers


def _with_specials(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """_perturbed plus what either path must get exactly right: NaN/Inf in a few chunks, equal NaN
    and Inf pairs, -0 vs +0, opposite signs, subnormals, a tie for the max abs error (the first
    wins), and (float32, bfloat16) a difference of finite values that overflows float32."""
    e, g = _perturbed(kind, n, seed)
    rng = np.random.default_rng(seed + 100)
    idx = np.sort(rng.choice(n, 14, replace=False))
    g[idx[0]] = np.nan
    e[idx[1]] = np.inf
    e[idx[2]] = g[idx[2]] = -np.inf
    e[idx[3]], g[idx[3]] = 0.0, -0.0
    e[idx[4]], g[idx[4]] = 1.5, -1.5
    tiny = float(np.finfo(np.float16).smallest_subnormal) if kind == "float16" else 2.0**-140
    e[idx[5]], g[idx[5]] = tiny, 3 * tiny
    e[idx[6]], g[idx[6]] = -tiny, tiny
    e[idx[7]] = g[idx[7]] = np.nan
    e[idx[8]], g[idx[8]] = 1.0, 41.0  # the max, twice
    e[idx[9]], g[idx[9]] = -3.0, 37.0
    if kind in ("float32", "bfloat16"):
        e[idx[10]], g[idx[10]] = 3e38, -3e38
    if kind == "bfloat16":
        e, g = bf16_round(e), bf16_round(g)
    return e, g


@pytest.mark.parametrize("kind", FLOAT_KINDS)
def test_torch_path_gives_the_numpy_numbers_with_special_values(kind: str) -> None:
    """Every field of the report, on both paths in several chunkings, equal (and equal to the reference)."""
    n = 5 * 4096 + 77  # several chunks and a short last one
    e, g = _with_specials(kind, n, seed=3)
    tol = (1e-3, 1e-2)
    thr = (*DEFAULT_THRESHOLDS, 3.5e38, math.inf)
    ref = reference(e, g, kind, thr, tol)
    numpy_report = run("numpy", to_tensor(e, kind), to_tensor(g, kind), tolerance=tol, thresholds=thr)
    assert_matches(numpy_report, ref, e.shape)
    assert numpy_report.nan_mismatch == 1 and numpy_report.inf_mismatch == 1
    for code_path, chunk in [("torch", None), ("torch", 4096), ("torch", 999), ("numpy", 1000)]:
        r = run(code_path, to_tensor(e, kind), to_tensor(g, kind), tolerance=tol, thresholds=thr, chunk=chunk)
        assert_same_numbers(r, numpy_report)


@pytest.mark.parametrize("code_path", PATHS)
def test_infinite_threshold_counts_nothing_above_it(code_path: str) -> None:
    """Nothing is above inf: neither a difference that overflowed float32 nor a NaN/Inf mismatch."""
    e = torch.tensor([3e38, 1.0, math.inf, 0.0, 2.0])
    g = torch.tensor([-3e38, math.nan, 1.0, 0.0, 2.5])
    r = run(code_path, e, g, thresholds=[0.0, 1.0, 3.4e38, math.inf])
    assert r.counts == {0.0: 4, 1.0: 3, 3.4e38: 3, math.inf: 0}
    assert r.max_abs == math.inf and r.argmax == (0,)


@pytest.mark.parametrize("code_path", ["numpy", "torch"])
def test_argmax_tie_with_an_earlier_chunk_holding_special_values(code_path: str) -> None:
    """A chunk holding a NaN has its special values judged apart: an equal max before the next
    chunk's must still win (the first occurrence is reported)."""
    n = 3 * 4096
    e = np.zeros(n, np.float32)
    g = np.zeros(n, np.float32)
    g[5000] = np.nan  # chunk 1
    g[4100] = 2.0  # chunk 1, the first occurrence of the max
    g[9000] = 2.0  # chunk 2
    r = run(code_path, torch.from_numpy(e), torch.from_numpy(g), chunk=4096)
    assert r.argmax == (4100,)
    assert r.nan_mismatch == 1
    assert r.counts[1.0] == 3


def test_float16_subnormals_and_large_values_are_exact() -> None:
    """Every float16 bit pattern against its neighbour: the casts of subnormals, the largest finite
    values and the ULP distances across zero."""
    bits = np.arange(0, 0x10000, dtype=np.uint16)
    e = bits.view(np.float16)
    finite = np.isfinite(e)
    e = e[finite]
    g = np.roll(e, 1)
    ref = reference(e, g, "float16", DEFAULT_THRESHOLDS, (1e-5, 1e-3))
    for code_path in ("numpy", "torch"):
        r = run(code_path, torch.from_numpy(e), torch.from_numpy(g), tolerance=(1e-5, 1e-3))
        assert_matches(r, ref, e.shape)


def test_torch_chunks_keep_scratch_within_twice_the_inputs() -> None:
    """The chunk length bounds the torch path's scratch (peak bytes per element: _TORCH_SCRATCH,
    measured by benchmarks/bench_diff.py --memory) to twice the two inputs, or to a small chunk."""
    for itemsize, work in [(1, torch.float32), (2, torch.float32), (4, torch.float32), (4, torch.float64), (8, torch.float64)]:
        for n in (1, 1000, 1 << 20, 37_748_736, 1 << 31):
            k = diff._torch_chunk_len(n, itemsize, work)
            assert 1 <= k <= n
            assert k * diff._TORCH_SCRATCH[work] <= 2 * (2 * n * itemsize) or k == min(n, diff._TORCH_CHUNK_MIN)


@pytest.mark.parametrize("code_path", PATHS)
@pytest.mark.parametrize("kind", ["float16", "float32"])
def test_strided_views_that_reshape_does_not_copy(kind: str, code_path: str) -> None:
    """x[::2], x[:, 0] and expanded tensors flatten to strided views (no copy): still compared."""
    dt = {"float16": torch.float16, "float32": torch.float32}[kind]
    e = torch.arange(40, dtype=dt).reshape(20, 2)
    g = e.clone()
    g[4, 0] += 1
    assert run(code_path, e[::2], g[::2]).argmax == (2, 0)
    r = run(code_path, e[:, 0], g[:, 0])
    assert (r.argmax, r.counts[0.0], r.n) == ((4,), 1, 20)
    ones = torch.ones(1, dtype=dt)
    r = run(code_path, ones.expand(10), (ones * 2).expand(10))
    assert (r.max_abs, r.counts[0.0]) == (1.0, 10)


@pytest.mark.parametrize("code_path", PATHS)
def test_ulp_counts_only_pairs_that_differ_under_flush_denormal(code_path: str) -> None:
    """With denormals flushed, a float32 subnormal pair has d == 0: its ULP distance is not counted."""
    e = np.zeros(64, np.float32)
    g = np.zeros(64, np.float32)
    e[3], g[3] = 2.0**-140, 3 * 2.0**-140
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        r = run(code_path, torch.from_numpy(e), torch.from_numpy(g))
    finally:
        torch.set_flush_denormal(False)
    assert (r.max_abs, r.max_ulp, r.counts[0.0]) == (0.0, 0.0, 0)


def test_non_contiguous_and_numpy_inputs() -> None:
    e = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    g = e.clone()
    g[1, 2] += 0.5
    r = compare(e.t(), g.t())
    assert r.argmax == (2, 1) and r.max_abs == 0.5 and r.shape == (6, 4)
    r2 = compare(e.numpy(), g.numpy())
    assert r2.argmax == (1, 2) and r2.counts[0.1] == 1


# ------------------------------------------------------------------------------------------------
# hand-picked edges


def test_nan_inf_semantics() -> None:
    inf, nan = math.inf, math.nan
    e = np.array([nan, nan, inf, inf, -inf, 1.0, inf, nan, 0.0, 2.0], np.float32)
    g = np.array([nan, -nan, inf, -inf, -inf, nan, 1.0, inf, -0.0, 2.5], np.float32)
    r = compare(torch.from_numpy(e), torch.from_numpy(g), tolerance=(1.0, 0.0))
    assert r.nan_mismatch == 2  # 1 vs NaN, NaN vs inf (a NaN makes it a NaN mismatch)
    assert r.inf_mismatch == 2  # +inf vs -inf, inf vs 1
    assert r.max_abs == 0.5 and r.argmax == (9,)
    assert r.counts[0.0] == 5 and r.counts[100.0] == 4
    assert r.out_of_tolerance == 4  # the mismatches; 0.5 <= atol
    assert r.max_ulp == 2**21  # 2.0 -> 2.5 in float32
    assert r.mean_abs == pytest.approx(0.5 / 10)


def test_only_mismatches_put_argmax_on_the_first_one() -> None:
    e = torch.tensor([1.0, 2.0, math.inf, 3.0])
    g = torch.tensor([1.0, 2.0, 5.0, math.nan])
    r = compare(e, g)
    assert r.max_abs == 0 and r.argmax == (2,)
    assert r.expected_at_max == math.inf and r.got_at_max == 5.0
    assert r.counts == dict.fromkeys(DEFAULT_THRESHOLDS, 2)


def test_signed_zero_and_nan_payloads_are_equal() -> None:
    e = torch.tensor([0.0, -0.0, math.nan], dtype=torch.float16)
    g = torch.tensor([-0.0, 0.0, math.nan], dtype=torch.float16)
    g[2:].view(torch.int16).fill_(-1)  # a negative NaN with another payload
    assert compare(e, g).is_exact
    assert compare(e, g).max_ulp == 0


def test_overflowing_difference_of_finite_values_is_infinite() -> None:
    """float32 max vs -max: |e-g| overflows float32, the work dtype; it is a finite pair with an
    infinite difference (reported as such, not as a NaN/Inf mismatch)."""
    big = np.finfo(np.float32).max
    e = torch.tensor([1.0, big])
    g = torch.tensor([1.0, -big])
    r = compare(e, g, tolerance=(1.0, 1.0))
    assert r.max_abs == math.inf and r.argmax == (1,) and r.max_rel == math.inf
    assert r.inf_mismatch == 0 and r.nan_mismatch == 0
    assert r.counts[100.0] == 1 and r.out_of_tolerance == 1
    assert r.max_ulp == 2 * 0x7F7FFFFF


def test_thresholds_are_exact_not_rounded_to_the_work_dtype() -> None:
    """float32(0.1) > 0.1: an element off by exactly float32(0.1) is above the 0.1 threshold."""
    e = torch.tensor([0.1, 0.0, 0.3], dtype=torch.float32)
    g = torch.zeros(3)
    for code_path in PATHS:
        r = run(code_path, e, g, thresholds=[0.1, 0.3, float(np.float32(0.3))])
        assert r.counts == {0.1: 2, 0.3: 1, float(np.float32(0.3)): 0}, code_path


def test_tolerance_boundary_is_inclusive() -> None:
    e = torch.tensor([1.0, 1.0, 4.0])
    g = torch.tensor([1.5, 1.5000001, 4.5])
    for code_path in PATHS:
        # numpy's allclose: |d| <= atol + rtol*|e| passes
        assert run(code_path, e, g, tolerance=(0.5, 0.0)).out_of_tolerance == 1
        assert run(code_path, e, g, tolerance=(0.0, 0.125)).out_of_tolerance == 2  # 0.5 <= 0.125*4
        assert run(code_path, e, g, tolerance=(0.0, 0.5)).out_of_tolerance == 1


@pytest.mark.parametrize("atol", [0.0, 1e-30])
def test_tolerance_is_exact_where_float32_rounding_would_decide(atol: float) -> None:
    """The bound atol + rtol*|e| is evaluated in float64. In float32, 0.75 * e rounds up onto d."""
    e = np.float32(float.fromhex("0x1.d0327ap+0"))
    d = e * np.float32(0.75)  # float32: rounded up, above the float64 product
    assert float(d) > 0.75 * float(e)
    g = e - d  # exact: |e - g| == d
    for code_path in PATHS:
        r = run(code_path, torch.tensor([e]), torch.tensor([g]), tolerance=(atol, 0.75))
        assert r.max_abs == float(d) and r.out_of_tolerance == 1, code_path


def test_tolerance_is_exact_for_subnormal_bounds() -> None:
    """rtol*|e| = 0.75 * 2**-149 rounds (in float32) up to 2**-149, the difference itself."""
    e = np.float32(2.0**-140)
    g = np.float32(2.0**-140 + 2.0**-149)
    for code_path in PATHS:
        r = run(code_path, torch.tensor([e]), torch.tensor([g]), tolerance=(0.0, 0.75 * 2.0**-9))
        assert r.out_of_tolerance == 1, code_path
        r = run(code_path, torch.tensor([e]), torch.tensor([g]), tolerance=(0.0, 2.0**-9))
        assert r.out_of_tolerance == 0, code_path  # d == rtol*|e| exactly: inside


def test_tolerance_is_exact_where_float32_rounding_would_count_an_element_out() -> None:
    """float32(float32(e*rtol) + atol) falls more than one float32 step below the float64 bound:
    d is above the float32 sum but inside the float64 one."""
    e, g = np.float32(1.2804087400436401), np.float32(-0.3272898197174072)
    tol = (0.9826634798211148, 0.4881527795453081)
    d = e - g
    assert float(d) <= tol[0] + tol[1] * float(e)
    assert d > np.float32(np.float32(e * np.float32(tol[1])) + np.float32(tol[0]))
    for code_path in PATHS:
        assert run(code_path, torch.tensor([e]), torch.tensor([g]), tolerance=tol).out_of_tolerance == 0, code_path


def test_tolerance_is_exact_where_float32_rounding_of_rtol_would_decide() -> None:
    """The same with a negligible atol: float32(rtol) and the product round down past d."""
    e, g = np.float32(1.7503966093063354), np.float32(0.7709215879440308)
    tol = (8.077935669463161e-28, 0.5595731983063726)
    assert float(e - g) <= tol[0] + tol[1] * float(e)
    for code_path in PATHS:
        assert run(code_path, torch.tensor([e]), torch.tensor([g]), tolerance=tol).out_of_tolerance == 0, code_path


def test_tolerance_candidates_taken_from_the_histogram() -> None:
    """atol equal to a histogram threshold: the candidates come from that threshold's pass."""
    e = torch.zeros(1000)
    g = torch.zeros(1000)
    g[::100] = 0.0101
    g[5] = 0.01  # exactly atol: inside
    for tol in [(0.01, 0.0), (0.01, 1e-3)]:
        for code_path in PATHS:
            r = run(code_path, e, g, tolerance=tol)
            assert r.out_of_tolerance == 10 and r.counts[0.01] == 10, (tol, code_path)


def test_relative_error_max_found_in_a_later_chunk() -> None:
    """The running maximum lets chunks be skipped; one whose ULP distance can still beat it is not."""
    e = torch.ones(16, dtype=torch.float16)  # 4 chunks of 4: both pairs in the first worker's range
    g = e.clone()
    g[0] = 1 + 10 * 2**-10  # rel 0.0098, 10 ULP
    g[4] = 1 + 14 * 2**-10  # rel 0.0137, 14 ULP, in the second chunk
    for code_path in PATHS:
        r = run(code_path, e, g)
        assert r.max_rel == 14 * 2**-10 and r.max_ulp == 14 and r.argmax == (4,), code_path


def test_relative_error_uses_tiny_floor_and_does_not_overflow() -> None:
    r = compare(torch.tensor([0.0, 1.0], dtype=torch.bfloat16), torch.tensor([8.0, 1.0], dtype=torch.bfloat16))
    assert r.max_rel == pytest.approx(8.0 / 2.0**-126, rel=1e-6)  # 6.8e38: more than float32 holds
    r = compare(torch.tensor([0.0, 2.0], dtype=torch.float16), torch.tensor([1.0, 3.0], dtype=torch.float16))
    assert r.max_rel == pytest.approx(2.0**14)


def test_integer_and_bool_compare_exactly() -> None:
    e = torch.tensor([2**31 - 1, -(2**31), 5], dtype=torch.int32)
    g = torch.tensor([-(2**31), 2**31 - 1, 5], dtype=torch.int32)
    r = compare(e, g, tolerance=(0.0, 0.0))
    assert r.max_abs == 2.0**32 - 1 and r.max_ulp == r.max_abs and r.argmax == (0,)
    assert r.counts[0.0] == 2 and r.out_of_tolerance == 2 and r.dtype == "int32"
    b = compare(torch.tensor([True, False, True]), torch.tensor([True, True, True]))
    assert b.dtype == "bool" and b.max_abs == 1 and b.argmax == (1,) and b.counts[0.1] == 1 and b.counts[1.0] == 0


def test_empty_and_scalar_tensors() -> None:
    r = compare(torch.empty(0, 3), torch.empty(0, 3))
    assert r.n == 0 and r.argmax is None and r.max_abs == 0 and r.mean_abs == 0
    assert all(c == 0 for c in r.counts.values())
    s = compare(torch.tensor(1.0), torch.tensor(1.25))
    assert s.shape == () and s.argmax == () and s.max_abs == 0.25


# ------------------------------------------------------------------------------------------------
# nested structures


def test_nested_dict_and_list_aggregate() -> None:
    a_e = torch.zeros(4)
    a_g = torch.tensor([0.0, 0.1, 0.0, 0.0])
    b_e = torch.zeros(2, 3, dtype=torch.float16)
    b_g = b_e.clone()
    b_g[1, 2] = 0.5
    c_e = [torch.ones(3), torch.ones(1)]
    c_g = [torch.tensor([1.0, math.nan, 1.0]), torch.ones(1)]
    r = compare({"a": a_e, "b": b_e, "c": c_e}, {"a": a_g, "b": b_g, "c": c_g}, tolerance=(0.0, 0.0), name="model")
    leaves = r.leaves()
    assert [x.name for x in leaves] == ["model.a", "model.b", "model.c[0]", "model.c[1]"]
    assert r.name == "model" and r.n == 4 + 6 + 3 + 1
    assert r.max_abs == 0.5 and r.max_rel == max(x.max_rel for x in leaves)
    assert r.nan_mismatch == 1 and r.out_of_tolerance == 3
    for t in r.thresholds:
        assert r.counts[t] == sum(x.counts[t] for x in leaves)
    # the worst output holds a mismatch: its argmax is reported
    assert r.argmax == (1,) and math.isnan(r.got_at_max)
    assert r.dtype == "float16,float32"
    assert r.mean_abs == pytest.approx((0.1 + 0.5) / 14, rel=1e-6)
    # without mismatches the output with the largest abs error is the worst
    r2 = compare([a_e, b_e], [a_g, b_g])
    assert r2.argmax == (1, 2) and r2.expected_at_max == 0 and r2.got_at_max == 0.5


def test_single_element_sequence_is_still_nested() -> None:
    r = compare([torch.zeros(2)], [torch.ones(2)])
    assert len(r.outputs) == 1 and r.outputs[0].name == "[0]" and r.counts[0.1] == 2


# ------------------------------------------------------------------------------------------------
# errors


def test_shape_mismatch_names_both_shapes() -> None:
    with pytest.raises(ShapeMismatchError, match=r"out.*\(2, 3\).*\(3, 2\)"):
        compare({"out": torch.zeros(2, 3)}, {"out": torch.zeros(3, 2)})


def test_dtype_mismatch_names_both_dtypes() -> None:
    with pytest.raises(ShapeMismatchError, match=r"float16.*float32"):
        compare(torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.float32))


def test_key_mismatch_names_both_sides() -> None:
    with pytest.raises(ShapeMismatchError, match=r"missing in got: \['y'\], unexpected in got: \['z'\]"):
        compare({"x": torch.zeros(1), "y": torch.zeros(1)}, {"x": torch.zeros(1), "z": torch.zeros(1)})


def test_sequence_and_type_mismatch() -> None:
    with pytest.raises(ShapeMismatchError, match="expected 2 values, got 1"):
        compare([torch.zeros(1), torch.zeros(1)], [torch.zeros(1)])
    with pytest.raises(ShapeMismatchError, match="expected a mapping, got Tensor"):
        compare({"x": torch.zeros(1)}, torch.zeros(1))


def test_bad_thresholds_and_tolerance() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        compare(torch.zeros(1), torch.zeros(1), thresholds=[])
    with pytest.raises(ValueError, match="non-negative"):
        compare(torch.zeros(1), torch.zeros(1), thresholds=[-1.0])
    with pytest.raises(ValueError, match="tolerance"):
        compare(torch.zeros(1), torch.zeros(1), tolerance=(-1.0, 0.0))


def test_tolerance_accepts_a_tolerance_object() -> None:
    from pytest_ortdiff import Tolerance

    e = torch.tensor([1.0, 2.0, 4.0, 8.0])
    g = torch.tensor([1.0005, 2.0, 4.5, 8.0])
    r = compare(e, g, tolerance=Tolerance(atol=1e-3))
    assert r.tolerance == (1e-3, 0.0) and r.out_of_tolerance == 1
    assert r == compare(e, g, tolerance=(1e-3, 0.0))
    # a Tolerance stating no rule: the expected dtype's defaults; per-dtype values resolved per output
    assert compare(e, g, tolerance=Tolerance()).tolerance == (1e-4, 1e-4)
    half = compare(e.half(), g.half(), tolerance=Tolerance(atol={"float16": 0.6, "float32": 1e-6}))
    assert half.tolerance == (0.6, 0.0) and half.out_of_tolerance == 0
    # and the report it makes is the one Tolerance.check asks for
    tol = Tolerance(atol=1e-3)
    assert [v.rule for v in tol.check(compare(e, g, tolerance=tol))] == ["allclose"]


def test_tolerance_object_in_nested_outputs_of_several_dtypes() -> None:
    from pytest_ortdiff import Tolerance

    e = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([1.0, 2.0], dtype=torch.float16), "i": torch.tensor([3, 4])}
    g = {"a": torch.tensor([1.0, 2.05]), "b": torch.tensor([1.0, 2.05], dtype=torch.float16), "i": torch.tensor([3, 5])}
    tol = Tolerance()
    r = compare(e, g, tolerance=tol)
    by_name = {leaf.name: leaf for leaf in r.leaves()}
    assert by_name["a"].tolerance == (1e-4, 1e-4) and by_name["a"].out_of_tolerance == 1
    assert by_name["b"].tolerance == (1e-2, 1e-2) and by_name["b"].out_of_tolerance == 1
    assert by_name["i"].tolerance == (0.0, 0.0) and by_name["i"].out_of_tolerance == 1
    # the pairs differ between outputs: the aggregate names none
    assert r.tolerance is None and r.out_of_tolerance == 3
    assert sorted(v.rule for v in tol.check(r)) == ["allclose", "allclose", "exact"]


def test_compare_options_are_keyword_only() -> None:
    with pytest.raises(TypeError, match="positional"):
        compare(torch.zeros(1), torch.zeros(1), (1e-3, 0.0))  # type: ignore[misc]


def test_bad_tolerance_names_both_spellings() -> None:
    with pytest.raises(ValueError, match=r"tolerance must be a Tolerance or a pair \(atol, rtol\) of non-negative numbers, got 0\.001"):
        compare(torch.zeros(1), torch.zeros(1), tolerance=1e-3)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# serialization


@SETTINGS
@given(data=st.data())
def test_to_dict_from_dict_round_trip_through_json(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(KINDS))
    e, g = data.draw(pairs(kind))
    tol = data.draw(tolerances)
    nested = data.draw(st.booleans())
    t_e, t_g = to_tensor(e, kind), to_tensor(g, kind)
    r = compare({"x": t_e, "y": [t_g]}, {"x": t_g, "y": [t_e]}, tolerance=tol) if nested else compare(t_e, t_g, tolerance=tol)
    text = json.dumps(r.to_dict(), allow_nan=False)
    back = DiffReport.from_dict(json.loads(text))
    assert back.to_dict() == r.to_dict()
    assert back.counts == r.counts and back.thresholds == r.thresholds
    assert len(back.leaves()) == len(r.leaves())
    assert _same_float(back.got_at_max, r.got_at_max) and _same_float(back.max_rel, r.max_rel)
    assert back.render() == r.render()


def test_mismatches_and_summary_without_a_zero_threshold() -> None:
    """Custom thresholds without 0: the report still knows how many elements differ at all."""
    e = np.ones(4, np.float32)
    g = e * np.float32(1.01)
    g[0] = 1.0
    r = compare(e, g, thresholds=[0.001, 0.1])
    assert r.thresholds == (0.001, 0.1)
    assert dict(r.counts) == {0.001: 3, 0.1: 0}
    assert r.mismatches == 3
    assert "3/4 differ" in r.summary()
    back = DiffReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.mismatches == 3 and back == r
    nested = compare({"a": e, "b": e}, {"a": g, "b": e}, thresholds=[0.5])
    assert nested.mismatches == 3 and [o.mismatches for o in nested.outputs] == [3, 0]
    # a report stored before `differ` existed falls back to the count above 0 (or 0)
    old = r.to_dict()
    del old["differ"]
    assert DiffReport.from_dict(old).mismatches == 0


# ------------------------------------------------------------------------------------------------
# 64-bit integers compare exactly (issue 12, item 1: a float64 difference made 2**53 + 1 == 2**53)

_I64 = (-(2**63), 2**63 - 1)
_U64 = (0, 2**64 - 1)


def _near_ends(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers within 2**12 of either end of [lo, hi], of 0, or of ±2**53: where float64 rounds."""
    centres = [c for c in (lo, hi, 0, 2**53, -(2**53)) if lo <= c <= hi]
    return st.sampled_from(centres).flatmap(lambda c: st.integers(max(lo, c - 4096), min(hi, c + 4096)))


@pytest.mark.parametrize("code_path", ["numpy", "torch"])
def test_64_bit_integers_off_by_one_differ(code_path: str) -> None:
    e = np.array([2**53 + 1, -(2**63), 2**63 - 1, 5], np.int64)
    g = np.array([2**53, -(2**63) + 1, 2**63 - 1, 5], np.int64)
    r = diff._compare(torch.from_numpy(e), torch.from_numpy(g), path=code_path, tolerance=(0.0, 0.0))  # type: ignore[arg-type]
    assert (r.mismatches, r.counts[0.0], r.out_of_tolerance) == (2, 2, 2)
    assert r.max_abs == 1.0 and r.expected_at_max == 2**53 + 1 and r.got_at_max == 2**53  # exact values, not float64 ones
    u = np.array([2**64 - 1, 2**63], np.uint64)
    ru = diff._compare(torch.from_numpy(u), torch.from_numpy(u - np.uint64(1)), path=code_path)
    assert ru.mismatches == 2
    # the largest difference of each type: 2**64 - 1 (int64) is above every finite threshold below it
    far = diff._compare(torch.tensor([-(2**63)]), torch.tensor([2**63 - 1]), path=code_path, thresholds=[0, 2.0**63, 2.0**64])
    assert dict(far.counts) == {0.0: 1, 2.0**63: 1, 2.0**64: 0}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_compare_counts_64_bit_integers_exactly(data: st.DataObject) -> None:
    """compare() on int64/uint64 arrays near ±2**63 (and 2**53, 2**64) counts exactly the elements that
    differ, and each threshold's count is the exact count of |e - g| > t in Python integers."""
    kind = data.draw(st.sampled_from([np.int64, np.uint64]))
    lo, hi = _I64 if kind is np.int64 else _U64
    n = data.draw(st.integers(1, 12))
    e = data.draw(st.lists(_near_ends(lo, hi), min_size=n, max_size=n))
    g = [data.draw(st.one_of(st.just(x), _near_ends(lo, hi), st.integers(max(lo, x - 2), min(hi, x + 2)))) for x in e]
    t = float(data.draw(st.sampled_from([0, 1, 2, 4095, 2**53, 2**63])))
    r = compare(np.array(e, kind), np.array(g, kind), thresholds=[0.0, t])
    d = [abs(a - b) for a, b in zip(e, g, strict=True)]
    assert r.mismatches == sum(x > 0 for x in d)
    assert r.counts[t] == sum(x > t for x in d)


# ------------------------------------------------------------------------------------------------
# issue 14: the floored errors (6) and the element outside the tolerance (4), against numpy

POW2_MAX = {"float16": 2.0**127, "bfloat16": 2.0**127, "float32": 2.0**127, "float64": 2.0**1023}
MANT = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


def floored_reference(e: np.ndarray, g: np.ndarray, kind: str) -> tuple[float, float, float]:
    """(F, max floored rel, max floored ulp) of the documented semantics, in float64 numpy: F the RMS of
    e's finite values rounded to the nearest power of two within [tiny, the work dtype's largest power of
    two]; over the pairs that differ (not NaN/Inf mismatches, not equal specials), |e - g| in the work
    dtype over max(|e|, F), and over 2**floor(log2(max(|e|, F))) times 2**p."""
    e = np.ascontiguousarray(e).reshape(-1)
    g = np.ascontiguousarray(g).reshape(-1)
    with np.errstate(all="ignore"):
        e64 = e.astype(np.float64)
        fin = e64[np.isfinite(e64)]
        rms = math.sqrt(float(np.mean((fin / np.abs(fin).max()) ** 2))) * float(np.abs(fin).max()) if fin.size and np.abs(fin).max() > 0 else 0.0
        if rms == 0:
            floor = TINY[kind]
        else:
            floor = min(max(2.0 ** min(round(math.log2(rms)), 1023), TINY[kind]), POW2_MAX[kind])
        ew, gw = e.astype(_work(kind)), g.astype(_work(kind))
        d = np.abs(ew - gw).astype(np.float64)
        g64 = gw.astype(np.float64)
        pos = (d > 0) & np.isfinite(e64) & ~np.isnan(g64) & ~(np.isinf(g64) & ~np.isinf(e64))
        if not pos.any():
            return floor, 0.0, 0.0
        a = np.maximum(np.abs(e64[pos]), floor)
        p2 = np.array([math.ldexp(1.0, math.frexp(x)[1] - 1) for x in a])
        return floor, float((d[pos] / a).max()), float((d[pos] / p2).max()) * 2.0 ** MANT[kind]


@pytest.mark.parametrize("kind", FLOAT_KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_floored_errors_match_numpy(kind: str, data: st.DataObject) -> None:
    e, g = data.draw(pairs(kind))
    floor, rel, ulp = floored_reference(e, g, kind)
    for code_path in PATHS:
        r = run(code_path, to_tensor(e, kind), to_tensor(g, kind))
        if not e.size:
            assert (r.rel_floor, r.max_rel_floored, r.max_ulp_floored) == (None, 0.0, 0.0)
            continue
        assert (r.rel_floor, r.max_rel_floored, r.max_ulp_floored) == (floor, rel, ulp), code_path
        assert r.max_rel_floored <= r.max_rel  # max(|e|, F) >= max(|e|, tiny)


def test_floored_errors_near_zero_read_at_the_outputs_scale() -> None:
    """Issue 14 (6): an element that should be 0 and is 1e-6 makes the raw relative error 1e-6 / tiny;
    floored at the output's RMS (here 1: values of +-1) it is 1e-6, and ULPs of 1 count float32's 2**-23."""
    e = np.where(np.arange(4096) % 2 == 0, 1.0, -1.0).astype(np.float32)
    e[7] = 0.0
    g = e.copy()
    g[7] = 1e-6
    g[8] = np.nextafter(np.float32(1.0), np.float32(2.0))  # one ULP at the output's scale
    for code_path in PATHS:
        r = run(code_path, torch.from_numpy(e), torch.from_numpy(g), chunk=1000)
        assert r.rel_floor == 1.0
        assert r.max_rel == float(np.float32(1e-6)) / TINY["float32"]
        assert r.max_rel_floored == float(np.float32(1e-6))
        assert r.max_ulp_floored == float(np.float32(1e-6)) * 2**23  # 8.4: above the one-ULP element's 1
    assert "max rel   8.51e+31   floored 1e-06" in r.render()


def test_floored_errors_of_nested_outputs_and_json() -> None:
    e = {"a": torch.tensor([0.0, 3.0]), "i": torch.tensor([3, 5])}
    g = {"a": torch.tensor([0.5, 3.0]), "i": torch.tensor([3, 6])}
    r = compare(e, g)
    a, i = r.outputs
    assert (a.rel_floor, a.max_rel_floored, a.max_ulp_floored) == (2.0, 0.25, 0.25 * 2**23)  # RMS 2.12 -> 2
    assert (i.rel_floor, i.max_rel_floored, i.max_ulp_floored) == (None, 1 / 5, 1.0)  # integers: the raw ones
    assert (r.rel_floor, r.max_rel_floored, r.max_ulp_floored) == (None, 0.25, 0.25 * 2**23)
    back = DiffReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    old = r.to_dict()
    for key in ("rel_floor", "max_rel_floored", "max_ulp_floored", "outside_at", "expected_at_outside", "got_at_outside"):
        del old[key]
    assert DiffReport.from_dict(old).max_rel_floored is None  # a report stored before issue 14


def outside_reference(e: np.ndarray, g: np.ndarray, kind: str, tol: tuple[float, float]) -> int | None:
    """The flat index `outside_at` names: the first finite pair with the largest |e - g| (work dtype)
    above atol + rtol*|e| (float64), else the first NaN/Inf mismatch, else None."""
    e = np.ascontiguousarray(e).reshape(-1)
    g = np.ascontiguousarray(g).reshape(-1)
    atol, rtol = tol
    with np.errstate(all="ignore"):
        e64, g64 = e.astype(np.float64), g.astype(_work(kind)).astype(np.float64)
        if kind in FLOAT_KINDS:
            d = np.abs(e.astype(_work(kind)) - g.astype(_work(kind))).astype(np.float64)
            finite = np.isfinite(e64) & np.isfinite(g64)
            mis = (np.isnan(e64) != np.isnan(g64)) | ((np.isinf(e64) | np.isinf(g64)) & (e64 != g64) & ~np.isnan(e64) & ~np.isnan(g64))
        else:
            d = np.array([abs(int(a) - int(b)) for a, b in zip(e.tolist(), g.tolist(), strict=True)], dtype=object)
            finite, mis = np.ones(e.size, bool), np.zeros(e.size, bool)
        out = [i for i in range(e.size) if finite[i] and (d[i] > math.floor(atol + rtol * abs(e64[i])) if kind not in FLOAT_KINDS else float(d[i]) > atol + rtol * abs(e64[i]))]
    if out:
        top = max(d[i] for i in out)
        return next(i for i in out if d[i] == top)
    return int(np.flatnonzero(mis)[0]) if mis.any() else None


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_outside_names_an_element_outside_the_tolerance(kind: str, data: st.DataObject) -> None:
    e, g = data.draw(pairs(kind))
    tol = data.draw(st.tuples(st.sampled_from([0.0, 1e-5, 0.5]) | st.floats(0, 10), st.sampled_from([0.0, 1e-3, 0.5]) | st.floats(0, 2)))
    where = outside_reference(e, g, kind, tol)
    for code_path in PATHS:
        r = run(code_path, to_tensor(e, kind), to_tensor(g, kind), tolerance=tol)
        if where is None:
            assert r.outside_at is None, code_path
            continue
        assert r.outside_at == (tuple(int(i) for i in np.unravel_index(where, e.shape)) if e.shape else ()), code_path
        assert _same_float(float(r.expected_at_outside), float(e.reshape(-1)[where])), code_path  # type: ignore[arg-type]
        assert _same_float(float(r.got_at_outside), float(g.reshape(-1)[where])), code_path  # type: ignore[arg-type]


@pytest.mark.parametrize("code_path", PATHS)
def test_outside_when_rtol_lets_the_max_abs_element_in(code_path: str) -> None:
    """The max abs element (0.5 off 100) is inside rtol=1 %; the element outside is the small one."""
    e = torch.tensor([100.0, 1e-3, 2e-3, 5.0])
    g = torch.tensor([100.5, 2e-3, 2.5e-3, 5.0])
    r = run(code_path, e, g, tolerance=(0.0, 0.01))
    assert r.argmax == (0,) and r.out_of_tolerance == 2
    assert r.outside_at == (1,) and (r.expected_at_outside, r.got_at_outside) == (float(e[1]), float(g[1]))


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("special", [False, True])
def test_floored_ratios_that_underflow_the_work_dtype_are_decided_in_float64(kind: str, special: bool) -> None:
    """An output of scale 2**55 with an element that should be 0 and is 1e-40 (a float32 subnormal): its floored
    relative error, 1e-40 / 2**55, underflows float32 (where 16-bit and float32 pairs are compared) to 0, and
    is the float64 quotient on every path (the torch path said 0 where numpy said 2.5e-57)."""
    big = 5.6294995e16 if kind != "float16" else 32768.0
    tiny = 9.1835e-41 if kind != "float16" else 6e-8
    e = np.array([-big, 0.0], dtype=np.float32)
    g = np.array([-np.inf if special else -big, tiny], dtype=np.float32)
    reports = {p: run(p, to_tensor(e, kind), to_tensor(g, kind)) for p in PATHS}
    r = reports["numpy"]
    t = float(to_tensor(g, kind)[1].double())
    assert r.rel_floor is not None and r.max_rel_floored == t / r.rel_floor > 0
    assert_same_numbers(reports["torch-chunks"], r)


def test_masks_are_counted_in_pieces_off_the_cpu() -> None:
    """On CUDA torch.count_nonzero sums the mask cast to int64 (8 bytes an element: twice a float32 chunk's d,
    what took the torch path past twice its inputs on a GPU); there the torch path counts in pieces. The pieces
    add up to the count whatever the length."""
    gen = torch.Generator().manual_seed(0)
    for n in (1, 15, 16, 17, 1000, (1 << 16) + 3):
        mask = torch.rand(n, generator=gen) < 0.3
        assert diff._count_in_pieces(mask) == int(torch.count_nonzero(mask)) == diff._count(mask)
    assert diff._count_in_pieces(torch.zeros(0, dtype=torch.bool)) == 0
