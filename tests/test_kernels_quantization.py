"""Quantization kernels (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul)
and float8 / 2-4-bit casts against onnx.reference and onnxruntime, plus a model quantized by onnxruntime."""

from __future__ import annotations

import io
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from kernel_harness import check_node, one_node_model, run_ort, run_reference, run_torch
from onnx import TensorProto, helper

from pytest_ortdiff.runtimes.kernels import KernelContext, UnsupportedVariantError, lookup
from pytest_ortdiff.runtimes.kernels.quantization import INT4, UINT4, dequantize, quantize, storage
from pytest_ortdiff.runtimes.kernels.tensor.cast import cast

CPU = torch.device("cpu")
RNG = np.random.default_rng(0)
# values whose x / scale lands on ties (2.5, -2.5, 0.5, -1.5), far beyond both ends, and in between
X = np.array([[2.5, -2.5, 0.5, -1.5, 1000.0, -1000.0], [0.26, -0.74, 3.49, 7.5, -8.5, 0.0]], np.float32)


def _kernel_run(op: str, opset: int, inputs: list[torch.Tensor | None], **attrs: object) -> tuple[torch.Tensor, ...]:
    names = [f"i{k}" if t is not None else "" for k, t in enumerate(inputs)]
    node = helper.make_node(op, names, ["y"], **attrs)
    cls = lookup("", op, opset)
    assert cls is not None
    return cls(node, KernelContext(device=CPU, opset=opset)).run(*inputs)


def _same(got: torch.Tensor, expected: np.ndarray) -> None:
    """Values equal (NaN at the same places); 2/4-bit tensors compared through their byte storage."""
    g = storage(got).to(torch.float64).numpy() if got.dtype in (INT4, UINT4) or not got.is_floating_point() else got.to(torch.float64).numpy()
    np.testing.assert_array_equal(g, np.asarray(expected).astype(np.float64))


# -- QuantizeLinear / DequantizeLinear through the evaluator: integer targets, every layout ----------------


@pytest.mark.parametrize(
    ("zp_type", "scale", "zp", "attrs"),
    [
        (np.uint8, np.float32(0.5), np.uint8(128), {}),  # per tensor
        (np.int8, np.array([1.0, 0.5], np.float32), np.array([0, -3], np.int8), {"axis": 0}),  # per axis
        (np.int16, np.array([[1.0, 0.25, 2.0], [0.5, 1.0, 4.0]], np.float32), np.full((2, 3), 7, np.int16), {"axis": 1, "block_size": 2}),
        (np.uint16, np.float32(0.01), np.uint16(30000), {}),
    ],
    ids=["uint8-tensor", "int8-axis", "int16-blocked", "uint16-saturated"],
)
def test_quantize_dequantize_integer_targets(zp_type: type, scale: np.ndarray, zp: np.ndarray, attrs: dict[str, int]) -> None:
    q = one_node_model("QuantizeLinear", {"x": X}, ["y"], 21, initializers={"s": scale, "zp": np.asarray(zp, zp_type)}, **attrs)
    check_node(q, {"x": X})
    qx = run_reference(q, {"x": X})[0]
    if zp_type == np.uint8:  # ties round half to even, both ends saturate
        np.testing.assert_array_equal(run_torch(q, {"x": X})[0][0], [133, 123, 129, 125, 255, 0])
    dq = one_node_model("DequantizeLinear", {"q": qx}, ["y"], 21, initializers={"s": scale, "zp": np.asarray(zp, zp_type)}, **attrs)
    check_node(dq, {"q": qx})


def test_float16_scale_and_oracle() -> None:
    scale = np.array([0.3, 0.7], np.float16)
    x16 = X.astype(np.float16)
    q = one_node_model("QuantizeLinear", {"x": x16}, ["y"], 19, initializers={"s": scale, "zp": np.array([3, 250], np.uint8)}, axis=0)
    np.testing.assert_array_equal(run_torch(q, {"x": x16})[0], run_reference(q, {"x": x16})[0])
    np.testing.assert_array_equal(run_torch(q, {"x": x16})[0], run_ort(q, {"x": x16})[0])
    qx = run_reference(q, {"x": x16})[0]
    dq = one_node_model("DequantizeLinear", {"q": qx}, ["y"], 19, initializers={"s": scale, "zp": np.array([3, 250], np.uint8)}, axis=0)
    np.testing.assert_array_equal(run_torch(dq, {"q": qx})[0], run_reference(dq, {"q": qx})[0])
    np.testing.assert_array_equal(run_torch(dq, {"q": qx})[0], run_ort(dq, {"q": qx})[0])
    oracle = run_torch(dq, {"q": qx}, compute_dtype=torch.float64)[0]
    assert oracle.dtype == np.float64
    np.testing.assert_allclose(oracle, (qx.astype(np.float64) - [[3], [250]]) * scale.astype(np.float64)[:, None])


