"""Rendering of DiffReports and check rows: the terminal block with histogram bars, one-line summaries,
the summary table of a pytest run (text and markdown), the rows' worst lines and their JUnit properties."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formatting import g, index, pct, table, threshold
from .results import CheckRow, closer_to_oracle
from .tolerance import floored_ulp

__all__ = ["junit_properties", "render_report", "render_table", "summary_line", "worst_budget_line", "worst_line"]

_BAR = "█"


def render_report(report: Any, *, width: int = 30) -> str:
    """One block per output: n, maxima with where and the two values, mismatches, histogram with bars."""
    blocks = [_render_leaf(leaf, width) for leaf in report.leaves()]
    if len(blocks) > 1:
        head = f"{len(blocks)} outputs, {report.n:,} elements: max abs {g(report.max_abs)}, max rel {g(report.max_rel)}, max ulp {g(report.max_ulp)}"
        if report.max_rel_floored is not None and report.max_ulp_floored is not None:
            head += f" (floored: rel {g(report.max_rel_floored)}, ulp {g(report.max_ulp_floored)})"
        blocks.insert(0, head)
    return "\n".join(blocks)


def _is_mismatch(expected: Any, got: Any) -> bool:
    """A NaN/Inf pair that differs under DESIGN.md's semantics (NaN == NaN, +Inf == +Inf)."""
    if not isinstance(expected, float) or not isinstance(got, float):
        return False
    if math.isnan(expected) or math.isnan(got):
        return not (math.isnan(expected) and math.isnan(got))
    return (math.isinf(expected) or math.isinf(got)) and expected != got


def _render_leaf(r: Any, width: int) -> str:
    shape = "x".join(map(str, r.shape)) if r.shape else "scalar"
    title = f"output {r.name!r}" if r.name else "output"
    lines = [f"{title}  {r.dtype}[{shape}]  n={r.n:,}"]
    if _is_mismatch(r.expected_at_max, r.got_at_max):
        # no finite pair differs: point at the first NaN/Inf mismatch rather than at a "max abs 0"
        lines.append(
            f"  max abs   {g(r.max_abs):<10} over finite pairs; first NaN/Inf mismatch at {index(r.argmax)}: "
            f"expected {g(r.expected_at_max, 8)}, got {g(r.got_at_max, 8)}"
        )
    else:
        lines.append(
            f"  max abs   {g(r.max_abs):<10} at {index(r.argmax)}: expected {g(r.expected_at_max, 8)}, got {g(r.got_at_max, 8)}"
        )
    if r.rel_floor is not None and r.max_rel_floored is not None and r.max_ulp_floored is not None:
        # near zero the raw ratios explode (|diff| / tiny): the floored ones read at the output's scale
        lines.append(f"  max rel   {g(r.max_rel):<10} floored {g(r.max_rel_floored):<9} (|expected| floored at {g(r.rel_floor)}, its RMS as a power of two)")
        lines.append(f"  max ulp   {g(r.max_ulp):<10} floored {g(r.max_ulp_floored)}")
    else:
        lines.append(f"  max rel   {g(r.max_rel)}")
        lines.append(f"  max ulp   {g(r.max_ulp)}")
    lines.append(f"  mean abs  {g(r.mean_abs)}")
    lines.append(f"  NaN mismatch {r.nan_mismatch:,}   Inf mismatch {r.inf_mismatch:,}")
    if r.out_of_tolerance is not None and r.tolerance is not None:
        atol, rtol = r.tolerance
        lines.append(f"  outside atol={g(atol)} rtol={g(rtol)}: {r.out_of_tolerance:,} ({pct(r.out_of_tolerance, r.n)})")
    lines.append("  |diff| >   elements   share    ")
    top = max(r.counts.values(), default=0)
    for t in r.thresholds:
        c = r.counts.get(t, 0)
        bar = _BAR * (max(1, round(width * c / top)) if c and top else 0)
        lines.append(f"  {threshold(t):>8}  {c:>10,}  {pct(c, r.n):>8}  {bar}")
    return "\n".join(lines)


