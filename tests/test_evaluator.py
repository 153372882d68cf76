"""TorchEvaluator: values against independent references (numpy float64, onnx.reference, onnxruntime),
intermediates and their freeing, pruning, the float64 oracle, kernel overrides, and its error messages."""

from __future__ import annotations

import re
import weakref
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff import OrtRunner, TorchEvaluator, compare, models
from pytest_ortdiff.runtimes.evaluator import MissingKernelError
from pytest_ortdiff.runtimes.kernels import known_ops

TP = onnx.TensorProto
DIMS = {"a": 2, "b": 8, "c": 16}
INPUTS = ("X", "scale", "bias", "weights", "bias2")


def lnmma_numpy(feeds: dict[str, torch.Tensor], eps: float = 1e-5) -> dict[str, np.ndarray]:
    """LayerNorm -> MatMul -> Add in float64 numpy, from the feeds' exact values."""
    x, scale, bias, w, b2 = (feeds[k].double().numpy() for k in INPUTS)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    norm = (x - mean) / np.sqrt(var + eps) * scale + bias
    mm = norm @ w
    return {"norm": norm, "mm": mm, "Z": mm + b2}


def assert_close(got: torch.Tensor, expected: np.ndarray, atol: float, rtol: float) -> None:
    np.testing.assert_allclose(got.double().numpy(), expected, atol=atol, rtol=rtol)


def make_model(nodes: list, inputs: list, outputs: list, opsets: dict[str, int] | None = None) -> onnx.ModelProto:
    opsets = opsets or {"": 18}
    return oh.make_model(
        oh.make_graph(nodes, "g", inputs, outputs),
        opset_imports=[oh.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=9,
    )


def vi(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


@pytest.fixture(scope="module")
def m32() -> onnx.ModelProto:
    return models.layer_norm_matmul_add(dtype="float32")


@pytest.fixture(scope="module")
def m16() -> onnx.ModelProto:
    return models.layer_norm_matmul_add(dtype="float16")


@pytest.fixture(scope="module")
def f32(m32: onnx.ModelProto) -> dict[str, torch.Tensor]:
    return models.random_feeds(m32, dims=DIMS, seed=0)


@pytest.fixture(scope="module")
def f16(m16: onnx.ModelProto) -> dict[str, torch.Tensor]:
    return models.random_feeds(m16, dims=DIMS, seed=0)


# -- values against references ------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "max_ulp"), [("float32", 16), ("float16", 4)])
def test_matches_onnx_reference_evaluator(dtype: str, max_ulp: int) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    (got,) = TorchEvaluator(model).run(None, feeds)
    (ref,) = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})
    assert got.dtype == getattr(torch, dtype)
    assert tuple(got.shape) == (2, 8, 16) == ref.shape
    report = compare(torch.from_numpy(ref), got)
    assert report.max_ulp <= max_ulp
    # and both close to the float64 truth at the dtype's default tolerance
    tol = 1e-4 if dtype == "float32" else 1e-2
    assert_close(got, lnmma_numpy(feeds)["Z"], atol=tol, rtol=tol)


@pytest.mark.parametrize(("dtype", "max_ulp"), [("float32", 16), ("float16", 4)])
def test_matches_onnxruntime(dtype: str, max_ulp: int) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=1)
    (got,) = TorchEvaluator(model).run(None, feeds)
    (ort,) = OrtRunner(model).run(None, feeds)
    report = compare(ort, got)
    assert report.n == 256
    assert report.max_ulp <= max_ulp
    assert report.nan_mismatch == report.inf_mismatch == 0


def test_intermediates_return_every_value_with_right_values(m32: onnx.ModelProto, f32: dict) -> None:
    values = TorchEvaluator(m32).run(None, f32, intermediates=True)
    assert isinstance(values, dict)
    assert set(values) == {*INPUTS, "norm", "mm", "Z"}
    ref = lnmma_numpy(f32)
    assert_close(values["norm"], ref["norm"], atol=1e-5, rtol=1e-5)
    assert_close(values["mm"], ref["mm"], atol=1e-4, rtol=1e-4)
    assert_close(values["Z"], ref["Z"], atol=1e-4, rtol=1e-4)
    assert {k: tuple(v.shape) for k, v in values.items() if k in ("norm", "mm", "Z")} == dict.fromkeys(("norm", "mm", "Z"), (2, 8, 16))
    # the same numbers as a plain run
    (z,) = TorchEvaluator(m32).run(None, f32)
    assert torch.equal(values["Z"], z)
    assert torch.equal(values["X"], f32["X"])


def _spy_kernels() -> tuple[dict, dict]:
    """A LayerNorm that keeps a weak reference to its output, an Add (the last node) that looks at it."""
    refs: dict[str, weakref.ref] = {}
    seen: dict[str, bool] = {}

    def layer_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (x.shape[-1],), scale, bias, 1e-5)
        refs["norm"] = weakref.ref(y)
        return y

    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen["norm alive during Add"] = refs["norm"]() is not None
        return a + b

    return {"layer_norm": layer_norm, "add": add}, seen


def test_intermediates_are_freed_after_their_last_use(m16: onnx.ModelProto, f16: dict) -> None:
    kernels, seen = _spy_kernels()
    out = TorchEvaluator(m16, kernels=kernels).run(None, f16)
    # `norm` is last used by MatMul: by the time Add runs it is gone
    assert seen == {"norm alive during Add": False}
    assert isinstance(out, list) and len(out) == 1 and tuple(out[0].shape) == (2, 8, 16)


def test_intermediates_true_keeps_them(m16: onnx.ModelProto, f16: dict) -> None:
    kernels, seen = _spy_kernels()
    values = TorchEvaluator(m16, kernels=kernels).run(None, f16, intermediates=True)
    assert seen == {"norm alive during Add": True}
    assert values["norm"].dtype == torch.float16


