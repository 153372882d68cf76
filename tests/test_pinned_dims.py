"""Symbolic dims a model fixes itself: a real export whose feature dim is declared dynamic (TorchScript's
`dynamic_axes` take any dim) while its weights fix it, and two inputs whose dims must be equal under two
names. Fuzzing draws the fixed dim at its value and the equal dims once (before, every example drawn
otherwise failed in onnxruntime, and hypothesis shrank on those errors); bounds that contradict the model,
and `compare --dim` values that do, are refused up front with the fix; `compare` fills what the model
fixes. A dynamo export (which checks its dynamic dims itself) pins nothing."""

from __future__ import annotations

import functools
import io
import warnings
from pathlib import Path

import onnx
import pytest
import torch
from hypothesis import given, settings
from torch import nn

from pytest_ortdiff import Checker
from pytest_ortdiff.analyses import strategies
from pytest_ortdiff.analyses.fuzz import fuzz
from pytest_ortdiff.cli import main
from pytest_ortdiff.models import layer_norm_matmul_add

HIDDEN = 32


class Block(nn.Module):
    """A BERT-like feed-forward block with its residual: LayerNorm, Linear up, GELU, Linear down, plus an
    additive mask (two inputs whose sequence dims must agree)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x)))) * mask.unsqueeze(-1)


@functools.cache
def _export(exporter: str, dtype: torch.dtype = torch.float32) -> onnx.ModelProto:
    """The block exported once per exporter and dtype (callers only read it)."""
    torch.manual_seed(0)
    module = Block().eval().to(dtype)
    args = (torch.randn(2, 5, HIDDEN, dtype=dtype), torch.ones(2, 5, dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            program = torch.onnx.export(module, args, dynamo=True, verbose=False, input_names=["x", "mask"], dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
            assert program is not None
            return program.model_proto
        buf = io.BytesIO()
        # the mistake this is about: `hidden` declared dynamic although the weights fix it, and the mask's
        # sequence under a name of its own
        axes = {"x": {0: "batch", 1: "seq", 2: "hidden"}, "mask": {0: "batch", 1: "mask_seq"}}
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=18, input_names=["x", "mask"], output_names=["y"], dynamic_axes=axes)
    return onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def torchscript() -> onnx.ModelProto:
    return _export("torchscript")


@pytest.fixture(scope="module")
def torchscript16() -> onnx.ModelProto:
    return _export("torchscript", torch.float16)


def test_a_torchscript_export_pins_the_dim_its_weights_fix_and_joins_equal_dims(torchscript: onnx.ModelProto) -> None:
    assert strategies.symbolic_dims(torchscript) == ["batch", "seq", "hidden", "mask_seq"]
    pins = strategies.pinned_dims(torchscript)
    assert dict(pins.fixed) == {"hidden": HIDDEN}
    # drawn once, as the one that comes first among the inputs (whichever way the inference merged them)
    assert dict(pins.same) == {"mask_seq": "seq"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_dynamo_export_pins_nothing(dtype: torch.dtype) -> None:
    model = _export("dynamo", dtype)
    assert strategies.pinned_dims(model) == strategies.PinnedDims()
    assert len(strategies.symbolic_dims(model)) == 2


def test_a_builder_with_every_dim_free_pins_nothing() -> None:
    # its weights are inputs of symbolic size: c is free
    assert strategies.pinned_dims(layer_norm_matmul_add(dtype="float32")) == strategies.PinnedDims()


@settings(max_examples=25, deadline=None)
@given(strategies.dims(_export("torchscript")))
def test_dims_draw_the_pinned_value_and_equal_dims_once(d: dict[str, int]) -> None:
    assert d["hidden"] == HIDDEN
    assert d["seq"] == d["mask_seq"]
    assert 1 <= d["batch"] <= 64 and 1 <= d["seq"] <= 64


def test_bounds_contradicting_the_model_are_refused_with_the_fix(torchscript: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=r"hidden=\(1, 64\): the model fixes 'hidden' at 32 .* drop 'hidden' from the bounds \(it is drawn as 32\) or give hidden=32"):
        strategies.dims(torchscript, hidden=(1, 64))
    with pytest.raises(ValueError, match=r"the bounds given for 'mask_seq' and for the dims it must equal leave no value in common \(the model makes 'mask_seq' equal to 'seq'"):
        strategies.dims(torchscript, seq=(1, 4), mask_seq=(8, 9))
    strategies.dims(torchscript, hidden=HIDDEN, batch=(1, 4))  # the pinned value itself is fine


@settings(max_examples=15, deadline=None)
@given(strategies.dims(_export("torchscript"), mask_seq=(3, 9), seq=(5, 40)))
def test_bounds_for_either_of_two_equal_dims_bound_both(d: dict[str, int]) -> None:
    assert 5 <= d["seq"] == d["mask_seq"] <= 9


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fuzz_runs_a_torchscript_export_whose_weights_fix_a_dynamic_dim(torchscript: onnx.ModelProto, torchscript16: onnx.ModelProto, tmp_path: Path, dtype: str) -> None:
    model = torchscript if dtype == "float32" else torchscript16
    assert dict(strategies.pinned_dims(model).fixed) == {"hidden": HIDDEN}
    path = tmp_path / "block.onnx"
    onnx.save(model, path)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == "float32" else {"atol": 5e-2, "rtol": 5e-2}
    result = fuzz(Checker("CPU", dtype), str(path), dims={"batch": (1, 4), "seq": (1, 16)}, tolerance=tolerance, max_examples=12)
    assert result.passed and result.examples == 12
    assert result.worst_dims is not None and result.worst_dims["hidden"] == HIDDEN
    assert result.worst_dims["seq"] == result.worst_dims["mask_seq"]


def test_fuzz_runs_a_dynamo_export() -> None:
    result = fuzz(Checker("CPU", "float32"), _export("dynamo"), dims={"batch": (1, 4), "seq": (2, 16)}, tolerance={"atol": 1e-4, "rtol": 1e-4}, max_examples=8)
    assert result.passed and result.examples == 8


def test_compare_takes_the_pinned_dim_and_refuses_another(torchscript: onnx.ModelProto, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "block.onnx"
    onnx.save(torchscript, path)
    # hidden and the mask's sequence come from the model: only batch and seq are given
    assert main(["compare", str(path), "--dim", "batch=2", "--dim", "seq=7"]) == 0
    out = capsys.readouterr().out
    assert "dims {'batch': 2, 'seq': 7, 'hidden': 32, 'mask_seq': 7}" in out and "passed" in out
    assert main(["compare", str(path), "--dim", "batch=2", "--dim", "seq=7", "--dim", "hidden=16"]) == 2
    err = capsys.readouterr().err
    assert "--dim hidden=16: the model fixes 'hidden' at 32" in err and "drop --dim hidden (it is taken as 32)" in err


def test_fuzz_names_the_dims_onnxruntime_refused(torchscript: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> None:
    # where the inference reads nothing (an op it does not know, say), a fixed dim drawn otherwise fails in
    # onnxruntime: the error says at which dims, and what to give
    monkeypatch.setattr(strategies, "pinned_dims", lambda model: strategies.PinnedDims())
    from pytest_ortdiff.engine.check import OrtRunError

    with pytest.raises(OrtRunError) as info:
        fuzz(Checker("CPU", "float32"), torchscript, dims={"batch": 1, "seq": 2, "mask_seq": 2, "hidden": (16, 16)}, max_examples=3)
    assert any("onnxruntime refused the example at dims {'batch': 1, 'seq': 2, 'hidden': 16, 'mask_seq': 2}" in n and "give it as a bound: dims={name: value}" in n for n in info.value.__notes__)


def test_compare_asks_only_for_the_dims_the_model_leaves_free(torchscript: onnx.ModelProto, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "block.onnx"
    onnx.save(torchscript, path)
    assert main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    # not hidden (fixed at 32), not mask_seq (drawn as seq)
    assert "the model's inputs have symbolic dims ['batch', 'seq']: give each a value, e.g. --dim batch=2 --dim seq=2" in err
    # the mask's name given alone sets the length of both
    assert main(["compare", str(path), "--dim", "batch=1", "--dim", "mask_seq=3"]) == 0
    assert "dims {'batch': 1, 'mask_seq': 3, 'hidden': 32, 'seq': 3}" in capsys.readouterr().out

