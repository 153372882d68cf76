"""Activation kernels (ONNX's math family): the ReLU family, sigmoids, Gelu, Swish, Mish, soft functions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['Celu', 'Elu', 'Gelu', 'HardSigmoid', 'HardSwish', 'LeakyRelu', 'Mish', 'PRelu', 'Selu', 'Softplus', 'Softsign', 'SwiGLU', 'Swish', 'ThresholdedRelu']


@kernel("LeakyRelu", since=1)
class LeakyRelu(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 0.01))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.leaky_relu(x, self.alpha),)


@kernel("PRelu", since=7)
class PRelu(Kernel):
    """`slope` broadcasts to X (unidirectionally, from opset 7)."""

    def run(self, x: torch.Tensor, slope: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.where(x < 0, x * slope, x),)


@kernel("ThresholdedRelu", since=10)
class ThresholdedRelu(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.where(x > self.alpha, x, torch.zeros((), dtype=x.dtype, device=x.device)),)


@kernel("Elu", since=1)
class Elu(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.elu(x, self.alpha),)


@kernel("Selu", since=1)
class Selu(Kernel):
    """gamma * elu(x, alpha) with the node's alpha and gamma (torch.selu hard-codes the defaults)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.67326319217681884765625))
        self.gamma = float(self.attr("gamma", 1.05070102214813232421875))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.elu(x, self.alpha) * self.gamma,)


@kernel("Celu", since=12)
class Celu(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.celu(x, self.alpha),)


@kernel("HardSigmoid", since=1)
class HardSigmoid(Kernel):
    """max(0, min(1, alpha * x + beta)), with ONNX's defaults alpha=0.2, beta=0.5 (torch's are 1/6, 1/2)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 0.2))
        self.beta = float(self.attr("beta", 0.5))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.clamp(x * self.alpha + self.beta, 0.0, 1.0),)


@kernel("HardSwish", since=14)
class HardSwish(Kernel):
    """x * HardSigmoid(x) with alpha=1/6, beta=0.5: exactly torch's hardswish."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.hardswish(x),)


@kernel("Softplus", since=1)
class Softplus(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.softplus(x),)


@kernel("Softsign", since=1)
class Softsign(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.softsign(x),)


@kernel("Mish", since=18)
class Mish(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.mish(x),)


@kernel("Gelu", since=20)
class Gelu(Kernel):
    """`approximate="none"` (the erf form) or `"tanh"`, the two forms torch's gelu has."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.approximate = self.attr("approximate", "none")
        if self.approximate not in ("none", "tanh"):
            raise UnsupportedVariantError(f"Gelu with approximate={self.approximate!r}")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.gelu(x, approximate=self.approximate),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else partial(F.gelu, approximate=self.approximate)


@kernel("Swish", since=24)
class Swish(Kernel):
    """x * sigmoid(alpha * x)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.alpha == 1.0:
            return (F.silu(x),)
        return (x * torch.sigmoid(x * self.alpha),)


@kernel("SwiGLU", since=28)
class SwiGLU(Kernel):
    """Y = Swish_alpha(A) * B = A * Sigmoid(alpha * A) * B; A and B of one shape (no broadcasting)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if a.shape != b.shape:
            raise ValueError(f"SwiGLU takes A and B of one shape (no broadcasting); got {list(a.shape)} and {list(b.shape)}")
        return (a * torch.sigmoid(self.alpha * a) * b,)
