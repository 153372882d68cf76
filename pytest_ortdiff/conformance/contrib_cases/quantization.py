"""Conformance cases for onnxruntime's quantization contrib ops (see pytest_ortdiff.contrib_cases).

Weights, scales and zero points are initializers, as onnxruntime's quantizers write them: onnxruntime
prepacks a constant MatMulNBits weight, and only then takes its accuracy_level=4 int8 path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from . import ContribCase

MS = "com.microsoft"
_OPSETS = (("", 21), (MS, 1))


def _np_dtype(dtype: str) -> Any:
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _onnx_type(dtype: str) -> int:
    from onnx import TensorProto

    return {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]


def _feed(array: Any) -> Any:
    from ...numerics.tensors import to_torch

    return to_torch(array)


def _model(node: Any, inputs: Sequence[Any], outputs: Sequence[Any], initializers: Sequence[Any] = (), opsets: Sequence[tuple[str, int]] = _OPSETS) -> Any:
    import onnx.helper as oh

    graph = oh.make_graph([node], f"case_{node.op_type}", list(inputs), list(outputs), list(initializers))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets], ir_version=10)


def _pack(values: Any, bits: int) -> Any:
    """uint8 values in [0, 2**bits) packed 8 // bits per byte along the last axis, the first in the low bits."""
    import numpy as np

    per = 8 // bits
    v = values.astype(np.uint8).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    out = np.zeros(v.shape[:-1], dtype=np.uint8)
    for j in range(per):
        out |= v[..., j] << (bits * j)
    return out


# -- MatMulNBits ----------------------------------------------------------------------------------------


