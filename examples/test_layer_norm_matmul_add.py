"""The reference scenario as a test suite: LayerNormalization -> MatMul -> Add, torch evaluator vs
onnxruntime, per provider × dtype.

    pytest examples/test_layer_norm_matmul_add.py --ort-providers=available --ort-dtypes=float32,float16 --ortdiff-reports

The summary table has the max abs error per provider × dtype; --ortdiff-reports adds the
histogram of every check.
"""

import pytest

from pytest_ortdiff import models


# Tolerances a user of this graph would choose, that hold on any machine (2 or 16 cores, any CPU, CUDA).
# Outputs are ~285 (a 1152-long dot product of LayerNorm outputs), so one float32 ULP there is 3e-5 and one
# float16 ULP 0.25. float32: torch and onnxruntime sum the dot products in different orders, and how depends
# on the CPU's kernels (6 ULPs on one machine, 9 on another, where 4.7 % of elements moved by more than 1e-4):
# <= 64 ULPs, none off by more than 1e-3. float16: <= 2 ULPs, at most half of the elements off by more than
# 0.1 (one ULP), none by more than 0.5.
# On CUDA, float32 is IEEE float32 on both sides: onnxruntime's CUDA provider computes float32 MatMul in TF32
# unless told otherwise (use_tf32=1 by default), 1000x the float32 error; the next test checks that deployment.
@pytest.mark.ortdiff(
    providers=["CPU", "CUDA"],
    dtypes=["float32", "float16"],
    max_ulp={"float32": 64, "float16": 2},
    budget={"float32": {1e-3: 0.0}, "float16": {0.1: 0.5, 0.5: 0.0}},
    provider_options={"CUDA": {"use_tf32": 0}},
)
def test_layer_norm_matmul_add(ortdiff):
    # the seed's sizes: batch 2 on CPU (too long otherwise), 32 on CUDA
    dims = {"a": 32 if ortdiff.device == "cuda" else 2, "b": 1024, "c": 1152}
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=dims, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)


# The TF32 deployment on purpose: onnxruntime's CUDA default (use_tf32=1) against IEEE float32. TF32 keeps 10
# mantissa bits, so each product is off by up to ~5e-4 of itself: on these outputs the errors spread to ~0.005
# (max ~0.03 over 37.7M elements), so: at most 20 % of elements off by more than 1e-2, none by more than 0.1.
@pytest.mark.ortdiff(
    providers=["CUDA"],
    dtypes=["float32"],
    budget={1e-2: 0.2, 0.1: 0.0},
    provider_options={"CUDA": {"use_tf32": 1}},
)
def test_layer_norm_matmul_add_tf32(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 32, "b": 1024, "c": 1152}, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
