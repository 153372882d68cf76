"""Generator torch kernels: values made from shapes and scalars (Shape, Size, ConstantOfShape, Range,
EyeLike, the Hann/Hamming/Blackman windows). Floats they create go through `ctx.torch_dtype`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch

from ...dtypes import DType
from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "BlackmanWindow",
    "ConstantOfShape",
    "EyeLike",
    "HammingWindow",
    "HannWindow",
    "Range",
    "Shape",
    "Shape15",
    "Size",
]


@kernel("Shape", since=1)
class Shape(Kernel):
    """The input's shape as a 1-D int64 tensor on the device."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.tensor(x.shape, dtype=torch.int64, device=x.device),)


@kernel("Shape", since=15)
class Shape15(Kernel):
    """Opset 15+: `start`/`end` slice the shape (negative from the back, clamped to [0, rank])."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.start = int(self.attr("start", 0))
        end = self.attr("end")
        self.end = None if end is None else int(end)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dims = x.shape[self.start : self.end]  # Python slicing clamps exactly as the spec says
        return (torch.tensor(dims, dtype=torch.int64, device=x.device),)


@kernel("Size", since=1)
class Size(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.tensor(x.numel(), dtype=torch.int64, device=x.device),)


@kernel("ConstantOfShape", since=9)
class ConstantOfShape(Kernel):
    """`value` (a one-element tensor, default float32 0) filled into the shape given by the input."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        proto = self.attrs.get("value")
        if proto is None:
            value = ctx.tensor(np.zeros((), dtype=np.float32))
        else:
            try:
                DType(proto.data_type)
            except ValueError:
                name = onnx.TensorProto.DataType.Name(proto.data_type)
                raise UnsupportedVariantError(f"ConstantOfShape of element type {name}") from None
            value = ctx.tensor(proto)
        self.dtype = value.dtype
        self.fill = value.reshape(-1)[0].item()

    def run(self, shape: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.full(shape.tolist(), self.fill, dtype=self.dtype, device=self.ctx.device),)


@kernel("Range", since=11)
class Range(Kernel):
    """output[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0), in the inputs' type;
    float16/bfloat16 (opset 27+) computed in the stash type, float32, and rounded once."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        stash = int(self.attr("stash_type", onnx.TensorProto.FLOAT))
        if stash not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            raise UnsupportedVariantError(f"Range with stash_type={stash}: FLOAT or DOUBLE")
        self.stash = ctx.torch_dtype(stash)

    def run(
        self, start: torch.Tensor, limit: torch.Tensor, delta: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        dtype = start.dtype
        if not dtype.is_floating_point:
            s, lim, d = int(start), int(limit), int(delta)
            n = max(-((s - lim) // d), 0)  # integer ceil division
            return (torch.arange(n, dtype=dtype, device=start.device) * d + s,)
        wide = self.stash if dtype in (torch.float16, torch.bfloat16) else dtype
        s, lim, d = start.to(wide), limit.to(wide), delta.to(wide)
        n = max(math.ceil(float((lim - s) / d)), 0)
        y = torch.arange(n, dtype=wide, device=start.device) * d + s
        return (y if y.dtype == dtype else y.to(dtype),)


@kernel("EyeLike", since=9)
class EyeLike(Kernel):
    """Ones on diagonal `k` of a matrix shaped like the input, of `dtype` (default: the input's)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.k = int(self.attr("k", 0))
        dtype = self.attr("dtype")
        self.dtype = None if dtype is None else ctx.torch_dtype(int(dtype))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.zeros(x.shape, dtype=self.dtype or x.dtype, device=x.device)
        if -x.shape[0] < self.k < x.shape[1]:
            y.diagonal(self.k).fill_(1)
        return (y,)


class _Window(Kernel):
    """A window of `size` points, computed in float64 and cast to `output_datatype` (default float)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.periodic = bool(self.attr("periodic", 1))
        self.dtype = ctx.torch_dtype(int(self.attr("output_datatype", onnx.TensorProto.FLOAT)))

    def run(self, size: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = int(size)
        period = n if self.periodic else n - 1
        phase = torch.arange(n, dtype=torch.float64, device=self.ctx.device) * (2 * math.pi / period)
        return (self.window(phase).to(self.dtype),)

    def window(self, phase: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@kernel("HannWindow", since=17)
class HannWindow(_Window):
    def window(self, phase: torch.Tensor) -> torch.Tensor:
        return 0.5 - 0.5 * torch.cos(phase)


@kernel("HammingWindow", since=17)
class HammingWindow(_Window):
    """alpha = 25/46 (not torch's 0.54), beta = 1 - alpha."""

    def window(self, phase: torch.Tensor) -> torch.Tensor:
        alpha = 25.0 / 46.0
        return alpha - (1.0 - alpha) * torch.cos(phase)


@kernel("BlackmanWindow", since=17)
class BlackmanWindow(_Window):
    def window(self, phase: torch.Tensor) -> torch.Tensor:
        return 0.42 - 0.5 * torch.cos(phase) + 0.08 * torch.cos(2 * phase)
