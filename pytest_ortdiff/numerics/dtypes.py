"""Element types: onnx <-> torch <-> numpy maps, per-dtype eps/max/tiny and default tolerances.

Importing this module does not import torch: the plugin validates `--ort-dtypes` with it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["DType", "dtype_of", "parse_dtype"]


class DType(enum.Enum):
    """An element type with the facts the diff needs (value: the onnx TensorProto code)."""

    FLOAT32 = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 9
    FLOAT16 = 10
    FLOAT64 = 11
    UINT32 = 12
    UINT64 = 13
    BFLOAT16 = 16

    # -- names -------------------------------------------------------------------------------
    @property
    def short(self) -> str:
        """The name users type: float32, float16, bfloat16, int64, ..."""
        return _SHORT[self]

    @property
    def onnx(self) -> int:
        return self.value

    @property
    def torch(self) -> torch.dtype:
        import torch

        dt: torch.dtype = getattr(torch, _TORCH_NAME[self])
        return dt

    @property
    def numpy(self) -> np.dtype[Any]:
        """numpy dtype; bfloat16 has none in numpy and maps to uint16 (its bits)."""
        import numpy as np

        return np.dtype(_NUMPY_NAME[self])

    # -- facts -------------------------------------------------------------------------------
    @property
    def is_floating_point(self) -> bool:
        return self in _FLOATS

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def mantissa_bits(self) -> int:
        return _FLOAT_FACTS[self][0]

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next representable value."""
        return 2.0 ** -self.mantissa_bits

    @property
    def max(self) -> float:
        return _FLOAT_FACTS[self][1]

    @property
    def tiny(self) -> float:
        """Smallest positive normal number (denominator floor of the relative error)."""
        return _FLOAT_FACTS[self][2]

    @property
    def default_atol(self) -> float:
        return _DEFAULT_TOL[self][0]

    @property
    def default_rtol(self) -> float:
        return _DEFAULT_TOL[self][1]

    def __str__(self) -> str:
        return self.short


_SHORT = {
    DType.FLOAT32: "float32",
    DType.FLOAT16: "float16",
    DType.BFLOAT16: "bfloat16",
    DType.FLOAT64: "float64",
    DType.UINT8: "uint8",
    DType.INT8: "int8",
    DType.UINT16: "uint16",
    DType.INT16: "int16",
    DType.INT32: "int32",
    DType.INT64: "int64",
    DType.UINT32: "uint32",
    DType.UINT64: "uint64",
    DType.BOOL: "bool",
}
_TORCH_NAME = dict(_SHORT)
_NUMPY_NAME = {**_SHORT, DType.BFLOAT16: "uint16"}
_FLOATS = frozenset({DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64})
_ITEMSIZE = {
    DType.FLOAT32: 4,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.FLOAT64: 8,
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.UINT16: 2,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.UINT32: 4,
    DType.UINT64: 8,
    DType.BOOL: 1,
}
# mantissa bits, max, smallest normal
_FLOAT_FACTS = {
    DType.FLOAT64: (52, 1.7976931348623157e308, 2.2250738585072014e-308),
    DType.FLOAT32: (23, 3.4028234663852886e38, 1.1754943508222875e-38),
    DType.FLOAT16: (10, 65504.0, 6.103515625e-05),
    DType.BFLOAT16: (7, 3.3895313892515355e38, 1.1754943508222875e-38),
}
# (atol, rtol) used when a test states no tolerance. They are for comparing two *different*
# implementations (reduction order, fused kernels, fp32 accumulation), hence looser than
# torch.testing's same-implementation defaults.
_DEFAULT_TOL = {
    DType.FLOAT64: (1e-7, 1e-7),
    DType.FLOAT32: (1e-4, 1e-4),
    DType.FLOAT16: (1e-2, 1e-2),
    DType.BFLOAT16: (5e-2, 5e-2),
}
for _dt in DType:
    _DEFAULT_TOL.setdefault(_dt, (0.0, 0.0))

_BY_NAME: dict[str, DType] = {}
for _dt in DType:
    _BY_NAME[_dt.short] = _dt
_BY_NAME.update(
    {
        "float": DType.FLOAT32,
        "fp32": DType.FLOAT32,
        "half": DType.FLOAT16,
        "fp16": DType.FLOAT16,
        "bf16": DType.BFLOAT16,
        "double": DType.FLOAT64,
        "fp64": DType.FLOAT64,
    }
)

#: the dtypes `--ort-dtypes` accepts
TESTABLE = ("float32", "float16", "bfloat16", "float64")


def parse_dtype(name: str) -> DType:
    """A dtype from a user's name (`float16`, `fp16`, `bfloat16`, ...); ValueError lists the valid ones."""
    key = name.strip().lower()
    if key.startswith("tensorproto."):
        key = key.split(".", 1)[1]
    if key in _BY_NAME:
        return _BY_NAME[key]
    if key.upper() in DType.__members__:
        return DType[key.upper()]
    raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(TESTABLE)} (and {', '.join(sorted(set(_SHORT.values()) - set(TESTABLE)))})")


def dtype_of(value: Any) -> DType:
    """The DType of a name, an onnx TensorProto code, a torch dtype, a numpy dtype, or a tensor/array."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        return parse_dtype(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DType(value)
        except ValueError:
            raise ValueError(f"onnx element type {value} is not supported; supported: {sorted(d.value for d in DType)}") from None
    if isinstance(value, type) and value.__module__ == "numpy":
        import numpy as np  # only here: the plugin imports this module and stays light

        if issubclass(value, np.generic):
            value = np.dtype(value)  # np.float16, as numpy itself accepts it for a dtype
    dt = getattr(value, "dtype", value)
    text = str(dt)
    if text.startswith("torch."):
        return parse_dtype(text[len("torch.") :])
    if text == "bfloat16":  # ml_dtypes
        return DType.BFLOAT16
    try:
        return parse_dtype(text)
    except ValueError:
        raise ValueError(f"cannot tell the element type of {type(value).__name__} with dtype {text!r}") from None
