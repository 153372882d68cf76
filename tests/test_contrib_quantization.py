"""onnxruntime's quantization contrib ops in the torch evaluator: MatMulNBits and GatherBlockQuantized against
float64 numpy references (what the ops mean), MatMulNBits' accuracy_level=4 as onnxruntime computes it, and
nodes of types numpy lacks (int4, float8, ...) run on onnxruntime inside the evaluator."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.conformance.contrib_cases import _floored_ulp
from pytest_ortdiff.conformance.contrib_cases.quantization import _matmul_nbits
from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError
from pytest_ortdiff.runtimes.kernels.contrib.quantization import (
    MatMulNBitsAsOnnxruntime,
    unpack_bits,
)
from pytest_ortdiff.runtimes.kernels.quantization import INT4, storage

MS = "com.microsoft"
OPSETS = [oh.make_opsetid("", 21), oh.make_opsetid(MS, 1)]
NBITS = (MS, "MatMulNBits")


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto], opsets: list[onnx.OperatorSetIdProto] = OPSETS) -> onnx.ModelProto:
    return oh.make_model(oh.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=opsets, ir_version=10)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_unpack_bits_low_bits_first() -> None:
    packed = torch.tensor([[0x21, 0xF0], [0xE4, 0x1B]], dtype=torch.uint8)
    assert unpack_bits(packed, 4).tolist() == [[1, 2, 0, 15], [4, 14, 11, 1]]
    assert unpack_bits(packed[:1, :1], 2).tolist() == [[1, 0, 2, 0]]
    assert unpack_bits(packed, 8) is packed


# -- MatMulNBits: the meaning --------------------------------------------------------------------------


def _nbits_reference(a: np.ndarray, q: np.ndarray, scales: np.ndarray, zp: np.ndarray, g_idx: np.ndarray | None, block: int, bias: np.ndarray | None) -> np.ndarray:
    """A @ ((q - zp) * scale)^T + bias in float64, q (N, K) and scales/zp (N, k_blocks) unpacked."""
    k = q.shape[1]
    groups = g_idx if g_idx is not None else np.arange(k) // block
    w = (q - zp[:, groups]) * scales[:, groups].astype(np.float64)
    y = a.astype(np.float64) @ w.T
    return y + bias if bias is not None else y


@pytest.mark.parametrize(
    ("bits", "block", "k", "zero_points", "g_idx"),
    [(4, 16, 80, "packed", False), (2, 32, 64, "none", False), (8, 16, 48, "packed", False), (4, 32, 64, "float", True)],
    ids=["4bit-odd-blocks", "2bit-default-zp", "8bit", "4bit-g_idx-float-zp"],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_nbits_is_the_dequantized_product(bits: int, block: int, k: int, zero_points: str, g_idx: bool, dtype: str) -> None:
    # bfloat16 has no onnxruntime CPU kernel: the numpy reference is the only judge there
    model, feeds = _matmul_nbits(dtype, bits=bits, block_size=block, k=k, n=12, a_shape=(2, 3), zero_points=zero_points, g_idx=g_idx, bias=True)()
    inits = {i.name: nh.to_array(i).copy() for i in model.graph.initializer}
    kb = -(-k // block)
    q = unpack_bits(torch.from_numpy(inits["B"]).reshape(12, -1), bits)[:, :k].numpy().astype(np.int64)
    scales = inits["scales"].astype(np.float64)
    if zero_points == "packed":
        zp = unpack_bits(torch.from_numpy(inits["zero_points"]), bits)[:, :kb].numpy().astype(np.float64)
    elif zero_points == "float":
        zp = inits["zero_points"].astype(np.float64)
    else:
        zp = np.full((12, kb), 2.0 ** (bits - 1))
    a = feeds["A"].float().numpy()
    expected = _nbits_reference(a, q, scales, zp, inits.get("g_idx"), block, inits["bias"].astype(np.float64))
    ours = TorchEvaluator(model).run(None, feeds)[0]
    oracle = TorchEvaluator(model, compute_dtype="float64").run(None, feeds)[0]
    assert ours.dtype == getattr(torch, dtype) and ours.shape == (2, 3, 12)
    np.testing.assert_allclose(oracle.numpy(), expected, rtol=1e-12, atol=1e-12)
    # one rounding to the output dtype (float32 accumulation: a few float32 ULPs)
    tol = 2.0**-7 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(ours.float().numpy(), expected, rtol=tol, atol=tol * np.abs(expected).max())


def test_matmul_nbits_empty_weight_is_the_bias() -> None:
    model, feeds = _matmul_nbits("float32", empty=True, bias=True, a_shape=(4,))()
    bias = nh.to_array(next(i for i in model.graph.initializer if i.name == "bias"))
    y = TorchEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(bias, (4, 24)))


def test_matmul_nbits_refuses_prepacked_weights_by_name() -> None:
    model, feeds = _matmul_nbits("float16")()
    model.graph.node[0].attribute.append(oh.make_attribute("weight_prepacked", 1))
    with pytest.raises(UnsupportedVariantError, match=r"weight_prepacked=1: B is prepacked in the CUDA SM80 fpA_intB layout.*kernels="):
        TorchEvaluator(model, check_model=False).run(None, feeds)


# -- MatMulNBits accuracy_level=4: onnxruntime's int8 activations ----------------------------------------


@pytest.mark.parametrize(("bits", "block", "k"), [(4, 32, 72), (8, 16, 64), (2, 64, 128), (4, 128, 256)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matmul_nbits_level4_as_onnxruntime(bits: int, block: int, k: int, dtype: str) -> None:
    model, feeds = _matmul_nbits(dtype, bits=bits, block_size=block, k=k, zero_points="packed", accuracy_level=4, a_shape=(2, 5))()
    got = [torch.from_numpy(y) for y in _ort(model, {"A": feeds["A"].numpy()})]
    meaning = TorchEvaluator(model).run(None, feeds)
    as_ort = TorchEvaluator(model, kernels={NBITS: MatMulNBitsAsOnnxruntime}).run(None, feeds)
    # onnxruntime's int8 arithmetic reproduced to float32's rounding; the meaning is far from it
    assert _floored_ulp(got, as_ort) <= (8 if dtype == "float32" else 4)
    assert _floored_ulp(got, meaning) > (1000 if dtype == "float32" else 8)


def test_matmul_nbits_as_onnxruntime_is_the_meaning_below_level4() -> None:
    model, feeds = _matmul_nbits("float32", zero_points="packed", accuracy_level=1)()
    meaning = TorchEvaluator(model).run(None, feeds)[0]
    as_ort = TorchEvaluator(model, kernels={NBITS: MatMulNBitsAsOnnxruntime}).run(None, feeds)[0]
    assert torch.equal(meaning, as_ort)


def test_matmul_nbits_departure_names_the_int8_activations() -> None:
    model, _ = _matmul_nbits("float32", accuracy_level=4)()
    ev = TorchEvaluator(model)
    (_, k, _), = list(ev.iter_kernels())
    departure = k.departure()
    assert departure is not None and isinstance(departure.kernel, MatMulNBitsAsOnnxruntime)
    assert departure.what.startswith("MatMulNBits accuracy_level=4: onnxruntime quantizes A to int8 per block of K (32 values")
    level0, _ = _matmul_nbits("float32")()
    (_, k0, _), = list(TorchEvaluator(level0).iter_kernels())
    assert k0.departure() is None


def test_ort_kernel_runs_matmul_nbits_as_inside_the_model() -> None:
    # onnxruntime takes accuracy_level=4's int8 path only for a prepacked (constant) B: the node on
    # onnxruntime inside the evaluator holds B, scales and zero points as initializers, so it gives the
    # whole model's bits (fed as inputs, B was dequantized to float32: the 9.4e-3)
    model, feeds = _matmul_nbits("float32", zero_points="packed", accuracy_level=4, a_shape=(3, 4), k=128, n=32)()
    whole = _ort(model, {"A": feeds["A"].numpy()})[0]
    swapped = TorchEvaluator(model, kernels={NBITS: "ort"}).run(None, feeds)[0]
    np.testing.assert_array_equal(swapped.numpy(), whole)
    oracle_swapped = TorchEvaluator(model, kernels={NBITS: "ort"}, compute_dtype="float64").run(None, feeds)[0]
    assert oracle_swapped.dtype == torch.float64
    np.testing.assert_array_equal(oracle_swapped.float().numpy(), whole)


# -- types numpy lacks, on onnxruntime inside the evaluator ----------------------------------------------


def _gather_int4_model() -> tuple[onnx.ModelProto, dict[str, torch.Tensor], np.ndarray]:
    rng = np.random.default_rng(1)
    q = rng.integers(-8, 8, size=(6, 32))
    scales = rng.uniform(0.1, 1.0, size=(6, 2)).astype(np.float32)
    zp = rng.integers(-8, 8, size=(6, 2))
    node = oh.make_node("GatherBlockQuantized", ["data", "idx", "scales", "zp"], ["y"], domain=MS, block_size=16, quantize_axis=1)
    inits = [nh.from_array(q.astype(ml_dtypes.int4), "data"), nh.from_array(scales, "scales"), nh.from_array(zp.astype(ml_dtypes.int4), "zp")]
    model = _model([node], [oh.make_tensor_value_info("idx", TensorProto.INT64, [3])], [oh.make_tensor_value_info("y", TensorProto.FLOAT, [3, 32])], inits)
    idx = np.array([5, -6, 2])
    expected = ((q - np.repeat(zp, 16, axis=1)) * np.repeat(scales, 16, axis=1))[[5, 0, 2]]
    return model, {"idx": torch.from_numpy(idx)}, expected


@pytest.mark.parametrize("compute_dtype", [None, "float64"])
def test_int4_gather_block_quantized_runs_on_onnxruntime_in_the_evaluator(compute_dtype: str | None) -> None:
    model, feeds, expected = _gather_int4_model()
    ours = TorchEvaluator(model, compute_dtype=compute_dtype).run(None, feeds)[0]
    on_ort = TorchEvaluator(model, kernels={(MS, "GatherBlockQuantized"): "ort"}, compute_dtype=compute_dtype).run(None, feeds)[0]
    np.testing.assert_allclose(on_ort.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6)


def _quantize_model(zp: np.ndarray, opset: int) -> onnx.ModelProto:
    """x -> QuantizeLinear(zp's type) -> q -> DequantizeLinear -> y, q an output too."""
    nodes = [oh.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]), oh.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])]
    elem = oh.np_dtype_to_tensor_dtype(zp.dtype)
    return _model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [oh.make_tensor_value_info("q", elem, [8]), oh.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        [nh.from_array(np.array(0.5, np.float32), "s"), nh.from_array(zp, "zp")],
        [oh.make_opsetid("", opset)],
    )


