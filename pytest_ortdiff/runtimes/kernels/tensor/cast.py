"""Cast kernels (ONNX's tensor family): Cast and CastLike.
"""

from __future__ import annotations

import onnx
import torch

from ....dtypes import DType
from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['Cast', 'Cast19', 'CastLike']


@kernel("CastLike", since=15)
class CastLike(Kernel):
    """Cast to the second input's dtype (float64 in oracle mode, where every float is); `saturate` is float8's."""

    def run(self, x: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.to(like.dtype),)


def _cast_target(to: int, ctx: KernelContext) -> torch.dtype:
    try:
        DType(to)
    except ValueError:
        name = (
            onnx.TensorProto.DataType.Name(to)
            if to in onnx.TensorProto.DataType.values()
            else str(to)
        )
        if name.startswith("FLOAT8"):
            why = "float8 rounding and `saturate` are not implemented by these kernels"
        elif name == "STRING":
            why = "strings are not tensors in torch"
        else:
            why = "torch has no arithmetic for it here"
        raise UnsupportedVariantError(f"Cast to {name}: {why}") from None
    # Float targets go through the context, so that in oracle mode a Cast to float16 stays float64.
    return ctx.torch_dtype(to)


@kernel("Cast", since=6)
class Cast(Kernel):
    """float -> int truncates toward zero and float -> bool is `!= 0`: torch's `.to` does both, as ONNX says."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.to = _cast_target(int(self.attr("to")), ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.to(self.to),)


@kernel("Cast", since=19)
class Cast19(Cast):
    """Opset 19 adds `saturate`, which only affects float8 targets, and those Cast refuses."""