def test_output_names_subset_prunes_the_graph(m32: onnx.ModelProto, f32: dict) -> None:
    calls: list[str] = []

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append("matmul")
        return a @ b

    ev = TorchEvaluator(m32, kernels={"matmul": matmul})
    (norm,) = ev.run(["norm"], f32)
    assert calls == []  # MatMul (and Add) are not needed for `norm`
    assert tuple(norm.shape) == (2, 8, 16)
    assert_close(norm, lnmma_numpy(f32)["norm"], atol=1e-5, rtol=1e-5)
    z, norm2 = ev.run(["Z", "norm"], f32)
    assert calls == ["matmul"]
    assert torch.equal(norm2, norm)
    assert tuple(z.shape) == (2, 8, 16)


def test_unknown_output_name_lists_the_outputs(m32: onnx.ModelProto, f32: dict) -> None:
    with pytest.raises(KeyError, match=re.escape("'nope' is not a value of this graph; outputs: ['Z']")):
        TorchEvaluator(m32).run(["nope"], f32)


# -- the float64 oracle ---------------------------------------------------------------------------


@pytest.mark.parametrize("compute_dtype", [torch.float64, "float64"])
def test_float64_oracle_is_closer_to_the_truth(m16: onnx.ModelProto, f16: dict, compute_dtype: object) -> None:
    oracle = TorchEvaluator(m16, compute_dtype=compute_dtype)
    (z64,) = oracle.run(None, f16)
    (z16,) = TorchEvaluator(m16).run(None, f16)
    assert z64.dtype == torch.float64
    assert z16.dtype == torch.float16
    truth = torch.from_numpy(lnmma_numpy(f16)["Z"])
    r_oracle = compare(truth, z64)
    r_half = compare(truth, z16.double())
    assert r_oracle.max_abs < 1e-9
    assert r_half.max_abs > 1e-3  # float16 rounding of values up to ~10
    assert r_oracle.max_abs < r_half.max_abs / 1e5
    # intermediates are float64 too
    values = oracle.run(None, f16, intermediates=True)
    assert {values[k].dtype for k in ("norm", "mm", "Z")} == {torch.float64}


def test_output_dtypes_record_the_declared_dtypes(m16: onnx.ModelProto) -> None:
    assert TorchEvaluator(m16, compute_dtype="float64").output_dtypes == {"Z": torch.float16}
    assert TorchEvaluator(m16).output_dtypes == {"Z": torch.float16}
    assert TorchEvaluator(models.layer_norm_matmul_add(dtype="float32")).output_dtypes == {"Z": torch.float32}


def test_compute_dtype_float16_is_rejected(m16: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=r"compute_dtype must be torch\.float64 \(the oracle\), torch\.float32 or None; got torch\.float16"):
        TorchEvaluator(m16, compute_dtype=torch.float16)


@pytest.mark.parametrize("name", ["fp64", "bogus"])
def test_compute_dtype_string_uses_the_project_dtype_names(m16: onnx.ModelProto, f16: dict, name: str) -> None:
    if name == "fp64":
        (z,) = TorchEvaluator(m16, compute_dtype=name).run(None, f16)
        assert z.dtype == torch.float64
    else:
        with pytest.raises(ValueError, match=r"compute_dtype.*'bogus'.*float64"):
            TorchEvaluator(m16, compute_dtype=name)


# -- feed errors ------------------------------------------------------------------------------------


def test_missing_and_unknown_feed_names_list_the_inputs(m16: onnx.ModelProto, f16: dict) -> None:
    feeds = {k: v for k, v in f16.items() if k != "bias2"}
    feeds["B2"] = f16["bias2"]
    expected = (
        "feeds do not match the model's inputs: missing ['bias2'], unknown ['B2']; inputs are "
        "X: float16[a, b, c], scale: float16[c], bias: float16[c], weights: float16[c, c], bias2: float16[c]"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        TorchEvaluator(m16).run(None, feeds)


def test_feed_with_wrong_dtype_names_both_and_suggests_a_cast(m16: onnx.ModelProto, f16: dict) -> None:
    feeds = {**f16, "X": f16["X"].float()}
    expected = "feed 'X' has dtype float32, the model declares float16[a, b, c]; cast it (e.g. .to(torch.float16))"
    with pytest.raises(TypeError, match=re.escape(expected)):
        TorchEvaluator(m16).run(None, feeds)


def test_feed_with_wrong_rank(m16: onnx.ModelProto, f16: dict) -> None:
    feeds = {**f16, "X": f16["X"][0]}
    expected = "feed 'X' has shape (8, 16) (rank 2), the model declares float16[a, b, c]"
    with pytest.raises(ValueError, match=re.escape(expected)):
        TorchEvaluator(m16).run(None, feeds)


def test_feed_with_wrong_fixed_dim() -> None:
    model = make_model([oh.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, ["n", 4])], [vi("y", TP.FLOAT, ["n", 4])])
    ev = TorchEvaluator(model)
    (y,) = ev.run(None, {"x": torch.tensor([[-1.0, 2.0, -3.0, 4.0]])})
    assert y.tolist() == [[0.0, 2.0, 0.0, 4.0]]
    with pytest.raises(ValueError, match=re.escape("feed 'x' has shape (2, 5), the model declares float32[n, 4] (axis 1 must be 4)")):
        ev.run(None, {"x": torch.zeros(2, 5)})


def test_numpy_feeds_work(m32: onnx.ModelProto, f32: dict) -> None:
    (z_np,) = TorchEvaluator(m32).run(None, {k: v.numpy() for k, v in f32.items()})
    (z_t,) = TorchEvaluator(m32).run(None, f32)
    assert torch.equal(z_np, z_t)


# -- model errors ----------------------------------------------------------------------------------


def _output_without_shape() -> onnx.ModelProto:
    # onnx.checker requires a graph output's type to have a shape field
    return make_model([oh.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, [3])], [vi("y", TP.FLOAT, None)])


def test_model_failing_onnx_checker() -> None:
    with pytest.raises(ValueError, match=r"^the model fails onnx\.checker: .*shape.*; fix the graph \(or pass check_model=False to try anyway\)$"):
        TorchEvaluator(_output_without_shape())
    # the suggested way out works
    (y,) = TorchEvaluator(_output_without_shape(), check_model=False).run(None, {"x": torch.tensor([-1.0, 0.5, 2.0])})
    assert y.tolist() == [0.0, 0.5, 2.0]