@pytest.mark.parametrize(
    ("zp", "opset"),
    [
        (np.array(1, ml_dtypes.int4), 21),
        (np.array(3, ml_dtypes.uint4), 21),
        (np.array(0, ml_dtypes.float8_e4m3fn), 21),
        (np.array(0, ml_dtypes.float8_e5m2), 21),
        (np.array(0, ml_dtypes.int2), 25),
    ],
    ids=["int4", "uint4", "float8e4m3fn", "float8e5m2", "int2"],
)
def test_low_precision_values_cross_to_onnxruntime_and_back(zp: np.ndarray, opset: int) -> None:
    # every node on onnxruntime: int4/float8/int2 values flow from one onnxruntime node to the next
    # through the evaluator, in and out of onnxruntime as their carriers
    model = _quantize_model(zp, opset)
    x = torch.tensor([0.26, -0.74, 3.49, 7.5, -8.5, 0.0, 1.25, -100.0])
    ours = TorchEvaluator(model).run(None, {"x": x})
    try:
        on_ort = TorchEvaluator(model, kernels={("", "QuantizeLinear"): "ort", ("", "DequantizeLinear"): "ort"}).run(None, {"x": x})
    except Exception as exc:
        if "NOT_IMPLEMENTED" in str(exc) or "not have" in str(exc):
            pytest.skip(f"this onnxruntime has no QuantizeLinear-{opset} for {zp.dtype}: {str(exc)[:120]}")
        raise
    assert on_ort[0].dtype == ours[0].dtype
    assert torch.equal(storage(on_ort[0]).view(torch.uint8), storage(ours[0]).view(torch.uint8))  # bit for bit
    assert torch.equal(on_ort[1], ours[1])