def test_dequantize_output_dtype_23() -> None:
    q = np.array([[1, -128, 127]], np.int8)
    m = one_node_model("DequantizeLinear", {"q": q}, ["y"], 23, initializers={"s": np.float32(0.1)}, output_dtype=TensorProto.FLOAT16)
    got = run_torch(m, {"q": q})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, run_reference(m, {"q": q})[0])


# -- 4-bit and float8 targets: the kernels on torch tensors, against onnx.reference -------------------------


@pytest.mark.parametrize(("onnx_type", "np_type"), [(TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4)])
def test_quantize_4bit_blocked(onnx_type: int, np_type: type) -> None:
    x = RNG.normal(size=(2, 6)).astype(np.float32) * 4
    scale = np.array([[0.5, 1.0, 0.25], [1.0, 0.3, 2.0]], np.float32)
    zp = np.ones((2, 3), np_type)
    q = one_node_model("QuantizeLinear", {"x": x}, ["y"], 21, initializers={"s": scale, "zp": zp}, axis=1, block_size=2)
    expected = run_reference(q, {"x": x})[0]
    zp_t = torch.from_numpy(zp.astype(np.int8 if onnx_type == TensorProto.INT4 else np.uint8)).view(INT4 if onnx_type == TensorProto.INT4 else UINT4)
    (got,) = _kernel_run("QuantizeLinear", 21, [torch.from_numpy(x), torch.from_numpy(scale), zp_t], axis=1, block_size=2)
    assert got.dtype == zp_t.dtype
    _same(got, expected.astype(np.int8))
    back = dequantize(got, torch.from_numpy(scale), zp_t, axis=1, block_size=2)
    dq = one_node_model("DequantizeLinear", {"q": expected}, ["y"], 21, initializers={"s": scale, "zp": zp}, axis=1, block_size=2)
    np.testing.assert_array_equal(back.numpy(), run_reference(dq, {"q": expected})[0])


FLOAT8 = [
    (TensorProto.FLOAT8E4M3FN, torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
    (TensorProto.FLOAT8E4M3FNUZ, torch.float8_e4m3fnuz, ml_dtypes.float8_e4m3fnuz),
    (TensorProto.FLOAT8E5M2, torch.float8_e5m2, ml_dtypes.float8_e5m2),
    (TensorProto.FLOAT8E5M2FNUZ, torch.float8_e5m2fnuz, ml_dtypes.float8_e5m2fnuz),
]
SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e6, -1e6, 448.0, 464.0, 465.0, 57344.0, 61440.0, 0.3, -17.1, 1e-9], np.float32)


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize(("onnx_type", "torch_type", "np_type"), FLOAT8, ids=lambda v: str(v) if isinstance(v, int) else None)
def test_float8_cast_and_quantize(onnx_type: int, torch_type: torch.dtype, np_type: type, saturate: int) -> None:
    x = np.concatenate([SPECIAL, RNG.normal(size=64).astype(np.float32) * 100])
    m = one_node_model("Cast", {"x": x}, ["y"], 19, to=onnx_type, saturate=saturate)
    expected = run_reference(m, {"x": x})[0].astype(np.float32)
    (got,) = _kernel_run("Cast", 19, [torch.from_numpy(x)], to=onnx_type, saturate=saturate)
    assert got.dtype == torch_type
    _same(got, expected)
    # and back: every float8 value is a float32
    (back,) = _kernel_run("Cast", 19, [got], to=TensorProto.FLOAT)
    _same(back, expected)
    # QuantizeLinear to the same type: x / 2 then the cast's rounding
    zp = torch.zeros((), dtype=torch_type)
    (q,) = _kernel_run("QuantizeLinear", 19, [torch.from_numpy(x), torch.tensor(2.0), zp], saturate=saturate)
    qm = one_node_model("QuantizeLinear", {"x": x}, ["y"], 19, initializers={"s": np.float32(2.0), "zp": np.zeros((), np_type)}, saturate=saturate)
    _same(q, run_reference(qm, {"x": x})[0].astype(np.float32))
    # CastLike with a float8 `like` takes the same path
    (like,) = _kernel_run("CastLike", 19, [torch.from_numpy(x), zp], saturate=saturate)
    _same(like, expected)


