"""The model zoo beyond seeds/000: MLPs, Llama attention and decoder layer.

Each builder must pass the full checker with symbolic dims, and three independent computations of its
function must agree: the eager torch twin, our torch evaluator, and onnx.reference / onnxruntime.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff import OrtRunner, TorchEvaluator, compare, models

DIMS = {"batch": 2, "seq": 5, "past": 3}

BUILDS: dict[str, Any] = {
    "mlp": lambda dt, **kw: models.mlp(dtype=dt, **kw),
    "gelu_mlp_erf": lambda dt, **kw: models.gelu_mlp(dtype=dt, **kw),
    "gelu_mlp_tanh": lambda dt, **kw: models.gelu_mlp(dtype=dt, approximate="tanh", **kw),
    "gelu_mlp_op20": lambda dt, **kw: models.gelu_mlp(dtype=dt, opset=20, **kw),
    "llama_attention": lambda dt, **kw: models.llama_attention(dtype=dt, **kw),
    "llama_attention_mha": lambda dt, **kw: models.llama_attention(dtype=dt, heads=4, kv_heads=4, **kw),
    "llama_attention_past": lambda dt, **kw: models.llama_attention(dtype=dt, past="past", **kw),
    "llama_attention_fused": lambda dt, **kw: models.llama_attention(dtype=dt, opset=23, fused=True, **kw),
    "llama_attention_fused_past": lambda dt, **kw: models.llama_attention(dtype=dt, opset=23, fused=True, past="past", **kw),
    "llama_decoder_layer": lambda dt, **kw: models.llama_decoder_layer(dtype=dt, **kw),
    "llama_decoder_layer_past": lambda dt, **kw: models.llama_decoder_layer(dtype=dt, past=4, **kw),
    "llama_decoder_layer_fused": lambda dt, **kw: models.llama_decoder_layer(dtype=dt, opset=23, fused=True, **kw),
}

# float32 agreement between two implementations of the same function (different summation orders)
ATOL32 = 2e-5


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, torch.Tensor]:
    return models.random_feeds(model, dims=DIMS, seed=seed)


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", sorted(BUILDS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_builder_passes_the_full_checker_with_symbolic_dims(name: str, dtype: str) -> None:
    model = BUILDS[name](dtype)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    x = inferred.graph.input[0]
    dims = [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim]
    assert "batch" in dims, dims  # batch stays symbolic
    # every output's element type is the builder's dtype
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype("float32")) if dtype == "float32" else None
    if elem is not None:
        assert all(o.type.tensor_type.elem_type == elem for o in model.graph.output)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_twin_evaluator_and_onnxruntime_agree_in_float32(name: str) -> None:
    model = BUILDS[name]("float32")
    feeds = _feeds(model)
    names = [o.name for o in model.graph.output]
    evaluated = TorchEvaluator(model).run(None, feeds)
    with torch.no_grad():
        eager = _as_tuple(models.torch_twin(model)(**feeds))
    ort_out = OrtRunner(model).run(None, feeds)
    assert len(evaluated) == len(eager) == len(ort_out) == len(names)
    for n, e, t, o in zip(names, evaluated, eager, ort_out, strict=True):
        assert e.shape == t.shape == o.shape, n
        assert compare(t, e).max_abs <= ATOL32, (n, compare(t, e).summary())
        assert compare(o, e).max_abs <= ATOL32, (n, compare(o, e).summary())


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_evaluator_matches_onnx_reference(name: str) -> None:
    model = BUILDS[name]("float32")
    feeds = _feeds(model, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})
    got = TorchEvaluator(model).run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g.numpy(), e, atol=ATOL32, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama_attention", "llama_decoder_layer", "gelu_mlp_erf"])
def test_float16_runtimes_are_closer_to_the_oracle_than_float16_resolution(name: str) -> None:
    model = BUILDS[name]("float16")
    feeds = _feeds(model)
    oracle = TorchEvaluator(model, compute_dtype=torch.float64).run(None, feeds)[0]
    for got in (TorchEvaluator(model).run(None, feeds)[0], OrtRunner(model).run(None, feeds)[0]):
        assert got.dtype == torch.float16
        rep = compare(oracle.to(torch.float16), got)
        # a few float16 ULPs around values of magnitude ~1, never NaN/Inf
        assert rep.nan_mismatch == rep.inf_mismatch == 0
        assert rep.max_abs < 0.05, rep.summary()


def test_fused_and_decomposed_attention_compute_the_same_function() -> None:
    feeds = _feeds(models.llama_attention(past="past"))
    a = TorchEvaluator(models.llama_attention(past="past")).run(None, feeds)
    b = TorchEvaluator(models.llama_attention(opset=23, fused=True, past="past")).run(None, feeds)
    for x, y in zip(a, b, strict=True):
        assert compare(x, y).max_abs <= ATOL32


def test_grouped_query_heads_and_present_cache_shapes() -> None:
    model = models.llama_attention(hidden=64, heads=8, kv_heads=2, past="past")
    feeds = models.random_feeds(model, dims={"batch": 1, "seq": 4, "past": 6}, seed=0)
    y, pk, pv = TorchEvaluator(model).run(None, feeds)
    assert tuple(y.shape) == (1, 4, 64)
    assert tuple(pk.shape) == tuple(pv.shape) == (1, 2, 10, 8)
    # the cache is the past followed by this step's keys/values
    assert torch.equal(pk[:, :, :6], feeds["past_key"])
    assert torch.equal(pv[:, :, :6], feeds["past_value"])


def test_causal_mask_first_token_ignores_the_future() -> None:
    model = models.llama_attention()
    feeds = _feeds(model)
    y_full = TorchEvaluator(model).run(None, feeds)[0]
    changed = {k: v.clone() for k, v in feeds.items()}
    changed["hidden_states"][:, 1:] += 1.0  # later tokens only
    y_changed = TorchEvaluator(model).run(None, changed)[0]
    assert torch.equal(y_full[:, 0], y_changed[:, 0])
    assert not torch.equal(y_full[:, 1:], y_changed[:, 1:])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: models.llama_attention(hidden=60, heads=8), "hidden"),
        (lambda: models.llama_attention(heads=4, kv_heads=3), "kv_heads"),
        (lambda: models.llama_attention(fused=True, opset=18), "opset >= 23"),
        (lambda: models.mlp(hidden=0), "hidden"),
        (lambda: models.gelu_mlp(approximate="fast"), "approximate"),
    ],
)
def test_bad_builder_arguments_are_named(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_builders_declare_dims_and_constraints_for_hypothesis() -> None:
    for build in (models.mlp, models.gelu_mlp, models.llama_attention, models.llama_decoder_layer):
        assert build.dims and isinstance(build.constraints, tuple)
    assert "heads % kv_heads == 0" in models.llama_attention.constraints


# -- exported transformers: torch.onnx.export(dynamo=True) of each twin -----------------------------

needs_onnxscript = pytest.mark.skipif(
    importlib.util.find_spec("onnxscript") is None,
    reason="torch.onnx.export(dynamo=True) needs onnxscript: pip install -e '.[export]'",
)

EXPORTS: dict[str, tuple[Any, dict[str, Any]]] = {
    "mlp": (lambda: models.mlp(), {"X": {0: "batch"}}),
    "gelu_mlp_tanh": (lambda: models.gelu_mlp(approximate="tanh"), {"X": {0: "batch"}}),
    "llama_attention": (lambda: models.llama_attention(), {"hidden_states": {0: "batch", 1: "seq"}}),
    "llama_attention_past": (lambda: models.llama_attention(past="past"), None),
    "llama_decoder_layer": (lambda: models.llama_decoder_layer(), {"hidden_states": {0: "batch", 1: "seq"}}),
}


@needs_onnxscript
@pytest.mark.filterwarnings("ignore")  # the exporter's own deprecation and torchvision warnings
@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exported_twin_evaluator_vs_onnxruntime_vs_eager(name: str) -> None:
    build, dynamic = EXPORTS[name]
    model = build()
    twin = models.torch_twin(model)
    feeds = _feeds(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(twin, (), kwargs=feeds, dynamo=True, dynamic_shapes=dynamic, verbose=False).model_proto
    with torch.no_grad():
        eager = _as_tuple(twin(**feeds))
    # the exporter may rename inputs (X -> x): feed them in the twin's order
    inputs = [i.name for i in exported.graph.input]

    def renamed(f: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(zip(inputs, f.values(), strict=True))

    evaluated = TorchEvaluator(exported).run(None, renamed(feeds))
    ort_out = OrtRunner(exported).run(None, renamed(feeds))
    assert len(evaluated) == len(eager) == len(ort_out)
    for t, e, o in zip(eager, evaluated, ort_out, strict=True):
        assert compare(t, e).max_abs <= ATOL32, compare(t, e).summary()
        assert compare(o, e).max_abs <= ATOL32, compare(o, e).summary()
    if dynamic:
        other = models.random_feeds(model, dims={"batch": 3, "seq": 7, "past": 3}, seed=1)
        # other shapes than the export's example: the dims stayed dynamic
        e2 = TorchEvaluator(exported).run(None, renamed(other))[0]
        o2 = OrtRunner(exported).run(None, renamed(other))[0]
        assert e2.shape[0] == 3 and compare(o2, e2).max_abs <= ATOL32