def test_int4_output_keeps_its_type() -> None:
    model = _quantize_model(np.array(0, ml_dtypes.int4), 21)
    q, _ = TorchEvaluator(model, kernels={("", "QuantizeLinear"): "ort"}).run(None, {"x": torch.tensor([1.0, -1.0, 3.0, 20.0, -20.0, 0.0, 0.5, 1.5])})
    assert q.dtype == INT4
    assert storage(q).tolist() == [2, -2, 6, 7, -8, 0, 1, 3]  # saturated to [-8, 7], ties to even


# -- integer products and the QLinear family against numpy ------------------------------------------------


def _run_one(op: str, inputs: list[tuple[str, np.ndarray | None]], out_type: int, out_shape: list[int], **attrs: object) -> torch.Tensor:
    """One com.microsoft node, every input fed (None: omitted), through the evaluator."""
    names = [n if v is not None else "" for n, v in inputs]
    node = oh.make_node(op, names, ["y"], domain=MS, **attrs)
    graph_inputs = [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for n, v in inputs if v is not None]
    model = _model([node], graph_inputs, [oh.make_tensor_value_info("y", out_type, out_shape)], [])
    return TorchEvaluator(model).run(None, {n: torch.from_numpy(np.asarray(v)) for n, v in inputs if v is not None})[0]