def _fused_matmul_model() -> onnx.ModelProto:
    node = oh.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=2.0, name="fmm")
    return make_model([node], [vi("x", TP.FLOAT, [2, 3]), vi("w", TP.FLOAT, [3, 4])], [vi("y", TP.FLOAT, [2, 4])], {"": 18, "com.microsoft": 1})


def _hardmax_model() -> onnx.ModelProto:
    node = oh.make_node("Hardmax", ["x"], ["y"], axis=-1, name="hm")
    return make_model([node], [vi("x", TP.FLOAT, [2, 3])], [vi("y", TP.FLOAT, [2, 3])])


FUSED_MATMUL_DICT = 'kernels={("com.microsoft", "FusedMatMul"): "ort"}'


def test_missing_kernel_names_the_op_and_suggests_ort() -> None:
    assert "com.microsoft::FusedMatMul" not in known_ops()
    with pytest.raises(MissingKernelError) as info:
        TorchEvaluator(_fused_matmul_model())
    msg = str(info.value)
    assert msg.startswith(f"no torch kernel for com.microsoft::FusedMatMul (opset 1); run it on onnxruntime: TorchEvaluator(model, {FUSED_MATMUL_DICT}), ")
    assert 'or every op without a kernel: TorchEvaluator(model, missing="ort"); known ops: ' in msg
    assert "known ops: Abs, " in msg and ", LayerNormalization, " in msg and ", MatMul, " in msg
    assert info.value.ops == ("com.microsoft::FusedMatMul",)
    assert isinstance(info.value, NotImplementedError)


def test_missing_kernel_suggestion_works() -> None:
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    w = torch.linspace(0, 2, 12).reshape(3, 4)
    ev = TorchEvaluator(_fused_matmul_model(), kernels={("com.microsoft", "FusedMatMul"): "ort"})
    (y,) = ev.run(None, {"x": x, "w": w})
    assert y.dtype == torch.float32
    assert_close(y, 2.0 * x.double().numpy() @ w.double().numpy(), atol=1e-6, rtol=1e-6)
    assert ev.ops_run_by_ort == ()  # an override, not missing="ort"


def _two_missing_ops_model() -> onnx.ModelProto:
    """FusedMatMul in the main graph, BiasGelu inside an If branch (com.microsoft contrib ops: onnxruntime
    runs them, the evaluator has no kernel for them), Relu in the other branch."""
    then = oh.make_graph([oh.make_node("BiasGelu", ["t", "bias"], ["g"], domain="com.microsoft", name="bias_gelu")], "then", [], [vi("g", TP.FLOAT, [2, 4])])
    other = oh.make_graph([oh.make_node("Relu", ["t"], ["r"], name="relu")], "else", [], [vi("r", TP.FLOAT, [2, 4])])
    nodes = [
        oh.make_node("FusedMatMul", ["x", "w"], ["t"], domain="com.microsoft", alpha=2.0, name="fmm"),
        oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch"),
    ]
    inputs = [vi("x", TP.FLOAT, [2, 3]), vi("w", TP.FLOAT, [3, 4]), vi("bias", TP.FLOAT, [4]), vi("c", TP.BOOL, [])]
    return make_model(nodes, inputs, [vi("y", TP.FLOAT, [2, 4])], {"": 18, "com.microsoft": 1})


def _two_missing_feeds(c: bool) -> dict[str, torch.Tensor]:
    return {"x": torch.linspace(-1, 1, 6).reshape(2, 3), "w": torch.linspace(-2, 2, 12).reshape(3, 4), "bias": torch.tensor([0.5, -0.5, 1.0, 0.0]), "c": torch.tensor(c)}


def test_missing_kernels_are_all_named_with_the_one_dict_that_runs_the_model() -> None:
    with pytest.raises(MissingKernelError) as info:
        TorchEvaluator(_two_missing_ops_model())
    msg = str(info.value)
    assert info.value.ops == ("com.microsoft::BiasGelu", "com.microsoft::FusedMatMul")  # the one in the If branch too
    assert msg.startswith("no torch kernel for com.microsoft::BiasGelu (opset 1), com.microsoft::FusedMatMul (opset 1); run them on onnxruntime: ")
    hint = re.search(r"TorchEvaluator\(model, kernels=(\{.*?\})\)", msg)
    assert hint is not None
    assert hint.group(1) == '{("com.microsoft", "BiasGelu"): "ort", ("com.microsoft", "FusedMatMul"): "ort"}'
    # the suggested dict, taken from the message as written, runs the model as onnxruntime does
    ev = TorchEvaluator(_two_missing_ops_model(), kernels=eval(hint.group(1)))
    for c in (True, False):
        feeds = _two_missing_feeds(c)
        (y,) = ev.run(None, feeds)
        (expected,) = OrtRunner(_two_missing_ops_model()).run(None, feeds)
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    # the exception keeps its ops across pickling (pytest-xdist workers)
    import pickle

    assert pickle.loads(pickle.dumps(info.value)).ops == info.value.ops


def test_missing_ort_runs_every_op_without_a_kernel_on_onnxruntime_and_names_them() -> None:
    ev = TorchEvaluator(_two_missing_ops_model(), missing="ort")
    assert ev.ops_run_by_ort == ("com.microsoft::BiasGelu", "com.microsoft::FusedMatMul")
    values = ev.run(None, _two_missing_feeds(True), intermediates=True)
    (expected,) = OrtRunner(_two_missing_ops_model()).run(None, _two_missing_feeds(True))
    torch.testing.assert_close(values["y"], expected, rtol=1e-5, atol=1e-6)
    assert "g" in values  # the If branch's value, computed by onnxruntime inside the torch evaluator
    assert TorchEvaluator(_hardmax_model(), missing="ort").ops_run_by_ort in ((), ("Hardmax",))
    assert TorchEvaluator(models.layer_norm_matmul_add(dtype="float32"), missing="ort").ops_run_by_ort == ()


def test_missing_must_be_error_or_ort() -> None:
    with pytest.raises(ValueError, match=r"missing='skip' is not valid; use 'error' \(name the ops without a torch kernel\) or 'ort' \(run them on onnxruntime\)"):
        TorchEvaluator(_fused_matmul_model(), missing="skip")  # type: ignore[arg-type]


