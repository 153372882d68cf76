"""Baselines and reproducibility on the reference scenario's graph (LayerNorm -> MatMul -> Add).

    # once per machine / upgrade you accept: store onnxruntime's outputs (and the environment) as baselines
    pytest examples/test_baseline_and_reproducibility.py --ortdiff-update-baselines
    # from then on: any changed bit is drift, reported with a histogram and what changed in the environment
    pytest examples/test_baseline_and_reproducibility.py

Baselines land in examples/test_baseline_and_reproducibility_ortdiff_baselines/ (commit them). Without
them the baseline tests fail and say how to create them: a baseline that does not exist checks nothing.
"""

import pytest

from pytest_ortdiff import models

DIMS = {"a": 2, "b": 256, "c": 1152}


# reproducible=...: ortdiff.check() also runs ortdiff.check_reproducible(): the same session 5 times,
# 1 vs 2 vs 4 intra-op threads, graph optimizations "all" vs "disable"/"basic"/"extended" — every
# comparison bit for bit — and on CUDA the torch evaluator with deterministic algorithms on and off.
# The thread counts are named: onnxruntime's MatMul at 16 threads splits this product differently than at
# 1 (28 % of Z differs), so comparing against the machine's core count (the default) would make the
# verdict depend on the machine.
@pytest.mark.ortdiff(
    providers=["CPU", "CUDA"],
    dtypes=["float32", "float16"],
    max_ulp={"float32": 64, "float16": 2},
    reproducible={"threads": [1, 2, 4]},
    provider_options={"CUDA": {"use_tf32": 0}},  # float32 means IEEE float32 on CUDA too (not TF32)
)
def test_seed_000_is_reproducible(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)


# baseline=True: once torch evaluator vs onnxruntime is within tolerance, onnxruntime's outputs are
# compared with the ones stored for this test × provider × dtype. 589,824 elements are more than the
# 65,536 stored in full (ini ortdiff_baseline_max_elements), so Z is stored as a summary: sha256 of its
# bits, quantiles and a 4,096-element strided sample; any drift still fails.
@pytest.mark.ortdiff(providers=["CPU", "CUDA"], dtypes=["float32", "float16"], max_ulp={"float32": 64, "float16": 2}, provider_options={"CUDA": {"use_tf32": 0}})
def test_seed_000_matches_its_baseline(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds, baseline=True)


# the explicit forms: a small slice stored in full (lossless, every dtype), and a tolerance that accepts
# drift up to one float16 ULP at these magnitudes instead of the default bitwise rule
@pytest.mark.ortdiff(dtypes=["float32", "float16"], max_ulp={"float32": 64, "float16": 2}, provider_options={"CUDA": {"use_tf32": 0}})
def test_seed_000_slice_baseline_with_tolerance(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 1, "b": 16, "c": 1152}, seed=0, device=ortdiff.device)
    (z,) = ortdiff.run(model, feeds)
    ortdiff.check_baseline("Z_slice", {"Z": z[0, :8]}, tolerance={"atol": 0.25, "rtol": 0.0})
