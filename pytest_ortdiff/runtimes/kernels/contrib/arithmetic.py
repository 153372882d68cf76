"""The precision onnxruntime's contrib kernels are computed in here: float32 for 16-bit inputs (rounded once,
at the end), the inputs' own widest float otherwise (float64 in the oracle); attribute defaults as float32."""

from __future__ import annotations

import torch

__all__ = ["f32", "wide_dtype"]


def wide_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32 for 16-bit floats, else the widest of the floating tensors' dtypes (float64 in the oracle,
    where every floating input is float64): the fused subgraph's value without its intermediate roundings."""
    out = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            out = torch.promote_types(out, t.dtype)
    return out


def f32(value: float) -> float:
    """`value` as a float32 attribute holds it: a default must be what a written attribute reads."""
    return float(torch.tensor(value, dtype=torch.float32).item())