def test_kernel_failing_at_run_time_names_node_op_and_shapes(m16: onnx.ModelProto, f16: dict) -> None:
    # symbolic c is 16 in X but 8 in weights: MatMul cannot multiply them
    feeds = {**f16, "weights": torch.zeros(8, 8, dtype=torch.float16)}
    with pytest.raises(RuntimeError, match=re.escape("torch kernel MatMul failed on node 'matmul' (MatMul) with inputs norm: float16[2, 8, 16], weights: float16[8, 8]: ")) as info:
        TorchEvaluator(m16).run(None, feeds)
    assert info.value.__cause__ is not None


def test_callable_kernel_failing_at_run_time(m32: onnx.ModelProto, f32: dict) -> None:
    def broken(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise ValueError("my kernel is broken")

    with pytest.raises(RuntimeError, match=r"failed on node 'add' \(Add\) with inputs mm: float32\[2, 8, 16\], bias2: float32\[16\]: my kernel is broken"):
        TorchEvaluator(m32, kernels={"add": broken}).run(None, f32)


# -- kernel overrides ------------------------------------------------------------------------------------


def _ort_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    model = make_model([oh.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", TP.FLOAT, ["p", "q", "r"]), vi("b", TP.FLOAT, ["r", "s"])], [vi("y", TP.FLOAT, ["p", "q", "s"])])
    return OrtRunner(model).run(None, {"a": a, "b": b})[0]


@pytest.mark.parametrize("key", [("", "MatMul"), "MatMul", "matmul"])
def test_ort_override_gives_onnxruntime_matmul(m32: onnx.ModelProto, f32: dict, key: object) -> None:
    values = TorchEvaluator(m32, kernels={key: "ort"}).run(None, f32, intermediates=True)
    expected = _ort_matmul(values["norm"], f32["weights"])
    assert values["mm"].dtype == torch.float32
    assert torch.equal(values["mm"], expected)
    assert torch.equal(values["Z"], values["mm"] + f32["bias2"])


def test_node_name_wins_over_op_type(m32: onnx.ModelProto, f32: dict) -> None:
    kernels = {("", "MatMul"): lambda a, b: torch.zeros_like(a), "matmul": lambda a, b: 2 * (a @ b)}
    values = TorchEvaluator(m32, kernels=kernels).run(None, f32, intermediates=True)
    assert torch.equal(values["mm"], 2 * (values["norm"] @ f32["weights"]))


def test_op_type_wins_over_predicate(m32: onnx.ModelProto, f32: dict) -> None:
    kernels = {(lambda node: node.op_type == "Add"): (lambda a, b: a * 0), ("", "Add"): (lambda a, b: a - b)}
    values = TorchEvaluator(m32, kernels=kernels).run(None, f32, intermediates=True)
    assert torch.equal(values["Z"], values["mm"] - f32["bias2"])


def test_predicate_key(m32: onnx.ModelProto, f32: dict) -> None:
    seen: list[str] = []

    def is_add(node: onnx.NodeProto) -> bool:
        seen.append(node.name)
        return node.op_type == "Add"

    values = TorchEvaluator(m32, kernels={is_add: lambda a, b: a - b}).run(None, f32, intermediates=True)
    assert torch.equal(values["Z"], values["mm"] - f32["bias2"])
    assert set(seen) == {"layer_norm", "matmul", "add"}
    (plain,) = TorchEvaluator(m32).run(None, f32)
    assert torch.equal(values["mm"] + f32["bias2"], plain)


@pytest.mark.parametrize("wrap", [lambda y: y, lambda y: (y,), lambda y: [y]], ids=["tensor", "tuple", "list"])
def test_callable_layer_norm_with_wrong_epsilon(m32: onnx.ModelProto, f32: dict, wrap: object) -> None:
    def layer_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> object:
        return wrap(F.layer_norm(x, (x.shape[-1],), scale, bias, eps=50.0))  # type: ignore[operator]

    values = TorchEvaluator(m32, kernels={("", "LayerNormalization"): layer_norm}).run(None, f32, intermediates=True)
    (plain,) = TorchEvaluator(m32).run(None, f32)
    expected = lnmma_numpy(f32, eps=50.0)
    assert_close(values["norm"], expected["norm"], atol=1e-5, rtol=1e-5)
    assert_close(values["Z"], expected["Z"], atol=1e-4, rtol=1e-4)
    assert compare(plain, values["Z"]).max_abs > 1e-2  # the wrong epsilon shows


@pytest.mark.parametrize("compute_dtype", [None, "float64"])
def test_float64_override_computes_wide_and_casts_back(m16: onnx.ModelProto, f16: dict, compute_dtype: str | None) -> None:
    values = TorchEvaluator(m16, kernels={"matmul": "float64"}, compute_dtype=compute_dtype).run(None, f16, intermediates=True)
    wide = values["norm"].double() @ f16["weights"].double()
    if compute_dtype is None:
        assert values["mm"].dtype == torch.float16  # the declared dtype
        assert values["norm"].dtype == torch.float16  # other nodes untouched
        assert torch.equal(values["mm"], wide.half())
        # float16 rounding of the float64 product: within half an ULP of numpy's product
        truth = values["norm"].double().numpy() @ f16["weights"].double().numpy()
        assert compare(torch.from_numpy(truth).half(), values["mm"]).max_ulp <= 1
    else:
        assert values["mm"].dtype == torch.float64  # oracle mode keeps float64
        assert torch.equal(values["mm"], wide)


def test_ort_override_of_layer_norm_in_the_seed_graph(m16: onnx.ModelProto, f16: dict) -> None:
    values = TorchEvaluator(m16, kernels={("", "LayerNormalization"): "ort"}).run(None, f16, intermediates=True)
    assert values["norm"].dtype == torch.float16
    assert tuple(values["norm"].shape) == (2, 8, 16)
    assert_close(values["norm"], lnmma_numpy(f16)["norm"], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("outputs", [["Y", "mean", "inv"], ["Y", "", "inv"], ["Y", "mean"]], ids=["all", "no-mean", "no-inv"])
@pytest.mark.parametrize("kernels", [None, {("", "LayerNormalization"): "ort"}], ids=["torch", "ort"])
def test_layer_norm_optional_outputs(outputs: list[str], kernels: dict | None) -> None:
    shapes = {"Y": ["a", "c"], "mean": ["a", 1], "inv": ["a", 1]}
    node = oh.make_node("LayerNormalization", ["X", "s", "b"], outputs, axis=-1, epsilon=1e-5, name="ln")
    model = make_model(
        [node],
        [vi("X", TP.FLOAT, ["a", "c"]), vi("s", TP.FLOAT, ["c"]), vi("b", TP.FLOAT, ["c"])],
        [vi(o, TP.FLOAT, shapes[o]) for o in outputs if o],
    )
    gen = torch.Generator().manual_seed(0)
    feeds = {"X": torch.randn(3, 8, generator=gen) * 10, "s": torch.rand(8, generator=gen), "b": torch.rand(8, generator=gen)}
    got = TorchEvaluator(model, kernels=kernels).run(None, feeds)
    ref = ReferenceEvaluator(model).run(None, {k: v.numpy() for k, v in feeds.items()})
    assert [tuple(t.shape) for t in got] == [r.shape for r in ref]
    assert [t.dtype for t in got] == [torch.float32] * len(ref)
    for t, r in zip(got, ref, strict=True):
        assert_close(t, r.astype(np.float64), atol=1e-5, rtol=1e-5)
    x = feeds["X"].double().numpy()
    inv = 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    by_name = dict(zip([o for o in outputs if o], got, strict=True))
    if "inv" in by_name:
        assert_close(by_name["inv"], inv, atol=1e-6, rtol=1e-5)
    if "mean" in by_name:
        assert_close(by_name["mean"], x.mean(-1, keepdims=True), atol=1e-5, rtol=1e-5)


# -- invalid overrides ---------------------------------------------------------------------------------------


def test_invalid_key_type(m32: onnx.ModelProto) -> None:
    with pytest.raises(TypeError, match=re.escape('kernels key 123 is not valid; keys: an op type ("", "LayerNormalization"), a node name, or a predicate')):
        TorchEvaluator(m32, kernels={123: "ort"})


def test_invalid_op_type_tuple(m32: onnx.ModelProto) -> None:
    with pytest.raises(TypeError, match=re.escape("kernels key ('', 'MatMul', 13): an op type is a (domain, op_type) pair such as ('', 'MatMul')")):
        TorchEvaluator(m32, kernels={("", "MatMul", 13): "ort"})


def test_key_naming_nothing_lists_node_names(m32: onnx.ModelProto) -> None:
    with pytest.raises(KeyError, match=re.escape("kernels key 'matmull' names no node and no op type of this model; node names: ['add', 'layer_norm', 'matmul']")):
        TorchEvaluator(m32, kernels={"matmull": "ort"})


def test_invalid_value_lists_valid_values(m32: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=re.escape("kernels['matmul'] = 'cuda' is not valid; ") + r".*values: \"torch\", \"ort\", \"float64\", \"float32\", \"float16\", \"bfloat16\", a Kernel subclass or a callable"):
        TorchEvaluator(m32, kernels={"matmul": "cuda"})


def test_torch_value_is_the_registry_kernel(m32: onnx.ModelProto, f32: dict) -> None:
    (a,) = TorchEvaluator(m32, kernels={"matmul": "torch"}).run(None, f32)
    (b,) = TorchEvaluator(m32).run(None, f32)
    assert torch.equal(a, b)


def test_ort_override_in_the_float64_oracle_falls_back_to_float32_where_onnxruntime_has_no_float64_kernel() -> None:
    """onnxruntime's CPU Hardmax has no float64 kernel: in the oracle, kernels={"hm": "ort"} runs that
    node in float32 (inputs cast down, outputs cast back up) instead of failing."""
    x = torch.tensor([[0.1, 3.0, -1.0], [2.0, 2.5, 0.0]])
    ev = TorchEvaluator(_hardmax_model(), kernels={"hm": "ort"}, compute_dtype=torch.float64)
    (y,) = ev.run(None, {"x": x})
    assert y.dtype == torch.float64
    assert torch.equal(y, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64))


# -- shape-specialised plans -----------------------------------------------------------------------


class _TinyAttention(torch.nn.Module):
    """Dynamo's shape arithmetic in a few nodes: sizes read from the input (Shape, Gather), positions from
    Range, a causal mask from Trilu of a full tensor, view/reshape targets built by Concat."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        h = self.emb(ids) + torch.arange(s, dtype=torch.float32)[None, :, None]
        mask = torch.full((s, s), -1e9).triu(1)[None, None]
        q = self.proj(h).view(b, s, 2, 4).transpose(1, 2)
        w = (q @ q.transpose(-1, -2) + mask).softmax(-1)
        return (w @ q).transpose(1, 2).reshape(b, s, -1)


@pytest.fixture(scope="module")
def dynamo_dynamic() -> onnx.ModelProto:
    """_TinyAttention exported by the dynamo exporter with batch and sequence dynamic (seconds: once)."""
    import contextlib
    import io
    import warnings

    from real_models import _torchlib_registry_built_once

    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=64)}
    with warnings.catch_warnings(), _torchlib_registry_built_once(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the exporter's own deprecations
        program = torch.onnx.export(_TinyAttention().eval(), (torch.randint(0, 50, (2, 5)),), dynamo=True, dynamic_shapes={"ids": dims}, verbose=False)
    assert program is not None
    return program.model_proto


def _plain(model: onnx.ModelProto) -> TorchEvaluator:
    """An evaluator that folds nothing: every node has an override (the registry's own kernel)."""
    return TorchEvaluator(model, kernels={lambda node: True: "torch"})


def test_shape_specialised_plan_is_bit_identical_at_every_shape_signature(dynamo_dynamic: onnx.ModelProto) -> None:
    ev, plain = TorchEvaluator(dynamo_dynamic), _plain(dynamo_dynamic)
    name = dynamo_dynamic.graph.input[0].name
    for shape in [(2, 5), (3, 9), (2, 5), (3, 9)]:  # each signature recorded, then reused
        feeds = {name: torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(shape[1]))}
        for _ in range(2):
            (y,) = ev.run(None, feeds)
            assert y.shape == (*shape, 8) and torch.equal(y, plain.run(None, feeds)[0])
            got, want = ev.run(None, feeds, intermediates=True), plain.run(None, feeds, intermediates=True)
            assert got.keys() == want.keys()
            assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    shaped = ev._shaped[(tuple(ev.output_names), False)]
    assert shaped is not None and len(shaped.by_signature) == 2
    folded = {ev.nodes[i].op_type for i in shaped.folded}
    assert {"Shape", "Range", "Trilu", "Concat"} <= folded  # the shape arithmetic and the mask did fold


def test_specialise_false_runs_the_plain_plan_records_nothing_and_gives_the_same_bits(dynamo_dynamic: onnx.ModelProto) -> None:
    ev, plain = TorchEvaluator(dynamo_dynamic), _plain(dynamo_dynamic)
    name = dynamo_dynamic.graph.input[0].name
    feeds = {name: torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))}
    (y,) = ev.run(None, feeds, specialise=False)
    got = ev.run(None, feeds, intermediates=True, specialise=False)
    assert not ev._shaped  # no signature recorded, for either output set
    want = plain.run(None, feeds, intermediates=True)
    assert torch.equal(y, plain.run(None, feeds)[0]) and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)


