"""Softmax-family kernels (ONNX's math family): Softmax, LogSoftmax and Hardmax.

They change meaning at opset 13 (coerce-to-2-D at `axis` before, one axis after).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import Any

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['Hardmax', 'Hardmax13', 'LogSoftmax', 'LogSoftmax13', 'Softmax', 'Softmax13']


@kernel("Softmax", since=1)
class Softmax(Kernel):
    """Opsets 1-12: X is coerced to 2-D, [prod(dims < axis), prod(dims >= axis)], and each row normalized."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # flatten(axis) is exactly the coercion (a no-op when axis is the last dim).
        return (torch.softmax(x.flatten(self.axis), -1).reshape(x.shape),)


@kernel("Softmax", since=13)
class Softmax13(Kernel):
    """Opset 13+: normalize along the single dimension `axis` (default -1)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.softmax(x, self.axis),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else methodcaller("softmax", self.axis)  # Tensor.softmax is torch.softmax


@kernel("LogSoftmax", since=1)
class LogSoftmax(Kernel):
    """Opsets 1-12: same 2-D coercion at `axis` (default 1) as Softmax."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log_softmax(x.flatten(self.axis), -1).reshape(x.shape),)


@kernel("LogSoftmax", since=13)
class LogSoftmax13(Kernel):
    """Opset 13+: along the single dimension `axis` (default -1)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.log_softmax(x, self.axis),)


def _hardmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    # argmax returns the first maximal index, as the spec asks ("the first maximum wins")
    idx = torch.argmax(x, dim=axis, keepdim=True)
    return torch.zeros_like(x).scatter_(axis, idx, 1)


@kernel("Hardmax", since=1)
class Hardmax(Kernel):
    """Opsets 1-12: 1 at the first maximum of each row of the 2-D coercion at `axis` (default 1), 0 elsewhere."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.numel() == 0:
            return (x.clone(),)
        return (_hardmax(x.flatten(self.axis), -1).reshape(x.shape),)


@kernel("Hardmax", since=13)
class Hardmax13(Kernel):
    """Opset 13+: along the single dimension `axis` (default -1)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.numel() == 0:
            return (x.clone(),)
        return (_hardmax(x, self.axis),)
