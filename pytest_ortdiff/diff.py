"""DiffReport: the histogram diff of two tensors (or nested structures of them), computed with torch.

CUDA tensors are compared on their device; CPU tensors in chunks that stay in cache, so a 37.7M-element
float16 comparison is a few passes over memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .dtypes import DType, dtype_of

__all__ = ["DEFAULT_THRESHOLDS", "DiffReport", "ShapeMismatchError", "compare"]

#: thresholds of the default histogram: counts[t] = number of elements with |expected - got| > t
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)

# elements per CPU chunk: 2**18 float32 temporaries (1 MiB each) stay in L2 across the ~12 passes
_CHUNK = 1 << 18


class ShapeMismatchError(ValueError):
    """expected and got cannot be compared element by element."""


@dataclass(frozen=True)
class DiffReport:
    """How far `got` is from `expected`: maxima, where they happen, and a histogram of abs errors.

    For a nested structure the report aggregates its `outputs` (one leaf report per tensor): maxima are
    the maxima over outputs, counts are summed, `argmax` and the values at the max come from the
    output holding the max abs error.
    """

    name: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    n: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    mean_abs: float = 0.0
    argmax: tuple[int, ...] | None = None
    expected_at_max: float | None = None
    got_at_max: float | None = None
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    counts: Mapping[float, int] = field(default_factory=dict)
    #: elements outside numpy's allclose (|e-g| > atol + rtol*|e|) for `tolerance`, when one was given
    out_of_tolerance: int | None = None
    #: the (atol, rtol) `out_of_tolerance` was computed for
    tolerance: tuple[float, float] | None = None
    outputs: tuple[DiffReport, ...] = ()

    @property
    def is_exact(self) -> bool:
        return self.max_abs == 0 and self.nan_mismatch == 0 and self.inf_mismatch == 0

    @property
    def mismatches(self) -> int:
        """Elements that differ at all (including NaN/Inf mismatches)."""
        return self.counts.get(0.0, 0)

    def leaves(self) -> tuple[DiffReport, ...]:
        return self.outputs or (self,)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (thresholds as strings, since JSON keys must be)."""
        out: dict[str, Any] = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "n": self.n,
            "max_abs": _json_float(self.max_abs),
            "max_rel": _json_float(self.max_rel),
            "max_ulp": _json_float(self.max_ulp),
            "mean_abs": _json_float(self.mean_abs),
            "argmax": list(self.argmax) if self.argmax is not None else None,
            "expected_at_max": _json_float(self.expected_at_max),
            "got_at_max": _json_float(self.got_at_max),
            "nan_mismatch": self.nan_mismatch,
            "inf_mismatch": self.inf_mismatch,
            "counts": {_threshold_key(t): int(c) for t, c in self.counts.items()},
            "out_of_tolerance": self.out_of_tolerance,
            "tolerance": list(self.tolerance) if self.tolerance else None,
        }
        if self.outputs:
            out["outputs"] = [o.to_dict() for o in self.outputs]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiffReport:
        counts = {float(k): int(v) for k, v in data.get("counts", {}).items()}
        return cls(
            name=data.get("name", ""),
            dtype=data.get("dtype", ""),
            shape=tuple(data.get("shape", ())),
            n=int(data.get("n", 0)),
            max_abs=_from_json_float(data.get("max_abs", 0.0)),
            max_rel=_from_json_float(data.get("max_rel", 0.0)),
            max_ulp=_from_json_float(data.get("max_ulp", 0.0)),
            mean_abs=_from_json_float(data.get("mean_abs", 0.0)),
            argmax=tuple(data["argmax"]) if data.get("argmax") is not None else None,
            expected_at_max=_from_json_float(data.get("expected_at_max")),
            got_at_max=_from_json_float(data.get("got_at_max")),
            nan_mismatch=int(data.get("nan_mismatch", 0)),
            inf_mismatch=int(data.get("inf_mismatch", 0)),
            thresholds=tuple(sorted(counts)) or DEFAULT_THRESHOLDS,
            counts=counts,
            out_of_tolerance=data.get("out_of_tolerance"),
            tolerance=tuple(data["tolerance"]) if data.get("tolerance") else None,  # type: ignore[arg-type]
            outputs=tuple(cls.from_dict(o) for o in data.get("outputs", ())),
        )

    def render(self, *, width: int = 30) -> str:
        from .report import render_report

        return render_report(self, width=width)

    def summary(self) -> str:
        from .report import summary_line

        return summary_line(self)

    def __str__(self) -> str:
        return self.summary()


