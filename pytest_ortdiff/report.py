"""Rendering of DiffReports: the terminal block with histogram bars, one-line summaries, the summary
table of a pytest run (text and markdown) and its JSON form for CI jobs to merge."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .formatting import g, index, pct, table, threshold
from .results import CheckRow

__all__ = ["render_report", "render_table", "summary_line", "worst_budget_line"]

_BAR = "█"


def render_report(report: Any, *, width: int = 30) -> str:
    """One block per output: n, maxima with where and the two values, mismatches, histogram with bars."""
    blocks = [_render_leaf(leaf, width) for leaf in report.leaves()]
    if len(blocks) > 1:
        head = f"{len(blocks)} outputs, {report.n:,} elements: max abs {g(report.max_abs)}, max rel {g(report.max_rel)}, max ulp {g(report.max_ulp)}"
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
    """One line: max abs (rel, ulp) at where, and the count above the largest threshold reached."""
    name = f"{report.name}: " if report.name else ""
    text = (
        f"{name}max abs {g(report.max_abs)} (rel {g(report.max_rel)}, {g(report.max_ulp)} ulp) "
        f"at {index(report.argmax)}; {report.mismatches:,}/{report.n:,} differ"
    )
    reached = [t for t in report.thresholds if t > 0 and report.counts.get(t, 0)]
    if reached:
        t = reached[-1]
        text += f", {report.counts[t]:,} > {threshold(t)}"
    if report.nan_mismatch or report.inf_mismatch:
        text += f"; NaN mismatch {report.nan_mismatch:,}, Inf mismatch {report.inf_mismatch:,}"
    return text


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


def render_table(rows: Iterable[CheckRow | Mapping[str, Any]], *, markdown: bool = False) -> str:
    """The run's summary: one row per checked test id (CheckRows, or their dicts: test, provider, dtype,
    max_abs, max_rel, worst, outcome; `report`, the DiffReport's dict, when there is one)."""
    cols = [("test", "test"), ("provider", "provider"), ("dtype", "dtype"), ("max abs", "max_abs"), ("max rel", "max_rel"), ("worst budget line", "worst"), ("result", "outcome")]
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
    errors while max abs says 0); and the ops the evaluator ran on onnxruntime for lack of a kernel."""
    text = _mismatches(row.report) or _cell(row.worst or None)
    if row.ran_on_ort:
        text += f"; ran on onnxruntime (no torch kernel): {', '.join(row.ran_on_ort)}"
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
