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
    from ..runtimes.tensors import to_torch

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

    def add(name: str, dtype: str, providers: tuple[str, ...] = ("CPU",), departs: str = "", **kw: Any) -> None:
        # float32: sums of up to 256 products, rounded in another order on each side (the oracle finds
        # onnxruntime itself up to 8 ULPs from the exact product)
        ulp = 8.0 if dtype == "float32" else None
        out.append(ContribCase(f"MatMulNBits-{name}-{dtype}", op, dtype, _matmul_nbits(dtype, **kw), providers=providers, max_ulp=ulp, departs=departs))

    for dtype in ("float32", "float16"):
        add("4bit-default-zp", dtype)
        add("4bit-packed-zp-bias-odd-blocks", dtype, block_size=16, k=80, n=17, zero_points="packed", bias=True, a_shape=(2, 3))
        add("4bit-float-zp", dtype, block_size=32, k=96, zero_points="float")
        add("4bit-g_idx", dtype, g_idx=True)
        add("4bit-g_idx-float-zp", dtype, g_idx=True, zero_points="float")
        add("4bit-g_idx-packed-zp", dtype, g_idx=True, zero_points="packed", departs=_G_IDX_ZP)
        add("8bit-packed-zp", dtype, bits=8, block_size=32, zero_points="packed", bias=True)
        add("4bit-bs128-level1", dtype, block_size=128, k=256, n=8, zero_points="packed", accuracy_level=1)
        add("empty-weight-bias", dtype, empty=True, bias=True)
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


@functools.cache
def _cases() -> tuple[ContribCase, ...]:
    return tuple(_nbits_cases() + _gather_cases())


CASES: list[ContribCase] = list(_cases())
