"""Shape and value fuzzing of the reference scenario's graph (LayerNorm -> MatMul -> Add) with hypothesis.

    pytest examples/test_fuzz_layer_norm.py --ort-dtypes=float32,float16 --hypothesis-profile=ortdiff-ci -s

`ortdiff.fuzz` draws the graph's dims (a, b, c within the builder's declared ranges, c up to 1024 here)
and a value regime, runs torch evaluator vs onnxruntime for each example, and on failure shrinks to the
smallest dims and simplest values, reported with the seed and the histogram.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_ortdiff import models, strategies


@pytest.mark.ortdiff(dtypes=["float32", "float16"], provider_options={"CUDA": {"use_tf32": 0}})
def test_fuzz_layer_norm_shapes(ortdiff):
    stats = ortdiff.fuzz(
        models.layer_norm_matmul_add,
        dims={"c": (1, 1024)},
        regime=st.sampled_from(["uniform", "normal"]),
    )
    print(f"\n{ortdiff.provider}-{ortdiff.dtype}: {stats}")


# The same with @given directly. The ortdiff fixture keeps no per-example state that could leak between
# examples (a check records one summary row per test, the worst), so hypothesis's function-scoped
# fixture health check can be suppressed safely.
@pytest.mark.ortdiff(dtypes=["float32"], provider_options={"CUDA": {"use_tf32": 0}})
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None, max_examples=25)
@given(dims=strategies.dims(models.layer_norm_matmul_add, c=(1, 512)), seed=st.integers(0, 2**16))
def test_given_style(ortdiff, dims, seed):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    ortdiff.check(model, strategies.make_feeds(model, dims, "uniform", seed))
