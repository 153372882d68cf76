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
        if arr.dtype.name == "bfloat16":  # ml_dtypes
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
    if t.dtype == torch.bfloat16:
        bits = t.contiguous().view(torch.uint16).numpy() if hasattr(torch, "uint16") else t.contiguous().view(torch.int16).numpy().view(np.uint16)
        try:
            import ml_dtypes

            return bits.view(ml_dtypes.bfloat16)
        except ImportError:
            return bits
    return t.contiguous().numpy()


def from_onnx_tensor(proto: onnx.TensorProto) -> torch.Tensor:
    arr = onnx.numpy_helper.to_array(proto)
    if proto.data_type == onnx.TensorProto.BFLOAT16:
        bits = np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)  # 0-d stays 0-d
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
    return to_torch(np.array(arr, copy=True))
