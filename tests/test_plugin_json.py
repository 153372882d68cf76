"""The CI side of the pytest surface (pytester): --ortdiff-json records every test's outcome besides the
check rows, is written even without checks (under xdist by the controller), is validated up front and
written atomically; `merge --strict` fails on failed tests without checks. Also: marker dtypes and empty
option values are usage errors, and NaN/Inf mismatches read as such in the summary table."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SEED_CHECK = """
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 8, "c": 16}, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
"""

# a job where only one test reaches its check: the others fail, error or skip before it, or have none
MIXED = f"""
import pytest
from pytest_ortdiff import models

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_checked(ortdiff):
{SEED_CHECK}
def test_fails_before_check(ortdiff):
    raise ValueError("bad feeds")
{SEED_CHECK}
def test_no_check():
    assert 1 == 2

def test_setup_error(ortdiff, broken):
    pass

def test_skipped(ortdiff):
    pytest.skip("not today")
"""


def _tests(path: Path) -> dict[str, dict]:
    return {t["test"]: t for t in json.loads(path.read_text())["tests"]}


def test_json_records_every_test_outcome(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(passed=1, failed=2, errors=1, skipped=1)
    data = json.loads((pytester.path / "job.json").read_text())
    assert [r["test"] for r in data["results"]] == ["test_mixed.py::test_checked[CPU-float32]"]
    assert _tests(pytester.path / "job.json") == {
        "test_mixed.py::test_checked[CPU-float32]": {"test": "test_mixed.py::test_checked[CPU-float32]", "outcome": "passed", "provider": "CPU", "dtype": "float32"},
        "test_mixed.py::test_fails_before_check[CPU-float32]": {
            "test": "test_mixed.py::test_fails_before_check[CPU-float32]",
            "outcome": "failed",
            "provider": "CPU",
            "dtype": "float32",
            "message": "ValueError: bad feeds",
        },
        "test_mixed.py::test_no_check": {"test": "test_mixed.py::test_no_check", "outcome": "failed", "message": "assert 1 == 2"},
        "test_mixed.py::test_setup_error[CPU-float32]": {
            "test": "test_mixed.py::test_setup_error[CPU-float32]",
            "outcome": "error",
            "provider": "CPU",
            "dtype": "float32",
            "message": "RuntimeError: fixture broke",
        },
        "test_mixed.py::test_skipped[CPU-float32]": {
            "test": "test_mixed.py::test_skipped[CPU-float32]",
            "outcome": "skipped",
            "provider": "CPU",
            "dtype": "float32",
            "message": "not today",  # (the skip's reason, which the matrix shows)
        },
    }


def test_merge_strict_fails_on_tests_that_failed_without_a_check(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    pytester.runpytest("--ortdiff-json=job.json")
    out = cli("merge", "job.json", "--strict", cwd=pytester.path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "1 check(s) from 1 file(s): 1 passed, 0 failed" in lines
    assert "5 test(s): 1 passed, 2 failed, 1 error(s), 1 skipped" in lines
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in lines[1:5])}
    assert rows["test_mixed.py::test_checked[CPU-float32]"][-1] == "passed"
    assert rows["test_mixed.py::test_fails_before_check[CPU-float32]"] == ["CPU", "float32", "-", "-", "-", "no check ran", "failed"]
    assert rows["test_mixed.py::test_no_check"] == ["-", "-", "-", "-", "-", "no check ran", "failed"]
    assert rows["test_mixed.py::test_setup_error[CPU-float32]"] == ["CPU", "float32", "-", "-", "-", "no check ran", "error"]
    assert "failed: test_mixed.py::test_fails_before_check[CPU-float32]: ValueError: bad feeds" in lines
    assert "errored: test_mixed.py::test_setup_error[CPU-float32]: RuntimeError: fixture broke" in lines
    markdown = cli("merge", "job.json", "--markdown", cwd=pytester.path)
    assert markdown.returncode == 0  # reported, not an error, without --strict
    assert "| test_mixed.py::test_no_check | - | - | - | - | - | no check ran | failed |" in markdown.stdout.splitlines()


def test_json_is_written_when_no_check_ran(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    assert False\n\ndef test_b():\n    pass\n")
    result = pytester.runpytest("--ortdiff-json=jobs/job.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ortdiff: wrote 0 check results, 2 test outcomes to jobs*job.json"])
    data = json.loads((pytester.path / "jobs" / "job.json").read_text())
    assert data["results"] == [] and data["skips"] == []
    assert [(t["test"], t["outcome"]) for t in data["tests"]] == [("test_plain.py::test_a", "failed"), ("test_plain.py::test_b", "passed")]
    out = cli("merge", "jobs/job.json", "--strict", cwd=pytester.path)
    assert out.returncode == 1
    assert "2 test(s): 1 passed, 1 failed, 0 error(s), 0 skipped" in out.stdout.splitlines()


def test_json_records_a_collection_error(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_ok="def test_a():\n    pass\n", test_broken="import no_such_module_here\n")
    result = pytester.runpytest("--ortdiff-json=job.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    tests = _tests(pytester.path / "job.json")
    assert tests["test_broken.py"]["outcome"] == "error"
    assert "No module named 'no_such_module_here'" in tests["test_broken.py"]["message"]
    out = cli("merge", "job.json", "--strict", cwd=pytester.path)
    assert out.returncode == 1
    assert re.split(r"\s{2,}", out.stdout.splitlines()[1]) == ["test_broken.py", "-", "-", "-", "-", "-", "no check ran", "error"]


def test_summary_json_and_html_under_xdist(pytester: pytest.Pytester, seed_test: Callable[..., str], xdist_args: list[str]) -> None:
    """One run on two workers: the summary table has every worker's rows, the matrix sets the run's two cases
    side by side, and the controller alone writes the JSON file (every test's outcome, the job's environment)
    and the HTML report, saying what it wrote (trip-up 5: not "3 result(s)" for a file of 3 checks and 7 tests)."""
    pytester.makepyfile(test_mixed=MIXED, test_seed=seed_test("dtypes=['float32', 'float16']"))
    result = pytester.runpytest(*xdist_args, "--ortdiff-json=job.json", "--ortdiff-html=reports/run.html", "--junitxml=junit.xml")
    result.assert_outcomes(passed=3, failed=2, errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*= ortdiff summary =*"])
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float16[]] * passed"])
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float32[]] * passed"])
    result.stdout.fnmatch_lines(
        [
            "*- ortdiff matrix: tests × provider, dtype -*",
            "test * CPU float32 * CPU float16",
            "test_mixed.py",
            "  test_checked * ok * -",
            "  test_fails_before_check * FAIL * -",
            "  test_setup_error * ERROR * -",
            "  test_skipped * skip * -",
            "test_seed.py",
            "  test_lnmm * ok * (* ulp) * ok * (* ulp)",
        ]
    )
    result.stdout.fnmatch_lines(["ortdiff: wrote 3 check results, 7 test outcomes to job.json", "ortdiff: wrote the HTML report to reports/run.html"])
    data = json.loads((pytester.path / "job.json").read_text())
    assert data["schema"] == 3
    env = data["environment"]
    assert (env["providers"], env["dtypes"]) == (["CPU"], ["float32"])  # what the run selected (the marker narrows it per test)
    assert env["onnxruntime"] == __import__("onnxruntime").__version__ and env["torch"] == __import__("torch").__version__
    tests = _tests(pytester.path / "job.json")
    assert {k: v["outcome"] for k, v in tests.items() if k.startswith("test_mixed")} == {
        "test_mixed.py::test_checked[CPU-float32]": "passed",
        "test_mixed.py::test_fails_before_check[CPU-float32]": "failed",
        "test_mixed.py::test_no_check": "failed",
        "test_mixed.py::test_setup_error[CPU-float32]": "error",
        "test_mixed.py::test_skipped[CPU-float32]": "skipped",
    }
    assert tests["test_mixed.py::test_fails_before_check[CPU-float32]"]["provider"] == "CPU"
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith("job")) == ["job.json"]
    html = (pytester.path / "reports" / "run.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "test_lnmm" in html  # (its content: tests/test_htmlreport.py)
    # the workers' check rows reach the controller's JUnit XML as flat properties, equal to the JSON's numbers
    import xml.etree.ElementTree as ET

    rows = {r["test"]: r for r in data["results"]}
    for case in ET.parse(pytester.path / "junit.xml").iter("testcase"):
        if case.get("name", "").startswith("test_lnmm"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            row = rows[f"test_seed.py::{case.get('name')}"]
            assert (props["ortdiff.provider"], props["ortdiff.dtype"], props["ortdiff.result"]) == ("CPU", row["dtype"], "passed")
            assert float(props["ortdiff.max_abs"]) == pytest.approx(row["max_abs"], rel=1e-5)
            assert props["ortdiff.worst"] == row["worst"]
            assert all(name.startswith("ortdiff.") for name in props), sorted(props)  # (not the plugin's own entries)


def test_json_xfail_and_teardown_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_x="""
        import pytest

        @pytest.fixture
        def bad_teardown():
            yield
            raise RuntimeError("teardown broke")

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False

        def test_teardown(bad_teardown):
            pass
        """
    )
    pytester.runpytest("--ortdiff-json=job.json")
    tests = _tests(pytester.path / "job.json")
    assert tests["test_x.py::test_xfail"]["outcome"] == "xfailed"
    assert tests["test_x.py::test_teardown"]["outcome"] == "error"
    assert tests["test_x.py::test_teardown"]["message"] == "RuntimeError: teardown broke"


@pytest.mark.parametrize(
    ("make", "arg", "message"),
    [
        ("dir", "--ortdiff-json=jobs", "*--ortdiff-json=jobs: jobs is a directory; give a file path such as jobs/job.json*"),
        ("file", "--ortdiff-json=jobs/job.json", "*--ortdiff-json=jobs/job.json: jobs is a file, not a directory*"),
        ("dir", "--ortdiff-html=jobs", "*--ortdiff-html=jobs: jobs is a directory; give a file path such as jobs/ortdiff.html*"),
    ],
    ids=["existing-directory", "parent-is-a-file", "html-existing-directory"],
)
def test_bad_json_path_is_a_usage_error_before_any_test_runs(pytester: pytest.Pytester, make: str, arg: str, message: str) -> None:
    if make == "dir":
        (pytester.path / "jobs").mkdir()
    else:
        (pytester.path / "jobs").write_text("not a directory")
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest(arg)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "passed" not in result.stdout.str()
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith("jobs")) == ["jobs"]


def test_json_write_failure_is_reported_and_leaves_no_tmp(pytester: pytest.Pytester) -> None:
    # the target turns into a directory during the run: the write fails, says so, and fails the run
    pytester.makepyfile(test_a="import os\n\ndef test_a():\n    os.remove('job.json')  # (the run's incomplete file)\n    os.mkdir('job.json')\n")
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["ortdiff: could not write job.json: *"])
    assert (pytester.path / "job.json").is_dir()
    assert [p.name for p in pytester.path.rglob("*.tmp")] == []


def test_json_rewrite_keeps_no_tmp(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    (pytester.path / "job.json").write_text('{"results": [], "skips": []}')  # (an earlier run's, of an early version)
    pytester.runpytest("--ortdiff-json=job.json").assert_outcomes(passed=1)
    assert json.loads((pytester.path / "job.json").read_text())["tests"][0]["outcome"] == "passed"
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith("job")) == ["job.json"]


# -- marker dtypes and empty option values ------------------------------------------------------------


def test_marker_integer_dtype_is_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad="import pytest\n\n@pytest.mark.ortdiff(dtypes=['int32'])\ndef test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.ortdiff on test_bad.py::test_a: int32 is not a floating dtype to test; valid: float32, float16, bfloat16, float64*"])


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("--ort-dtypes=", "*--ort-dtypes is empty; give e.g. float32,float16*"),
        ("--ort-dtypes=,", "*--ort-dtypes is empty; give e.g. float32,float16*"),
        ("--ort-providers=", "*--ort-providers is empty; give e.g. CPU,CUDA*"),
        # issue 12, item 5: an unset CI variable must not quietly store baselines in the default place
        ("--ortdiff-baseline-dir=", "*--ortdiff-baseline-dir is empty; give a directory such as tests/baselines*"),
        ("--ortdiff-baseline-dir=  ", "*--ortdiff-baseline-dir is empty; give a directory such as tests/baselines*"),
    ],
)
def test_empty_option_is_a_usage_error(pytester: pytest.Pytester, arg: str, message: str) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest(arg)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


# -- NaN/Inf mismatches in the summary ----------------------------------------------------------------


def test_summary_names_nan_mismatches(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    # a baseline of finite values, then a run whose outputs are NaN in 50 of 256 places
    pytester.makepyfile(
        test_nan="""
        import os
        import torch

        def test_a(ortdiff):
            x = torch.zeros(256)
            x[100] = 0.5
            if os.path.exists("nan_mode"):
                x[:50] = float("nan")
                x[100] = 0.25
            ortdiff.check_baseline("out", x)
        """
    )
    pytester.runpytest("--ortdiff-update-baselines").assert_outcomes(passed=1)
    (pytester.path / "nan_mode").write_text("")
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["test_nan.py::test_a[[]CPU-float32[]] [[]baseline out[]]  CPU * float32  0.25 * 50 NaN, 0 Inf mismatches  failed"])
    out = cli("merge", "job.json", cwd=pytester.path)
    assert "50 NaN, 0 Inf mismatches" in out.stdout


def test_expected_check_failures_do_not_fail_merge_strict(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    """A check that fails inside an xfail test, or inside pytest.raises, failed as the test expected:
    its row says "xfailed", and a green pytest run stays green under `merge --strict`."""
    pytester.makepyfile(
        test_x="""
        import pytest
        import torch
        from pytest_ortdiff import models
        from pytest_ortdiff.plugin.fixtures import OrtDiffFailure

        BROKEN = {("", "MatMul"): lambda x, w: torch.matmul(x, w) + 1.0}

        @pytest.mark.xfail(reason="known: MatMul is off by one")
        def test_known(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
            ortdiff.check(model, feeds, kernels=BROKEN)

        def test_caught(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
            with pytest.raises(OrtDiffFailure):
                ortdiff.check(model, feeds, kernels=BROKEN)

        def test_ok(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
            ortdiff.check(model, feeds)
        """
    )
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(passed=2, xfailed=1)
    rows = {r["test"]: r["outcome"] for r in json.loads((pytester.path / "job.json").read_text())["results"]}
    assert rows == {
        "test_x.py::test_known[CPU-float32]": "xfailed",
        "test_x.py::test_caught[CPU-float32]": "xfailed",
        "test_x.py::test_ok[CPU-float32]": "passed",
    }
    result.stdout.fnmatch_lines(["*test_x.py::test_known[[]CPU-float32[]]*xfailed*"])
    out = cli("merge", "job.json", "--strict", cwd=pytester.path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 check(s) from 1 file(s): 1 passed, 0 failed, 2 expected to fail (xfailed)" in out.stdout


def test_a_model_built_for_another_dtype_warns(pytester: pytest.Pytester) -> None:
    """Forgetting dtype=ortdiff.dtype runs the float32 model in the float16 case under float16's
    looser tolerance: the case warns, naming the fix."""
    pytester.makepyfile(
        test_d="""
        import pytest
        from pytest_ortdiff import models

        @pytest.mark.ortdiff(dtypes=["float32", "float16"])
        def test_forgot(ortdiff):
            model = models.layer_norm_matmul_add(dtype="float32")
            feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
            ortdiff.check(model, feeds)
        """
    )
    result = pytester.runpytest("-W", "default")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*test_d.py::test_forgot[[]CPU-float16[]]*",
            "*OrtDiffDtypeWarning: this case is float16, but the model's floating inputs and outputs are float32: "
            "build it for the case, e.g. models.layer_norm_matmul_add(dtype=ortdiff.dtype)*",
        ]
    )
    # the float16 row says so too (with warnings ignored, a green float16 cell was the only sign): its check ran in float32
    row = next(line for line in result.stdout.lines if line.startswith("test_d.py::test_forgot[CPU-float16]  CPU"))
    assert "the model is float32, not this case's float16: checked in float32" in row and row.rstrip().endswith("passed")
    float32_row = next(line for line in result.stdout.lines if line.startswith("test_d.py::test_forgot[CPU-float32]  CPU"))
    assert "not this case's" not in float32_row


# -- a run that does not finish; the report's temporary file (issue 12, items 3 and 18) -------------------


def test_a_killed_run_never_leaves_the_previous_green_file(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    pytester.runpytest("--ortdiff-json=job.json").assert_outcomes(passed=1)
    assert cli("merge", "job.json", "--strict", cwd=pytester.path).returncode == 0
    # the next run fails, then is killed before it can write its results
    pytester.makepyfile(test_a="import os, signal\n\ndef test_a():\n    assert False\n\ndef test_b():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    pytester.runpytest_subprocess("--ortdiff-json=job.json", "-p", "no:cacheprovider")
    out = cli("merge", "job.json", "--strict", cwd=pytester.path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(line.startswith("errored: pytest run (did not finish): started ") for line in out.stdout.splitlines()), out.stdout
    data = json.loads((pytester.path / "job.json").read_text())
    assert data["complete"] is False and data["results"] == []
    # a run that finishes writes a complete file again
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    pytester.runpytest("--ortdiff-json=job.json").assert_outcomes(passed=1)
    assert json.loads((pytester.path / "job.json").read_text())["complete"] is True
    assert cli("merge", "job.json", "--strict", cwd=pytester.path).returncode == 0


def test_an_interrupted_run_writes_an_incomplete_file(pytester: pytest.Pytester, cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n\ndef test_b():\n    raise KeyboardInterrupt\n")
    pytester.inline_run("--ortdiff-json=job.json", no_reraise_ctrlc=True)
    data = json.loads((pytester.path / "job.json").read_text())
    assert data["complete"] is False
    assert [t["outcome"] for t in data["tests"] if t["test"] == "test_a.py::test_a"] == ["passed"]  # what ran is kept
    assert cli("merge", "job.json", "--strict", cwd=pytester.path).returncode == 1


@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="needs symlinks")
def test_the_json_file_is_never_written_through_a_symlink(pytester: pytest.Pytester) -> None:
    """Someone who can create files next to the report cannot have another file overwritten: neither a
    link at the report's own name nor at a temporary name is followed."""
    import os

    victim = pytester.path / "victim.json"
    victim.write_text('{"results": [], "skips": []}')  # (a report: a link to anything else is a usage error)
    os.symlink(victim, pytester.path / "job.json")
    for name in ("job.json.tmp", ".job.json.tmp", "job.json~", ".job.json.swp"):
        os.symlink(victim, pytester.path / name)
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    pytester.runpytest("--ortdiff-json=job.json").assert_outcomes(passed=1)
    assert victim.read_text() == '{"results": [], "skips": []}'
    target = pytester.path / "job.json"
    assert not target.is_symlink() and json.loads(target.read_text())["tests"][0]["outcome"] == "passed"
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


# -- the terminal summary: what happened to each test, within the terminal's width (issue 14) -----------------


LONG_ID_TEST = """
import pytest
import torch
from pytest_ortdiff import models

@pytest.mark.ortdiff(dtypes=["float32", "float16"])
@pytest.mark.parametrize("rows", [3])
def test_layer_norm_matmul_add_then_compared_with_its_stored_baseline(ortdiff, rows):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 1, "b": rows, "c": 8}, seed=0)
    ortdiff.check(model, feeds)
    ortdiff.check_baseline("out", torch.zeros(4))  # none stored: the test fails after its check passed
"""


def test_summary_fits_the_terminal_and_says_a_missing_baseline_failed_the_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trip-ups 1 and 8: under an 80-column terminal every ortdiff table fits (test ids elided in the middle,
    the parametrize id kept), and a test whose check passed but whose baseline is missing gets a row that
    says so, not only its check's "passed"; the matrix sets float32 and float16 side by side."""
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile(test_a_module_with_a_long_name_for_numerical_regression_checks=LONG_ID_TEST)
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(failed=2)
    lines = result.stdout.lines
    ours = lines[lines.index(next(line for line in lines if " ortdiff summary " in line)) : lines.index(next(line for line in lines if " short test summary info " in line))]
    assert max(map(len, ours)) <= 80, "\n".join(line for line in ours if len(line) > 80)
    for dtype in ("float32", "float16"):
        i = ours.index(next(line for line in ours if line.endswith(f"[CPU-{dtype}-3]")))
        assert ours[i].startswith("test_a…") and ".py::test_layer_no…" in ours[i] and len(ours[i]) == 80  # (the id is 142 characters)
        assert ours[i + 1].startswith(f"    CPU {dtype}  passed  max abs ")  # the check (its worst line may wrap)
        j = next(j for j in range(i + 2, len(ours)) if not ours[j].startswith("      "))
        assert ours[j] == f"    CPU {dtype}  failed: baseline 'out' missing"  # the test
    matrix = ours[ours.index(next(line for line in ours if " ortdiff matrix: " in line)) + 1 :]
    assert matrix[0].split() == ["test", "CPU", "float32", "CPU", "float16"]
    assert matrix[1] == "test_a_module_with_a_long_name_for_numerical_regression_checks.py"  # (a module's tests under it)
    assert matrix[2].startswith("  test_layer…") and "_baseline[3]  FAIL " in matrix[2] and matrix[2].count("FAIL") == 2
    # trip-up 5: what was written, counted by kind
    result.stdout.fnmatch_lines(["ortdiff: wrote 2 check results, 2 test outcomes, 2 baseline results to job.json"])
    baselines = json.loads((pytester.path / "job.json").read_text())["baselines"]
    assert [(b["action"], b["passed"], b["max_abs"], b["message"].splitlines()[0][:22]) for b in baselines] == [("missing", False, None, "ortdiff: no baseline '")] * 2


# -- a report path that holds something else; the HTML of a killed run (issue 29, items 1 and 6) ---------------

MODULE = "def test_a(ortdiff):\n    pass\n"  # (with a provider x dtype case: the HTML report lists it)
#: the head of an HTML report written before reports carried their generator marker
LEGACY_HTML = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>pytest-ortdiff report</title><style></style></head><body>old</body></html>'


@pytest.mark.parametrize("option", ["--ortdiff-json", "--ortdiff-html"])
def test_a_report_path_holding_a_test_module_is_a_usage_error(pytester: pytest.Pytester, option: str) -> None:
    """`pytest --ortdiff-json test_models.py` (a space instead of `=`): the option takes the module as its path;
    the run stops before any test with the path and the fix, and the module is untouched byte for byte."""
    pytester.makepyfile(test_models=MODULE)
    before = (pytester.path / "test_models.py").read_bytes()
    result = pytester.runpytest(option, "test_models.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*{option}=test_models.py: test_models.py exists and is not a report written by pytest-ortdiff, "
            f"so it is not overwritten: give the report a path of its own, e.g. {option}=*"
        ]
    )
    assert "passed" not in result.stdout.str()
    assert (pytester.path / "test_models.py").read_bytes() == before
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.endswith(".tmp")) == []


@pytest.mark.parametrize(
    ("option", "name", "content"),
    [
        ("--ortdiff-json", "job.json", '{"name": "my settings", "results": 3}'),
        ("--ortdiff-json", "job.json", "not json"),
        ("--ortdiff-json", "job.json", b"\x89PNG\r\n\x1a\n\x00\x00"),
        ("--ortdiff-html", "r.html", "<!DOCTYPE html><html><title>my page</title></html>"),
        # our JSON is not an HTML report (nor the other way round): a CI job's results are not written over
        ("--ortdiff-html", "r.html", '{\n "schema": 3,\n "complete": true,\n "results": []}'),
        ("--ortdiff-json", "job.json", LEGACY_HTML),
    ],
    ids=["json-of-another-tool", "text", "binary", "html-of-another-tool", "our-json-as-html", "our-html-as-json"],
)
def test_a_report_path_holding_a_foreign_file_is_a_usage_error(pytester: pytest.Pytester, option: str, name: str, content: str | bytes) -> None:
    pytester.makepyfile(test_a=MODULE)
    target = pytester.path / name
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = pytester.runpytest(f"{option}={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}={name}: {name} exists and is not a report written by pytest-ortdiff*"])
    assert target.read_bytes() == (content if isinstance(content, bytes) else content.encode())


