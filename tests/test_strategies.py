"""Hypothesis strategies and ortdiff.fuzz: dims respect constraints, regimes produce what they say,
a deliberately broken kernel is found and shrunk to the boundary, profiles are registered."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_ortdiff import compare, models
from pytest_ortdiff.analyses import strategies
from pytest_ortdiff.plugin.fixtures import OrtDiff, OrtDiffFailure


def fake_attention(dtype="float32", hidden=8, heads=2):
    raise NotImplementedError  # only its declared dims/constraints are used here


fake_attention.dims = {"hidden": (1, 64), "heads": (1, 8), "kv_heads": (1, 8)}
fake_attention.constraints = ("hidden % heads == 0", "heads % kv_heads == 0", "(hidden // heads) % 2 == 0")


@settings(max_examples=50, deadline=None)
@given(strategies.dims(fake_attention))
def test_dims_respect_builder_constraints(d: dict[str, int]) -> None:
    assert 1 <= d["hidden"] <= 64 and 1 <= d["heads"] <= 8
    assert d["hidden"] % d["heads"] == 0
    assert d["heads"] % d["kv_heads"] == 0
    assert (d["hidden"] // d["heads"]) % 2 == 0


@settings(max_examples=30, deadline=None)
@given(strategies.dims(models.layer_norm_matmul_add, a=2, c=(8, 16), max_size=2 * 64 * 16))
def test_dims_bounds_override_and_pin(d: dict[str, int]) -> None:
    assert d["a"] == 2 and 8 <= d["c"] <= 16 and d["a"] * d["b"] * d["c"] <= 2 * 64 * 16


def test_symbolic_dims_of_a_model() -> None:
    assert strategies.symbolic_dims(models.layer_norm_matmul_add()) == ["a", "b", "c"]


@settings(max_examples=20, deadline=None)
@given(strategies.dims(models.layer_norm_matmul_add()))
def test_dims_of_a_model_default_to_1_64(d: dict[str, int]) -> None:
    assert set(d) == {"a", "b", "c"} and all(1 <= v <= 64 for v in d.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"z": 3}, "'z' is not a dim of this model/builder; its dims are \\['a', 'b', 'c'\\]"),
        ({"c": (5, 2)}, "bounds for 'c' must satisfy 0 <= low <= high, got \\(5, 2\\)"),
        ({"max_size": 0}, "max_size must be >= 1"),
    ],
)
def test_dims_validates_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        strategies.dims(models.layer_norm_matmul_add, **kwargs)


def test_builder_without_ranges_is_an_error() -> None:
    with pytest.raises(ValueError, match="declares no `dims` ranges"):
        strategies.dims(lambda dtype: None)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_regimes_produce_what_they_say(dtype: str) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    values = {"a": 2, "b": 32, "c": 64}
    info = torch.finfo(getattr(torch, dtype))
    large = strategies.make_feeds(model, values, "large", 1)["X"]
    assert large.dtype == getattr(torch, dtype) and large.shape == (2, 32, 64)
    assert large.abs().min() >= 2.0 ** ((math.log2(info.max) - 4) / 2) * 0.99
    assert bool(torch.isfinite(large).all())
    tiny = strategies.make_feeds(model, values, "tiny", 1)["X"].float().abs()
    assert tiny.max() <= info.tiny * 2**6 * 1.01
    special = strategies.make_feeds(model, values, "special", 1)["X"]
    assert bool(torch.isnan(special).any()) and bool(torch.isinf(special).any()) and bool((special == 0).any())
    uniform = strategies.make_feeds(model, values, "uniform", 1)
    assert float(uniform["X"].min()) >= -60 and float(uniform["X"].max()) <= 60
    assert float(uniform["scale"].min()) >= 0 and float(uniform["scale"].max()) <= 1
    # deterministic in (dims, regime, seed): a failure report's three values reproduce it
    again = strategies.make_feeds(model, values, "special", 1)["X"]
    assert torch.equal(torch.nan_to_num(again), torch.nan_to_num(special))
    with pytest.raises(ValueError, match="unknown regime 'huge'; valid: normal, uniform, large, tiny, special"):
        strategies.make_feeds(model, values, "huge", 1)


@settings(max_examples=40, deadline=None)
@given(
    strategies.feeds(
        models.layer_norm_matmul_add(dtype="float16"),
        strategies.dims(models.layer_norm_matmul_add, a=(1, 2), b=(1, 8), c=(1, 32)),
        regime=st.sampled_from(strategies.REGIMES),
    )
)
def test_diff_against_numpy_float64_on_fuzzed_values(feeds: dict[str, torch.Tensor]) -> None:
    # the diff engine against an independent float64 numpy reference, on every regime (NaN/Inf included)
    e = feeds["X"]
    g = (e.double() * (1 + 2.0**-9)).half()  # a ~half-ULP relative perturbation, overflow possible
    report = compare(e, g, thresholds=[0.0, 1e-3, 1.0])
    en, gn = e.double().numpy(), g.double().numpy()
    both_nan = np.isnan(en) & np.isnan(gn)
    same = (en == gn) | both_nan
    nan_mis = np.isnan(en) ^ np.isnan(gn)
    inf_mis = (np.isinf(en) | np.isinf(gn)) & ~same & ~np.isnan(en) & ~np.isnan(gn)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
        d = np.where(same, 0.0, np.abs(en - gn))
    d = np.where(nan_mis | inf_mis, np.inf, d)
    assert report.nan_mismatch == int(nan_mis.sum()) and report.inf_mismatch == int(inf_mis.sum())
    for t in (0.0, 1e-3, 1.0):
        assert report.counts[t] == int((d > t).sum())
    finite = np.where(np.isinf(d), 0.0, d)
    assert report.max_abs == float(finite.max())


@settings(max_examples=25, deadline=None)
@given(strategies.dims(models.layer_norm_matmul_add, b=(1, 8), c=(2, 48)), st.integers(0, 1000))
def test_evaluator_against_onnx_reference_on_fuzzed_shapes(d: dict[str, int], seed: int) -> None:
    from onnx.reference import ReferenceEvaluator

    from pytest_ortdiff import TorchEvaluator

    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = strategies.make_feeds(model, d, "normal", seed)
    ours = TorchEvaluator(model).run(None, feeds)[0]
    ref = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})[0]
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-4, atol=1e-4)


def _broken_layer_norm(x, scale, bias):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, bias, 1e-5)
    return y + 1.0 if x.shape[-1] > 40 else y  # wrong only past a size


def test_fuzz_finds_and_shrinks_to_the_boundary() -> None:
    checker = OrtDiff("CPU", "float32")
    with pytest.raises(OrtDiffFailure) as info:
        checker.fuzz(models.layer_norm_matmul_add, kernels={("", "LayerNormalization"): _broken_layer_norm}, max_examples=200)
    message = str(info.value)
    assert "smallest failing case (shrunk by hypothesis): dims={'a': 1, 'b': 1, 'c': 41}" in message
    assert "|diff| >" in message  # the histogram
    assert "reproduce: from pytest_ortdiff import models, strategies; model = models.layer_norm_matmul_add(dtype='float32'); feeds = strategies.make_feeds(model, {'a': 1, 'b': 1, 'c': 41}" in message


def _softmax_broken_past_8_keys(x: torch.Tensor) -> torch.Tensor:
    y = torch.softmax(x, dim=-1)
    return y * 1.01 if x.shape[-1] > 8 else y  # wrong only for more than 8 keys


def test_fuzz_rebuilds_graphs_for_builder_dims_and_shrinks_them() -> None:
    # hidden/heads/kv_heads/past are builder arguments (the graph changes), batch/seq feed dims: fuzz
    # rebuilds the model per combination and shrinks past + seq to the smallest count of keys that fails
    checker = OrtDiff("CPU", "float32")
    with pytest.raises(OrtDiffFailure) as info:
        checker.fuzz(
            models.llama_attention,
            dims={"hidden": (8, 32), "heads": (1, 2), "kv_heads": (1, 2), "past": (0, 8), "seq": (1, 12)},
            kernels={("", "Softmax"): _softmax_broken_past_8_keys},
            max_examples=150,
        )
    message = str(info.value)
    line = next(x for x in message.splitlines() if "smallest failing case" in x)
    values = eval(line.split("dims=")[1].split(" regime=")[0])
    assert values["past"] + values["seq"] == 9, line  # the boundary: 9 keys
    assert values["batch"] == 1 and values["heads"] == values["kv_heads"] == 1, line
    assert "reproduce: from pytest_ortdiff import models, strategies; model = models.llama_attention(dtype='float32', hidden=" in message
    # the reproduce line really rebuilds the failing case
    repro = next(x for x in message.splitlines() if "reproduce:" in x).split("reproduce: ")[1]
    scope: dict = {}
    exec(repro, scope)  # (as it is: its imports included)
    assert scope["feeds"]["hidden_states"].shape[-1] == values["hidden"]


def test_fuzz_passing_returns_statistics() -> None:
    stats = OrtDiff("CPU", "float32").fuzz(models.layer_norm_matmul_add, dims={"c": (1, 64)}, max_examples=30)
    assert stats["examples"] == 30
    assert 0 <= stats["max_abs"] < 1e-3
    assert set(stats["worst_dims"]) == {"a", "b", "c"}


def test_providers_and_dtypes_follow_the_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from hypothesis import given, settings
        from pytest_ortdiff.analyses import strategies

        @settings(max_examples=20)
        @given(strategies.dtypes(), strategies.providers())
        def test_a(dtype, provider):
            assert dtype in ("float16", "float64")
            assert provider == "CPU"
        """
    )
    pytester.runpytest("--ort-dtypes=float16,float64").assert_outcomes(passed=1)


