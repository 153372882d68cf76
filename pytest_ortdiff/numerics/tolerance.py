"""Tolerance: atol/rtol (numpy semantics), max ULP and a histogram budget; judges a DiffReport.

Values may be per dtype (`atol={"float16": 0.5, "float32": 1e-4}`); `for_dtype` resolves them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from .dtypes import DType, dtype_of, parse_dtype
from .formatting import g, index, pct, pct_frac, shortest

__all__ = ["Tolerance", "Violation", "floored_ulp", "parse_budget"]

_Number = float | int
_PerDtype = _Number | Mapping[str, _Number] | None


@dataclass(frozen=True)
class Violation:
    """One broken rule, with a sentence a person reads in the failure report."""

    rule: str  # "allclose", "max_ulp", "budget", "nan", "inf", "exact" (integer and bool outputs)
    message: str
    output: str = ""

    def __str__(self) -> str:
        return f"{self.output}: {self.message}" if self.output else self.message


@dataclass(frozen=True)
class Tolerance:
    """What a test accepts.

    - `atol`, `rtol`: numpy's allclose, `|expected - got| <= atol + rtol * |expected|` for every element.
    - `max_ulp`: at most this many units in the last place of the compared dtype, counted at the output's
      scale (`DiffReport.max_ulp_floored`: near zero the raw ULP distance counts ULPs of tiny values).
    - `budget`: `{threshold: fraction}`, e.g. `{1e-2: 0.001, 1.0: 0}` = at most 0.1 % of elements off by
      more than 1e-2 and none by more than 1.
    NaN/Inf mismatches always violate. When none of the four is given, the dtype's default atol/rtol
    apply (see `DType.default_atol`); a test that states any rule gets only the rules it states.
    Integer and bool outputs compare exactly whatever the rules say: they are for floating outputs.
    """

    atol: _PerDtype = None
    rtol: _PerDtype = None
    max_ulp: _PerDtype = None
    budget: Mapping[float, float] | Mapping[str, Mapping[float, float]] | None = None
    dtype: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "max_ulp"):
            _validate_value(name, getattr(self, name))
        if self.budget is not None:
            if not isinstance(self.budget, Mapping):
                raise TypeError(f"budget must be a dict {{threshold: fraction}}, e.g. {{1e-2: 0.001, 1.0: 0}}; got {self.budget!r}")
            if not self.budget:
                # no threshold is no rule: any error would pass (and describe() would call it "defaults")
                raise ValueError(
                    "budget={} states no rule, so any error would pass: give thresholds, e.g. budget={1e-2: 0.001, 1.0: 0}, "
                    "or leave budget out for the dtype's default atol/rtol"
                )
            if _is_per_dtype(self.budget):
                for key, b in self.budget.items():
                    parse_dtype(str(key))
                    if not isinstance(b, Mapping):
                        raise TypeError(f"budget[{key!r}] must be a dict {{threshold: fraction}}, e.g. {{1e-2: 0.001}}; got {b!r}")
                    if not b:
                        raise ValueError(
                            f"budget[{key!r}] is empty, so any {key} error would pass: give thresholds, e.g. {{1e-2: 0.001, 1.0: 0}}, "
                            f"or leave {key} out for its default atol/rtol"
                        )
                    _validate_budget(b)
            else:
                _validate_budget(self.budget)

    # -- resolution --------------------------------------------------------------------------
    @property
    def is_empty(self) -> bool:
        return self.atol is None and self.rtol is None and self.max_ulp is None and self.budget is None

    def for_dtype(self, dtype: Any) -> Tolerance:
        """Concrete numbers for one dtype: per-dtype dicts resolved, defaults filled in (also for a
        dtype that per-dtype dicts leave without any rule). Integer and bool dtypes compare exactly:
        atol = rtol = 0, whatever the rules stated for floats."""
        dt = dtype_of(dtype)
        if not dt.is_floating_point:
            return Tolerance(atol=0.0, rtol=0.0, dtype=dt.short)
        if self.is_empty:
            return Tolerance(atol=dt.default_atol, rtol=dt.default_rtol, dtype=dt.short)
        atol = _pick(self.atol, dt)
        rtol = _pick(self.rtol, dt)
        if (atol is None) != (rtol is None) and (atol is not None or rtol is not None):
            # one of the pair given: the other is 0, as in numpy's allclose with an explicit atol
            atol = 0.0 if atol is None else atol
            rtol = 0.0 if rtol is None else rtol
        budget = self.budget
        if budget is not None and _is_per_dtype(budget):
            budget = _pick(budget, dt)
        max_ulp = _pick(self.max_ulp, dt)
        if atol is None and rtol is None and max_ulp is None and budget is None:
            # per-dtype rules that name other dtypes only: this one keeps its defaults (no rule at
            # all would let any error pass)
            return Tolerance(atol=dt.default_atol, rtol=dt.default_rtol, dtype=dt.short)
        return Tolerance(atol=atol, rtol=rtol, max_ulp=max_ulp, budget=budget, dtype=dt.short)

    @property
    def allclose(self) -> tuple[float, float] | None:
        """(atol, rtol) for `compare(..., tolerance=)`, once resolved for a dtype; None if not used."""
        if self.atol is None and self.rtol is None:
            return None
        if isinstance(self.atol, Mapping) or isinstance(self.rtol, Mapping):
            raise ValueError("per-dtype tolerance: call .for_dtype(dtype) first")
        return (float(self.atol or 0.0), float(self.rtol or 0.0))

    @property
    def thresholds(self) -> tuple[float, ...]:
        """Budget thresholds, to be added to the histogram."""
        if not self.budget or _is_per_dtype(self.budget):
            return ()
        return tuple(float(t) for t in self.budget)

    # -- judging -----------------------------------------------------------------------------
    def check(self, report: Any) -> list[Violation]:
        """The rules `report` breaks (empty list: it passes), one sentence each, per output.

        The allclose rule needs the report to have been computed with `compare(...,
        tolerance=self.allclose)` (or `tolerance=self`); the budget needs its thresholds in the report's
        histogram. An integer or bool output breaks the one rule "exact" when any element differs.
        """
        out: list[Violation] = []
        for leaf in report.leaves():
            kind = _exact_kind(leaf.dtype)
            if kind is not None:
                out.extend(_check_exact_leaf(leaf, kind))
                continue
            tol = self if self.dtype is not None and self.dtype == leaf.dtype else self.for_dtype(leaf.dtype)
            out.extend(tol._check_leaf(leaf))
        return out

    def _check_leaf(self, r: Any) -> list[Violation]:
        out: list[Violation] = []
        name = r.name
        n = r.n
        if r.nan_mismatch:
            out.append(Violation("nan", f"{r.nan_mismatch:,} of {n:,} elements are NaN on one side only", name))
        if r.inf_mismatch:
            out.append(Violation("inf", f"{r.inf_mismatch:,} of {n:,} elements are infinite on one side only (or of opposite sign)", name))
        pair = self.allclose
        if pair is not None:
            if r.tolerance is None or tuple(r.tolerance) != pair:
                raise ValueError(
                    f"this report was computed for tolerance {r.tolerance}, not (atol, rtol)={pair}: "
                    f"call compare(expected, got, tolerance={pair}) so the allclose count is made in the same pass"
                )
            if r.out_of_tolerance:
                atol, rtol = pair
                at = ""
                if r.argmax is not None:
                    at = "; " + _worst_at(r)
                out.append(
                    Violation(
                        "allclose",
                        f"{r.out_of_tolerance:,} of {n:,} elements ({pct(r.out_of_tolerance, n)}) exceed atol={g(atol)} + rtol={g(rtol)}*|expected|{at}",
                        name,
                    )
                )
        limit = self.max_ulp
        if limit is not None and not isinstance(limit, Mapping):
            # the floored ULPs (at the output's scale): near zero the raw distance counts ULPs of a tiny
            # value, thousands of them for an error of 1e-7 that a person calls 4 ULPs
            ulp = floored_ulp(r)
            if ulp > float(limit):
                raw = f" (ULPs at the output's scale; raw {g(r.max_ulp)})" if r.max_ulp != ulp else ""
                out.append(Violation("max_ulp", f"max ULP error {g(ulp)} exceeds max_ulp={g(limit)}{raw}", name))
        if self.budget:
            for t, frac in self._budget_items():
                if t not in r.counts:
                    raise ValueError(f"budget threshold {t:g} is not in the report's histogram; pass thresholds including it to compare()")
                c = r.counts[t]
                # c / n > frac, not c > frac * n: the product can round below c (1/49 * 49 < 1), and a
                # budget equal to the actual share must pass
                if c / n > frac if n else c > 0:
                    out.append(
                        Violation(
                            "budget",
                            f"{c:,} of {n:,} elements ({pct(c, n)}) exceed {g(t)}; budget allows {pct_frac(frac)}",
                            name,
                        )
                    )
        return out

    def describe(self) -> str:
        parts = []
        if self.atol is not None or self.rtol is not None:
            parts.append(f"atol={g(self.atol)} rtol={g(self.rtol)}")
        if self.max_ulp is not None:
            parts.append(f"max_ulp={g(self.max_ulp)}")
        if self.budget:
            parts.append("budget " + ", ".join(f">{g(t)}: {pct_frac(f)}" for t, f in self._budget_items()))
        return "; ".join(parts) or "defaults"

    def _budget_items(self) -> list[tuple[float, float]]:
        """(threshold, fraction) of a budget resolved for one dtype, by threshold."""
        if not self.budget:
            return []
        if _is_per_dtype(self.budget):
            raise ValueError("per-dtype budget: call .for_dtype(dtype) first")
        flat = cast(Mapping[float, float], self.budget)
        return sorted((float(t), float(f)) for t, f in flat.items())

    @classmethod
    def from_marker(cls, kwargs: Mapping[str, Any]) -> Tolerance:
        return cls(**{k: kwargs[k] for k in ("atol", "rtol", "max_ulp", "budget") if k in kwargs})

    def merged(self, other: Tolerance | None) -> Tolerance:
        """`other`'s rules where it states them, ours elsewhere (call-site over marker over ini)."""
        if other is None or other.is_empty:
            return self
        return other


