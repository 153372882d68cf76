"""The reference scenario as a test suite: LayerNormalization -> MatMul -> Add, torch evaluator vs
onnxruntime, per provider × dtype.

    pytest examples/test_layer_norm_matmul_add.py --ort-providers=available --ort-dtypes=float32,float16 --ortdiff-reports

The summary table has the max abs error per provider × dtype; --ortdiff-reports adds the
histogram of every check.
"""

import pytest

from pytest_ortdiff import models


# Tolerances a user of this graph would choose. Outputs are ~285 (a 1152-long dot product of LayerNorm
# outputs), so one float16 ULP there is 0.25 and float32 reduction-order noise is a few 1e-4:
# float32: <= 64 ULPs, under 1 % of elements off by more than 1e-4, none by more than 1e-3;
# float16: <= 2 ULPs, at most half of the elements off by more than 0.1 (one ULP), none by more than 0.5.
@pytest.mark.ortdiff(
    providers=["CPU", "CUDA"],
    dtypes=["float32", "float16"],
    max_ulp={"float32": 64, "float16": 2},
    budget={"float32": {1e-4: 0.01, 1e-3: 0.0}, "float16": {0.1: 0.5, 0.5: 0.0}},
)
def test_layer_norm_matmul_add(ortdiff):
    # the seed's sizes: batch 2 on CPU (too long otherwise), 32 on CUDA
    dims = {"a": 32 if ortdiff.device == "cuda" else 2, "b": 1024, "c": 1152}
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=dims, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