def test_profiles_are_registered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from hypothesis import settings

        def test_a():
            assert settings.default.derandomize is True
            assert settings.default.deadline is None
            assert settings.default.max_examples == 50
            assert settings.default.print_blob is True
        """
    )
    result = pytester.runpytest("--hypothesis-profile=ortdiff-ci")
    result.assert_outcomes(passed=1)


def test_fuzz_failure_in_a_test_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fz="""
        import torch
        import pytest
        from pytest_ortdiff import models

        def broken(x, scale, bias):
            y = torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, bias, 1e-5)
            return y + 1.0 if x.shape[1] > 7 else y

        def test_fuzz(ortdiff):
            ortdiff.fuzz(models.layer_norm_matmul_add, kernels={("", "LayerNormalization"): broken})
        """
    )
    result = pytester.runpytest("--hypothesis-profile=ortdiff-ci")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*smallest failing case (shrunk by hypothesis): dims={'a': 1, 'b': 8, 'c': 1}*"])
    result.stdout.fnmatch_lines(["test_fz.py::test_fuzz[[]CPU-float32[]] [[]fuzz[]] * failed"])


def user_builder(dtype: str = "float32", c: int = 8) -> Any:
    """A builder of the user's own, in their module (here: this test module)."""
    return models.layer_norm_matmul_add(dtype=dtype)


