"""compare() on the GPU in one fused pass: a Triton kernel computing every statistic of a DiffReport.

The path of float16/bfloat16/float32 tensors on CUDA where Triton is importable (torch's CUDA builds ship it):
one pass reads both tensors once and writes a few numbers per block (histogram counts, |e - g| sum and max
with its first index, max ULP, the relative errors plain and floored, the allclose count), reduced on the
device; a first pass sums the expected squares for the floor F. Every number is the one the CPU path gives:
|e - g| in float32 and every comparison with it as there; the ratios in float64 (exact, so their maxima
too); the allclose bound atol + rtol*|e| in float64 without fused multiply-adds, as numpy's. A tensor with a
NaN or Inf anywhere (or a difference that overflows) takes the torch path, which judges those pairs apart.
A Triton that cannot compile or launch here (no C compiler for its launcher, no libcuda it can find, a
ptxas error) gives the pass up for the process: compare() takes the torch path, and `failure()` says why.
With TRITON_INTERPRET=1 the same kernels run on CPU tensors (the project's tests check them against numpy).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import torch

__all__ = ["available", "failure", "give_up", "stats_pass", "usable"]

BLOCK = 2048
# (integer type of the bit patterns, mask of their magnitude, mantissa bits) per input dtype
_BITS = {torch.float16: ("int16", 0x7FFF), torch.bfloat16: ("int16", 0x7FFF), torch.float32: ("int32", 0x7FFFFFFF)}


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Triton importable here (torch's CUDA builds bring it; a CPU torch does not)."""
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception:  # (ImportError, or a broken install failing on import)
        return False
    return True


# why the fused pass was given up in this process (the first error of a compile or launch), or None
_FAILURE: list[str] = []


def failure() -> str | None:
    """Why compare() stopped taking the fused pass in this process (None: it has not)."""
    return _FAILURE[0] if _FAILURE else None


def give_up(exc: BaseException) -> None:
    """The pass failed to compile or launch: compare() takes the torch path from now on, the reason kept."""
    if not _FAILURE:
        text = str(exc).strip().splitlines()
        _FAILURE.append(f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": "))


def usable() -> bool:
    """Triton importable here and the pass not given up (compare()'s default for CUDA tensors)."""
    return available() and not _FAILURE


