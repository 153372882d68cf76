"""The self-contained HTML report of one or more runs: the jobs, the provider × dtype matrix as a heat map,
and per check its histogram as an inline SVG chart with the tolerance drawn on it, blame, oracle, baseline."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from ..numerics.formatting import g, index, pct, pct_frac, threshold
from ..numerics.results import (
    BaselineRow,
    CheckRow,
    ResultsFile,
    SkipRow,
    closer_to_oracle,
    write_atomically,
)
from .matrix import Cell, Job, Matrix, pivot, ran_environment

__all__ = ["GENERATOR", "render", "write_html"]

#: in the head of every page this package writes: how --ortdiff-html knows a file it may write over
GENERATOR = '<meta name="generator" content="pytest-ortdiff">'

_ORT_VS_ORACLE = " [ort vs float64]"
_TORCH_VS_ORACLE = " [torch vs float64]"
_BASELINE = re.compile(r" \[baseline (?P<name>.*)\]$")
#: "budget >0.01: 0.10 %, >1: 0 %" in Tolerance.describe(): the only place a row states its budget
_BUDGET = re.compile(r">(?P<t>[0-9.e+-]+|inf): (?P<p>[0-9.e+-]+) %")
#: blame rows and module scopes shown per check (the terminal's BlameTable.TOP, and its scope count)
_BLAME_TOP = 15
_SCOPES_TOP = 10
#: a conflict cell's parts, in a word each
_WORDS = {"passed": "ok", "skipped": "skip", "failed": "FAIL", "error": "ERROR"}


def render(files: Sequence[ResultsFile], labels: Sequence[str] | None = None) -> str:
    """The whole HTML document for `files` (one per CI job, or the one of this run), each job named by
    `labels` (default: the matrix's job labels). No network, no script needed to read it."""
    matrix = pivot(files, labels)
    names = [job.label for job in matrix.jobs]
    # with one job, every check's line would repeat its label
    checks = _checks(files, names if len(names) > 1 else [""] * len(names))
    anchors = {id(c.row): c.anchor for c in checks}
    out: list[str] = [_HEAD]
    out.append(_overview(files, checks, matrix))
    out.append(_jobs(matrix))
    out.append(_heatmap(matrix, anchors))
    out.append(_unchecked_failures(files, names))
    out.append(_holes([s for f in files for s in f.skips]))
    out.append(_baselines(files, names))
    out.append(_check_sections(checks))
    out.append(_TAIL)
    return "".join(out)


def write_html(
    path: Path, files: Sequence[ResultsFile], labels: Sequence[str] | None = None
) -> None:
    """`render(files, labels)` written to `path` atomically (a reader sees the old file or the new one)."""
    write_atomically(Path(path), render(files, labels))


# ------------------------------------------------------------------------------------------------
# the checks: one section each, in an order a reader wants (failures first)


@dataclass(frozen=True)
class _Check:
    row: CheckRow
    job: str
    anchor: str
    #: the other side of an oracle pair (ort vs float64 <-> torch vs float64), when the run has it
    partner: CheckRow | None
    baseline: BaselineRow | None


def _checks(files: Sequence[ResultsFile], names: Sequence[str]) -> list[_Check]:
    found: list[tuple[int, int, CheckRow, str, CheckRow | None, BaselineRow | None]] = []
    for f, name in zip(files, names, strict=False):
        by_test = {r.test: r for r in f.results}
        baselines = {(b.test, b.name): b for b in f.baselines}
        for r in f.results:
            partner = None
            if r.test.endswith(_ORT_VS_ORACLE):
                partner = by_test.get(r.test.removesuffix(_ORT_VS_ORACLE) + _TORCH_VS_ORACLE)
            elif r.test.endswith(_TORCH_VS_ORACLE):
                partner = by_test.get(r.test.removesuffix(_TORCH_VS_ORACLE) + _ORT_VS_ORACLE)
            m = _BASELINE.search(r.test)
            base = baselines.get((r.test[: m.start()], m.group("name"))) if m else None
            found.append((0 if not r.ok else 1, len(found), r, name, partner, base))
    found.sort(key=lambda x: (x[0], x[1]))
    return [
        _Check(r, job, f"c{i}", partner, base)
        for i, (_, _, r, job, partner, base) in enumerate(found)
    ]


def _check_sections(checks: Sequence[_Check]) -> str:
    if not checks:
        return '<section><h2>Checks</h2><p class="muted">No check ran.</p></section>'
    failing = sum(not c.row.ok for c in checks)
    out = [
        f'<section id="checks"><h2>Checks <span class="muted">({len(checks):,}; failures first, open)</span></h2>'
    ]
    if failing:
        out.append(
            f"<p>{failing:,} check(s) broke their tolerance; the passing ones are collapsed (click a line to open it).</p>"
        )
    out.extend(_check_section(c) for c in checks)
    out.append("</section>")
    return "".join(out)


def _check_section(c: _Check) -> str:
    r = c.row
    rep = r.report if isinstance(r.report, Mapping) else None
    verdict = r.outcome or ("passed" if r.passed else "failed")
    head = (
        f'<details class="check {_cls(verdict)}" id="{c.anchor}"{"" if r.ok else " open"}><summary>'
        f'<span class="badge {_cls(verdict)}">{_e(verdict)}</span> <code>{_e(r.test)}</code> '
        f'<span class="muted">{_e(" · ".join(x for x in (r.provider or "-", r.dtype or "-", c.job) if x))}</span> '
        f'<span class="nums">max abs {_e(g(r.max_abs))} · max ulp {_e(g(r.ulp))}</span></summary><div class="body">'
    )
    parts = [head]
    if rep is not None:
        budget, counts = _budget(r.tolerance), _counts(rep)
        parts.append(_histogram_svg(rep, counts, budget))
        parts.append(_numbers(r, rep, counts, budget))
    else:
        parts.append(f'<p class="muted">No comparison: {_e(r.worst or "nothing was compared")}</p>')
    if c.partner is not None:
        parts.append(_oracle(r, c.partner))
    # a BlameTable.to_dict() when the row carries one (a `blame` field, filled by a check run with blame=True)
    blame = getattr(r, "blame", None)
    if isinstance(blame, Mapping):
        parts.append(_blame(blame))
    if c.baseline is not None:
        parts.append(_baseline_detail(c.baseline))
    parts.append("</div></details>")
    return "".join(parts)


def _numbers(
    r: CheckRow,
    rep: Mapping[str, Any],
    histogram: Sequence[tuple[float, int]],
    budget: Sequence[tuple[float, float]],
) -> str:
    n = _int(rep.get("n"))
    where, expected, got = (
        index(rep.get("argmax")),
        _num(rep.get("expected_at_max")),
        _num(rep.get("got_at_max")),
    )
    at = f"at {where}: expected {g(expected, 8)}, got {g(got, 8)}"
    if _is_mismatch(
        expected, got
    ):  # as the terminal report says it: no finite pair is that far off
        at = f"over finite pairs; first NaN/Inf mismatch {at}"
    items = [
        ("max abs", f"{g(_num(rep.get('max_abs')))} {at}"),
        ("max rel", g(_num(rep.get("max_rel")))),
        ("max ulp", _ulp_item(rep)),
        ("mean abs", g(_num(rep.get("mean_abs")))),
        ("elements", f"{n:,} ({_dtype_shape(rep)}); {_differ(rep):,} differ"),
        (
            "NaN / Inf mismatches",
            f"{_int(rep.get('nan_mismatch')):,} / {_int(rep.get('inf_mismatch')):,}",
        ),
        *(
            [("note", "NaN/Inf mismatches count above every threshold of the chart")]
            if _mismatched(rep)
            else []
        ),
        ("tolerance", r.tolerance or "-"),
        ("worst budget line", r.worst or "-"),
    ]
    tol = _pair(rep.get("tolerance"))
    if tol is not None and rep.get("out_of_tolerance") is not None:
        out = _int(rep.get("out_of_tolerance"))
        items.append(
            (
                "outside atol + rtol·|expected|",
                f"{out:,} ({pct(out, n)}) for atol={g(tol[0])} rtol={g(tol[1])}",
            )
        )
    counts = dict(histogram)
    for t, frac in _on_axis(budget, list(counts)).items():
        c = counts[t]
        items.append(
            (f"budget > {threshold(t)}", f"{c:,} ({pct(c, n)}) of at most {pct_frac(frac)}")
        )
    if r.ran_on_ort:
        items.append(("ran on onnxruntime (no torch kernel)", ", ".join(r.ran_on_ort)))
    items.extend(("note", n) for n in r.notes)
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items)
    outputs = rep.get("outputs")
    extra = ""
    if isinstance(outputs, list) and outputs:
        head = "<tr><th>output</th><th>dtype[shape]</th><th>max abs</th><th>max ulp</th><th>differ</th><th>NaN/Inf</th></tr>"
        cells = "".join(
            f"<tr><td><code>{_e(str(o.get('name', '')))}</code></td><td>{_e(_dtype_shape(o))}</td>"
            f"<td>{_e(g(_num(o.get('max_abs'))))}</td><td>{_e(_ulp_item(o))}</td><td>{_differ(o):,}</td>"
            f"<td>{_int(o.get('nan_mismatch'))}/{_int(o.get('inf_mismatch'))}</td></tr>"
            for o in outputs
            if isinstance(o, Mapping)
        )
        extra = f'<table class="small">{head}{cells}</table>'
    return f'<dl class="nums">{body}</dl>{extra}'


