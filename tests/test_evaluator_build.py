"""Building a TorchEvaluator: tensors decoded straight from their protos as onnx.numpy_helper decodes them
(every element type, both storage forms, external data), and the float64 twin `with_compute_dtype`
against a freshly built float64 evaluator, bit for bit, sharing nothing a run changes."""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import pytest
import real_models
import torch
from onnx import TensorProto as TP
from onnx import numpy_helper

from pytest_ortdiff import TorchEvaluator, models
from pytest_ortdiff.numerics.tensors import _from_onnx_tensor_via_numpy, from_onnx_tensor, to_numpy
from pytest_ortdiff.runtimes import evaluator as evaluator_module
from pytest_ortdiff.runtimes.kernels.generator import Constant


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread here: on a loaded 2-core machine a 2-thread float32 matmul of these toy sizes
    can wait 10 ms for the other core (what these tests compare does not depend on the thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- decoding -----------------------------------------------------------------------------------------

_FLOATS = [0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf"), float("nan"), 1e-40]  # 1e-40: a float32 subnormal
_SMALL_FLOATS = [0.0, 0.5, -1.0, 2.0, 3.0, -4.0, 0.25, 1.5]  # exact in every float8/6/4 type that has a sign


def _values(code: int) -> np.ndarray:
    """Eight values of element type `code` that try its edges, as onnx's numpy dtype for it."""
    np_dtype = oh.tensor_dtype_to_np_dtype(code)
    if code == TP.STRING:
        return np.array([b"a", b"", b"bc", "é".encode(), b"d", b"e", b"f", b"g"], dtype=object)
    if code == TP.BOOL:
        return np.array([True, False, True, True, False, False, True, False])
    if code in (TP.COMPLEX64, TP.COMPLEX128):
        return np.array([0, 1 + 2j, -1.5j, 3, float("inf"), 2 - 1j, 1e-3, -7], dtype=np_dtype)
    if code in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.BFLOAT16):
        return np.array(_FLOATS, dtype=np.float64).astype(np_dtype)
    if code == TP.FLOAT8E8M0:  # powers of two only
        return np.array([1.0, 2.0, 0.5, 4.0, 0.25, 8.0, 1.0, 16.0], dtype=np.float32).astype(np_dtype)
    if code in (TP.INT4, TP.INT2):
        lo, hi = (-8, 7) if code == TP.INT4 else (-2, 1)
        return np.array([lo, hi, 0, 1, -1, lo + 1, hi - 1, 0]).astype(np_dtype)
    if code in (TP.UINT4, TP.UINT2):
        hi = 15 if code == TP.UINT4 else 3
        return np.array([0, hi, 1, 2, hi - 1, 0, 1, hi]).astype(np_dtype)
    if np.dtype(np_dtype).kind in "iu":
        info = np.iinfo(np_dtype)
        return np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1, 7, 3], dtype=np_dtype)
    return np.array(_SMALL_FLOATS, dtype=np.float32).astype(np_dtype)  # float8, float6, float4