@pytest.mark.parametrize(
    ("option", "name", "content"),
    [
        ("--ortdiff-json", "job.json", ""),
        ("--ortdiff-json", "job.json", '{"results": [], "skips": []}'),  # the first versions' file (schema 1)
        ("--ortdiff-json", "job.json", '{\n "schema": 9,\n "complete": true,\n "results": []\n}'),  # a newer version's
        ("--ortdiff-html", "r.html", ""),
        ("--ortdiff-html", "r.html", LEGACY_HTML),
    ],
    ids=["empty-json", "schema-1-json", "newer-json", "empty-html", "legacy-html"],
)
def test_a_report_of_ours_is_replaced(pytester: pytest.Pytester, option: str, name: str, content: str) -> None:
    pytester.makepyfile(test_a=MODULE)
    (pytester.path / name).write_text(content)
    result = pytester.runpytest(f"{option}={name}")
    result.assert_outcomes(passed=1)
    text = (pytester.path / name).read_text()
    assert ('"outcome": "passed"' in text) if option == "--ortdiff-json" else ("test_a" in text and "did not finish" not in text)
    # and the report written is one of ours: the next run replaces it again
    pytester.runpytest(f"{option}={name}").assert_outcomes(passed=1)


def test_one_path_for_both_reports_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a=MODULE)
    result = pytester.runpytest("--ortdiff-json=out/r", "--ortdiff-html=out/./r")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ortdiff-json and --ortdiff-html name one file (out/r): give each report its own path*"])
    assert not (pytester.path / "out").exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="needs symlinks")
