"""Moving values between runtimes: numpy <-> torch <-> onnx TensorProto, bfloat16 included.

numpy has no bfloat16: such arrays travel as their uint16 bits (or ml_dtypes.bfloat16 when onnx gives one).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch

__all__ = ["from_onnx_tensor", "to_numpy", "to_torch"]


def to_torch(value: Any, device: str | torch.device | None = None) -> torch.Tensor:
    """A torch tensor from a tensor, numpy array (ml_dtypes bfloat16 too) or scalar, without a copy where possible."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        low = _LOW_PRECISION.get(arr.dtype.name)
        if low is not None:  # ml_dtypes float8 (bit for bit) or 2/4-bit (one value per byte, tagged)
            t = _low_precision_to_torch(arr, *low)
        elif arr.dtype.name == "bfloat16":  # ml_dtypes
            # ascontiguousarray makes 0-d arrays 1-d: give the scalar its shape back
            t = torch.from_numpy(np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)).view(torch.bfloat16)
        elif not arr.flags.writeable or not arr.flags.c_contiguous:
            t = torch.from_numpy(np.array(arr, copy=True, order="C"))
        else:
            t = torch.from_numpy(arr)
    elif isinstance(value, onnx.TensorProto):
        t = from_onnx_tensor(value)
    else:
        t = torch.as_tensor(value)
    if device is not None and t.device != torch.device(device):
        t = t.to(device)
    return t


def to_numpy(t: Any) -> np.ndarray:
    """A numpy array for onnxruntime; bfloat16 becomes ml_dtypes.bfloat16 when available, else its uint16 bits."""
    if isinstance(t, np.ndarray):
        return t
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    name = str(t.dtype).removeprefix("torch.")
    if name in _LOW_PRECISION_TORCH:
        import ml_dtypes

        np_name, byte = _LOW_PRECISION_TORCH[name]
        raw = t.contiguous().view(torch.uint8 if byte == "uint8" else torch.int8).numpy()
        return raw.view(getattr(ml_dtypes, np_name)) if name.startswith("float8") else raw.astype(getattr(ml_dtypes, np_name))
    if t.dtype == torch.bfloat16:
        bits = t.contiguous().view(torch.uint16).numpy() if hasattr(torch, "uint16") else t.contiguous().view(torch.int16).numpy().view(np.uint16)
        try:
            import ml_dtypes

            return bits.view(ml_dtypes.bfloat16)
        except ImportError:
            return bits
    return t.contiguous().numpy()


# ml_dtypes name -> (torch dtype name, byte storage): float8 bit for bit, 2/4-bit one value per byte
_LOW_PRECISION = {
    "float8_e4m3fn": ("float8_e4m3fn", "uint8"),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", "uint8"),
    "float8_e5m2": ("float8_e5m2", "uint8"),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", "uint8"),
    "float8_e8m0fnu": ("float8_e8m0fnu", "uint8"),
    "int4": ("int4", "int8"),
    "uint4": ("uint4", "uint8"),
    "int2": ("int2", "int8"),
    "uint2": ("uint2", "uint8"),
}
_LOW_PRECISION_TORCH = {torch_name: (np_name, byte) for np_name, (torch_name, byte) in _LOW_PRECISION.items()}


def _low_precision_to_torch(arr: np.ndarray, torch_name: str, byte: str) -> torch.Tensor:
    if torch_name.startswith("float8"):
        raw = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape).copy()
    else:
        raw = np.asarray(arr).astype(np.dtype(byte))  # the values, sign-extended, one per byte
    return torch.from_numpy(raw).view(getattr(torch, torch_name))


def from_onnx_tensor(proto: onnx.TensorProto) -> torch.Tensor:
    """A torch tensor of its own (writable, sharing no memory with `proto`) holding `proto`'s values, as
    `onnx.numpy_helper.to_array` decodes them: byte-aligned element types stored in `raw_data`, and
    float/double/int32/int64 stored in their `*_data` field, straight into torch (a model's constants are
    hundreds of small tensors: the numpy round trip was most of an evaluator's build); every other form
    (packed 2/4-bit types, the other `*_data` fields, external data, strings) through numpy."""
    code = proto.data_type
    dtype = _RAW_TORCH.get(code)
    if dtype is not None and proto.data_location != _EXTERNAL and _LITTLE:
        shape = proto.dims[:]  # a list: the quickest copy of a repeated field
        n = math.prod(shape)
        if proto.HasField("raw_data"):
            raw = proto.raw_data
            if len(raw) == n * dtype.itemsize and not proto.HasField("segment"):
                if not n:  # torch.frombuffer refuses an empty buffer
                    return torch.empty(shape, dtype=dtype)
                # the bytearray is the one copy: the tensor owns it, so nothing it shares can be written
                t = torch.frombuffer(bytearray(raw), dtype=dtype)
                return t if len(shape) == 1 else t.reshape(shape)
        elif code in _FIELD_TORCH:
            values = getattr(proto, _FIELD_TORCH[code])
            if len(values) == n and not proto.HasField("segment"):
                return torch.tensor(values, dtype=dtype).reshape(shape)
    return _from_onnx_tensor_via_numpy(proto)


def _from_onnx_tensor_via_numpy(proto: onnx.TensorProto) -> torch.Tensor:
    """Every form onnx stores a tensor in, through `onnx.numpy_helper.to_array` (the reference the fast
    paths of `from_onnx_tensor` match bit for bit)."""
    arr = onnx.numpy_helper.to_array(proto)
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        bits = np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)  # 0-d stays 0-d
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
    return to_torch(np.array(arr, copy=True))


_TP = onnx.TensorProto
# element types whose raw_data is one little-endian element after the other, as torch holds them
_RAW_TORCH: dict[int, torch.dtype] = {
    code: dt
    for code, name in (
        (_TP.FLOAT, "float32"), (_TP.DOUBLE, "float64"), (_TP.FLOAT16, "float16"), (_TP.BFLOAT16, "bfloat16"),
        (_TP.INT8, "int8"), (_TP.UINT8, "uint8"), (_TP.INT16, "int16"), (_TP.UINT16, "uint16"),
        (_TP.INT32, "int32"), (_TP.UINT32, "uint32"), (_TP.INT64, "int64"), (_TP.UINT64, "uint64"),
        (_TP.BOOL, "bool"), (_TP.COMPLEX64, "complex64"), (_TP.COMPLEX128, "complex128"),
        (_TP.FLOAT8E4M3FN, "float8_e4m3fn"), (_TP.FLOAT8E4M3FNUZ, "float8_e4m3fnuz"),
        (_TP.FLOAT8E5M2, "float8_e5m2"), (_TP.FLOAT8E5M2FNUZ, "float8_e5m2fnuz"), (_TP.FLOAT8E8M0, "float8_e8m0fnu"),
    )
    if isinstance(dt := getattr(torch, name, None), torch.dtype)
}
# element types whose `*_data` field holds the values themselves (the others pack or widen them)
_FIELD_TORCH: dict[int, str] = {_TP.FLOAT: "float_data", _TP.DOUBLE: "double_data", _TP.INT32: "int32_data", _TP.INT64: "int64_data"}
_EXTERNAL = _TP.EXTERNAL
_LITTLE = sys.byteorder == "little"  # raw_data is little-endian; a big-endian host goes through numpy