def _proto(code: int, storage: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    """A tensor of `shape` (at most 8 elements) of element type `code`, its values in `raw_data` or in
    the type's `*_data` field as onnx.helper writes them."""
    values = _values(code)[: int(np.prod(shape))].reshape(shape)
    if storage == "raw":
        proto = numpy_helper.from_array(values, "t")
        assert proto.HasField("raw_data") and proto.data_type == code
        return proto
    if code == TP.STRING:
        flat: list[Any] = list(values.ravel())
    elif code in (TP.INT4, TP.UINT4, TP.INT2, TP.UINT2):
        flat = values.astype(np.int32).ravel().tolist()
    elif values.dtype.kind == "V" or values.dtype.name.startswith(("float8", "float6", "float4", "bfloat16")):
        flat = values.astype(np.float32).ravel().tolist()  # make_tensor converts floats to these types
    else:
        flat = values.ravel().tolist()
    proto = oh.make_tensor("t", code, shape, flat, raw=False)
    assert not proto.HasField("raw_data")
    return proto


_CODES = [code for name, code in TP.DataType.items() if code != TP.UNDEFINED]
_CASES = [
    pytest.param(code, storage, id=f"{TP.DataType.Name(code)}-{storage}")
    for code in _CODES
    for storage in ("raw", "field")
    if not (code == TP.STRING and storage == "raw")  # onnx stores strings in string_data only
]


@pytest.mark.parametrize(("code", "storage"), _CASES)
def test_decoding_matches_numpy_helper(code: int, storage: str) -> None:
    """from_onnx_tensor gives onnx.numpy_helper.to_array's values bit for bit (NaN payloads, -0.0, integer
    extremes, float8 codes), its dtype and its shape (0-d and empty included); where the numpy path has no
    torch tensor for the type (strings, float4/float6), the same error as before the fast paths."""
    for shape in ((2, 4), (), (0, 3)):
        if code == TP.STRING and shape == (0, 3):
            continue  # an empty string tensor decodes to a float64 numpy array: nothing to compare
        proto = _proto(code, storage, shape)
        expected = numpy_helper.to_array(proto)
        try:
            reference = _from_onnx_tensor_via_numpy(proto)
        except TypeError as exc:  # no torch dtype for it: the same refusal
            with pytest.raises(TypeError, match=re.escape(str(exc))):
                from_onnx_tensor(proto)
            continue
        got = from_onnx_tensor(proto)
        assert got.dtype == reference.dtype and got.shape == reference.shape
        back = to_numpy(got)
        assert back.dtype == expected.dtype, (back.dtype, expected.dtype)
        assert back.shape == expected.shape
        assert back.tobytes() == expected.tobytes()


@pytest.mark.parametrize(("code", "storage"), [(TP.FLOAT, "raw"), (TP.INT64, "raw"), (TP.BFLOAT16, "raw"), (TP.FLOAT8E4M3FN, "raw"), (TP.BOOL, "raw"), (TP.FLOAT, "field"), (TP.INT64, "field")])
def test_a_decoded_tensor_is_its_own(code: int, storage: str) -> None:
    """Writing into a decoded tensor changes neither the proto nor the next decoding (no memory shared
    with protobuf), and raises no warning about a read-only buffer."""
    proto = _proto(code, storage, (2, 4))
    before = numpy_helper.to_array(proto).tobytes()
    t = from_onnx_tensor(proto)
    t.view(-1).view(torch.uint8).fill_(1)
    assert numpy_helper.to_array(proto).tobytes() == before
    assert to_numpy(from_onnx_tensor(proto)).tobytes() == before


def test_external_data_decodes_as_before(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor whose data lives in another file: read as onnx reads it (relative to the working
    directory, as before), and a model saved with external data runs as the model in memory does."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "W")
    graph = oh.make_graph([oh.make_node("MatMul", ["X", "W"], ["Y"])], "g", [oh.make_tensor_value_info("X", TP.FLOAT, [2, 8])], [oh.make_tensor_value_info("Y", TP.FLOAT, [2, 8])], [w])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    stored = onnx.load(path, load_external_data=False).graph.initializer[0]
    assert stored.data_location == TP.EXTERNAL
    monkeypatch.chdir(tmp_path)
    assert torch.equal(from_onnx_tensor(stored), torch.from_numpy(numpy_helper.to_array(stored, str(tmp_path)).copy()))
    x = {"X": torch.randn(2, 8)}
    assert torch.equal(TorchEvaluator(str(path)).run(None, x)[0], TorchEvaluator(model).run(None, x)[0])


def test_inference_without_the_weights_gives_the_same_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shape inference runs on the model less its weights' data: every inferred type is the one full
    inference gives."""
    model = models.gelu_mlp(in_features=64, hidden=64, out_features=64)  # 4,096-element weights
    assert evaluator_module._without_weights(model) is not model
    light = evaluator_module._ModelFacts(model).types
    monkeypatch.setattr(evaluator_module, "_without_weights", lambda m: m)
    full = evaluator_module._ModelFacts(model).types
    for got, want in zip(light, full, strict=True):
        assert {k: v.SerializeToString() for k, v in got.items()} == {k: v.SerializeToString() for k, v in want.items()}
    assert len(light[0]) > 5


# -- the float64 twin ---------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> tuple[Any, ...]:
    flat = t.detach().reshape(-1).contiguous()
    raw = flat.view(torch.uint8) if flat.numel() and t.dtype != torch.bool else flat
    return (t.dtype, tuple(t.shape), raw.numpy().tobytes())


def _all_bits(values: Any) -> Any:
    if isinstance(values, torch.Tensor):
        return _bits(values)
    if isinstance(values, dict):
        return {k: _all_bits(v) for k, v in values.items()}
    if isinstance(values, list | tuple):
        return [_all_bits(v) for v in values]
    return values


def _runs(ev: TorchEvaluator, feeds: list[dict[str, torch.Tensor]]) -> list[Any]:
    """Every value of a run per feed set (the plain plan's), then the outputs twice (the second run's
    through the shape-specialised plan the first recorded)."""
    out = []
    for f in feeds:
        out += [_all_bits(ev.run(None, f, intermediates=True)), _all_bits(ev.run(None, f)), _all_bits(ev.run(None, f))]
    return out


def _export(name: str, exporter: str) -> tuple[onnx.ModelProto, list[dict[str, torch.Tensor]]]:
    model = real_models.export(name, exporter)
    names = [i.name for i in model.graph.input]
    return model, [dict(zip(names, args, strict=True)) for args in real_models.MODELS[name].all_inputs(torch.float32)]


def _builder(model: onnx.ModelProto, dims: dict[str, int]) -> tuple[onnx.ModelProto, list[dict[str, torch.Tensor]]]:
    return model, [models.random_feeds(model, dims=dims, seed=0)]


_GRAPHS = {
    "layer_norm_matmul_add-float16": lambda: _builder(models.layer_norm_matmul_add(dtype="float16"), {"a": 2, "b": 3, "c": 8}),
    "llama_decoder_layer": lambda: _builder(models.llama_decoder_layer(), {"batch": 2, "seq": 5}),
    "vit-torchscript": lambda: _export("vit", "torchscript"),  # Constant nodes, shape arithmetic
    "control_loop-torchscript": lambda: _export("control_loop", "torchscript"),  # Loop with an If inside
    "control_cond-dynamo": lambda: _export("control_cond", "dynamo"),  # If
}


@pytest.fixture(scope="module", params=list(_GRAPHS))
def graph(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, list[dict[str, torch.Tensor]]]:
    return _GRAPHS[request.param]()


def test_the_twin_computes_what_a_fresh_float64_evaluator_does(graph: tuple[onnx.ModelProto, list[dict[str, torch.Tensor]]]) -> None:
    """`ev.with_compute_dtype(torch.float64)`: every value of every run bit-identical to those of
    `TorchEvaluator(model, compute_dtype=torch.float64, check_model=False)`, and its declared output dtypes
    the same; the original's own values unchanged by the twin's building and running, and the twin's by
    the original's running, through both plans."""
    model, feeds = graph
    ev = TorchEvaluator(model)
    mine = _runs(ev, feeds)
    twin = ev.with_compute_dtype(torch.float64)
    fresh = TorchEvaluator(model, compute_dtype=torch.float64, check_model=False)
    assert twin.compute_dtype == torch.float64 and twin.device == ev.device and twin.model is ev.model
    theirs = _runs(twin, feeds)
    assert theirs == _runs(fresh, feeds)
    assert twin.output_dtypes == fresh.output_dtypes == ev.output_dtypes
    assert _runs(ev, feeds) == mine  # the original after the twin ran
    assert _runs(twin, feeds) == theirs  # and the twin after the original ran again
    # the values the twin promoted are tensors of its own
    pairs = [(ev._initializers[n], t) for n, t in twin._initializers.items()]
    pairs += [(a.value, b.value) for a, b in zip(ev._kernels, twin._kernels, strict=True) if isinstance(a, Constant) and isinstance(b, Constant)]
    promoted = [(a, b) for a, b in pairs if a.dtype != b.dtype and b.numel()]
    assert all(a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() for a, b in promoted)
    assert promoted or not any(a.is_floating_point() for a, _ in pairs)


def test_declared_output_dtypes_are_the_inferred_ones(graph: tuple[onnx.ModelProto, list[dict[str, torch.Tensor]]]) -> None:
    """output_dtypes read off the graph's outputs where it declares them all are what shape inference says."""
    ev = TorchEvaluator(graph[0])
    assert ev.output_dtypes == {n: ev._facts.declared_torch_dtype(n) for n in ev.output_names}


def test_an_undeclared_output_dtype_is_inferred() -> None:
    """An output the graph declares without an element type gets the inferred one, in the twin too."""
    graph = oh.make_graph(
        [oh.make_node("Relu", ["X"], ["r"]), oh.make_node("Cast", ["r"], ["Y"], to=TP.FLOAT16)],
        "g",
        [oh.make_tensor_value_info("X", TP.FLOAT, [2])],
        [oh.make_empty_tensor_value_info("Y"), oh.make_tensor_value_info("r", TP.FLOAT, [2])],
    )
    ev = TorchEvaluator(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9), check_model=False)
    assert ev.output_dtypes == {"Y": torch.float16, "r": torch.float32}
    assert ev.with_compute_dtype(torch.float64).output_dtypes == ev.output_dtypes


def _gap_kernel(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 1.5


@pytest.mark.parametrize(
    ("base_kernels", "twin_kernels", "base_dtype", "twin_dtype"),
    [
        pytest.param(None, {("", "Softmax"): "ort", ("", "Mul"): "float32"}, None, torch.float64, id="other-overrides"),
        pytest.param({("", "Softmax"): _gap_kernel, ("", "Add"): "ort"}, {("", "Softmax"): "ort"}, None, torch.float64, id="blame-like"),
        pytest.param({("", "MatMul"): "float64"}, "same", None, torch.float64, id="same-overrides"),
        pytest.param(None, None, torch.float32, torch.float64, id="from-float32"),
        pytest.param(None, None, torch.float64, None, id="back-from-float64"),
    ],
)
def test_the_twin_takes_other_kernels_and_dtypes(base_kernels: Any, twin_kernels: Any, base_dtype: Any, twin_dtype: Any) -> None:
    """With overrides of its own (or the original's, by default), and from or to any compute dtype: the
    same values as an evaluator built from scratch with them."""
    model = models.llama_decoder_layer()
    feeds = [models.random_feeds(model, dims={"batch": 2, "seq": 5}, seed=1)]
    ev = TorchEvaluator(model, kernels=base_kernels, compute_dtype=base_dtype)
    ev.run(None, feeds[0])  # its fold analysis done: a twin with the same overrides takes it
    if twin_kernels == "same":
        twin, want = ev.with_compute_dtype(twin_dtype), base_kernels
    else:
        twin, want = ev.with_compute_dtype(twin_dtype, kernels=twin_kernels), twin_kernels
    fresh = TorchEvaluator(model, kernels=want, compute_dtype=twin_dtype, check_model=False)
    assert _runs(twin, feeds) == _runs(fresh, feeds)
    assert twin._foldable == fresh._foldable and twin._guarded_sources == fresh._guarded_sources


def test_the_twin_of_a_model_with_ops_run_by_onnxruntime() -> None:
    """missing="ort" carries over: the op without a torch kernel runs on onnxruntime in the twin too."""
    graph = oh.make_graph(
        [oh.make_node("Relu", ["X"], ["r"]), oh.make_node("Trilu", ["r"], ["g"], domain="com.microsoft"), oh.make_node("Mul", ["g", "X"], ["Y"])],
        "g",
        [oh.make_tensor_value_info("X", TP.FLOAT, [2, 3])],
        [oh.make_tensor_value_info("Y", TP.FLOAT, [2, 3])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)], ir_version=9)
    ev = TorchEvaluator(model, missing="ort")
    twin = ev.with_compute_dtype("float64")
    fresh = TorchEvaluator(model, missing="ort", compute_dtype=torch.float64, check_model=False)
    feeds = [{"X": torch.linspace(-2, 2, 6).reshape(2, 3)}]
    assert twin.ops_run_by_ort == ("com.microsoft::Trilu",)
    assert _runs(twin, feeds) == _runs(fresh, feeds)


def test_the_twin_keeps_nothing_alive() -> None:
    """Neither evaluator keeps the other alive, nor itself in a cycle: each goes as soon as the last
    reference to it does (kernels hold their contexts, not the evaluator)."""
    ev = TorchEvaluator(models.mlp())
    twin = ev.with_compute_dtype(torch.float64)
    base_ref, twin_ref = weakref.ref(ev), weakref.ref(twin)
    del ev
    assert base_ref() is None
    del twin
    assert twin_ref() is None


def test_the_twin_refuses_what_the_constructor_refuses() -> None:
    ev = TorchEvaluator(models.mlp())
    with pytest.raises(ValueError, match=r"compute_dtype must be torch\.float64"):
        ev.with_compute_dtype(torch.float16)
    with pytest.raises(KeyError, match="names no node and no op type"):
        ev.with_compute_dtype(torch.float64, kernels={"nope": "ort"})


def test_ml_dtypes_is_what_onnx_decodes_with() -> None:
    """The decoding test compares through ml_dtypes arrays: onnx's numpy dtypes for float8 are those."""
    assert oh.tensor_dtype_to_np_dtype(TP.FLOAT8E4M3FN) == np.dtype(ml_dtypes.float8_e4m3fn)
