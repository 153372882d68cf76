"""Issue 14: every check's numbers reach `--junitxml` as flat properties (`ortdiff.max_abs`, ...), on one
process and under xdist, with the values an independent float64 numpy reference gives for the same outputs;
and the pure function behind them (names per check, the oracle verdict, nothing made up)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytest_ortdiff import OrtRunner, TorchEvaluator, models
from pytest_ortdiff.numerics.report import junit_properties
from pytest_ortdiff.numerics.results import CheckRow

DIMS = {"a": 2, "b": 8, "c": 16}

MODULE = f"""
import pytest
from pytest_ortdiff import models

DIMS = {DIMS!r}

@pytest.mark.ortdiff(dtypes=["float32"])
def test_default_tolerance(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    ortdiff.check(model, feeds)
    ortdiff.check(model, feeds, reference="float64")

@pytest.mark.ortdiff(dtypes=["float16"], budget={{1e-6: 0.0}})
def test_budget_broken(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    ortdiff.check(model, models.random_feeds(model, dims=DIMS, seed=0))
"""


def _properties(xml: Path) -> dict[str, dict[str, str]]:
    """testcase name -> its properties (the ortdiff.* ones)."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        out[case.get("name", "")] = {k: v for k, v in props.items() if k.startswith("ortdiff.")}
    return out


def _outputs(dtype: str) -> dict[str, np.ndarray]:
    """The output of onnxruntime, the torch evaluator and the float64 oracle (cast to the dtype), flat."""
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    got = OrtRunner(model).run(None, feeds)[0]
    return {
        "ort": got.numpy().reshape(-1),
        "torch": TorchEvaluator(model).run(None, feeds)[0].numpy().reshape(-1),
        "oracle": TorchEvaluator(model, compute_dtype=torch.float64).run(None, feeds)[0].to(got.dtype).numpy().reshape(-1),
    }


def _numbers(e: np.ndarray, g: np.ndarray) -> dict[str, Any]:
    """max abs / rel / ulp, the floored ones and the count that differ (in all, and by more than 1e-6)
    of `g` against `e`, in numpy: |e - g| in float32, ratios in float64, ULPs from the bit patterns, the
    floor the RMS of the expected values rounded to a power of two."""
    info = np.finfo(e.dtype)
    bits = {np.float32: (np.uint32, 32), np.float16: (np.uint16, 16)}[e.dtype.type]
    d = np.abs(e.astype(np.float32) - g.astype(np.float32)).astype(np.float64)
    e64 = e.astype(np.float64)
    rms = math.sqrt(float(np.mean(e64**2)))
    floor = max(2.0 ** round(math.log2(rms)), float(info.tiny))
    a = np.maximum(np.abs(e64), floor)
    p = info.nmant
    ordered = [np.where(x.view(bits[0]) >> (bits[1] - 1), -(x.view(bits[0]).astype(np.int64) & (2 ** (bits[1] - 1) - 1)), x.view(bits[0]).astype(np.int64)) for x in (e, g)]
    return {
        "max_abs": float(d.max()),
        "max_rel": float((d / np.maximum(np.abs(e64), float(info.tiny))).max()),
        "max_ulp": float(np.abs(ordered[0] - ordered[1]).max()),
        "max_rel_floored": float((d / a).max()),
        "max_ulp_floored": float((d / 2.0 ** np.floor(np.log2(a))).max()) * 2.0**p,
        "differ": int(np.count_nonzero(d)),
        "above_1e-6": int(np.count_nonzero(d > 1e-6)),
    }


@pytest.fixture(scope="module")
def expected_numbers() -> dict[str, dict[str, Any]]:
    f32, f16 = _outputs("float32"), _outputs("float16")
    return {
        "ort32": _numbers(f32["torch"], f32["ort"]),
        "ort_vs_oracle32": _numbers(f32["oracle"], f32["ort"]),
        "torch_vs_oracle32": _numbers(f32["oracle"], f32["torch"]),
        "ort16": _numbers(f16["torch"], f16["ort"]),
    }


def _check_values(props: dict[str, str], prefix: str, ref: dict[str, Any]) -> None:
    for key in ("max_abs", "max_rel", "max_ulp", "max_rel_floored", "max_ulp_floored"):
        assert float(props[f"{prefix}.{key}"]) == pytest.approx(ref[key], rel=1e-5), key  # (6 digits)


def _assert_properties(props: dict[str, dict[str, str]], expected_numbers: dict[str, dict[str, Any]]) -> None:
    p = props["test_default_tolerance[CPU-float32]"]
    assert (p["ortdiff.provider"], p["ortdiff.dtype"], p["ortdiff.result"]) == ("CPU", "float32", "passed")
    _check_values(p, "ortdiff", expected_numbers["ort32"])
    # issue 14 (2): no budget was set, so no budget line: the rule that judged it (float32's defaults)
    assert p["ortdiff.worst"] == "0 outside atol=0.0001 rtol=0.0001 (0 %)"
    assert p["ortdiff.tolerance"] == "atol=0.0001 rtol=0.0001"
    # the second check, against the float64 oracle: two more rows under their own names, and the verdict
    ort, torch_side = expected_numbers["ort_vs_oracle32"], expected_numbers["torch_vs_oracle32"]
    _check_values(p, "ortdiff.ort_vs_float64", ort)
    _check_values(p, "ortdiff.torch_vs_float64", torch_side)
    ko, kt = (ort["max_ulp"], ort["differ"]), (torch_side["max_ulp"], torch_side["differ"])
    assert p["ortdiff.closer_to_oracle"] == ("tie" if ko == kt else "onnxruntime" if ko < kt else "torch")

    b = props["test_budget_broken[CPU-float16]"]
    ref16 = expected_numbers["ort16"]
    _check_values(b, "ortdiff", ref16)
    assert b["ortdiff.result"] == "failed"
    assert ref16["above_1e-6"] > 0
    assert b["ortdiff.worst"].startswith(f"{ref16['above_1e-6']:,} > 1e-06 (") and b["ortdiff.worst"].endswith("; allows 0 %)")
    assert b["ortdiff.tolerance"] == "budget >1e-06: 0 %"
    assert "ortdiff.closer_to_oracle" not in b


def test_junitxml_carries_every_check(pytester: pytest.Pytester, expected_numbers: dict[str, dict[str, Any]]) -> None:
    pytester.makepyfile(test_lnmm=MODULE)
    pytester.runpytest("--junitxml=one.xml").assert_outcomes(passed=1, failed=1)
    _assert_properties(_properties(pytester.path / "one.xml"), expected_numbers)


# -- the function behind them -------------------------------------------------------------------


def _row(suffix: str, max_ulp: float, differ: int, floored: float | None = None, **kw: Any) -> CheckRow:
    report = {"max_rel_floored": 1e-7, "max_ulp_floored": max_ulp if floored is None else floored, "differ": differ}
    return CheckRow(test="", provider="CPU", dtype="float32", max_abs=1.5e-5, max_rel=2.0, max_ulp=max_ulp, worst="w", passed=True, tolerance="t", report=report, suffix=suffix, **kw)


@pytest.mark.parametrize(
    ("ort", "torch_side", "verdict"),
    [((1.0, 5), (4.0, 3), "onnxruntime"), ((4.0, 3), (1.0, 5), "torch"), ((2.0, 3), (2.0, 7), "onnxruntime"), ((2.0, 3), (2.0, 3), "tie")],
)
def test_oracle_verdict_smaller_max_ulp_then_fewer_elements(ort: tuple[float, int], torch_side: tuple[float, int], verdict: str) -> None:
    props = dict(junit_properties([_row(" [ort vs float64]", *ort), _row(" [torch vs float64]", *torch_side)]))
    assert props["ortdiff.closer_to_oracle"] == verdict
    assert props["ortdiff.ort_vs_float64.max_ulp"] == f"{ort[0]:.6g}"
    assert props["ortdiff.torch_vs_float64.max_ulp_floored"] == f"{torch_side[0]:.6g}"


def test_oracle_verdict_is_decided_at_the_outputs_scale() -> None:
    """Raw ULPs near zero are noise: 470 raw against 196 raw, both 1 at the output's scale, is a tie there, and the
    fewer elements off decide (a new user's float16 check was given to the side with more elements off)."""
    props = dict(junit_properties([_row(" [ort vs float64]", 470.0, 124, floored=1.0), _row(" [torch vs float64]", 196.0, 129, floored=1.0)]))
    assert props["ortdiff.closer_to_oracle"] == "onnxruntime"


def test_names_values_and_nothing_made_up() -> None:
    row = _row(" [baseline out]", 3.0, 1, floored=0.5)
    assert junit_properties([row]) == [
        ("ortdiff.baseline_out.provider", "CPU"),
        ("ortdiff.baseline_out.dtype", "float32"),
        ("ortdiff.baseline_out.max_abs", "1.5e-05"),
        ("ortdiff.baseline_out.max_rel", "2"),
        ("ortdiff.baseline_out.max_rel_floored", "1e-07"),
        ("ortdiff.baseline_out.max_ulp", "3"),
        ("ortdiff.baseline_out.max_ulp_floored", "0.5"),
        ("ortdiff.baseline_out.worst", "w"),
        ("ortdiff.baseline_out.tolerance", "t"),
        ("ortdiff.baseline_out.result", "passed"),
    ]
    # a row without numbers (nothing compared) and without a report: only what it has; one oracle row: no verdict
    bare = CheckRow(test="", provider="CPU", dtype="float16", worst="shapes changed", passed=False)
    assert dict(junit_properties([bare, _row(" [ort vs float64]", 1.0, 1)])) == {
        "ortdiff.provider": "CPU",
        "ortdiff.dtype": "float16",
        "ortdiff.worst": "shapes changed",
        "ortdiff.result": "failed",
        **{k: v for k, v in junit_properties([_row(" [ort vs float64]", 1.0, 1)])},
    }


def test_a_repeated_check_replaces_its_properties(pytester: pytest.Pytester) -> None:
    """Two checks of one suffix in a test (a check per hypothesis example): one row kept, the worst, and
    its properties alone in the XML."""
    pytester.makepyfile(
        test_twice="""
        from pytest_ortdiff.numerics.results import CheckRow

        def test_twice(ortdiff):
            worse = CheckRow(test="", provider="CPU", dtype="float32", max_abs=0.5, max_rel=1.0, max_ulp=9.0, worst="bad", passed=True)
            better = CheckRow(test="", provider="CPU", dtype="float32", max_abs=0.1, max_rel=1.0, max_ulp=2.0, worst="good", passed=True)
            ortdiff._record(better)
            ortdiff._record(worse)
            ortdiff._record(better)
        """
    )
    pytester.runpytest("--junitxml=x.xml").assert_outcomes(passed=1)
    props = _properties(pytester.path / "x.xml")["test_twice[CPU-float32]"]
    assert (props["ortdiff.max_abs"], props["ortdiff.max_ulp"], props["ortdiff.worst"]) == ("0.5", "9", "bad")
    names = [p.get("name") for p in ET.parse(pytester.path / "x.xml").getroot().iter("property")]
    assert names.count("ortdiff.max_abs") == 1


# -- the workflow template users copy -----------------------------------------------------------------

TEMPLATE = Path(__file__).resolve().parent.parent / "ci" / "github-actions.yml"


def _steps(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s.get("name") or s["uses"]: s for s in job["steps"]}


def test_workflow_template_structure(pytester: pytest.Pytester, cli: Any) -> None:
    """ci/github-actions.yml parses; its matrix jobs write what the merge job reads; the pytest and merge
    command lines it runs are ones this pytest-ortdiff accepts (the merge one run on a job's file)."""
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    assert set(wf[True]) >= {"pull_request", "push"}  # (YAML 1.1 reads the key `on` as true)
    jobs = wf["jobs"]
    assert set(jobs) == {"cpu", "cuda", "report"}
    cpu, cuda, report = jobs["cpu"], jobs["cuda"], jobs["report"]

    assert cpu["runs-on"] == "ubuntu-latest" and cpu["strategy"]["fail-fast"] is False
    assert set(cpu["strategy"]["matrix"]) == {"dtype", "onnxruntime"} and "float16" in cpu["strategy"]["matrix"]["dtype"]
    assert "--index-url https://download.pytorch.org/whl/cpu" in _steps(cpu)["Install"]["run"]
    assert cuda["if"] is False and {"self-hosted", "gpu"} <= set(cuda["runs-on"])
    assert "onnxruntime-gpu==" in _steps(cuda)["Install"]["run"] and "[gpu]" in _steps(cuda)["Install"]["run"]
    for job, provider in ((cpu, "CPU"), (cuda, "CUDA")):
        test = " ".join(_steps(job)["Test"]["run"].split())
        assert "--dist loadgroup" in test and f"--ort-providers={provider}" in test
        assert "--ortdiff-json=ortdiff-${{ env.JOB }}.json" in test and "--junitxml=junit-${{ env.JOB }}.xml" in test
        assert job["env"]["JOB"].startswith(f"{provider}-${{{{ matrix.dtype }}}}")
        upload = _steps(job)["Upload the job's results"]
        assert upload["uses"] == "actions/upload-artifact@v4" and upload["if"] == "always()"
        assert upload["with"]["name"] == "ortdiff-${{ env.JOB }}" and "ortdiff-${{ env.JOB }}.json" in upload["with"]["path"]

    assert report["needs"] == ["cpu", "cuda"] and report["if"] == "always()"
    steps = _steps(report)
    download = steps["actions/download-artifact@v4"]["with"]
    assert download == {"pattern": "ortdiff-*", "path": "jobs", "merge-multiple": True}
    merge_script = steps["Merge"]["run"]
    assert '>> "$GITHUB_STEP_SUMMARY"' in merge_script and "exit $status" in merge_script
    assert steps["Upload the HTML report"]["with"]["path"] == "report.html"

    # the pytest options the jobs pass exist (xdist's included)
    test_args = _steps(cpu)["Test"]["run"].replace("${{ matrix.dtype }}", "float16").replace("${{ env.JOB }}", "CPU-float16").split()
    assert test_args[:4] == ["python", "-m", "pytest", '"$TESTS"']
    test_args = test_args[4:]
    config = pytester.parseconfig(*test_args)
    assert (config.getoption("ortdiff_json"), config.getoption("dist")) == ("ortdiff-CPU-float16.json", "loadgroup")
    # the merge line, run on a job's file as the template runs it
    pytester.makepyfile(test_one="def test_a(ortdiff):\n    pass\n")
    (pytester.path / "jobs").mkdir()
    pytester.runpytest("--ortdiff-json=jobs/ortdiff-CPU-float32.json").assert_outcomes(passed=1)
    line = next(x for x in merge_script.splitlines() if "pytest_ortdiff merge" in x)
    args = line.split(">")[0].split()[3:]
    assert args[:5] == ["merge", "--strict", "--markdown", "--html", "report.html"]
    out = cli(*args[:-1], "jobs/ortdiff-CPU-float32.json", cwd=pytester.path)
    assert out.returncode == 0, out.stderr
    assert (pytester.path / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
