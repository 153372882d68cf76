"""The resampling kernels (Resize, Upsample, GridSample, AffineGrid) on one-node models against
onnx.reference, onnxruntime and the float64 oracle, and F.interpolate exported by both torch exporters.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from kernel_harness import (
    REF_TOL,
    assert_outputs_close,
    check_node,
    given,
    one_node_model,
    run_ort,
    run_reference,
    run_torch,
)
from torch import nn

from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
# check_node's float16 pass retypes every float32 initializer, Resize's scales and roi included, which Resize
# refuses: Resize's float16 runs are checked against onnxruntime by _check_float16 instead
F32 = ("float32", "float64")


def _resize_model(
    opset: int, *, scales: list[float] | None = None, sizes: list[int] | None = None,
    roi: list[float] | None = None, x: np.ndarray = X, **attrs: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inits: dict[str, np.ndarray] = {"roi": np.array(roi or [], np.float32)}
    inits["scales"] = np.array(scales or [], np.float32)
    if sizes is not None:
        inits["sizes"] = np.array(sizes, np.int64)
    inputs: dict[str, np.ndarray | None] = {"X": x, "roi": None, "scales": None, "sizes": None}
    return one_node_model("Resize", inputs, ["Y"], opset, initializers=inits, **attrs), given({"X": x})


UP = [1.0, 1.0, 1.75, 2.4]  # non-integer factors put x_original between pixels (and on .5 ties)
DOWN = [1.0, 1.0, 0.5, 0.6]
# align_corners divides by scale * length - 1, which onnx.reference (and ONNX's node tests) take fractional and
# onnxruntime takes as the integer output length: factors whose products are integers keep both references.
ALIGN_UP = [1.0, 1.0, 1.75, 3.0]
ALIGN_DOWN = [1.0, 1.0, 0.5, 0.8]
# onnx.reference computes cubic weights in float32 (a float32 attribute in numpy 2 arithmetic): its float64
# results are float32-accurate only
CUBIC = {"tol": {"float64": (1e-5, 1e-6)}}

# (id, scales, attrs, check_node kwargs): one row per mode, coordinate transform, nearest_mode /
# cubic_coeff_a, antialias
RESIZE_TABLE: list[tuple[str, list[float], dict[str, Any], dict[str, Any]]] = [
    ("nearest-floor-half_pixel-up", UP, {"mode": "nearest", "nearest_mode": "round_prefer_floor"}, {}),
    ("nearest-ceil-asymmetric-down", DOWN, {"mode": "nearest", "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"}, {}),
    ("nearest-floor-align_corners-up", ALIGN_UP, {"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "align_corners"}, {}),
    ("nearest-ceil-pytorch_half_pixel-down", DOWN, {"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "pytorch_half_pixel"}, {}),
    ("linear-half_pixel-up", UP, {"mode": "linear"}, {}),
    ("linear-half_pixel_symmetric-down", DOWN, {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, {}),
    ("linear-align_corners-down", ALIGN_DOWN, {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, {}),
    ("linear-asymmetric-up", UP, {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, {}),
    ("linear-antialias-down", DOWN, {"mode": "linear", "antialias": 1}, {}),
    ("cubic-a0.5-pytorch_half_pixel-up", UP, {"mode": "cubic", "cubic_coeff_a": -0.5, "coordinate_transformation_mode": "pytorch_half_pixel"}, CUBIC),
    ("cubic-exclude_outside-down", DOWN, {"mode": "cubic", "exclude_outside": 1}, CUBIC),
    ("cubic-antialias-down", DOWN, {"mode": "cubic", "antialias": 1}, CUBIC),
]


@pytest.mark.parametrize(("scales", "attrs", "kw"), [pytest.param(s, a, k, id=i) for i, s, a, k in RESIZE_TABLE])
def test_resize_table(scales: list[float], attrs: dict[str, Any], kw: dict[str, Any]) -> None:
    model, feeds = _resize_model(19, scales=scales, **attrs)
    check_node(model, feeds, dtypes=F32, **kw)
    _check_float16(opset=19, scales=scales, **attrs)


def _check_float16(**kwargs: Any) -> None:
    """The Resize `_resize_model(**kwargs)` builds, on float16 X (scales and roi stay float32), against
    onnxruntime: the kernel interpolates in float32 and rounds once, as onnxruntime does."""
    x16 = X.astype(np.float16)
    model, feeds = _resize_model(x=x16, **kwargs)
    (got,) = run_torch(model, feeds)
    (exp,) = run_ort(model, feeds)
    assert got.dtype == np.float16
    assert_outputs_close([got], [exp], REF_TOL["float16"], ["Y"])


def test_resize_tf_crop_and_resize_with_extrapolation() -> None:
    model, feeds = _resize_model(
        13, sizes=[1, 2, 3, 3], roi=[0, 0, 0.4, -0.2, 1, 1, 1.3, 0.9], mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0,
    )
    check_node(model, feeds, dtypes=F32)
    (got,) = run_torch(model, feeds)
    assert (got == 7.0).any()  # part of the crop lies outside X
    _check_float16(
        opset=13, sizes=[1, 2, 3, 3], roi=[0, 0, 0.4, -0.2, 1, 1, 1.3, 0.9], mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0,
    )


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_sizes_axes_and_keep_aspect_ratio(policy: str) -> None:
    model, feeds = _resize_model(
        18, sizes=[5, 8], mode="nearest", axes=[3, 2], keep_aspect_ratio_policy=policy
    )
    check_node(model, feeds, dtypes=F32)
    _check_float16(opset=18, sizes=[5, 8], mode="nearest", axes=[3, 2], keep_aspect_ratio_policy=policy)


def test_resize_opset11_tf_half_pixel_for_nn() -> None:
    # onnx.reference lacks this (opset-11-only) transform: onnxruntime is the reference
    model, feeds = _resize_model(11, scales=UP, mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn")
    check_node(model, feeds, dtypes=F32, reference="ort")


def test_resize_uint8_linear_rounds() -> None:
    x = RNG.integers(0, 256, (1, 1, 3, 4), dtype=np.uint8)
    model, feeds = _resize_model(19, scales=[1, 1, 2.0, 1.5], x=x, mode="linear")
    (got,) = run_torch(model, feeds)
    (exp,) = run_ort(model, feeds)
    assert got.dtype == np.uint8
    assert np.abs(got.astype(int) - exp.astype(int)).max() <= 1


@pytest.mark.parametrize(
    ("opset", "mode", "scales"),
    [(10, "nearest", [1, 1, 0.6, 2.5]), (10, "linear", [1, 1, 2, 1.5]), (9, "nearest", [1, 1, 2, 3]), (9, "linear", [1, 1, 2, 1.5])],
)
def test_resize10_and_upsample9(opset: int, mode: str, scales: list[float]) -> None:
    op = "Resize" if opset == 10 else "Upsample"
    inputs: dict[str, np.ndarray | None] = {"X": X, "scales": None}
    model = one_node_model(op, inputs, ["Y"], opset, initializers={"scales": np.array(scales, np.float32)}, mode=mode)
    check_node(model, {"X": X}, dtypes=F32, reference="ort")


def test_upsample7_scales_attribute() -> None:
    model = one_node_model("Upsample", {"X": X}, ["Y"], 7, mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])
    check_node(model, {"X": X}, dtypes=F32, reference="ort")


# -- GridSample / AffineGrid ---------------------------------------------------------------------

GRID = (RNG.random((1, 3, 4, 2)) * 2.6 - 1.3).astype(np.float32)  # some points outside [-1, 1]
# onnx.reference denormalizes grid points in float32: its float64 results are float32-accurate only
GS_TOL = {"float64": (1e-5, 1e-6)}


@pytest.mark.parametrize(
    ("opset", "mode", "padding", "align"),
    [
        (16, "bilinear", "zeros", 0),
        (16, "nearest", "border", 1),
        (16, "bicubic", "reflection", 0),
        (20, "cubic", "border", 1),
        (20, "linear", "reflection", 1),
        (20, "nearest", "reflection", 0),
    ],
)
def test_grid_sample_4d(opset: int, mode: str, padding: str, align: int) -> None:
    feeds = {"X": X, "grid": GRID}
    model = one_node_model("GridSample", feeds, ["Y"], opset, mode=mode, padding_mode=padding, align_corners=align)
    # onnx.reference knows only opset 20's mode names, and
    # clamps a cubic point into the border before taking its taps where onnxruntime and torch clamp each tap
    reference = "ort" if opset == 16 or (mode, padding) == ("cubic", "border") else "both"
    check_node(model, feeds, reference=reference, tol=GS_TOL)


@pytest.mark.parametrize(
    ("x_shape", "grid_shape", "mode", "padding"),
    [
        ((1, 2, 3, 4, 3), (1, 2, 2, 3, 3), "linear", "zeros"),
        ((1, 2, 3, 4, 3), (1, 2, 2, 3, 3), "cubic", "reflection"),
        ((2, 3, 6), (2, 5, 1), "nearest", "border"),
    ],
)
def test_grid_sample_nd(
    x_shape: tuple[int, ...], grid_shape: tuple[int, ...], mode: str, padding: str
) -> None:
    feeds = {
        "X": RNG.standard_normal(x_shape).astype(np.float32),
        "grid": (RNG.random(grid_shape) * 2.4 - 1.2).astype(np.float32),
    }
    model = one_node_model("GridSample", feeds, ["Y"], 20, mode=mode, padding_mode=padding)
    # onnxruntime's CPU kernel is 4-D only: onnx.reference is the reference
    check_node(model, feeds, dtypes=F32, reference="onnx", tol=GS_TOL)


def test_unsupported_variants_are_refused_by_name() -> None:
    # tf_half_pixel_for_nn left the spec at opset 13: refused, not approximated
    model, feeds = _resize_model(11, scales=UP, mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn")
    model.opset_import[0].version = 13
    with pytest.raises(Exception, match="tf_half_pixel_for_nn") as info:
        run_torch(model, feeds, check_model=False)
    chain: BaseException | None = info.value
    while chain is not None and not isinstance(chain, UnsupportedVariantError):
        chain = chain.__cause__
    assert chain is not None


@pytest.mark.parametrize(("dims", "align"), [((2, 3, 4, 5), 0), ((2, 3, 2, 4, 5), 1)])
def test_affine_grid(dims: tuple[int, ...], align: int) -> None:
    r = len(dims) - 2
    theta = RNG.standard_normal((2, r, r + 1)).astype(np.float32)
    model = one_node_model(
        "AffineGrid", {"theta": theta, "size": None}, ["grid"], 20,
        initializers={"size": np.array(dims, np.int64)}, align_corners=align,
    )
    # onnx.reference returns a float32 grid whatever theta's type: the oracle is checked against it loosely
    check_node(model, {"theta": theta}, dtypes=("float32", "float16"))
    oracle = run_torch(model, {"theta": theta}, compute_dtype=torch.float64)
    assert_outputs_close(oracle, run_reference(model, {"theta": theta}), (1e-5, 1e-6), ["grid"], check_dtype=False)


# -- real exports ---------------------------------------------------------------------------------


class Interpolations(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.interpolate(x, scale_factor=2.0, mode="nearest"),
            F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False),
            F.interpolate(x, size=(3, 7), mode="bilinear", align_corners=True),
            F.interpolate(x, scale_factor=1.5, mode="bicubic", align_corners=False),
            # exported with scales=1.5: ONNX divides by 1.5 * 5 - 1, torch and onnxruntime by 7 - 1
            F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
        )


@pytest.fixture(scope="session")
def interpolate_exports() -> dict[str, onnx.ModelProto]:
    module = Interpolations().eval()
    args = (torch.randn(1, 2, 4, 5, generator=torch.Generator().manual_seed(3)),)
    out: dict[str, onnx.ModelProto] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own deprecation and tracer warnings
        program = torch.onnx.export(module, args, dynamo=True, verbose=False)
        assert program is not None
        out["dynamo"] = program.model_proto
        buf = io.BytesIO()
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=18)
        out["torchscript"] = onnx.load_from_string(buf.getvalue())
    return out


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_interpolate_exports_agree_with_onnxruntime(
    interpolate_exports: dict[str, onnx.ModelProto], exporter: str
) -> None:
    model = interpolate_exports[exporter]
    assert "Resize" in {n.op_type for n in model.graph.node}
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    got, expected, reference = run_torch(model, feeds), run_ort(model, feeds), run_reference(model, feeds)
    eager = Interpolations()(torch.from_numpy(x))
    for i, (g, e, r, t) in enumerate(zip(got, expected, reference, eager, strict=True)):
        scale = float(np.abs(e).max())
        assert float(np.abs(g - r).max()) <= 1e-5 * scale  # the evaluator follows ONNX's semantics
        if i < 4:
            assert float(np.abs(g - e).max()) <= 1e-5 * scale  # and agrees with onnxruntime
            assert float(np.abs(g - t.numpy()).max()) <= 1e-5 * scale  # and with torch itself
        else:
            # align_corners with a fractional scale * length: onnxruntime and torch (which agree) are off
            # the spec's definition, and the evaluator says so rather than follow them
            assert float(np.abs(e - t.numpy()).max()) <= 1e-5 * scale
            assert float(np.abs(g - e).max()) > 1e-2 * scale
