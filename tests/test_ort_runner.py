"""OrtRunner: outputs equal to a plain onnxruntime.InferenceSession's, feeds of torch or numpy, session
caching and options, bfloat16 through IO binding, providers, load_model, and the error messages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest
import torch

from pytest_ortdiff import OrtRunner, TorchEvaluator, models
from pytest_ortdiff.numerics.tensors import to_numpy
from pytest_ortdiff.runtimes.ort import (
    ProviderUnavailableError,
    UnsupportedByProviderError,
    load_model,
    model_bytes,
)
from pytest_ortdiff.runtimes.protocol import Runtime
from pytest_ortdiff.runtimes.providers import unavailable_reason

TP = onnx.TensorProto
DIMS = {"a": 2, "b": 8, "c": 16}


def make_model(nodes: list, inputs: list, outputs: list) -> onnx.ModelProto:
    return oh.make_model(oh.make_graph(nodes, "g", inputs, outputs), opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


@pytest.fixture(scope="module")
def m32() -> onnx.ModelProto:
    return models.layer_norm_matmul_add(dtype="float32")


@pytest.fixture(scope="module")
def f32(m32: onnx.ModelProto) -> dict[str, torch.Tensor]:
    return models.random_feeds(m32, dims=DIMS, seed=0)


def plain_session(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in feeds.items()})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_outputs_are_torch_tensors_equal_to_inference_session(dtype: str) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    (got,) = OrtRunner(model).run(None, feeds)
    (ref,) = plain_session(model, feeds)
    assert isinstance(got, torch.Tensor)
    assert got.dtype == getattr(torch, dtype)
    assert got.device.type == "cpu"
    assert tuple(got.shape) == ref.shape == (2, 8, 16)
    assert np.array_equal(got.numpy(), ref)


def test_numpy_and_torch_feeds_give_the_same_outputs(m32: onnx.ModelProto, f32: dict) -> None:
    (from_torch,) = OrtRunner(m32).run(None, f32)
    (from_numpy,) = OrtRunner(m32).run(None, {k: v.numpy() for k, v in f32.items()})
    mixed = {k: (v.numpy() if k in ("X", "bias") else v) for k, v in f32.items()}
    (from_mixed,) = OrtRunner(m32).run(None, mixed)
    assert torch.equal(from_torch, from_numpy)
    assert torch.equal(from_torch, from_mixed)


def test_non_contiguous_feeds(m32: onnx.ModelProto, f32: dict) -> None:
    (ref,) = OrtRunner(m32).run(None, f32)
    w = f32["weights"]
    w_t = w.t().contiguous().t()  # same values, transposed strides
    assert not w_t.is_contiguous()
    w_np = np.ascontiguousarray(w.numpy().T).T
    assert not w_np.flags.c_contiguous
    (a,) = OrtRunner(m32).run(None, {**f32, "weights": w_t})
    (b,) = OrtRunner(m32).run(None, {**f32, "weights": w_np})
    assert torch.equal(a, ref)
    assert torch.equal(b, ref)


def test_output_names_select_outputs() -> None:
    model = make_model(
        [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Neg", ["x"], ["n"])],
        [oh.make_tensor_value_info("x", TP.FLOAT, ["k"])],
        [oh.make_tensor_value_info("r", TP.FLOAT, ["k"]), oh.make_tensor_value_info("n", TP.FLOAT, ["k"])],
    )
    x = torch.tensor([-2.0, 0.5, 3.0])
    runner = OrtRunner(model)
    assert runner.input_names == ["x"]
    assert runner.output_names == ["r", "n"]
    n, r = runner.run(["n", "r"], {"x": x})
    assert n.tolist() == [2.0, -0.5, -3.0]
    assert r.tolist() == [0.0, 0.5, 3.0]
    assert [t.tolist() for t in runner.run(None, {"x": x})] == [[0.0, 0.5, 3.0], [2.0, -0.5, -3.0]]


# -- session cache and options ---------------------------------------------------------------------


def test_sessions_are_cached_per_model(m32: onnx.ModelProto) -> None:
    a = OrtRunner(m32).session
    assert OrtRunner(m32).session is a
    assert OrtRunner(m32.SerializeToString()).session is a  # the same bytes
    other = models.layer_norm_matmul_add(dtype="float32", epsilon=1e-3)
    assert OrtRunner(other).session is not a


def test_an_uncached_runner_makes_its_own_session_and_keeps_none(m32: onnx.ModelProto, f32: dict) -> None:
    from pytest_ortdiff.runtimes import ort as ort_module

    cached = OrtRunner(m32).session
    before = dict(ort_module._SESSIONS)
    own = OrtRunner(m32, cache=False)
    assert own.session is not cached and own.session is own.session  # its own, made once
    assert dict(ort_module._SESSIONS) == before  # nothing added to the cache
    assert torch.equal(own.run(None, f32)[0], OrtRunner(m32).run(None, f32)[0])


def test_session_options_dict_is_applied_and_cached_separately(m32: onnx.ModelProto, f32: dict) -> None:
    default = OrtRunner(m32).session
    opts = {"intra_op_num_threads": 1, "graph_optimization_level": "disable"}
    sess = OrtRunner(m32, session_options=opts).session
    assert sess is not default
    # the same options in another order: the same session
    assert OrtRunner(m32, session_options={"graph_optimization_level": "disable", "intra_op_num_threads": 1}).session is sess
    so = sess.get_session_options()
    assert so.intra_op_num_threads == 1
    assert so.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert OrtRunner(m32, session_options={"intra_op_num_threads": 2}).session not in (sess, default)
    # unoptimized or not, the graph computes the same function
    (a,) = OrtRunner(m32, session_options=opts).run(None, f32)
    (b,) = OrtRunner(m32).run(None, f32)
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, rtol=1e-5)


def test_session_options_object_is_used_as_is(m32: onnx.ModelProto) -> None:
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    sess = OrtRunner(m32, session_options=so).session
    assert sess.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize(("level", "expected"), [("basic", "ORT_ENABLE_BASIC"), ("ALL", "ORT_ENABLE_ALL"), (0, "ORT_DISABLE_ALL")])
def test_graph_optimization_level_spellings(m32: onnx.ModelProto, level: object, expected: str) -> None:
    sess = OrtRunner(m32, session_options={"graph_optimization_level": level}).session
    assert sess.get_session_options().graph_optimization_level == getattr(onnxruntime.GraphOptimizationLevel, expected)


def test_unknown_session_option_lists_examples(m32: onnx.ModelProto) -> None:
    expected = "unknown session option 'intra_threads'; e.g. intra_op_num_threads, graph_optimization_level, use_deterministic_compute, or a config entry"
    with pytest.raises(ValueError, match=re.escape(expected)):
        OrtRunner(m32, session_options={"intra_threads": 1}).session  # noqa: B018


def test_worker_threads_do_not_spin_unless_asked(m32: onnx.ModelProto) -> None:
    # spinning onnxruntime threads slow down the torch kernel that runs next: off by default
    default = OrtRunner(m32).session.get_session_options()
    assert default.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert default.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    asked = OrtRunner(m32, session_options={"session.intra_op.allow_spinning": 1, "intra_op_num_threads": 1}).session.get_session_options()
    assert asked.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert asked.intra_op_num_threads == 1


def test_unknown_optimization_level_lists_valid(m32: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=re.escape("graph_optimization_level 'fast'; valid: disable, basic, extended, all")):
        OrtRunner(m32, session_options={"graph_optimization_level": "fast"}).session  # noqa: B018


# -- feed errors --------------------------------------------------------------------------------


def test_missing_feed_lists_the_inputs(m32: onnx.ModelProto, f32: dict) -> None:
    feeds = {k: v for k, v in f32.items() if k != "bias2"}
    with pytest.raises(ValueError, match=re.escape("feeds do not match the model's inputs: missing ['bias2'], unknown []; inputs are X: float32[a, b, c], scale: float32[c], bias: float32[c], weights: float32[c, c], bias2: float32[c]")):
        OrtRunner(m32).run(None, feeds)


def test_unknown_and_missing_feeds_together(m32: onnx.ModelProto, f32: dict) -> None:
    feeds = {k: v for k, v in f32.items() if k != "X"}
    feeds["x"] = f32["X"]
    with pytest.raises(ValueError, match=re.escape("feeds do not match the model's inputs: missing ['X'], unknown ['x']; inputs are X: float32[a, b, c], scale: float32[c], bias: float32[c], weights: float32[c, c], bias2: float32[c]")):
        OrtRunner(m32).run(None, feeds)


def test_feed_with_wrong_dtype_is_named(m32: onnx.ModelProto, f32: dict) -> None:
    with pytest.raises((TypeError, ValueError), match=r"'X'.*float16.*float32"):
        OrtRunner(m32).run(None, {**f32, "X": f32["X"].half()})


# -- bfloat16 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_bytes", [False, True], ids=["proto", "bytes"])
def test_an_input_declared_without_a_shape_takes_any_rank_and_a_scalar_only_rank_0(as_bytes: bool) -> None:
    """onnxruntime reports both as shape []: the model's own declaration tells them apart."""
    f = onnx.TensorProto.FLOAT
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "s"], ["y"])], "shapeless", [oh.make_tensor_value_info("x", f, None), oh.make_tensor_value_info("s", f, [])], [oh.make_tensor_value_info("y", f, None)]
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    runner = OrtRunner(model.SerializeToString() if as_bytes else model)
    x = torch.arange(6.0).reshape(2, 3)
    (y,) = runner.run(None, {"x": x, "s": torch.tensor(0.5)})
    assert torch.equal(y, x + 0.5)
    with pytest.raises(ValueError, match=re.escape("feed 's' has shape (1,) (rank 1), the model declares float32[]")):
        runner.run(None, {"x": x, "s": torch.tensor([0.5])})


