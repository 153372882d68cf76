"""Result collection across a pytest run, xdist included: the rows the fixtures attach to test reports and
every test's outcome, into the --ortdiff-json file (atomically) and the terminal summary."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from .results import OUTCOMES, BaselineRow, CheckRow, Outcome, ResultsFile, SkipRow, TestOutcome

__all__ = ["BASELINE_KEY", "CASE_KEY", "RESULT_KEY", "SKIP_KEY", "RunResults"]

# user properties of a test report: how rows travel from the fixture (on an xdist worker, maybe) to the
# session, as plain dicts (the to_dict of results' classes) that xdist serializes
RESULT_KEY = "ortdiff"
SKIP_KEY = "ortdiff_skip"
BASELINE_KEY = "ortdiff_baseline"
#: the (provider, dtype) a test was parametrized with
CASE_KEY = "ortdiff_case"


@dataclass(eq=False)  # a plugin object: hashed by identity
class RunResults:
    """Everything the run's checks and tests produced, kept by the collector (on the xdist controller
    too), written to `json_target` at the end and summarized in the terminal."""

    json_path: str | None = None
    json_target: Path | None = None
    show_reports: bool = False
    results: list[CheckRow] = field(default_factory=list)
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    skips: list[SkipRow] = field(default_factory=list)
    baselines: list[BaselineRow] = field(default_factory=list)
    json_message: str = ""
    json_failed: bool = False
    interrupted: bool = False

    # -- collecting (hooks: this object is registered as a plugin) --------------------------------
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.tests[report.nodeid] = TestOutcome(report.nodeid, "error", message=_message(report))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is not None:
            entry = self.tests.get(report.nodeid) or TestOutcome(report.nodeid, outcome)
            if OUTCOMES.index(outcome) > OUTCOMES.index(entry.outcome):
                entry = replace(entry, outcome=outcome)
            if outcome in ("failed", "error") and entry.message is None:
                entry = replace(entry, message=_message(report))
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

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # Ctrl-C, or pytest.exit(): the run stops before its end. (Session.Interrupted, which pytest
        # raises itself after collection errors, is a verdict the file records as errors.)
        self.interrupted = not isinstance(excinfo.value, pytest.Session.Interrupted)

    # -- writing -------------------------------------------------------------------------------
    def mark_running(self) -> None:
        """Replace the target by an incomplete file before any test runs: a run killed before its end
        (SIGKILL, an OOM kill, a CI timeout) must not leave the previous run's green file, which
        `merge --strict` would pass. OSError when it cannot be written."""
        if self.json_target is not None:
            ResultsFile.running().write(self.json_target)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # runs inside the terminal reporter's own sessionfinish, before the summary that reports it; under
        # xdist only the controller has a target (the workers' reports reach it through logreport)
        if self.json_target is None:
            return
        data = ResultsFile(tuple(self.results), tuple(self.skips), tuple(self.tests.values()))
        if self.interrupted:
            # Ctrl-C (or a test raising KeyboardInterrupt): what ran is kept, the run stays incomplete
            data = data.incomplete(why="interrupted")
        try:
            data.write(self.json_target)
        except OSError as exc:
            # a CI job must not go green without its report
            self.json_message, self.json_failed = f"ortdiff: could not write {self.json_path}: {exc}", True
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        else:
            self.json_message = f"ortdiff: wrote {len(self.results)} result(s) to {self.json_path}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from .report import render_table

        tr = terminalreporter
        if self.results:
            tr.write_sep("=", "ortdiff summary")
            for line in render_table(self.results).splitlines():
                tr.write_line(line)
        if self.skips:
            tr.write_sep("-", "ortdiff: holes in the provider × dtype matrix")
            grouped: dict[str, int] = {}
            for s in self.skips:
                grouped[s.reason] = grouped.get(s.reason, 0) + 1
            for reason, count in sorted(grouped.items()):
                tr.write_line(f"{count} test(s) skipped: {reason}")
        _baseline_summary(tr, self.baselines)
        if self.show_reports and self.results:
            from .diff import DiffReport

            tr.write_sep("-", "ortdiff reports")
            for row in self.results:
                tr.write_line(f"{row.test} ({row.outcome}; tolerance {row.tolerance or '-'})")
                if row.report is not None:
                    tr.write_line(DiffReport.from_dict(dict(row.report)).render())
                tr.write_line("")
        if self.json_message:
            tr.write_line(self.json_message, red=self.json_failed)


def _baseline_summary(tr: Any, rows: list[BaselineRow]) -> None:
    """What happened to stored baselines: files written, and baselines that are missing or corrupted."""
    written = [r for r in rows if r.action in ("created", "updated", "replaced corrupted")]
    missing = [r for r in rows if r.action == "missing"]
    corrupted = [r for r in rows if r.action == "corrupted"]
    if not (written or missing or corrupted):
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