def _ulp_item(rep: Mapping[str, Any]) -> str:
    """"4 at the output's scale (raw 4.69e+03)": the floored ULPs a person means, with the raw distance."""
    raw, floored = _num(rep.get("max_ulp")), _num(rep.get("max_ulp_floored"))
    if floored is None or floored == raw:
        return g(raw)
    return f"{g(floored)} at the output's scale (raw {g(raw)})"


# ------------------------------------------------------------------------------------------------
# the histogram chart

_W, _H = 440, 190
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 8, 22, 38


_PW, _PH = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
_BASE = _TOP + _PH


def _histogram_svg(
    rep: Mapping[str, Any],
    counts: Sequence[tuple[float, int]],
    budget: Sequence[tuple[float, float]],
) -> str:
    """Bars: elements whose |diff| exceeds each threshold (thresholds on a log axis, one slot per decade
    as the histogram has them; none where no element exceeds it), counts on a log axis; the budget's
    allowances as red caps over their bars (a bar past its cap is red), atol as a dashed vertical line at
    its place on the threshold axis."""
    n = max(_int(rep.get("n")), max((c for _, c in counts), default=0), 1)
    ts = tuple(t for t, _ in counts)
    slot = _PW / max(len(ts), 1)
    top_log = math.log10(1 + n)

    def y(count: float) -> float:
        return _BASE - _PH * math.log10(1 + max(count, 0.0)) / top_log

    allow = _on_axis(budget, ts)
    out = [_frame(ts, n)]
    for i, (t, c) in enumerate(counts):
        x = _LEFT + i * slot
        cap = allow.get(t)
        if c:  # no bar at all for none: a page of passing checks is mostly empty thresholds
            yy = y(c)
            over = " over" if cap is not None and c > cap * n else ""
            out.append(
                f'<rect class="bar{over}" x="{x + slot * 0.15:.1f}" y="{yy:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{_BASE - yy:.1f}"><title>{c:,} elements ({pct(c, n)}) with |diff| &gt; {threshold(t)}</title></rect>'
                f'<text class="cnt" x="{x + slot / 2:.1f}" y="{yy - 3:.1f}">{_short(c)}</text>'
            )
        if cap is not None:
            ya = y(cap * n)
            out.append(
                f'<line class="cap" x1="{x + 1:.1f}" x2="{x + slot - 1:.1f}" y1="{ya:.1f}" y2="{ya:.1f}">'
                f"<title>budget: at most {pct_frac(cap)} ({cap * n:,.0f} elements) above {threshold(t)}</title></line>"
            )
    tol = _pair(rep.get("tolerance"))
    if tol is not None and ts:
        xa = _x_of(tol[0], ts, slot)
        out.append(
            f'<line class="atol" x1="{xa:.1f}" x2="{xa:.1f}" y1="{_TOP - 8}" y2="{_BASE}"/>'
            f'<text class="tl" x="{xa + 3:.1f}" y="{_TOP - 2}">atol {g(tol[0])}</text>'
        )
    out.append("</svg>")
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _frame(ts: tuple[float, ...], n: int) -> str:
    """The chart's opening tag, grid and axes for thresholds `ts` and `n` elements: the same for most checks
    of a run, so built once."""
    slot = _PW / max(len(ts), 1)
    top_log = math.log10(1 + n)
    out = [
        f'<svg class="hist" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" aria-label="histogram of |diff|">'
    ]
    # y grid: powers of ten up to n, at most 6 lines
    decades = int(math.log10(n)) if n >= 1 else 0
    for d in range(0, decades + 1, max(1, math.ceil((decades + 1) / 6))):
        yy = _BASE - _PH * math.log10(1 + 10**d) / top_log
        out.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}"/>'
            f'<text class="yl" x="{_LEFT - 4}" y="{yy + 3:.1f}">{_power(d)}</text>'
        )
    out.extend(
        f'<text class="xl" x="{_LEFT + (i + 0.5) * slot:.1f}" y="{_BASE + 12:.1f}">{threshold(t)}</text>'
        for i, t in enumerate(ts)
    )
    out.append(
        f'<line class="axis" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_BASE}" y2="{_BASE}"/>'
        f'<text class="xt" x="{_LEFT + _PW / 2:.0f}" y="{_H - 6}">elements with |diff| &gt; threshold (log scales)</text>'
    )
    return "".join(out)