def test_bfloat16_outputs_through_cast() -> None:
    # ORT's CPU provider implements Cast to and from bfloat16 (but not bfloat16 arithmetic)
    model = make_model(
        [oh.make_node("Cast", ["x"], ["y"], to=TP.BFLOAT16), oh.make_node("Cast", ["y"], ["z"], to=TP.FLOAT)],
        [oh.make_tensor_value_info("x", TP.FLOAT, ["n"])],
        [oh.make_tensor_value_info("y", TP.BFLOAT16, ["n"]), oh.make_tensor_value_info("z", TP.FLOAT, ["n"])],
    )
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 100
    y, z = OrtRunner(model).run(None, {"x": x})
    assert y.dtype == torch.bfloat16
    assert tuple(y.shape) == (1000,)
    assert torch.equal(y, x.to(torch.bfloat16))  # round to nearest even, as torch does
    assert torch.equal(z, x.to(torch.bfloat16).float())
    assert not torch.equal(z, x)  # bfloat16 did round


def _bf16_to_float() -> onnx.ModelProto:
    return make_model(
        [oh.make_node("Cast", ["x"], ["y"], to=TP.FLOAT)],
        [oh.make_tensor_value_info("x", TP.BFLOAT16, ["n"])],
        [oh.make_tensor_value_info("y", TP.FLOAT, ["n"])],
    )


