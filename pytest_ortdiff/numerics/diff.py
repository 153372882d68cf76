"""DiffReport: the histogram diff of two tensors (or nested structures of them).

CPU tensors go through numpy in chunks that stay in cache, on worker threads (see "CPU: numpy over
chunks"); tensors on any other device (CUDA) are compared where they are, with torch, chunk by chunk,
every histogram threshold counted in one pass (see "Any device: torch over chunks"). Both paths give
the same numbers (mean_abs up to summation order): |e - g| in the work dtype (float32 for 16-bit and
float32 inputs, float64 for float64 ones), every comparison and ratio as if in float64.

Near zero the relative error and the ULP distance say little (|e - g| / tiny is huge for any error of an
element that should be 0), so the report also has them *floored* at the output's scale F, the RMS of the
expected finite values rounded to the nearest power of two (see "The floor"): max |e - g| / max(|e|, F)
and max |e - g| / ulp(max(|e|, F)).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from .dtypes import DType, dtype_of
from .tolerance import Tolerance

__all__ = ["DEFAULT_THRESHOLDS", "DiffReport", "ShapeMismatchError", "compare"]

#: thresholds of the default histogram: counts[t] = number of elements with |expected - got| > t
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)

# elements per CPU chunk: large enough that numpy's per-call overhead is noise, small enough that the
# float32 scratch arrays stay in cache across the passes (measured: benchmarks/bench_diff.py)
_CHUNK = 8 * 32000

#: the code paths of `_compare`: "numpy" (CPU tensors' own), "triton" (CUDA tensors' own where Triton is
#: importable: one fused pass, diff_triton.py) and "torch" (any device's)
DiffPath = Literal["numpy", "torch", "triton"]


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
    #: elements that differ at all (NaN/Inf mismatches included), whatever the thresholds
    differ: int | None = None
    #: F, the floor of the floored errors: the RMS of the expected output's finite values rounded to the
    #: nearest power of two, at least the dtype's smallest normal (None: integer outputs, aggregates)
    rel_floor: float | None = None
    #: max |e - g| / max(|e|, F): the relative error at the output's scale (None: not computed)
    max_rel_floored: float | None = None
    #: max |e - g| / ulp(max(|e|, F)): ULPs at the output's scale; the ULP distance wherever |e| >= F
    #: and both values lie in one binade (None: not computed)
    max_ulp_floored: float | None = None
    #: with a tolerance: the element outside it with the largest |diff| among the finite pairs, else
    #: (only NaN/Inf mismatches are outside) the first mismatch; None when every element is inside
    outside_at: tuple[int, ...] | None = None
    expected_at_outside: float | None = None
    got_at_outside: float | None = None

    @property
    def is_exact(self) -> bool:
        return self.max_abs == 0 and self.nan_mismatch == 0 and self.inf_mismatch == 0

    @property
    def mismatches(self) -> int:
        """Elements that differ at all (including NaN/Inf mismatches)."""
        return self.differ if self.differ is not None else self.counts.get(0.0, 0)

    def leaves(self) -> tuple[DiffReport, ...]:
        return self.outputs or (self,)

    @property
    def rel_at_max(self) -> float | None:
        """The relative error |e - g| / max(|e|, tiny) of the element at `argmax` (None when there is no
        finite pair there): `max_rel` is the largest over all elements, often another one."""
        leaf = self._leaf_at_max()
        if leaf is None:
            return None
        tiny = _tiny(leaf.dtype)
        return float(leaf.max_abs) / max(abs(float(leaf.expected_at_max)), tiny)  # type: ignore[arg-type]

    @property
    def ulp_at_max(self) -> float | None:
        """The ULP distance (in the output's dtype) of the element at `argmax` (None when there is no
        finite pair there); `max_ulp` is the largest over all elements."""
        leaf = self._leaf_at_max()
        if leaf is None:
            return None
        try:
            dt = dtype_of(leaf.dtype)
        except ValueError:
            return None
        if not dt.is_floating_point:
            return float(leaf.max_abs)
        if leaf.max_abs == 0:
            return 0.0
        return _ulp_between(float(leaf.expected_at_max), float(leaf.got_at_max), dt)  # type: ignore[arg-type]

    def _leaf_at_max(self) -> DiffReport | None:
        """The output holding `argmax` when the pair there is a finite one (not a NaN/Inf mismatch)."""
        leaf = _worst_leaf(list(self.outputs)) if self.outputs else self
        if leaf.argmax is None or leaf.expected_at_max is None or leaf.got_at_max is None or not leaf.dtype:
            return None
        e, g = float(leaf.expected_at_max), float(leaf.got_at_max)
        if not (math.isfinite(e) and math.isfinite(g)):
            return None
        return leaf

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
            "differ": self.differ,
            "rel_floor": _json_float(self.rel_floor),
            "max_rel_floored": _json_float(self.max_rel_floored),
            "max_ulp_floored": _json_float(self.max_ulp_floored),
            "outside_at": list(self.outside_at) if self.outside_at is not None else None,
            "expected_at_outside": _json_float(self.expected_at_outside),
            "got_at_outside": _json_float(self.got_at_outside),
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
            tolerance=(float(data["tolerance"][0]), float(data["tolerance"][1])) if data.get("tolerance") else None,
            outputs=tuple(cls.from_dict(o) for o in data.get("outputs", ())),
            differ=int(data["differ"]) if data.get("differ") is not None else None,
            # (reports stored before these existed have none of them)
            rel_floor=_from_json_float(data.get("rel_floor")),
            max_rel_floored=_from_json_float(data.get("max_rel_floored")),
            max_ulp_floored=_from_json_float(data.get("max_ulp_floored")),
            outside_at=tuple(data["outside_at"]) if data.get("outside_at") is not None else None,
            expected_at_outside=_from_json_float(data.get("expected_at_outside")),
            got_at_outside=_from_json_float(data.get("got_at_outside")),
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


def _tiny(dtype: str) -> float:
    """The floor of the relative error's denominator: the dtype's smallest normal (1 for integers)."""
    try:
        dt = dtype_of(dtype)
    except ValueError:
        return 1.0
    return dt.tiny if dt.is_floating_point else 1.0


def _ulp_between(e: float, g: float, dt: DType) -> float:
    """The ULP distance of two finite values of a floating dtype (held exactly in Python floats)."""
    t = torch.tensor([e, g], dtype=torch.float64).to(dt.torch)
    return float(_ulp_torch(t[:1], t[1:], _BITS[dt])[0])


def _worst_leaf(leaves: Sequence[DiffReport]) -> DiffReport:
    """The output an aggregate takes its argmax from: a NaN/Inf mismatch first, then the largest max abs."""
    return max(leaves, key=lambda r: (r.nan_mismatch + r.inf_mismatch > 0, r.max_abs))


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    if isinstance(x, int) and not isinstance(x, bool):
        return x  # an integer output's value: exact in JSON, where a float64 may not hold it
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
    tolerance: tuple[float, float] | Tolerance | None = None,
    name: str = "",
) -> DiffReport:
    """Compare `expected` with `got`: torch tensors, numpy arrays, or nested lists/tuples/dicts of them.

    Every argument after `got` is keyword-only (`compare(e, g, tolerance=...)`). `thresholds` sets the
    histogram (default `DEFAULT_THRESHOLDS`); `tolerance` also counts the elements outside numpy's
    allclose, `|e - g| > atol + rtol * |e|`: a pair `(atol, rtol)`, or a `Tolerance`, whose allclose
    pair is resolved for each output's dtype (`Tolerance.for_dtype`: per-dtype values, the dtype's
    defaults when it states no rule) — the report `Tolerance.check` then needs.
    Shapes and dtypes must match: a mismatch raises `ShapeMismatchError` naming both.
    """
    return _compare(expected, got, thresholds=thresholds, tolerance=tolerance, name=name)


def _compare(
    expected: Any,
    got: Any,
    *,
    thresholds: Sequence[float] | None = None,
    tolerance: tuple[float, float] | Tolerance | None = None,
    name: str = "",
    path: DiffPath | None = None,
    chunk: int | None = None,
) -> DiffReport:
    """`compare` on a chosen code path, for the tests that hold every path to the same numbers.

    `path`: None takes the tensors' own path (numpy on CPU, torch elsewhere); "torch" runs the torch
    path on CPU tensors too; "numpy" copies non-CPU tensors to the host first. `chunk`: elements per
    chunk (None: the path's own choice), tiny values put chunk boundaries everywhere.
    """
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be a positive number of elements, got {chunk}")
    thr = _normalize_thresholds(thresholds)
    tol: tuple[float, float] | Tolerance | None = tolerance if isinstance(tolerance, Tolerance) else _normalize_tolerance(tolerance)
    leaves: list[DiffReport] = []
    # 0 is always counted: `differ` (how many elements differ at all) whatever the histogram shows
    route = _Route(path, chunk)
    _walk(expected, got, name, thr if 0.0 in thr else (0.0, *thr), tol, route, leaves)
    leaves = [_shown(leaf, thr) for leaf in leaves]
    if len(leaves) == 1 and not _is_nested(expected):
        return leaves[0]
    return _aggregate(leaves, thr, name, tol if isinstance(tol, tuple) else None)


@dataclass(frozen=True)
class _Route:
    path: DiffPath | None
    chunk: int | None


def _shown(leaf: DiffReport, thr: tuple[float, ...]) -> DiffReport:
    """The leaf with `differ` set and only the requested thresholds in its histogram."""
    differ = leaf.counts.get(0.0, 0)
    if leaf.thresholds == thr:
        return replace(leaf, differ=differ)
    return replace(leaf, thresholds=thr, counts={t: leaf.counts[t] for t in thr}, differ=differ)


def _normalize_thresholds(thresholds: Sequence[float] | None) -> tuple[float, ...]:
    if thresholds is None:
        return DEFAULT_THRESHOLDS
    out = sorted({float(t) for t in thresholds})
    if not out:
        raise ValueError("thresholds must not be empty; e.g. thresholds=[0, 1e-3, 1e-2]")
    if any(math.isnan(t) or t < 0 for t in out):
        raise ValueError(f"thresholds must be non-negative numbers, got {list(thresholds)}")
    return tuple(out)


def _normalize_tolerance(tolerance: Any) -> tuple[float, float] | None:
    if tolerance is None:
        return None
    message = f"tolerance must be a Tolerance or a pair (atol, rtol) of non-negative numbers, got {tolerance!r}"
    try:
        atol, rtol = (float(x) for x in tolerance)
    except (TypeError, ValueError):
        raise ValueError(message) from None
    if math.isnan(atol) or math.isnan(rtol) or atol < 0 or rtol < 0:
        raise ValueError(message)
    return (atol, rtol)


def _leaf_tolerance(tol: tuple[float, float] | Tolerance | None, dtype: torch.dtype) -> tuple[float, float] | None:
    """The (atol, rtol) pair for one output: a Tolerance resolved for its dtype as `Tolerance.check` does."""
    if not isinstance(tol, Tolerance):
        return tol
    dt = dtype_of(dtype)
    return (tol if tol.dtype == dt.short else tol.for_dtype(dt)).allclose


def _is_nested(x: Any) -> bool:
    return isinstance(x, Mapping | list | tuple)


def _walk(expected: Any, got: Any, path: str, thr: tuple[float, ...], tol: Any, route: _Route, out: list[DiffReport]) -> None:
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            raise ShapeMismatchError(f"{path or 'value'}: expected a mapping, got {type(got).__name__}")
        if set(expected) != set(got):
            missing = sorted(map(str, set(expected) - set(got)))
            extra = sorted(map(str, set(got) - set(expected)))
            raise ShapeMismatchError(f"{path or 'value'}: keys differ; missing in got: {missing}, unexpected in got: {extra}")
        for k in expected:
            _walk(expected[k], got[k], f"{path}.{k}" if path else str(k), thr, tol, route, out)
        return
    if isinstance(expected, list | tuple):
        if not isinstance(got, list | tuple):
            raise ShapeMismatchError(f"{path or 'value'}: expected a sequence of {len(expected)}, got {type(got).__name__}")
        if len(expected) != len(got):
            raise ShapeMismatchError(f"{path or 'value'}: expected {len(expected)} values, got {len(got)}")
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            _walk(e, g, f"{path}[{i}]" if path else f"[{i}]", thr, tol, route, out)
        return
    e = _as_tensor(expected)
    out.append(_compare_tensors(e, _as_tensor(got), path, thr, _leaf_tolerance(tol, e.dtype), route))


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    from .tensors import to_torch

    return to_torch(x)


def _aggregate(leaves: list[DiffReport], thr: tuple[float, ...], name: str, pair: tuple[float, float] | None) -> DiffReport:
    if not leaves:
        return DiffReport(name=name, thresholds=thr, counts=dict.fromkeys(thr, 0), tolerance=pair, differ=0)
    worst = _worst_leaf(leaves)
    n = sum(r.n for r in leaves)
    # the outputs' pairs (a Tolerance resolves one per dtype): the aggregate names one only if all agree
    pairs = {r.tolerance for r in leaves}
    tol = next(iter(pairs)) if len(pairs) == 1 else None
    counted = [r.out_of_tolerance for r in leaves if r.out_of_tolerance is not None]
    oot = sum(counted) if counted else None
    floored_rel = [r.max_rel_floored for r in leaves if r.max_rel_floored is not None]
    floored_ulp = [r.max_ulp_floored for r in leaves if r.max_ulp_floored is not None]
    outside = _worst_outside_leaf(leaves)
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
        differ=sum(r.mismatches for r in leaves),
        max_rel_floored=max(floored_rel) if floored_rel else None,
        max_ulp_floored=max(floored_ulp) if floored_ulp else None,
        outside_at=outside.outside_at if outside is not None else None,
        expected_at_outside=outside.expected_at_outside if outside is not None else None,
        got_at_outside=outside.got_at_outside if outside is not None else None,
    )


def _worst_outside_leaf(leaves: Sequence[DiffReport]) -> DiffReport | None:
    """The output whose element outside the tolerance an aggregate shows: a finite pair with the largest
    |diff| first, else (only NaN/Inf mismatches outside) the first output with one."""

    def key(r: DiffReport) -> tuple[bool, float]:
        e, g = float(r.expected_at_outside or 0.0), float(r.got_at_outside or 0.0)
        finite = math.isfinite(e) and math.isfinite(g)
        return (finite, abs(e - g) if finite else 0.0)

    found = [r for r in leaves if r.outside_at is not None]
    return max(found, key=key) if found else None


# ------------------------------------------------------------------------------------------------
# one pair of tensors



def _compare_tensors(e: torch.Tensor, g: torch.Tensor, name: str, thr: tuple[float, ...], tol: tuple[float, float] | None, route: _Route) -> DiffReport:
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
    try:
        dt = dtype_of(e.dtype)
    except ValueError:  # (KeyError too: a torch dtype without an onnx name)
        if not e.is_floating_point():
            raise
        # a floating dtype the diff has no rules for (the float8s): compared as the float32 values they hold,
        # each of theirs one of float32's (the Checker's report says so; its ULPs are float32's)
        e, g = e.to(torch.float32), g.to(torch.float32)
        dt = dtype_of(torch.float32)
    # integers and bools compare on the host, exactly (`_integer_chunk`): whichever path was asked for, so
    # every path gives the same counts (integer outputs are indices and masks, small next to activations)
    path = route.path or _own_path(e)
    if not dt.is_floating_point:
        path = "numpy"
    if path == "triton" and (e.dtype not in _TRITON_DTYPES or route.chunk is not None):
        path = "torch"  # (float64, and chunk boundaries asked for: the torch path's)
    if path == "numpy" and e.device.type != "cpu":
        e = e.cpu()
    if e.device != g.device:
        g = g.to(e.device)
    ef = e.reshape(-1)
    gf = g.reshape(-1)
    if path == "triton" and ef.numel():
        done = _triton_or_none(ef.contiguous(), gf.contiguous(), dt, thr, tol, asked=route.path == "triton")
        if done is not None:
            return done.report(name, tuple(e.shape), ef, gf)
        path = "torch"  # a NaN/Inf (or an overflowed difference) somewhere: judged apart, as the torch path does
    stats = _Stats(dt, thr, tol, _rel_floor(ef, dt) if dt.is_floating_point and ef.numel() else None)
    if ef.numel():
        if path == "numpy":
            # (reshape keeps a strided view where it can, e.g. of x[::2]: the passes need flat memory)
            ef, gf = ef.contiguous(), gf.contiguous()
            _cpu_pass(ef, gf, stats, route.chunk or _CHUNK)
        else:
            _torch_pass(ef, gf, stats, route.chunk)
    return stats.report(name, tuple(e.shape), ef, gf)


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _own_path(e: torch.Tensor) -> DiffPath:
    """numpy on CPU; on CUDA one fused Triton pass where Triton is importable (and has not failed here), torch otherwise."""
    if e.device.type == "cpu":
        return "numpy"
    if e.device.type == "cuda" and e.dtype in _TRITON_DTYPES:
        from . import diff_triton

        if diff_triton.usable():
            return "triton"
    return "torch"


def _triton_or_none(ef: torch.Tensor, gf: torch.Tensor, dt: DType, thr: tuple[float, ...], tol: tuple[float, float] | None, *, asked: bool) -> _Stats | None:
    """`_triton_pass`, or None when the torch path is to decide: a special pair, or a Triton that cannot compile
    or launch here (given up for the process, the reason in `diff_triton.failure()`). Asked for by name
    (`path="triton"`, the tests holding the paths to each other), its error is raised, not hidden."""
    from . import diff_triton

    try:
        return _triton_pass(ef, gf, dt, thr, tol)
    except torch.OutOfMemoryError:
        raise  # (no Triton problem: the torch path needs more memory still)
    except Exception as exc:
        if asked:
            raise
        diff_triton.give_up(exc)
        return None


def _triton_pass(ef: torch.Tensor, gf: torch.Tensor, dt: DType, thr: tuple[float, ...], tol: tuple[float, float] | None) -> _Stats | None:
    """The statistics by diff_triton's fused pass (None: a special pair somewhere, for the torch path)."""
    from . import diff_triton

    floor = diff_triton.floor_of(ef, dt, _floor_of_rms)
    if floor is None:
        return None
    st = _Stats(dt, thr, tol, floor)
    got = diff_triton.stats_pass(ef, gf, st.thr_work, floor, tol, st.tiny)
    if got is None:
        return None
    st.counts = got["counts"]
    st.sum_abs = got["sum_abs"]
    st.max_abs, st.argmax = got["max_abs"], got["argmax"]
    st.max_rel = got["max_rel"]
    st.max_ulp = got["max_ulp"]
    st.rel_floored, st.ulp_floored = got["rel_floored"], got["ulp_floored"] * 2.0**dt.mantissa_bits
    st.oot = got["oot"]
    return st


# compute dtype of the differences: wide enough that |e - g| of two finite values rarely overflows
# (float16/bfloat16 -> float32) and that integer differences are exact
def _work_dtype(dt: DType) -> torch.dtype:
    if dt in (DType.FLOAT64, DType.INT64, DType.UINT64, DType.UINT32, DType.INT32):
        return torch.float64
    return torch.float32


# ------------------------------------------------------------------------------------------------
# The floor
#
# The floored errors divide by max(|e|, F) (and count ULPs of it) with F the output's scale: the RMS of
# its finite expected values, rounded to the nearest power of two (so that ulp(F) = F * 2**-p exactly,
# and a report reads "floored at 1" for a unit-scale output), at least the dtype's smallest normal. It is
# one pass before the comparison, in float32 (float64 for float64 outputs); an RMS within 0.1 % of a
# rounding boundary (where another summation order could round it the other way) is redone in float64,
# so every path and device gets the same F. On CPU the pass never starts torch's OpenMP team (its
# threads would spin on the cores the comparison's worker threads use): numpy's dot, 16-bit values cast
# to float32 first in pieces below torch's grain size (as the comparison casts them).


def _rel_floor(x: torch.Tensor, dt: DType) -> float:
    """F of a flat floating tensor (any device)."""
    rms = _rms(x, exact=False)
    if rms > 0 and abs(math.log2(rms) % 1.0 - 0.5) < 1e-3:
        rms = _rms(x, exact=True)
    return _floor_of_rms(rms, dt)


def _floor_of_rms(rms: float, dt: DType) -> float:
    """F for the RMS of the expected finite values: the nearest power of two, within the dtype's range."""
    if rms == 0:
        return dt.tiny
    lo, hi = math.frexp(dt.tiny)[1] - 1, math.frexp(_POW2_MAX[dt])[1] - 1  # (both are powers of two)
    return math.ldexp(1.0, min(max(round(math.log2(rms)), lo), hi))


def _rms(x: torch.Tensor, exact: bool) -> float:
    """Root mean square of the finite values of x (0.0 when there are none)."""
    total, count = 0.0, 0
    for piece, s in _piece_sums(x, exact):
        if not math.isfinite(s):  # NaN/Inf values (left out) or an overflow (redone in float64)
            piece = piece[piece.isfinite()]
            s = _sum_squares(piece, True) if piece.numel() else 0.0
        total += s
        count += piece.numel()
    if not count:
        return 0.0
    if math.isinf(total) or total < 1e-30 * count:
        # squares that overflow (float64 values above ~1e154) or underflow (float32 values below ~1e-19,
        # float64 ones below ~1e-154): scaled by the largest value, in float64 (a rare extra pass)
        finite = x[x.isfinite()].double()
        top = float(finite.abs().max())
        if top == 0:
            return 0.0
        return top * (float(torch.linalg.vector_norm(finite / top)) / math.sqrt(count))
    return math.sqrt(total / count)


def _piece_sums(x: torch.Tensor, exact: bool) -> Iterator[tuple[torch.Tensor, float]]:
    """(piece, sum of its squares) over x. 16-bit values on CPU are cast to float32 in pieces below
    torch's grain size (as the comparison casts them) and summed by numpy's dot."""
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16) and not exact:
        k = min(_CHUNK, x.numel())
        buf = torch.empty(k, dtype=torch.float32)
        buf_np = buf.numpy()
        for start in range(0, x.numel(), k):
            piece = x[start : start + k]
            n = piece.numel()
            _foreach_copy([*buf[:n].split(_SERIAL)], [*piece.split(_SERIAL)])
            yield piece, _dot(buf_np[:n])
        return
    for start in range(0, x.numel(), _FLOOR_PIECE):
        piece = x[start : start + _FLOOR_PIECE]
        yield piece, _sum_squares(piece, exact)