def _f(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def test_qlinear_add_mul_without_zero_points() -> None:
    # onnxruntime refuses these nodes ("Input data type does not match"): zero points default to 0
    a = np.array([[100, -128, 3, 127]], np.int8)
    b = np.array([[27, 1, -3, 127]], np.int8)
    add = _run_one("QLinearAdd", [("A", a), ("As", _f(0.5)), ("Az", None), ("B", b), ("Bs", _f(0.25)), ("Bz", None), ("Cs", _f(1.0)), ("Cz", None)], TensorProto.INT8, [1, 4])
    # 0.5 a + 0.25 b: 56.75, -63.75, 0.75, 95.25 -> rounded half to even
    assert add.tolist() == [[57, -64, 1, 95]]
    mul = _run_one("QLinearMul", [("A", a), ("As", _f(0.1)), ("Az", None), ("B", b), ("Bs", _f(0.1)), ("Bz", None), ("Cs", _f(0.01)), ("Cz", None)], TensorProto.INT8, [1, 4])
    assert mul.tolist() == [[127, -128, -9, 127]]  # saturated both ways


def test_qlinear_reduce_mean_is_the_requantized_mean() -> None:
    # no onnxruntime CPU kernel to compare with: numpy's mean of the dequantized data, requantized
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3, 4, 5)).astype(np.uint8)
    for axes, keep in (([1], 1), ([0, 2], 0)):
        shape = [1 if a in axes else d for a, d in enumerate(x.shape)] if keep else [d for a, d in enumerate(x.shape) if a not in axes]
        y = _run_one("QLinearReduceMean", [("x", x), ("xs", _f(0.04)), ("xz", np.array(3, np.uint8)), ("ys", _f(0.01)), ("yz", np.array(7, np.uint8))],
                     TensorProto.UINT8, shape, axes=axes, keepdims=keep)
        mean = (0.04 * (x.astype(np.float64) - 3)).mean(axis=tuple(axes), keepdims=bool(keep))
        np.testing.assert_array_equal(y.numpy(), np.clip(np.round(mean / 0.01) + 7, 0, 255))


def test_qlinear_softmax_is_the_requantized_softmax() -> None:
    x = np.array([[0, 10, 20, 255], [128, 128, 128, 128]], np.uint8)
    y = _run_one("QLinearSoftmax", [("x", x), ("xs", _f(0.05)), ("xz", np.array(128, np.uint8)), ("ys", _f(0.003)), ("yz", np.array(0, np.uint8))],
                 TensorProto.UINT8, [2, 4], opset=13)
    v = 0.05 * (x.astype(np.float64) - 128)
    p = np.exp(v - v.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(y.numpy(), np.clip(np.round(p / 0.003), 0, 255))  # 1.0 / 0.003 = 333.3: saturates at 255


def test_matmul_integer_to_float_per_column_parameters() -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (3, 6)).astype(np.uint8)
    b = rng.integers(-128, 128, (6, 5)).astype(np.int8)
    a_scale, a_zp = rng.uniform(0.01, 0.1, 6).astype(np.float32), rng.integers(0, 256, 6).astype(np.uint8)
    b_scale, b_zp = rng.uniform(0.01, 0.1, 5).astype(np.float32), rng.integers(-5, 5, 5).astype(np.int8)
    y = _run_one("MatMulIntegerToFloat", [("a", a), ("b", b), ("as", a_scale), ("bs", b_scale), ("az", a_zp), ("bz", b_zp)], TensorProto.FLOAT, [3, 5])
    expected = ((a.astype(np.float64) - a_zp) * a_scale) @ ((b.astype(np.float64) - b_zp) * b_scale)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)


def test_dynamic_quantize_matmul_per_column_b() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.integers(-128, 128, (8, 3)).astype(np.int8)
    b_scale = np.array([0.01, 0.02, 0.03], np.float32)
    y = _run_one("DynamicQuantizeMatMul", [("a", a), ("b", b), ("bs", b_scale)], TensorProto.FLOAT, [4, 3])
    lo, hi = min(a.min(), 0.0), max(a.max(), 0.0)
    scale = np.float32((hi - lo) / 255)
    zp = np.round(-lo / scale)
    qa = np.clip(np.round(a / scale) + zp, 0, 255)
    expected = ((qa - zp) @ b.astype(np.float64)) * scale * b_scale
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5)


