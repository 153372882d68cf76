"""The seeds/000 scenario as a test suite: LayerNormalization -> MatMul -> Add, torch evaluator vs
onnxruntime, per provider × dtype.

    pytest examples/test_layer_norm_matmul_add.py --ort-providers=available --ort-dtypes=float32,float16 --ortdiff-reports

The summary table is seeds/000's first table (max abs per provider × dtype); --ortdiff-reports adds the
histogram of every check.
"""

import pytest

from pytest_ortdiff import models

# tolerances a user of this graph would choose: values are ~285 (LayerNorm output ~N(0.5, 0.3) through a
# 1152-long dot product), so float32 differences of a few 1e-4 are reduction-order noise and float16
# differences of one or two ULPs (0.25-0.5 at 256-512) are expected; anything past that is a finding.
@pytest.mark.ortdiff(
    providers=["CPU", "CUDA"],
    dtypes=["float32", "float16"],
    atol={"float32": 1e-3, "float16": 0.0},
    rtol={"float32": 1e-5, "float16": 2 * 2**-10},
    budget={"float32": {1e-3: 0.0, 1e-2: 0.0}, "float16": {0.25: 0.5, 1.0: 0.0}},
)
def test_layer_norm_matmul_add(ortdiff):
    # the seed's sizes: batch 2 on CPU (too long otherwise), 32 on CUDA
    dims = {"a": 32 if ortdiff.device == "cuda" else 2, "b": 1024, "c": 1152}
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=dims, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