def _on_axis(budget: Sequence[tuple[float, float]], ts: Sequence[float]) -> dict[float, float]:
    """The budget keyed by the histogram's own thresholds: the tolerance text rounds a threshold to three
    digits (Tolerance.describe), the histogram keeps it exact."""
    out = {}
    for t, frac in budget:
        near = min(ts, key=lambda x: abs(x - t), default=None)
        if near is not None and abs(near - t) <= 5e-3 * max(abs(t), 1e-300):
            out[near] = frac
    return out


def _x_of(value: float, ts: Sequence[float], slot: float) -> float:
    """Where `value` falls on the threshold axis: slot centres at the thresholds, log-interpolated between
    them (0, the first slot, counts as a decade below the first positive threshold)."""
    pos = [t for t in ts if t > 0]
    stand_in = (pos[0] / 10) if pos else 1e-7
    logs = [math.log10(t if t > 0 else stand_in) for t in ts]
    v = math.log10(value) if value > 0 else logs[0]
    centre = [_LEFT + (i + 0.5) * slot for i in range(len(ts))]
    if v <= logs[0]:
        return centre[0]
    for i in range(1, len(ts)):
        if v <= logs[i]:
            span = logs[i] - logs[i - 1] or 1.0
            return centre[i - 1] + (centre[i] - centre[i - 1]) * (v - logs[i - 1]) / span
    return centre[-1]