user_builder.build_dims = ("c",)  # type: ignore[attr-defined]


def test_fuzz_reproduce_line_for_a_users_builder_is_runnable() -> None:
    """Issue 30: it read `models.build(dtype='float32')` (no such builder): the user's own builder is imported
    from the user's module, a model file loaded from its path, and the line runs as printed."""
    from pytest_ortdiff.analyses.fuzz import _reproduce_line

    line = _reproduce_line("float32", user_builder, ("c",), {"a": 1, "b": 2, "c": 8}, "normal", 3)
    assert line == (
        f"from {user_builder.__module__} import user_builder; from pytest_ortdiff import strategies; "
        "model = user_builder(dtype='float32', c=8); feeds = strategies.make_feeds(model, {'a': 1, 'b': 2, 'c': 8}, 'normal', 3)"
    )
    scope: dict = {}
    exec(line, scope)
    assert scope["feeds"]["X"].shape == (1, 2, 8)

    def local(dtype: str) -> Any:
        return models.layer_norm_matmul_add(dtype=dtype)

    line = _reproduce_line("float16", local, (), {"a": 1, "b": 1, "c": 4}, "normal", 0)
    assert line.startswith("from pytest_ortdiff import strategies; model = local(dtype='float16'); feeds = ")
    assert f"(test_fuzz_reproduce_line_for_a_users_builder_is_runnable.<locals>.local of {__name__}: the builder given to fuzz)" in line
    assert _reproduce_line("float32", "m.onnx", (), {"a": 1}, "normal", 0) == "import onnx; from pytest_ortdiff import strategies; model = onnx.load('m.onnx'); feeds = strategies.make_feeds(model, {'a': 1}, 'normal', 0)"
