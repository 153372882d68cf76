"""`python -m pytest_ortdiff precision MODEL`: the audit table and the keep-in-float32 report for a model file,
the converted model written, exit codes like `compare` (0 a verified list, 1 none, 2 bad arguments)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from pytest_ortdiff import models


@pytest.fixture
def softmax_file(tmp_path: Path) -> Path:
    path = tmp_path / "softmax.onnx"
    onnx.save(models.fp16_hazards("softmax", dtype="float32"), str(path))
    return path


def test_precision_prints_the_audit_and_the_list_and_writes_the_converted_model(
    cli: Callable[..., Any], softmax_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "softmax_fp16.onnx"
    args = [
        "precision",
        str(softmax_file),
        "--dim",
        "batch=2",
        "--dim",
        "n=64",
        "--samples",
        "2",
        "--budget",
        "0.01:0.01,0.1:0",
    ]
    result = cli(*args, "--write-converted", str(out))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "softmax.onnx: 2 samples (seeds 0 and 1), dims {'batch': 2, 'n': 64}" in text  # (not "2 input(s)": issue 30)
    assert "float16 range audit of 'fp16_hazard_softmax'" in text and "overflows float16" in text
    assert "keep in float32: 3 nodes, 1-minimal" in text and "status: verified" in text
    assert "tolerance budget >0.01: 1.00 %, >0.1: 0 %" in text
    assert f"wrote {out}" in text
    written = onnx.load(str(out))
    onnx.checker.check_model(written)
    inits = {t.name: t.data_type for t in written.graph.initializer}
    kept = [n for n in written.graph.node if n.name in ("exp", "sum_exp", "normalize")]
    assert len(kept) == 3 and all(
        inits.get(x, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT
        for n in kept
        for x in n.input
    )


def test_precision_with_feeds_from_a_file(
    cli: Callable[..., Any], softmax_file: Path, tmp_path: Path
) -> None:
    """--feeds gives X; values that stay within exp's float16 range need no list (exit 0, nothing to keep)."""
    feeds = tmp_path / "x.npz"
    np.savez(feeds, X=np.linspace(-5, 5, 2 * 16, dtype=np.float32).reshape(2, 16))
    result = cli(
        "precision",
        str(softmax_file),
        "--feeds",
        str(feeds),
        "--samples",
        "1",
        "--budget",
        "0.01:0",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "nothing to keep in float32" in result.stdout and "status: nothing to keep" in result.stdout
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "0.01"], "--budget '0.01': expected THRESHOLD:FRACTION"),
        (["--samples", "0"], "--samples 0: expected 1 to 1,000 samples"),
        (["--provider", "nope"], "unknown provider 'nope'"),
        (["--dim", "batch=2"], "the model's inputs have symbolic dims ['n']"),
    ],
)
def test_precision_bad_arguments_are_one_line_exit_2(
    cli: Callable[..., Any], softmax_file: Path, extra: list[str], message: str
) -> None:
    args = ["--dim", "batch=2", "--dim", "n=8"] if extra[0] != "--dim" else []
    result = cli("precision", str(softmax_file), *args, *extra)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert result.stdout == ""


def test_precision_unreachable_budget_exits_1(cli: Callable[..., Any], softmax_file: Path) -> None:
    result = cli(
        "precision",
        str(softmax_file),
        "--dim",
        "batch=1",
        "--dim",
        "n=8",
        "--samples",
        "1",
        "--budget",
        "0:0",
    )
    assert result.returncode == 1, result.stderr
    assert (
        "status: unreachable" in result.stdout
        and "cannot be met even with every node in float32" in result.stdout
    )
