"""Llama attention and a Llama decoder layer, torch evaluator vs onnxruntime, per provider × dtype.

    pytest examples/test_llama_attention.py --ort-providers=available --ort-dtypes=float32,float16,bfloat16 --ortdiff-reports -rs

onnxruntime's CPU provider has no bfloat16 MatMul: the bfloat16 cases are skipped there with the op named,
and listed under "holes in the provider × dtype matrix"; on CUDA they run. A failing case prints its
histogram followed by the blame table (`blame=True`): which node, swapped to onnxruntime's kernel, closes
the gap. Blame runs one mixed evaluation per node (tens of seconds for these graphs on CPU), so it is asked
for only here, where it runs only when the tolerance is broken.
"""

import pytest

from pytest_ortdiff import models

# batch 2, 16 new tokens, 8 cached ones: 2,048 elements per output (5,120 with present_key/value), a few
# tenths of a second per case on CPU
DIMS = {"batch": 2, "seq": 16, "past": 8}

# Tolerances a user would choose, from the errors measured on onnxruntime 1.32 CPU over seeds 0-4 (torch
# evaluator vs onnxruntime; outputs are within ±3):
# - float32: max 7.8e-07 on every graph -> none off by more than 1e-5;
# - float16: max 0.00195 (one float16 ULP at 2-4), at most 0.93 % of the elements off by more than 1e-3 (the
#   decoder layer; attention alone 0.02 %) -> at most 2 % off by more than 1e-3, none by more than 1e-2;
# - bfloat16 (not on CPU: measured torch evaluator vs the float64 oracle): max 0.0156 (one bfloat16 ULP at
#   2-4), at most 1.03 % off by more than 1e-2 -> at most 5 % off by more than 1e-2, none by more than 0.1.
# Not max_ulp: attention outputs cross zero, where one float32 rounding is ~1,000 ULPs of the tiny result.
TOLERANCE = {
    "budget": {
        "float32": {1e-5: 0.0},
        "float16": {1e-3: 0.02, 1e-2: 0.0},
        "bfloat16": {1e-2: 0.05, 0.1: 0.0},
    }
}


@pytest.mark.ortdiff(dtypes=["float32", "float16", "bfloat16"], provider_options={"CUDA": {"use_tf32": 0}}, **TOLERANCE)
@pytest.mark.parametrize("past", [0, "past"], ids=["prefill", "kv_cache"])
def test_llama_attention(ortdiff, past):
    # grouped-query attention: 4 query heads sharing 2 k/v heads, rotary embedding, causal mask, softmax
    # in float32 (as transformers does); with a cache also present_key / present_value
    model = models.llama_attention(dtype=ortdiff.dtype, hidden=64, heads=4, kv_heads=2, past=past)
    feeds = models.random_feeds(model, dims=DIMS, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds, blame=True)


@pytest.mark.ortdiff(dtypes=["float32", "float16", "bfloat16"], provider_options={"CUDA": {"use_tf32": 0}}, **TOLERANCE)
@pytest.mark.parametrize("fused", [False, True], ids=["decomposed", "fused_opset23"])
def test_llama_decoder_layer(ortdiff, fused):
    # RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual; fused=True writes it with the
    # opset-23 RMSNormalization, RotaryEmbedding and Attention ops instead of their decompositions
    model = models.llama_decoder_layer(dtype=ortdiff.dtype, fused=fused, opset=23 if fused else 18)
    feeds = models.random_feeds(model, dims=DIMS, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds, blame=True)
