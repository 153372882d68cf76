"""Stored baselines: lossless round trip per dtype, summaries of large outputs, drift with histogram and
environment changes, corrupted files reported and left alone, the update flag, atomic writes under
pytest-xdist."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytest_ortdiff.engine import baseline as B
from pytest_ortdiff.engine.baseline import (
    CorruptBaselineError,
    check_baseline,
    compare_baseline,
    load_baseline,
    write_baseline,
)

FAKE_ENV = {"onnxruntime": "1.31.0", "torch": "2.12.0", "onnx": "1.22.0", "numpy": "2.4.6", "python": "3.11.0", "provider": "CPUExecutionProvider", "device": "Old CPU", "cpu": "Old CPU", "platform": "Linux x86_64"}


def _special(dtype: torch.dtype) -> torch.Tensor:
    """Every kind of value a dtype has: NaN, ±inf, -0.0, subnormals, extremes."""
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False])
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.tensor([0, 1, -1, info.max, info.min, 12345], dtype=dtype)
    info = torch.finfo(dtype)
    vals = torch.tensor([0.0, -0.0, 1.0, -1.5, float("nan"), float("inf"), float("-inf")], dtype=dtype)
    extremes = torch.tensor([info.max, -info.max, info.tiny, info.tiny / 4, info.eps], dtype=dtype)
    rand = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)).to(dtype)
    return torch.cat([vals, extremes, rand.reshape(-1)]).reshape(3, -1)


def _bits(t: torch.Tensor) -> bytes:
    return B._to_numpy_bits(t).tobytes()


# -- round trip --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_round_trip_is_lossless_for_every_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    t = _special(dtype)
    path = write_baseline(tmp_path / "t.x.npz", {"Y": t, "scalar": t.reshape(-1)[2].clone()}, test="t.py::t", dtype=str(dtype)[6:], name="x", env=FAKE_ENV)
    b = load_baseline(path)
    y = b.outputs["Y"]
    assert y.stored == "full" and y.tensor is not None
    assert y.tensor.dtype == dtype and tuple(y.tensor.shape) == tuple(t.shape)
    assert _bits(y.tensor) == _bits(t)  # bit for bit: NaN, -0.0, subnormals included
    assert b.outputs["scalar"].shape == ()
    assert b.environment == FAKE_ENV
    assert compare_baseline(b, {"Y": t, "scalar": t.reshape(-1)[2]}, env=FAKE_ENV).identical
    # the readable sidecar holds the same metadata
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["outputs"]["Y"]["dtype"] == B.dtype_of(dtype).short
    assert side["outputs"]["Y"]["sha256"] == hashlib.sha256(_bits(t)).hexdigest()


def test_bfloat16_is_stored_as_its_uint16_bits(tmp_path: Path) -> None:
    t = torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16)
    path = write_baseline(tmp_path / "t.x.npz", t, env=FAKE_ENV)
    with np.load(path) as npz:
        stored = npz["full_0"]
        meta = json.loads(str(npz["__meta__"]))
    assert stored.dtype == np.uint16
    assert stored.tolist() == [0x3F80, 0xC020, 0x4049]
    assert meta["outputs"]["output"]["dtype"] == "bfloat16"


def test_reference_report_and_environment_are_stored(tmp_path: Path) -> None:
    from pytest_ortdiff import compare

    ref = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
    path = write_baseline(tmp_path / "t.x.npz", [torch.ones(2)], name="x", reference_report=ref, env=FAKE_ENV)
    b = load_baseline(path)
    assert b.reference_report is not None and b.reference_report.max_abs == 0.5
    assert b.meta["written_by"].startswith("pytest-ortdiff ")


def test_environment_names_versions_provider_and_device() -> None:
    import onnxruntime

    env = B.environment("CPU")
    assert env["onnxruntime"] == onnxruntime.__version__
    assert env["torch"] == torch.__version__
    assert env["provider"] == "CPUExecutionProvider"
    assert env["device"] and env["cpu"] and env["device"] == env["cpu"]
    assert {"onnx", "numpy", "python", "platform"} <= set(env)
    changes = B.environment_changes(FAKE_ENV, {**FAKE_ENV, "onnxruntime": "1.32.0", "cuda": "12.8"})
    assert changes == [("onnxruntime", "1.31.0", "1.32.0"), ("cuda", "(none)", "12.8")]


# -- large outputs: summary --------------------------------------------------------------------


def test_large_output_is_stored_as_a_summary_that_detects_drift(tmp_path: Path) -> None:
    t = torch.randn(64, 1000, generator=torch.Generator().manual_seed(1))
    path = write_baseline(tmp_path / "t.x.npz", {"Z": t}, max_elements=10_000, env=FAKE_ENV)
    b = load_baseline(path)
    z = b.outputs["Z"]
    assert z.stored == "summary" and z.sample is not None
    stride = z.summary["sample_stride"]
    assert stride == 16 and z.sample.numel() == 4000
    assert torch.equal(z.sample, t.reshape(-1)[::16])
    q = z.summary["quantiles"]
    assert q["0.0"] == pytest.approx(float(t.min())) and q["1.0"] == pytest.approx(float(t.max()))
    assert q["0.5"] == pytest.approx(float(np.quantile(t.numpy().astype(np.float64), 0.5)), rel=1e-6)
    assert z.summary["mean"] == pytest.approx(float(t.double().mean()))
    assert path.stat().st_size < t.numel() * 4 / 10  # far smaller than the tensor

    assert compare_baseline(b, {"Z": t.clone()}, env=FAKE_ENV).identical
    # a sampled element moves: counted, with the histogram and where it is in the full tensor
    moved = t.clone()
    moved.view(-1)[16 * 10] += 0.5
    c = compare_baseline(b, {"Z": moved}, env=FAKE_ENV)
    (o,) = c.outputs
    assert not c.passed and o.status == "drift" and o.bit_mismatches == 1 and o.compared == 4000
    assert o.report is not None and o.report.max_abs == pytest.approx(0.5, abs=1e-6)
    assert "element (0, 160) of the output" in o.note
    # an element outside the sample moves: the checksum still catches it
    hidden = t.clone()
    hidden.view(-1)[17] += 1e-3
    (o,) = compare_baseline(b, {"Z": hidden}, env=FAKE_ENV).outputs
    assert o.status == "drift" and o.bit_mismatches == 0
    assert "the sampled elements are identical: the drift is elsewhere" in o.note
    assert [name for name, _, _ in o.quantiles] == ["0.0", "0.01", "0.25", "0.5", "0.75", "0.99", "1.0"]


# -- comparison --------------------------------------------------------------------------------


def test_bitwise_by_default_tolerance_on_request(tmp_path: Path) -> None:
    t = torch.linspace(-1, 1, 101)
    b = load_baseline(write_baseline(tmp_path / "t.x.npz", {"Y": t}, env=FAKE_ENV))
    nudged = t.clone()
    nudged[3] = torch.nextafter(t[3], torch.tensor(2.0))  # one ULP
    bitwise = compare_baseline(b, {"Y": nudged}, env=FAKE_ENV)
    assert not bitwise.passed and bitwise.rule == "bitwise"
    assert bitwise.outputs[0].bit_mismatches == 1
    loose = compare_baseline(b, {"Y": nudged}, tolerance={"atol": 1e-6, "rtol": 0}, env=FAKE_ENV)
    assert loose.passed and not loose.identical and loose.rule == "atol=1e-06 rtol=0"
    tight = compare_baseline(b, {"Y": nudged + 1e-3}, tolerance={"atol": 1e-6, "rtol": 0}, env=FAKE_ENV)
    assert not tight.passed and "exceed atol=1e-06" in tight.outputs[0].violations[0]
    # signed zero: equal values, different bits -> drift under the bitwise rule
    zero = load_baseline(write_baseline(tmp_path / "z.x.npz", {"Y": torch.zeros(3)}, env=FAKE_ENV))
    assert compare_baseline(zero, {"Y": -torch.zeros(3)}, env=FAKE_ENV).outputs[0].bit_mismatches == 3


def test_shape_dtype_and_output_set_changes_are_drift(tmp_path: Path) -> None:
    b = load_baseline(write_baseline(tmp_path / "t.x.npz", {"Y": torch.ones(2, 3), "W": torch.ones(2)}, env=FAKE_ENV))
    c = compare_baseline(b, {"Y": torch.ones(3, 2), "V": torch.ones(2)}, tolerance={"atol": 1.0}, env=FAKE_ENV)
    status = {o.name: (o.status, o.note) for o in c.outputs}
    assert status["Y"] == ("shape", "shape changed: (2, 3) -> (3, 2)")
    assert status["W"][0] == "removed" and status["V"][0] == "added"
    assert not c.passed  # even with a tolerance
    c = compare_baseline(b, {"Y": torch.ones(2, 3, dtype=torch.float16), "W": torch.ones(2)}, env=FAKE_ENV)
    assert c.outputs[0].note == "dtype changed: float32 -> float16"


def test_drift_render_shows_environment_changes_and_histogram(tmp_path: Path) -> None:
    path = write_baseline(tmp_path / "t.x.npz", {"Y": torch.zeros(1000)}, name="x", env=FAKE_ENV)
    moved = torch.zeros(1000)
    moved[:50] = 0.02
    moved[7] = 3.0
    text = compare_baseline(load_baseline(path), {"Y": moved}, env={**FAKE_ENV, "onnxruntime": "1.32.0"}).render()
    print(text)
    assert "baseline 'x': DRIFTED (bitwise; written " in text
    assert "environment changed since the baseline was written:\n    onnxruntime: 1.31.0 -> 1.32.0" in text
    assert "  - Y: 50 of 1,000 elements differ in their bits (float32[1000])" in text
    assert "max abs   3          at (7): expected 0, got 3" in text
    assert "      0.01          50    5.00 %  ██████████████████████████████" in text
    assert "         1           1    0.10 %  █" in text


# -- check_baseline: missing, corrupted, drift, update -------------------------------------------


def test_missing_baseline_fails_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.x.npz"
    out = check_baseline(path, torch.ones(3), test="t.py::test_a[CPU-float32]", name="x")
    assert (out.action, out.passed) == ("missing", False)
    assert "no baseline 'x' of t.py::test_a[CPU-float32]" in out.message
    assert "run: pytest 't.py::test_a[CPU-float32]' --ortdiff-update-baselines" in out.message
    assert not path.parent.exists()
    out = check_baseline(path, torch.ones(3), test="t.py::test_a[CPU-float32]", name="x", update=True)
    assert (out.action, out.passed) == ("created", True) and path.exists()


@pytest.mark.parametrize(
    "damage",
    ["truncate", "garbage", "flip_bits", "empty", "no_meta", "bad_json"],
)
def test_corrupted_baseline_is_reported_and_left_untouched(tmp_path: Path, damage: str) -> None:
    path = write_baseline(tmp_path / "t.x.npz", {"Y": torch.arange(100.0)}, test="t.py::t", name="x", env=FAKE_ENV)
    raw = path.read_bytes()
    if damage == "truncate":
        bad = raw[: len(raw) // 2]
    elif damage == "garbage":
        bad = b"not a baseline at all"
    elif damage == "empty":
        bad = b""
    else:
        with np.load(io.BytesIO(raw)) as npz:
            arrays = {k: npz[k] for k in npz.files}
        if damage == "flip_bits":  # a valid zip whose data no longer match the recorded sha256
            arrays["full_0"] = arrays["full_0"].copy()
            arrays["full_0"][5] += 1
        elif damage == "no_meta":
            del arrays["__meta__"]
        else:
            arrays["__meta__"] = np.array("{not json")
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        bad = buf.getvalue()
    path.write_bytes(bad)
    with pytest.raises(CorruptBaselineError) as info:
        load_baseline(path)
    assert info.value.path == path
    out = check_baseline(path, torch.arange(100.0), test="t.py::t", name="x")
    assert (out.action, out.passed) == ("corrupted", False)
    assert f"the baseline file is corrupted and was NOT overwritten:\n  {path}" in out.message
    assert "--ortdiff-update-baselines" in out.message and "git checkout" in out.message
    assert path.read_bytes() == bad  # untouched
    expected_reason = {
        "truncate": "truncated or not a zip file",
        "garbage": "truncated or not a zip file",
        "empty": "truncated or not a zip file",
        "flip_bits": "stored bits do not match their recorded sha256",
        "no_meta": "no __meta__ entry",
        "bad_json": "unreadable",
    }[damage]
    assert expected_reason in out.message
    # the update flag replaces it
    out = check_baseline(path, torch.arange(100.0), test="t.py::t", name="x", update=True)
    assert (out.action, out.passed) == ("replaced corrupted", True)
    assert load_baseline(path).outputs["output"].tensor is not None


def test_baseline_of_another_provider_is_refused(tmp_path: Path) -> None:
    path = write_baseline(tmp_path / "t.x.npz", torch.ones(2), provider="CUDA", dtype="float16", name="x", env=FAKE_ENV)
    raw = path.read_bytes()
    out = check_baseline(path, torch.ones(2), test="t.py::t", provider="CPU", dtype="float16", name="x")
    assert out.action == "corrupted" and "written for provider 'CUDA' (this test: 'CPU')" in out.message
    assert path.read_bytes() == raw


def test_update_rewrites_drift_and_leaves_identical_files_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.x.npz"
    check_baseline(path, torch.ones(4), test="t.py::t", name="x", update=True)
    raw = path.read_bytes()
    out = check_baseline(path, torch.ones(4), test="t.py::t", name="x", update=True)
    assert out.action == "unchanged" and path.read_bytes() == raw  # no churn
    out = check_baseline(path, torch.full((4,), 2.0), test="t.py::t", name="x")
    assert (out.action, out.passed) == ("drift", False) and path.read_bytes() == raw
    assert "if the new numbers are right, accept them: pytest 't.py::t' --ortdiff-update-baselines" in out.message
    out = check_baseline(path, torch.full((4,), 2.0), test="t.py::t", name="x", update=True)
    assert (out.action, out.passed) == ("updated", True)
    assert torch.equal(load_baseline(path).outputs["output"].tensor, torch.full((4,), 2.0))


def test_atomic_writes_never_expose_half_a_file(tmp_path: Path) -> None:
    """Two writers replace the same baseline over and over while a reader loads it: every load sees one
    complete version, and no temporary file is left behind."""
    path = tmp_path / "t.x.npz"
    versions = {k: torch.full((20_000,), float(k)) for k in range(2)}
    write_baseline(path, versions[0], env=FAKE_ENV)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for _ in range(15):
                write_baseline(path, versions[k], env=FAKE_ENV)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    seen: set[float] = set()

    def reader() -> None:
        while not stop.is_set():
            t = load_baseline(path).outputs["output"].tensor
            assert t is not None
            seen.add(float(t[0]))

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert not errors
    assert seen <= {0.0, 1.0} and seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.x.json", "t.x.npz"]


def test_file_names_are_safe_and_bounded() -> None:
    assert B.baseline_test_name("tests/test_x.py::TestA::test_b[CPU-float32]") == "TestA.test_b[CPU-float32]"
    assert B.baseline_path("d", "test_a[CPU-float32]", "logits").name == "test_a[CPU-float32].logits.npz"  # kept as it is
    p = B.baseline_path("d", "test_a[CPU-float32]", "my model/v2")
    assert p.name.startswith("test_a[CPU-float32].my_model_v2~") and p.name.endswith(".npz")  # readable, marked as changed
    long = B.baseline_path("d", "test_" + "x" * 300, "y")
    assert len(long.name) < 200
    assert long != B.baseline_path("d", "test_" + "x" * 299 + "z", "y")


# -- through pytest ------------------------------------------------------------------------------

BASELINE_TEST = """
import pytest
import torch