def test_a_report_path_linked_to_a_foreign_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    import os

    pytester.makepyfile(test_a=MODULE)
    before = (pytester.path / "test_a.py").read_bytes()
    os.symlink("test_a.py", pytester.path / "job.json")
    result = pytester.runpytest("--ortdiff-json=job.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ortdiff-json=job.json: job.json exists and is not a report written by pytest-ortdiff*"])
    assert (pytester.path / "job.json").is_symlink() and (pytester.path / "test_a.py").read_bytes() == before


def test_a_killed_run_never_leaves_the_previous_green_html_report(pytester: pytest.Pytester) -> None:
    """Item 6: the HTML report is replaced by an "incomplete run" page when the run starts, so a run killed with
    SIGKILL leaves that page, never the previous run's green report; a run that finishes writes its report."""
    pytester.makepyfile(test_a=MODULE)
    pytester.runpytest("--ortdiff-html=r.html").assert_outcomes(passed=1)
    green = (pytester.path / "r.html").read_bytes()
    assert b"test_a" in green
    pytester.makepyfile(test_a="import os, signal\n\ndef test_a(ortdiff):\n    assert False\n\ndef test_b():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    result = pytester.runpytest_subprocess("--ortdiff-html=r.html", "-p", "no:cacheprovider")
    assert result.ret == -9  # (killed: it wrote nothing at its end)
    page = (pytester.path / "r.html").read_text()
    assert page.encode() != green and "test_a" not in page
    assert "<title>pytest-ortdiff report: run did not finish</title>" in page
    assert re.search(r"The pytest run that writes this report started \S+ \S+ UTC \(pid \d+\) and did not finish", page), page
    assert '<meta name="generator" content="pytest-ortdiff">' in page
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith(("r.", ".r."))) == ["r.html"]
    # a run that finishes replaces the page with its report
    pytester.makepyfile(test_a=MODULE)
    pytester.runpytest("--ortdiff-html=r.html").assert_outcomes(passed=1)
    report = (pytester.path / "r.html").read_text()
    assert "test_a" in report and "did not finish" not in report


