"""Logical kernels (ONNX's logical family): comparisons, boolean and bitwise ops, BitShift.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .math.elementwise import run_unsigned

__all__ = ['And', 'BitShift', 'BitwiseAnd', 'BitwiseNot', 'BitwiseOr', 'BitwiseXor', 'Equal', 'Greater', 'GreaterOrEqual', 'Less', 'LessOrEqual', 'Not', 'Or', 'Xor']


def _binary(
    op_type: str, since: int, fn: Callable[..., torch.Tensor], wrapping: bool, doc: str = ""
) -> type[Kernel]:
    """A kernel class for a two-input broadcasting op that is exactly a torch function."""

    def run(self: Kernel, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (fn(a, b),)
        except RuntimeError as exc:
            return (run_unsigned(fn, a, b, wrapping=wrapping, error=exc),)

    cls = type(op_type, (Kernel,), {"run": run, "__doc__": doc or None, "__module__": __name__})
    return kernel(op_type, since=since)(cls)


# From opset 7 on these broadcast numpy-style (before, only with `broadcast=1` and `axis`: no kernel).
Equal = _binary("Equal", 7, torch.eq, True)


Less = _binary("Less", 7, torch.lt, False)


Greater = _binary("Greater", 7, torch.gt, False)


LessOrEqual = _binary("LessOrEqual", 12, torch.le, False)


GreaterOrEqual = _binary("GreaterOrEqual", 12, torch.ge, False)


And = _binary("And", 7, torch.logical_and, True)


Or = _binary("Or", 7, torch.logical_or, True)


Xor = _binary("Xor", 7, torch.logical_xor, True)


BitwiseAnd = _binary("BitwiseAnd", 18, torch.bitwise_and, True)


BitwiseOr = _binary("BitwiseOr", 18, torch.bitwise_or, True)


BitwiseXor = _binary("BitwiseXor", 18, torch.bitwise_xor, True)


@kernel("Not", since=1)
class Not(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.logical_not(x),)


@kernel("BitwiseNot", since=18)
class BitwiseNot(Kernel):
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            return (torch.bitwise_not(x),)
        except RuntimeError as exc:
            return (run_unsigned(torch.bitwise_not, x, wrapping=True, error=exc),)


_BITS = {
    torch.uint8: 8,
    torch.uint16: 16,
    torch.uint32: 32,
    torch.uint64: 64,
    torch.int8: 8,
    torch.int16: 16,
    torch.int32: 32,
    torch.int64: 64,
}


@kernel("BitShift", since=11)
class BitShift(Kernel):
    """A shift by a negative amount or by the bit width or more gives 0 (-1 for a right shift of a
    negative signed value), as the opset-28 spec words what C leaves undefined. Right shifts of
    unsigned values are logical, of signed ones arithmetic."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        direction = self.attr("direction")
        if direction not in ("LEFT", "RIGHT"):
            raise UnsupportedVariantError(f"BitShift with direction={direction!r}: LEFT or RIGHT")
        self.left = direction == "LEFT"

    def run(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bits = _BITS.get(x.dtype)
        if bits is None:
            raise UnsupportedVariantError(f"BitShift of {x.dtype}: integers only")
        signed = x.dtype.is_signed
        if x.dtype == torch.uint64:
            v, s = x.view(torch.int64), y.view(torch.int64)
        elif x.dtype in (torch.uint16, torch.uint32):
            v, s = x.to(torch.int64), y.to(torch.int64)
        else:
            v, s = x, y
        out = (s < 0) | (s >= bits)
        s = torch.where(out, torch.zeros((), dtype=s.dtype, device=s.device), s)
        if self.left:
            r = torch.bitwise_left_shift(v, s)
        else:
            r = torch.bitwise_right_shift(v, s)
            if x.dtype == torch.uint64:
                # int64's right shift drags the sign bit in: keep only the low 64 - s bits (logical shift)
                one = torch.ones((), dtype=torch.int64, device=v.device)
                keep = torch.bitwise_left_shift(one, 64 - s.clamp(min=1)) - 1
                r = torch.where(s == 0, r, r & keep)
        fill = torch.zeros((), dtype=r.dtype, device=r.device)
        if signed and not self.left:
            fill = torch.where(v < 0, torch.full((), -1, dtype=r.dtype, device=r.device), fill)
        r = torch.where(out, fill, r)
        if x.dtype == torch.uint64:
            return (r.view(torch.uint64),)
        return (r if r.dtype == x.dtype else r.to(x.dtype),)