def _counts(rep: Mapping[str, Any]) -> list[tuple[float, int]]:
    raw = rep.get("counts")
    if not isinstance(raw, Mapping):
        return []
    out = []
    for key, value in raw.items():
        try:
            out.append((float(key), int(value)))
        except (TypeError, ValueError):
            continue
    return sorted(out)


def _count(rep: Mapping[str, Any], t: float) -> int:
    return next((c for tt, c in _counts(rep) if tt == t), 0)


def _budget(tolerance: str | None) -> list[tuple[float, float]]:
    """(threshold, allowed fraction) from the row's tolerance text ("...; budget >0.01: 0.10 %, >1: 0 %")."""
    if not tolerance or "budget" not in tolerance:
        return []
    part = tolerance[tolerance.index("budget") :]
    out = []
    for m in _BUDGET.finditer(part):
        try:
            out.append((float(m.group("t")), float(m.group("p")) / 100))
        except ValueError:
            continue
    return out


# ------------------------------------------------------------------------------------------------
# oracle, blame, baselines


_WHO = {"onnxruntime": "onnxruntime", "torch": "the torch evaluator", "tie": "neither (a tie)"}


def _oracle(row: CheckRow, partner: CheckRow) -> str:
    ort, torch = (row, partner) if row.test.endswith(_ORT_VS_ORACLE) else (partner, row)
    a, b = _Against.of(ort), _Against.of(torch)
    if a is None or b is None:
        return ""
    who = _WHO[closer_to_oracle(a, b)]
    return (
        f'<p class="oracle"><b>Closer to the float64 oracle: {who}</b> '
        f"(onnxruntime: max {g(a.max_ulp)} ulp, {a.mismatches:,} elements off; "
        f"torch evaluator: max {g(b.max_ulp)} ulp, {b.mismatches:,} elements off)</p>"
    )


def _closer_in(rows: Sequence[CheckRow]) -> str | None:
    """The oracle's verdict of a heat-map cell whose rows hold one oracle pair (one job's, or jobs that agree)."""
    ort = [r for r in rows if r.test.endswith(_ORT_VS_ORACLE)]
    torch = [r for r in rows if r.test.endswith(_TORCH_VS_ORACLE)]
    if len(ort) != 1 or len(torch) != 1:
        return None
    a, b = _Against.of(ort[0]), _Against.of(torch[0])
    return _WHO[closer_to_oracle(a, b)] if a is not None and b is not None else None


@dataclass(frozen=True)
class _Against:
    max_ulp: float
    mismatches: int

    @classmethod
    def of(cls, row: CheckRow) -> _Against | None:
        rep = row.report if isinstance(row.report, Mapping) else None
        if rep is None:
            return None
        ulp = _num(rep.get("max_ulp_floored"))  # (at the output's scale, as the verdict; a file without it: raw)
        if ulp is None:
            ulp = _num(rep.get("max_ulp"))
        return cls(ulp if ulp is not None else math.inf, _differ(rep))