SEED = {seed}

@pytest.mark.ortdiff(dtypes=["float32", "float16", "bfloat16", "float64"])
def test_outputs(ortdiff):
    g = torch.Generator().manual_seed(SEED)
    out = {{
        "y": torch.randn(4, 8, generator=g).to(ortdiff.torch_dtype),
        "idx": torch.arange(6) * SEED,
        "mask": torch.rand(5, generator=g) > 0.5,
    }}
    ortdiff.check_baseline("outputs", out)
"""


F32 = "--ort-dtypes=float32"


def _glob(text: str) -> str:
    return "".join({"[": "[[]", "]": "[]]", "*": "[*]", "?": "[?]"}.get(c, c) for c in text)


def _files(pytester: pytest.Pytester, module: str = "test_base") -> dict[str, bytes]:
    d = pytester.path / f"{module}_ortdiff_baselines"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.exists() else {}


def test_missing_baseline_fails_with_how_to_create_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_base=BASELINE_TEST.format(seed=0))
    result = pytester.runpytest("--ort-dtypes=float32")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*ortdiff: no baseline 'outputs' of test_base.py::test_outputs[[]CPU-float32[]] (CPU float32): expected at",
            "*test_base_ortdiff_baselines/test_outputs[[]CPU-float32[]].outputs.npz",
            "*to create it, run: pytest 'test_base.py::test_outputs[[]CPU-float32[]]' --ortdiff-update-baselines",
            "*1 baseline(s) missing: rerun with --ortdiff-update-baselines to create them",
        ]
    )
    assert _files(pytester) == {}


def test_round_trip_drift_and_update_through_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_base=BASELINE_TEST.format(seed=0))
    dtypes = "--ort-dtypes=float32,float16,bfloat16,float64"
    monkeypatch.setattr(B, "environment", lambda provider="CPU": dict(FAKE_ENV))
    result = pytester.runpytest(dtypes, "--ortdiff-update-baselines")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*- ortdiff baselines -*", "wrote 4 baseline(s) (--ortdiff-update-baselines); review and commit them:", "  created * *test_outputs[[]CPU-bfloat16[]].outputs.npz"])
    written = _files(pytester)
    assert sorted(written) == sorted(f"test_outputs[CPU-{d}].outputs.{ext}" for d in ("float32", "float16", "bfloat16", "float64") for ext in ("npz", "json"))
    meta = json.loads(written["test_outputs[CPU-bfloat16].outputs.json"])
    assert meta["test"] == "test_base.py::test_outputs[CPU-bfloat16]" and meta["provider"] == "CPU" and meta["dtype"] == "bfloat16"
    assert {k: v["dtype"] for k, v in meta["outputs"].items()} == {"y": "bfloat16", "idx": "int64", "mask": "bool"}

    # the same numbers again: passes (bitwise), one summary row per check, files untouched
    result = pytester.runpytest(dtypes)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["test_base.py::test_outputs[[]CPU-float16[]] [[]baseline outputs[]]*CPU*float16*exact*passed"])
    assert _files(pytester) == written

    # a deliberate change (another seed) under a newer onnxruntime: drift, with histogram and environment
    pytester.makepyfile(test_base=BASELINE_TEST.format(seed=1))
    monkeypatch.setattr(B, "environment", lambda provider="CPU": {**FAKE_ENV, "onnxruntime": "1.32.0", "torch": "2.13.0"})
    result = pytester.runpytest(dtypes)
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(
        [
            "*ortdiff: baseline 'outputs' of test_base.py::test_outputs[[]CPU-float32[]] (CPU float32) drifted (bitwise: any change is drift)",
            "*environment changed since the baseline was written:",
            "*    onnxruntime: 1.31.0 -> 1.32.0",
            "*    torch: 2.12.0 -> 2.13.0",
            "*  - y: 32 of 32 elements differ in their bits (float32[[]4x8[]])",
            "*|diff| >   elements   share*",
            "*           0          32  100.00 %  ██████████████████████████████",
            "*  - idx: 5 of 6 elements differ in their bits (int64[[]6[]])",
            "*if the new numbers are right, accept them: pytest 'test_base.py::test_outputs[[]CPU-float32[]]' --ortdiff-update-baselines",
        ]
    )
    result.stdout.fnmatch_lines(["test_base.py::test_outputs[[]CPU-float32[]] [[]baseline outputs[]]*CPU*float32*failed"])
    assert _files(pytester) == written  # drift never rewrites without the flag

    # the update flag rewrites them; the next run passes
    result = pytester.runpytest(dtypes, "--ortdiff-update-baselines")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["wrote 4 baseline(s)*", "  updated *"])
    rewritten = _files(pytester)
    assert all(rewritten[k] != written[k] for k in written)
    assert json.loads(rewritten["test_outputs[CPU-float32].outputs.json"])["environment"]["onnxruntime"] == "1.32.0"
    pytester.runpytest(dtypes).assert_outcomes(passed=4)


def test_corrupted_file_fails_naming_it_and_is_not_overwritten(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_base=BASELINE_TEST.format(seed=0))
    pytester.runpytest(F32, "--ortdiff-update-baselines").assert_outcomes(passed=1)
    path = pytester.path / "test_base_ortdiff_baselines" / "test_outputs[CPU-float32].outputs.npz"
    truncated = path.read_bytes()[:100]
    path.write_bytes(truncated)
    result = pytester.runpytest(F32)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the baseline file is corrupted and was NOT overwritten:",
            "*" + _glob(str(path)),
            "*reason: truncated or not a zip file (BadZipFile: *",
            "*replace it with this run's numbers: pytest 'test_base.py::test_outputs[[]CPU-float32[]]' --ortdiff-update-baselines",
            "*1 baseline file(s) corrupted and left untouched:",
        ]
    )
    assert path.read_bytes() == truncated
    result = pytester.runpytest(F32, "--ortdiff-update-baselines")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["  replaced corrupted *test_outputs[[]CPU-float32[]].outputs.npz"])
    pytester.runpytest(F32).assert_outcomes(passed=1)


def test_check_with_baseline_stores_ort_outputs_and_the_reference_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_seed="""
        from pytest_ortdiff import models

        def test_lnmm(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 2, "b": 16, "c": 32}, seed=0)
            ortdiff.check(model, feeds, baseline=True)
            ortdiff.check(model, feeds, baseline="second")
        """
    )
    pytester.runpytest("--ortdiff-update-baselines").assert_outcomes(passed=1)
    d = pytester.path / "test_seed_ortdiff_baselines"
    assert sorted(p.name for p in d.glob("*.npz")) == ["test_lnmm[CPU-float32].layer_norm_matmul_add.npz", "test_lnmm[CPU-float32].second.npz"]
    b = load_baseline(d / "test_lnmm[CPU-float32].layer_norm_matmul_add.npz")
    assert b.outputs["Z"].shape == (2, 16, 32) and b.outputs["Z"].stored == "full"
    assert b.reference_report is not None and b.reference_report.n == 1024 and 0 < b.reference_report.max_abs < 1e-3
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float32[]] [[]baseline layer_norm_matmul_add[]]*CPU*exact*passed"])


def test_same_name_twice_in_one_test_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import torch\ndef test_a(ortdiff):\n    ortdiff.check_baseline('x', torch.ones(2))\n    ortdiff.check_baseline('x', torch.ones(2))\n")
    result = pytester.runpytest("--ortdiff-update-baselines")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*baseline name 'x' is used twice in this test; give each check_baseline call its own name"])


def test_baseline_dir_option_ini_and_max_elements(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nortdiff_baseline_dir = stored\nortdiff_baseline_max_elements = 10\n")
    sub = pytester.mkpydir("pkg")
    (sub / "test_m.py").write_text("import torch\ndef test_a(ortdiff):\n    ortdiff.check_baseline('big', torch.arange(11.0))\n    ortdiff.check_baseline('small', torch.arange(10.0))\n")
    pytester.runpytest("--ortdiff-update-baselines").assert_outcomes(passed=1)
    ini_dir = pytester.path / "stored" / "pkg" / "test_m"
    assert load_baseline(ini_dir / "test_a[CPU-float32].big.npz").outputs["output"].stored == "summary"
    assert load_baseline(ini_dir / "test_a[CPU-float32].small.npz").outputs["output"].stored == "full"
    # the command line wins over the ini file
    pytester.runpytest("--ortdiff-baseline-dir=cli_dir", "--ortdiff-update-baselines").assert_outcomes(passed=1)
    assert (pytester.path / "cli_dir" / "pkg" / "test_m" / "test_a[CPU-float32].big.npz").exists()
    pytester.makeini("[pytest]\nortdiff_baseline_max_elements = lots\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini ortdiff_baseline_max_elements: expected a positive number of elements such as 65536, got 'lots'"])


def test_help_lists_the_baseline_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--ortdiff-baseline-dir=DIR*", "*--ortdiff-update-baselines*"])
    result.stdout.fnmatch_lines(["*ortdiff_baseline_dir (string)*", "*ortdiff_baseline_max_elements (string)*"])


XDIST_TEST = """
import pytest
import torch

