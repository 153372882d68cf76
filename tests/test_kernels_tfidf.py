"""TfIdfVectorizer on int32/int64 token ids against onnxruntime and onnx.reference: n-gram lengths,
skips, the three modes, weights, 1-D and 2-D input; string pools refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_harness import assert_outputs_close, one_node_model, run_ort, run_reference, run_torch

from pytest_ortdiff.runtimes.kernels.base import UnsupportedVariantError

POOL = {
    "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
    "ngram_counts": [0, 4],
    "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
}
X1 = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], dtype=np.int32)
X2 = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], dtype=np.int64)


@pytest.mark.parametrize(
    ("x", "min_n", "max_n", "skip", "mode", "weights"),
    [
        (X1, 1, 1, 0, "TF", None),
        (X2, 2, 2, 0, "TF", None),
        (X2, 1, 2, 2, "TF", None),
        (X1, 1, 2, 3, "IDF", None),
        (X2, 1, 2, 1, "IDF", [0.5, 1.0, 2.0, 0.1, 3.0, 1.5, 0.2]),
        (X2, 2, 2, 1, "TFIDF", [0.5, 1.0, 2.0, 0.1, 3.0, 1.5, 0.2]),
    ],
)
def test_tfidf(x, min_n, max_n, skip, mode, weights) -> None:
    attrs = {
        "min_gram_length": min_n,
        "max_gram_length": max_n,
        "max_skip_count": skip,
        "mode": mode,
        **POOL,
    }
    if weights:
        attrs["weights"] = weights
    model = one_node_model("TfIdfVectorizer", {"X": x}, ["Y"], 9, **attrs)
    got = run_torch(model, {"X": x})
    assert_outputs_close(got, run_ort(model, {"X": x}), (1e-6, 1e-7), ["Y"])
    if weights or mode == "TF":  # onnx.reference fails on IDF/TFIDF without weights (len(None))
        assert_outputs_close(got, run_reference(model, {"X": x}), (1e-6, 1e-7), ["Y"])
    oracle = run_torch(model, {"X": x}, compute_dtype=torch.float64)
    assert_outputs_close(oracle, got, (1e-6, 1e-7), ["Y"], check_dtype=False)


def test_tfidf_string_pool_is_refused() -> None:
    from onnx import helper

    from pytest_ortdiff.runtimes.kernels.base import KernelContext
    from pytest_ortdiff.runtimes.kernels.nn.tfidf import TfIdfVectorizer

    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], mode="TF", min_gram_length=1, max_gram_length=1,
                            max_skip_count=0, ngram_counts=[0], ngram_indexes=[0], pool_strings=["a"])  # fmt: skip
    with pytest.raises(UnsupportedVariantError, match="pool_strings"):
        TfIdfVectorizer(node, KernelContext(device=torch.device("cpu"), opset=9))