def _view_model() -> onnx.ModelProto:
    """Y = Reshape(X, Concat(Unsqueeze(Gather(Shape(X), 0)), [-1])): X flattened to [rows, -1]."""
    i64 = oh.make_tensor("zero", TP.INT64, [], [0])
    axes = oh.make_tensor("axes", TP.INT64, [1], [0])
    rest = oh.make_tensor("rest", TP.INT64, [1], [-1])
    graph = oh.make_graph(
        [
            oh.make_node("Shape", ["X"], ["shape"], name="shape"),
            oh.make_node("Gather", ["shape", "zero"], ["rows"], name="rows"),
            oh.make_node("Unsqueeze", ["rows", "axes"], ["rows1"], name="unsqueeze"),
            oh.make_node("Concat", ["rows1", "rest"], ["target"], name="concat", axis=0),
            oh.make_node("Reshape", ["X", "target"], ["Y"], name="reshape"),
        ],
        "g",
        [vi("X", TP.FLOAT, ["n", "m", 3])],
        [vi("Y", TP.FLOAT, ["n", None])],
        [i64, axes, rest],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


def test_an_override_on_a_foldable_node_runs_every_time() -> None:
    calls = []

    def rows_times_two(shape: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return shape[index] * 2

    ev = TorchEvaluator(_view_model(), kernels={"rows": rows_times_two})
    x = torch.zeros(3, 4, 3)
    for _ in range(3):
        (y,) = ev.run(None, {"X": x})
        assert y.shape == (6, 6)
    assert len(calls) == 3
    assert all(ev.nodes[i].name != "rows" for s in ev._shaped.values() if s for i in s.folded)


def test_a_feed_shape_change_replans() -> None:
    ev = TorchEvaluator(_view_model())
    for shape in [(2, 4, 3), (5, 1, 3), (2, 4, 3), (1, 2, 3)]:
        x = torch.randn(shape)
        (y,) = ev.run(None, {"X": x})
        assert torch.equal(y, x.reshape(shape[0], -1))
        inter = ev.run(None, {"X": x}, intermediates=True)
        assert inter["target"].tolist() == [shape[0], -1]
    assert len(ev._shaped[(("Y",), False)].by_signature) == 3  # type: ignore[union-attr]


def test_a_shape_that_depends_on_data_is_guarded() -> None:
    """Shape(NonZero(X)) changes with X's values at one feed shape: the specialised plan's guard sees it
    and the run falls back to the plain plan, so the answer is never the first run's."""
    graph = oh.make_graph(
        [
            oh.make_node("NonZero", ["X"], ["nz"]),
            oh.make_node("Shape", ["nz"], ["nz_shape"]),
            oh.make_node("ConstantOfShape", ["nz_shape"], ["ones"], value=oh.make_tensor("v", TP.FLOAT, [1], [1.0])),
            oh.make_node("ReduceSum", ["ones"], ["Y"], keepdims=0),
        ],
        "g",
        [vi("X", TP.FLOAT, [4])],
        [vi("Y", TP.FLOAT, [])],
    )
    ev = TorchEvaluator(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9))
    for x, count in [([1, 0, 2, 0], 2), ([1, 0, 2, 0], 2), ([1, 1, 1, 0], 3), ([0, 0, 0, 5], 1), ([1, 0, 2, 0], 2)]:
        (y,) = ev.run(None, {"X": torch.tensor(x, dtype=torch.float32)})
        assert y.item() == count


def test_observe_streams_every_node_and_frees_values() -> None:
    """run(observe=f) sees each node's outputs in execution order, returns the same outputs as a plain run,
    and holds only the live values: a value is gone once no later node reads it."""
    from pytest_ortdiff import models

    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 2, "b": 8, "c": 16}, seed=0)
    ev = TorchEvaluator(model)
    seen: list[tuple[str, tuple[str, ...]]] = []
    out = ev.run(None, feeds, observe=lambda node, outs: seen.append((node.op_type, tuple(outs))))
    assert [op for op, _ in seen] == ["LayerNormalization", "MatMul", "Add"]
    assert torch.equal(out[0], ev.run(None, feeds)[0])
    with pytest.raises(ValueError, match="pick one"):
        ev.run(None, feeds, intermediates=True, observe=lambda node, outs: None)


