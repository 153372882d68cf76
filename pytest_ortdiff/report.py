"""Rendering of DiffReports: the terminal block with histogram bars, one-line summaries, the summary
table of a pytest run (text and markdown) and its JSON form for CI jobs to merge."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["render_report", "render_table", "summary_line", "worst_budget_line"]

_BAR = "█"


def _g(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def _thr(t: float) -> str:
    return "0" if t == 0 else f"{t:g}"


def _pct(c: int, n: int) -> str:
    if not n or not c:
        return "0 %"
    p = 100.0 * c / n
    return f"{p:.2f} %" if p >= 0.01 else f"{p:.1g} %"


def _idx(idx: Sequence[int] | None) -> str:
    return "-" if idx is None else "(" + ", ".join(map(str, idx)) + ")"


def render_report(report: Any, *, width: int = 30) -> str:
    """One block per output: n, maxima with where and the two values, mismatches, histogram with bars."""
    blocks = [_render_leaf(leaf, width) for leaf in report.leaves()]
    if len(blocks) > 1:
        head = f"{len(blocks)} outputs, {report.n:,} elements: max abs {_g(report.max_abs)}, max rel {_g(report.max_rel)}, max ulp {_g(report.max_ulp)}"
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
            f"  max abs   {_g(r.max_abs):<10} over finite pairs; first NaN/Inf mismatch at {_idx(r.argmax)}: "
            f"expected {_g(r.expected_at_max, 8)}, got {_g(r.got_at_max, 8)}"
        )
    else:
        lines.append(
            f"  max abs   {_g(r.max_abs):<10} at {_idx(r.argmax)}: expected {_g(r.expected_at_max, 8)}, got {_g(r.got_at_max, 8)}"
        )
    lines.append(f"  max rel   {_g(r.max_rel)}")
    lines.append(f"  max ulp   {_g(r.max_ulp)}")
    lines.append(f"  mean abs  {_g(r.mean_abs)}")
    lines.append(f"  NaN mismatch {r.nan_mismatch:,}   Inf mismatch {r.inf_mismatch:,}")
    if r.out_of_tolerance is not None and r.tolerance is not None:
        atol, rtol = r.tolerance
        lines.append(f"  outside atol={_g(atol)} rtol={_g(rtol)}: {r.out_of_tolerance:,} ({_pct(r.out_of_tolerance, r.n)})")
    lines.append("  |diff| >   elements   share    ")
    top = max(r.counts.values(), default=0)
    for t in r.thresholds:
        c = r.counts.get(t, 0)
        bar = _BAR * (max(1, round(width * c / top)) if c and top else 0)
        lines.append(f"  {_thr(t):>8}  {c:>10,}  {_pct(c, r.n):>8}  {bar}")
    return "\n".join(lines)


def summary_line(report: Any) -> str:
    """One line: max abs (rel, ulp) at where, and the count above the largest threshold reached."""
    name = f"{report.name}: " if report.name else ""
    text = (
        f"{name}max abs {_g(report.max_abs)} (rel {_g(report.max_rel)}, {_g(report.max_ulp)} ulp) "
        f"at {_idx(report.argmax)}; {report.mismatches:,}/{report.n:,} differ"
    )
    reached = [t for t in report.thresholds if t > 0 and report.counts.get(t, 0)]
    if reached:
        t = reached[-1]
        text += f", {report.counts[t]:,} > {_thr(t)}"
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
        return f"{c:,} > {_thr(float(t))} ({_pct(c, n)}; allows {float(frac) * 100:g} %)"
    reached = [t for t in report.thresholds if report.counts.get(t, 0)]
    if not reached:
        return "exact"
    t = reached[-1]
    return f"{report.counts[t]:,} > {_thr(t)} ({_pct(report.counts[t], n)})"


def render_table(rows: Iterable[Mapping[str, Any]], *, markdown: bool = False) -> str:
    """The run's summary: one row per checked test id (keys: test, provider, dtype, max_abs, max_rel,
    worst, outcome; `report`, the DiffReport's dict, when there is one)."""
    cols = [("test", "test"), ("provider", "provider"), ("dtype", "dtype"), ("max abs", "max_abs"), ("max rel", "max_rel"), ("worst budget line", "worst"), ("result", "outcome")]
    body = [[_cell(_mismatches(row) if key == "worst" else None, row.get(key)) for _, key in cols] for row in rows]
    if markdown:
        out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(out)
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, (h, _) in enumerate(cols)]
    out = ["  ".join(h.ljust(w) for (h, _), w in zip(cols, widths, strict=True)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in body]
    return "\n".join(out)


def _mismatches(row: Mapping[str, Any]) -> str | None:
    """"50 NaN, 0 Inf mismatches" when the row's report has any: the histogram counts them above every
    threshold, so its worst line ("50 > 100") would read as huge finite errors while max abs says 0."""
    report = row.get("report")
    if not isinstance(report, Mapping):
        return None
    nan, inf = int(report.get("nan_mismatch") or 0), int(report.get("inf_mismatch") or 0)
    return f"{nan:,} NaN, {inf:,} Inf mismatches" if nan or inf else None


def _cell(override: str | None, v: Any) -> str:
    if override is not None:
        return override
    if v is None:
        return "-"
    if isinstance(v, float):
        return _g(v)
    return str(v)
