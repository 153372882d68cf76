"""Result collection across a pytest run, xdist included: the rows the fixtures attach to test reports and
every test's outcome, into the --ortdiff-json file (atomically), the --ortdiff-html report and the terminal summary."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from ..numerics.results import (
    OUTCOMES,
    BaselineRow,
    CheckRow,
    Environment,
    Outcome,
    ResultsFile,
    SkipRow,
    TestOutcome,
    write_atomically,
)
from ..reports.targets import running_page

__all__ = ["BASELINE_KEY", "CASE_KEY", "RESULT_KEY", "SKIP_KEY", "RunResults"]

# user properties of a test report: how rows travel from the fixture (on an xdist worker, maybe) to the
# session, as plain dicts (the to_dict of results' classes) that xdist serializes
RESULT_KEY = "ortdiff"
SKIP_KEY = "ortdiff_skip"
BASELINE_KEY = "ortdiff_baseline"
#: the (provider, dtype) a test was parametrized with
CASE_KEY = "ortdiff_case"
_INTERNAL_KEYS = frozenset({RESULT_KEY, SKIP_KEY, BASELINE_KEY, CASE_KEY})
#: the terminal's matrix shows every test up to this many, beyond only those with a case that did not pass
_MATRIX_ROWS = 40


@dataclass(eq=False)  # a plugin object: hashed by identity
class RunResults:
    """Everything the run's checks and tests produced, kept by the collector (on the xdist controller
    too), written to `json_target` at the end and summarized in the terminal."""

    json_path: str | None = None
    json_target: Path | None = None
    html_path: str | None = None
    html_target: Path | None = None
    show_reports: bool = False
    #: whether this process hands the reports on to the JUnit XML (not an xdist worker, which sends them to
    #: the controller): there the internal properties are taken off each report once read
    hide_internal: bool = False
    #: what the run selected, for the environment in the JSON file and the HTML report
    providers: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    results: list[CheckRow] = field(default_factory=list)
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    skips: list[SkipRow] = field(default_factory=list)
    baselines: list[BaselineRow] = field(default_factory=list)
    json_message: str = ""
    json_failed: bool = False
    html_message: str = ""
    html_failed: bool = False
    interrupted: bool = False
    #: test id -> its place in collection order (the summary's order, whichever order xdist's workers finished in)
    order: dict[str, int] = field(default_factory=dict)

    # -- collecting (hooks: this object is registered as a plugin) --------------------------------
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._ordered(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:  # (the xdist controller collects nothing itself)
        self._ordered(ids)

    def _ordered(self, ids: Any) -> None:
        for nodeid in ids:
            self.order.setdefault(nodeid, len(self.order))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.tests[report.nodeid] = TestOutcome(report.nodeid, "error", message=_message(report))

    @pytest.hookimpl(tryfirst=True)  # (before the JUnit XML's hook writes the report's properties)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is not None:
            entry = self.tests.get(report.nodeid) or TestOutcome(report.nodeid, outcome)
            if OUTCOMES.index(outcome) > OUTCOMES.index(entry.outcome):
                entry = replace(entry, outcome=outcome)
            if outcome in ("failed", "error") and entry.message is None:
                entry = replace(entry, message=_message(report))
            elif outcome == "skipped" and entry.message is None:
                entry = replace(entry, message=_skip_reason(report))
            self.tests[report.nodeid] = entry
        for key, item in report.user_properties:
            value = cast(dict[str, Any], item)
            if key == CASE_KEY:
                if report.nodeid in self.tests:
                    self.tests[report.nodeid] = replace(self.tests[report.nodeid], provider=value["provider"], dtype=value["dtype"])
            elif key == RESULT_KEY and report.when == "call":
                row = CheckRow.from_dict({"test": "", **value})
                # a broken check in a test that xfailed, or that passed anyway (the check ran under
                # pytest.raises), failed as its test expected
                expected = hasattr(report, "wasxfail") or report.passed
                verdict = "passed" if row.passed else ("xfailed" if expected else "failed")
                self.results.append(replace(row, test=report.nodeid + row.suffix, suffix="", outcome=verdict))
            elif key == SKIP_KEY and report.skipped:
                self.skips.append(replace(SkipRow.from_dict(value), test=report.nodeid))
            elif key == BASELINE_KEY and report.when == "call":
                self.baselines.append(replace(BaselineRow.from_dict(value), test=report.nodeid))
        if self.hide_internal:
            # the rows as this plugin stores them (a whole report, a blame table) are not for a JUnit XML,
            # which gets the flat `ortdiff.*` properties instead; the report gets a list of its own (the
            # item's, which later phases share, keeps them)
            report.user_properties = [(k, v) for k, v in report.user_properties if k not in _INTERNAL_KEYS]

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # Ctrl-C, or pytest.exit(): the run stops before its end. (Session.Interrupted, which pytest
        # raises itself after collection errors, is a verdict the file records as errors.)
        self.interrupted = not isinstance(excinfo.value, pytest.Session.Interrupted)

    # -- writing -------------------------------------------------------------------------------
    def mark_running(self) -> None:
        """Replace the targets by incomplete files before any test runs: a run killed before its end
        (SIGKILL, an OOM kill, a CI timeout) must not leave the previous run's green file, which
        `merge --strict` would pass, nor its green HTML report, which a person would believe.
        pytest.UsageError naming the option when one cannot be written."""
        for option, shown, target, write in (
            ("--ortdiff-json", self.json_path, self.json_target, lambda t: ResultsFile.running().write(t)),
            ("--ortdiff-html", self.html_path, self.html_target, lambda t: write_atomically(t, running_page())),
        ):
            if target is None:
                continue
            try:
                write(target)
            except OSError as exc:
                raise pytest.UsageError(f"{option}={shown}: cannot write it: {exc.strerror or exc}") from None

    def results_file(self, environment: bool = True) -> ResultsFile:
        """Everything collected so far, as the --ortdiff-json file holds it (with this machine's environment
        unless `environment` is False: the summary needs none, and it costs a look at installed packages)."""
        env = Environment.current(self.providers, self.dtypes) if environment else Environment()
        return ResultsFile(tuple(self.results), tuple(self.skips), tuple(self.tests.values()), environment=env, baselines=tuple(self.baselines))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # runs inside the terminal reporter's own sessionfinish, before the summary that reports it; under
        # xdist only the controller has targets (the workers' reports reach it through logreport)
        if self.json_target is None and self.html_target is None:
            return
        data = self.results_file()
        if self.interrupted:
            # Ctrl-C (or a test raising KeyboardInterrupt): what ran is kept, the run stays incomplete
            data = data.incomplete(why="interrupted")
        if self.json_target is not None:
            try:
                data.write(self.json_target)
            except OSError as exc:
                # a CI job must not go green without its report
                self.json_message, self.json_failed = f"ortdiff: could not write {self.json_path}: {exc}", True
            else:
                self.json_message = f"ortdiff: wrote {_contents(data)} to {self.json_path}"
        if self.html_target is not None:
            from ..reports.htmlreport import write_html

            try:
                write_html(self.html_target, [data], None)
            except OSError as exc:
                self.html_message, self.html_failed = f"ortdiff: could not write {self.html_path}: {exc}", True
            else:
                self.html_message = f"ortdiff: wrote the HTML report to {self.html_path}"
        if (self.json_failed or self.html_failed) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from ..reports.matrix import pivot

        tr = terminalreporter
        width = _terminal_width(tr)
        data = self.results_file(environment=False)
        rows = _summary_rows(data, self.order)
        if rows:
            tr.write_sep("=", "ortdiff summary")
            for line in _row_table(rows, width):
                tr.write_line(line)
        matrix = pivot([data], ["this run"])
        if matrix.cases > 1:
            # several cases: the same tests side by side, one column per provider × dtype; a long run's
            # matrix keeps the tests with a case that did not pass (the row table above has every check)
            tr.write_sep("-", "ortdiff matrix: tests × provider, dtype")
            shown = matrix.tests if len(matrix.tests) <= _MATRIX_ROWS else matrix.failing_tests()
            if shown:
                for line in matrix.render_text(width or sys.maxsize, notes=False, tests=shown).splitlines():
                    tr.write_line(line)
            if len(shown) < len(matrix.tests):
                passed = len(matrix.tests) - len(shown)
                tr.write_line(f"{passed} of {len(matrix.tests)} tests passed in every case and are not shown (--ortdiff-html has them all)")
        if self.skips:
            tr.write_sep("-", "ortdiff: holes in the provider × dtype matrix")
            grouped: dict[str, int] = {}
            for s in self.skips:
                grouped[s.reason] = grouped.get(s.reason, 0) + 1
            for reason, count in sorted(grouped.items()):
                for line in _wrapped(f"{count} test(s) skipped: {reason}", width):
                    tr.write_line(line)
        _baseline_summary(tr, self.baselines)
        if self.show_reports and self.results:
            from ..numerics.diff import DiffReport

            tr.write_sep("-", "ortdiff reports")
            for row in self.results:
                tr.write_line(f"{row.test} ({row.outcome}; tolerance {row.tolerance or '-'})")
                if row.report is not None:
                    tr.write_line(DiffReport.from_dict(dict(row.report)).render())
                tr.write_line("")
        fused = sys.modules.get("pytest_ortdiff.numerics.diff_triton")  # (imported by a compare on CUDA only)
        if fused is not None and fused.failure():
            for line in _wrapped(f"ortdiff: compare() on CUDA took the torch path (the same numbers, slower): Triton's fused pass could not run here: {fused.failure()}", width):
                tr.write_line(line, yellow=True)
        for message, failed in ((self.json_message, self.json_failed), (self.html_message, self.html_failed)):
            if message:
                tr.write_line(message, red=failed)


def _contents(data: ResultsFile) -> str:
    """"4 check results, 6 test outcomes, 1 skip": what a file holds, each kind counted."""

    def count(n: int, noun: str) -> str:
        return f"{n} {noun}" + ("" if n == 1 else "s")

    parts = [count(len(data.results), "check result"), count(len(data.tests), "test outcome")]
    if data.skips:
        parts.append(count(len(data.skips), "skip"))
    if data.baselines:
        parts.append(count(len(data.baselines), "baseline result"))
    return ", ".join(parts)


def _summary_rows(data: ResultsFile, order: Mapping[str, int] | None = None) -> list[CheckRow]:
    """The summary table's rows: every check's, and after a test's checks a row for the test when it failed
    while its checks passed, or before any check (a missing baseline, an exception): its check rows alone
    would say "passed". Tests without a provider × dtype case are pytest's own business. In collection order
    (`order`: test id -> place; a test's own checks in their order), the same table whichever order xdist's
    workers finished in."""
    rows = list(data.results)
    for extra in data.test_rows():
        if extra.provider is None:
            continue
        own = [i for i, r in enumerate(rows) if r.test == extra.test or r.test.startswith(extra.test + " [")]
        rows.insert(own[-1] + 1 if own else len(rows), extra)
    if order:  # (stable: a test's own rows, and its test row after them, keep their order)
        rows.sort(key=lambda r: order.get(r.test, order.get(r.test.split(" [", 1)[0], len(order))))
    return rows


def _terminal_width(tr: Any) -> int | None:
    """The terminal's width (pytest's), when there is a terminal or $COLUMNS says how wide it is; None for
    output to a file or a pipe (a CI log), which keeps every table whole rather than fitted to a guess."""
    writer = tr._tw
    stream = getattr(writer, "_file", None)
    isatty = getattr(stream, "isatty", None)
    if not ((callable(isatty) and isatty()) or os.environ.get("COLUMNS", "").strip().isdigit()):
        return None
    return int(writer.fullwidth)


def _row_table(rows: list[CheckRow], width: int | None) -> list[str]:
    """The row table, fitted to `width`: as it is when it fits; with the test ids elided in the middle of
    their path when that is enough; else one block per row (the id, then its numbers, then its worst line)."""
    from ..numerics.report import _worst, render_table
    from ..reports.matrix import elide

    lines = render_table(rows).splitlines()
    if width is None or max(len(line) for line in lines) <= width:
        return lines
    test_w = max(len("test"), *(len(r.test) for r in rows))
    room = width - (max(len(line) for line in lines) - test_w)
    if room >= min(test_w, 32):
        return render_table([replace(r, test=elide(r.test, room)) for r in rows]).splitlines()
    from ..numerics.formatting import g

    out: list[str] = []
    for i, r in enumerate(rows):
        if i == 0 or rows[i - 1].test != r.test:  # (a test's own row follows its check's: one id for both)
            out.append(elide(r.test, width))
        if r.max_abs is None and r.max_rel is None:  # a test's own row: what happened to it
            line = f"{r.provider or '-'} {r.dtype or '-'}  {r.outcome or '-'}: {_worst(r)}"
        else:
            line = f"{r.provider or '-'} {r.dtype or '-'}  {r.outcome or '-'}  max abs {g(r.max_abs)}  max rel {g(r.max_rel)}  {_worst(r)}"
        out += _wrapped(line, width, "    ")
    return out


def _wrapped(text: str, width: int | None, indent: str = "") -> list[str]:
    if width is None:
        return [indent + text]
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False) or [indent]


def _baseline_summary(tr: Any, rows: list[BaselineRow]) -> None:
    """What happened to stored baselines: files written, and baselines that are missing or corrupted."""
    written = [r for r in rows if r.action in ("created", "updated", "replaced corrupted")]
    missing = [r for r in rows if r.action == "missing"]
    corrupted = [r for r in rows if r.action == "corrupted"]
    unwritable = [r for r in rows if r.action == "unwritable"]
    if not (written or missing or corrupted or unwritable):
        return
    tr.write_sep("-", "ortdiff baselines")
    if written:
        tr.write_line(f"wrote {len(written)} baseline(s) (--ortdiff-update-baselines); review and commit them:")
        for r in sorted(written, key=lambda r: r.path):
            tr.write_line(f"  {r.action:<18} {r.path}")
    if missing:
        tr.write_line(f"{len(missing)} baseline(s) missing: rerun with --ortdiff-update-baselines to create them")
    if corrupted:
        tr.write_line(f"{len(corrupted)} baseline file(s) corrupted and left untouched:")
        tr.write_line("\n".join(f"  {r.path}" for r in sorted(corrupted, key=lambda r: r.path)))
    if unwritable:
        tr.write_line(f"{len(unwritable)} baseline(s) could not be written (their directory is not writable):")
        tr.write_line("\n".join(f"  {r.path}" for r in sorted(unwritable, key=lambda r: r.path)))


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The line that says why a test failed: the exception's first line (a collection error's last `E`)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:
        lines = str(report.longrepr).splitlines()
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        text = errors[-1] if errors else next((line.strip() for line in lines if line.strip()), "")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= 300 else first[:297] + "..."


def _skip_reason(report: pytest.TestReport) -> str | None:
    """A skip's reason ("not today" from pytest.skip("not today")), None when pytest gives none."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ") or None
    return None


def _outcome(report: pytest.TestReport) -> Outcome | None:
    """This phase's contribution to the test's outcome (None: a passing setup or teardown says nothing)."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    # other outcomes (pytest-rerunfailures' "rerun") are superseded by the next attempt's
    return "passed" if report.passed and report.when == "call" else None
