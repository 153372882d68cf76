"""Quantization kernels (ONNX's quantization family): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, and the public quantize/dequantize helpers other quantized kernels build on.

How the evaluator holds the low-precision types:

- float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0): torch's own float8 dtypes.
- int4, uint4, int2, uint2: one value per byte, sign-extended, tagged with torch's shell dtypes
  (`torch.int4`, `torch.uint4`, ...) through `Tensor.view`: the tag keeps the ONNX type (a QuantizeLinear whose
  zero point is int4 must saturate to [-8, 7], not to int8's range), the byte storage keeps every value
  addressable. torch has no arithmetic (nor copy) on the shell dtypes: kernels compute on `storage(t)`, the
  int8/uint8 view, and tag results with `tag(t, dtype)`. Packed storage is the file format's business only.
- float4e2m1 has no one-value-per-element torch dtype (`float4_e2m1fn_x2` packs two): refused by name.
"""

from __future__ import annotations

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "FLOAT8_TYPES",
    "SUB_BYTE_TYPES",
    "DequantizeLinear",
    "DequantizeLinear13",
    "DequantizeLinear19",
    "DequantizeLinear21",
    "DequantizeLinear23",
    "DequantizeLinear24",
    "DequantizeLinear25",
    "DynamicQuantizeLinear",
    "QuantizeLinear",
    "QuantizeLinear13",
    "QuantizeLinear19",
    "QuantizeLinear21",
    "QuantizeLinear23",
    "QuantizeLinear24",
    "QuantizeLinear25",
    "dequantize",
    "dynamic_quantize_uint8",
    "expand_param",
    "float8_cast",
    "integer_range",
    "low_precision_dtype",
    "quantize",
    "storage",
    "tag",
    "to_e8m0",
    "wrap_sub_byte",
]

TP = onnx.TensorProto
# torch's shell dtypes for 2/4-bit integers (not in its type stubs)
INT4: torch.dtype = torch.int4  # type: ignore[attr-defined]
UINT4: torch.dtype = torch.uint4  # type: ignore[attr-defined]
INT2: torch.dtype = torch.int2  # type: ignore[attr-defined]
UINT2: torch.dtype = torch.uint2  # type: ignore[attr-defined]

#: onnx element type -> torch float8 dtype
FLOAT8_TYPES: dict[int, torch.dtype] = {
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn,
    TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    TP.FLOAT8E5M2: torch.float8_e5m2,
    TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    TP.FLOAT8E8M0: torch.float8_e8m0fnu,
}
#: onnx element type -> the torch shell dtype that tags a one-value-per-byte tensor of it
SUB_BYTE_TYPES: dict[int, torch.dtype] = {
    TP.INT4: INT4,
    TP.UINT4: UINT4,
    TP.INT2: INT2,
    TP.UINT2: UINT2,
}
# tagged dtype -> (byte storage dtype, number of bits)
_SUB_BYTE = {
    INT4: (torch.int8, 4),
    UINT4: (torch.uint8, 4),
    INT2: (torch.int8, 2),
    UINT2: (torch.uint8, 2),
}
_INTEGER_RANGES: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.uint16: (0, 65535),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
    UINT4: (0, 15),
    INT4: (-8, 7),
    UINT2: (0, 3),
    INT2: (-2, 1),
}
_INTEGER_TARGETS: dict[int, torch.dtype] = {TP.UINT8: torch.uint8, TP.INT8: torch.int8, TP.UINT16: torch.uint16, TP.INT16: torch.int16}
_FLOAT8 = frozenset(FLOAT8_TYPES.values())
_HALF = (torch.float16, torch.bfloat16)


def low_precision_dtype(onnx_type: int, what: str) -> torch.dtype | None:
    """The torch dtype of a float8 or 2/4-bit onnx type, None for the others; float4/float6 refused by name."""
    if onnx_type in FLOAT8_TYPES:
        return FLOAT8_TYPES[onnx_type]
    if onnx_type in SUB_BYTE_TYPES:
        return SUB_BYTE_TYPES[onnx_type]
    name = TP.DataType.Name(onnx_type) if onnx_type in TP.DataType.values() else str(onnx_type)
    if name.startswith(("FLOAT4", "FLOAT6")):
        raise UnsupportedVariantError(
            f"{what} {name}: torch has no one-value-per-element {name.lower()} dtype (only packed "
            "float4_e2m1fn_x2), so the evaluator does not hold it; run the node on onnxruntime (kernels={...: 'ort'})"
        )
    return None


