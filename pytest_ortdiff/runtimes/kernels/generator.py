"""Generator kernels (ONNX's generator family): Constant, ConstantOfShape, Range, EyeLike, and the random
ops (RandomNormal/Uniform and their -Like forms, Bernoulli, Multinomial).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch

from ...numerics.dtypes import DType
from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    'Bernoulli', 'Constant', 'ConstantOfShape', 'EyeLike', 'Multinomial', 'RandomNormal',
    'RandomNormalLike', 'RandomUniform', 'RandomUniformLike', 'Range',
]


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
        ws, wl, wd = start.to(wide), limit.to(wide), delta.to(wide)
        n = max(math.ceil(float((wl - ws) / wd)), 0)
        y = torch.arange(n, dtype=wide, device=start.device) * wd + ws
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


_FLOAT = onnx.TensorProto.FLOAT


_INT64 = onnx.TensorProto.INT64
_KNOWN_TYPES = frozenset(d.value for d in DType)  # the element types a Constant may hold


@kernel("Constant", since=1)
class Constant(Kernel):
    """The value is built once, on the device and promoted in oracle mode; `run` hands out that tensor."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.value = self._build(ctx)

    def _build(self, ctx: KernelContext) -> torch.Tensor:
        attrs = self.attrs
        if "value" in attrs:
            proto: onnx.TensorProto = attrs["value"]
            if proto.data_type not in _KNOWN_TYPES:
                name = onnx.TensorProto.DataType.Name(proto.data_type)
                raise UnsupportedVariantError(f"Constant of element type {name}")
            return ctx.tensor(proto)
        if "value_float" in attrs:
            return ctx.tensor(np.float32(attrs["value_float"]), _FLOAT)
        if "value_floats" in attrs:
            return ctx.tensor(np.asarray(attrs["value_floats"], dtype=np.float32), _FLOAT)
        if "value_int" in attrs:
            return ctx.tensor(np.int64(attrs["value_int"]), _INT64)
        if "value_ints" in attrs:
            return ctx.tensor(np.asarray(attrs["value_ints"], dtype=np.int64), _INT64)
        for refused in ("value_string", "value_strings", "sparse_value"):
            if refused in attrs:
                raise UnsupportedVariantError(
                    f"Constant with {refused}: strings and sparse tensors are not torch tensors here"
                )
        raise ValueError(f"Constant node {self.node.name!r} has no value attribute")

    def for_context(self, ctx: KernelContext) -> Constant | None:
        # the value as decoded, promoted as `ctx.tensor` promotes it (a TorchScript export holds hundreds
        # of constants: decoding them again was most of a float64 twin's build)
        if ctx.device != self.ctx.device or self.ctx.compute_dtype not in (None, ctx.compute_dtype):
            return None
        twin = Constant.__new__(Constant)
        twin.node, twin.ctx, twin.attrs = self.node, ctx, dict(self.attrs)
        value = self.value
        if ctx.compute_dtype is not None and value.is_floating_point() and value.element_size() >= 2:
            value = value.to(ctx.compute_dtype)
        twin.value = value
        return twin

    def run(self) -> tuple[torch.Tensor, ...]:
        return (self.value,)


# -- random ops ------------------------------------------------------------------------------------
# Their values come from torch's generator: they honour shape, dtype, the distribution and the `seed`
# attribute (the same seed gives the same values run after run), but can never equal another runtime's
# draws. Without a seed they draw from torch's global generator, as the spec leaves it to the runtime.


class _Random(Kernel):
    """Shared by the random ops: the output dtype (`dtype` attribute, else `default`) and the generator."""

    default_dtype: int | None = onnx.TensorProto.FLOAT

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        dt = self.attr("dtype", self.default_dtype)
        self.onnx_dtype: int | None = None if dt is None else int(dt)
        seed = self.attr("seed")
        self.seed: int | None = None if seed is None else int(seed)

    def out_dtype(self, like: torch.Tensor | None = None) -> torch.dtype:
        if self.onnx_dtype is not None:
            return self.ctx.torch_dtype(self.onnx_dtype)
        assert like is not None
        return like.dtype

    def generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        g = torch.Generator(device=self.ctx.device)
        g.manual_seed(self.seed)
        return g

    def _draw(self, shape: tuple[int, ...], dtype: torch.dtype, normal: bool) -> torch.Tensor:
        # drawn in float64 (or float32) and cast: torch has no half-precision sampling on every device
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        out = torch.empty(shape, dtype=wide, device=self.ctx.device)
        if normal:
            out.normal_(float(self.attr("mean", 0.0)), float(self.attr("scale", 1.0)), generator=self.generator())
        else:
            out.uniform_(float(self.attr("low", 0.0)), float(self.attr("high", 1.0)), generator=self.generator())
        return out.to(dtype)


@kernel("RandomNormal", since=1)
class RandomNormal(_Random):
    def run(self) -> tuple[torch.Tensor, ...]:
        return (self._draw(tuple(int(d) for d in self.attr("shape")), self.out_dtype(), normal=True),)


@kernel("RandomUniform", since=1)
class RandomUniform(_Random):
    def run(self) -> tuple[torch.Tensor, ...]:
        return (self._draw(tuple(int(d) for d in self.attr("shape")), self.out_dtype(), normal=False),)


@kernel("RandomNormalLike", since=1)
class RandomNormalLike(_Random):
    default_dtype = None

    def run(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self._draw(tuple(like.shape), self.out_dtype(like), normal=True),)


@kernel("RandomUniformLike", since=1)
class RandomUniformLike(_Random):
    default_dtype = None

    def run(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self._draw(tuple(like.shape), self.out_dtype(like), normal=False),)


@kernel("Bernoulli", since=15)
class Bernoulli(_Random):
    """1 with probability p (the input), else 0, in `dtype` (default the input's)."""

    default_dtype = None

    def run(self, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        wide = p.double() if p.dtype == torch.float64 else p.float()
        return (torch.bernoulli(wide, generator=self.generator()).to(self.out_dtype(p)),)


@kernel("Multinomial", since=7)
class Multinomial(_Random):
    """`sample_size` class indices per batch row, drawn from the softmax of the unnormalized log-probabilities."""

    default_dtype = onnx.TensorProto.INT32

    def run(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = int(self.attr("sample_size", 1))
        probs = torch.softmax(logits.double(), dim=-1)
        idx = torch.multinomial(probs, n, replacement=True, generator=self.generator())
        return (idx.to(self.out_dtype()),)