def test_cast_to_4bit_wraps_like_onnx() -> None:
    x = np.array([-9.7, -8.5, -3.5, 7.9, 8.2, 15.5, 16.0, 200.0], np.float32)
    for onnx_type, dtype in ((TensorProto.INT4, INT4), (TensorProto.UINT4, UINT4)):
        (got,) = _kernel_run("Cast", 21, [torch.from_numpy(x)], to=onnx_type)
        assert got.dtype == dtype
        m = one_node_model("Cast", {"x": x}, ["y"], 21, to=onnx_type)
        _same(got, run_reference(m, {"x": x})[0].astype(np.int8))
        _same(cast(got, torch.float32), run_reference(m, {"x": x})[0].astype(np.float32))


def test_float8e8m0_and_refusals() -> None:
    x = np.array([1.0, 1.5, 3.0, 0.3, 1e-30, 1e38, np.inf, np.nan], np.float32)
    m = one_node_model("Cast", {"x": x}, ["y"], 24, to=TensorProto.FLOAT8E8M0)
    (got,) = _kernel_run("Cast", 24, [torch.from_numpy(x)], to=TensorProto.FLOAT8E8M0)
    np.testing.assert_array_equal(got.view(torch.uint8).numpy(), run_reference(m, {"x": x})[0].view(np.uint8))
    for to in (TensorProto.STRING, TensorProto.FLOAT4E2M1):
        with pytest.raises(UnsupportedVariantError, match=TensorProto.DataType.Name(to)):
            _kernel_run("Cast", 25, [torch.from_numpy(x)], to=to)


def test_bitcast() -> None:
    x = np.array([1.0, -2.5, np.inf], np.float32)
    (got,) = _kernel_run("BitCast", 26, [torch.from_numpy(x)], to=TensorProto.INT32)
    np.testing.assert_array_equal(got.numpy(), x.view(np.int32))
    with pytest.raises(UnsupportedVariantError, match="bit width"):
        _kernel_run("BitCast", 26, [torch.from_numpy(x)], to=TensorProto.INT64)


def test_public_helpers_round_half_to_even() -> None:
    y = quantize(torch.tensor([2.5, -2.5, 3.5, 1e9]), torch.tensor(1.0), torch.tensor(0, dtype=torch.int8), dtype=torch.int8)
    assert y.tolist() == [2, -2, 4, 127]


# -- DynamicQuantizeLinear, MatMulInteger, QLinearMatMul: exactly onnxruntime ------------------------------


@pytest.mark.parametrize("x", [X, np.abs(X), np.zeros((2, 3), np.float32)], ids=["mixed", "positive", "zeros"])
def test_dynamic_quantize_linear(x: np.ndarray) -> None:
    m = one_node_model("DynamicQuantizeLinear", {"x": x}, ["y", "s", "zp"], 11)
    got, ort_out, ref = run_torch(m, {"x": x}), run_ort(m, {"x": x}), run_reference(m, {"x": x})
    for g, o, r in zip(got, ort_out, ref, strict=True):
        np.testing.assert_array_equal(g, o)
        if x.any():  # all zeros: onnx.reference's scale is 1/255, onnxruntime's (and its own comment's) 1.0
            np.testing.assert_array_equal(g, r)


A = RNG.integers(0, 256, size=(4, 5)).astype(np.uint8)
# onnxruntime's uint8 x int8 kernel on AVX2 without VNNI (vpmaddubsw) saturates the sum of two products to
# int16, so it is exact only while |b| < 64 there; the exact product is checked against numpy beyond that.
B = RNG.integers(-64, 64, size=(5, 3)).astype(np.int8)
B_FULL = RNG.integers(-128, 128, size=(5, 3)).astype(np.int8)


