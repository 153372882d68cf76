"""Pooling kernels (ONNX's nn family): MaxPool (with Indices), AveragePool, LpPool, the global pools,
MaxUnpool, MaxRoiPool.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..object_detection import geometry_dtype
from .conv import Pads, auto_pad_attr, compute_type, spatial_pads, torch_pad

__all__ = [
    "AveragePool",
    "GlobalAveragePool",
    "GlobalLpPool",
    "GlobalMaxPool",
    "LpPool",
    "MaxPool",
    "MaxRoiPool",
    "MaxUnpool",
]

_MAX_POOL: dict[int, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    1: F.max_pool1d_with_indices,
    2: F.max_pool2d_with_indices,
    3: F.max_pool3d_with_indices,
}
_CONV: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class _Pool(Kernel):
    """The sliding-window geometry every ONNX pool shares: kernel_shape, strides, dilations, explicit
    pads or auto_pad, ceil_mode.

    One kernel per op serves every version: later versions only added attributes (whose defaults are the
    earlier behaviour) and types. The ceil_mode rule that a window starting in the right padding is
    dropped, written into the spec at opset 22, is what onnx.reference, onnxruntime and torch do for every
    version that has ceil_mode.
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        ks = self.attr("kernel_shape")
        if ks is None:
            raise ValueError(f"{self.op_type} needs the kernel_shape attribute")
        self.kernel_shape = [int(v) for v in ks]
        n = len(self.kernel_shape)
        self.strides = [int(v) for v in self.attr("strides", [1] * n)]
        self.dilations = [int(v) for v in self.attr("dilations", [1] * n)]
        self.auto_pad = auto_pad_attr(self)
        self.ceil_mode = int(self.attr("ceil_mode", 0))
        self.pads = self.attr("pads")

    def geometry(self, x: torch.Tensor) -> tuple[Pads, Pads]:
        """(the spec's pads, the pads to apply): the latter extends the end by the ceil_mode overhang,
        so that a plain floor-mode, unpadded torch pool yields exactly the spec's output shape."""
        in_shape = list(x.shape[2:])
        n = len(in_shape)
        if n != len(self.kernel_shape):
            raise ValueError(
                f"{self.op_type} kernel_shape={self.kernel_shape} for an input of {n} spatial axes"
            )
        pads = spatial_pads(self.auto_pad, self.pads, in_shape, self.kernel_shape, self.strides, self.dilations)
        if self.auto_pad != "NOTSET" or not self.ceil_mode:
            return pads, pads
        applied: Pads = []
        for i in range(n):
            (pb, pe), s = pads[i], self.strides[i]
            ek = (self.kernel_shape[i] - 1) * self.dilations[i] + 1
            out = -(-(in_shape[i] + pb + pe - ek) // s) + 1
            if (out - 1) * s >= in_shape[i] + pb:
                out -= 1  # the last window would start in the right padding
            applied.append((pb, max(pe, (out - 1) * s + ek - in_shape[i] - pb)))
        return pads, applied

    def sum_pool(self, x: torch.Tensor) -> torch.Tensor:
        """Window sums of an already padded tensor: a depthwise convolution with a kernel of ones, which
        honours dilations in 1-D to 3-D (torch's avg_pool has none)."""
        n = x.dim() - 2
        fn = _CONV.get(n)
        if fn is None:
            raise UnsupportedVariantError(f"{self.op_type} on a {n}-D spatial input: torch pools 1-D to 3-D only")
        ones = torch.ones(1, 1, *self.kernel_shape, dtype=x.dtype, device=x.device)
        flat = x.reshape(-1, 1, *x.shape[2:])
        y = fn(flat, ones, None, self.strides, 0, self.dilations)
        return y.reshape(*x.shape[:2], *y.shape[2:])


@kernel("MaxPool", since=1)
class MaxPool(_Pool):
    """Max over each window, padding never chosen (-inf); Indices flattened over the whole NC... tensor,
    the spatial part row-major or, with storage_order=1, column-major."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.storage_order = int(self.attr("storage_order", 0))
        self.want_indices = len(node.output) > 1 and bool(node.output[1])

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.dim() - 2
        fn = _MAX_POOL.get(n)
        if fn is None:
            raise UnsupportedVariantError(f"MaxPool on a {n}-D spatial input: torch pools 1-D to 3-D only")
        _, applied = self.geometry(x)
        # integer inputs (int8/uint8) are exact in float32, and -inf needs a float
        ct = compute_type(x) if x.is_floating_point() else torch.float32
        xp = F.pad(x.to(ct), torch_pad(applied), value=-math.inf)
        y, idx = fn(xp, self.kernel_shape, self.strides, 0, self.dilations, False, True)
        y = y.to(x.dtype)
        if not self.want_indices:
            return (y,)
        return (y, self._onnx_indices(idx, list(x.shape), list(xp.shape[2:]), applied))

    def _onnx_indices(
        self, idx: torch.Tensor, shape: Sequence[int], padded: Sequence[int], applied: Pads
    ) -> torch.Tensor:
        # torch's index is row-major within the padded plane: back to coordinates of the input
        coords = []
        rest = idx
        for size in reversed(padded):
            coords.append(rest % size)
            rest = rest // size
        coords.reverse()
        spatial = list(shape[2:])
        coords = [c - applied[i][0] for i, c in enumerate(coords)]
        order = range(len(spatial)) if self.storage_order == 0 else reversed(range(len(spatial)))
        flat = torch.zeros_like(idx)
        for i in order:
            flat = flat * spatial[i] + coords[i]
        plane = torch.arange(shape[0] * shape[1], device=idx.device, dtype=idx.dtype)
        plane = plane.reshape(shape[0], shape[1], *([1] * len(spatial))) * math.prod(spatial)
        return flat + plane


@kernel("AveragePool", since=1)
class AveragePool(_Pool):
    """Window sum over the count of elements taken: input only, or (count_include_pad=1) input and pads,
    never the ceil_mode overhang beyond the pads."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.count_include_pad = int(self.attr("count_include_pad", 0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pads, applied = self.geometry(x)
        ct = compute_type(x)
        total = self.sum_pool(F.pad(x.to(ct), torch_pad(applied)))
        ones = torch.ones(1, 1, *x.shape[2:], dtype=ct, device=x.device)
        if self.count_include_pad:
            ones = F.pad(ones, torch_pad(pads), value=1.0)
            mask = F.pad(ones, torch_pad([(0, a[1] - p[1]) for a, p in zip(applied, pads, strict=True)]))
        else:
            mask = F.pad(ones, torch_pad(applied))
        count = self.sum_pool(mask)
        return ((total / count).to(x.dtype),)


@kernel("LpPool", since=1)
class LpPool(_Pool):
    """(sum over the window of |x|^p)^(1/p), padding contributing zero. p is a float in LpPool-1 and an
    int from LpPool-2 on: read as a number either way."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.p = float(self.attr("p", 2))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _, applied = self.geometry(x)
        ct = compute_type(x)
        xc = x.to(ct)
        powered = xc * xc if self.p == 2 else torch.abs(xc) ** self.p
        total = self.sum_pool(F.pad(powered, torch_pad(applied)))
        y = torch.sqrt(total) if self.p == 2 else total ** (1.0 / self.p)
        return (y.to(x.dtype),)


def _spatial(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(2, x.dim()))


@kernel("GlobalAveragePool", since=1)
class GlobalAveragePool(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.mean(x.to(compute_type(x)), _spatial(x), keepdim=True).to(x.dtype),)


@kernel("GlobalMaxPool", since=1)
class GlobalMaxPool(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.amax(x, _spatial(x), keepdim=True),)


@kernel("GlobalLpPool", since=1)
class GlobalLpPool(Kernel):
    """(sum of |x|^p over the spatial axes)^(1/p); p float in version 1, int from 2 on."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.p = float(self.attr("p", 2))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xc = x.to(compute_type(x))
        total = torch.sum(torch.abs(xc) ** self.p, _spatial(x), keepdim=True)
        return ((total ** (1.0 / self.p)).to(x.dtype),)


@kernel("MaxUnpool", since=9)
class MaxUnpool(Kernel):
    """X scattered to the flat positions I (MaxPool's Indices, over the whole tensor) of zeros of the
    inferred shape ((in - 1) * stride + kernel - pads), then placed at the start of output_shape if given.

    That is the spec's own example (test_maxunpool_export_with_output_shape) and onnx.reference.
    onnxruntime (and torch's max_unpool) instead read I as positions in the output_shape tensor: the two
    agree whenever output_shape is the inferred shape, and we follow the spec where they do not.
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        ks = self.attr("kernel_shape")
        if ks is None:
            raise ValueError("MaxUnpool needs the kernel_shape attribute")
        self.kernel_shape = [int(v) for v in ks]
        n = len(self.kernel_shape)
        self.strides = [int(v) for v in self.attr("strides", [1] * n)]
        self.pads = spatial_pads("NOTSET", self.attr("pads"), [0] * n, self.kernel_shape, self.strides, [1] * n)

    def run(
        self, x: torch.Tensor, indices: torch.Tensor, output_shape: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        inferred = list(x.shape[:2]) + [
            (x.shape[2 + i] - 1) * s + k - pb - pe
            for i, (s, k, (pb, pe)) in enumerate(zip(self.strides, self.kernel_shape, self.pads, strict=True))
        ]
        out = torch.zeros(math.prod(inferred), dtype=x.dtype, device=x.device)
        out.scatter_(0, indices.reshape(-1).long(), x.reshape(-1))
        y = out.reshape(inferred)
        if output_shape is None:
            return (y,)
        shape = [int(v) for v in output_shape.tolist()]
        if len(shape) != len(inferred) or any(s < i for s, i in zip(shape, inferred, strict=True)):
            raise ValueError(
                f"MaxUnpool output_shape={shape} is smaller than the unpooled shape {inferred}"
            )
        return (F.pad(y, torch_pad([(0, s - i) for s, i in zip(shape[2:], inferred[2:], strict=True)])),)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's round(): halves away from zero (torch.round rounds them to even)."""
    return torch.sign(v) * torch.floor(torch.abs(v) + 0.5)


@kernel("MaxRoiPool", since=1)
class MaxRoiPool(Kernel):
    """Caffe's RoI max pooling: RoI corners scaled and rounded (halves away from zero), each of
    pooled_shape bins spans [floor(i * bin), ceil((i + 1) * bin)) clipped to the image, an empty bin is 0.
    The max is separable over a rectangle: first over each bin's columns, then its rows.
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        shape = self.attr("pooled_shape")
        if shape is None or len(shape) != 2:
            raise ValueError("MaxRoiPool needs pooled_shape=[height, width]")
        self.ph, self.pw = (int(v) for v in shape)
        self.scale = float(self.attr("spatial_scale", 1.0))

    def _bins(self, start: torch.Tensor, end: torch.Tensor, pooled: int, size: int) -> torch.Tensor:
        """(R, pooled, size) mask of the positions of each bin."""
        length = torch.clamp(end - start + 1, min=1)
        binsz = length / pooled
        i = torch.arange(pooled, device=start.device, dtype=start.dtype)
        lo = torch.clamp(torch.floor(i * binsz[:, None]) + start[:, None], 0, size)
        hi = torch.clamp(torch.ceil((i + 1) * binsz[:, None]) + start[:, None], 0, size)
        pos = torch.arange(size, device=start.device, dtype=start.dtype)
        return (pos >= lo[..., None]) & (pos < hi[..., None])

    def run(self, x: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _, _, height, width = x.shape
        # Which pixels a bin takes is a discrete choice that the float64 oracle must make as the float32
        # model does (geometry_dtype): 5 * 0.9f (the float32 attribute) is 4.5 in float32 and rounds to 5,
        # but 4.49999989 in float64 and rounds to 4 — a whole row apart.
        r = rois.to(geometry_dtype(rois, self.ctx))
        batch = r[:, 0].long()
        scale = torch.tensor(self.scale, dtype=r.dtype, device=r.device)
        x1, y1, x2, y2 = (_round_half_away(r[:, i] * scale) for i in range(1, 5))
        rows = self._bins(y1, y2, self.ph, height)  # (R, ph, H)
        cols = self._bins(x1, x2, self.pw, width)  # (R, pw, W)
        xb = x[batch]  # (R, C, H, W)
        neg = torch.tensor(-math.inf, dtype=xb.dtype, device=x.device)
        # max over each bin's columns: (R, C, H, pw), then over its rows: (R, C, ph, pw)
        by_col = torch.where(cols[:, None, None], xb[:, :, :, None, :], neg).amax(-1)
        y = torch.where(rows[:, None, :, :, None], by_col[:, :, None], neg).amax(3)
        empty = ~(rows.any(-1)[:, :, None] & cols.any(-1)[:, None, :])  # (R, ph, pw)
        return (torch.where(empty[:, None], torch.zeros_like(y), y),)