def test_observe_holds_only_live_values() -> None:
    """On a chain, when node i is observed, of the earlier values only its input is still alive: each value
    is freed once no later node reads it (weak references tell)."""
    import weakref

    import onnx.helper as oh

    n = 40
    nodes = [oh.make_node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info("v0", onnx.TensorProto.FLOAT, [4])], [oh.make_tensor_value_info(f"v{n}", onnx.TensorProto.FLOAT, [4])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    ev = TorchEvaluator(model)
    refs: list[weakref.ref[torch.Tensor]] = []
    alive: list[int] = []

    def observe(node: onnx.NodeProto, outs: dict[str, torch.Tensor]) -> None:
        alive.append(sum(r() is not None for r in refs))
        refs.extend(weakref.ref(v) for v in outs.values())

    ev.run(None, {"v0": np.ones(4, np.float32)}, observe=observe)
    assert len(alive) == n
    assert max(alive) <= 1, alive


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_compute_override_matches_a_converted_node(dtype: str) -> None:
    """kernels={node: "float16"} computes that node as a float16 conversion would (inputs rounded to the
    half type, the kernel in it), its output cast back: equal to running the node on half inputs."""
    import onnx.helper as oh

    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm"), oh.make_node("Exp", ["y"], ["z"], name="exp")],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5]), oh.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [5, 4])],
        [oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [3, 4])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 5), dtype=np.float32), rng.standard_normal((5, 4), dtype=np.float32)
    half = getattr(torch, dtype)
    got = TorchEvaluator(model, kernels={"mm": dtype}).run(None, {"x": x, "w": w})[0]
    want = torch.exp((torch.from_numpy(x).to(half) @ torch.from_numpy(w).to(half)).float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- faster runs: kernels called directly, shapes needing no guard, runs below autograd -------------------


def _kernel(op: str, inputs: list[str], attrs: dict, opset: int = 20) -> Any:
    from pytest_ortdiff.runtimes.kernels.base import KernelContext, lookup

    cls = lookup("", op, opset)
    assert cls is not None
    return cls(oh.make_node(op, inputs, ["y"], **attrs), KernelContext(torch.device("cpu"), opset))


def _i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


_X = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5) / 7 - 8
_DIRECT_CASES = [  # (op, attrs, inputs, the positions a plan holds fixed)
    ("Reshape", {}, [_X, _i64(6, -1)], {1}),
    ("Reshape", {}, [_X, _i64(0, 3, 0, -1)], {1}),  # 0 copies the input's dim
    ("Reshape", {"allowzero": 1}, [torch.zeros(0, 3), _i64(3, 0)], {1}),
    ("Reshape", {}, [_X.transpose(1, 3), _i64(2, -1)], {1}),  # not viewable: a copy
    ("Unsqueeze", {}, [_X, _i64(0, -1)], {1}),
    ("Unsqueeze", {}, [_X, _i64(4, 1)], {1}),
    ("Squeeze", {}, [_X[:, :1], _i64(1)], {1}),
    ("Slice", {}, [_X, _i64(1), _i64(100), _i64(-1), _i64(1)], {1, 2, 3, 4}),
    ("Slice", {}, [_X, _i64(-3), _i64(-1), _i64(2), _i64(1)], {1, 2, 3, 4}),
    ("Slice", {}, [_X, _i64(3, 0), _i64(0, 2), _i64(3, 1), _i64(-2, 1)], {1, 2, 3, 4}),  # a negative step
    ("Slice", {}, [_X, _i64(0, 1), _i64(1, 3)], {1, 2}),  # axes and steps omitted
    ("Expand", {}, [_X[:, :1], _i64(3, 1, 1, 1, 1)], {1}),
    ("Tile", {}, [_X, _i64(1, 2, 1, 2)], {1}),
    ("ReduceMean", {"keepdims": 0}, [_X, _i64(-1, 1)], {1}),
    ("ReduceSum", {}, [_X, _i64(2)], {1}),
    ("Transpose", {"perm": [0, 2, 3, 1]}, [_X], set()),
    ("Softmax", {"axis": 1}, [_X], set()),
    ("Gelu", {"approximate": "tanh"}, [_X], set()),
    ("Add", {}, [_X, _X[0]], {1}),  # a fixed input it does not build in: it takes both
    ("MatMul", {}, [_X, _X.transpose(-1, -2)], set()),
    ("Sqrt", {}, [_X.abs()], set()),
    ("Gemm", {}, [_X[0, 0], _X[1, 1].T], {1}),  # no C: torch.mm
    ("Gemm", {}, [_X[0, 0], _X[1, 1].T, _X[0, 1, 0, :4]], {1, 2}),  # C, beta = alpha = 1: torch.addmm
    ("Gemm", {}, [_X[0, 0].long(), _X[1, 1].T.long(), _X[0, 1, 0, :4].long()], {2}),  # integers too
    ("Where", {}, [_X > 0, _X, torch.tensor(-1.0)], {0, 2}),
    ("LayerNormalization", {"epsilon": 1e-3}, [_X, _X[0, 0, 0] / 9, _X[1, 1, 1] / 9], {1, 2}),
    ("LayerNormalization", {"axis": 2}, [_X, _X[0, 0] / 9], {1}),
]