def _threshold_key(t: float) -> str:
    return repr(float(t))


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return float(x)


def _from_json_float(x: Any) -> Any:
    if isinstance(x, str):
        return float(x)
    return x


# ------------------------------------------------------------------------------------------------
# compare


def compare(
    expected: Any,
    got: Any,
    *,
    thresholds: Sequence[float] | None = None,
    tolerance: tuple[float, float] | None = None,
    name: str = "",
) -> DiffReport:
    """Compare `expected` with `got`: torch tensors, numpy arrays, or nested lists/tuples/dicts of them.

    `thresholds` sets the histogram (default `DEFAULT_THRESHOLDS`); `tolerance=(atol, rtol)` also
    counts the elements outside numpy's allclose, `|e - g| > atol + rtol * |e|` (what `Tolerance` checks).
    Shapes and dtypes must match: a mismatch raises `ShapeMismatchError` naming both.
    """
    thr = _normalize_thresholds(thresholds)
    leaves: list[DiffReport] = []
    _walk(expected, got, name, thr, tolerance, leaves)
    if len(leaves) == 1 and not _is_nested(expected):
        return leaves[0]
    return _aggregate(leaves, thr, tolerance, name)


def _normalize_thresholds(thresholds: Sequence[float] | None) -> tuple[float, ...]:
    if thresholds is None:
        return DEFAULT_THRESHOLDS
    out = sorted({float(t) for t in thresholds})
    if not out:
        raise ValueError("thresholds must not be empty; e.g. thresholds=[0, 1e-3, 1e-2]")
    if any(math.isnan(t) or t < 0 for t in out):
        raise ValueError(f"thresholds must be non-negative numbers, got {list(thresholds)}")
    return tuple(out)


def _is_nested(x: Any) -> bool:
    return isinstance(x, Mapping | list | tuple)


def _walk(expected: Any, got: Any, path: str, thr: tuple[float, ...], tol: Any, out: list[DiffReport]) -> None:
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            raise ShapeMismatchError(f"{path or 'value'}: expected a mapping, got {type(got).__name__}")
        if set(expected) != set(got):
            missing = sorted(map(str, set(expected) - set(got)))
            extra = sorted(map(str, set(got) - set(expected)))
            raise ShapeMismatchError(f"{path or 'value'}: keys differ; missing in got: {missing}, unexpected in got: {extra}")
        for k in expected:
            _walk(expected[k], got[k], f"{path}.{k}" if path else str(k), thr, tol, out)
        return
    if isinstance(expected, list | tuple):
        if not isinstance(got, list | tuple):
            raise ShapeMismatchError(f"{path or 'value'}: expected a sequence of {len(expected)}, got {type(got).__name__}")
        if len(expected) != len(got):
            raise ShapeMismatchError(f"{path or 'value'}: expected {len(expected)} values, got {len(got)}")
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            _walk(e, g, f"{path}[{i}]" if path else f"[{i}]", thr, tol, out)
        return
    out.append(_compare_tensors(_as_tensor(expected), _as_tensor(got), path, thr, tol))


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    from .runtimes.tensors import to_torch

    return to_torch(x)


def _aggregate(leaves: list[DiffReport], thr: tuple[float, ...], tol: Any, name: str) -> DiffReport:
    if not leaves:
        return DiffReport(name=name, thresholds=thr, counts=dict.fromkeys(thr, 0), tolerance=tol)
    worst = max(leaves, key=lambda r: (r.nan_mismatch + r.inf_mismatch > 0, r.max_abs))
    n = sum(r.n for r in leaves)
    oot = None if tol is None else sum(r.out_of_tolerance or 0 for r in leaves)
    return DiffReport(
        name=name,
        dtype=",".join(sorted({r.dtype for r in leaves})),
        shape=(),
        n=n,
        max_abs=max(r.max_abs for r in leaves),
        max_rel=max(r.max_rel for r in leaves),
        max_ulp=max(r.max_ulp for r in leaves),
        mean_abs=sum(r.mean_abs * r.n for r in leaves) / n if n else 0.0,
        argmax=worst.argmax,
        expected_at_max=worst.expected_at_max,
        got_at_max=worst.got_at_max,
        nan_mismatch=sum(r.nan_mismatch for r in leaves),
        inf_mismatch=sum(r.inf_mismatch for r in leaves),
        thresholds=thr,
        counts={t: sum(r.counts[t] for r in leaves) for t in thr},
        out_of_tolerance=oot,
        tolerance=tol,
        outputs=tuple(leaves),
    )


