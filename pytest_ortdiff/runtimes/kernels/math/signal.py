"""Signal kernels (ONNX's math family): the Hann, Hamming and Blackman windows.
"""

from __future__ import annotations

import math

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['BlackmanWindow', 'HammingWindow', 'HannWindow']


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
