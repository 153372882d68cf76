"""Shape kernels (ONNX's tensor family): Shape, Size, Reshape, Transpose, Squeeze, Unsqueeze, Concat.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import Any

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['Concat', 'Reshape', 'Shape', 'Shape15', 'Size', 'Squeeze', 'Squeeze13', 'Transpose', 'Unsqueeze', 'Unsqueeze13']


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


@kernel("Reshape", since=5)
class Reshape(Kernel):
    """A 0 in the shape copies the input's dim, unless `allowzero=1` (opset 14+) makes it a real 0; -1 infers."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        # Before opset 14 the attribute does not exist, and its default is the old behaviour.
        self.allowzero = bool(self.attr("allowzero", 0))

    def run(self, x: torch.Tensor, shape: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dims = shape.tolist()
        if not self.allowzero and 0 in dims:
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return (x.reshape(dims),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1} or static[1] is None:
            return None
        dims = static[1].tolist()
        if not self.allowzero and 0 in dims:
            return lambda x: x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(dims)])
        return methodcaller("reshape", dims)


@kernel("Transpose", since=1)
class Transpose(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        perm = self.attr("perm")
        self.perm = None if perm is None else tuple(int(p) for p in perm)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.perm is None:
            return (x.permute(tuple(range(x.dim() - 1, -1, -1))),)
        return (x.permute(self.perm),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static or self.perm is None else methodcaller("permute", self.perm)


def _squeeze(x: torch.Tensor, axes: list[int] | tuple[int, ...]) -> torch.Tensor:
    if not axes:
        return x.squeeze()
    shape = x.shape
    for a in axes:
        # torch silently keeps a dim that is not 1; ONNX makes that an error, and so do we.
        if shape[a] != 1:
            raise ValueError(f"Squeeze: axis {a} of shape {tuple(shape)} is not 1")
    return x.squeeze(tuple(axes))


def _unsqueeze(x: torch.Tensor, axes: list[int] | tuple[int, ...]) -> torch.Tensor:
    # Axes index the *output*, whose rank is rank(x) + len(axes); insert in ascending order.
    rank = x.dim() + len(axes)
    dims = list(x.shape)
    for a in sorted(a + rank if a < 0 else a for a in axes):
        dims.insert(a, 1)
    return x.reshape(dims)


def _unsqueezer(axes: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """`_unsqueeze` for fixed axes: their order sorted once when none counts from the back."""
    if any(a < 0 for a in axes):
        return lambda x: _unsqueeze(x, axes)
    at = sorted(axes)

    def unsqueeze(x: torch.Tensor) -> torch.Tensor:
        dims = list(x.shape)
        for a in at:
            dims.insert(a, 1)
        return x.reshape(dims)

    return unsqueeze


@kernel("Squeeze", since=1)
class Squeeze(Kernel):
    """Opsets 1-12: axes in an attribute; none means every size-1 dim."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = tuple(int(a) for a in self.attr("axes", ()))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_squeeze(x, self.axes),)


@kernel("Squeeze", since=13)
class Squeeze13(Kernel):
    """Opset 13+: axes in an optional int64 input."""

    def run(self, x: torch.Tensor, axes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return (_squeeze(x, () if axes is None else axes.reshape(-1).tolist()),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1}:
            return None
        axes = () if static[1] is None else tuple(static[1].reshape(-1).tolist())
        return lambda x: _squeeze(x, axes)


@kernel("Unsqueeze", since=1)
class Unsqueeze(Kernel):
    """Opsets 1-12: axes in a required attribute."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = tuple(int(a) for a in self.attr("axes", ()))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_unsqueeze(x, self.axes),)


@kernel("Unsqueeze", since=13)
class Unsqueeze13(Kernel):
    """Opset 13+: axes in a required int64 input."""

    def run(self, x: torch.Tensor, axes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_unsqueeze(x, axes.reshape(-1).tolist()),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != {1} or static[1] is None:
            return None
        return _unsqueezer(static[1].reshape(-1).tolist())


@kernel("Concat", since=1)
class Concat(Kernel):
    """`axis` may be negative (opset 11+); opset 1 defaulted it to 1, later opsets require it."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.cat(xs, self.axis),)