def floored_ulp(report: Any) -> float:
    """The ULP error `max_ulp` judges and the reports show: the report's ULPs at the output's scale
    (`max_ulp_floored`: |e - g| / ulp(max(|e|, F))), its raw `max_ulp` when it has none (a report stored
    before floored errors existed, an integer output)."""
    floored = getattr(report, "max_ulp_floored", None)
    return float(report.max_ulp) if floored is None else float(floored)


def parse_budget(items: Sequence[str]) -> dict[float, float]:
    """`--budget 0.01:0.001 --budget 1:0` (or one comma list) -> {0.01: 0.001, 1.0: 0.0}: the command line's
    budget (`Tolerance(budget=...)` validates the numbers)."""
    budget: dict[float, float] = {}
    for item in (p for it in items for p in it.split(",") if p.strip()):
        t, sep, f = item.partition(":")
        try:
            if not sep:
                raise ValueError
            threshold, share = float(t), float(f)
        except ValueError:
            raise ValueError(
                f"--budget {item!r}: expected THRESHOLD:FRACTION, e.g. --budget 0.01:0.001 (at most 0.1 % of elements off by more than 0.01)"
            ) from None
        if threshold in budget and budget[threshold] != share:  # (the later one would silently replace the earlier)
            raise ValueError(f"--budget {item!r}: the threshold {t.strip()} is given twice, with {budget[threshold]:g} and {share:g}: give it once")
        budget[threshold] = share
    return budget


