"""Matrix-product kernels (ONNX's math family): MatMul, Gemm, Einsum, and the quantized MatMulInteger and
QLinearMatMul.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..quantization import float8_cast, integer_range

__all__ = ['Einsum', 'Gemm', 'MatMul', 'MatMulInteger', 'QLinearMatMul', 'QLinearMatMul21']


# float16/bfloat16 operands contract in float32, rounded once at the end (onnx.reference does so for
# bfloat16, numpy's float16 dot accumulates in float32); integers contract in int64, whose wrap-around
# agrees with every narrower integer type's once cast back.
_EINSUM_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


# torch multiplies integer matrices on the CPU only: cuBLAS has no integer GEMM ("addmm_cuda" / "bmm_cuda" not
# implemented for 'Long', pytorch#44428). Integer operands on another device are multiplied on the host, with the
# CPU's exact wrap-around arithmetic, and the product goes back to their device (integer products are index and
# shape arithmetic, small next to the float ones).
def _on_host(a: torch.Tensor) -> bool:
    return a.device.type != "cpu" and not a.is_floating_point()


def _host(fn: Callable[..., torch.Tensor], *operands: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return fn(*(x.cpu() for x in operands), **kwargs).to(operands[0].device)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _host(torch.matmul, a, b) if _on_host(a) else torch.matmul(a, b)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _host(torch.mm, a, b) if _on_host(a) else torch.mm(a, b)


def _addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return _host(torch.addmm, c, a, b, **kwargs) if _on_host(a) else torch.addmm(c, a, b, **kwargs)


@kernel("MatMul", since=1)
class MatMul(Kernel):
    """torch.matmul has numpy's rules: 1-D operands are promoted then squeezed, batch dims broadcast."""

    def run(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_matmul(a, b),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        return None if static else _matmul


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

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        # the plain product (torch.mm, C absent or beta 0) or product plus C (torch.addmm with its default
        # beta = alpha = 1), what run calls for floats and integers alike; transposes and scaling: run
        if self.trans_a or self.trans_b or self.alpha != 1.0 or not self.int_scalars:
            return None
        fixed = set(static)
        if len(self.node.input) < 3 or not self.node.input[2] or self.beta == 0.0:
            return _mm if fixed <= {2} else None
        if self.beta != 1.0:
            return None
        if fixed == {2}:
            return partial(_addmm, static[2])
        if fixed == {1, 2}:
            c, w = static[2], static[1]
            return lambda a: _addmm(c, a, w)
        return None

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
                y = _mm(a, b)
                return y if alpha == 1 else y.mul_(alpha)
            return _addmm(c, a, b, beta=beta, alpha=alpha)
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
        if _on_host(operands[0]):  # (integer contractions: bmm, which CUDA lacks for integers)
            return (_host(partial(torch.einsum, self.equation), *(x.to(wide) for x in operands)).to(dtype),)
        if wide == dtype:
            return (torch.einsum(self.equation, *operands),)
        return (torch.einsum(self.equation, *(x.to(wide) for x in operands)).to(dtype),)


def _row_param(p: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor | None:
    """A per-row parameter of A (1-D, one per row) as a column that broadcasts over A's columns; scalars
    and N-D parameters as given (numpy broadcasting)."""
    if p is None or p.dim() != 1 or p.numel() == 1 or a.dim() < 2:
        return p
    if p.numel() != a.shape[-2]:
        raise ValueError(f"a per-row zero point/scale of A has {a.shape[-2]} elements (A is {tuple(a.shape)}); got {p.numel()}")
    return p.reshape(-1, 1)


def _centered(x: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """x - zero_point, exactly, in float64: the operands of an integer product (|value| < 2**16, so every
    partial sum of fewer than 2**37 products is an exact float64, and float64 matmul runs on every device)."""
    xd = x.to(torch.float64)  # float8 operands of QLinearMatMul 21 too: exact
    return xd if zero_point is None else xd - zero_point.to(torch.float64)


@kernel("MatMulInteger", since=10)
class MatMulInteger(Kernel):
    """int32 (A - a_zero_point) @ (B - b_zero_point), exact; zero points per tensor, per row of A, per column of B."""

    def run(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        a_zero_point: torch.Tensor | None = None,
        b_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        y = torch.matmul(_centered(a, _row_param(a_zero_point, a)), _centered(b, b_zero_point))
        return (y.to(torch.int32),)


@kernel("QLinearMatMul", since=10)
class QLinearMatMul(Kernel):
    """saturate(round((A - a_zp) @ (B - b_zp) * (a_scale * b_scale / y_scale)) + y_zp) to y_zp's type: the
    product exact, the requantization in float32 (float64 when the scales are) and rounded half to even, as
    onnxruntime does. Scales and zero points per tensor, per row of A, per column of B."""

    def run(
        self,
        a: torch.Tensor,
        a_scale: torch.Tensor,
        a_zero_point: torch.Tensor | None,
        b: torch.Tensor,
        b_scale: torch.Tensor,
        b_zero_point: torch.Tensor | None,
        y_scale: torch.Tensor,
        y_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        acc = torch.matmul(_centered(a, _row_param(a_zero_point, a)), _centered(b, b_zero_point))
        compute = torch.float64 if a_scale.dtype == torch.float64 else torch.float32
        a_s, y_s = _row_param(a_scale, a), _row_param(y_scale, a)
        assert a_s is not None and y_s is not None
        multiplier = a_s.to(compute) * b_scale.to(compute) / y_s.to(compute)
        y = acc.to(compute) * multiplier
        out_dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
        zp = _row_param(y_zero_point, a)
        if out_dtype.is_floating_point:
            if zp is not None:
                y = y + zp.to(compute)
            return (float8_cast(y, out_dtype, saturate=True),)
        bounds = integer_range(out_dtype)
        if bounds is None:
            raise UnsupportedVariantError(f"QLinearMatMul to {out_dtype}: not a quantized type of the spec")
        q = torch.round(y)
        if zp is not None:
            q = q + zp.to(compute)
        return (q.clamp_(*bounds).to(out_dtype),)


@kernel("QLinearMatMul", since=21)
class QLinearMatMul21(QLinearMatMul):
    """Adds float16/bfloat16 scales and float8 operands."""