@pytest.mark.parametrize("k", range(24))
def test_many(ortdiff, k):
    g = torch.Generator().manual_seed(k)
    ortdiff.check_baseline("a", torch.randn(64, 64, generator=g))
    ortdiff.check_baseline("b", {"x": torch.randn(300, 300, generator=g), "n": torch.arange(k + 1)})
"""


def test_two_xdist_workers_writing_baselines_lose_nothing(pytester: pytest.Pytester, xdist_args: list[str]) -> None:
    pytester.makepyfile(test_par=XDIST_TEST)
    result = pytester.runpytest(*xdist_args, "--ortdiff-update-baselines")
    result.assert_outcomes(passed=24)
    result.stdout.fnmatch_lines(["wrote 48 baseline(s) (--ortdiff-update-baselines); review and commit them:"])
    d = pytester.path / "test_par_ortdiff_baselines"
    names = sorted(p.name for p in d.iterdir())
    assert len(names) == 96 and not [n for n in names if n.endswith(".tmp")]
    for k in range(24):
        g = torch.Generator().manual_seed(k)
        a = load_baseline(d / f"test_many[CPU-float32-{k}].a.npz")
        assert torch.equal(a.outputs["output"].tensor, torch.randn(64, 64, generator=g))
        b = load_baseline(d / f"test_many[CPU-float32-{k}].b.npz")
        assert b.outputs["x"].stored == "summary" and b.outputs["x"].sha256 == hashlib.sha256(torch.randn(300, 300, generator=g).numpy().tobytes()).hexdigest()
        assert torch.equal(b.outputs["n"].tensor, torch.arange(k + 1))
    pytester.runpytest(*xdist_args).assert_outcomes(passed=24)


def test_zip_crc_damage_inside_a_valid_archive_is_caught(tmp_path: Path) -> None:
    path = write_baseline(tmp_path / "t.x.npz", {"Y": torch.arange(5000.0)}, env=FAKE_ENV)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        info = z.getinfo("full_0.npy")
    # flip a byte in the middle of the compressed data of the array
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBaselineError, match="corrupted"):
        load_baseline(path)


def test_a_changed_shape_is_a_failed_summary_row_and_a_non_tensor_is_a_type_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(
        test_s="""
        import os
        import torch

        def test_shape(ortdiff):
            n = int(os.environ.get("N", "3"))
            ortdiff.check_baseline("v", torch.ones(n))

        def test_not_a_tensor(ortdiff):
            ortdiff.check_baseline("bt", "hello")
        """
    )
    pytester.runpytest("-k", "shape", "--ortdiff-update-baselines").assert_outcomes(passed=1)
    monkeypatch.setenv("N", "2")
    result = pytester.runpytest("--ortdiff-json=job.json")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*TypeError: check_baseline('bt', ...): outputs must be a tensor or array, or a list/tuple/dict of them; got str*",
            "*test_s.py::test_shape[[]CPU-float32[]] [[]baseline v[]]*-*-*shape changed: (3,) -> (2,)*failed*",
        ]
    )
    rows = json.loads((pytester.path / "job.json").read_text())["results"]
    assert [(r["test"], r["outcome"]) for r in rows] == [("test_s.py::test_shape[CPU-float32] [baseline v]", "failed")]
    assert not list(pytester.path.rglob("*.bt.*"))


# -- adversarial files (issue 12) ---------------------------------------------------------------------


def _rezip(raw: bytes, edit: dict[str, bytes | None]) -> bytes:
    """The archive with members replaced (bytes), removed (None) or added."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename not in edit:
                dst.writestr(info.filename, src.read(info.filename))
        for name, data in edit.items():
            if data is not None:
                dst.writestr(name, data)
    return out.getvalue()