def test_qlinear_kernels_refuse_per_channel_parameters_by_name() -> None:
    x = np.zeros((2, 3), np.uint8)
    with pytest.raises(RuntimeError, match=r"QLinearSigmoid X_scale of shape \(3,\): the spec's is a scalar"):
        _run_one("QLinearSigmoid", [("x", x), ("xs", np.ones(3, np.float32)), ("xz", None), ("ys", _f(1.0)), ("yz", None)], TensorProto.UINT8, [2, 3])


# -- a real int4 model: a Llama-like block quantized by onnxruntime's MatMulNBitsQuantizer -------------------


class _TinyLlama(torch.nn.Module):
    """Embedding, RMSNorm, causal single-head attention, SwiGLU MLP, LM head: every weight a MatMul or Gather
    the quantizer turns into MatMulNBits and GatherBlockQuantized."""

    def __init__(self, vocab: int = 96, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.norms = torch.nn.Parameter(1 + 0.1 * torch.randn(3, dim))

    def _norm(self, x: torch.Tensor, i: int) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norms[i]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        x = self._norm(h, 0)
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 8.0
        mask = torch.triu(torch.full((ids.shape[-1], ids.shape[-1]), float("-inf")), 1)
        h = h + self.o(torch.softmax(scores + mask, -1) @ self.v(x))
        x = self._norm(h, 1)
        h = h + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return self.head(self._norm(h, 2))


@functools.cache
def _int4_llama(accuracy_level: int) -> onnx.ModelProto:
    import io
    import logging
    import warnings

    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_TinyLlama().eval(), (torch.zeros(1, 8, dtype=torch.int64),), buf, dynamo=False, opset_version=18, input_names=["ids"])
    config = DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=False, accuracy_level=accuracy_level,
        op_types_to_quantize=("MatMul", "Gather"), quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)  # (its opset-21 upgrade notice)
    quantizer = MatMulNBitsQuantizer(onnx.load_from_string(buf.getvalue()), algo_config=config)
    quantizer.process()
    return quantizer.model.model


IDS = torch.tensor([[5, 17, 3, 90, 44, 0, 61, 8]])


def test_int4_llama_runs_in_the_evaluator_and_its_oracle() -> None:
    model = _int4_llama(0)
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops
    data = next(i for i in model.graph.initializer if i.name.endswith("_Q4"))
    assert data.data_type == TensorProto.UINT4  # the quantizer's asymmetric int4 embedding
    expected = _ort(model, {"ids": IDS.numpy()})[0]
    ours = TorchEvaluator(model).run(None, {"ids": IDS})[0]
    oracle = TorchEvaluator(model, compute_dtype="float64").run(None, {"ids": IDS})[0]
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(ours.numpy(), expected, atol=2e-6 * scale, rtol=0)
    np.testing.assert_allclose(oracle.numpy(), expected, atol=2e-6 * scale, rtol=0)


def test_int4_llama_at_level4_departs_by_what_blame_names() -> None:
    from pytest_ortdiff import blame

    model = _int4_llama(4)
    expected = _ort(model, {"ids": IDS.numpy()})[0]
    scale = float(np.abs(expected).max())
    meaning = TorchEvaluator(model).run(None, {"ids": IDS})[0].numpy()
    as_ort = TorchEvaluator(model, kernels={NBITS: MatMulNBitsAsOnnxruntime}).run(None, {"ids": IDS})[0].numpy()
    on_ort = TorchEvaluator(model, kernels={NBITS: "ort"}).run(None, {"ids": IDS})[0].numpy()
    # int8 activations cost about a percent of the logits' scale; onnxruntime's arithmetic reproduced
    assert np.abs(meaning - expected).max() > 1e-3 * scale
    np.testing.assert_allclose(as_ort, expected, atol=2e-6 * scale, rtol=0)
    np.testing.assert_allclose(on_ort, expected, atol=2e-6 * scale, rtol=0)
    table = blame(model, {"ids": IDS})
    assert table.op_rows[0].op_type == "MatMulNBits" and table.op_rows[0].explained > 0.9
    note = next(n for n in table.notes if n.startswith("MatMulNBits accuracy_level=4: onnxruntime quantizes A to int8 per block of K (32 values"))
    assert "8 nodes" in note and "MatMulNBitsAsOnnxruntime" in note
