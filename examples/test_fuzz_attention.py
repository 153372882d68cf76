"""Shape fuzzing of Llama attention with hypothesis: heads, grouped-query kv heads, KV-cache length.

    pytest examples/test_fuzz_attention.py --ort-dtypes=float32,float16 --hypothesis-profile=ortdiff-ci -s

`hidden`, `heads`, `kv_heads` and `past` are builder arguments: they change the graph, so `ortdiff.fuzz`
builds one model (and one onnxruntime session, one evaluator) per combination hypothesis draws, always
within the builder's declared constraints (heads divide hidden, kv_heads divide heads, even head dim for
the rotary embedding). `batch` and `seq` are symbolic dims of the feeds. A failure is shrunk to the
smallest graph and shape and printed with the line that rebuilds it.
"""

import pytest
from hypothesis import strategies as st

from pytest_ortdiff import models

# Attention softmax-averages values: errors stay near the dtype's resolution around |values| ~ 1.
TOLERANCE = {"float32": {"atol": 1e-4, "rtol": 1e-4}, "float16": {"atol": 1e-2, "rtol": 1e-2}}


@pytest.mark.ortdiff(dtypes=["float32", "float16"], provider_options={"CUDA": {"use_tf32": 0}})
def test_fuzz_llama_attention(ortdiff):
    stats = ortdiff.fuzz(
        models.llama_attention,
        dims={"hidden": (8, 64), "heads": (1, 8), "kv_heads": (1, 8), "past": (0, 8), "seq": (1, 16)},
        regime=st.sampled_from(["uniform", "normal"]),
        tolerance=TOLERANCE[ortdiff.dtype],
        max_examples=40,
    )
    print(f"\n{ortdiff.provider}-{ortdiff.dtype}: {stats}")
    assert stats["examples"] == 40


# The fused opset-23 graph (RotaryEmbedding + Attention): onnxruntime's own kernels for these ops
# against our torch kernels.
@pytest.mark.ortdiff(dtypes=["float32"], provider_options={"CUDA": {"use_tf32": 0}})
def test_fuzz_fused_llama_attention(ortdiff):
    def fused(dtype, **dims):
        return models.llama_attention(dtype=dtype, opset=23, fused=True, **dims)

    fused.dims = models.llama_attention.dims
    fused.build_dims = models.llama_attention.build_dims
    fused.constraints = models.llama_attention.constraints
    stats = ortdiff.fuzz(fused, dims={"hidden": (8, 64), "past": (0, 8), "seq": (1, 16)}, tolerance=TOLERANCE["float32"], max_examples=30)
    print(f"\n{ortdiff.provider}-{ortdiff.dtype} fused: {stats}")