# ------------------------------------------------------------------------------------------------
# one pair of tensors


def _compare_tensors(e: torch.Tensor, g: torch.Tensor, name: str, thr: tuple[float, ...], tol: Any) -> DiffReport:
    if e.shape != g.shape:
        raise ShapeMismatchError(
            f"{name or 'output'}: shape mismatch: expected {tuple(e.shape)} ({e.dtype}), got {tuple(g.shape)} ({g.dtype})"
        )
    if e.dtype != g.dtype:
        raise ShapeMismatchError(
            f"{name or 'output'}: dtype mismatch: expected {str(e.dtype).replace('torch.', '')}, "
            f"got {str(g.dtype).replace('torch.', '')} (shape {tuple(e.shape)}); cast one side first "
            "(e.g. the float64 oracle to the tested dtype)"
        )
    if e.device != g.device:
        g = g.to(e.device)
    dt = dtype_of(e.dtype)
    acc = _Accumulator(dt, thr, tol, e.device)
    n = e.numel()
    ef = e.reshape(-1)
    gf = g.reshape(-1)
    if e.device.type == "cpu" and n > _CHUNK:
        for start in range(0, n, _CHUNK):
            acc.add(ef[start : start + _CHUNK], gf[start : start + _CHUNK], start)
    elif n:
        acc.add(ef, gf, 0)
    return acc.report(name, tuple(e.shape), ef, gf)


# compute dtype of the differences: wide enough that |e - g| of two finite values never overflows
# (float16/bfloat16 -> float32) and that integer differences are exact
def _work_dtype(dt: DType) -> torch.dtype:
    if dt in (DType.FLOAT64, DType.INT64, DType.UINT64, DType.UINT32, DType.INT32):
        return torch.float64
    return torch.float32


_BITS_INT = {DType.FLOAT16: torch.int16, DType.BFLOAT16: torch.int16, DType.FLOAT32: torch.int32, DType.FLOAT64: torch.int64}