def summary_line(report: Any) -> str:
    """One line: max abs with where it is and the relative and ULP error of that same element; then the
    largest relative and ULP errors over all elements (usually elsewhere: near zero) with their floored
    values; how many elements differ and the count above the largest threshold reached."""
    name = f"{report.name}: " if report.name else ""
    # several outputs: the one holding the max abs error, by name (an aggregate's argmax is the output
    # with a NaN/Inf mismatch, when one has any)
    holder = max(report.outputs, key=lambda r: r.max_abs) if report.outputs else report
    where = f"{holder.name or 'output'} {index(holder.argmax)}" if report.outputs else index(report.argmax)
    rel_at, ulp_at = holder.rel_at_max, holder.ulp_at_max
    if report.max_abs > 0 and rel_at is not None and ulp_at is not None:
        text = f"{name}max abs {g(report.max_abs)} at {where} (there: rel {g(rel_at)}, {g(ulp_at)} ulp)"
    else:  # every finite pair equal (a NaN/Inf mismatch, if any, is named at the end)
        text = f"{name}max abs {g(report.max_abs)}"
    if report.max_rel or report.max_ulp:
        text += f"; max rel {g(report.max_rel)}{_floored(report.max_rel_floored)}, max ulp {g(report.max_ulp)}{_floored(report.max_ulp_floored)}"
    text += f"; {report.mismatches:,}/{report.n:,} differ"
    reached = [t for t in report.thresholds if t > 0 and report.counts.get(t, 0)]
    if reached:
        t = reached[-1]
        text += f", {report.counts[t]:,} > {threshold(t)}"
    if report.nan_mismatch or report.inf_mismatch:
        text += f"; NaN mismatch {report.nan_mismatch:,}, Inf mismatch {report.inf_mismatch:,}"
    return text


def _floored(value: float | None) -> str:
    return f" (floored {g(value)})" if value is not None else ""


def worst_budget_line(report: Any, budget: Mapping[float, float] | None) -> str:
    """The histogram line a reader should look at: the budget line closest to (or past) its allowance,
    else the largest threshold that any element exceeds."""
    n = report.n
    if budget:
        def used(item: tuple[float, float]) -> float:
            t, frac = item
            c = report.counts.get(float(t), 0)
            allowed = float(frac) * n
            return math.inf if c and allowed == 0 else (c / allowed if allowed else 0.0)

        t, frac = max(sorted(budget.items()), key=used)
        c = report.counts.get(float(t), 0)
        return f"{c:,} > {threshold(float(t))} ({pct(c, n)}; allows {float(frac) * 100:g} %)"
    reached = [t for t in report.thresholds if report.counts.get(t, 0)]
    if not reached:
        return "exact"
    t = reached[-1]
    return f"{report.counts[t]:,} > {threshold(t)} ({pct(report.counts[t], n)})"


def worst_line(report: Any, tolerance: Any) -> str:
    """A summary row's "worst budget line": where `report` stands against each rule of `tolerance` (a
    Tolerance resolved for the dtype) — the budget line closest to its allowance, the count outside
    atol/rtol ("N of M differ" when both are 0: bitwise), the max ULP against its limit; "exact" when no
    element differs and no budget is set, "-" when it states no rule. Never a budget the test did not set."""
    if tolerance.budget:
        parts = [worst_budget_line(report, tolerance.budget)]
    elif not report.mismatches and not tolerance.is_empty:
        return "exact"
    else:
        parts = []
    if tolerance.atol is not None or tolerance.rtol is not None:
        parts.append(_allclose_line(report, float(tolerance.atol or 0.0), float(tolerance.rtol or 0.0)))
    if tolerance.max_ulp is not None:  # (the ULPs max_ulp judges: at the output's scale)
        parts.append(f"max {g(floored_ulp(report))} ulp (allows {g(tolerance.max_ulp)})")
    return "; ".join(parts) or "-"


def _allclose_line(report: Any, atol: float, rtol: float) -> str:
    n = report.n
    if atol == 0 and rtol == 0:
        differ = report.mismatches
        return "exact" if not differ else f"{differ:,} of {n:,} differ ({pct(differ, n)})"
    if report.out_of_tolerance is None:  # a report computed without the tolerance: no count to show
        return f"atol={g(atol)} rtol={g(rtol)}"
    oot = report.out_of_tolerance
    return f"{oot:,} outside atol={g(atol)} rtol={g(rtol)} ({pct(oot, n)})"


def render_table(rows: Iterable[CheckRow | Mapping[str, Any]], *, markdown: bool = False) -> str:
    """The run's summary: one row per checked test id (CheckRows, or their dicts: test, provider, dtype,
    max_abs, max_rel, worst, outcome; `report`, the DiffReport's dict, when there is one). "max ulp" is the
    ULP error at the output's scale (`CheckRow.ulp`); the raw distance stays in the report and the JSON."""
    cols = [("test", "test"), ("provider", "provider"), ("dtype", "dtype"), ("max abs", "max_abs"), ("max rel", "max_rel"), ("max ulp", "ulp"), ("worst budget line", "worst"), ("result", "outcome")]
    typed = [row if isinstance(row, CheckRow) else CheckRow.from_dict(row) for row in rows]
    body = [[_worst(row) if key == "worst" else _cell(getattr(row, key)) for _, key in cols] for row in typed]
    if markdown:
        out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(out)
    return "\n".join(table([h for h, _ in cols], body))