def test_bfloat16_feeds_torch_and_numpy() -> None:
    xb = (torch.randn(257, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    (y,) = OrtRunner(_bf16_to_float()).run(None, {"x": xb})
    assert y.dtype == torch.float32
    assert torch.equal(y, xb.float())
    arr = to_numpy(xb)  # ml_dtypes.bfloat16 (or its uint16 bits)
    assert arr.dtype.itemsize == 2
    (y2,) = OrtRunner(_bf16_to_float()).run(None, {"x": arr})
    assert torch.equal(y2, xb.float())


@pytest.mark.parametrize(("op", "named"), [("MatMul", "MatMul"), ("Add", "Add")])
def test_bfloat16_arithmetic_on_cpu_is_unsupported_and_named(op: str, named: str) -> None:
    model = make_model(
        [oh.make_node(op, ["x", "w"], ["y"])],
        [oh.make_tensor_value_info("x", TP.BFLOAT16, [3, 3]), oh.make_tensor_value_info("w", TP.BFLOAT16, [3, 3])],
        [oh.make_tensor_value_info("y", TP.BFLOAT16, [3, 3])],
    )
    x = torch.ones(3, 3, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedByProviderError, match=rf"^onnxruntime CPUExecutionProvider has no kernel for {named}\(\d+\): .*NOT_IMPLEMENTED") as info:
        OrtRunner(model).run(None, {"x": x, "w": x})
    assert info.value.provider == "CPU"
    assert re.fullmatch(rf"{named}\(\d+\)", info.value.op)


def test_bfloat16_seed_graph_names_the_first_missing_op() -> None:
    model = models.layer_norm_matmul_add(dtype="bfloat16")
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    assert feeds["X"].dtype == torch.bfloat16
    with pytest.raises(UnsupportedByProviderError) as info:
        OrtRunner(model).run(None, feeds)
    assert info.value.op.split("(")[0] in {"LayerNormalization", "MatMul", "Add"}
    assert info.value.op in str(info.value)


# -- providers ----------------------------------------------------------------------------------


def test_unknown_provider_lists_the_valid_ones(m32: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=re.escape("unknown provider 'GPU'; valid: CPU, CUDA, TensorRT, ROCm")) as info:
        OrtRunner(m32, provider="GPU")
    assert "a full EP name such as CUDAExecutionProvider" in str(info.value)


@pytest.mark.parametrize("spelling", ["cpu", "CPUExecutionProvider", " CPU "])
def test_provider_spellings(m32: onnx.ModelProto, spelling: str) -> None:
    runner = OrtRunner(m32, provider=spelling)
    assert runner.provider == "CPU"
    assert runner.device == torch.device("cpu")
    assert runner.session.get_providers() == ["CPUExecutionProvider"]


def test_unavailable_provider_says_what_is_available(m32: onnx.ModelProto, f32: dict) -> None:
    reason = unavailable_reason("CUDA")
    if reason is None:
        pytest.skip("CUDA is usable here: this test needs a machine without it")
    with pytest.raises(ProviderUnavailableError, match=re.escape(reason)):
        OrtRunner(m32, provider="CUDA").run(None, f32)
    assert "CUDAExecutionProvider" in reason


# -- load_model ------------------------------------------------------------------------------------


def test_load_model_from_path_bytes_and_proto(tmp_path: Path, m32: onnx.ModelProto, f32: dict) -> None:
    path = tmp_path / "lnmma.onnx"
    onnx.save(m32, str(path))
    data = m32.SerializeToString()
    assert load_model(m32) is m32
    for source in (path, str(path), data, bytearray(data)):
        loaded = load_model(source)
        assert isinstance(loaded, onnx.ModelProto)
        assert [n.op_type for n in loaded.graph.node] == ["LayerNormalization", "MatMul", "Add"]
        assert model_bytes(source) == data
    # runners built from any of them share the session and agree
    (a,) = OrtRunner(path).run(None, f32)
    (b,) = OrtRunner(data).run(None, f32)
    assert OrtRunner(path).session is OrtRunner(m32).session
    assert torch.equal(a, b)


def test_load_model_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match=re.escape(f"model file {str(missing)!r} does not exist")):
        load_model(missing)


def test_runner_on_missing_path_has_the_same_message(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match=re.escape(f"model file {str(missing)!r} does not exist")):
        OrtRunner(str(missing))


def test_load_model_wrong_type() -> None:
    with pytest.raises(TypeError, match=re.escape("expected an onnx.ModelProto, a path or bytes, got int")):
        load_model(42)


def test_arguments_after_the_model_are_keyword_only(m32: onnx.ModelProto) -> None:
    with pytest.raises(TypeError, match="positional"):
        OrtRunner(m32, "CPU")  # type: ignore[misc]


def test_runners_are_runtimes(m32: onnx.ModelProto) -> None:
    class Doubler:
        def run(self, output_names: object, feeds: dict) -> list[torch.Tensor]:
            return [v * 2 for v in feeds.values()]

    for runtime in (OrtRunner(m32), TorchEvaluator(m32), Doubler()):
        assert isinstance(runtime, Runtime)
    assert not isinstance(object(), Runtime)


def test_feeds_that_require_grad_are_detached(m32: onnx.ModelProto, f32: dict) -> None:
    """Issue 12 item 11: DLPack refuses a tensor that requires grad (BufferError before the fix)."""
    (ref,) = OrtRunner(m32).run(None, f32)
    grad_feeds = {k: v.clone().requires_grad_() for k, v in f32.items()}
    (got,) = OrtRunner(m32).run(None, grad_feeds)
    assert torch.equal(got, ref)
    assert not got.requires_grad


# -- external data ---------------------------------------------------------------------------------


def _weights_model() -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("MatMul", ["x", "W"], ["y"])],
            "g",
            [oh.make_tensor_value_info("x", TP.FLOAT, [2, 8])],
            [oh.make_tensor_value_info("y", TP.FLOAT, [2, 8])],
            [onnx.numpy_helper.from_array(w, "W")],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    return model, w


