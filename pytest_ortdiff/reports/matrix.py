"""The CI matrix: one run's or several jobs' check rows, test outcomes and skips pivoted into tests ×
(provider, dtype[, onnxruntime version]) cells — conflicts between jobs kept — and its text and markdown forms."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..numerics.dtypes import TESTABLE
from ..numerics.formatting import cut, g, html_text, markdown_text
from ..numerics.results import CheckRow, Environment, ResultsFile, SkipRow, TestOutcome
from ..runtimes.providers import KNOWN

__all__ = ["VERDICTS", "Cell", "Column", "Job", "Matrix", "elide", "job_labels", "pivot", "ran_environment", "test_key"]

#: a cell's verdicts, in the order a headline counts them ("conflict": jobs reporting the same cell disagree)
VERDICTS = ("passed", "failed", "error", "skipped", "conflict")
#: the column of a row or outcome that names no provider or dtype
_NONE = "-"
_WORDS = {"passed": "ok", "skipped": "skip", "failed": "FAIL", "error": "ERROR", "conflict": "CONFLICT"}
_MARKS = {"passed": "✅", "skipped": "⏭️", "failed": "❌", "error": "💥", "conflict": "⚠️"}
_XFAIL_MARK = "🟡"
_MD_LEGEND = (
    f"{_MARKS['passed']} passed · {_MARKS['failed']} failed · {_MARKS['error']} error · {_MARKS['skipped']} skipped · "
    f"{_XFAIL_MARK} failed as expected (xfail) · {_MARKS['conflict']} jobs disagree; numbers: max abs error (worst ULP error at the output's scale)"
)
#: a GitHub comment holds 65,536 characters; the markdown form stays below, leaving room for a heading
MARKDOWN_LIMIT = 60_000
_GITHUB_LIMIT = 65_536


@dataclass(frozen=True)
class Column:
    """A case: provider × dtype, and the onnxruntime version when the jobs merged differ in it."""

    provider: str
    dtype: str
    ort_version: str | None = None  # None unless jobs differ in onnxruntime version

    @property
    def label(self) -> str:
        """"CPU float16", or "CPU float16 ort 1.31.0"."""
        return f"{self.provider} {self.dtype}" + (f" ort {self.ort_version}" if self.ort_version else "")


@dataclass(frozen=True)
class Cell:
    """One test in one case: the verdict, the largest absolute and ULP errors of its checks (ULPs at the
    output's scale: `CheckRow.ulp`), the worst budget
    line (or why it failed, was skipped, or which jobs disagree: `message`), and what it was made of.

    A cell folds every check of the test case (the test's own and its suffixed ones: " [baseline out]",
    " [fuzz]") to the worst. Reported by several jobs alike, it lists them all in `jobs`; reported
    differently, it is a "conflict" whose `parts` hold one cell per distinct result with its jobs.
    """

    verdict: str  # "passed" | "failed" | "skipped" | "conflict" | "error"
    max_abs: float | None = None
    max_ulp: float | None = None
    worst: str = ""
    rows: tuple[CheckRow, ...] = ()
    skips: tuple[SkipRow, ...] = ()
    jobs: tuple[str, ...] = ()
    message: str | None = None
    parts: tuple[Cell, ...] = ()
    tests: tuple[TestOutcome, ...] = ()
    #: NaN and Inf mismatches of the worst check (max abs counts finite pairs only: 0 beside 256 Inf mismatches)
    nan_mismatch: int = 0
    inf_mismatch: int = 0

    @property
    def text(self) -> str:
        """The cell as the text matrix shows it: "ok 0.00015 (3 ulp)", "FAIL 0.25 (1.2e+04 ulp)", "skip",
        "CONFLICT FAIL 0.25 (3 ulp) / ok 0.00015 (3 ulp)"."""
        if self.verdict == "conflict":
            return "CONFLICT " + " / ".join(p.text for p in self.parts)
        word = "xfail" if self.expected_failure else _WORDS.get(self.verdict, self.verdict)
        return f"{word} {self.numbers}".rstrip()

    @property
    def expected_failure(self) -> bool:
        """A passed cell whose checks (or test) failed as the test expected (xfail): it passes `merge
        --strict`, and is shown as an expected failure, not as a pass."""
        return self.verdict == "passed" and (any(r.outcome == "xfailed" for r in self.rows) or any(t.outcome == "xfailed" for t in self.tests))

    @property
    def numbers(self) -> str:
        """"0.00015 (3 ulp)", "0 (0 ulp), 256 Inf"; "" for a cell without a check."""
        if self.max_abs is None and self.max_ulp is None:
            return ""
        text = g(self.max_abs) + (f" ({g(self.max_ulp)} ulp)" if self.max_ulp is not None else "")
        for n, kind in ((self.nan_mismatch, "NaN"), (self.inf_mismatch, "Inf")):
            if n:
                text += f", {n:,} {kind}"
        return text

    @property
    def reason(self) -> str:
        """Why the cell is not simply passed: the budget line broken, the test's failure, the skip reason,
        each job's result for a conflict; "" for a passed cell (or the note that it failed as expected)."""
        return self.reason_naming(None)

    def reason_naming(self, tags: Mapping[str, str] | None) -> str:
        """`reason`, the jobs of a conflict named by `tags` (label -> short name such as "job A")."""
        if self.verdict == "conflict":
            return "; ".join(f"{_jobs(p.jobs, tags)}: {p.text}" + (f" — {p.reason}" if p.reason else "") for p in self.parts)
        if self.verdict == "passed":
            return self.message or ""
        broken = self.worst if any(not r.ok for r in self.rows) else ""
        return " — ".join(t for t in (broken, self.message or "") if t)


@dataclass(frozen=True)
class Job:
    """One merged file: its label (from its environment, a file name or `merge --label`) and what it holds."""

    label: str
    environment: Environment
    results: ResultsFile = field(repr=False, compare=False, default_factory=ResultsFile)


@dataclass(frozen=True)
class Matrix:
    """Tests (ids without their provider/dtype part) × columns (cases), with the jobs merged.

    `outside` holds the failed and errored tests that carry no case (a plain test, a collection error, a
    run that did not finish), with their job's label: no cell shows them, every rendering lists them.
    """

    tests: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: Mapping[tuple[str, Column], Cell]
    jobs: tuple[Job, ...]
    outside: tuple[tuple[str, TestOutcome], ...] = ()

    def cell(self, test: str, column: Column) -> Cell | None:
        return self.cells.get((test, column))

    @property
    def cases(self) -> int:
        """How many real provider × dtype columns (a column of rows without either does not count)."""
        return sum(1 for c in self.columns if c.provider != _NONE and c.dtype != _NONE)

    def failing_tests(self) -> tuple[str, ...]:
        """The tests with a cell that did not pass (failed, error, skipped or conflict) in some case."""
        return tuple(t for t in self.tests if any((x := self.cell(t, c)) is not None and x.verdict != "passed" for c in self.columns))

    def counts(self) -> dict[str, int]:
        """Cells per verdict, in VERDICTS' order, zeros left out."""
        out = {v: 0 for v in VERDICTS}
        for c in self.cells.values():
            out[c.verdict] = out.get(c.verdict, 0) + 1
        return {k: n for k, n in out.items() if n}

    def headline(self) -> str:
        """"3 tests × 4 cases from 3 jobs, 11 cells: 8 passed, 1 failed, 1 skipped, 1 conflict" (an expected
        failure counted as "xfail")."""
        jobs = f" from {_count(len(self.jobs), 'job')}" if len(self.jobs) > 1 else ""
        tally = self.counts()
        xfail = sum(1 for c in self.cells.values() if c.expected_failure)
        if xfail:  # (a passed verdict, shown apart: the checks failed as their tests expected)
            tally = {k: n for k, n in {**tally, "passed": tally["passed"] - xfail, "xfail": xfail}.items() if n}
        counts = ", ".join(f"{n} {v}" if v != "conflict" else _count(n, "conflict") for v, n in tally.items())
        return f"{_count(len(self.tests), 'test')} × {_count(len(self.columns), 'case')}{jobs}, {_count(len(self.cells), 'cell')}: {counts or 'none'}"

    # -- text ---------------------------------------------------------------------------------------
    def render_text(self, width: int, *, notes: bool = True, tests: Sequence[str] | None = None) -> str:
        """The matrix in `width` columns: test ids elided in the middle of their path (their parametrize id
        kept), and columns that still do not fit continued in a further block. With `notes`, a line per cell
        that did not pass says why, and the jobs and the failures outside the matrix follow. `tests`: the
        rows to show (default: all)."""
        width = max(width, 40)
        shown = self.tests if tests is None else tuple(tests)
        # a module's path once, as a heading, its tests' names under it: the names keep the room
        groups: dict[str, list[list[str]]] = {}
        for t in shown:
            module, sep, name = t.partition("::")
            groups.setdefault(module if sep else "", []).append([name if sep else t, *((cell.text if (cell := self.cell(t, c)) else "-") for c in self.columns)])
        lines = _fit(["test", *(c.label for c in self.columns)], list(groups.items()), width)
        lines += _wrap("cells: max abs (worst ULP at the output's scale); ok FAIL ERROR xfail skip CONFLICT (jobs disagree)", width)
        if notes:
            tags = self.tags()
            for t in shown:
                for c in self.columns:
                    cell = self.cell(t, c)
                    if cell is not None and cell.verdict != "passed":
                        lines += _wrap(f"{_WORDS[cell.verdict]}  {t} · {c.label}: {cell.reason_naming(tags) or '-'}", width)
            for label, o in self.outside:
                where = f" ({_jobs((label,), tags)})" if len(self.jobs) > 1 else ""
                lines += _wrap(f"{_WORDS[o.outcome]}  {o.test}{where}: {o.message or 'no message'}", width)
            if len(self.jobs) > 1:
                lines.append("jobs:")
                for job in self.jobs:
                    lines += _wrap(f"  {tags[job.label]}  {job.label}: {_environment_text(job)}", width, indent="       ")
        return "\n".join(line.rstrip() for line in lines)

    def tags(self) -> dict[str, str]:
        """A short name per job label for notes and details: "job A", "job B", ... (the labels are listed once)."""
        return {job.label: f"job {_letters(i)}" for i, job in enumerate(self.jobs)}

    # -- markdown -----------------------------------------------------------------------------------
    def render_markdown(self, *, limit: int = MARKDOWN_LIMIT) -> str:
        """A pull-request comment: the headline, the table (one emoji and the numbers per cell), a collapsed
        <details> per failed, errored or conflicting cell, one for the skipped cells, the failures outside the
        matrix, and the jobs — in at most `limit` characters. Above it, what a reader needs first stays: the
        failing tests' rows (and the details of their first cells), then the skipped cells, the failures
        outside, the passing tests' rows; a note says what was left out. Text from the files is escaped
        (`formatting.markdown_text`): it forms no link, image, HTML or column."""
        failing_tests = set(self.failing_tests())
        failing = [(t, c, cell) for t in self.tests for c in self.columns if (cell := self.cell(t, c)) is not None and cell.verdict in ("failed", "error", "conflict")]
        skipped = [(t, c, x) for t in self.tests for c in self.columns if (x := self.cell(t, c)) is not None and x.verdict == "skipped"]
        tags = self.tags() if len(self.jobs) > 1 else None
        full = _MarkdownParts(
            head=[f"**ortdiff**: {_md(self.headline())}", ""],
            table_head=["| test | " + " | ".join(_md(c.label, _MD_LABEL) for c in self.columns) + " |", "|---|" + "---|" * len(self.columns)] if self.columns else [],
            rows={t: self._md_row(t) for t in self.tests},
            details=[_md_details(t, c, cell, tags) for t, c, cell in failing],
            skipped=[f"- {_md(t)} · {_md(c.label, _MD_LABEL)}: {_md(x.message or 'skipped')}" for t, c, x in skipped],
            outside=[f"- {_MARKS[o.outcome]} {_md(o.test)}" + (f" ({_jobs((label,), tags)})" if tags else "") + f": {_md(o.message or 'no message')}" for label, o in self.outside],
            jobs=[f"- {tags[job.label]}: **{_md(job.label, _MD_LABEL)}**: {_md(_environment_text(job))}" for job in self.jobs] if tags else [],
        )
        text = full.render(list(self.tests), len(failing), len(skipped), len(self.outside), "")
        if len(text) <= limit:
            return text
        return full.fit([t for t in self.tests if t in failing_tests], [t for t in self.tests if t not in failing_tests], limit)

    def _md_row(self, test: str) -> str:
        return f"| {_md(test, _MD_TEST)} | " + " | ".join(_md_cell(self.cell(test, c)) for c in self.columns) + " |"


@dataclass
class _MarkdownParts:
    """The markdown comment's lines, section by section, so that a comment over its limit keeps what fits
    of each section, in the order a reader needs them, and says what it left out."""

    head: list[str]
    table_head: list[str]
    rows: dict[str, str]
    details: list[list[str]]
    skipped: list[str]
    outside: list[str]
    jobs: list[str]

    def render(self, tests: Sequence[str], details: int, skipped: int, outside: int, note: str) -> str:
        out = list(self.head)
        if self.table_head:
            out += self.table_head + [self.rows[t] for t in tests] + ["", _MD_LEGEND, ""]
        if note:
            out += [note, ""]
        for block in self.details[:details]:
            out += block
        if skipped:
            out += [f"<details><summary>{_MARKS['skipped']} {_count(len(self.skipped), 'skipped cell')}</summary>", "", *self.skipped[:skipped], "", "</details>", ""]
        if outside:
            out += ["Failed outside the matrix:", *self.outside[:outside], ""]
        if self.jobs:
            out += ["Jobs:", *self.jobs, ""]
        return "\n".join(out).rstrip("\n") + "\n"

    def fit(self, failing: list[str], passing: list[str], limit: int) -> str:
        """The comment in at most `limit` characters: room for the fixed lines and the note first, then the
        failing tests' rows (up to 60 % of what is left), the details, the rest of the failing rows, the
        skipped cells, the failures outside, the passing rows: as many of each as fit."""
        note_room = 700
        fixed = len(self.render([], 0, 1 if self.skipped else 0, 1 if self.outside else 0, "")) - (len(self.skipped[0]) + 1 if self.skipped else 0) - (len(self.outside[0]) + 1 if self.outside else 0)
        room = limit - fixed - note_room
        if room <= 0:
            return self._too_large(limit)

        def take(lengths: Sequence[int], budget: int) -> int:
            n = used = 0
            while n < len(lengths) and used + lengths[n] <= budget:
                used += lengths[n]
                n += 1
            return n

        def size(lines: Sequence[str]) -> list[int]:
            return [len(line) + 1 for line in lines]

        row_sizes = size([self.rows[t] for t in failing])
        detail_sizes = [sum(size(block)) for block in self.details]
        rows = take(row_sizes, int(room * 0.6))
        room -= sum(row_sizes[:rows])
        details = take(detail_sizes, room)
        room -= sum(detail_sizes[:details])
        more = take(row_sizes[rows:], room)
        rows += more
        room -= sum(row_sizes[rows - more : rows])
        skipped = take(size(self.skipped), room)
        room -= sum(size(self.skipped[:skipped]))
        outside = take(size(self.outside), room)
        room -= sum(size(self.outside[:outside]))
        passing_rows = take(size([self.rows[t] for t in passing]), room)
        shown = set(failing[:rows]) | set(passing[:passing_rows])
        tests = [t for t in self.rows if t in shown]  # (the table's own order)
        left = [
            (len(failing) - rows, f"{len(failing) - rows:,} of {len(failing):,} failing tests' rows"),
            (len(passing) - passing_rows, f"{len(passing) - passing_rows:,} tests where every case passed"),
            (len(self.details) - details, f"the details of {len(self.details) - details:,} of {len(self.details):,} failing cells"),
            (len(self.skipped) - skipped, f"{len(self.skipped) - skipped:,} of {len(self.skipped):,} skipped cells"),
            (len(self.outside) - outside, f"{len(self.outside) - outside:,} of {len(self.outside):,} failures outside the matrix"),
        ]
        note = (
            f"_Cut to stay under {MARKDOWN_LIMIT:,} characters (a GitHub comment holds {_GITHUB_LIMIT:,}): "
            + "; ".join(what for n, what in left if n)
            + " not shown. All of it: `merge` without --markdown, or --html._"
        )
        text = self.render(tests, details, skipped, outside, note)
        return text if len(text) <= limit else self._too_large(limit)

    def _too_large(self, limit: int) -> str:
        """When even the fixed lines do not fit (thousands of columns or jobs): the headline and why."""
        note = f"_The matrix does not fit in {MARKDOWN_LIMIT:,} characters (a GitHub comment holds {_GITHUB_LIMIT:,}), not even its header: `merge` without --markdown, or --html, shows it._"
        return cut("\n".join([*self.head, note]), limit - 1) + "\n"


# ------------------------------------------------------------------------------------------------
# the pivot


def pivot(files: Sequence[ResultsFile], labels: Sequence[str] | None = None) -> Matrix:
    """The matrix of `files` (one per job; `labels` name them, else job_labels does). Rows: tests without
    their provider/dtype id part; columns: provider × dtype, × onnxruntime version when the jobs differ in
    it; a cell folds a test case's checks, its outcome and its skips (a test that failed without a failed
    check — a missing baseline, an exception — is failed or error with why). Jobs reporting one cell
    differently make a conflict cell that keeps every result."""
    names = list(labels) if labels is not None else job_labels(files)
    if len(names) != len(files):
        raise ValueError(f"{len(names)} label(s) for {len(files)} file(s): give one label per file")
    versions = {f.environment.onnxruntime for f in files if f.environment.onnxruntime}
    split = len(versions) > 1
    jobs = tuple(Job(name, f.environment, f) for name, f in zip(names, files, strict=True))
    reported: dict[tuple[str, Column], list[Cell]] = {}
    outside: list[tuple[str, TestOutcome]] = []
    for job in jobs:
        f = job.results
        version = f.environment.onnxruntime if split else None
        for key, column, cell in _job_cells(f, job.label, version):
            reported.setdefault((key, column), []).append(cell)
        outside += [(job.label, t) for t in f.tests if t.outcome in ("failed", "error") and not (t.provider and t.dtype)]
    cells = {k: _combine(v) for k, v in reported.items()}
    columns = tuple(sorted({c for _, c in cells}, key=_column_order))
    return Matrix(tuple(sorted({t for t, _ in cells})), columns, cells, jobs, tuple(outside))


def job_labels(files: Sequence[ResultsFile], names: Sequence[str] | None = None) -> list[str]:
    """A label per file: its environment's ("CPU float16 · ort 1.32.0 · torch 2.13.0", naming the cases its
    rows ran: `ran_environment`), else its name in `names` (a file stem), else "job N"; labels that collide
    get the name (or the number) added."""
    labels = [ran_environment(f).label or (names[i] if names else f"job {i + 1}") for i, f in enumerate(files)]
    seen = {label: labels.count(label) for label in labels}
    return [label if seen[label] == 1 else f"{label} ({names[i] if names else f'job {i + 1}'})" for i, label in enumerate(labels)]


def ran_environment(f: ResultsFile) -> Environment:
    """The file's environment with the providers and dtypes its checks, tests and skips ran (the run's
    selection, --ort-dtypes, says float32 where a marker's dtypes=["float16"] ran float16); the selection's
    where the file names none; nothing for a file that recorded no environment (labelled by its name)."""
    env = f.environment
    if env.empty:
        return env
    # the cases that ran; a job that skipped its CUDA cases (no GPU) ran CPU only, and is labelled so (its
    # CPU's model is not a GPU's name); a job that skipped everything is labelled by what it skipped
    ran = [(r.provider, r.dtype) for r in f.results] + [(t.provider, t.dtype) for t in f.tests if t.outcome != "skipped"]
    skipped = [(t.provider, t.dtype) for t in f.tests if t.outcome == "skipped"] + [(k.provider, k.dtype) for k in f.skips]
    cases = ran if any(p for p, _ in ran) else ran + skipped
    providers = tuple(dict.fromkeys(p for p, _ in cases if p))
    dtypes = tuple(dict.fromkeys(d for _, d in cases if d))
    return replace(env, providers=providers or env.providers, dtypes=dtypes or env.dtypes)


def _provider_names() -> str:
    return "|".join(re.escape(p) for p in sorted(KNOWN, key=len, reverse=True))


#: the id part the plugin's parametrization adds: "<provider>-<dtype>", a whole dash-separated part of the id
_CASE_ID = re.compile(rf"(?:^|-)(?:{_provider_names()})-(?:{'|'.join(TESTABLE)})(?=-|$)")


_XDIST_GROUP = re.compile(r"@[^\[\]@/:]+$")


def test_key(nodeid: str) -> str:
    """The test id without its provider/dtype id part: "t.py::test_x[CPU-float16]" -> "t.py::test_x",
    "t.py::test_y[CPU-float32-7]" -> "t.py::test_y[7]"."""
    return _strip_case(nodeid, None)


# (pytest collects a function named test_*: this one is not a test)
test_key.__test__ = False  # type: ignore[attr-defined]


def _strip_case(nodeid: str, case: tuple[str, str] | None) -> str:
    """`nodeid` without the parametrize id part of `case` (provider, dtype), or of any known case (and
    without the `@group` suffix xdist's `--dist loadgroup` appends to grouped tests' ids)."""
    nodeid = _XDIST_GROUP.sub("", nodeid)
    start = nodeid.find("[", nodeid.find("::") + 1 if "::" in nodeid else 0)
    if start < 0 or not nodeid.endswith("]"):
        return nodeid
    params = nodeid[start + 1 : -1]
    if case is not None:
        part = re.compile(rf"(?:^|-){re.escape(case[0])}-{re.escape(case[1])}(?=-|$)")
        m = part.search(params) or _CASE_ID.search(params)
    else:
        m = _CASE_ID.search(params)
    if m is None:
        return nodeid
    i, j = m.span()
    # drop one dash with the part: the one before it, or the one after it at the start of the id
    rest = params[:i] + params[j:] if i > 0 or j >= len(params) else params[j + 1 :]
    return nodeid[:start] + (f"[{rest}]" if rest else "")


def _nodeid(test: str, known: Mapping[str, TestOutcome]) -> str:
    """The test id of a check row's `test` (test id + suffix such as " [baseline out]")."""
    if test in known:
        return test
    for nodeid in known:
        if test.startswith(nodeid + " ["):
            return nodeid
    m = re.match(r"^(.*?\])((?: \[[^\]]*\])+)$", test)  # files without test outcomes: cut the suffixes
    return m.group(1) if m else test


def _job_cells(f: ResultsFile, label: str, version: str | None) -> Iterable[tuple[str, Column, Cell]]:
    known = {t.test: t for t in f.tests}
    groups: dict[tuple[str, Column], tuple[list[CheckRow], list[TestOutcome], list[SkipRow]]] = {}

    def group(nodeid: str, provider: str | None, dtype: str | None) -> tuple[list[CheckRow], list[TestOutcome], list[SkipRow]]:
        p, d = provider or _NONE, dtype or _NONE
        key = _strip_case(nodeid, (p, d))
        return groups.setdefault((key, Column(p, d, version)), ([], [], []))

    for r in f.results:
        group(_nodeid(r.test, known), r.provider, r.dtype)[0].append(r)
    for t in f.tests:
        if t.provider and t.dtype:
            group(t.test, t.provider, t.dtype)[1].append(t)
    for s in f.skips:
        if s.test is not None and s.provider and s.dtype:
            group(s.test, s.provider, s.dtype)[2].append(s)
    why = {r.test: r.worst for r in f.test_rows()}
    for (key, column), (rows, tests, skips) in groups.items():
        yield key, column, _fold(rows, tests, skips, label, why)


def _fold(rows: list[CheckRow], tests: list[TestOutcome], skips: list[SkipRow], label: str, why: Mapping[str, str]) -> Cell:
    """One job's cell from a test case's check rows, outcome(s) and skips: the worst verdict, the largest
    errors, and the line that says why."""
    failed = sorted((r for r in rows if not r.ok), key=lambda r: -_magnitude(r.max_abs))
    broken = [t for t in tests if t.outcome in ("failed", "error") and t.test in why]
    message: str | None = None
    if failed:
        verdict = "failed"
    elif broken:
        verdict = "error" if any(t.outcome == "error" for t in broken) else "failed"
        message = "; ".join(why[t.test] + (f": {t.message}" if t.message else "") for t in broken)
    elif rows or not (skips or any(t.outcome == "skipped" for t in tests)):
        verdict = "passed"
        if any(r.outcome == "xfailed" for r in rows) or any(t.outcome == "xfailed" for t in tests):
            message = "failed as the test expected (xfail)"
    else:
        verdict = "skipped"
        reasons = [s.reason for s in skips] + [t.message for t in tests if t.outcome == "skipped" and t.message]
        message = "; ".join(dict.fromkeys(reasons)) or "skipped"
    top = failed[0] if failed else max(rows, key=lambda r: _magnitude(r.max_abs), default=None)
    return Cell(
        verdict,
        _largest(r.max_abs for r in rows),
        _largest(r.ulp for r in rows),  # (at the output's scale: raw ULPs near zero alarm on passing checks)
        _worst_text(top) if top is not None else "",
        tuple(rows),
        tuple(skips),
        (label,),
        message,
        (),
        tuple(tests),
        max((_mismatches(r)[0] for r in rows), default=0),
        max((_mismatches(r)[1] for r in rows), default=0),
    )


def _combine(cells: list[Cell]) -> Cell:
    """The cells several jobs report for one test and column: one cell when they agree (same verdict and
    errors), else a conflict holding one part per distinct result."""
    groups: dict[tuple[str, str, str, int, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.verdict, repr(c.max_abs), repr(c.max_ulp), c.nan_mismatch, c.inf_mismatch), []).append(c)
    parts = [_merge(same) for same in groups.values()]
    if len(parts) == 1:
        return parts[0]
    return Cell(
        "conflict",
        _largest(p.max_abs for p in parts),
        _largest(p.max_ulp for p in parts),
        "",
        tuple(r for c in cells for r in c.rows),
        tuple(s for c in cells for s in c.skips),
        tuple(j for c in cells for j in c.jobs),
        f"jobs disagree: {len(parts)} different results",
        tuple(parts),
        tuple(t for c in cells for t in c.tests),
        max(p.nan_mismatch for p in parts),
        max(p.inf_mismatch for p in parts),
    )


def _merge(cells: list[Cell]) -> Cell:
    first = cells[0]
    if len(cells) == 1:
        return first
    return Cell(
        first.verdict,
        first.max_abs,
        first.max_ulp,
        first.worst,
        tuple(r for c in cells for r in c.rows),
        tuple(s for c in cells for s in c.skips),
        tuple(j for c in cells for j in c.jobs),
        first.message,
        (),
        tuple(t for c in cells for t in c.tests),
        first.nan_mismatch,
        first.inf_mismatch,
    )


def _magnitude(x: float | None) -> float:
    """For ordering: NaN above everything, None below."""
    if x is None:
        return -math.inf
    return math.inf if math.isnan(x) else x


def _largest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return math.nan if any(math.isnan(v) for v in known) else max(known)


def _mismatches(row: CheckRow) -> tuple[int, int]:
    """(NaN, Inf) mismatches of the row's report; (0, 0) without one."""
    report = row.report
    if not isinstance(report, Mapping):
        return 0, 0
    nan, inf = report.get("nan_mismatch"), report.get("inf_mismatch")
    return (nan if isinstance(nan, int) else 0), (inf if isinstance(inf, int) else 0)


def _worst_text(row: CheckRow) -> str:
    """The row's worst budget line, or its NaN/Inf mismatches (the histogram counts those above every
    threshold, so its worst line would read as huge finite errors)."""
    nan, inf = _mismatches(row)
    return f"{nan:,} NaN, {inf:,} Inf mismatches" if nan or inf else row.worst


def _column_order(c: Column) -> tuple[int, str, int, str, tuple[int | str, ...]]:
    providers, dtypes = list(KNOWN), list(TESTABLE)
    p = providers.index(c.provider) if c.provider in providers else len(providers)
    d = dtypes.index(c.dtype) if c.dtype in dtypes else len(dtypes)
    version = tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", c.ort_version)) if c.ort_version else ()
    return (p, c.provider, d, c.dtype, version)


# ------------------------------------------------------------------------------------------------
# rendering helpers


def _letters(i: int) -> str:
    """0 -> "A", 25 -> "Z", 26 -> "AA"."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(ord("A") + r) + out
    return out


def _jobs(labels: Iterable[str], tags: Mapping[str, str] | None) -> str:
    return ", ".join(tags.get(label, label) if tags else label for label in labels)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _environment_text(job: Job) -> str:
    """What the job's label leaves out: "onnx 1.23.0, numpy 2.3.1, python 3.11.9, Linux x86_64, <device>"."""
    env = job.environment
    if env.empty:
        return "environment not recorded (a file of an older pytest-ortdiff)"
    shown = [f"{k} {v}" for k, v in env.items() if k in ("onnxruntime", "torch", "onnx", "numpy", "python")]
    shown += [v for k, v in env.items() if k in ("platform", "device")]
    return ", ".join(shown)


def elide(test: str, width: int) -> str:
    """`test` in at most `width` characters: the middle of its path elided first ("tests/…/test_a.py::test_x[7]"),
    then the middle of its function name, keeping the parametrize id visible as long as it fits."""
    if len(test) <= width:
        return test
    path, sep, name = test.partition("::")
    if sep and len(name) + 2 + 5 <= width:
        return _middle(path, width - len(name) - 2) + "::" + name
    bracket = test.find("[", len(path))
    params = test[bracket:] if bracket >= 0 else ""
    room = width - len(params) - 2
    if sep and room >= 16:
        # a third of the room for the path, the rest for the function's name: both stay recognizable
        path_w = min(len(path), max(8, room // 3))
        return _middle(path, path_w) + "::" + _middle(name[: len(name) - len(params)], room - path_w) + params
    if params and len(params) + 8 <= width:
        return _middle(test[: len(test) - len(params)], width - len(params)) + params
    return _middle(test, width)


def _middle(text: str, width: int) -> str:
    """`text` with its middle replaced by "…" to fit `width`, keeping more of its end (a file name, an id)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 3
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


_INDENT = "  "


def _fit(head: list[str], groups: list[tuple[str, list[list[str]]]], width: int) -> list[str]:
    """A table of a test column and case columns in `width` characters. `groups`: (module, rows) — a module's
    path is a heading line and its tests' names are indented under it. The names are elided as far as a
    useful minimum, then the case columns go on in further blocks, each repeating the test column."""
    sep = 2
    body = [(bool(module), row) for module, rows in groups for row in rows]
    natural = max([len(head[0]), *(len(row[0]) + len(_INDENT) * indented for indented, row in body)])
    widths = [max([len(head[i]), *(len(row[i]) for _, row in body)]) for i in range(1, len(head))]
    rest = sum(sep + w for w in widths)
    # below this the names lose too much: the case columns go on in another block instead
    floor = min(natural, max(32, int(width * 0.4)))
    if natural + rest <= width or width - rest >= floor:
        blocks, test_w = [list(range(len(widths)))], min(natural, width - rest)
    else:
        test_w = min(natural, max(floor, width // 3))
        room = width - test_w
        blocks, current, used = [], list[int](), 0
        for i, w in enumerate(widths):
            if current and used + sep + w > room:
                blocks.append(current)
                current, used = [], 0
            current.append(i)
            used += sep + w
        blocks.append(current)
        widths = [min(w, room - sep) for w in widths]

    def line(first: str, row: list[str], block: list[int]) -> str:
        return (" " * sep).join([first.ljust(test_w), *(_cut(row[i + 1], widths[i]).ljust(widths[i]) for i in block)]).rstrip()

    lines: list[str] = []
    for n, block in enumerate(blocks):
        if n:
            lines.append("")
        lines.append(line(head[0], head, block))
        for module, rows in groups:
            if module:
                lines.append(_middle(module, width))
            indent = _INDENT if module else ""
            lines += [line(indent + elide(row[0], test_w - len(indent)), row, block) for row in rows]
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _wrap(text: str, width: int, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]


#: the longest test id and the longest label a markdown line shows (a comment has a size limit)
_MD_TEST = 300
_MD_LABEL = 120
#: BlameTable.CULPRIT_MIN as the terminal's table words it (a node explaining less is no culprit)
_CULPRIT_MIN = "10 %"


def _md(text: str, limit: int = 400) -> str:
    return markdown_text(text, limit)


def _ulp_text(r: CheckRow) -> str:
    """"4 (raw 4.69e+03)": the ULPs at the output's scale, and the raw distance when it differs."""
    if r.ulp is None or r.ulp == r.max_ulp or r.max_ulp is None:
        return g(r.ulp)
    return f"{g(r.ulp)} (raw {g(r.max_ulp)})"


def _md_cell(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.verdict == "conflict":
        return f"{_MARKS['conflict']} " + " / ".join(_md_cell(p) for p in cell.parts)
    mark = _XFAIL_MARK if cell.expected_failure else _MARKS[cell.verdict]
    return f"{mark} {_md(cell.numbers or ('xfail' if cell.expected_failure else cell.verdict))}"


def _md_details(test: str, column: Column, cell: Cell, tags: Mapping[str, str] | None) -> list[str]:
    # (a <details> line is raw HTML, where markdown is not read: HTML's escapes, not markdown's)
    summary = f"{_MARKS[cell.verdict]} {html_text(test, _MD_TEST)} · {html_text(column.label, _MD_LABEL)}"
    if cell.verdict == "conflict":
        summary += f": {len(cell.parts)} different results"
    elif cell.reason:
        summary += f": {html_text(cell.reason)}"
    out = [f"<details><summary>{summary}</summary>", ""]
    for part in cell.parts or (cell,):
        jobs = f" ({_jobs(part.jobs, tags)})" if tags else ""
        if cell.verdict == "conflict":
            out.append(f"- {_MARKS[part.verdict]} {_md(part.text)}{jobs}" + (f": {_md(part.reason)}" if part.reason else ""))
        for r in part.rows:
            out.append(
                f"- {_md(r.test)}{jobs}: {_md(r.outcome or '?')}, max abs {g(r.max_abs)}, max rel {g(r.max_rel)}, "
                f"max ULP {_ulp_text(r)}; {_md(_worst_text(r) or '-')}; tolerance {_md(r.tolerance or '-')}"
            )
            if isinstance(r.blame, Mapping):  # (--ortdiff-blame: the node that explains the gap, if one does)
                top, drift, closer = r.blame_top, r.blame.get("first_divergence"), r.blame.get("closer_to_oracle")
                if top is not None and r.blame.get("culprit"):
                    line = f"  - blame: {_md(top)}"
                elif top is not None:  # (as the terminal's table says it: a node under 10 % is no culprit)
                    line = f"  - blame: no single node explains {_CULPRIT_MIN} of the gap (the most: {_md(top)})"
                else:  # (no row at all: every node explains 0 %)
                    line = "  - blame: no single node explains any of the gap"
                if not r.blame.get("culprit") and drift:
                    line += f"; first node whose output drifts beyond the tolerance: {_md(str(drift))}"
                out.append(line + (f"; closer to the float64 oracle: {_md(str(closer))}" if closer else ""))
        if not any(not r.ok for r in part.rows):  # (a failed check's own line says why its test failed)
            out.extend(f"- {_md(t.test)}{jobs}: {t.outcome}: {_md(t.message or 'no message')}" for t in part.tests if t.outcome in ("failed", "error"))
    out += ["", "</details>", ""]
    return out
