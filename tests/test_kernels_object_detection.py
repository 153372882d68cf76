"""The object-detection kernels (RoiAlign, NonMaxSuppression) on one-node models against onnx.reference,
onnxruntime and the float64 oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from kernel_harness import check_node, given, one_node_model, run_ort, run_reference, run_torch

from pytest_ortdiff.runtimes.kernels.base import KernelContext
from pytest_ortdiff.runtimes.kernels.object_detection import geometry_dtype

RNG = np.random.default_rng(3)

X = RNG.standard_normal((2, 3, 8, 9)).astype(np.float32)
# x1, y1, x2, y2: inside, the whole image, thinner than a pixel, and reaching past the top-left corner
ROIS = np.array([[0.5, 1.2, 6.3, 5.1], [1.0, 0.0, 8.5, 7.9], [2.2, 3.1, 2.4, 3.3], [-1.5, -0.5, 4.2, 3.7]], np.float32)
ROI_FEEDS: dict[str, np.ndarray] = {"X": X, "rois": ROIS, "batch_indices": np.array([0, 1, 0, 1], np.int64)}

ROI_ALIGN_CASES: dict[str, tuple[int, dict[str, Any]]] = {
    # name: (opset, attributes); output 3x2 and spatial_scale 0.8 throughout
    "opset10-avg-adaptive-grid": (10, {"mode": "avg"}),
    "opset10-max-sampling2": (10, {"mode": "max", "sampling_ratio": 2}),
    "half_pixel-avg-sampling2": (16, {"mode": "avg", "sampling_ratio": 2}),
    "half_pixel-max-adaptive-grid": (16, {"mode": "max"}),
    "output_half_pixel-avg-sampling1": (16, {"mode": "avg", "sampling_ratio": 1,
                                             "coordinate_transformation_mode": "output_half_pixel"}),
    "output_half_pixel-max-sampling3": (16, {"mode": "max", "sampling_ratio": 3,
                                             "coordinate_transformation_mode": "output_half_pixel"}),
}


@pytest.mark.parametrize("case", list(ROI_ALIGN_CASES))
def test_roi_align(case: str) -> None:
    opset, attrs = ROI_ALIGN_CASES[case]
    model = one_node_model("RoiAlign", ROI_FEEDS, ["Y"], opset, output_height=3, output_width=2,
                           spatial_scale=0.8, **attrs)
    # Max mode: the spec says "max pooling" of the bilinearly interpolated samples, but onnx.reference and
    # onnxruntime (since 1.13; before, it summed, and its log warning about that still shows) both take, per
    # sample, the largest of the four *weighted* corner values w_i * v_i, then the max over the samples.
    # The kernel follows onnx.reference, which onnxruntime 1.32 matches to the bit on these cases, so both
    # references are trusted for max as for avg.
    # onnx.reference runs RoiAlign-10 with RoiAlign-16's default coordinate_transformation_mode (half_pixel),
    # an attribute RoiAlign-10 does not have: RoiAlign-10's coordinates are used as they are (what 16 calls
    # output_half_pixel), as onnxruntime does, so opset 10 is checked against onnxruntime only.
    check_node(model, ROI_FEEDS, reference="ort" if opset == 10 else "both")


def test_roi_align_max_is_not_the_max_of_interpolated_samples() -> None:
    # pins the reading of max mode above on a case where the two readings differ: one sample at the middle
    # of a 2x2 image [[0, 4], [4, 0]] interpolates to 2, while its largest weighted corner is 4 * 0.25 = 1
    feeds: dict[str, np.ndarray] = {"X": np.array([[[[0, 4], [4, 0]]]], np.float32), "rois": np.array([[0, 0, 1, 1]], np.float32),
             "batch_indices": np.array([0], np.int64)}
    model = one_node_model("RoiAlign", feeds, ["Y"], 16, mode="max", output_height=1, output_width=1,
                           sampling_ratio=1, coordinate_transformation_mode="output_half_pixel")
    got = run_torch(model, feeds)[0]
    assert got.item() == 1.0
    assert run_reference(model, feeds)[0].item() == run_ort(model, feeds)[0].item() == 1.0


def _clustered_boxes(n_batch: int, n_box: int) -> np.ndarray:
    """[y1, x1, y2, x2] boxes around three centres (so that many overlap), half with the corners swapped."""
    centres = RNG.uniform(0, 10, (n_batch, 3, 2))
    c = centres[:, RNG.integers(0, 3, n_box)] + RNG.normal(0, 0.4, (n_batch, n_box, 2))
    half = RNG.uniform(0.5, 1.5, (n_batch, n_box, 2))
    boxes = np.concatenate([c - half, c + half], axis=-1)
    swap = RNG.random((n_batch, n_box)) < 0.5
    boxes[swap] = boxes[swap][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


def _to_center_boxes(boxes: np.ndarray) -> np.ndarray:
    lo, hi = np.minimum(boxes[..., :2], boxes[..., 2:]), np.maximum(boxes[..., :2], boxes[..., 2:])
    # center_point_box=1 is [x_center, y_center, width, height]
    return np.concatenate([((lo + hi) / 2)[..., ::-1], (hi - lo)[..., ::-1]], axis=-1).astype(np.float32)


BOXES = _clustered_boxes(2, 12)
SCORES = RNG.random((2, 3, 12)).astype(np.float32)

NMS_CASES: dict[str, tuple[int, dict[str, np.ndarray | None]]] = {
    # name: (center_point_box, optional inputs: None = omitted)
    "corners-all-thresholds": (0, {"max_output_boxes_per_class": np.array([5], np.int64),
                                   "iou_threshold": np.array([0.3], np.float32),
                                   "score_threshold": np.array([0.25], np.float32)}),
    "center-no-score_threshold": (1, {"max_output_boxes_per_class": np.array([4], np.int64),
                                      "iou_threshold": np.array([0.1], np.float32), "score_threshold": None}),
    # iou_threshold omitted (0): any overlap at all suppresses
    "only-max_output": (0, {"max_output_boxes_per_class": np.array([20], np.int64)}),
    # max_output_boxes_per_class omitted (0): no box is selected
    "no-optional-inputs": (0, {}),
    # an omitted iou_threshold in the middle of the inputs
    "omitted-iou-with-score": (1, {"max_output_boxes_per_class": np.array([2], np.int64), "iou_threshold": None,
                                   "score_threshold": np.array([0.5], np.float32)}),
}


@pytest.mark.parametrize("case", list(NMS_CASES))
def test_non_max_suppression(case: str) -> None:
    center, optional = NMS_CASES[case]
    boxes = _to_center_boxes(BOXES) if center else BOXES
    feeds: dict[str, np.ndarray | None] = {"boxes": boxes, "scores": SCORES, **optional}
    model = one_node_model("NonMaxSuppression", feeds, ["selected_indices"], 11, center_point_box=center)
    present = given(feeds)
    # onnx.reference fails on an omitted max_output_boxes_per_class or iou_threshold (it reads their .size):
    # onnxruntime only there
    reference = "both" if feeds.get("iou_threshold") is not None else "ort"
    # boxes and scores are float only (the spec's type constraint): float32, and the float64 oracle below
    check_node(model, present, dtypes=("float32",), reference=reference)
    selected = run_ort(model, present)[0]
    np.testing.assert_array_equal(run_torch(model, present, compute_dtype=torch.float64)[0], selected)
    if case == "no-optional-inputs":
        assert selected.shape == (0, 3)
    elif case != "omitted-iou-with-score":
        # the boxes overlap enough that suppression, not the limit, decides (or the case would test little)
        limit = int(optional["max_output_boxes_per_class"][0])  # type: ignore[index]
        assert 0 < len(selected) < 2 * 3 * min(limit, 12)


def test_geometry_dtype_keeps_float64_rois_of_a_float64_model() -> None:
    oracle = KernelContext(torch.device("cpu"), 16, torch.float64)
    from_float32 = torch.tensor([[0.5, 1.2, 6.3, 5.1]], dtype=torch.float32).double()
    assert geometry_dtype(from_float32, oracle) == torch.float32
    assert geometry_dtype(torch.tensor([[0.5, 1.2, 6.3, 5.1]], dtype=torch.float64), oracle) == torch.float64
    plain = KernelContext(torch.device("cpu"), 16)
    assert geometry_dtype(from_float32, plain) == torch.float64
    assert geometry_dtype(from_float32.half(), plain) == torch.float32