def _save_external(model: onnx.ModelProto, path: Path, location: str = "weights.data") -> None:
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0)


def test_model_with_external_data_runs_from_its_path(tmp_path: Path) -> None:
    """Issue 12 item 10: from the file's bytes alone onnxruntime cannot find the data ("model_path must
    not be empty" before the fix): the runner opens the file itself."""
    model, w = _weights_model()
    path = tmp_path / "m.onnx"
    _save_external(model, path)
    x = torch.linspace(-1, 1, 16).reshape(2, 8)
    (y,) = OrtRunner(path).run(None, {"x": x})
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w, rtol=1e-6)
    (y2,) = OrtRunner(str(path)).run(None, {"x": x})
    assert torch.equal(y, y2)
    # the same graph with other weights in another folder: another session
    other = tmp_path / "other"
    other.mkdir()
    model2, _ = _weights_model()
    model2.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w * 2, "W"))
    _save_external(model2, other / "m.onnx")
    (y3,) = OrtRunner(other / "m.onnx").run(None, {"x": x})
    assert torch.allclose(y3, 2 * y)


def test_external_data_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    model, _ = _weights_model()
    path = tmp_path / "m.onnx"
    _save_external(model, path)
    with pytest.raises(ValueError, match=r"keeps the data of 1 tensor\(s\) in other files \('weights.data'\): pass the model's path"):
        OrtRunner(path.read_bytes())
    (tmp_path / "weights.data").rename(tmp_path / "elsewhere.data")
    with pytest.raises(FileNotFoundError, match=r"tensor 'W' is in 'weights.data', which does not exist; copy it next to the model"):
        OrtRunner(path)
    # data outside the model's folder, directly or through a symlink, is refused
    inner = tmp_path / "inner"
    inner.mkdir()
    proto = onnx.load(str(path), load_external_data=False)
    for location in ("../elsewhere.data", "link.data"):
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save(proto, str(inner / "m.onnx"))
        if location == "link.data":
            (inner / "link.data").symlink_to(tmp_path / "elsewhere.data")
        with pytest.raises(ValueError, match=rf"'{re.escape(location)}', outside the model's directory"):
            OrtRunner(inner / "m.onnx")


