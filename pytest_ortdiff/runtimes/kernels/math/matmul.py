"""Matrix-product kernels (ONNX's math family): MatMul, Gemm, Einsum.
"""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, kernel

__all__ = ['Einsum', 'Gemm', 'MatMul']


# float16/bfloat16 operands contract in float32, rounded once at the end (onnx.reference does so for
# bfloat16, numpy's float16 dot accumulates in float32); integers contract in int64, whose wrap-around
# agrees with every narrower integer type's once cast back.
_EINSUM_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


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


@kernel("Einsum", since=12)
class Einsum(Kernel):
    """torch.einsum on the equation made explicit; opset 28 only adds bfloat16, which this kernel covers."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        equation = str(self.attr("equation", "")).replace(" ", "")
        if not equation:
            raise ValueError("Einsum needs a non-empty equation")
        lhs, arrow, rhs = equation.partition("->")
        if not arrow:
            # Implicit mode: the labels seen exactly once, in ASCII order (upper case first), after the ellipsis.
            labels = lhs.replace("...", "").replace(",", "")
            once = sorted(c for c in set(labels) if labels.count(c) == 1)
            rhs = ("..." if "..." in lhs else "") + "".join(once)
        self.terms = lhs.split(",")
        self.equation = f"{lhs}->{rhs}"

    def run(self, *operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(operands) != len(self.terms):
            raise ValueError(
                f"Einsum equation {self.equation!r} has {len(self.terms)} operand terms, got {len(operands)} inputs"
            )
        dtype = operands[0].dtype
        wide = _EINSUM_WIDER.get(dtype, dtype if dtype.is_floating_point else torch.int64)
        if wide == dtype:
            return (torch.einsum(self.equation, *operands),)
        return (torch.einsum(self.equation, *(x.to(wide) for x in operands)).to(dtype),)