def _sum_squares(piece: torch.Tensor, exact: bool) -> float:
    if piece.device.type == "cpu" and piece.dtype in (torch.float32, torch.float64):
        a = piece.numpy()
        return _dot(a.astype(np.float64) if exact and a.dtype == np.float32 else a)
    acc = torch.float64 if exact or piece.dtype == torch.float64 else torch.float32
    return float(torch.linalg.vector_norm(piece, dtype=acc)) ** 2


def _dot(a: np.ndarray) -> float:
    """Sum of squares, by numpy's dot over 64k pieces: a float32 dot adds ~4k values per SIMD lane in
    order, a relative error far below the 0.1 % window of `_rel_floor` (a whole 1M piece would not be)."""
    with np.errstate(all="ignore"):  # (an overflow is redone in float64 by the caller)
        return sum(float(np.dot(a[i : i + 65536], a[i : i + 65536])) for i in range(0, a.size, 65536))


_FLOOR_PIECE = 1 << 20


_BITS = {DType.FLOAT16: torch.int16, DType.BFLOAT16: torch.int16, DType.FLOAT32: torch.int32, DType.FLOAT64: torch.int64}
_F32_MAX = float(np.finfo(np.float32).max)
# the largest power of two of each floating dtype's work dtype: the largest floor (a float32 F must be finite)
_POW2_MAX = {DType.FLOAT16: 2.0**127, DType.BFLOAT16: 2.0**127, DType.FLOAT32: 2.0**127, DType.FLOAT64: 2.0**1023}
# exponent bits of the work dtypes: a value with its mantissa cleared is the power of two at or below it
_EXP_MASK: dict[Any, int] = {np.float32: 0x7F800000, np.float64: 0x7FF0000000000000}
# 2**(bits-1) - (largest finite bit pattern): the bit patterns e, g of an opposite-sign pair of
# finite values, subtracted in their integer type (wrapping), have |e - g| >= this (see _fast_chunk)
_OPPOSITE = {
    DType.FLOAT16: 2**15 - 0x7BFF,
    DType.BFLOAT16: 2**15 - 0x7F7F,
    DType.FLOAT32: 2**31 - 0x7F7FFFFF,
    DType.FLOAT64: 2**63 - 0x7FEFFFFFFFFFFFFF,
}