def test_a_check_on_an_empty_feed_fails_the_test_and_its_summary_row(pytester: pytest.Pytester) -> None:
    """Issue 29, item 7: ortdiff.check with torch.zeros(0, 4) compared 0 elements: the test fails saying so, and
    its summary row and JSON row read failed, with no numbers."""
    pytester.makepyfile(
        test_empty="""
        import torch
        from onnx import TensorProto, helper

        def test_empty(ortdiff):
            graph = helper.make_graph(
                [helper.make_node("Relu", ["x"], ["y"])], "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
            )
            ortdiff.check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), {"x": torch.zeros(0, 4)})
        """
    )
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(failed=1)
    why = "compared 0 elements: every output is empty (y: float32[0x4]) for the feeds given (empty: x [0, 4]); feed a non-empty input"
    glob = re.sub(r"([\[\]])", r"[\1]", why)
    result.stdout.fnmatch_lines(["*OrtDiffFailure: ortdiff: torch evaluator vs onnxruntime CPU float32: compared 0 elements, not a pass", f"*- {glob}"])
    result.stdout.fnmatch_lines([f"test_empty.py::test_empty[[]CPU-float32[]] * CPU * float32 * -  * - * {glob}  failed"])
    (row,) = json.loads((pytester.path / "job.json").read_text())["results"]
    assert (row["passed"], row["outcome"], row["max_abs"], row["worst"]) == (False, "failed", None, why)