def _blame(b: Mapping[str, Any]) -> str:
    """A BlameTable's to_dict(): its top nodes, the summary per module scope, culprit and oracle."""
    rows = [r for r in b.get("rows") or [] if isinstance(r, Mapping)]
    out = ['<div class="blame"><h4>Blame: each node swapped to onnxruntime in turn</h4>']
    if rows:
        out.append(
            '<table class="small"><tr><th>node</th><th>op</th><th>explained</th><th>local abs</th>'
            "<th>local ulp</th><th>drift abs</th><th>vs f64 ulp</th></tr>"
        )
        for r in rows[:_BLAME_TOP]:
            share = max(0.0, min(1.0, _num(r.get("explained")) or 0.0))
            mark = "" if r.get("exact", True) else "~"
            out.append(
                f"<tr><td><code>{_e(str(r.get('node', '')))}</code></td><td>{_e(str(r.get('op_type', '')))}</td>"
                f'<td><span class="share"><span style="width:{share * 100:.0f}%"></span></span> {mark}{share * 100:.0f} %</td>'
                f"<td>{_e(g(_num(r.get('local_max_abs'))))}</td><td>{_e(g(_num(r.get('local_max_ulp'))))}</td>"
                f"<td>{_e(g(_num(r.get('drift_max_abs'))))}</td><td>{_e(g(_num(r.get('oracle_max_ulp'))))}</td></tr>"
            )
        out.append("</table>")
        nodes = max(len(rows), _int(b.get("nodes")))  # (a stored table keeps its top rows only)
        if nodes > _BLAME_TOP:
            out.append(f'<p class="muted">... {nodes - _BLAME_TOP:,} more nodes</p>')
    scopes = [
        s
        for s in b.get("by_scope") or []
        if isinstance(s, Mapping) and (_num(s.get("explained")) or 0) > 0
    ]
    if scopes:
        out.append("<p><b>By module scope</b> (its nodes' explained summed):</p><ul>")
        out.extend(
            f"<li><code>{_e(str(s.get('scope', '')))}</code>: {(_num(s.get('explained')) or 0) * 100:.0f} % of the gap "
            f"({_int(s.get('nodes'))} node{'' if _int(s.get('nodes')) == 1 else 's'}; most: <code>{_e(str(s.get('top_node', '')))}</code> {(_num(s.get('top_explained')) or 0) * 100:.0f} %)</li>"
            for s in scopes[:_SCOPES_TOP]
        )
        out.append("</ul>")
    facts = [
        ("most to blame", b.get("culprit")),
        ("first node whose output drifts beyond the tolerance", b.get("first_divergence")),
        ("closer to the float64 oracle", b.get("closer_to_oracle")),
    ]
    out.extend(f"<p>{k}: <code>{_e(str(v))}</code></p>" for k, v in facts if v)
    out.extend(f'<p class="muted">note: {_e(str(n))}</p>' for n in b.get("notes") or [])
    out.append("</div>")
    return "".join(out)


def _baseline_detail(b: BaselineRow) -> str:
    head = f'<div class="baseline"><p><b>Baseline {_e(b.name)}</b>: {_e(b.action)}'
    if b.max_abs is not None:
        head += f", max abs drift {_e(g(b.max_abs))}"
    head += f' <span class="muted">({_e(b.path)})</span></p>'
    return head + _env_table(b) + "</div>"


def _env_table(b: BaselineRow) -> str:
    if b.env_changes:
        body = "".join(
            f"<tr><td>{_e(k)}</td><td>{_e(a)}</td><td>{_e(n)}</td></tr>"
            for k, a, n in b.env_changes
        )
        return f'<table class="small"><tr><th>environment</th><th>at the baseline</th><th>now</th></tr>{body}</table>'
    if b.max_abs is not None:  # outputs were compared, so the environments were too
        return '<p class="muted">environment unchanged since the baseline was written</p>'
    return ""


def _baselines(files: Sequence[ResultsFile], names: Sequence[str]) -> str:
    rows = [(b, name) for f, name in zip(files, names, strict=False) for b in f.baselines]
    if not rows:
        return ""
    head = "<tr><th>test</th><th>baseline</th><th>action</th><th>max abs drift</th><th>environment changes</th><th>job</th></tr>"
    body = []
    for b, name in rows:
        env = "; ".join(f"{k}: {a} → {n}" for k, a, n in b.env_changes) or (
            "unchanged" if b.max_abs is not None else "-"
        )
        verdict = "passed" if b.passed else "failed"
        body.append(
            f'<tr><td><code>{_e(b.test or "-")}</code></td><td>{_e(b.name)}</td><td><span class="badge {verdict}">{_e(b.action)}</span></td>'
            f"<td>{_e(g(b.max_abs))}</td><td>{_e(env)}</td><td>{_e(name)}</td></tr>"
        )
    return f'<section id="baselines"><h2>Baselines</h2><table class="list">{head}{"".join(body)}</table></section>'


# ------------------------------------------------------------------------------------------------
# overview, jobs, heat map, holes