@functools.lru_cache(maxsize=2)
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The two kernels, made on first use (in the interpreter when TRITON_INTERPRET=1 was set by then)."""
    return _make_kernels()


def _make_kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def squares(e_ptr, n, out_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        # (the finite values only: a tensor with any other takes the torch path, this sum is then unused)
        finite = mask & (tl.abs(e) <= 1.7976931348623157e308)
        tl.store(out_ptr + pid, tl.sum(tl.where(finite, e * e, 0.0), axis=0))

    @triton.jit
    def stats(
        e_ptr, g_ptr, n, thr_ptr, params_ptr, counts_ptr, f64_ptr, i64_ptr,
        NT: tl.constexpr, HAS_TOL: tl.constexpr, BITS: tl.constexpr, MAG: tl.constexpr, IS_BF16: tl.constexpr, BLOCK: tl.constexpr,
    ):
        # (float64 numbers come in a tensor: a Python float argument would be float32)
        floor = tl.load(params_ptr + 0)
        atol = tl.load(params_ptr + 1)
        rtol = tl.load(params_ptr + 2)
        tiny = tl.load(params_ptr + 3)
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e_raw = tl.load(e_ptr + offs, mask=mask, other=0.0)
        g_raw = tl.load(g_ptr + offs, mask=mask, other=0.0)
        if IS_BF16:  # bfloat16 is float32's upper half: shifted in, bit for bit (subnormals kept, never flushed)
            e = (e_raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
            g = (g_raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            e = e_raw.to(tl.float32)
            g = g_raw.to(tl.float32)
        d = tl.abs(g - e)  # (float32, as the CPU path's work dtype: g - e is exactly -(e - g))
        special = mask & ~(d <= 3.4028234663852886e38)  # NaN/Inf on either side, or an overflowed difference
        d = tl.where(mask & ~special, d, 0.0)
        # histogram: counts[j] = #(d > thr[j]), thr rounded down into float32 (so d > thr <=> d > t exactly)
        for j in tl.static_range(NT):
            t = tl.load(thr_ptr + j)
            tl.store(counts_ptr + pid * NT + j, tl.sum((d > t).to(tl.int32), axis=0))
        m = tl.max(d, axis=0)
        first = tl.min(tl.where((d == m) & mask, offs, n), axis=0)  # the first index holding the max
        d64 = d.to(tl.float64)
        ae = tl.abs(e)
        ae64 = ae.to(tl.float64)
        rel = tl.where(d > 0, d64 / tl.maximum(ae64, tiny), 0.0)
        a = tl.maximum(ae, floor.to(tl.float32))  # max(|e|, F): exact in float32 (F a power of two)
        rel_f = d64 / a.to(tl.float64)
        # the power of two at or below a (a >= F >= the tested dtype's smallest normal: normal in float32)
        p2 = (a.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
        ulp_f = d64 / p2.to(tl.float64)
        # ULP distance: ordered bit patterns (negative ones mirrored), in 64 bits, where the pair differs
        eb = e_raw.to(BITS, bitcast=True).to(tl.int64)
        gb = g_raw.to(BITS, bitcast=True).to(tl.int64)
        oe = tl.where(eb < 0, -(eb & MAG), eb)
        og = tl.where(gb < 0, -(gb & MAG), gb)
        ulp = tl.where(d > 0, tl.abs(oe - og), 0)
        if HAS_TOL:
            bound = atol + rtol * ae64  # (no fused multiply-add: launched with enable_fp_fusion=False)
            oot = tl.sum((d64 > bound).to(tl.int32), axis=0)
        else:
            oot = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
        base = pid * 5
        tl.store(f64_ptr + base + 0, tl.sum(d64, axis=0))
        tl.store(f64_ptr + base + 1, m.to(tl.float64))
        tl.store(f64_ptr + base + 2, tl.max(rel, axis=0))
        tl.store(f64_ptr + base + 3, tl.max(rel_f, axis=0))
        tl.store(f64_ptr + base + 4, tl.max(ulp_f, axis=0))
        ibase = pid * 4
        tl.store(i64_ptr + ibase + 0, first)
        tl.store(i64_ptr + ibase + 1, tl.max(ulp, axis=0))
        tl.store(i64_ptr + ibase + 2, oot.to(tl.int64))
        tl.store(i64_ptr + ibase + 3, tl.sum(special.to(tl.int64), axis=0))

    return squares, stats


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: the compiled launches' options: fused multiply-adds would round atol + rtol*|e| once instead of twice
#: (numpy's allclose: twice), so the kernels are compiled without them (ptx `mul.rn.f64` + `add.rn.f64`, and
#: ptxas --fmad=false); tests/test_diff_triton.py compiles them for sm_90 and reads the PTX
LAUNCH_OPTIONS: dict[str, Any] = {"num_warps": 8, "enable_fp_fusion": False}


def _launch(kernel: Any, grid: tuple[int], *args: Any, **meta: Any) -> None:
    if _interpreting():
        import numpy as np

        with np.errstate(all="ignore"):  # (numpy runs the interpreted kernel: overflow to inf is IEEE, as on a GPU)
            kernel[grid](*args, **meta)
        return
    device = args[0].device
    # Triton launches on the current device: a tensor of another GPU would be read through the wrong context
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](*args, **meta, **LAUNCH_OPTIONS)


def sum_of_squares(e: torch.Tensor) -> float:
    """The sum of the squares of `e`'s finite values, in float64 (flat, contiguous)."""
    squares, _ = _kernels(_interpreting())
    n = e.numel()
    blocks = -(-n // BLOCK)
    out = torch.empty(blocks, dtype=torch.float64, device=e.device)
    _launch(squares, (blocks,), e, n, out, BLOCK=BLOCK)
    return float(out.sum())


def stats_pass(ef: torch.Tensor, gf: torch.Tensor, thr_work: list[Any], floor: float, tol: tuple[float, float] | None, tiny: float) -> dict[str, Any] | None:
    """Every statistic of the pair (flat, contiguous, same dtype), or None when a pair is special (NaN/Inf
    on either side, or an overflowed difference): the caller then takes the torch path."""
    _, stats = _kernels(_interpreting())
    bits, mag = _BITS[ef.dtype]
    import triton.language as tl

    n = ef.numel()
    blocks = -(-n // BLOCK)
    dev = ef.device
    thr = torch.tensor([float(t) for t in thr_work], dtype=torch.float32, device=dev)
    nt = thr.numel()
    counts = torch.empty((blocks, nt), dtype=torch.int32, device=dev)
    f64 = torch.empty((blocks, 5), dtype=torch.float64, device=dev)
    i64 = torch.empty((blocks, 4), dtype=torch.int64, device=dev)
    atol, rtol = tol if tol is not None else (0.0, 0.0)
    params = torch.tensor([floor, atol, rtol, tiny], dtype=torch.float64, device=dev)
    _launch(
        stats, (blocks,), ef, gf, n, thr, params, counts, f64, i64,
        NT=nt, HAS_TOL=tol is not None, BITS=getattr(tl, bits), MAG=mag, IS_BF16=ef.dtype == torch.bfloat16, BLOCK=BLOCK,
    )
    # reduced on the device, read back at once
    maxima = f64.amax(0)  # [sum (unused), max, rel, rel floored, ulp floored]
    at_max = torch.where(f64[:, 1] == maxima[1], i64[:, 0], n).amin()
    head = torch.stack([f64[:, 0].sum(), maxima[1], maxima[2], maxima[3], maxima[4], at_max.to(torch.float64)])
    ints = torch.cat([counts.sum(0, dtype=torch.int64), i64[:, 1].amax().reshape(1), i64[:, 2:].sum(0)])
    total, m, rel, rel_f, ulp_f, first = head.tolist()
    *count_list, max_ulp, oot, special = ints.tolist()
    if special:
        return None
    return {
        "counts": count_list,
        "sum_abs": total,
        "max_abs": m,
        "argmax": int(first),
        "max_rel": rel,
        "rel_floored": rel_f,
        "ulp_floored": ulp_f,
        "max_ulp": float(max_ulp),
        "oot": oot,
    }


def floor_of(e: torch.Tensor, dt: Any, finish: Any) -> float | None:
    """F of `e` from its float64 sum of squares (`finish(rms, dt)` rounds it as diff._rel_floor does); None
    when the sum says nothing (no finite value: the torch path decides)."""
    total = sum_of_squares(e)
    if not math.isfinite(total):
        return None
    return float(finish(math.sqrt(total / e.numel()) if e.numel() else 0.0, dt))
