"""Runs the documentation's code blocks, so that no snippet rots (pytest-markdown-docs, the `docs` extra):

    python -m pytest --markdown-docs --markdown-docs-syntax=superfences -m markdown-docs docs

Every python block of a page runs, in a fresh module, in a temporary directory (`tests/` of the checkout is
linked there, for the blocks that import the test suite's T5-like encoder); what it prints is shown only
when it fails. Options go in the block's braces, where MkDocs ignores them:

- `{.python continuation}`: continues the block before it (its names are defined).
- `{.python title="test_x.py" runner:PytestFile}`: the block is a test file; pytest runs it in-process, in a
  directory of its own, and every test in it must pass (none may error). `runner:FailingPytestFile`: the block shows a
  failure: at least one test must fail, and every failure must be a broken check (`OrtDiffFailure`), never a
  TypeError of a snippet that no longer matches the API.
- `fixture:slow`: skipped unless `--docs-slow` is given (the block exports or compiles models: seconds
  each); `fixture:cuda`: skipped without a CUDA GPU. The skip's reason names the option.
- `{.python notest}`: not run (a file included whole, run by its own suite; or a fragment); the page says why.

Shell blocks (bash, console) and output blocks (text) are not run: the command line's flags in them are
checked against each command's `--help` by tests/test_docs.py. (This docstring holds no code fence: with
--markdown-docs, pytest-markdown-docs collects the fences of .py files' docstrings too.)
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

# the plugin's runner API (0.9; private there, hence the docs extra's pin)
from pytest_markdown_docs._runners import DefaultRunner, register_runner

ROOT = Path(__file__).resolve().parent.parent

# notes other work hands in, not yet merged into the pages: neither part of the site nor run
collect_ignore = ["_incoming"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--docs-slow", action="store_true", help="also run the documentation's slow code blocks (fixture:slow)")


def pytest_configure(config: pytest.Config) -> None:
    # the blocks show user code calling the exporters, which warn about their own internals: warnings stay
    # warnings there, not the errors the project's own suite makes them
    config.addinivalue_line("filterwarnings", "ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torch")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning:torch")
    config.addinivalue_line("filterwarnings", "ignore:.*LeafSpec.*is deprecated:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore::torch.jit.TracerWarning")


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block may write files (a converted model, a report): into a directory of its own. The checkout's
    tests/ is linked there, as the blocks that say "from the repository's root" expect."""
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def slow(request: pytest.FixtureRequest) -> None:
    """A block that exports or compiles models (seconds each): run with --docs-slow."""
    if not request.config.getoption("--docs-slow"):
        pytest.skip("slow block (exports or compiles models): run with --docs-slow")


@pytest.fixture
def cuda() -> None:
    """A block for a CUDA GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


@register_runner(default=True)
class QuietRunner(DefaultRunner):
    """The plugin's own runner (the block executed as a module), with what the block prints kept back and
    shown only when it fails."""

    def __init__(self) -> None:
        self.printed: dict[Any, str] = {}

    def runtest(self, test: Any, args: dict[str, Any], **kwargs: Any) -> None:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                super().runtest(test, args, **kwargs)
        finally:
            self.printed[test] = out.getvalue()

    def repr_failure(self, test: Any, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        printed = self.printed.get(test, "")
        tail = f"\nprinted:\n{printed[-4000:]}" if printed else ""
        return f"{super().repr_failure(test, excinfo, style)}{tail}"


class _Reports:
    """A plugin for the inner run: its test and collection reports."""

    def __init__(self) -> None:
        self.reports: list[pytest.TestReport | pytest.CollectReport] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.reports.append(report)


@register_runner()
class PytestFile(DefaultRunner):
    """The block is a test file: pytest runs it in this process, in a directory of its own, and every test
    in it must pass. Not through pytester, which would drop the modules the run imports first (torch's
    dynamo, the exporter's), which torch cannot import twice."""

    expect_failures = False

    def runtest(self, test: Any, args: dict[str, Any], **kwargs: Any) -> None:
        page = Path(test.source_path).relative_to(ROOT).with_suffix("")
        name = "test_" + re.sub(r"\W", "_", str(page)) + f"_line_{test.start_line}.py"
        collected = _Reports()
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="docs-block-") as work:
            path = Path(work) / name
            path.write_text(test.source)
            os.chdir(work)  # where the test file reads and writes files
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    argv = ["-p", "no:cacheprovider", "--capture=sys", "--import-mode=importlib", "-rfEs"]
                    pytest.main([*argv, "--rootdir", work, "--basetemp", str(Path(work) / "tmp"), str(path)], plugins=[collected])
            finally:
                os.chdir(cwd)
        printed = out.getvalue()[-6000:]
        reports = collected.reports
        errors = [r for r in reports if r.failed and getattr(r, "when", "collect") != "call"]
        failed = [r for r in reports if r.failed and getattr(r, "when", "") == "call"]
        passed = [r for r in reports if r.passed and getattr(r, "when", "") == "call"]
        if errors:
            raise AssertionError(f"the test file errors:\n{printed}")
        if self.expect_failures:
            if not failed:
                raise AssertionError(f"the block shows a failing check, but every test passed:\n{printed}")
            other = [r.nodeid for r in failed if "OrtDiffFailure" not in r.longreprtext]
            if other:
                raise AssertionError(f"{other} failed otherwise than by a broken check (OrtDiffFailure):\n{printed}")
        elif failed or not passed:
            raise AssertionError(f"the block's tests must pass (passed {len(passed)}, failed {len(failed)}):\n{printed}")

    def repr_failure(self, test: Any, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return f"{test.source_path}:{test.start_line}: {excinfo.value}"


@register_runner()
class FailingPytestFile(PytestFile):
    """The block is a test file that shows a failure: at least one test fails, each by a broken check."""

    expect_failures = True


os.environ.setdefault("ORTDIFF_PROGRESS", "0")