def storage(t: torch.Tensor) -> torch.Tensor:
    """The int8/uint8 byte view of a tagged 2/4-bit tensor (any other tensor unchanged)."""
    sub = _SUB_BYTE.get(t.dtype)
    return t if sub is None else t.view(sub[0])


def tag(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` (integers already in `dtype`'s range) as a tensor of `dtype`, tagged if it is a 2/4-bit type."""
    sub = _SUB_BYTE.get(dtype)
    if sub is None:
        return t.to(dtype)
    return t.to(sub[0]).contiguous().view(dtype)


def wrap_sub_byte(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integers (any integer dtype) to a 2/4-bit type by keeping the low bits, as ONNX's Cast does
    (two's complement for the signed ones): 200 -> int4 is -8."""
    store, bits = _SUB_BYTE[dtype]
    low = t.to(torch.int64) & ((1 << bits) - 1)
    if store == torch.int8:
        half = 1 << (bits - 1)
        low = torch.where(low >= half, low - (1 << bits), low)
    return tag(low, dtype)


def integer_range(dtype: torch.dtype) -> tuple[int, int] | None:
    """[lo, hi] of an integer quantization target (tagged 2/4-bit dtypes included), None for floats."""
    return _INTEGER_RANGES.get(dtype)


def float8_cast(x: torch.Tensor, dtype: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """A floating tensor rounded to a float8 dtype (round half to even) per ONNX's tables.

    saturate=True: +-Inf and values beyond the largest finite one become +-max (torch's own conversion gives
    NaN or Inf there, so the clamp comes first); NaN stays NaN. saturate=False: torch's conversion, which is
    ONNX's non-saturating table (e4m3fn and the fnuz types: NaN; e5m2: +-Inf), except that torch saturates
    finite e4m3fn overflow, corrected here."""
    if dtype == torch.float8_e8m0fnu:
        return to_e8m0(x, saturate)
    if x.dtype in _HALF or not x.is_floating_point():
        x = x.to(torch.float32)
    if saturate:
        big = torch.finfo(dtype).max
        return x.clamp(-big, big).to(dtype)
    if dtype == torch.float8_e4m3fn:
        # torch saturates finite e4m3fn overflow; ONNX wants NaN beyond the rounding midpoint 464 (a tie
        # there rounds to even, 448)
        x = torch.where(x.abs() > 464.0, torch.copysign(torch.full_like(x, float("nan")), x), x)
    return x.to(dtype)


def to_e8m0(x: torch.Tensor, saturate: bool, round_mode: str = "up") -> torch.Tensor:
    """float8e8m0 (a bare power-of-two exponent): onnx.numpy_helper.to_float8e8m0 on float32 bits."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    special = exponent == 0xFF
    if round_mode == "nearest":
        g = (bits & 0x400000) > 0
        r = (bits & 0x200000) > 0
        s = (bits & 0x1FFFFF) > 0
        up = g & (r | s | (exponent > 0))
    elif round_mode == "up":
        up = (mantissa > 0) & ~((exponent == 0) & (mantissa <= 0x400000))
    elif round_mode == "down":
        up = torch.zeros_like(special)
    else:
        raise UnsupportedVariantError(f"round_mode={round_mode!r}: valid values are 'up', 'down' and 'nearest'")
    if saturate:
        e = torch.where(up & (exponent < 254), exponent + 1, exponent)
    else:
        e = torch.where(up, exponent + 1, exponent)
    e = torch.where(special, torch.full_like(e, 0xFF), e)
    return e.to(torch.uint8).view(torch.float8_e8m0fnu)


def expand_param(value: torch.Tensor, shape: torch.Size, axis: int, block_size: int = 0) -> torch.Tensor:
    """A scale or zero point made broadcastable to `shape`: a scalar (or one element) as is, a 1-D tensor
    along `axis` (per-axis), or repeated `block_size` times along `axis` and cut to its length (blocked)."""
    if value.dim() == 0 or value.numel() == 1:
        return value.reshape(())
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    if not block_size:
        if value.dim() != 1 or value.numel() != shape[axis]:
            raise ValueError(
                f"a per-axis scale/zero point must be 1-D with {shape[axis]} elements (dim {axis} of the "
                f"input {tuple(shape)}); got shape {tuple(value.shape)} (blocked quantization needs block_size)"
            )
        dims = [1] * rank
        dims[axis] = value.numel()
        return value.reshape(dims)
    if block_size < 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size}")
    if value.dim() != rank:
        raise ValueError(f"a blocked scale/zero point has the input's rank {rank}; got shape {tuple(value.shape)}")
    out = storage(value).repeat_interleave(block_size, dim=axis).narrow(axis, 0, shape[axis])
    if tuple(out.shape) != tuple(shape):
        raise ValueError(
            f"blocked scale/zero point of shape {tuple(value.shape)} with block_size={block_size} along axis "
            f"{axis} does not cover the input {tuple(shape)}"
        )
    return out


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    axis: int = 1,
    block_size: int = 0,
    dtype: torch.dtype = torch.uint8,
    saturate: bool = True,
    precision: torch.dtype | None = None,
) -> torch.Tensor:
    """`saturate(round(x / scale) + zero_point)` to `dtype`, ONNX's QuantizeLinear.

    x / scale is computed in `precision`, else in the promotion of x's and scale's dtypes (as onnx.reference
    does), then rounded half to even; integer targets clamp to their range, float8 targets follow
    `float8_cast` (`saturate`). `dtype` is an integer dtype (2/4-bit ones tagged), or a float8 dtype."""
    s = expand_param(scale, x.shape, axis, block_size)
    compute = precision or torch.promote_types(x.dtype, s.dtype)
    y = x.to(compute) / s.to(compute)
    zp = None if zero_point is None else storage(expand_param(zero_point, x.shape, axis, block_size))
    if dtype in _FLOAT8:
        if zp is not None:
            # zero points of float8 targets are zero in practice; the spec's formula adds them all the same
            y = y + zp.to(compute)
        return float8_cast(y, dtype, saturate)
    bounds = _INTEGER_RANGES.get(dtype)
    if bounds is None:
        raise UnsupportedVariantError(f"QuantizeLinear to {dtype}: not a quantization type of the spec")
    # round in the division's type, then integers: exact for every zero point, float16's included
    q = torch.round(y).to(torch.float64).clamp_(-(2.0**40), 2.0**40).to(torch.int64)
    if zp is not None:
        q = q + zp.to(torch.int64)
    lo, hi = bounds
    return tag(q.clamp_(lo, hi), dtype)


def dequantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    axis: int = 1,
    block_size: int = 0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`(x - zero_point) * scale`, ONNX's DequantizeLinear: the difference exact, the product in float32
    (float64 when the scale is), rounded once to `dtype` (default: the scale's dtype)."""
    s = expand_param(scale, x.shape, axis, block_size)
    compute = torch.float64 if s.dtype == torch.float64 else torch.float32
    if x.dtype in _FLOAT8:
        dx = x.to(torch.float32).to(compute)
        if zero_point is not None:
            dx = dx - expand_param(zero_point, x.shape, axis, block_size).to(torch.float32).to(compute)
    else:
        xi = storage(x).to(torch.int64)
        if zero_point is not None:
            xi = xi - storage(expand_param(zero_point, x.shape, axis, block_size)).to(torch.int64)
        dx = xi.to(compute)
    return (dx * s.to(compute)).to(dtype or scale.dtype)


class _QuantizeBase(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))
        self.block_size = int(self.attr("block_size", 0))


@kernel("QuantizeLinear", since=10)
class QuantizeLinear(_QuantizeBase):
    """Output type: `output_dtype` (21+), else the zero point's, else uint8. Opset 10 is per-tensor
    uint8/int8, 13 adds `axis`, 19 float8 and `saturate`, 21 blocks, 4-bit and 16-bit types, 23
    `precision` and float4, 25 2-bit types: one kernel reads whichever attributes the node has."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.saturate = bool(self.attr("saturate", 1))
        out = int(self.attr("output_dtype", 0))
        self.output_dtype = _quant_dtype(out, "QuantizeLinear output_dtype") if out else None
        precision = int(self.attr("precision", 0))
        self.precision = ctx.torch_dtype(precision) if precision else None

    def run(
        self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        dtype = self.output_dtype or torch.uint8
        if zero_point is not None:
            if zero_point.is_floating_point() and zero_point.dtype not in _FLOAT8:
                if self.output_dtype is None:
                    raise UnsupportedVariantError(
                        f"QuantizeLinear: zero point of dtype {zero_point.dtype} (a float8 zero point promoted "
                        "by the float64 oracle?): its float8 type is lost; the quantization type must stay float8"
                    )
            else:
                dtype = zero_point.dtype
        return (quantize(x, scale, zero_point, self.axis, self.block_size, dtype, self.saturate, self.precision),)


def _quant_dtype(onnx_type: int, what: str) -> torch.dtype:
    low = low_precision_dtype(onnx_type, what)
    if low is not None:
        return low
    dt = _INTEGER_TARGETS.get(onnx_type)
    if dt is None:
        raise UnsupportedVariantError(f"{what} {TP.DataType.Name(onnx_type)}: not a quantization type")
    return dt


@kernel("DequantizeLinear", since=10)
class DequantizeLinear(_QuantizeBase):
    """Output type: the scale's, or `output_dtype` from opset 23. Same layouts as QuantizeLinear."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        out = int(self.attr("output_dtype", 0))
        self.output_dtype = ctx.torch_dtype(out) if out else None

    def run(
        self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        if x.dtype == torch.float8_e8m0fnu:
            raise UnsupportedVariantError("DequantizeLinear of float8e8m0: not a DequantizeLinear input type")
        return (dequantize(x, scale, zero_point, self.axis, self.block_size, self.output_dtype),)


@kernel("QuantizeLinear", since=13)
class QuantizeLinear13(QuantizeLinear):
    """Adds `axis` (per-axis)."""


@kernel("DequantizeLinear", since=13)
class DequantizeLinear13(DequantizeLinear):
    """Adds `axis` (per-axis)."""


@kernel("QuantizeLinear", since=19)
class QuantizeLinear19(QuantizeLinear):
    """Adds float8 targets and `saturate`."""


@kernel("DequantizeLinear", since=19)
class DequantizeLinear19(DequantizeLinear):
    """Adds float8 inputs, float16 scales."""


@kernel("QuantizeLinear", since=21)
class QuantizeLinear21(QuantizeLinear):
    """Adds `block_size`, `output_dtype`, int4/uint4/int16/uint16."""


@kernel("DequantizeLinear", since=21)
class DequantizeLinear21(DequantizeLinear):
    """Adds `block_size`, int4/uint4/int16/uint16."""


@kernel("QuantizeLinear", since=23)
class QuantizeLinear23(QuantizeLinear):
    """Adds `precision`, float4e2m1."""


@kernel("DequantizeLinear", since=23)
class DequantizeLinear23(DequantizeLinear):
    """Adds `output_dtype`, float4e2m1."""


@kernel("QuantizeLinear", since=24)
class QuantizeLinear24(QuantizeLinear):
    """Adds float8e8m0 scales."""


@kernel("DequantizeLinear", since=24)
class DequantizeLinear24(DequantizeLinear):
    """Adds float8e8m0 scales."""


@kernel("QuantizeLinear", since=25)
class QuantizeLinear25(QuantizeLinear):
    """Adds int2/uint2."""


@kernel("DequantizeLinear", since=25)
class DequantizeLinear25(DequantizeLinear):
    """Adds int2/uint2."""


def dynamic_quantize_uint8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x quantized to uint8 over its whole range, as DynamicQuantizeLinear (and onnxruntime's
    DynamicQuantizeMatMul) do: (y, scale, zero point), scale = (max(0, max x) - min(0, min x)) / 255 and
    zero point = round(clip(-min / scale)), in float32 (float64 for a float64 x); scale and zero point
    0-d, the scale in float32 or float64."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    zero = torch.zeros((), dtype=compute, device=x.device)
    hi = torch.maximum(zero, xf.max()) if xf.numel() else zero
    lo = torch.minimum(zero, xf.min()) if xf.numel() else zero
    # all zeros: scale 1.0, as onnxruntime (and the comment in onnx.reference, whose code gives 1/255)
    scale = torch.where(hi == lo, torch.ones_like(hi), (hi - lo) / 255.0)
    zp = torch.round((0.0 - lo / scale).clamp(0.0, 255.0))
    y = (torch.round(xf / scale) + zp).clamp(0.0, 255.0)
    return y.to(torch.uint8), scale, zp.to(torch.uint8)


@kernel("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Kernel):
    """uint8 with scale = (max(0, max x) - min(0, min x)) / 255 and zero point = round(clip(-min / scale)),
    in float32 as onnxruntime and onnx.reference compute it (float64 in the oracle)."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, scale, zp = dynamic_quantize_uint8(x)
        return y, scale.to(x.dtype), zp