def _npy_header(header: str) -> bytes:
    body = header.encode("latin1")
    pad = 63 - (10 + len(body)) % 64
    return b"\x93NUMPY\x01\x00" + (len(body) + pad + 1).to_bytes(2, "little") + body + b" " * pad + b"\n"


def _member_offsets(raw: bytes, name: str) -> tuple[int, int]:
    """(local header, central directory entry) offsets of a member."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        local = z.getinfo(name).header_offset
    central = next(off for off in range(len(raw)) if raw[off : off + 4] == b"PK\x01\x02" and raw[off + 46 : off + 46 + len(name)] == name.encode())
    return local, central


def _damaged(raw: bytes, damage: str) -> bytes:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        info = z.getinfo("full_0.npy")
        member = z.read("full_0.npy")
    local = info.header_offset
    start = local + 30 + int.from_bytes(raw[local + 26 : local + 28], "little") + int.from_bytes(raw[local + 28 : local + 30], "little")
    bad = bytearray(raw)
    if damage == "zlib":  # a deflate block of the reserved type: zlib.error
        bad[start] = 0x07
    elif damage == "token":  # an edited .npy header that does not tokenize
        return _rezip(raw, {"full_0.npy": _npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100,), 'x': '''") + member[128:]})
    elif damage == "method":  # a compression method zipfile does not implement
        local, central = _member_offsets(raw, "full_0.npy")
        bad[local + 8 : local + 10] = bad[central + 10 : central + 12] = (99).to_bytes(2, "little")
    elif damage == "huge_header":  # a header claiming 2**40 elements: refused before any allocation
        return _rezip(raw, {"full_0.npy": _npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }") + member[128:]})
    elif damage == "bad_dtype":  # the same bits under another dtype: the same sha256, another meaning
        return _rezip(raw, {"full_0.npy": member.replace(b"'<f4'", b"'<i4'")})
    return bytes(bad)


@pytest.mark.parametrize("damage", ["zlib", "token", "method", "huge_header", "bad_dtype"])
def test_any_damage_is_corrupted_and_update_replaces_it(tmp_path: Path, damage: str) -> None:
    """Item 7: zlib.error, TokenError, NotImplementedError, ValueError, MemoryError all become
    "corrupted", naming the file; --ortdiff-update-baselines then replaces the file."""
    path = write_baseline(tmp_path / "t.x.npz", {"Y": torch.arange(100.0)}, test="t.py::t", name="x", env=FAKE_ENV)
    bad = _damaged(path.read_bytes(), damage)
    path.write_bytes(bad)
    with pytest.raises(CorruptBaselineError) as info:
        load_baseline(path)
    assert info.value.path == path and str(path) in str(info.value)
    out = check_baseline(path, torch.arange(100.0), test="t.py::t", name="x")
    assert (out.action, out.passed) == ("corrupted", False) and path.read_bytes() == bad
    out = check_baseline(path, torch.arange(100.0), test="t.py::t", name="x", update=True)
    assert (out.action, out.passed) == ("replaced corrupted", True)
    assert load_baseline(path).outputs["output"].tensor is not None


def test_an_unreadable_file_is_not_corrupted_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "t.x.npz"
    path.mkdir()  # stands for any file that cannot be read (permissions, I/O error): it may be good
    with pytest.raises(OSError):
        check_baseline(path, torch.ones(2), test="t.py::t", name="x", update=True)
    assert path.is_dir()


def test_only_referenced_members_are_inflated_with_a_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 13: a bomb member the metadata never names is never inflated; a named member larger than its
    shape x itemsize is refused before it is."""
    path = write_baseline(tmp_path / "t.x.npz", {"Y": torch.arange(10.0)}, env=FAKE_ENV)
    raw = path.read_bytes()
    bomb = b"\0" * (8 << 20)  # 8 MiB of zeros, ~8 kB compressed
    inflated: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        inflated.append(name if isinstance(name, str) else name.filename)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    path.write_bytes(_rezip(raw, {"bomb.npy": bomb}))
    inflated.clear()
    assert load_baseline(path).outputs["Y"].tensor is not None
    assert "bomb.npy" not in inflated
    path.write_bytes(_rezip(raw, {"full_0.npy": _npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }") + bomb}))
    inflated.clear()
    with pytest.raises(CorruptBaselineError, match="more than the 40 bytes of data its metadata gives it"):
        load_baseline(path)
    assert "full_0.npy" not in inflated  # refused from the zip directory's size alone


def test_names_are_injective_and_old_names_are_still_read(tmp_path: Path) -> None:
    """Item 14: `a/b` and `a_b` get two files; a baseline stored under the old name is found when its
    metadata says it is this test's, never when it is another's."""
    a = B.baseline_path(tmp_path, "test_x[a/b]", "out")
    b = B.baseline_path(tmp_path, "test_x[a_b]", "out")
    assert a != b and b.name == "test_x[a_b].out.npz"
    assert B.baseline_path(tmp_path, "T.t", "a.b") != B.baseline_path(tmp_path, "T.t.a", "b")
    # the old naming put test_x[a/b] in test_x[a_b].out.npz
    write_baseline(b, torch.ones(2), test="m.py::test_x[a/b]", name="out", env=FAKE_ENV)
    assert B.baseline_path(tmp_path, "test_x[a/b]", "out") == b  # found under its old name
    assert B.baseline_path(tmp_path, "test_x[a_b]", "out") == b  # and that name is still test_x[a_b]'s own
    write_baseline(b, torch.ones(2), test="m.py::test_x[a_b]", name="out", env=FAKE_ENV)
    assert B.baseline_path(tmp_path, "test_x[a/b]", "out") == a  # another test's file: never used


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """Item 15: a killed writer's temporary file goes (its pid is gone, or it is old); a live writer's
    fresh one and every baseline stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    keep = write_baseline(tmp_path / "t.x.npz", torch.ones(2), env=FAKE_ENV)
    old = tmp_path / ".t.x.npz.abc123.tmp"
    gone = tmp_path / f".t.y.npz.pid{dead.stdout.strip()}.abc.tmp"
    live = tmp_path / f".t.z.npz.pid{os.getpid()}.abc.tmp"
    fresh = tmp_path / ".t.x.json.zz9.tmp"
    for p in (old, gone, live, fresh):
        p.write_bytes(keep.read_bytes())
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert sorted(B.clean_stale_temp_files(tmp_path)) == sorted([old, gone])
    assert live.exists() and fresh.exists() and keep.exists() and (tmp_path / "t.x.json").exists()
    # check_baseline cleans its directory (once per process) before it reads
    os.utime(fresh, (time.time() - 3600, time.time() - 3600))
    B._CLEANED.discard(tmp_path.absolute())
    assert check_baseline(keep, torch.ones(2), test="t.py::t").passed
    assert not fresh.exists()


# -- edited metadata (issue 29, item 9) ---------------------------------------------------------------


def _two_outputs() -> dict[str, torch.Tensor]:
    """A summarized output (100 elements above max_elements=16) and a stored one."""
    return {"big": torch.linspace(-1, 1, 100), "small": torch.arange(4.0)}


def _edited(path: Path, edit: Any) -> bytes:
    """The baseline at `path` with its metadata edited by `edit(meta)` (its arrays as they are): the bytes."""
    with np.load(io.BytesIO(path.read_bytes())) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays.pop("__meta__")[()]))
    edit(meta)
    buf = io.BytesIO()
    np.savez_compressed(buf, __meta__=np.array(json.dumps(meta)), **arrays)
    return buf.getvalue()


def _setter(where: tuple[Any, ...], value: Any) -> Any:
    def edit(meta: dict[str, Any]) -> None:
        node = meta
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        (("outputs", "big", "sample_stride"), 0, "outputs['big'].sample_stride"),
        (("outputs", "big", "sample_stride"), -1, "outputs['big'].sample_stride"),
        (("outputs", "big", "sample_stride"), 10**9, "outputs['big'].sample_stride"),
        (("outputs", "big", "sample_stride"), "x", "outputs['big'].sample_stride"),
        (("outputs", "big", "sample_count"), 10**6, "outputs['big'].sample_count"),
        (("outputs", "big", "quantiles"), {"0.5": "x"}, "outputs['big'].quantiles['0.5']"),
        (("outputs", "big", "quantiles"), [0.5], "outputs['big'].quantiles"),
        (("outputs", "big", "nan"), "many", "outputs['big'].nan"),
        (("outputs", "small", "shape"), ["4"], "outputs['small'].shape[0]"),
        (("outputs", "small", "dtype"), "float8_e4m3fn", "outputs['small'].dtype"),
        (("outputs", "small", "stored"), 3, "outputs['small'].stored"),
        (("environment",), ["onnxruntime", "1.31.0"], "environment"),
        (("environment",), {"torch": {"version": 2}}, "environment['torch']"),
        (("provider",), "NoSuchProvider", "provider"),
        (("provider",), ["CPU"], "provider"),
        (("name",), 7, "name"),
        (("written_at",), {"when": 1}, "written_at"),
        (("reference_report",), {"max_abs": "x"}, "reference_report"),
        (("outputs",), [], "outputs"),
    ],
)
def test_edited_metadata_is_a_corrupted_baseline_that_update_replaces(tmp_path: Path, where: tuple[Any, ...], value: Any, named: str) -> None:
    path = write_baseline(tmp_path / "t.x.npz", _two_outputs(), test="t.py::t", name="x", max_elements=16, env=FAKE_ENV)
    bad = _edited(path, _setter(where, value))
    path.write_bytes(bad)
    with pytest.raises(CorruptBaselineError, match=re.escape(f"metadata {named} is ")):
        load_baseline(path)
    out = check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16)
    assert (out.action, out.passed) == ("corrupted", False), out.message
    assert f"metadata {named} is " in out.message and "--ortdiff-update-baselines" in out.message and "git checkout" in out.message
    assert path.read_bytes() == bad
    out = check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16, update=True)
    assert (out.action, out.passed) == ("replaced corrupted", True)
    assert check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16).action == "unchanged"


#: values an edit may leave in any field of the metadata
HOSTILE = [0, -1, 1, 10**9, 10**30, 2.5, float("nan"), True, None, "", "x", "float32", "CPU", [], [1], ["x"], {}, {"a": 1}, {"0.5": "x"}]


def _paths(node: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field of the metadata (nested ones too), as key paths."""
    out = [where] if where else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*where, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*where, i))
    return out