# -- dtypes DLPack (or onnxruntime's DLPack) lacks: bound without it, per tensor ----------------------


def _bool_model() -> onnx.ModelProto:
    """x (float) > 0 -> m, And(m, keep) -> y, Not(keep) -> z: a bool input and two bool outputs."""
    return oh.make_model(
        oh.make_graph(
            [
                oh.make_node("Greater", ["x", "zero"], ["m"]),
                oh.make_node("And", ["m", "keep"], ["y"]),
                oh.make_node("Not", ["keep"], ["z"]),
            ],
            "g",
            [oh.make_tensor_value_info("x", TP.FLOAT, [6]), oh.make_tensor_value_info("keep", TP.BOOL, [6])],
            [oh.make_tensor_value_info("y", TP.BOOL, [6]), oh.make_tensor_value_info("z", TP.BOOL, [6])],
            [oh.make_tensor("zero", TP.FLOAT, [], [0.0])],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )


_BOOL_FEEDS = {
    "x": torch.tensor([-1.0, 2.0, 3.0, -4.0, 5.0, 0.0]),
    "keep": torch.tensor([True, True, False, True, True, True]),
}
_BOOL_Y = [False, True, False, False, True, False]
_BOOL_Z = [False, False, True, False, False, False]


def test_bool_feeds_and_outputs_keep_their_dtype() -> None:
    """onnxruntime 1.31 refuses a bool tensor through DLPack and hands bool outputs back as uint8: the
    runner binds such a feed without DLPack and gives every output the dtype the model declares."""
    y, z = OrtRunner(_bool_model()).run(None, _BOOL_FEEDS)
    assert (y.dtype, z.dtype) == (torch.bool, torch.bool)
    assert y.tolist() == _BOOL_Y and z.tolist() == _BOOL_Z
    (y_np,) = OrtRunner(_bool_model()).run(["y"], {k: v.numpy() for k, v in _BOOL_FEEDS.items()})
    assert y_np.dtype == torch.bool and y_np.tolist() == _BOOL_Y


def test_a_feed_dlpack_refuses_is_bound_without_it_and_the_others_still_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per tensor, not per run: a refused bool goes through a host array, the float feed still through DLPack."""
    real = onnxruntime.OrtValue.from_dlpack
    seen: list[torch.dtype] = []

    def refusing(t: object, *args: object, **kwargs: object) -> object:
        seen.append(t.dtype)  # type: ignore[attr-defined]
        if t.dtype == torch.bool:  # type: ignore[attr-defined]
            raise RuntimeError("dlpack_converter.cc:145 GetOrtValueDataType Unsupported code 6")
        return real(t, *args, **kwargs)

    monkeypatch.setattr(onnxruntime.OrtValue, "from_dlpack", staticmethod(refusing))
    from pytest_ortdiff.runtimes import ort as ort_module

    monkeypatch.setattr(ort_module, "_DLPACK_REFUSED", set())
    runner = OrtRunner(_bool_model(), cache=False)
    y, z = runner.run(None, _BOOL_FEEDS)
    assert y.tolist() == _BOOL_Y and z.tolist() == _BOOL_Z
    assert seen == [torch.float32, torch.bool]
    seen.clear()
    runner.run(None, _BOOL_FEEDS)  # the refusal is remembered: no second try for bool
    assert seen == [torch.float32]


def test_outputs_handed_back_in_another_dtype_are_given_the_declared_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime 1.31's DLPack export of a bool output is uint8: a silent change of dtype in what is compared."""
    real = torch.from_dlpack

    def as_uint8(value: object) -> torch.Tensor:
        t = real(value)
        return t.view(torch.uint8) if t.dtype == torch.bool else t

    monkeypatch.setattr(torch, "from_dlpack", as_uint8)
    y, z = OrtRunner(_bool_model(), cache=False).run(None, _BOOL_FEEDS)
    assert (y.dtype, z.dtype) == (torch.bool, torch.bool)
    assert y.tolist() == _BOOL_Y and z.tolist() == _BOOL_Z


# -- IR versions newer than onnxruntime reads -------------------------------------------------------


def _ir_model(ir_version: int) -> onnx.ModelProto:
    model = make_model(
        [oh.make_node("Relu", ["x"], ["y"])],
        [oh.make_tensor_value_info("x", TP.FLOAT, [3])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [3])],
    )
    model.ir_version = ir_version
    return model


