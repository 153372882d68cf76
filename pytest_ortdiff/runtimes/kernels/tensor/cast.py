"""Cast kernels (ONNX's tensor family): Cast, CastLike and BitCast, float8 and 2/4-bit types included.

float8 tensors are torch's float8 dtypes; int4/uint4/int2/uint2 are one value per byte tagged with torch's
shell dtypes (see kernels/quantization.py, which owns that representation and the float8 rounding).
"""

from __future__ import annotations

import onnx
import torch

from ....numerics.dtypes import DType
from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..quantization import (
    FLOAT8_TYPES,
    SUB_BYTE_TYPES,
    float8_cast,
    low_precision_dtype,
    storage,
    to_e8m0,
    wrap_sub_byte,
)

__all__ = ["BitCast", "Cast", "Cast19", "Cast21", "Cast23", "Cast24", "Cast25", "CastLike", "CastLike19", "cast"]

_FLOAT8 = frozenset(FLOAT8_TYPES.values())
_SUB_BYTE = frozenset(SUB_BYTE_TYPES.values())
_ROUND_MODES = ("up", "down", "nearest")


def _type_name(to: int) -> str:
    return onnx.TensorProto.DataType.Name(to) if to in onnx.TensorProto.DataType.values() else str(to)


def _cast_target(to: int, ctx: KernelContext, what: str = "Cast to") -> torch.dtype:
    low = low_precision_dtype(to, what)
    if low is not None:
        # float8 stays float8 in the oracle too: its rounding is the model's arithmetic, as an int8's is
        return low
    try:
        DType(to)
    except ValueError:
        name = _type_name(to)
        why = "strings are not tensors in torch" if name == "STRING" else "torch has no arithmetic for it here"
        raise UnsupportedVariantError(f"{what} {name}: {why}") from None
    # Float targets go through the context, so that in oracle mode a Cast to float16 stays float64.
    return ctx.torch_dtype(to)


def cast(x: torch.Tensor, to: torch.dtype, saturate: bool = True, round_mode: str = "up") -> torch.Tensor:
    """ONNX's Cast of `x` to `to`: float -> int truncates toward zero, float -> bool is `!= 0`, integers
    wrap, float8 targets round half to even with `saturate`, float8e8m0 follows `round_mode`, 2/4-bit
    targets keep the low bits of the truncated value (as ml_dtypes and onnx.reference do)."""
    if x.dtype == to:
        return x
    src = storage(x)
    if src.dtype in _FLOAT8:
        src = src.to(torch.float32)  # exact: every float8 value is a float32
    if to == torch.float8_e8m0fnu:
        return to_e8m0(src, saturate, round_mode)
    if to in _FLOAT8:
        return float8_cast(src, to, saturate)
    if to in _SUB_BYTE:
        if src.is_floating_point():
            src = src.to(torch.float64).trunc().nan_to_num(0.0).clamp(-(2.0**62), 2.0**62)
        return wrap_sub_byte(src.to(torch.int64), to)
    return src.to(to)


class _CastBase(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.saturate = bool(self.attr("saturate", 1))
        self.round_mode = str(self.attr("round_mode", "up"))
        if self.round_mode not in _ROUND_MODES:
            raise UnsupportedVariantError(f"{node.op_type} round_mode={self.round_mode!r}: valid values are {', '.join(_ROUND_MODES)}")


@kernel("Cast", since=6)
class Cast(_CastBase):
    """torch's `.to` for the ordinary types (it truncates toward zero and tests `!= 0` for bool, as ONNX says);
    float8 and 2/4-bit targets through `cast`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.to = _cast_target(int(self.attr("to")), ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (cast(x, self.to, self.saturate, self.round_mode),)


@kernel("Cast", since=19)
class Cast19(Cast):
    """Adds float8 types and `saturate`."""


@kernel("Cast", since=21)
class Cast21(Cast):
    """Adds int4/uint4."""


@kernel("Cast", since=23)
class Cast23(Cast):
    """Adds float4e2m1 (refused by name: torch has no unpacked float4)."""


@kernel("Cast", since=24)
class Cast24(Cast):
    """Adds float8e8m0 and its `round_mode`."""


@kernel("Cast", since=25)
class Cast25(Cast):
    """Adds int2/uint2."""


@kernel("CastLike", since=15)
class CastLike(_CastBase):
    """Cast to the second input's dtype (float64 in oracle mode, where every float is); `saturate` and
    `round_mode` (19+, 24+) as Cast's."""

    def run(self, x: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (cast(x, like.dtype, self.saturate, self.round_mode),)


@kernel("CastLike", since=19)
class CastLike19(CastLike):
    """Adds float8 types and `saturate` (later versions only add types and `round_mode`)."""




@kernel("BitCast", since=26)
class BitCast(Kernel):
    """Reinterprets the bits (`Tensor.view`) as the `to` type of the same width: shape unchanged."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        to = int(self.attr("to"))
        low = low_precision_dtype(to, "BitCast to")
        if low is not None:
            self.to = low
        elif to == onnx.TensorProto.BOOL:
            self.to = torch.bool
        elif to in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            self.to = torch.complex64 if to == onnx.TensorProto.COMPLEX64 else torch.complex128
        else:
            try:
                self.to = DType(to).torch
            except ValueError:
                raise UnsupportedVariantError(f"BitCast to {_type_name(to)}: not a tensor type torch holds") from None

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dtype in _SUB_BYTE or self.to in _SUB_BYTE:
            if not (x.dtype in _SUB_BYTE and self.to in _SUB_BYTE and x.dtype.itemsize == self.to.itemsize
                    and _width(x.dtype) == _width(self.to)):
                raise UnsupportedVariantError(f"BitCast from {x.dtype} to {self.to}: not the same bit width")
            return (wrap_sub_byte(storage(x), self.to),)
        if x.dtype.itemsize != self.to.itemsize:
            raise UnsupportedVariantError(
                f"BitCast from {str(x.dtype).removeprefix('torch.')} to {str(self.to).removeprefix('torch.')}: "
                "not the same bit width (in the float64 oracle, a promoted float input has lost its bits)"
            )
        return (x.contiguous().view(self.to),)


def _width(dtype: torch.dtype) -> int:
    return 4 if dtype in (SUB_BYTE_TYPES[onnx.TensorProto.INT4], SUB_BYTE_TYPES[onnx.TensorProto.UINT4]) else 2