@pytest.mark.parametrize(
    ("azp", "bzp"),
    [(np.uint8(12), np.int8(-3)), (np.array([1, 2, 3, 4], np.uint8), None), (None, np.array([5, -6, 7], np.int8))],
    ids=["per-tensor", "per-row-of-A", "per-column-of-B"],
)
def test_matmul_integer(azp: np.ndarray | None, bzp: np.ndarray | None) -> None:
    inits = {k: v for k, v in {"azp": azp, "bzp": bzp}.items() if v is not None}
    m = one_node_model("MatMulInteger", {"a": A, "b": B, "azp": None if azp is None else azp, "bzp": None if bzp is None else bzp}, ["y"], 10, initializers=inits)
    got = run_torch(m, {"a": A, "b": B})[0]
    assert got.dtype == np.int32
    if azp is None or np.size(azp) == 1:  # onnxruntime refuses per-row zero points of A (onnx.reference
        # broadcasts a 1-D one along A's columns): the exact product below is the reference for them
        np.testing.assert_array_equal(got, run_ort(m, {"a": A, "b": B})[0])
    exact = (A.astype(np.int64) - (0 if azp is None else np.reshape(azp, (-1, 1)).astype(np.int64))) @ (
        B_FULL.astype(np.int64) - (0 if bzp is None else bzp.astype(np.int64)))
    np.testing.assert_array_equal(run_torch(m, {"a": A, "b": B_FULL})[0], exact)


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_matmul(opset: int, per_channel: bool) -> None:
    a = RNG.integers(-128, 128, size=(2, 4, 5)).astype(np.int8)
    b = RNG.integers(-128, 128, size=(5, 3)).astype(np.int8)
    b_scale = np.array([0.02, 0.05, 0.011], np.float32) if per_channel else np.float32(0.03)
    b_zp = np.zeros(3, np.int8) if per_channel else np.int8(0)
    inits = {"a_s": np.float32(0.07), "a_zp": np.int8(3), "b_s": b_scale, "b_zp": b_zp, "y_s": np.float32(0.5), "y_zp": np.int8(-4)}
    feeds = {"a": a, "b": b}
    inputs: dict[str, np.ndarray | None] = {"a": a, "a_s": None, "a_zp": None, "b": b, "b_s": None, "b_zp": None, "y_s": None, "y_zp": None}
    m = one_node_model("QLinearMatMul", inputs, ["y"], opset, initializers=inits)
    got = run_torch(m, feeds)[0]
    np.testing.assert_array_equal(got, run_ort(m, feeds)[0])
    np.testing.assert_array_equal(got, run_reference(m, feeds)[0])


# -- a real model quantized by onnxruntime --------------------------------------------------------------


@pytest.fixture(scope="session")
def mlp_onnx(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = io.BytesIO()
        torch.onnx.export(mlp, (x,), buf, dynamo=False, input_names=["x"], output_names=["y"], opset_version=17)
    path.write_bytes(buf.getvalue())
    return str(path), x.numpy()


@pytest.mark.parametrize("how", ["dynamic", "static-qdq"])
def test_quantized_mlp_agrees_with_onnxruntime(mlp_onnx: tuple[str, np.ndarray], how: str, ) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src, x = mlp_onnx
    out = f"{src[:-5]}-{how}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamic":
            # reduce_range: 7-bit weights, which onnxruntime's AVX2 uint8 x int8 kernel needs to be exact (above)
            quantize_dynamic(src, out, weight_type=QuantType.QInt8, reduce_range=True)
        else:

            class Reader(CalibrationDataReader):
                def __init__(self) -> None:
                    self.batches = iter([{"x": x}, {"x": x * 0.5}])

                def get_next(self) -> dict[str, np.ndarray] | None:
                    return next(self.batches, None)

            quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ)
    model = onnx.load(out)
    ops = {n.op_type for n in model.graph.node}
    assert ({"MatMulInteger", "DynamicQuantizeLinear"} <= ops) if how == "dynamic" else ({"QuantizeLinear", "DequantizeLinear"} <= ops)
    got, expected = run_torch(model, {"x": x})[0], run_ort(model, {"x": x})[0]
    step = float(np.abs(expected).max()) / 127
    np.testing.assert_allclose(got, expected, atol=step, rtol=0)
    # the oracle keeps the integer arithmetic and computes the float parts in float64
    oracle = run_torch(model, {"x": x}, compute_dtype=torch.float64)[0]
    np.testing.assert_allclose(oracle, expected, atol=step, rtol=0)
