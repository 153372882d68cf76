"""The suite passes in any order: a pytester run that makes a worker's first torch.onnx export must not leave
the worker unable to make the next one (conftest imports torch.onnx's exporters up front)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_dynamo_export_after_the_first_torchscript_export_made_inside_pytester() -> None:
    """The order that broke 12 tests under -n 14: test_parity's fixture test (the worker's first TorchScript
    export, inside pytester, whose sys.modules restore dropped torch.onnx._internal.exporter), then a dynamo
    export ("_registry must not be empty"). Run in a fresh interpreter, in this order."""
    first = "tests/test_parity.py::test_fixture_passes_fails_and_reports_export_failures"
    then = "tests/test_evaluator.py::test_shape_specialised_plan_is_bit_identical_at_every_shape_signature"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", first, then],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