def _block_len(k: int) -> int:
    """Elements per block of a chunk of k for the per-block ULP maxima: a divisor of k."""
    return next((b for b in (8000, 8192, 4000, 4096, 2000, 2048, 1000, 1024) if k % b == 0 and k >= 4 * b), k)


def _round_down(t: float, work: Any) -> Any:
    """The largest value of the work dtype <= t: then `d > t` (exact, in float64) == `d > result` (in the
    work dtype) for every d of the work dtype. Needed because float32(0.1) > 0.1. (inf stays inf:
    nothing is above it, an overflowed difference included.)"""
    if work == np.float64 or t == math.inf:
        return work(t)
    if t >= _F32_MAX:
        return np.float32(_F32_MAX)
    x = np.float32(t)
    if float(x) > t:
        x = np.nextafter(x, np.float32(-np.inf))
    return x


def _round_up(t: float) -> Any:
    """The smallest float32 >= t (float32 max for larger t)."""
    if t >= _F32_MAX:
        return np.float32(_F32_MAX)
    x = np.float32(t)
    if float(x) < t:
        x = np.nextafter(x, np.float32(np.inf))
    return x


class _Stats:
    """Running statistics of one output over its chunks (chunks arrive in index order)."""

    def __init__(self, dt: DType, thr: tuple[float, ...], tol: tuple[float, float] | None, floor: float | None = None) -> None:
        self.dt = dt
        # the floored errors (floating outputs): F a power of two, exact in the work dtype
        self.floor = floor
        self.rel_floored = 0.0
        self.ulp_floored = 0.0
        self.floating = dt.is_floating_point
        self.work = _work_dtype(dt)
        self.np_work = np.float64 if self.work == torch.float64 else np.float32
        self.tiny = dt.tiny if self.floating else 1.0
        self.thr = thr
        self.thr_work = [_round_down(t, self.np_work) for t in thr]
        self.tol = tol
        self.atol_work = _round_down(tol[0], self.np_work) if tol is not None else None
        self.counts = [0] * len(thr)
        self.sum_abs = 0.0
        self.max_abs = -1.0  # below any |diff|: the first finite pair sets argmax
        self.argmax = 0
        self.first_mismatch: int | None = None
        self.max_rel = 0.0
        self.max_ulp = 0.0
        self.nan_mismatch = 0
        self.inf_mismatch = 0
        self.oot = 0
        # bit patterns (e, g) of opposite-sign pairs, for their exact ULP distance at the end
        self.opposite: list[tuple[np.ndarray, np.ndarray]] = []

    def finish(self) -> None:
        """Fold in the opposite-sign pairs collected by the chunks."""
        if self.opposite:
            eb, gb = (np.concatenate(x) for x in zip(*self.opposite, strict=True))
            self.opposite = []
            self.max_ulp = max(self.max_ulp, _ulp_exact(eb, gb))

    def fresh(self) -> _Stats:
        return _Stats(self.dt, self.thr, self.tol, self.floor)

    def merge(self, other: _Stats) -> None:
        """Fold in the statistics of the elements right after ours."""
        self.finish()
        other.finish()
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum_abs += other.sum_abs
        self.see_max(other.max_abs, other.argmax)
        if self.first_mismatch is None:
            self.first_mismatch = other.first_mismatch
        self.max_rel = max(self.max_rel, other.max_rel)
        self.max_ulp = max(self.max_ulp, other.max_ulp)
        self.rel_floored = max(self.rel_floored, other.rel_floored)
        self.ulp_floored = max(self.ulp_floored, other.ulp_floored)
        self.nan_mismatch += other.nan_mismatch
        self.inf_mismatch += other.inf_mismatch
        self.oot += other.oot

    def see_max(self, m: float, index: int) -> None:
        # ties go to the first index: the torch path sees a chunk's special values apart from the rest
        if m > self.max_abs or (m == self.max_abs and index < self.argmax):
            self.max_abs = m
            self.argmax = index

    def report(self, name: str, shape: tuple[int, ...], ef: torch.Tensor, gf: torch.Tensor) -> DiffReport:
        self.finish()
        n = ef.numel()
        max_abs = max(self.max_abs, 0.0)
        idx = self.argmax
        if max_abs == 0 and self.first_mismatch is not None:
            idx = self.first_mismatch
        outside = self.outside(ef, gf, max_abs) if n else None
        if self.floating:
            rel_f, ulp_f = self.rel_floored, self.ulp_floored
        else:  # integers: |e - g| / max(|e|, 1) already says it at any scale
            rel_f, ulp_f = self.max_rel, max_abs
        return DiffReport(
            name=name,
            dtype=self.dt.short,
            shape=shape,
            n=n,
            max_abs=max_abs,
            max_rel=self.max_rel,
            max_ulp=self.max_ulp if self.floating else max_abs,
            mean_abs=self.sum_abs / n if n else 0.0,
            argmax=_unravel(idx, shape) if n else None,
            expected_at_max=_value_at(ef, idx, self.floating) if n else None,
            got_at_max=_value_at(gf, idx, self.floating) if n else None,
            nan_mismatch=self.nan_mismatch,
            inf_mismatch=self.inf_mismatch,
            thresholds=self.thr,
            counts=dict(zip(self.thr, self.counts, strict=True)),
            out_of_tolerance=self.oot if self.tol is not None else None,
            tolerance=self.tol,
            rel_floor=self.floor,
            max_rel_floored=rel_f,
            max_ulp_floored=ulp_f,
            outside_at=_unravel(outside, shape) if outside is not None else None,
            expected_at_outside=_value_at(ef, outside, self.floating) if outside is not None else None,
            got_at_outside=_value_at(gf, outside, self.floating) if outside is not None else None,
        )

    def outside(self, ef: torch.Tensor, gf: torch.Tensor, max_abs: float) -> int | None:
        """The flat index `DiffReport.outside_at` names (None when nothing is outside the tolerance).

        Usually free: the element of the max abs error is outside whenever anything finite is, unless
        rtol lets its large |e| in; only then are the finite pairs scanned again (`_largest_outside`)."""
        if self.tol is None or not self.oot:
            return None
        mismatches = self.nan_mismatch + self.inf_mismatch
        if self.oot == mismatches:  # only NaN/Inf mismatches are outside: the first one
            return self.first_mismatch
        atol, rtol = self.tol
        if self.floating:
            i = self.argmax
            if max_abs > atol + rtol * abs(float(_value_at(ef, i, True))):  # (as numpy's allclose, in float64)
                return i
        return _largest_outside(ef, gf, self)  # (integers: exactly, as _integer_chunk counts)


