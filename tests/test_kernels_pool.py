"""The pooling kernels (MaxPool with Indices, AveragePool, LpPool, the global pools, MaxUnpool, MaxRoiPool)
on one-node models against onnx.reference, onnxruntime and the float64 oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kernel_harness import check_node, one_node_model, run_ort, run_reference, run_torch

RNG = np.random.default_rng(1)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


MAXPOOL_CASES: dict[str, tuple[tuple[int, ...], int, dict[str, Any]]] = {
    # name: (X shape, opset, attributes); every case asks for Indices
    "2d-pads-strides": ((2, 3, 7, 6), 12, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    "2d-ceil-dilations": ((1, 2, 8, 7), 12, {"kernel_shape": [2, 2], "strides": [2, 3], "dilations": [2, 1],
                                             "ceil_mode": 1, "pads": [0, 1, 1, 0]}),
    "2d-storage_order": ((1, 2, 5, 4), 12, {"kernel_shape": [2, 2], "storage_order": 1}),
    "1d-same-upper": ((1, 2, 9), 22, {"kernel_shape": [4], "strides": [2], "auto_pad": "SAME_UPPER"}),
    "3d-same-lower": ((1, 1, 4, 5, 3), 11, {"kernel_shape": [2, 3, 2], "auto_pad": "SAME_LOWER"}),
    "2d-opset8": ((1, 2, 5, 5), 8, {"kernel_shape": [3, 3], "strides": [2, 2]}),
}


# onnx.reference gets storage_order=1's Indices wrong and fails on 3-D SAME_LOWER: onnxruntime there
_ORT_ONLY = {"2d-storage_order", "3d-same-lower"}


@pytest.mark.parametrize("case", list(MAXPOOL_CASES))
def test_max_pool_with_indices(case: str) -> None:
    xs, opset, attrs = MAXPOOL_CASES[case]
    feeds = {"X": _f(*xs)}
    model = one_node_model("MaxPool", feeds, ["Y", "Indices"], opset, **attrs)
    check_node(model, feeds, reference="ort" if case in _ORT_ONLY else "both")


def test_max_pool_int8_is_exact() -> None:
    feeds = {"X": RNG.integers(-128, 128, (1, 2, 6, 6), dtype=np.int8)}
    model = one_node_model("MaxPool", feeds, ["Y"], 12, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    np.testing.assert_array_equal(run_torch(model, feeds)[0], run_ort(model, feeds)[0])


AVGPOOL_CASES: dict[str, tuple[tuple[int, ...], int, dict[str, Any]]] = {
    "count_include_pad": ((1, 2, 6, 5), 11, {"kernel_shape": [3, 3], "pads": [1, 2, 1, 0], "count_include_pad": 1}),
    "ceil-drops-last-window": ((1, 2, 7, 6), 19, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                                  "ceil_mode": 1}),
    "ceil-count_include_pad": ((1, 1, 6, 6), 19, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                                  "ceil_mode": 1, "count_include_pad": 1}),
    "dilations": ((1, 2, 8, 7), 19, {"kernel_shape": [2, 3], "dilations": [3, 2], "pads": [1, 1, 0, 1]}),
    "same-lower-1d": ((2, 2, 7), 10, {"kernel_shape": [4], "strides": [3], "auto_pad": "SAME_LOWER"}),
    "3d-valid": ((1, 1, 4, 5, 4), 22, {"kernel_shape": [2, 2, 3], "strides": [2, 1, 1], "auto_pad": "VALID"}),
}


@pytest.mark.parametrize("case", list(AVGPOOL_CASES))
def test_average_pool(case: str) -> None:
    xs, opset, attrs = AVGPOOL_CASES[case]
    feeds = {"X": _f(*xs)}
    check_node(one_node_model("AveragePool", feeds, ["Y"], opset, **attrs), feeds)


@pytest.mark.parametrize(
    ("opset", "attrs"),
    [
        (11, {"kernel_shape": [2, 2], "p": 3, "pads": [1, 0, 0, 1]}),
        # onnx.reference counts an element twice in a ceil_mode window that reaches past the input (a factor
        # sqrt(2) for p=2), and onnxruntime ignores LpPool-18's dilations: ceil_mode is covered by AveragePool
        (18, {"kernel_shape": [3, 2], "p": 2, "strides": [2, 2], "dilations": [1, 2]}),
    ],
    ids=["p3-pads", "dilations"],
)
def test_lp_pool(opset: int, attrs: dict[str, Any]) -> None:
    feeds = {"X": _f(1, 2, 7, 6)}
    model = one_node_model("LpPool", feeds, ["Y"], opset, **attrs)
    # onnxruntime's LpPool ignores dilations and ceil_mode (LpPool-18): onnx.reference for those
    reference = "both" if opset < 18 else "onnx"
    check_node(model, feeds, reference=reference, dtypes=("float32", "float64") if opset >= 18 else
               ("float32", "float16", "float64"))


@pytest.mark.parametrize(("op", "attrs"), [("GlobalAveragePool", {}), ("GlobalMaxPool", {}), ("GlobalLpPool", {"p": 3})])
def test_global_pools(op: str, attrs: dict[str, Any]) -> None:
    feeds = {"X": _f(2, 3, 4, 5)}
    # onnx.reference has no GlobalLpPool
    model = one_node_model(op, feeds, ["Y"], 11 if op == "GlobalLpPool" else 22, **attrs)
    check_node(model, feeds, reference="ort" if op == "GlobalLpPool" else "both")


def test_max_unpool_inverts_max_pool() -> None:
    x = _f(1, 2, 4, 6)
    pool = one_node_model("MaxPool", {"X": x}, ["Y", "I"], 12, kernel_shape=[2, 2], strides=[2, 2])
    y, idx = run_torch(pool, {"X": x})
    feeds = {"X": y, "I": idx}
    model = one_node_model("MaxUnpool", feeds, ["Y"], 11, kernel_shape=[2, 2], strides=[2, 2])
    got = run_torch(model, feeds)[0]
    np.testing.assert_array_equal(got, run_reference(model, feeds)[0])
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])
    # every pooled value back at its place, the rest zero
    np.testing.assert_array_equal(got[got != 0], x[got != 0])
    np.testing.assert_array_equal(np.sort(got[got != 0]), np.sort(y.ravel()))
    # (the output_shape input is covered by the conformance case test_maxunpool_export_with_output_shape)


def test_max_roi_pool_matches_onnxruntime() -> None:
    # onnx.reference has no MaxRoiPool: onnxruntime only. spatial_scale=0.9 puts a RoI corner on a rounding
    # tie (5 * 0.9f is 4.5 in float32, 4.4999999 in float64): the float64 oracle must still pick the float32
    # model's pixels, so the bin geometry is float32 in every mode
    feeds = {
        "X": _f(2, 3, 8, 9),
        "rois": np.array([[0, 1, 1, 6, 5], [1, 0.4, 2.5, 8, 7.6], [0, 3, 3, 3, 3], [1, -2, -1, 4, 2]], np.float32),
    }
    # onnxruntime registers MaxRoiPool-1 only: an opset-21 model
    model = one_node_model("MaxRoiPool", feeds, ["Y"], 21, pooled_shape=[3, 2], spatial_scale=0.9)
    check_node(model, feeds, reference="ort")