def _matmul_nbits(
    dtype: str,
    *,
    bits: int = 4,
    block_size: int = 32,
    k: int = 64,
    n: int = 24,
    a_shape: tuple[int, ...] = (3,),
    zero_points: str = "none",  # "none" | "packed" | "float"
    g_idx: bool = False,
    bias: bool = False,
    accuracy_level: int | None = None,
    empty: bool = False,
    seed: int = 0,
) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import numpy as np
        import onnx.helper as oh
        import onnx.numpy_helper as nh
        from onnx import TensorProto

        rng = np.random.default_rng(seed)
        t = _np_dtype(dtype)
        kb = -(-k // block_size)
        blob = block_size * bits // 8
        q = rng.integers(0, 1 << bits, size=(n, kb * block_size))
        q[:, k:] = 0
        b = _pack(q, bits).reshape(n, kb, blob)
        scales = (rng.uniform(0.5, 1.5, size=(n, kb)) / (1 << bits)).astype(np.float32)
        inits = []
        names = ["A", "B", "scales"]
        if empty:
            b = np.zeros((n, 0, blob), dtype=np.uint8)
            scales = np.zeros((n, 0), dtype=np.float32)
        inits += [nh.from_array(b, "B"), nh.from_array(scales.astype(t), "scales")]
        if zero_points == "packed":
            zq = rng.integers(0, 1 << bits, size=(n, -(-kb * bits // 8) * (8 // bits)))
            inits.append(nh.from_array(_pack(zq, bits), "zero_points"))
            names.append("zero_points")
        elif zero_points == "float":
            zf = rng.uniform(0, (1 << bits) - 1, size=(n, kb)).astype(t)
            inits.append(nh.from_array(zf, "zero_points"))
            names.append("zero_points")
        if g_idx:
            groups = np.arange(k, dtype=np.int32) // block_size
            inits.append(nh.from_array(rng.permutation(groups).astype(np.int32), "g_idx"))
            names += [""] * (4 - len(names)) + ["g_idx"]
        if bias:
            inits.append(nh.from_array(rng.standard_normal(n).astype(t), "bias"))
            names += [""] * (5 - len(names)) + ["bias"]
        attrs: dict[str, Any] = {"K": k, "N": n, "bits": bits, "block_size": block_size}
        if accuracy_level is not None:
            attrs["accuracy_level"] = accuracy_level
        node = oh.make_node("MatMulNBits", names, ["Y"], domain=MS, **attrs)
        elem = _onnx_type(dtype)
        model = _model(node, [oh.make_tensor_value_info("A", elem, [*a_shape, k])], [oh.make_tensor_value_info("Y", elem, [*a_shape, n])], inits)
        a = rng.standard_normal((*a_shape, k)).astype(np.float32).astype(t)
        del TensorProto
        return model, {"A": _feed(a)}

    return build


def _nbits_cases() -> list[ContribCase]:
    op = f"{MS}::MatMulNBits"
    out: list[ContribCase] = []

    def add(name: str, dtype: str, providers: tuple[str, ...] = ("CPU",), departs: str = "", since: tuple[str, str] = ("", ""), **kw: Any) -> None:
        # float32: sums of up to 256 products, rounded in another order on each side (the oracle finds
        # onnxruntime itself up to 8 ULPs from the exact product)
        ulp = 8.0 if dtype == "float32" else None
        out.append(
            ContribCase(
                f"MatMulNBits-{name}-{dtype}", op, dtype, _matmul_nbits(dtype, **kw), providers=providers, max_ulp=ulp, departs=departs,
                min_onnxruntime=since[0], before=since[1],
            )
        )

    for dtype in ("float32", "float16"):
        add("4bit-default-zp", dtype)
        add("4bit-packed-zp-bias-odd-blocks", dtype, block_size=16, k=80, n=17, zero_points="packed", bias=True, a_shape=(2, 3))
        add("4bit-float-zp", dtype, block_size=32, k=96, zero_points="float")
        add("4bit-g_idx", dtype, g_idx=True)
        add("4bit-g_idx-float-zp", dtype, g_idx=True, zero_points="float")
        add("4bit-g_idx-packed-zp", dtype, g_idx=True, zero_points="packed", departs=_G_IDX_ZP)
        add("8bit-packed-zp", dtype, bits=8, block_size=32, zero_points="packed", bias=True)
        add("4bit-bs128-level1", dtype, block_size=128, k=256, n=8, zero_points="packed", accuracy_level=1)
        add("empty-weight-bias", dtype, empty=True, bias=True, since=("1.32", "refuses or crashes on an empty weight (its PrePack checks B's shape)"))
        add("4bit-level4", dtype, zero_points="packed", accuracy_level=4, a_shape=(2, 5), departs=_LEVEL4)
        add("8bit-level4", dtype, bits=8, accuracy_level=4, departs=_LEVEL4)
    add("2bit-packed-zp", "float32", bits=2, block_size=32, zero_points="packed")
    add("2bit-default-zp", "float32", bits=2, block_size=64, k=128)
    add("4bit-1d-a", "float32", a_shape=(), zero_points="packed")
    add("4bit-level2", "float32", accuracy_level=2, zero_points="packed")
    add("4bit-level3", "float32", accuracy_level=3)
    add("4bit-level4-g_idx", "float32", accuracy_level=4, g_idx=True)
    add("4bit-level4-float-zp", "float32", accuracy_level=4, zero_points="float")
    for name, kw in (("4bit-packed-zp-bias", {"zero_points": "packed", "bias": True}), ("8bit", {"bits": 8})):
        add(name, "bfloat16", providers=("CUDA",), **kw)
    return out


# -- GatherBlockQuantized --------------------------------------------------------------------------------


def _gather_block_quantized(
    dtype: str,
    *,
    data_type: str = "int4",  # "int4" | "uint4" | "uint8" | a float8 name of ml_dtypes
    shape: tuple[int, ...] = (10, 64),
    gather_axis: int = 0,
    quantize_axis: int = 1,
    block_size: int | None = 16,
    bits: int | None = None,
    zero_points: bool = False,
    indices: Any = ((0, 3, -1, 9), (12, -11, 5, 5)),  # 12 and -11 are out of range for 10 rows: zeros
    index_type: str = "int64",
    scale_shape: tuple[int, ...] | None = None,
    seed: int = 0,
) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import ml_dtypes
        import numpy as np
        import onnx.helper as oh
        import onnx.numpy_helper as nh

        rng = np.random.default_rng(seed)
        t = _np_dtype(dtype)
        logical = list(shape)
        qa = quantize_axis % len(shape)
        nbits = bits or 4
        block = block_size if block_size else logical[qa]
        sshape = list(scale_shape) if scale_shape else [-(-d // block) if a == qa else d for a, d in enumerate(logical)]
        scales = rng.uniform(0.01, 0.1, size=sshape).astype(np.float32).astype(t)
        inits = [nh.from_array(scales, "scales")]
        names = ["data", "indices", "scales"]
        if data_type in ("int4", "uint4"):
            lo, hi = (-8, 8) if data_type == "int4" else (0, 16)
            q = rng.integers(lo, hi, size=logical).astype(getattr(ml_dtypes, data_type))
            data = nh.from_array(q, "data")
            if zero_points:
                zp = rng.integers(lo, hi, size=sshape).astype(getattr(ml_dtypes, data_type))
                inits.append(nh.from_array(zp, "zero_points"))
        elif data_type == "uint8":
            q = rng.integers(0, 1 << nbits, size=logical)
            data = nh.from_array(_pack(q, nbits) if nbits < 8 else q.astype(np.uint8), "data")
            if zero_points:
                per = 8 // nbits
                zq = rng.integers(0, 1 << nbits, size=[*sshape[:-1], -(-sshape[-1] // per) * per])
                inits.append(nh.from_array(_pack(zq, nbits) if nbits < 8 else zq.astype(np.uint8), "zero_points"))
        else:
            q = (rng.standard_normal(logical) * 4).astype(getattr(ml_dtypes, data_type))
            data = nh.from_array(q, "data")
        if zero_points:
            names.append("zero_points")
        inits.insert(0, data)
        attrs: dict[str, Any] = {"gather_axis": gather_axis, "quantize_axis": quantize_axis}
        if block_size is not None:
            attrs["block_size"] = block_size
        if bits is not None:
            attrs["bits"] = bits
        node = oh.make_node("GatherBlockQuantized", names, ["output"], domain=MS, **attrs)
        idx = np.array(indices, dtype=index_type)
        elem = _onnx_type(dtype)
        g = gather_axis % len(shape)
        out_shape = [*logical[:g], *idx.shape, *logical[g + 1 :]]
        model = _model(node, [oh.make_tensor_value_info("indices", oh.np_dtype_to_tensor_dtype(idx.dtype), list(idx.shape))], [oh.make_tensor_value_info("output", elem, out_shape)], inits)
        return model, {"indices": _feed(idx)}

    return build


def _gather_cases() -> list[ContribCase]:
    op = f"{MS}::GatherBlockQuantized"
    out: list[ContribCase] = []

    def add(name: str, dtype: str, providers: tuple[str, ...] = ("CPU",), **kw: Any) -> None:
        # each output element is one product, rounded once on both sides: exact
        out.append(ContribCase(f"GatherBlockQuantized-{name}-{dtype}", op, dtype, _gather_block_quantized(dtype, **kw), providers=providers, max_ulp=0.0))

    for dtype in ("float32", "float16"):
        add("int4", dtype)
        add("uint4-zp-int32-indices", dtype, data_type="uint4", zero_points=True, index_type="int32")
        add("uint8-4bit-zp", dtype, data_type="uint8", bits=4, zero_points=True, block_size=32, shape=(10, 96))
        add("float8e4m3fn-row-block", dtype, data_type="float8_e4m3fn", block_size=0)
    add("int4-zp-gather-on-quantize-axis", "float32", zero_points=True, gather_axis=0, quantize_axis=0, shape=(64, 6), indices=(0, 17, 63, -64, 64))
    add("int4-3d-axis1", "float32", shape=(2, 10, 32), gather_axis=1, quantize_axis=2, zero_points=True, indices=((1, 9), (-2, 0)))
    add("uint4-quantize-axis0", "float32", data_type="uint4", shape=(10, 48), gather_axis=1, quantize_axis=0, block_size=16, indices=(0, 47, -48, 48), zero_points=True)
    add("uint8-8bit-default-zp", "float32", data_type="uint8", bits=8, block_size=16, shape=(10, 40))
    add("uint8-2bit-zp", "float32", data_type="uint8", bits=2, zero_points=True, block_size=32, shape=(10, 96))
    add("uint8-4bit-default-zp-block128", "float16", data_type="uint8", bits=4, block_size=128, shape=(10, 256))
    add("float8e5m2-per-tensor-scale", "float32", data_type="float8_e5m2", block_size=0, scale_shape=(1, 1))
    add("float8e4m3fnuz-block16", "float32", data_type="float8_e4m3fnuz", block_size=16)
    for name, kw in (("int4-zp", {"zero_points": True}), ("uint8-4bit", {"data_type": "uint8", "bits": 4, "block_size": 32, "shape": (10, 96)})):
        add(name, "bfloat16", providers=("CUDA",), **kw)
    return out


#: how onnxruntime's CPU kernel departs from MatMulNBits' meaning at accuracy_level=4
_LEVEL4 = (
    "accuracy_level=4: onnxruntime quantizes A to int8 per block of K (scale max|a|/127) and multiplies "
    "integers; ours is the dequantized float product (MatMulNBitsAsOnnxruntime reproduces onnxruntime's)"
)


#: onnxruntime 1.32's CPU kernel given g_idx and packed zero points
_G_IDX_ZP = (
    "g_idx with packed uint8 zero points: onnxruntime's CPU kernel (1.32) ignores the zero points and "
    "dequantizes with the default 2^(bits-1) (a bug, not a choice: float zero points are read); ours reads them"
)


# -- integer matrix products and the QLinear family --------------------------------------------------------


def _quantized_case(
    op: str,
    inputs: Sequence[tuple[str, Any, bool]],  # (name, array or None for an omitted input, fed: else an initializer)
    out_type: int,
    out_shape: Sequence[int],
    **attrs: Any,
) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A one-node model of `op` (com.microsoft) whose fed inputs are graph inputs and the others initializers."""

    def build() -> tuple[Any, dict[str, Any]]:
        import onnx.helper as oh
        import onnx.numpy_helper as nh

        names, graph_inputs, inits, feeds = [], [], [], {}
        for name, value, fed in inputs:
            if value is None:
                names.append("")
                continue
            names.append(name)
            if fed:
                graph_inputs.append(oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
                feeds[name] = _feed(value)
            else:
                inits.append(nh.from_array(value, name))
        node = oh.make_node(op, names, ["y"], domain=MS, **attrs)
        return _model(node, graph_inputs, [oh.make_tensor_value_info("y", out_type, list(out_shape))], inits), feeds

    return build


def _rand_q(rng: Any, shape: Sequence[int], dtype: str) -> Any:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return rng.integers(lo, hi, size=tuple(shape)).astype(dtype)


def _scalar(value: float, dtype: str = "float32") -> Any:
    import numpy as np

    return np.array(value, dtype=dtype)


def _integer_cases() -> list[ContribCase]:
    import numpy as np
    from onnx import TensorProto

    out: list[ContribCase] = []
    rng = np.random.default_rng(7)
    f32 = TensorProto.FLOAT

    def add(op: str, name: str, build: Callable[[], tuple[Any, dict[str, Any]]], max_ulp: float | None = None, departs: str = "") -> None:
        out.append(ContribCase(f"{op}-{name}", f"{MS}::{op}", "float32", build, max_ulp=max_ulp, departs=departs))

    # DynamicQuantizeMatMul: A quantized to uint8 over its range; B int8 or uint8
    for btype, zp, bias in (("int8", None, True), ("uint8", 131, False), ("int8", 3, True)):
        a = rng.standard_normal((2, 3, 40)).astype(np.float32)
        b = _rand_q(rng, (40, 16), btype)
        ins = [("A", a, True), ("B", b, False), ("b_scale", _scalar(0.013), False),
               ("b_zero_point", None if zp is None else _scalar(zp, btype), False),
               ("bias", rng.standard_normal(16).astype(np.float32) if bias else None, False)]
        add("DynamicQuantizeMatMul", f"{btype}-zp{zp}-bias{int(bias)}", _quantized_case("DynamicQuantizeMatMul", ins, f32, (2, 3, 16)), max_ulp=4.0)
    # MatMulIntegerToFloat: A uint8 (onnxruntime's CPU kernel), B int8/uint8, scalar scales
    for btype, bias in (("int8", True), ("uint8", False)):
        a = _rand_q(rng, (3, 40), "uint8")
        b = _rand_q(rng, (40, 16), btype)
        ins = [("A", a, True), ("B", b, False), ("a_scale", _scalar(0.02), False), ("b_scale", _scalar(0.007), False),
               ("a_zero_point", _scalar(120, "uint8"), False), ("b_zero_point", _scalar(5 if btype == "uint8" else -3, btype), False),
               ("bias", rng.standard_normal(16).astype(np.float32) if bias else None, False)]
        add("MatMulIntegerToFloat", f"{btype}-bias{int(bias)}", _quantized_case("MatMulIntegerToFloat", ins, f32, (3, 16)), max_ulp=4.0)
    # QGemm: float output and requantized output; per-column B; transA/transB; alpha; C
    for name, atype, trans_a, trans_b, per_col, c, y_out in (
        ("u8-float-out", "uint8", 0, 0, False, True, None),
        ("u8-transB-per-column-u8-out", "uint8", 0, 1, True, True, "uint8"),
        ("s8-transA-s8-out-alpha", "int8", 1, 0, False, False, "int8"),
    ):
        a = _rand_q(rng, (24, 5) if trans_a else (5, 24), atype)
        btype = "int8" if atype == "int8" else "uint8"
        b = _rand_q(rng, (12, 24) if trans_b else (24, 12), btype)
        b_scale = rng.uniform(0.001, 0.01, 12).astype(np.float32) if per_col else _scalar(0.004)
        b_zp = rng.integers(100, 150, 12).astype(btype) if per_col else _scalar(0, btype)
        ins = [("A", a, True), ("a_scale", _scalar(0.03), False), ("a_zero_point", _scalar(7 if atype == "int8" else 128, atype), False),
               ("B", b, False), ("b_scale", b_scale, False), ("b_zero_point", b_zp, False),
               ("C", rng.integers(-3000, 3000, (12,)).astype(np.int32) if c else None, False),
               ("y_scale", None if y_out is None else _scalar(0.05), False), ("y_zero_point", None if y_out is None else _scalar(10, y_out), False)]
        attrs = {"transA": trans_a, "transB": trans_b, **({"alpha": 0.75} if "alpha" in name else {})}
        elem = f32 if y_out is None else (TensorProto.UINT8 if y_out == "uint8" else TensorProto.INT8)
        add("QGemm", name, _quantized_case("QGemm", ins, elem, (5, 12), **attrs), max_ulp=4.0 if y_out is None else None)

    def unary(op: str, name: str, qtype: str, xs: float, xzp: int | None, ys: float, yzp: int | None, **attrs: Any) -> None:
        x = np.arange(256).astype(np.uint8).view(qtype).reshape(4, 64)  # every quantized value
        ins = [("X", x, True), ("X_scale", _scalar(xs), False), ("X_zero_point", None if xzp is None else _scalar(xzp, qtype), False),
               ("Y_scale", _scalar(ys), False), ("Y_zero_point", None if yzp is None else _scalar(yzp, qtype), False)]
        add(op, name, _quantized_case(op, ins, _QTYPES[qtype], (4, 64), **attrs))

    unary("QLinearSigmoid", "uint8", "uint8", 0.05, 128, 1 / 256, 0)
    unary("QLinearSigmoid", "int8-no-zp", "int8", 0.031, None, 0.0041, None)
    unary("QLinearLeakyRelu", "uint8", "uint8", 0.1, 100, 0.07, 30, alpha=0.2)
    unary("QLinearLeakyRelu", "int8-default-alpha", "int8", 0.02, -5, 0.01, 3)

    def binary(op: str, name: str, qtype: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], scales: tuple[float, float, float], zps: tuple[int | None, int | None, int | None]) -> None:
        a, b = _rand_q(rng, a_shape, qtype), _rand_q(rng, b_shape, qtype)
        ins = [("A", a, True), ("A_scale", _scalar(scales[0]), False), ("A_zero_point", None if zps[0] is None else _scalar(zps[0], qtype), False),
               ("B", b, True), ("B_scale", _scalar(scales[1]), False), ("B_zero_point", None if zps[1] is None else _scalar(zps[1], qtype), False),
               ("C_scale", _scalar(scales[2]), False), ("C_zero_point", None if zps[2] is None else _scalar(zps[2], qtype), False)]
        add(op, name, _quantized_case(op, ins, _QTYPES[qtype], np.broadcast_shapes(a_shape, b_shape)))

    for op in ("QLinearAdd", "QLinearMul"):
        binary(op, "uint8", "uint8", (3, 70), (3, 70), (0.05, 0.031, 0.09), (128, 100, 120))
        binary(op, "int8-broadcast-row", "int8", (3, 4, 70), (70,), (0.021, 0.5, 0.11), (-3, 4, -10))
        binary(op, "uint8-scalar-b", "uint8", (5, 33), (), (0.02, 0.013, 0.05), (0, 255, 17))
        binary(op, "uint8-saturating", "uint8", (2, 50), (2, 50), (0.5, 0.5, 0.01), (0, 0, 128))
        binary(op, "int8-ties-to-even", "int8", (4, 40), (4, 40), (0.5, 0.25, 1.0), (1, 0, 0))  # x.5 results

    # QLinearSoftmax: 1/y_scale an integer (256: onnxruntime's floor(1/y_scale) is exact)
    for name, qtype, shape, axis, opset, xzp, yzp in (
        ("uint8-last-axis-opset13", "uint8", (3, 4, 20), -1, 13, 128, 0),
        ("uint8-axis1-opset13", "uint8", (3, 20, 4), 1, 13, 120, 0),
        ("int8-opset12-coerced", "int8", (2, 3, 8), 1, 12, 0, -128),
    ):
        x = _rand_q(rng, shape, qtype)
        ins = [("X", x, True), ("X_scale", _scalar(0.07), False), ("x_zero_point", _scalar(xzp, qtype), False),
               ("y_scale", _scalar(1 / 256), False), ("y_zero_point", _scalar(yzp, qtype), False)]
        add("QLinearSoftmax", name, _quantized_case("QLinearSoftmax", ins, _QTYPES[qtype], shape, axis=axis, opset=opset))
    x = _rand_q(np.random.default_rng(1), (16, 6), "uint8")
    ins = [("X", x, True), ("X_scale", _scalar(0.05), False), ("x_zero_point", _scalar(128, "uint8"), False),
           ("y_scale", _scalar(1 / 200.5), False), ("y_zero_point", _scalar(0, "uint8"), False)]
    add("QLinearSoftmax", "uint8-inverse-y_scale-200.5", _quantized_case("QLinearSoftmax", ins, TensorProto.UINT8, (16, 6), opset=13), departs=_SOFTMAX_FLOOR)

    for qtype in ("uint8", "int8"):
        parts = [(_rand_q(rng, (2, n, 3), qtype), s, z) for n, s, z in ((4, 0.02, 3), (5, 0.05, -7 if qtype == "int8" else 140), (2, 0.03, 10))]
        ins = [("Y_scale", _scalar(0.04), False), ("Y_zero_point", _scalar(5, qtype), False)]
        for i, (x, s, z) in enumerate(parts):
            ins += [(f"X{i}", x, True), (f"X{i}_scale", _scalar(s), False), (f"X{i}_zero_point", _scalar(z, qtype), False)]
        add("QLinearConcat", f"{qtype}-axis1", _quantized_case("QLinearConcat", ins, _QTYPES[qtype], (2, 11, 3), axis=1))
        cond = rng.random((3, 1, 16)) > 0.5
        x, y = _rand_q(rng, (4, 16), qtype), _rand_q(rng, (3, 4, 1), qtype)
        ins = [("condition", cond, True), ("X", x, True), ("x_scale", _scalar(0.03), False), ("x_zero_point", _scalar(2, qtype), False),
               ("Y", y, True), ("y_scale", _scalar(0.08), False), ("y_zero_point", _scalar(-1 if qtype == "int8" else 200, qtype), False),
               ("z_scale", _scalar(0.05), False), ("z_zero_point", _scalar(4, qtype), False)]
        add("QLinearWhere", f"{qtype}-broadcast", _quantized_case("QLinearWhere", ins, _QTYPES[qtype], (3, 4, 16)))

    pools: list[tuple[str, str, tuple[int, ...], dict[str, Any]]] = [
        ("uint8-3x3-pads", "uint8", (2, 3, 9, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ("int8-count-include-pad", "int8", (1, 4, 8, 8), {"kernel_shape": [2, 3], "pads": [0, 1, 1, 0], "count_include_pad": 1}),
        ("uint8-nhwc-ceil", "uint8", (1, 7, 7, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "channels_last": 1}),
    ]
    for pool, ptype, pshape, pattrs in pools:
        x = _rand_q(rng, pshape, ptype)
        ins = [("X", x, True), ("x_scale", _scalar(0.04), False), ("x_zero_point", _scalar(10, ptype), False),
               ("y_scale", _scalar(0.03), False), ("y_zero_point", _scalar(-4 if ptype == "int8" else 20, ptype), False)]
        add("QLinearAveragePool", pool, _quantized_case("QLinearAveragePool", ins, _QTYPES[ptype], _pooled(pshape, pattrs), **pattrs))
    for pool, ptype, pshape, cl in (("uint8-nchw", "uint8", (2, 5, 6, 7), 0), ("int8-nhwc", "int8", (2, 6, 7, 5), 1)):
        x = _rand_q(rng, pshape, ptype)
        ins = [("X", x, True), ("x_scale", _scalar(0.04), False), ("x_zero_point", _scalar(3, ptype), False),
               ("y_scale", _scalar(0.01), False), ("y_zero_point", _scalar(-2 if ptype == "int8" else 100, ptype), False)]
        out_shape = (pshape[0], 1, 1, pshape[3]) if cl else (*pshape[:2], 1, 1)
        add("QLinearGlobalAveragePool", pool, _quantized_case("QLinearGlobalAveragePool", ins, _QTYPES[ptype], out_shape, channels_last=cl))
    # (QLinearReduceMean: onnxruntime 1.32 has no CPU kernel for it; tests/test_contrib_quantization.py checks ours)
    out += _ms_quantize_cases(rng)
    return out


def _ms_quantize_cases(rng: Any) -> list[ContribCase]:
    """com.microsoft QuantizeLinear / DequantizeLinear: per tensor and per axis, 8/16/4-bit. A 4-bit result
    leaves the model through a Cast to int8 (onnxruntime's Python API has no numpy type for it)."""
    import ml_dtypes
    import numpy as np
    import onnx.helper as oh
    import onnx.numpy_helper as nh
    from onnx import TensorProto

    out: list[ContribCase] = []

    def quantize_case(name: str, dtype: str, zp: Any, axis: int | None, shape: tuple[int, ...] = (3, 4, 5)) -> None:
        def build() -> tuple[Any, dict[str, Any]]:
            t = _np_dtype(dtype)
            x = (rng.standard_normal(shape) * 3).astype(t)
            n = shape[axis] if axis is not None else 1
            scale = rng.uniform(0.01, 0.05, n).astype(t) if axis is not None else np.array(0.02, t)
            zero = np.asarray(zp if axis is None else np.resize(np.asarray(zp), n)).astype(np.asarray(zp).dtype)
            attrs: dict[str, Any] = {} if axis is None else {"axis": axis}
            elem = oh.np_dtype_to_tensor_dtype(zero.dtype)
            nodes = [oh.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], domain=MS, **attrs)]
            result = "q"
            if elem in (TensorProto.INT4, TensorProto.UINT4):
                nodes.append(oh.make_node("Cast", ["q"], ["q8"], to=TensorProto.INT8))
                result, elem = "q8", TensorProto.INT8
            graph = oh.make_graph(nodes, "case_QuantizeLinear", [oh.make_tensor_value_info("x", _onnx_type(dtype), list(shape))],
                                  [oh.make_tensor_value_info(result, elem, list(shape))], [nh.from_array(scale, "s"), nh.from_array(zero, "zp")])
            return oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in _OPSETS], ir_version=10), {"x": _feed(x)}

        out.append(ContribCase(f"QuantizeLinear-{name}-{dtype}", f"{MS}::QuantizeLinear", dtype, build))

    quantize_case("uint8-per-tensor", "float32", np.uint8(128), None)
    quantize_case("int8-per-axis", "float32", np.int8(-3), 1)
    quantize_case("int16-per-axis", "float32", np.int16(100), 2)
    quantize_case("uint16", "float32", np.uint16(30000), None)
    quantize_case("int4-per-axis", "float32", np.array(1, ml_dtypes.int4), 0)
    quantize_case("uint4", "float32", np.array(8, ml_dtypes.uint4), None)
    quantize_case("uint8-per-tensor", "float16", np.uint8(128), None)
    quantize_case("int8-per-axis", "float16", np.int8(2), 1)

    def dequantize_case(name: str, dtype: str, q: Any, zp: Any, axis: int | None) -> None:
        def build() -> tuple[Any, dict[str, Any]]:
            t = _np_dtype(dtype)
            n = q.shape[axis] if axis is not None else 1
            scale = rng.uniform(0.01, 0.05, n).astype(t) if axis is not None else np.array(0.02, t)
            zero = np.asarray(zp if axis is None else np.resize(np.asarray(zp), n)).astype(np.asarray(zp).dtype)
            attrs: dict[str, Any] = {} if axis is None else {"axis": axis}
            node = oh.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], domain=MS, **attrs)
            sub_byte = q.dtype.name in ("int4", "uint4")
            inputs = [] if sub_byte else [oh.make_tensor_value_info("q", oh.np_dtype_to_tensor_dtype(q.dtype), list(q.shape))]
            inits = [nh.from_array(scale, "s"), nh.from_array(zero, "zp")] + ([nh.from_array(q, "q")] if sub_byte else [])
            graph = oh.make_graph([node], "case_DequantizeLinear", inputs, [oh.make_tensor_value_info("y", _onnx_type(dtype), list(q.shape))], inits)
            return oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in _OPSETS], ir_version=10), ({} if sub_byte else {"q": _feed(q)})

        out.append(ContribCase(f"DequantizeLinear-{name}-{dtype}", f"{MS}::DequantizeLinear", dtype, build))

    dequantize_case("uint8-per-tensor", "float32", _rand_q(rng, (3, 8), "uint8"), np.uint8(120), None)
    dequantize_case("int8-per-axis", "float32", _rand_q(rng, (3, 8), "int8"), np.int8(-5), 1)
    dequantize_case("int16", "float32", rng.integers(-30000, 30000, (3, 8)).astype(np.int16), np.int16(-7), None)
    dequantize_case("int32", "float32", rng.integers(-(2**20), 2**20, (3, 8)).astype(np.int32), np.int32(11), None)
    dequantize_case("int4-per-axis", "float32", rng.integers(-8, 8, (3, 8)).astype(ml_dtypes.int4), np.array(-1, ml_dtypes.int4), 0)
    dequantize_case("uint8-per-axis", "float16", _rand_q(rng, (3, 8), "uint8"), np.uint8(131), 0)
    return out


def _pooled(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    import math

    channels_last = attrs.get("channels_last", 0)
    spatial = shape[1:3] if channels_last else shape[2:]
    pads = attrs.get("pads", [0, 0, 0, 0])
    out = []
    for i, (d, k, s) in enumerate(zip(spatial, attrs["kernel_shape"], attrs.get("strides", [1, 1]), strict=True)):
        span = (d + pads[i] + pads[i + 2] - k) / s + 1
        out.append(math.ceil(span) if attrs.get("ceil_mode") else math.floor(span))
    return (shape[0], *out, shape[3]) if channels_last else (*shape[:2], *out)


_QTYPES = {"uint8": 2, "int8": 3}  # onnx TensorProto.UINT8, INT8

#: onnxruntime's QLinearSoftmax when 1 / y_scale is not an integer
_SOFTMAX_FLOOR = (
    "QLinearSoftmax with 1/y_scale not an integer: onnxruntime multiplies by floor(1/y_scale) instead of "
    "dividing by y_scale (200 for 200.5): 8 of the 96 outputs one quantization step low"
)


@functools.cache
def _cases() -> tuple[ContribCase, ...]:
    return tuple(_nbits_cases() + _gather_cases() + _integer_cases())


CASES: list[ContribCase] = list(_cases())

