"""The Checker and the fixture on deployed graphs: a failure report is never hidden by a blame that fails, and
"did my deployment step move the numbers" (check_deployment: outputs compared, graphs aligned node to node,
the first divergence named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_ortdiff import Checker
from pytest_ortdiff.check import ToleranceBroken

Deployed = Callable[[str], Path]


def test_a_blame_that_fails_never_hides_the_failure_report(monkeypatch: pytest.MonkeyPatch, contrib_model: Any) -> None:
    """check(..., blame=True) on a failing model whose blame raises (it crashed on fused graphs: the oracle's
    EmbedLayerNormalization in float64) still raises ToleranceBroken with the report, and says why no table."""
    import importlib

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torch kernel OrtKernel failed on node 'embed'\nsecond line")

    monkeypatch.setattr(importlib.import_module("pytest_ortdiff.blame"), "blame", broken)
    model = contrib_model()
    feeds = {"x": torch.tensor([[0.1, 3.0, -1.0], [2.0, 2.5, 0.0]])}
    with pytest.raises(ToleranceBroken) as info:
        # (both ops run on onnxruntime, the torch side's FastGelu planted wrong by 1 %)
        Checker("CPU", "float32").check(model, feeds, missing="ort", blame=True, kernels={("com.microsoft", "FastGelu"): lambda x: x * 0.51 * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))})
    result = info.value.result
    assert not result.passed and result.blame is None
    assert result.blame_error == "RuntimeError: torch kernel OrtKernel failed on node 'embed'"
    text = str(info.value)
    assert text.startswith("ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken")
    assert text.rstrip().endswith("blame failed, no table: RuntimeError: torch kernel OrtKernel failed on node 'embed'")