def _overview(files: Sequence[ResultsFile], checks: Sequence[_Check], matrix: Matrix) -> str:
    by: dict[str, int] = {}
    for c in checks:
        key = c.row.outcome or "?"
        by[key] = by.get(key, 0) + 1
    conflicts = matrix.counts().get("conflict", 0)
    incomplete = sum(not f.complete for f in files)
    parts = [f"{len(files)} job(s)", f"{len(matrix.tests):,} test(s)", f"{len(checks):,} check(s)"]
    parts += [f"{v:,} {k}" for k, v in sorted(by.items())]
    if conflicts:
        parts.append(f"{conflicts} conflicting cell(s)")
    if incomplete:
        parts.append(f"{incomplete} incomplete file(s): a run did not finish")
    return f"<header><h1>pytest-ortdiff report</h1><p>{_e(' · '.join(parts))}</p></header>"


def _jobs(matrix: Matrix) -> str:
    body = []
    for job in matrix.jobs:
        f = job.results
        env = (
            "; ".join(f"{k}: {v}" for k, v in _ran_items(job))
            or "not recorded (a file of an older pytest-ortdiff)"
        )
        status = "complete" if f.complete else "did not finish"
        # every skipped test (a provider × dtype hole, no case left for the marker, pytest.skip), as merge counts them
        skipped = sum(t.outcome == "skipped" for t in f.tests) or len(f.skips)
        body.append(
            f"<tr><td>{_e(job.label)}</td><td>{len(f.results):,}</td><td>{len(f.tests):,}</td><td>{skipped:,}</td>"
            f"<td>{_e(status)}</td><td>{_e(env)}</td></tr>"
        )
    head = "<tr><th>job</th><th>checks</th><th>tests</th><th>skipped</th><th>run</th><th>environment</th></tr>"
    return f'<section id="jobs"><h2>Jobs</h2><table class="list">{head}{"".join(body)}</table></section>'


def _ran_items(job: Job) -> list[tuple[str, str]]:
    """The job's environment as (key, value), its providers and dtypes those its rows ran, the run's selection
    beside them where it differs (a marker's dtypes=["float16"] in a run that selected float32)."""
    if job.environment.empty:
        return []
    ran = dict(ran_environment(job.results).items())
    out = []
    for key, value in job.environment.items():
        shown = ran.get(key, value)
        out.append((key, shown if shown == value else f"{shown} (the run selected {value})"))
    return out + [(k, v) for k, v in ran.items() if k not in dict(job.environment.items())]


def _heatmap(matrix: Matrix, anchors: Mapping[int, str]) -> str:
    if not matrix.tests or not matrix.columns:
        return '<section id="matrix"><h2>Matrix</h2><p class="muted">Nothing to pivot: no test ran a check.</p></section>'
    head = "".join(f'<th scope="col">{_e(col.label)}</th>' for col in matrix.columns)
    out = [
        '<section id="matrix"><h2>Matrix</h2>',
        _LEGEND,
        f'<table class="heat"><thead><tr><th scope="col">test</th>{head}</tr></thead><tbody>',
    ]
    for test in matrix.tests:
        out.append(f'<tr><th scope="row"><code>{_e(test)}</code></th>')
        out.extend(
            _heat_cell(matrix.cell(test, col), anchors, len(matrix.jobs) > 1)
            for col in matrix.columns
        )
        out.append("</tr>")
    out.append("</tbody></table></section>")
    return "".join(out)


def _heat_cell(cell: Cell | None, anchors: Mapping[int, str], several_jobs: bool) -> str:
    if cell is None:
        return '<td class="none" title="not run">·</td>'
    verdict = cell.verdict
    tip = [cell.text]
    if cell.reason:
        tip.append(cell.reason)
    closer = _closer_in(cell.rows)
    if closer:
        tip.append(f"closer to the float64 oracle: {closer}")
    if several_jobs and cell.jobs:
        tip.append("jobs: " + ", ".join(dict.fromkeys(cell.jobs)))
    style = ""
    if verdict in ("passed", "failed"):
        style = f' style="background:{_heat_colour(verdict, cell.max_ulp, cell.max_abs)}"'
    if verdict == "conflict":
        text = "≠ " + " / ".join(_WORDS.get(p.verdict, p.verdict) for p in cell.parts)
    else:
        text = {"skipped": "skip", "error": "error"}.get(verdict) or _magnitude(cell)
    anchor = next((anchors[id(r)] for r in cell.rows if id(r) in anchors), None)
    inner = f'<a href="#{anchor}">{_e(text)}</a>' if anchor else _e(text)
    dark = " dark" if verdict == "failed" and _strength(cell.max_ulp, cell.max_abs) > 0.5 else ""
    return f'<td class="{_cls(verdict)}{dark}"{style} title="{_e(" | ".join(tip))}">{inner}</td>'


def _strength(max_ulp: float | None, max_abs: float | None) -> float:
    """0..1: log10 of the error in ULPs (1e5 ULP and beyond: 1), or of max abs in millionths without ULPs."""
    if max_ulp is not None and math.isfinite(max_ulp):
        return min(1.0, math.log10(1 + max(max_ulp, 0.0)) / 5)
    if max_abs is not None and math.isfinite(max_abs):
        return min(1.0, math.log10(1 + max(max_abs, 0.0) * 1e6) / 8)
    return 1.0


