"""Activation torch kernels: the ReLU family, sigmoids and their hard variants, Gelu, Swish, Shrink,
and Dropout at inference. Attributes (alpha, beta, ...) are parsed once; outputs keep the input's dtype.
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "Celu",
    "Dropout",
    "Dropout12",
    "Elu",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Mish",
    "PRelu",
    "Selu",
    "Shrink",
    "Softplus",
    "Softsign",
    "Swish",
    "ThresholdedRelu",
]

# Opset 1 versions of these ops differ from opset 6 by the legacy `consumed_inputs` attribute only.


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


@kernel("Shrink", since=9)
class Shrink(Kernel):
    """x + bias below -lambd, x - bias above lambd, 0 between; integer inputs are computed in float64
    and cast back (truncating), as the reference does."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.bias = float(self.attr("bias", 0.0))
        self.lambd = float(self.attr("lambd", 0.5))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w = x if x.is_floating_point() else x.double()
        zero = torch.zeros((), dtype=w.dtype, device=w.device)
        y = torch.where(w < -self.lambd, w + self.bias, torch.where(w > self.lambd, w - self.bias, zero))
        return (y if y.dtype == x.dtype else y.to(x.dtype),)





@kernel("Dropout", since=10)
class Dropout(Kernel):
    """Opsets 10-11: inference is the identity, and the optional mask all True."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(self.node.output) > 1 and self.node.output[1]:
            return (x, torch.ones(x.shape, dtype=torch.bool, device=x.device))
        return (x,)


@kernel("Dropout", since=12)
class Dropout12(Kernel):
    """Opset 12+: `ratio` and `training_mode` are inputs; training with a nonzero ratio draws random
    numbers, which no reference can reproduce, so it is refused."""

    def run(
        self,
        x: torch.Tensor,
        ratio: torch.Tensor | None = None,
        training_mode: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if training_mode is not None and bool(training_mode) and (ratio is None or float(ratio) != 0.0):
            raise UnsupportedVariantError(
                "Dropout with training_mode=True and a nonzero ratio: random, not reproducible"
            )
        if len(self.node.output) > 1 and self.node.output[1]:
            return (x, torch.ones(x.shape, dtype=torch.bool, device=x.device))
        return (x,)
