"""Moving values between runtimes: numpy <-> torch <-> onnx TensorProto, bfloat16 included.

numpy has no bfloat16: such arrays travel as their uint16 bits (or ml_dtypes.bfloat16 when onnx gives one).
"""

from __future__ import annotations

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
    arr = onnx.numpy_helper.to_array(proto)
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        bits = np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)  # 0-d stays 0-d
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
    return to_torch(np.array(arr, copy=True))