class _Accumulator:
    """Running maxima, sums and histogram counts over chunks, kept as tensors to avoid device syncs."""

    def __init__(self, dt: DType, thr: tuple[float, ...], tol: Any, device: torch.device) -> None:
        self.dt = dt
        self.work = _work_dtype(dt)
        self.floating = dt.is_floating_point
        self.tiny = dt.tiny if self.floating else 1.0
        self.thr = torch.tensor(thr, dtype=self.work, device=device)
        self.thr_tuple = thr
        self.tol = tol
        self.n_thr = len(thr)
        self.hist = torch.zeros(self.n_thr + 1, dtype=torch.int64, device=device)
        self.best_abs = torch.zeros((), dtype=self.work, device=device)
        self.best_idx = torch.zeros((), dtype=torch.int64, device=device)
        self.max_rel = torch.zeros((), dtype=self.work, device=device)
        self.max_ulp = torch.zeros((), dtype=torch.float64, device=device)
        self.sum_abs = torch.zeros((), dtype=torch.float64, device=device)
        self.nan_mismatch = torch.zeros((), dtype=torch.int64, device=device)
        self.inf_mismatch = torch.zeros((), dtype=torch.int64, device=device)
        self.oot = torch.zeros((), dtype=torch.int64, device=device)
        # index of the worst element when only mismatches (NaN/Inf) exist
        self.mismatch_idx: torch.Tensor | None = None

    def add(self, e: torch.Tensor, g: torch.Tensor, offset: int) -> None:
        ew = e.to(self.work)
        gw = g.to(self.work)
        d = (ew - gw).abs_()
        s = d.sum(dtype=torch.float64)
        special = self.floating and not bool(torch.isfinite(s))
        if special:
            d = self._special(ew, gw, d, offset)
            finite_d = torch.where(torch.isinf(d), 0.0, d)
            s = finite_d.sum(dtype=torch.float64)
            dmax_src = finite_d
        else:
            dmax_src = d
        self.sum_abs += s
        # histogram: index i = number of thresholds strictly below d, so count(d > t_k) = #(i > k)
        idx = torch.searchsorted(self.thr, d, right=False)
        self.hist += torch.bincount(idx, minlength=self.n_thr + 1)
        m, i = dmax_src.max(dim=0)
        better = m > self.best_abs
        self.best_abs = torch.where(better, m, self.best_abs)
        self.best_idx = torch.where(better, i + offset, self.best_idx)
        abs_e = ew.abs()
        rel = dmax_src / abs_e.clamp_min_(self.tiny)
        self.max_rel = torch.maximum(self.max_rel, rel.max())
        if self.floating:
            self.max_ulp = torch.maximum(self.max_ulp, self._ulp(e, g, d if special else None).to(torch.float64))
        else:
            self.max_ulp = torch.maximum(self.max_ulp, m.to(torch.float64))
        if self.tol is not None:
            atol, rtol = self.tol
            self.oot += (d > atol + rtol * abs_e).sum()

    def _special(self, ew: torch.Tensor, gw: torch.Tensor, d: torch.Tensor, offset: int) -> torch.Tensor:
        """NaN/Inf semantics: NaN==NaN and +Inf==+Inf are equal; a mismatch counts above every threshold."""
        en, gn = torch.isnan(ew), torch.isnan(gw)
        both_nan = en & gn
        nan_mis = en ^ gn
        ei, gi = torch.isinf(ew), torch.isinf(gw)
        same_inf = ei & gi & (ew == gw)
        inf_mis = (ei | gi) & ~same_inf & ~en & ~gn
        self.nan_mismatch += nan_mis.sum()
        self.inf_mismatch += inf_mis.sum()
        d = torch.where(both_nan | same_inf, 0.0, d)
        mis = nan_mis | inf_mis
        d = torch.where(mis, torch.inf, d)
        if self.mismatch_idx is None and bool(mis.any()):
            self.mismatch_idx = mis.nonzero()[0, 0] + offset
        return d

    def _ulp(self, e: torch.Tensor, g: torch.Tensor, d: torch.Tensor | None) -> torch.Tensor:
        """Max distance in units in the last place of the compared dtype: the count of representable
        values between e and g, from their bit patterns (sign-magnitude mapped to a monotone integer)."""
        ibits = _BITS_INT[self.dt]
        # 16-bit patterns differ by < 2**16: int32 is exact and half the traffic of int64
        wide = torch.int32 if ibits == torch.int16 else torch.int64
        ei = _ordered(e.contiguous().view(ibits)).to(wide)
        gi = _ordered(g.contiguous().view(ibits)).to(wide)
        if ibits == torch.int64:
            dist = (ei.to(torch.float64) - gi.to(torch.float64)).abs_()
        else:
            dist = (ei - gi).abs_()
        if d is not None:
            # NaN/Inf positions are reported as mismatches, not as ULP distances
            dist = torch.where(torch.isfinite(d), dist, 0)
        return dist.max()

    def report(self, name: str, shape: tuple[int, ...], ef: torch.Tensor, gf: torch.Tensor) -> DiffReport:
        n = ef.numel()
        # suffix sums: counts[k] = #(idx > k)
        hist = self.hist.tolist()
        counts: dict[float, int] = {}
        running = 0
        for k in range(self.n_thr - 1, -1, -1):
            running += hist[k + 1]
            counts[self.thr_tuple[k]] = running
        counts = {t: counts[t] for t in self.thr_tuple}
        best_abs = float(self.best_abs)
        idx_flat = int(self.best_idx)
        if best_abs == 0 and self.mismatch_idx is not None:
            idx_flat = int(self.mismatch_idx)
        argmax = _unravel(idx_flat, shape) if n else None
        e_at = float(ef[idx_flat]) if n else None
        g_at = float(gf[idx_flat]) if n else None
        return DiffReport(
            name=name,
            dtype=self.dt.short,
            shape=shape,
            n=n,
            max_abs=best_abs,
            max_rel=float(self.max_rel),
            max_ulp=float(self.max_ulp),
            mean_abs=float(self.sum_abs) / n if n else 0.0,
            argmax=argmax,
            expected_at_max=e_at,
            got_at_max=g_at,
            nan_mismatch=int(self.nan_mismatch),
            inf_mismatch=int(self.inf_mismatch),
            thresholds=self.thr_tuple,
            counts=counts,
            out_of_tolerance=int(self.oot) if self.tol is not None else None,
            tolerance=tuple(self.tol) if self.tol is not None else None,  # type: ignore[arg-type]
        )


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Map IEEE sign-magnitude bit patterns to integers that increase with the float value (+0 == -0)."""
    sign_mask = torch.iinfo(bits.dtype).max  # all bits but the sign
    return torch.where(bits < 0, -(bits & sign_mask), bits)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))
