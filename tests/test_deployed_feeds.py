"""models.transformer_feeds: the inputs of transformers exports and of the models onnxruntime's tools write, past
key/values included, proven by onnxruntime itself (a decode step continues its own prefill) and float64 numpy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import torch

from pytest_ortdiff.models import transformer_feeds

Deployed = Callable[[str], Path]


def _session(path: Path | onnx.ModelProto) -> ort.InferenceSession:
    data = str(path) if isinstance(path, Path) else path.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _np(feeds: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in feeds.items()}


def test_a_decode_step_with_past_continues_onnxruntime_genais_own_prefill(deployed: Deployed) -> None:
    """genai's decoder (GroupQueryAttention, rotary inside, seqlens_k from the mask): 4 tokens prefilled, then
    one decode step fed with past=4 (mask over 5, past along axis 2) gives the logits of a 5-token prefill."""
    path = deployed("llama-genai-fp32")
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    full = transformer_feeds(path, sequence=5, seed=1)
    prefill = transformer_feeds(path, sequence=4, seed=1)
    step = transformer_feeds(path, sequence=1, past=4, seed=1)
    assert {k: tuple(v.shape) for k, v in step.items()} == {
        "input_ids": (1, 1), "attention_mask": (1, 5),
        "past_key_values.0.key": (1, 2, 4, 16), "past_key_values.0.value": (1, 2, 4, 16),  # head size from genai_config.json
    }
    assert step["attention_mask"].dtype == torch.int64 and bool((step["attention_mask"] == 1).all())
    assert int(full["input_ids"].max()) < 128  # the tied embedding's rows (a Transpose of lm_head's weight)
    prefill["input_ids"] = full["input_ids"][:, :4]
    present = dict(zip(names, session.run(None, _np(prefill)), strict=True))
    step["input_ids"] = full["input_ids"][:, 4:]
    step["past_key_values.0.key"] = torch.from_numpy(present["present.0.key"])
    step["past_key_values.0.value"] = torch.from_numpy(present["present.0.value"])
    decoded = dict(zip(names, session.run(None, _np(step)), strict=True))
    expected = session.run(None, _np(full))[0][:, -1]
    np.testing.assert_allclose(decoded["logits"][:, -1], expected, atol=1e-5, rtol=1e-5)
    assert decoded["present.0.key"].shape == (1, 2, 5, 16)


def _gqa_model(heads: int = 2, kv_heads: int = 1, head: int = 16) -> onnx.ModelProto:
    """GroupQueryAttention with its own seqlens_k and total_sequence_length inputs (no rotary), BSNH query."""
    f = onnx.TensorProto.FLOAT
    i32 = onnx.TensorProto.INT32
    node = oh.make_node(
        "GroupQueryAttention", ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
    )
    graph = oh.make_graph(
        [node], "gqa",
        [
            oh.make_tensor_value_info("query", f, ["batch", "sequence_length", heads * head]),
            oh.make_tensor_value_info("key", f, ["batch", "sequence_length", kv_heads * head]),
            oh.make_tensor_value_info("value", f, ["batch", "sequence_length", kv_heads * head]),
            oh.make_tensor_value_info("past_key", f, ["batch", kv_heads, "past_sequence_length", head]),
            oh.make_tensor_value_info("past_value", f, ["batch", kv_heads, "past_sequence_length", head]),
            oh.make_tensor_value_info("seqlens_k", i32, ["batch"]),
            oh.make_tensor_value_info("total_sequence_length", i32, []),
        ],
        [
            oh.make_tensor_value_info("out", f, None),
            oh.make_tensor_value_info("present_key", f, None),
            oh.make_tensor_value_info("present_value", f, None),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)], ir_version=9)


def test_group_query_attentions_seqlens_k_is_the_last_tokens_index_and_total_the_length() -> None:
    """seqlens_k = past + sequence - 1 per batch row, total_sequence_length = past + sequence (int32 scalar):
    onnxruntime's GroupQueryAttention then attends as causal attention over past + new in float64 numpy (one
    batch row: onnxruntime takes several new tokens after a past only for batch 1)."""
    model = _gqa_model()
    feeds = transformer_feeds(model, batch=1, sequence=3, past=4, seed=0)
    assert feeds["seqlens_k"].dtype == torch.int32 and feeds["seqlens_k"].tolist() == [6]
    assert feeds["total_sequence_length"].shape == () and int(feeds["total_sequence_length"]) == 7
    assert feeds["past_key"].shape == (1, 1, 4, 16) and feeds["query"].shape == (1, 3, 32)
    out = _session(model).run(["out"], _np(feeds))[0]

    q = feeds["query"].double().numpy().reshape(1, 3, 2, 16).transpose(0, 2, 1, 3)
    k_new = feeds["key"].double().numpy().reshape(1, 3, 1, 16).transpose(0, 2, 1, 3)
    v_new = feeds["value"].double().numpy().reshape(1, 3, 1, 16).transpose(0, 2, 1, 3)
    k = np.concatenate([feeds["past_key"].double().numpy(), k_new], axis=2)
    v = np.concatenate([feeds["past_value"].double().numpy(), v_new], axis=2)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(16)  # (the kv head shared by both query heads)
    causal = np.arange(7)[None, :] > (4 + np.arange(3))[:, None]  # query i sees past and new tokens up to its own
    scores = np.where(causal, -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(out, expected.transpose(0, 2, 1, 3).reshape(1, 3, 32), atol=2e-6)
    two = transformer_feeds(model, batch=2, sequence=1, past=4)  # a decode step of a batch
    assert two["seqlens_k"].tolist() == [4, 4] and _session(model).run(["out"], _np(two))[0].shape == (2, 1, 32)


def test_encoder_feeds_by_name_vocabulary_from_the_fused_embedding(deployed: Deployed) -> None:
    """BERT after onnxruntime's optimizer: the ids index EmbedLayerNormalization's word table (128 rows), the mask
    is ones, the token types zeros; onnxruntime runs them."""
    path = deployed("bert-torchscript-opt")
    feeds = transformer_feeds(path, batch=2, sequence=5, seed=3)
    assert {k: tuple(v.shape) for k, v in feeds.items()} == {"input_ids": (2, 5), "attention_mask": (2, 5), "token_type_ids": (2, 5)}
    assert int(feeds["input_ids"].min()) >= 0 and int(feeds["input_ids"].max()) < 128
    assert int(feeds["input_ids"].max()) > 10  # drawn over the table, not random_feeds' [0, 10)
    assert bool((feeds["attention_mask"] == 1).all()) and bool((feeds["token_type_ids"] == 0).all())
    (out,) = _session(path).run(None, _np(feeds))
    assert out.shape == (2, 5, 32) and np.isfinite(out).all()


def test_dims_the_dynamo_exporter_named_s0_s1_are_sized_by_the_input_they_shape(deployed: Deployed) -> None:
    """A dynamo export names its dims s33, s50, ...: batch is axis 0, the sequence axis 1 (the mask's: past + new)."""
    path = deployed("llama-dynamo")
    feeds = transformer_feeds(path, batch=2, sequence=3)
    assert {k: tuple(v.shape) for k, v in feeds.items()} == {"input_ids": (2, 3), "attention_mask": (2, 3)}
    (logits,) = _session(path).run(None, _np(feeds))
    assert logits.shape == (2, 3, 128)


def test_a_past_for_a_model_without_one_and_an_unknown_dim_are_refused_with_the_fix(deployed: Deployed) -> None:
    path = deployed("bert-torchscript")
    with pytest.raises(ValueError, match=r"no past key/value input.*leave past=0"):
        transformer_feeds(path, past=4)
    model = _gqa_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].ClearField("dim_value")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "hidden"
    with pytest.raises(ValueError, match=r"hidden \(axis 2 of 'query'\).*dims="):
        transformer_feeds(model)
    assert transformer_feeds(model, dims={"hidden": 32})["query"].shape == (1, 8, 32)


