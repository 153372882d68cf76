"""Wording that says what it means (issue 30): the HTML's job label names the dtypes its checks ran, merge's
markdown names no culprit the terminal's table does not, the bfloat16 audit says whose ±65504 it cites, the
help and messages speak of no "seeds", and the install the README gives has the exporter."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from pytest_ortdiff import models
from pytest_ortdiff.numerics.results import CheckRow, Environment, ResultsFile
from pytest_ortdiff.reports.htmlreport import render
from pytest_ortdiff.reports.matrix import job_labels


def _row(dtype: str) -> CheckRow:
    return CheckRow(f"t.py::test_a[CPU-{dtype}]", "CPU", dtype, 1e-3, 1e-3, 2.0, "w", True, "t", {"n": 4, "counts": {"0.0": 1}}, "passed")


def test_a_jobs_label_names_the_dtypes_its_checks_ran() -> None:
    """A run that selected float32 (--ort-dtypes' default) whose marker ran float16: the label said
    "dtypes: float32" beside float16 columns."""
    env = Environment(onnxruntime="1.32.0", torch="2.13.0", providers=("CPU",), dtypes=("float32",))
    job = ResultsFile((_row("float16"),), environment=env)
    assert job_labels([job]) == ["CPU float16 · ort 1.32.0 · torch 2.13.0"]
    html = render([job])
    assert "dtypes: float16 (the run selected float32)" in html
    assert "dtypes: float32;" not in html and "dtypes: float32<" not in html


def test_markdown_blame_line_agrees_with_the_terminal(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """The terminal's table says no node explains 10 %; the markdown named a "2 %" culprit."""
    row = {**_row("float32").to_dict(), "outcome": "failed", "passed": False}
    row["blame"] = {"rows": [{"node": "mm", "op_type": "MatMul", "explained": 0.02, "exact": True}], "culprit": None, "first_divergence": "mm"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"results": [row]}))
    out = cli("merge", str(path), "--matrix", "--markdown")
    assert "  - blame: no single node explains 10 % of the gap (the most: mm (MatMul) 2 %); first node whose output drifts beyond the tolerance: mm" in out.stdout
    row["blame"]["culprit"] = "mm"
    row["blame"]["rows"][0]["explained"] = 0.6
    path.write_text(json.dumps({"results": [row]}))
    assert "  - blame: mm (MatMul) 60 %\n" in cli("merge", str(path), "--matrix", "--markdown").stdout


def test_help_and_messages_speak_of_no_seeds(cli: Callable[..., Any]) -> None:
    for command in ([], ["merge"], ["compare"], ["blame"], ["diff"], ["precision"], ["demo"]):
        out = cli(*command, "--help")
        assert out.returncode == 0 and out.stdout, command
        assert not re.search(r"seeds/|seeds'|seed-000", out.stdout), (command, out.stdout)


def test_the_bfloat16_audit_says_whose_65504_it_cites(tmp_path: Path, cli: Callable[..., Any]) -> None:
    path = tmp_path / "lnmm.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float32"), str(path))
    out = cli("precision", str(path), "--dtype", "bfloat16", "--dim", "a=1", "--dim", "b=4", "--dim", "c=8", "--samples", "1")
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.strip().startswith("range-only rule:")]
    assert "beyond float16's ±65504 or non-zero below float16's 5.96e-08" in line
    assert "float16's thresholds: the tool has none for bfloat16" in line and "seeds" not in out.stdout


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_the_test_install_brings_the_exporter() -> None:
    """The demo's `pip install -e ".[cpu,test]"` lacked onnxscript: torch.onnx.export failed in it."""
    import tomllib

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("onnxscript") for req in extras["test"]) and any(req.startswith("onnxscript") for req in extras["export"])
