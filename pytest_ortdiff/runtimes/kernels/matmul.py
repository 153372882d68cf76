"""Matrix-product torch kernels: MatMul (numpy matmul semantics) and Gemm (alpha * A' B' + beta * C).

They call torch.matmul / torch.mm / torch.addmm, the kernels a torch user would run.
"""

from __future__ import annotations

import onnx
import torch

from .base import Kernel, KernelContext, kernel

__all__ = ["Gemm", "MatMul"]


@kernel("MatMul", since=1)
class MatMul(Kernel):
    """torch.matmul has numpy's rules: 1-D operands are promoted then squeezed, batch dims broadcast."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.matmul(a, b),)


@kernel("Gemm", since=7)
class Gemm(Kernel):
    """From opset 7 C broadcasts unidirectionally to (M, N); opset 11 only made C optional, same kernel."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 1.0))
        self.beta = float(self.attr("beta", 1.0))
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        # torch refuses float alpha/beta for integer tensors; integral ones can go as ints.
        self.int_scalars = self.alpha.is_integer() and self.beta.is_integer()

    def run(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        if self.trans_a:
            a = a.t()
        if self.trans_b:
            b = b.t()
        if not a.is_floating_point():
            return (self._run_int(a, b, c),)
        # beta == 0 ignores C entirely (its NaNs too), as the reference does.
        if c is None or self.beta == 0.0:
            y = torch.mm(a, b)
            return (y if self.alpha == 1.0 else y.mul_(self.alpha),)
        return (torch.addmm(c, a, b, beta=self.beta, alpha=self.alpha),)

    def _run_int(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        if self.int_scalars:
            alpha, beta = int(self.alpha), int(self.beta)
            if c is None or beta == 0:
                y = torch.mm(a, b)
                return y if alpha == 1 else y.mul_(alpha)
            return torch.addmm(c, a, b, beta=beta, alpha=alpha)
        # Fractional scalars: compute in float64 and truncate back, as onnx.reference's astype does.
        y = torch.mm(a.double(), b.double()) * self.alpha
        if c is not None and self.beta != 0.0:
            y = y + c.double() * self.beta
        return y.to(a.dtype)
