"""Linear-algebra kernels (ONNX's math family): Det."""

from __future__ import annotations

import torch

from ..base import Kernel, kernel

__all__ = ["Det"]

_DET_TYPES = (torch.float32, torch.float64)


@kernel("Det", since=11)
class Det(Kernel):
    """Determinant of the trailing square matrices of X ([*, M, M] -> [*]); half types through float32."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"Det takes [*, M, M] matrices; got shape {list(x.shape)}")
        if x.dtype in _DET_TYPES:
            return (torch.linalg.det(x),)
        return (torch.linalg.det(x.float()).to(x.dtype),)