def test_optimums_summed_dim_names_and_position_ids_of_a_decode_step() -> None:
    """optimum's decoder export names the mask's and the present's length "past_sequence_length +
    sequence_length" and takes position_ids: a step after 5 cached tokens is a mask of 6, positions [5]."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    total = "past_sequence_length + sequence_length"
    graph = oh.make_graph(
        [
            oh.make_node("Shape", ["attention_mask"], ["mask_shape"]),
            oh.make_node("Concat", ["past_key_values.0.key", "past_key_values.0.key"], ["present.0.key"], axis=2),
            oh.make_node("Identity", ["position_ids"], ["positions"]),
        ],
        "optimum_like",
        [
            oh.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
            oh.make_tensor_value_info("attention_mask", i64, ["batch_size", total]),
            oh.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"]),
            oh.make_tensor_value_info("past_key_values.0.key", f, ["batch_size", 2, "past_sequence_length", 16]),
        ],
        [oh.make_tensor_value_info(n, t, None) for n, t in (("mask_shape", i64), ("present.0.key", f), ("positions", i64))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    feeds = transformer_feeds(model, batch=2, sequence=1, past=5, vocab=128)
    assert {k: tuple(v.shape) for k, v in feeds.items()} == {
        "input_ids": (2, 1), "attention_mask": (2, 6), "position_ids": (2, 1), "past_key_values.0.key": (2, 2, 5, 16)}
    assert feeds["position_ids"].tolist() == [[5], [5]]
    shape, present, _ = _session(model).run(None, _np(feeds))
    assert shape.tolist() == [2, 6] and present.shape == (2, 2, 10, 16)