def test_a_model_of_a_newer_ir_version_runs_when_it_uses_nothing_of_it_and_says_so() -> None:
    """onnx 1.23 writes IR 14 for any model and onnxruntime 1.31 reads IR <= 13: a model needing nothing
    newer runs at the version this onnxruntime reads, and the runner's notes say so (one version past the
    newest onnx knows stands in for it on an onnxruntime that reads IR 14)."""
    runner = OrtRunner(_ir_model(onnx.IR_VERSION + 1), cache=False)
    (y,) = runner.run(None, {"x": torch.tensor([-1.0, 0.5, 2.0])})
    assert y.tolist() == [0.0, 0.5, 2.0]
    (note,) = runner.notes
    assert re.fullmatch(
        rf"IR version {onnx.IR_VERSION + 1} read as (\d+): onnxruntime {re.escape(onnxruntime.__version__)} reads IR <= \1, "
        r"and the model uses nothing newer \(it needs IR 8\); onnx.helper.make_model\(..., ir_version=\1\) writes it so",
        note,
    ), note
    cached = OrtRunner(_ir_model(onnx.IR_VERSION + 1))
    cached.run(None, {"x": torch.zeros(3)})
    again = OrtRunner(_ir_model(onnx.IR_VERSION + 1))  # from the session cache: the note comes with it
    again.run(None, {"x": torch.zeros(3)})
    assert again.notes == (note,)
    assert OrtRunner(_ir_model(9)).notes == ()