@pytest.mark.parametrize(("op", "attrs", "inputs", "fixed"), _DIRECT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(_DIRECT_CASES)])
def test_a_kernels_direct_call_is_its_run(op: str, attrs: dict, inputs: list[torch.Tensor], fixed: set[int]) -> None:
    """`direct(static)` returns `run(...)[0]` bit for bit, with its strides (a later reduction's order
    follows them): what the evaluator calls instead of `run`, built for the inputs a plan holds fixed."""
    k = _kernel(op, [f"i{j}" for j in range(len(inputs))], attrs)
    (want,) = k.run(*inputs)
    fn = k.direct({j: inputs[j] for j in fixed})
    args = [x for j, x in enumerate(inputs) if j not in fixed]
    if fn is None:  # builds none of them in: then it takes every input
        fn, args = k.direct({}), inputs
    got = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


def test_a_direct_call_that_raises_falls_back_to_run() -> None:
    """uint32 Add: torch.add refuses uint32, the evaluator's direct call raises, the kernel's run (int64
    arithmetic) answers, as numpy's wrapping uint32 add does."""
    a, b = np.array([1, 2**32 - 1, 7], np.uint32), np.array([2, 3, 2**31], np.uint32)
    model = make_model([oh.make_node("Add", ["a", "b"], ["y"])], [vi("a", TP.UINT32, [3]), vi("b", TP.UINT32, [3])], [vi("y", TP.UINT32, [3])])
    (y,) = TorchEvaluator(model).run(None, {"a": a, "b": b})
    assert y.dtype == torch.uint32 and y.to(torch.int64).tolist() == (a + b).tolist()


