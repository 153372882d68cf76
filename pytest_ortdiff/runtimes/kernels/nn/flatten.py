"""Flatten (ONNX's nn family): the input as a 2-D matrix split at `axis`.
"""

from __future__ import annotations

import math

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['Flatten']


@kernel("Flatten", since=1)
class Flatten(Kernel):
    """A 2-D result: the dims before `axis` (default 1; negative from opset 11) times the rest."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        axis = self.axis + x.dim() if self.axis < 0 else self.axis
        return (x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])),)