def test_a_model_that_needs_a_newer_ir_version_is_refused_in_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ortdiff.runtimes import model_io
    from pytest_ortdiff.runtimes.ort import IrVersionError

    # what a model with a FLOAT6E2M3 tensor needs, on any onnxruntime: one IR version past the newest
    monkeypatch.setattr(model_io, "required_ir_version", lambda proto: (onnx.IR_VERSION + 1, "element type FLOAT6E2M3"))
    with pytest.raises(IrVersionError) as info:
        OrtRunner(_ir_model(onnx.IR_VERSION + 1), cache=False).run(None, {"x": torch.zeros(3)})
    message = str(info.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"the model needs IR version {onnx.IR_VERSION + 1} \(element type FLOAT6E2M3\) and onnxruntime \S+ reads IR <= \d+: "
        rf"install an onnxruntime that reads IR {onnx.IR_VERSION + 1}, or build the model without element type FLOAT6E2M3",
        message,
    ), message


def test_required_ir_version_names_what_sets_it() -> None:
    from pytest_ortdiff.runtimes.model_io import required_ir_version

    assert required_ir_version(_ir_model(14)) == (8, "opset ai.onnx 18")
    model = _ir_model(14)
    model.graph.node.append(oh.make_node("Cast", ["y"], ["z"], to=TP.FLOAT8E8M0))
    assert required_ir_version(model) == (12, "element type FLOAT8E8M0")
    model.graph.initializer.append(oh.make_tensor("w", TP.INT2, [2], [1, -1]))
    assert required_ir_version(model) == (13, "element type INT2")
    body = oh.make_graph([oh.make_node("Cast", ["a"], ["b"], to=TP.FLOAT6E2M3)], "body", [], [oh.make_tensor_value_info("b", TP.FLOAT6E2M3, [1])])
    model.graph.node.append(oh.make_node("If", ["c"], ["d"], then_branch=body, else_branch=body))
    assert required_ir_version(model) == (14, "element type FLOAT6E2M3")


def test_a_model_file_with_external_data_of_a_newer_ir_version_runs(tmp_path: Path) -> None:
    model, w = _weights_model()
    model.ir_version = onnx.IR_VERSION + 1
    _save_external(model, tmp_path / "m.onnx")
    runner = OrtRunner(tmp_path / "m.onnx", cache=False)
    x = np.ones((2, w.shape[0]), np.float32)
    (y,) = runner.run(None, {"x": x})
    np.testing.assert_allclose(y.numpy(), x @ w, rtol=1e-6)
    assert len(runner.notes) == 1