def test_direct_and_shape_specialised_runs_equal_the_kernels_own_runs(dynamo_dynamic: onnx.ModelProto) -> None:
    """A run with `observe=` calls every kernel's own `run` on the plain plan; a plain run calls their
    direct callables on the shape-specialised plan: the same bits."""
    ev = TorchEvaluator(dynamo_dynamic)
    name = dynamo_dynamic.graph.input[0].name
    for shape in [(2, 5), (3, 9), (2, 5)]:
        feeds = {name: torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(shape[1]))}
        (fast,) = ev.run(None, feeds)
        (slow,) = ev.run(None, feeds, observe=lambda node, outs: None)
        assert torch.equal(fast, slow)


def test_a_shape_of_a_computed_value_needs_no_guard() -> None:
    """Shape(MatMul(X, W)) (TorchScript's exports read shapes of intermediates): a MatMul's shape follows
    from its inputs' shapes, so the Shape folds without a guard; NonZero's output keeps one."""
    w = oh.make_tensor("W", TP.FLOAT, [3, 4], np.linspace(-1, 1, 12, dtype=np.float32))
    nodes = [
        oh.make_node("MatMul", ["X", "W"], ["h"]),
        oh.make_node("Shape", ["h"], ["s"]),
        oh.make_node("Reshape", ["h", "s"], ["Y"]),
        oh.make_node("NonZero", ["X"], ["nz"]),
        oh.make_node("Shape", ["nz"], ["Z"]),
    ]
    graph = oh.make_graph(nodes, "g", [vi("X", TP.FLOAT, ["n", 3])], [vi("Y", TP.FLOAT, ["n", 4]), vi("Z", TP.INT64, [2])], [w])
    ev = TorchEvaluator(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9))
    assert [ev.nodes[i].input[0] for i in sorted(ev._guarded_sources)] == ["nz"]
    for x in (torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([[1.0, 3.0, 2.0]]), torch.zeros(2, 3)):
        y, z = ev.run(None, {"X": x})
        assert torch.equal(y, x @ torch.from_numpy(onnx.numpy_helper.to_array(w))) and z.tolist() == [2, int((x != 0).sum())]


def test_runs_below_autograd_give_ordinary_tensors_and_gradients_still_flow() -> None:
    """A run dispatches below torch's autograd layers: its outputs are ordinary tensors (not inference
    tensors), usable in autograd and in place; a feed that requires grad keeps the graph (dY/dX of
    Y = X @ W is W's row sums)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = make_model([oh.make_node("MatMul", ["X", "W"], ["Y"])], [vi("X", TP.FLOAT, [1, 2]), vi("W", TP.FLOAT, [2, 3])], [vi("Y", TP.FLOAT, [1, 3])])
    ev = TorchEvaluator(model)
    (y,) = ev.run(None, {"X": torch.ones(1, 2), "W": w})
    assert not torch.is_inference(y) and not y.requires_grad
    scale = torch.tensor(2.0, requires_grad=True)
    (y * scale).sum().backward()
    assert scale.grad is not None and scale.grad.item() == float(w.sum())
    y.add_(1)  # in place, outside any mode
    x = torch.ones(1, 2, requires_grad=True)
    (y2,) = ev.run(None, {"X": x, "W": w})
    y2.sum().backward()
    assert x.grad is not None and x.grad.tolist() == [w.sum(axis=1).tolist()]


def test_gather_on_axis_0_wraps_negative_indices() -> None:
    """Gather's axis-0 paths (index_select, indexing where an index is negative): negative and int32
    indices, against numpy's take."""
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    idx = np.array([[0, -1], [5, -6]], dtype=np.int32)
    model = make_model([oh.make_node("Gather", ["d", "i"], ["y"], axis=0)], [vi("d", TP.FLOAT, [6, 4]), vi("i", TP.INT32, [2, 2])], [vi("y", TP.FLOAT, [2, 2, 4])])
    (y,) = TorchEvaluator(model).run(None, {"d": data, "i": idx})
    np.testing.assert_array_equal(y.numpy(), np.take(data, idx, axis=0))
    ahead = np.array([[0, 3], [5, 2]], dtype=np.int32)  # no negative index: index_select's copy of the rows
    (y,) = TorchEvaluator(model).run(None, {"d": data, "i": ahead})
    assert y.is_contiguous() and y.shape == (2, 2, 4)
    np.testing.assert_array_equal(y.numpy(), np.take(data, ahead, axis=0))
    with pytest.raises(RuntimeError, match=r"out of bounds|out of range"):
        TorchEvaluator(model).run(None, {"d": data, "i": np.array([[6, 0], [0, 0]], dtype=np.int32)})


def test_observe_keeps_an_initializer_a_direct_kernel_built_in_until_its_kernel_reads_it() -> None:
    """Identity(w) then LayerNormalization(x, w, b): the plan's direct LayerNorm has w and b built in, so the
    plan frees w after the Identity; an observed run calls LayerNorm's own run, which reads w (the
    TorchScript ViT export's norm1.weight failed so)."""
    TP = onnx.TensorProto
    w = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "w")
    b = onnx.numpy_helper.from_array(np.linspace(-0.1, 0.1, 8, dtype=np.float32), "b")
    nodes = [oh.make_node("Identity", ["w"], ["w_copy"], name="copy"), oh.make_node("LayerNormalization", ["x", "w", "b"], ["y"], name="ln", axis=-1)]
    graph = oh.make_graph(nodes, "g", [vi("x", TP.FLOAT, [3, 8])], [vi("w_copy", TP.FLOAT, [8]), vi("y", TP.FLOAT, [3, 8])], [w, b])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    ev = TorchEvaluator(model)
    seen: dict[str, torch.Tensor] = {}
    observed = ev.run(None, {"x": x}, observe=lambda node, outs: seen.update(outs))
    plain = ev.run(None, {"x": x})
    assert set(seen) == {"w_copy", "y"} and all(torch.equal(a, b_) for a, b_ in zip(observed, plain, strict=True))
    assert torch.equal(plain[1], F.layer_norm(x, (8,), torch.tensor(onnx.numpy_helper.to_array(w)), torch.tensor(onnx.numpy_helper.to_array(b))))