def _largest_outside(ef: torch.Tensor, gf: torch.Tensor, st: _Stats) -> int | None:
    """The first finite pair with the largest |e - g| (in the work dtype) above atol + rtol*|e| (in
    float64), by a pass over the tensors where they are, in chunks."""
    assert st.tol is not None
    atol, rtol = st.tol
    best, where = -1.0, None
    k = _TORCH_CHUNK_MIN * 16
    for start in range(0, ef.numel(), k):
        ec, gc = ef[start : start + k], gf[start : start + k]
        if st.floating:
            e64, g64 = ec.to(st.work).double(), gc.to(st.work).double()
            d = (gc.to(st.work) - ec.to(st.work)).abs_().double()
            d.masked_fill_(~(e64.isfinite() & g64.isfinite()), -1.0)  # mismatches and equal NaN/Inf pairs
        else:  # integers: exact 64-bit differences, as _integer_chunk counts them
            e_np, g_np = ec.cpu().numpy(), gc.cpu().numpy()
            if e_np.dtype == np.bool_:
                e_np, g_np = e_np.view(np.uint8), g_np.view(np.uint8)
            u = np.maximum(e_np, g_np).astype(np.uint64) - np.minimum(e_np, g_np).astype(np.uint64)
            bound = np.floor(atol + rtol * np.abs(e_np.astype(np.float64)))
            inside = bound >= _TWO_64
            out = (u > np.where(inside, 0.0, bound).astype(np.uint64)) & ~inside
            if out.any():
                i = int(np.flatnonzero(out)[int(u[out].argmax())])
                if float(u[i]) > best:
                    best, where = float(u[i]), start + i
            continue
        d.masked_fill_(d <= e64.abs().mul_(rtol).add_(atol), -1.0)  # (e64 may be the caller's tensor)
        m, j = d.max(0)
        if float(m) > best:
            best, where = float(m), start + int(j)
    return where


def _value_at(x: torch.Tensor, i: int, floating: bool) -> float | int:
    """An element for the report: a float, or an int for integer dtypes (a 64-bit one may not fit a float)."""
    if floating or x.dtype == torch.bool:
        return float(x[i])
    return int(x[i : i + 1].cpu().numpy()[0])  # (torch's item() refuses uint64 >= 2**63)


# ------------------------------------------------------------------------------------------------
# CPU: numpy over chunks
#
# A chunk of finite values ("fast path") costs: the two float16/bfloat16 -> float32 casts (torch,
# vectorized; float32/float64 inputs need none), |e - g|, max, sum; on the integer bit patterns
# xor/min (any opposite signs?), subtract, abs, max: the ULP distance, whose nonzero count is also the
# count above the threshold 0; then one compare-and-count per histogram threshold *below the chunk's
# max* (every count above it is 0). The relative error needs a pass only in chunks whose ULP
# distances could beat the running maximum (see `_rel_same_sign`), the allclose count only in chunks
# whose max exceeds atol, on candidates found with float32 bounds of atol + rtol*|e| and decided in
# float64. A chunk holding NaN/Inf (or a difference that overflows) takes `_exact_chunk`, which
# applies every rule with explicit masks. Large tensors are split into one contiguous range per
# worker thread (numpy releases the GIL; torch is only called below its OpenMP grain size there);
# their statistics are merged in index order. Every result is exact: the shortcuts only decide
# where to look, never what is counted.