def _exact_kind(dtype: str) -> str | None:
    """"integer" or "bool" for the dtypes that compare exactly, None for floating (or unnamed) ones."""
    if not dtype or "," in dtype:
        return None
    try:
        dt = dtype_of(dtype)
    except ValueError:
        return None
    if dt.is_floating_point:
        return None
    return "bool" if dt.short == "bool" else "integer"


def _check_exact_leaf(r: Any, kind: str) -> list[Violation]:
    differ = r.counts.get(0.0)
    if differ is None and r.tolerance is not None and tuple(r.tolerance) == (0.0, 0.0):
        differ = r.out_of_tolerance
    if differ == 0 or (differ is None and r.max_abs == 0):
        return []
    count = f"{differ:,} of {r.n:,} elements differ" if differ is not None else f"elements differ (max |diff| {g(r.max_abs)})"
    at = ""
    if r.argmax is not None:
        at = f"; worst at {index(r.argmax)}: expected {_exact_value(r.expected_at_max, r.dtype)}, got {_exact_value(r.got_at_max, r.dtype)}"
    return [Violation("exact", f"{count}; {kind} outputs compare exactly{at}", r.name)]


def _exact_value(x: Any, dtype: str) -> str:
    # an int as it is: a 64-bit value off by one must not print as its float64 neighbour
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else shortest(x, dtype)


def _worst_at(r: Any) -> str:
    """ "worst at (i, j): expected E, got G (|diff| D)", E and G printed in as many digits as tell them
    apart: the element outside the tolerance with the largest |diff|, or — when only NaN/Inf mismatches
    are outside — the first mismatch, shown as such. (Reports stored before `outside_at` existed name
    the max abs element.)"""
    where, e, gv = r.argmax, r.expected_at_max, r.got_at_max
    if getattr(r, "outside_at", None) is not None:
        where, e, gv = r.outside_at, r.expected_at_outside, r.got_at_outside
    if _is_nan_inf_mismatch(e, gv):
        how = "NaN/Inf mismatch"
    else:
        # |e - g| in float64 of the two values: the work dtype's difference where they are this far apart
        how = f"|diff| {g(r.max_abs if where == r.argmax else abs(float(e) - float(gv)))}"
    return f"worst at {index(where)}: expected {shortest(e, r.dtype)}, got {shortest(gv, r.dtype)} ({how})"


def _is_nan_inf_mismatch(e: Any, got: Any) -> bool:
    if e is None or got is None:
        return False
    e, got = float(e), float(got)
    if math.isnan(e) or math.isnan(got):
        return not (math.isnan(e) and math.isnan(got))
    return (math.isinf(e) or math.isinf(got)) and e != got


def _is_per_dtype(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(isinstance(k, str) for k in value)


def _pick(value: Any, dt: DType) -> Any:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if parse_dtype(str(k)) == dt:
                return v
        return None
    return value


def _validate_value(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            try:
                parse_dtype(str(k))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            _validate_value(name, v)
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number or a dict {{dtype: number}}, got {value!r}")


def _validate_budget(budget: Mapping[Any, Any]) -> None:
    for t, frac in budget.items():
        try:
            t = float(t)
            frac = float(frac)
        except (TypeError, ValueError):
            raise ValueError(f"budget must map thresholds to fractions, e.g. {{1e-2: 0.001}}; got {dict(budget)!r}") from None
        if t < 0 or math.isnan(t):
            raise ValueError(f"budget threshold must be >= 0, got {t}")
        if not 0 <= frac <= 1:
            raise ValueError(f"budget fraction for {t:g} must be between 0 and 1 (0.001 = 0.1 %), got {frac}")