def _heat_colour(verdict: str, max_ulp: float | None, max_abs: float | None) -> str:
    s = _strength(max_ulp, max_abs)
    if (
        verdict == "passed"
    ):  # pale green when exact, to yellow-green as the error grows within tolerance
        return f"hsl({130 - 70 * s:.0f},55%,{90 - 22 * s:.0f}%)"
    return f"hsl(0,75%,{82 - 40 * s:.0f}%)"  # failed: pink to deep red


def _magnitude(cell: Cell) -> str:
    if cell.max_ulp is not None:
        return "exact" if cell.max_ulp == 0 and not cell.max_abs else f"{g(cell.max_ulp, 2)} ulp"
    return "-" if cell.max_abs is None else f"{g(cell.max_abs, 2)} abs"


def _holes(skips: Sequence[SkipRow]) -> str:
    if not skips:
        return ""
    grouped: dict[str, int] = {}
    for s in skips:
        grouped[s.reason] = grouped.get(s.reason, 0) + 1
    items = "".join(
        f"<li>{n} test(s) skipped: {_e(reason)}</li>" for reason, n in sorted(grouped.items())
    )
    return f'<section id="holes"><h2>Holes in the provider × dtype matrix</h2><ul>{items}</ul></section>'


def _unchecked_failures(files: Sequence[ResultsFile], names: Sequence[str]) -> str:
    """Tests that failed or errored while no failed check of theirs says why (a missing baseline, an
    exception, a run that did not finish): the checks alone would not show them."""
    rows: list[tuple[CheckRow, str, str]] = []
    for f, name in zip(files, names, strict=False):
        messages = {t.test: t.message or "" for t in f.tests}
        rows += [(r, messages.get(r.test, ""), name) for r in f.test_rows()]
    if not rows:
        return ""
    body = "".join(
        f'<tr><td><code>{_e(r.test)}</code></td><td><span class="badge failed">{_e(r.outcome or "failed")}</span></td>'
        f"<td>{_e(r.worst)}</td><td>{_e(message)}</td><td>{_e(name)}</td></tr>"
        for r, message, name in rows
    )
    head = (
        "<tr><th>test</th><th>outcome</th><th>what happened</th><th>message</th><th>job</th></tr>"
    )
    return f'<section id="failures"><h2>Tests that failed outside a check</h2><table class="list">{head}{body}</table></section>'


# ------------------------------------------------------------------------------------------------
# small helpers


def _e(text: str) -> str:
    return escape(text, quote=True)


def _cls(verdict: str) -> str:
    return (
        verdict
        if verdict in ("passed", "failed", "skipped", "conflict", "error", "xfailed")
        else "other"
    )


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # DiffReport.to_dict writes nan/inf as strings
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any) -> int:
    v = _num(value)
    return int(v) if v is not None and math.isfinite(v) else 0


def _pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        a, b = _num(value[0]), _num(value[1])
        if a is not None and b is not None:
            return a, b
    return None


def _differ(rep: Mapping[str, Any]) -> int:
    """Elements that differ at all: `differ`, else the histogram's count above 0 (DiffReport.mismatches)."""
    if rep.get("differ") is not None:
        return _int(rep.get("differ"))
    return _count(rep, 0.0)


def _is_mismatch(expected: float | None, got: float | None) -> bool:
    """A NaN/Inf pair that differs (NaN == NaN, +Inf == +Inf), as report.py reads the values at the max."""
    if expected is None or got is None:
        return False
    if math.isnan(expected) or math.isnan(got):
        return not (math.isnan(expected) and math.isnan(got))
    return (math.isinf(expected) or math.isinf(got)) and expected != got


def _mismatched(rep: Mapping[str, Any]) -> bool:
    return bool(_int(rep.get("nan_mismatch")) or _int(rep.get("inf_mismatch")))


def _dtype_shape(rep: Mapping[str, Any]) -> str:
    """ "float16[2x16x32]"; the dtype alone for a report over several outputs (each has its own shape)."""
    dtype = str(rep.get("dtype") or "?")
    shape = rep.get("shape") or []
    if not shape and rep.get("outputs"):
        return dtype
    return f"{dtype}[{'x'.join(map(str, shape)) or 'scalar'}]"