def test_any_edit_of_the_metadata_is_corrupted_or_harmless_and_update_replaces_it(tmp_path: Path) -> None:
    """Hypothesis: any field (at any depth) set to any of HOSTILE values: check_baseline never raises; it says
    the file is corrupted (and leaves it), or the edit does not matter; with update the check passes and the
    file is whole again."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    path = write_baseline(tmp_path / "t.x.npz", _two_outputs(), test="t.py::t", name="x", max_elements=16, env=FAKE_ENV)
    good = path.read_bytes()
    with np.load(io.BytesIO(good)) as npz:
        fields = _paths(json.loads(str(npz["__meta__"][()])))

    @settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(fields), st.sampled_from(HOSTILE))
    def edit(where: tuple[Any, ...], value: Any) -> None:
        path.write_bytes(good)
        bad = _edited(path, _setter(where, value))
        path.write_bytes(bad)
        out = check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16)
        assert out.action in ("corrupted", "unchanged"), (where, value, out.message)
        if out.action == "corrupted":
            assert path.read_bytes() == bad and "--ortdiff-update-baselines" in out.message
        fixed = check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16, update=True)
        assert fixed.passed and fixed.action in ("replaced corrupted", "unchanged"), (where, value, fixed.message)
        assert check_baseline(path, _two_outputs(), test="t.py::t", name="x", max_elements=16).action == "unchanged"

    edit()


def test_a_baseline_that_cannot_be_written_is_one_failure_not_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only (immutable) baseline directory with --ortdiff-update-baselines: a PermissionError traceback
    per test, from write_atomically's mkstemp. Now the outcome says so in one message and fails."""
    import tempfile

    from pytest_ortdiff.engine.baseline import check_baseline

    def refuse(*args: object, dir: object = None, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted", str(dir))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    path = tmp_path / "bl" / "t.mlp.npz"
    outcome = check_baseline(path, {"y": torch.ones(3)}, test="t.py::t", provider="CPU", dtype="float32", name="mlp", update=True)
    assert (outcome.action, outcome.passed) == ("unwritable", False)
    assert outcome.message == (
        f"ortdiff: baseline 'mlp' of t.py::t (CPU float32): cannot write {path}: Operation not permitted ({path.parent}); nothing was written "
        "and what was there is untouched. Make the directory writable, or point --ortdiff-baseline-dir at one that is"
    )
    assert not path.exists()