def _worst(row: CheckRow) -> str:
    """The row's worst budget line; "50 NaN, 0 Inf mismatches" instead when its report has any (the
    histogram counts them above every threshold, so its worst line ("50 > 100") would read as huge finite
    errors while max abs says 0); and the ops the evaluator ran on onnxruntime for lack of a kernel, and the
    gate's notes."""
    text = _mismatches(row.report) or _cell(row.worst or None)
    if row.ran_on_ort:
        text += f"; ran on onnxruntime (no torch kernel): {', '.join(row.ran_on_ort)}"
    for note in row.notes:
        text += f"; {note}"
    return text


def _mismatches(report: Mapping[str, Any] | None) -> str | None:
    if not isinstance(report, Mapping):
        return None
    nan, inf = int(report.get("nan_mismatch") or 0), int(report.get("inf_mismatch") or 0)
    return f"{nan:,} NaN, {inf:,} Inf mismatches" if nan or inf else None


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return g(v)
    return str(v)


# ------------------------------------------------------------------------------------------------
# JUnit properties

#: the row's fields a JUnit property carries, by property name
_JUNIT_FIELDS = ("provider", "dtype", "max_abs", "max_rel", "max_rel_floored", "max_ulp", "max_ulp_floored", "worst", "tolerance", "result")
_JUNIT_BLAME = ("blame_top", "culprit")


def junit_properties(rows: Sequence[CheckRow]) -> list[tuple[str, str]]:
    """The check rows of one test as flat (name, value) properties, as `record_property` makes them, so
    that `--junitxml` carries them into a CI system's test view: `ortdiff.provider`, `ortdiff.dtype`,
    `ortdiff.max_abs`, `ortdiff.max_rel` (and `.max_rel_floored`), `ortdiff.max_ulp` (and
    `.max_ulp_floored`), `ortdiff.worst`, `ortdiff.tolerance`, `ortdiff.result` ("passed"/"failed"); a
    row with a suffix gets its own names (" [ort vs float64]": `ortdiff.ort_vs_float64.max_abs`). With
    both rows against the float64 oracle: `ortdiff.closer_to_oracle` ("onnxruntime", "torch" or "tie").
    A row carrying a blame table (`--ortdiff-blame`): `ortdiff.blame_top` (its first row: "node (Op) 87 %",
    `~` before an estimate) and, where a node explains 10 % of the gap, `ortdiff.culprit`.
    Numbers in 6 significant digits; fields without a value are left out."""
    out: list[tuple[str, str]] = []
    against: dict[str, _AgainstOracle] = {}
    for row in rows:
        prefix = _junit_prefix(row.suffix)
        report = row.report if isinstance(row.report, Mapping) else {}
        values: dict[str, Any] = {
            "provider": row.provider,
            "dtype": row.dtype,
            "max_abs": row.max_abs,
            "max_rel": row.max_rel,
            "max_rel_floored": report.get("max_rel_floored"),
            "max_ulp": row.max_ulp,
            "max_ulp_floored": report.get("max_ulp_floored"),
            "worst": row.worst or None,
            "tolerance": row.tolerance,
            "result": None if row.passed is None else ("passed" if row.passed else "failed"),
        }
        out += [(f"{prefix}.{key}", _junit_value(values[key])) for key in _JUNIT_FIELDS if values[key] is not None]
        top = row.blame_top
        if top is not None:
            out.append((f"{prefix}.blame_top", top))
            if row.blame is not None and row.blame.get("culprit"):
                out.append((f"{prefix}.culprit", str(row.blame["culprit"])))
        if row.suffix.strip() in ("[ort vs float64]", "[torch vs float64]") and row.max_ulp is not None:
            differ = report.get("differ")
            if not isinstance(differ, int):
                differ = int((report.get("counts") or {}).get(repr(0.0), 0))
            against[row.suffix.strip()] = _AgainstOracle(float(row.ulp if row.ulp is not None else row.max_ulp), differ)
    if len(against) == 2:
        out.append(("ortdiff.closer_to_oracle", closer_to_oracle(against["[ort vs float64]"], against["[torch vs float64]"])))
    return out


def junit_names(row: CheckRow) -> set[str]:
    """Every property name `junit_properties` may give `row` (whichever have a value): what a row that
    replaces it in a test's properties replaces."""
    prefix = _junit_prefix(row.suffix)
    return {f"{prefix}.{key}" for key in (*_JUNIT_FIELDS, *_JUNIT_BLAME)}


def _junit_prefix(suffix: str) -> str:
    """"ortdiff" for a test's main check, "ortdiff.<suffix as a name>" for the others (" [baseline out]":
    "ortdiff.baseline_out")."""
    name = re.sub(r"\W+", "_", suffix.strip().strip("[]")).strip("_")
    return f"ortdiff.{name}" if name else "ortdiff"


@dataclass(frozen=True)
class _AgainstOracle:
    max_ulp: float
    mismatches: int


def _junit_value(v: Any) -> str:
    if isinstance(v, float):
        return str(v) if math.isnan(v) or math.isinf(v) else f"{v:.6g}"
    return str(v)