def _cpu_pass(ef: torch.Tensor, gf: torch.Tensor, st: _Stats, chunk: int) -> None:
    n = ef.numel()
    chunk = max(1, min(chunk, n))
    n_chunks = -(-n // chunk)
    workers = min(_MAX_WORKERS, torch.get_num_threads(), n_chunks)  # the user's thread limit holds
    if workers <= 1:
        _numpy_range(ef, gf, 0, n, chunk, st)
        return
    bounds = [min(n, (i * n_chunks // workers) * chunk) for i in range(workers + 1)]
    parts = [st.fresh() for _ in range(workers)]
    pool = _pool()
    futures = [pool.submit(_numpy_range, ef, gf, bounds[i], bounds[i + 1], chunk, parts[i]) for i in range(1, workers)]
    try:
        _numpy_range(ef, gf, bounds[0], bounds[1], chunk, parts[0])
    finally:
        for f in futures:
            f.exception()  # wait for every worker before raising anything
    for f in futures:
        f.result()
    for part in parts:
        st.merge(part)


# threads per comparison; more only add GIL hand-offs on top of memory bandwidth
_MAX_WORKERS = 4
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_MAX_WORKERS - 1, thread_name_prefix="ortdiff")
        return _POOL


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: start a new pool there."""
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)



def _numpy_range(ef: torch.Tensor, gf: torch.Tensor, lo: int, hi: int, chunk: int, st: _Stats) -> None:
    """Elements [lo, hi) of the flat tensors, chunk by chunk with numpy, into `st`."""
    chunk = max(1, min(chunk, hi - lo))
    with np.errstate(all="ignore"):
        if not st.floating:
            e_np, g_np = ef.numpy(), gf.numpy()
            for start in range(lo, hi, chunk):
                stop = min(hi, start + chunk)
                _integer_chunk(e_np[start:stop], g_np[start:stop], start, st)
            return
        bits = _BITS[st.dt]
        e_bits, g_bits = ef.view(bits).numpy(), gf.view(bits).numpy()
        convert = st.dt in (DType.FLOAT16, DType.BFLOAT16)
        if convert:
            # torch's cast is vectorized, numpy's float16 cast is ~10x slower. It is called on pieces
            # below torch's grain size so that it runs on this thread: an OpenMP team started here
            # would spin on the cores the other workers use. The pieces are made chunk by chunk
            # (thousands of live views would cost more, and wake the garbage collector).
            piece = min(_SERIAL, chunk)
            chunk = chunk // piece * piece
            e_buf, g_buf = torch.empty(chunk, dtype=torch.float32), torch.empty(chunk, dtype=torch.float32)
            e_buf_np, g_buf_np = e_buf.numpy(), g_buf.numpy()
            full_dst = [*e_buf.split(piece), *g_buf.split(piece)]
        else:
            e_np, g_np = ef.numpy(), gf.numpy()
        bufs = _Buffers(chunk, st.np_work, e_bits.dtype)
        for start in range(lo, hi, chunk):
            stop = min(hi, start + chunk)
            k = stop - start
            if convert:
                dst = full_dst if k == chunk else [*e_buf[:k].split(piece), *g_buf[:k].split(piece)]
                _foreach_copy(dst, [*ef[start:stop].split(piece), *gf[start:stop].split(piece)])
                ew, gw = e_buf_np[:k], g_buf_np[:k]
                d = gw  # |e - g| overwrites the cast of g (one buffer less in cache)
            else:
                ew, gw = e_np[start:stop], g_np[start:stop]
                d = bufs.d[:k]
            eb, gb = e_bits[start:stop], g_bits[start:stop]
            np.subtract(ew, gw, out=d)
            np.abs(d, out=d)
            m = float(d.max())
            if math.isfinite(m):
                _fast_chunk(ew, eb, gb, d, m, start, st, bufs)
            else:
                if convert:
                    gw = gf[start:stop].to(torch.float32).numpy()
                _exact_chunk(ew, gw, eb, gb, start, st)


_SERIAL = 32000  # elements per torch cast: < at::internal::GRAIN_SIZE (32768), so no OpenMP


def _foreach_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(dst, src)  # one call instead of 2 per piece (same kernels, same thread)
    else:
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


class _Buffers:
    """Scratch arrays reused by every chunk of one range."""

    def __init__(self, size: int, work: Any, bits: Any) -> None:
        self.d = np.empty(size, work)
        self.tmp = np.empty(size, work)
        self.tmp2 = np.empty(size, work)
        self.mask = np.empty(size, np.bool_)
        self.mask2 = np.empty(size, np.bool_)
        self.ints = np.empty(size, bits)
        self.work_ints = np.empty(size, np.int64 if work == np.float64 else np.int32)
        # F in every element: np.maximum against an array is ~4x faster than against a scalar
        self.floor: np.ndarray | None = None


def lane_sum(d: np.ndarray) -> float:
    """sum(d) of a chunk of finite |e - g|: float32 lanes added down the rows (vectorized; numpy's pairwise
    sum is not), the lane sums in float64; a float32 overflow redone in float64. blame sums in this order
    too, to get compare's mean to the bit."""
    k = d.size
    lanes = next((w for w in (2048, 1024, 512) if k % w == 0 and k >= 16 * w), 0)
    if lanes:
        s = float(np.add.reduce(np.add.reduce(d.reshape(-1, lanes), axis=0), dtype=np.float64))
    else:
        s = float(np.add.reduce(d))
    if s == math.inf:
        s = float(np.add.reduce(d, dtype=np.float64))
    return s


def _fast_chunk(ew: np.ndarray, eb: np.ndarray, gb: np.ndarray, d: np.ndarray, m: float, start: int, st: _Stats, bufs: _Buffers) -> None:
    """A chunk whose values and differences are all finite; m = max(d)."""
    k = d.size
    mask = bufs.mask[:k]
    st.sum_abs += lane_sum(d)
    if m >= st.max_abs:  # a tie may sit before the argmax so far (see see_max)
        st.see_max(m, start + int(d.argmax()))
    if m == 0:  # identical chunk: nothing else to count
        return

    # ULP distance: for same-sign pairs the difference of the raw bit patterns, in the bits' integer
    # type (it fits). A pair of opposite signs (-0 vs +0 included) wraps there to |u| >= the
    # `_OPPOSITE` bound (about a binade's worth of ULPs). Per block of the chunk: the max |u| from the
    # max and min of u (no |u| pass); only blocks reaching the bound (usually few: they hold the
    # opposite signs, if any) get a sign test, their opposite-sign pairs are done exactly on their own.
    u = bufs.ints[:k]
    np.subtract(eb, gb, out=u)
    blk = _block_len(k)
    u2 = u.reshape(-1, blk)
    hi, lo = u2.max(axis=1), u2.min(axis=1)
    bound = _OPPOSITE[st.dt]
    hot = np.flatnonzero((hi >= bound) | (lo <= -bound))
    ext = np.maximum(hi, np.negative(lo))  # max |u| per block (wrong for hot blocks: redone below)
    n_opposite_differ = 0
    if hot.size:
        opposite = np.flatnonzero(np.bitwise_xor(eb.reshape(-1, blk)[hot], gb.reshape(-1, blk)[hot]) < 0)
        if opposite.size:
            opposite = hot[opposite // blk] * blk + opposite % blk
            u[opposite] = 0
            d_opp = d[opposite]
            n_opposite_differ = int(np.count_nonzero(d_opp))
            st.opposite.append((eb[opposite], gb[opposite]))  # their ULP distance: in finish()
            # (their rel now: usually >= 1, it lets _rel_same_sign skip most chunks)
            st.max_rel = max(st.max_rel, _rel_exact(d_opp, ew[opposite], st.tiny))
        ext[hot] = np.abs(u2[hot]).max(axis=1)
    big_u = int(ext.max())
    st.max_ulp = max(st.max_ulp, float(big_u))

    # histogram: counts[t] += #(d > t) for the thresholds below the chunk max (every count above it
    # is 0). Counts fall as t rises, so where two thresholds count the same so do all between them:
    # the thresholds are visited by bisection (outputs that differ at all often differ by more than
    # every small threshold: then one pass counts them all). Once few elements are above a threshold,
    # the thresholds above it count on those few, and the allclose count takes its candidates
    # (d > atol) from them (np.flatnonzero costs about 3 compare-and-count passes).
    thr = st.thr_work
    atol = st.atol_work
    n_below = next((i for i, t in enumerate(thr) if t >= m), len(thr))
    counts = [-1] * n_below
    few: list[tuple[float, np.ndarray, np.ndarray]] = []  # (t, indices of every d > t, d there)

    def count(i: int) -> int:
        t = thr[i]
        known = [f for f in few if f[0] <= t]
        if known:
            return int(np.count_nonzero(max(known, key=lambda f: f[0])[2] > t))
        if t == 0:  # same-sign pairs differ iff their bits do
            return int(np.count_nonzero(u)) + n_opposite_differ
        np.greater(d, t, out=mask)
        c = int(np.count_nonzero(mask))
        if c * 16 <= k:
            later = sum(1 for c_later in counts[i + 1 :] if c_later < 0)
            if later >= 3 or (atol is not None and t <= atol):
                idx = np.flatnonzero(mask)
                few.append((t, idx, d[idx]))
        return c

    if n_below:
        counts[0] = count(0)
        spans = [(0, n_below - 1)]
        if n_below > 1:
            counts[-1] = count(n_below - 1)
        while spans:
            lo, hi = spans.pop()
            if hi - lo < 2:
                continue
            if counts[lo] == counts[hi]:
                counts[lo + 1 : hi] = [counts[lo]] * (hi - lo - 1)
                continue
            mid = (lo + hi) // 2
            counts[mid] = count(mid)
            spans += [(mid, hi), (lo, mid)]  # (the lower half first: it may leave few for the upper)
        for i, c in enumerate(counts):
            st.counts[i] += c
    # the allclose candidates: from the fewest elements known to be above some t <= atol
    for_tol = max((f for f in few if atol is not None and f[0] <= atol), key=lambda f: f[0], default=None)
    above, t_above = (for_tol[1], float(for_tol[0])) if for_tol is not None else (None, 0.0)

    if big_u:
        _rel_same_sign(ew, d, u2, ext, big_u, st, bufs)
    if st.floor is not None:
        _floored_chunk(ew, d, m, st, bufs)
    if st.tol is not None and m > st.tol[0]:
        _tolerance_chunk(ew, d, st, bufs, above, t_above)


def _rel_same_sign(ew: np.ndarray, d: np.ndarray, u2: np.ndarray, ext: np.ndarray, big_u: int, st: _Stats, bufs: _Buffers) -> None:
    """Max of d / max(|e|, tiny) over the same-sign pairs, from candidates picked by ULP distance.

    For a same-sign pair u ULPs apart in a format with p mantissa bits (tiny its smallest normal),
    every step between the two values is between 2**-(p+1) and 2**-p times max(value, tiny), so its
    rel lies in [L(u), H(u)] with L(u) = c/(1+c), c = u*2**-(p+1), and H(u) = q/(1-q), q = u*2**-p.
    So a pair can beat a relative error R only if H(u) > R, i.e. u > 2**p * R/(1+R); R is the running
    maximum, or L(U) of the chunk's largest distance U (that pair reaches it). A chunk whose U cannot
    beat the running maximum is skipped without a pass; otherwise the (usually few) candidates get
    the exact relative error. u2: the same-sign distances (signed) in blocks, ext: max |u| per block."""
    k = d.size
    p = st.dt.mantissa_bits
    scale = 2.0**p
    r_best = max(st.max_rel, _low_rel(big_u, p))
    u_min = scale * (r_best / (1 + r_best) if r_best < math.inf else 1.0)
    if big_u <= u_min * (1 - 1e-6):
        return
    u_min = max(1, math.floor(u_min * 0.99))
    mask = bufs.mask[:k]
    if u_min > 4:  # else most differing pairs are candidates: no point in listing them
        blk = u2.shape[1]
        hot = np.flatnonzero(ext >= u_min)  # the blocks holding candidates
        idx = np.flatnonzero(np.abs(u2[hot]) >= u_min)
        idx = hot[idx // blk] * blk + idx % blk
        if idx.size * 16 <= k:
            st.max_rel = max(st.max_rel, _rel_exact(d[idx], ew[idx], st.tiny))
            return
    # many candidates: all of them, in the work dtype (in float64 that is the reported value)
    a = bufs.tmp[:k]
    np.abs(ew, out=a)
    if a.min() < st.tiny:  # (a min pass and a rare putmask: np.maximum with a scalar is 5x slower)
        np.putmask(a, a < st.tiny, st.tiny)
    np.divide(d, a, out=a)
    r = float(a.max())
    if st.np_work == np.float64:
        st.max_rel = max(st.max_rel, r)
    elif r > 0 and r >= _round_down(st.max_rel, np.float32):
        # float32 rounding is monotonic: the largest exact ratio is among those whose rounding is the
        # largest, and none whose rounding is below the running maximum's can beat it
        np.greater_equal(a, r, out=mask)
        idx = np.flatnonzero(mask)
        st.max_rel = max(st.max_rel, _rel_exact(d[idx], ew[idx], st.tiny))


def _floored_chunk(ew: np.ndarray, d: np.ndarray, m: float, st: _Stats, bufs: _Buffers) -> None:
    """The floored relative error and ULPs of a chunk of finite values (m = max(d)): a = max(|e|, F),
    d / a and d / p2(a) (p2: the power of two at or below a, so ulp(a) = p2(a) * 2**-p) in the work
    dtype, their maxima decided in float64 among the elements whose rounded ratio is the largest
    (rounding is monotonic). A chunk where no element can beat the running maxima is skipped: every
    ratio is at most m / F, and at most m / F * 2**p in ULPs (p2(a) >= F)."""
    assert st.floor is not None
    scale = 2.0**st.dt.mantissa_bits
    if m / st.floor <= st.rel_floored and m / st.floor * scale <= st.ulp_floored:
        return
    k = d.size
    a, r, mask = bufs.tmp[:k], bufs.tmp2[:k], bufs.mask[:k]
    if bufs.floor is None:
        bufs.floor = np.full(bufs.tmp.size, st.floor, st.np_work)
    np.abs(ew, out=a)
    np.maximum(a, bufs.floor[:k], out=a)
    np.divide(d, a, out=r)
    st.rel_floored = max(st.rel_floored, _exact_max(r, mask, lambda idx: d[idx].astype(np.float64) / a[idx].astype(np.float64)))
    p2 = bufs.work_ints[:k]
    np.bitwise_and(a.view(p2.dtype), p2.dtype.type(_EXP_MASK[st.np_work]), out=p2)
    pw = p2.view(st.np_work)
    np.divide(d, pw, out=r)  # exact (a division by a power of two) but where the result is subnormal
    top = r.max()
    if not np.finfo(st.np_work).tiny <= top < np.inf:  # (rounding is monotonic: the exact max is among the largest)
        top = _exact_max(r, mask, lambda idx: d[idx].astype(np.float64) / pw[idx].astype(np.float64))
    st.ulp_floored = max(st.ulp_floored, float(top) * scale)


def _exact_max(r: np.ndarray, mask: np.ndarray, exact: Any) -> float:
    """The largest exact ratio of a chunk, from `r` (the ratios rounded to the work dtype, none NaN):
    `exact(indices)` in float64 on the elements whose rounded ratio is the largest."""
    top = r.max()
    # (a top of 0 is exact only where the chunk's d are all 0; _floored_chunk calls with some d > 0, whose
    # ratios then all underflowed the work dtype: the float64 ones decide)
    if r.dtype == np.float64:
        return float(top)
    np.greater_equal(r, top, out=mask)
    return float(exact(np.flatnonzero(mask)).max())


def _floored_exact(d64: np.ndarray, e64: np.ndarray, floor: float, p: int) -> tuple[float, float]:
    """The floored relative error and ULPs of a few pairs (d64 > 0, e64 finite), in float64."""
    a = np.maximum(np.abs(e64), floor)
    _, exponent = np.frexp(a)  # a = m * 2**exponent, 0.5 <= m < 1
    p2 = np.ldexp(1.0, exponent - 1)
    return float((d64 / a).max()), float((d64 / p2).max()) * 2.0**p


def _low_rel(u: int, p: int) -> float:
    c = u * 2.0 ** -(p + 1)
    return c / (1 + c)


def _rel_exact(d: np.ndarray, ew: np.ndarray, tiny: float) -> float:
    if not d.size:
        return 0.0
    d64 = d.astype(np.float64)
    rel = d64 / np.maximum(np.abs(ew.astype(np.float64)), tiny)
    return float(np.where(d64 > 0, rel, 0.0).max())


def _tolerance_chunk(ew: np.ndarray, d: np.ndarray, st: _Stats, bufs: _Buffers, above: np.ndarray | None, t_above: float) -> None:
    """Count d > atol + rtol*|e| (evaluated in float64) for a chunk of finite values: a cheap lower
    bound of the right side in the work dtype picks the candidates, float64 decides. `above` (when
    not None) holds the indices of every d > t_above."""
    assert st.tol is not None and st.atol_work is not None  # (called only with a tolerance)
    atol, rtol = st.tol
    atol_work = st.atol_work  # d > atol_work <=> d > atol, and atol + rtol*|e| >= atol in float64 too
    k = d.size
    mask = bufs.mask[:k]
    if st.np_work == np.float64:
        b = bufs.tmp[:k]
        np.abs(ew, out=b)
        np.multiply(b, rtol, out=b)
        np.add(b, atol, out=b)
        np.greater(d, b, out=mask)
        st.oot += int(np.count_nonzero(mask))
        return
    # float32: bounds of atol + rtol*|e| with a 2**-16 relative margin (>> the float32 rounding of
    # the two ops); an atol >= 2**-100 also gives an absolute margin over subnormal rounding
    tiny_atol = atol < 2.0**-100
    if above is not None and t_above <= atol_work:
        idx = above[d[above] > atol_work]
    else:
        np.greater(d, atol_work, out=mask)
        c = int(np.count_nonzero(mask))
        if not c or rtol == 0:  # atol + 0*|e| == atol
            st.oot += c
            return
        if c * 16 > k and max(atol, rtol) < 2.0**127:
            # many candidates (a failing comparison): d above an upper bound is out; only the few
            # between the lower and the upper bound need float64
            lo, hi, above_hi = bufs.tmp[:k], bufs.tmp2[:k], bufs.mask2[:k]
            np.abs(ew, out=lo)
            if not tiny_atol:
                np.multiply(lo, _round_up(rtol * (1 + 2.0**-16)), out=hi)
                np.add(hi, _round_up(atol * (1 + 2.0**-16)), out=hi)
                np.greater(d, hi, out=above_hi)
            np.multiply(lo, _round_down(rtol * (1 - 2.0**-16), np.float32), out=lo)
            if tiny_atol:
                np.subtract(lo, np.float32(2.0**-149), out=lo)  # covers the subnormal rounding
            else:
                np.add(lo, _round_down(atol * (1 - 2.0**-16), np.float32), out=lo)
            np.greater(d, lo, out=mask)
            if tiny_atol:
                np.logical_and(mask, d > 0, out=mask)
            else:
                st.oot += int(np.count_nonzero(above_hi))
                np.logical_and(mask, ~above_hi, out=mask)
        idx = np.flatnonzero(mask)
    if idx.size:
        d64 = d[idx].astype(np.float64)
        st.oot += int(np.count_nonzero(d64 > atol + rtol * np.abs(ew[idx].astype(np.float64))))


def _exact_chunk(ew: np.ndarray, gw: np.ndarray, eb: np.ndarray | None, gb: np.ndarray | None, start: int, st: _Stats) -> None:
    """Every rule with explicit masks, in float64: chunks with NaN/Inf (or an overflowing
    difference)."""
    k = ew.size
    d = np.abs(ew - gw)
    mis: np.ndarray | None = None
    n_mis = 0
    if st.floating:
        en, gn = np.isnan(ew), np.isnan(gw)
        ei, gi = np.isinf(ew), np.isinf(gw)
        same_inf = ei & gi & (ew == gw)
        nan_mis = en ^ gn
        inf_mis = (ei | gi) & ~same_inf & ~(en | gn)
        mis = nan_mis | inf_mis
        d[mis | (en & gn) | same_inf] = 0
        st.nan_mismatch += int(np.count_nonzero(nan_mis))
        st.inf_mismatch += int(np.count_nonzero(inf_mis))
        n_mis = int(np.count_nonzero(mis))
        if n_mis and st.first_mismatch is None:
            st.first_mismatch = start + int(np.flatnonzero(mis)[0])
    d64 = d.astype(np.float64)
    for i, t in enumerate(st.thr):
        # a mismatch is an infinite difference: above every threshold but inf
        st.counts[i] += int(np.count_nonzero(d64 > t)) + (n_mis if t < math.inf else 0)
    if n_mis < k:
        finite = d64 if mis is None else np.where(mis, -1.0, d64)
        i = int(finite.argmax())
        st.see_max(float(finite[i]), start + i)
    st.sum_abs += float(d64.sum())
    pos = d64 > 0  # pairs that differ and are not mismatches
    if pos.any():
        st.max_rel = max(st.max_rel, _rel_exact(d64[pos], ew[pos], st.tiny))
        if eb is not None and gb is not None:
            st.max_ulp = max(st.max_ulp, _ulp_exact(eb[pos], gb[pos]))
        if st.floor is not None:
            rel, ulp = _floored_exact(d64[pos], ew[pos].astype(np.float64), st.floor, st.dt.mantissa_bits)
            st.rel_floored, st.ulp_floored = max(st.rel_floored, rel), max(st.ulp_floored, ulp)
    if st.tol is not None:
        atol, rtol = st.tol
        out = d64 > atol + rtol * np.abs(ew.astype(np.float64))
        if mis is not None:
            out &= ~mis
        st.oot += int(np.count_nonzero(out)) + n_mis


_TWO_64 = float(2**64)


def _integer_chunk(e: np.ndarray, g: np.ndarray, start: int, st: _Stats) -> None:
    """Integer and bool elements, exactly: |e - g| as a 64-bit unsigned integer (in float64, 2**53 + 1
    and 2**53 would be equal), each threshold and allclose bound compared with it as an integer."""
    if e.dtype == np.bool_:
        e, g = e.view(np.uint8), g.view(np.uint8)
    # max - min, both cast to uint64 (two's complement, modulo 2**64): the true difference, < 2**64
    d = np.maximum(e, g).astype(np.uint64) - np.minimum(e, g).astype(np.uint64)
    for i, t in enumerate(st.thr):
        if t < _TWO_64:  # d > t <=> d > floor(t) for an integer d; nothing is above 2**64 - 1
            st.counts[i] += int(np.count_nonzero(d > np.uint64(math.floor(t))))
    i = int(d.argmax())
    st.see_max(float(d[i]), start + i)
    d64 = d.astype(np.float64)  # the report's numbers (max, mean, ratio): rounded, never counted
    st.sum_abs += float(d64.sum())
    pos = d > 0
    if pos.any():
        st.max_rel = max(st.max_rel, _rel_exact(d64[pos], e[pos], st.tiny))
    if st.tol is not None:
        atol, rtol = st.tol
        bound = np.floor(atol + rtol * np.abs(e.astype(np.float64)))  # numpy's allclose bound, in float64
        inside = bound >= _TWO_64  # (2**64 - 1 rounds to 2**64 in float64: such a bound holds every d)
        limit = np.where(inside, 0.0, bound).astype(np.uint64)
        st.oot += int(np.count_nonzero((d > limit) & ~inside))


def _ulp_exact(eb: np.ndarray, gb: np.ndarray) -> float:
    """Max |ordered(e) - ordered(g)| of IEEE bit patterns, exact (the 64-bit distance, up to 2**64,
    is rounded once to float64)."""
    if not eb.size:
        return 0.0
    nbits = eb.dtype.itemsize * 8
    if nbits < 64:
        mag = (1 << (nbits - 1)) - 1
        e = eb.astype(np.int64)
        g = gb.astype(np.int64)
        oe = np.where(e < 0, -(e & mag), e)
        og = np.where(g < 0, -(g & mag), g)
        return float(np.abs(oe - og).max())
    mag64 = np.int64(0x7FFFFFFFFFFFFFFF)
    oe = np.where(eb < 0, -(eb & mag64), eb)
    og = np.where(gb < 0, -(gb & mag64), gb)
    hi = (oe >> 11) - (og >> 11)  # |hi| < 2**53: exact as float64
    lo = (oe & 2047) - (og & 2047)
    return float(np.abs(hi * 2048.0 + lo).max())


# ------------------------------------------------------------------------------------------------
# Any device: torch over chunks (the path of CUDA tensors)
#
# Per chunk: |e - g| in the work dtype (16-bit values cast to float32, float32 and float64 values
# read as they are), then one bucketize of it against the thresholds and one bincount: every
# histogram count at once (the count above threshold j is the sum of the bins after j). Pairs whose
# difference is not finite (NaN/Inf on either side, or finite values whose difference overflows)
# are usually few: their difference is set to 0 and they are judged apart, with explicit masks
# (`_torch_special`). The relative error and the allclose count are found in the work dtype and
# decided in float64 on the few candidates, as on the numpy path; the ULP distance comes from the
# bit patterns in integers. Nothing is copied to float64 but candidates, and the chunk length keeps
# the scratch within about twice the two inputs' size (`_torch_chunk_len`). Results stay on the
# device until the chunk's scalars are read, a handful of synchronizations per chunk.

# scratch bytes per element of a chunk at the torch path's peak, by work dtype (measured on CPU with
# `python benchmarks/bench_diff.py --memory`: 11-12 for float16/bfloat16/float32, 20 for float64)
_TORCH_SCRATCH = {torch.float32: 13, torch.float64: 22}
# below this many elements a chunk's scratch is small whatever the ratio; above the maximum more
# elements per chunk save no launches worth having
_TORCH_CHUNK_MIN = 1 << 16
_TORCH_CHUNK_MAX = 1 << 26


def _torch_chunk_len(n: int, itemsize: int, work: torch.dtype) -> int:
    """Elements per chunk: the chunk's scratch at most twice the two inputs (of n elements each)."""
    fit = 2 * (2 * n * itemsize) // _TORCH_SCRATCH[work]
    return max(1, min(n, max(_TORCH_CHUNK_MIN, min(fit, _TORCH_CHUNK_MAX))))


def _torch_pass(ef: torch.Tensor, gf: torch.Tensor, st: _Stats, chunk: int | None) -> None:
    n = ef.numel()
    k = max(1, min(n, chunk or _torch_chunk_len(n, ef.element_size(), st.work)))
    # the thresholds rounded down into the work dtype (sorted, as they were): d > bound <=> d > t
    bounds = torch.tensor([float(t) for t in st.thr_work], dtype=st.work, device=ef.device)
    bins = torch.zeros(len(st.thr) + 1, dtype=torch.int64, device=ef.device)
    for start in range(0, n, k):
        bins += _torch_chunk(ef[start : start + k], gf[start : start + k], start, st, bounds)
    # bucketize gives each d the number of bounds below it: elements above bound j = bins j+1, j+2, ...
    above = bins.flip(0).cumsum(0).flip(0)[1:].tolist()
    st.counts = [c + int(a) for c, a in zip(st.counts, above, strict=True)]


def _torch_chunk(ec: torch.Tensor, gc: torch.Tensor, start: int, st: _Stats, bounds: torch.Tensor) -> torch.Tensor:
    """Elements [start, start + len(ec)) into `st`; returns their histogram bins.

    What lives through the chunk is d (the work dtype) and, when there are special values, their mask;
    every other temporary is made from the inputs when needed and freed after (|e| twice rather than a
    kept cast of e: memory, not passes, is what this path is short of on a GPU)."""
    d = gc.to(st.work, copy=True)
    if ec.dtype == st.work:
        d.sub_(ec)  # (g - e in the work dtype: exactly -(e - g))
    else:
        # a mixed-dtype op casts its operand into a temporary (on CPU): in pieces it stays small
        piece = max(1, -(-d.numel() // 8))
        for lo in range(0, d.numel(), piece):
            d[lo : lo + piece].sub_(ec[lo : lo + piece].to(st.work))
    d.abs_()
    special: torch.Tensor | None = None
    if st.floating:
        special = d.le(torch.finfo(st.work).max).logical_not_()  # NaN or inf (isfinite needs |d| again)
        if bool(special.any()):
            d.masked_fill_(special, 0.0)  # judged apart; here they count as equal pairs
            for idx in _indices(special):
                _torch_special(ec[idx], gc[idx], idx.add_(start), st)
        else:
            special = None
    bins = torch.bincount(torch.bucketize(d, bounds, out_int32=True), minlength=bounds.numel() + 1)
    total = d.sum()  # the work dtype's own accumulation; redone in float64 if it overflows

    # relative error d / max(|e|, tiny)
    r = _abs(ec, st.work)
    if special is not None:
        r.masked_fill_(special, 1.0)  # (a NaN e would make a NaN ratio of their d = 0)
    r.clamp_min_(st.tiny)
    torch.div(d, r, out=r)
    r_max = float(r.max())
    if st.work == torch.float64:
        st.max_rel = max(st.max_rel, r_max)  # already the float64 ratio
    elif r_max > 0 and r_max >= _round_down(st.max_rel, np.float32):
        # float32 rounding is monotonic: the largest exact ratio is among those whose rounding is the
        # largest (and none below the running maximum's rounding can beat it)
        st.max_rel = max(st.max_rel, _torch_rel_exact(d, ec, r == r_max, st.tiny))
    del r
    if st.floor is not None:
        _torch_floored(d, ec, special, st)
    if st.tol is not None:
        st.oot += _torch_outside(d, ec, st)

    ulp = torch.zeros((), dtype=torch.float64, device=d.device)
    if st.floating:
        ulp = _torch_max_ulp(ec, gc, d, _BITS[st.dt])
    if special is not None:
        d.masked_fill_(special, -1.0)  # no special pair holds the max here (the equal ones were seen apart)
    m, i = d.max(0)  # the first occurrence of the max
    s, m_v, i_v, u_v = torch.stack([total.to(torch.float64), m.to(torch.float64), i.to(torch.float64), ulp]).tolist()
    if s == math.inf:
        s = float(d.clamp_min(0).sum(dtype=torch.float64))
    st.sum_abs += s
    if m_v >= 0:
        st.see_max(m_v, start + int(i_v))
    st.max_ulp = max(st.max_ulp, u_v)
    return bins


def _abs(x: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """|x| in the work dtype, a new tensor (x itself may be in the work dtype already)."""
    return x.to(work, copy=True).abs_()


def _indices(mask: torch.Tensor, parts: int = 8) -> Iterator[torch.Tensor]:
    """Positions of the True elements of a 1-D mask, in batches of at most 1/parts of it (so that what
    is computed on them stays a fraction of the chunk's scratch)."""
    k = mask.numel()
    piece = max(1, -(-k // parts))
    count = _count(mask)
    if count == 0:
        return
    if count <= piece:
        yield mask.nonzero().squeeze(1)
        return
    for lo in range(0, k, piece):
        idx = mask[lo : lo + piece].nonzero().squeeze(1)
        if idx.numel():
            yield idx.add_(lo)


def _count(mask: torch.Tensor) -> int:
    """The True elements of a 1-D bool mask. On CPU torch.count_nonzero counts in place (a bool sum would cast
    the mask to int64 first); on CUDA count_nonzero is that sum, 8 bytes of scratch per element, twice a float32
    chunk's d: there the mask is counted in 16 pieces, the counts added on the device and read once."""
    if mask.device.type == "cpu" or mask.numel() <= _TORCH_CHUNK_MIN:
        return int(torch.count_nonzero(mask))
    return _count_in_pieces(mask)


def _count_in_pieces(mask: torch.Tensor, parts: int = 16) -> int:
    pieces = mask.split(max(1, -(-mask.numel() // parts)))
    return int(sum((torch.count_nonzero(p) for p in pieces), torch.zeros((), dtype=torch.int64, device=mask.device)))


def _torch_rel_exact(d: torch.Tensor, ec: torch.Tensor, mask: torch.Tensor, tiny: float) -> float:
    """Max of d / max(|e|, tiny) in float64 over the masked elements (all with d > 0)."""
    best = 0.0
    for idx in _indices(mask):
        rel = d[idx].double() / ec[idx].double().abs_().clamp_min_(tiny)
        best = max(best, float(rel.max()))
    return best


def _torch_floored(d: torch.Tensor, ec: torch.Tensor, special: torch.Tensor | None, st: _Stats) -> None:
    """The floored relative error and ULPs of a chunk (as `_floored_chunk`, one scratch tensor at a
    time): d / max(|e|, F), then d / p2(max(|e|, F)), each max decided in float64 on its candidates."""
    assert st.floor is not None
    scale = 2.0**st.dt.mantissa_bits
    for in_ulps in (False, True):
        a = _abs(ec, st.work)
        if special is not None:
            a.masked_fill_(special, 1.0)  # (their d is 0 here; a NaN e would make a NaN ratio)
        a.clamp_min_(st.floor)
        if in_ulps:
            bits = torch.int64 if st.work == torch.float64 else torch.int32
            a.view(bits).bitwise_and_(_EXP_MASK[st.np_work])  # the power of two at or below
        torch.div(d, a, out=a)
        top = float(a.max())
        # (a quotient by a power of two is exact unless subnormal)
        exact = st.work == torch.float64 or (in_ulps and torch.finfo(st.work).tiny <= top < math.inf)
        # (a top of 0 with some d > 0: every ratio underflowed the work dtype; the float64 ones decide)
        if not exact and (top > 0 or bool((d > 0).any())):
            best = 0.0
            for idx in _indices(a == top):
                e64 = ec[idx].double().abs_().clamp_min_(st.floor)
                if in_ulps:
                    e64 = torch.ldexp(torch.ones_like(e64), torch.frexp(e64).exponent - 1)
                best = max(best, float((d[idx].double() / e64).max()))
            top = best
        del a
        if in_ulps:
            st.ulp_floored = max(st.ulp_floored, top * scale)
        else:
            st.rel_floored = max(st.rel_floored, top)


def _torch_outside(d: torch.Tensor, ec: torch.Tensor, st: _Stats) -> int:
    """How many d > atol + rtol*|e| (evaluated in float64, as numpy's allclose) among the chunk's pairs
    (the special ones have d = 0 here: they are counted apart)."""
    assert st.tol is not None and st.atol_work is not None
    atol, rtol = st.tol
    b = _abs(ec, st.work)
    if st.work == torch.float64:
        b.mul_(rtol).add_(atol)
        return _count(d > b)
    atol_work = float(st.atol_work)  # d > atol_work <=> d > atol
    if rtol == 0:  # atol + 0*|e| == atol (a NaN/Inf e is a special pair, d = 0 here)
        return _count(d > atol_work)
    if max(atol, rtol) >= 2.0**127:  # beyond float32 bounds: every d > atol is a candidate
        return _torch_outside_exact(d, ec, d > atol_work, atol, rtol)
    # bounds of atol + rtol*|e| in float32 with a 2**-16 relative margin (>> the float32 rounding of the
    # two ops): d above the upper one is out, d between the two is decided in float64
    if atol < 2.0**-100:
        # rtol*|e| rounded to a subnormal can err by more than a relative margin: an absolute one
        b.mul_(float(_round_down(rtol * (1 - 2.0**-16), np.float32))).sub_(2.0**-149)
        candidates = d > b
        candidates.logical_and_(d > 0)
        return _torch_outside_exact(d, ec, candidates, atol, rtol)
    b.mul_(float(_round_up(rtol * (1 + 2.0**-16)))).add_(float(_round_up(atol * (1 + 2.0**-16))))
    out = d > b
    n_out = _count(out)
    b.copy_(ec).abs_()
    b.mul_(float(_round_down(rtol * (1 - 2.0**-16), np.float32))).add_(float(_round_down(atol * (1 - 2.0**-16), np.float32)))
    candidates = d > b
    del b
    candidates.logical_and_(out.logical_not_())
    return n_out + _torch_outside_exact(d, ec, candidates, atol, rtol)


def _torch_outside_exact(d: torch.Tensor, ec: torch.Tensor, mask: torch.Tensor, atol: float, rtol: float) -> int:
    n = 0
    for idx in _indices(mask):
        bound = ec[idx].double().abs_().mul_(rtol).add_(atol)
        n += int(torch.count_nonzero(d[idx].double() > bound))
    return n


def _torch_special(es: torch.Tensor, gs: torch.Tensor, pos: torch.Tensor, st: _Stats) -> None:
    """Pairs whose difference is not finite, at flat positions `pos`: NaN/Inf mismatches, equal NaN or
    Inf pairs (difference 0), and finite values whose difference overflows the work dtype (inf)."""
    ew, gw = es.to(st.work), gs.to(st.work)
    en, gn = ew.isnan(), gw.isnan()
    ei, gi = ew.isinf(), gw.isinf()
    same_inf = ei & gi & (ew == gw)
    nan_mis = en ^ gn
    inf_mis = (ei | gi) & ~same_inf & ~(en | gn)
    mis = nan_mis | inf_mis
    over = ~(mis | (en & gn) | same_inf)
    n_nan, n_inf, n_over = (int(torch.count_nonzero(x)) for x in (nan_mis, inf_mis, over))
    n_mis = n_nan + n_inf
    st.nan_mismatch += n_nan
    st.inf_mismatch += n_inf
    if n_mis:
        first = int(pos[mis].min())
        st.first_mismatch = first if st.first_mismatch is None else min(st.first_mismatch, first)
    # a mismatch is an infinite difference, and so is an overflowed one: above every threshold but inf
    st.counts = [c + (n_mis + n_over if t < math.inf else 0) for c, t in zip(st.counts, st.thr, strict=True)]
    if n_over:
        st.see_max(math.inf, int(pos[over].min()))
        st.sum_abs = math.inf
        st.max_rel = math.inf  # inf / max(|e|, tiny), e finite
        if st.floor is not None:
            st.rel_floored = st.ulp_floored = math.inf
        st.max_ulp = max(st.max_ulp, float(_ulp_torch(es[over], gs[over], _BITS[st.dt]).max()))
    elif n_mis < len(pos):
        st.see_max(0.0, int(pos[~mis].min()))  # an equal pair may come before the chunk's max
    if st.tol is not None:
        st.oot += n_mis
        if n_over:
            atol, rtol = st.tol
            bound = ew[over].double().abs_().mul_(rtol).add_(atol)
            st.oot += int(torch.count_nonzero(bound < math.inf))  # inf > bound (a NaN bound, inf*0, is not)


def _torch_max_ulp(ec: torch.Tensor, gc: torch.Tensor, d: torch.Tensor, bits: torch.dtype) -> torch.Tensor:
    """Max ULP distance over the pairs that differ (d > 0), as a float64 0-d tensor.

    For two values of the same sign it is the difference of their bit patterns, which fits their own
    integer type: no widening. Pairs of opposite signs (usually few) are done apart, exactly."""
    be, bg = ec.view(bits), gc.view(bits)
    opposite = torch.bitwise_xor(be, bg) < 0
    differ = d > 0
    dist = be - bg  # (wraps for opposite signs: masked out)
    dist.abs_()
    dist.masked_fill_(differ.logical_not().logical_or_(opposite), 0)
    best = dist.max().to(torch.float64)  # (64-bit distances rounded once)
    del dist
    opposite.logical_and_(differ)
    del differ
    for idx in _indices(opposite, parts=32):
        best = torch.maximum(best, _ulp_torch(ec[idx], gc[idx], bits).max())
    return best


def _ulp_torch(ef: torch.Tensor, gf: torch.Tensor, bits: torch.dtype) -> torch.Tensor:
    """|ordered(e) - ordered(g)| per element, as float64 (exact; 64-bit distances rounded once)."""
    wide = torch.int32 if bits == torch.int16 else torch.int64
    mag = torch.iinfo(bits).max
    e = ef.view(bits).to(wide)
    g = gf.view(bits).to(wide)
    oe = torch.where(e < 0, -(e & mag), e)
    og = torch.where(g < 0, -(g & mag), g)
    if bits != torch.int64:
        return (oe - og).abs_().to(torch.float64)
    hi = (oe >> 11) - (og >> 11)
    lo = (oe & 2047) - (og & 2047)
    return (hi.to(torch.float64) * 2048.0 + lo.to(torch.float64)).abs_()


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat = flat // s if s else 0
    return tuple(reversed(out))