def _power(d: int) -> str:
    """10**d as an axis reads it: "1", "10", "100", "1k", ... "100M", "1G", then "1e10"."""
    if d >= 10:
        return f"1e{d}"
    return (
        ("1", "10", "100")[d % 3] + ("", "k", "M", "G")[d // 3] if d >= 3 else ("1", "10", "100")[d]
    )


def _short(c: int) -> str:
    if c < 1000:
        return str(c)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if c >= div:
            return f"{c / div:.3g}{unit}"
    return str(c)


_LEGEND = (
    '<p class="legend">'
    '<span class="sw" style="background:hsl(130,55%,90%)"></span> passed, exact '
    '<span class="sw" style="background:hsl(60,55%,68%)"></span> passed, ≥1e5 ulp '
    '<span class="sw" style="background:hsl(0,75%,72%)"></span> failed, small '
    '<span class="sw" style="background:hsl(0,75%,42%)"></span> failed, ≥1e5 ulp '
    '<span class="sw conflict"></span> conflict (jobs disagree) '
    '<span class="sw skipped"></span> skipped <span class="sw error"></span> error '
    "· the cell shows the worst ULP error at the output's scale; hover for details, click for the check</p>"
)

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.2em;margin:1.4em 0 .5em;border-bottom:1px solid #ddd}
h4{margin:.6em 0 .3em}code{font:12px ui-monospace,monospace}.muted{color:#777}
table{border-collapse:collapse}td,th{padding:2px 6px;text-align:left;vertical-align:top}
table.list td,table.list th,table.small td,table.small th{border-bottom:1px solid #eee}
table.small{font-size:12px;margin:.4em 0}#jobs td:first-child{white-space:nowrap}
table.heat th[scope=row]{max-width:40em;overflow-wrap:anywhere;font-weight:normal}
table.heat td{min-width:6em;text-align:center;border:1px solid #fff;font-size:12px;white-space:nowrap}
table.heat td a{color:inherit;text-decoration:none;display:block}
td.dark{color:#fff}td.none{background:#f7f7f7;color:#bbb}
td.skipped,.sw.skipped{background:#e4e4e4;color:#666}td.error,.sw.error{background:#333;color:#fff}
td.conflict,.sw.conflict{background:repeating-linear-gradient(45deg,#e3cdf7 0 5px,#fff 5px 10px);outline:2px solid #7b2cbf;outline-offset:-2px;color:#4a0f80;font-weight:bold}
.legend{font-size:12px}.sw{display:inline-block;width:1.2em;height:1em;vertical-align:middle;border:1px solid #ccc;margin-left:.6em}
.badge{display:inline-block;padding:0 .5em;border-radius:3px;font-size:12px;background:#ddd}
.badge.passed{background:#cdebd3}.badge.failed,.badge.error{background:#f4b4b4}.badge.xfailed{background:#f3e2b3}
details.check{border:1px solid #e3e3e3;border-radius:4px;margin:.3em 0;padding:.2em .6em}
details.check.failed{border-color:#e28b8b}details.check>summary{cursor:pointer}
.nums{color:#555;font-size:12px;margin-left:.6em}
.body{display:flex;flex-wrap:wrap;gap:.5em 2em;align-items:flex-start;margin:.4em 0}
.body>.oracle,.body>.blame,.body>.baseline{flex-basis:100%}
dl.nums{display:grid;grid-template-columns:auto auto;gap:0 1em;margin:0;font-size:12px;color:#222}
dl.nums dt{color:#666}dl.nums dd{margin:0}
svg.hist{background:#fcfcfc;border:1px solid #eee}
svg.hist .bar{fill:#6b8fc7}svg.hist .bar.over{fill:#d33}
svg.hist .grid{stroke:#eee}svg.hist .axis{stroke:#999}svg.hist .cap{stroke:#c00;stroke-width:2.5}
svg.hist .atol{stroke:#e07b00;stroke-width:1.5;stroke-dasharray:4 3}
svg.hist text{font:9px sans-serif;fill:#555}svg.hist .xl,svg.hist .cnt,svg.hist .xt{text-anchor:middle}
svg.hist .yl{text-anchor:end}svg.hist .tl{fill:#b35f00}svg.hist .cnt{fill:#222}
.share{display:inline-block;width:4em;height:.7em;background:#eee;vertical-align:middle}
.share>span{display:block;height:100%;background:#d9822b}
"""

# opens the check a heat-map link points at (a closed <details> would hide it); the page reads fine without
_JS = """
function ortdiffOpen(){var e=location.hash&&document.getElementById(location.hash.slice(1));if(e&&e.tagName==='DETAILS')e.open=true;}
addEventListener('hashchange',ortdiffOpen);addEventListener('DOMContentLoaded',ortdiffOpen);
"""

_HEAD = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
    f'<meta name="viewport" content="width=device-width,initial-scale=1">{GENERATOR}'
    f"<title>pytest-ortdiff report</title><style>{_CSS}</style><script>{_JS}</script></head><body>"
)
_TAIL = "</body></html>\n"
