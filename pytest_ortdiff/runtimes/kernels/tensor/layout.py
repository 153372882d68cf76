"""Layout kernels (ONNX's tensor family): Split, Tile, Pad, DepthToSpace, SpaceToDepth, CenterCropPad.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['CenterCropPad', 'DepthToSpace', 'Pad', 'Pad11', 'SpaceToDepth', 'Split', 'Split13', 'Split18', 'Tile']


def _split(x: torch.Tensor, axis: int, sizes: list[int] | None, parts: int) -> tuple[torch.Tensor, ...]:
    if sizes is None:
        dim = x.shape[axis]
        # the last chunk is the smaller one when the dim does not divide (opset 18's num_outputs)
        chunk = -(-dim // parts)
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    return tuple(x.split_with_sizes(sizes, axis))  # what torch.split calls, past its two Python layers


@kernel("Split", since=2)
class Split(Kernel):
    """Opsets 2-12: sizes in the optional `split` attribute, else equal parts, one per output."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))
        split = self.attr("split")
        self.sizes = None if split is None else [int(s) for s in split]

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _split(x, self.axis, self.sizes, len(self.node.output))


@kernel("Split", since=13)
class Split13(Kernel):
    """Opset 13+: sizes in the optional second input; opset 18 adds `num_outputs`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))
        self.parts = int(self.attr("num_outputs", len(node.output)))

    def run(self, x: torch.Tensor, split: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return _split(x, self.axis, None if split is None else split.tolist(), self.parts)


@kernel("Split", since=18)
class Split18(Split13):
    """Opset 18: `num_outputs` splits unevenly, the last chunk smaller."""


@kernel("Tile", since=6)
class Tile(Kernel):
    def run(self, x: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.repeat(repeats.tolist()),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1} or static[1] is None:
            return None
        return methodcaller("repeat", static[1].tolist())


def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """For each output position along an axis, the input position it copies (reflect/edge/wrap)."""
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge" or (mode == "reflect" and n == 1):
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(i, n)
    period = 2 * (n - 1)
    j = torch.remainder(i, period)
    return torch.where(j >= n, period - j, j)


class _PadBase(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.mode = self.attr("mode", "constant")
        if self.mode not in ("constant", "reflect", "edge", "wrap"):
            raise UnsupportedVariantError(f"Pad with mode={self.mode!r}")

    def pad(
        self, x: torch.Tensor, pads: list[int], axes: list[int], value: torch.Tensor | float | None
    ) -> torch.Tensor:
        rank = x.dim()
        n = len(axes)
        before = dict.fromkeys(range(rank), 0)
        after = dict.fromkeys(range(rank), 0)
        for k, a in enumerate(axes):
            a = a + rank if a < 0 else a
            before[a], after[a] = pads[k], pads[k + n]
        if self.mode == "constant":
            flat: list[int] = []
            for a in reversed(range(rank)):
                flat += [before[a], after[a]]
            fill = 0 if value is None else (value.item() if isinstance(value, torch.Tensor) else value)
            return F.pad(x, flat, value=fill) if any(flat) else x
        for a in range(rank):
            if before[a] or after[a]:
                idx = _pad_index(x.shape[a], before[a], after[a], self.mode, x.device)
                x = x.index_select(a, idx)
        return x


@kernel("Pad", since=2)
class Pad(_PadBase):
    """Opsets 2-10: `pads` and `value` attributes; modes constant, reflect, edge."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.pads = [int(p) for p in self.attr("pads")]
        self.value = float(self.attr("value", 0.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.pad(x, self.pads, list(range(x.dim())), self.value),)


@kernel("Pad", since=11)
class Pad11(_PadBase):
    """Opset 11+: pads, constant_value and (18+) axes are inputs; 19 adds mode "wrap"; negative pads crop."""

    def run(
        self,
        x: torch.Tensor,
        pads: torch.Tensor,
        value: torch.Tensor | None = None,
        axes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        dims = list(range(x.dim())) if axes is None else axes.tolist()
        return (self.pad(x, pads.tolist(), dims, value),)


@kernel("DepthToSpace", since=1)
class DepthToSpace(Kernel):
    """Mode DCR (depth-column-row, the default and opset 1's only) or CRD (opset 11+)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.bs = int(self.attr("blocksize"))
        self.mode = self.attr("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise UnsupportedVariantError(f"DepthToSpace with mode={self.mode!r}")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, c, h, w = x.shape
        bs = self.bs
        if self.mode == "DCR":
            y = x.reshape(b, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(b, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
        return (y.reshape(b, c // (bs * bs), h * bs, w * bs),)


@kernel("SpaceToDepth", since=1)
class SpaceToDepth(Kernel):
    """The inverse of DepthToSpace; opset 28 adds `mode` (DCR, the former behaviour, or CRD)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.bs = int(self.attr("blocksize"))
        self.mode = self.attr("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise UnsupportedVariantError(f"SpaceToDepth with mode={self.mode!r}")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, c, h, w = x.shape
        bs = self.bs
        y = x.reshape(b, c, h // bs, bs, w // bs, bs)
        perm = (0, 3, 5, 1, 2, 4) if self.mode == "DCR" else (0, 1, 3, 5, 2, 4)
        return (y.permute(perm).reshape(b, c * bs * bs, h // bs, w // bs),)


@kernel("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    """Each listed axis cropped or zero-padded to the target size, centred (the extra element at the end)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        axes = self.attr("axes")
        self.axes = None if axes is None else [int(a) for a in axes]

    def run(self, x: torch.Tensor, shape: torch.Tensor) -> tuple[torch.Tensor, ...]:
        target = shape.tolist()
        axes = self.axes if self.axes is not None else list(range(len(target)))
        flat = [0] * (2 * x.dim())
        for a, size in zip(axes, target, strict=True):
            a = a + x.dim() if a < 0 else a
            dim = x.shape[a]
            if size < dim:
                start = (dim - size) // 2
                x = x.narrow(a, start, size)
            elif size > dim:
                before = (size - dim) // 2
                k = 2 * (x.dim() - 1 - a)
                flat[k], flat[k + 1] = before, size - dim - before
        return (F.pad(x, flat) if any(flat) else x,)
