"""Kernels of ONNX's training family (domain ai.onnx.preview.training): the Adagrad, Adam and Momentum
optimizer steps, for one tensor or several (inputs R, T, then the Xs, the Gs and the states)."""

from __future__ import annotations

import math

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["Adagrad", "Adam", "Momentum"]

_DOMAIN = "ai.onnx.preview.training"


def _groups(inputs: tuple[torch.Tensor | None, ...], per: int, op: str) -> list[list[torch.Tensor]]:
    """[X1..Xn, G1..Gn, S1..Sn, ...] -> per tensor i: [Xi, Gi, Si, ...]."""
    rest = [t for t in inputs if t is not None]
    if len(rest) % per:
        raise ValueError(f"{op}: {len(rest)} tensors after R and T do not split into groups of {per}")
    n = len(rest) // per
    return [[rest[k * n + i] for k in range(per)] for i in range(n)]


@kernel("Adagrad", since=1, domain=_DOMAIN)
class Adagrad(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.decay = float(self.attr("decay_factor", 0.0))
        self.eps = float(self.attr("epsilon", 1e-6))
        self.norm = float(self.attr("norm_coefficient", 0.0))

    def run(self, r: torch.Tensor, t: torch.Tensor, *rest: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        rate = float(r) / (1 + float(t) * self.decay)
        xs, hs = [], []
        for x, g, h in _groups(rest, 3, "Adagrad"):
            g = self.norm * x + g
            h_new = h + g * g
            xs.append((x - rate * g / (torch.sqrt(h_new) + self.eps)).to(x.dtype))
            hs.append(h_new.to(h.dtype))
        return (*xs, *hs)


@kernel("Adam", since=1, domain=_DOMAIN)
class Adam(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 0.9))
        self.beta = float(self.attr("beta", 0.999))
        self.eps = float(self.attr("epsilon", 1e-6))
        self.norm = float(self.attr("norm_coefficient", 0.0))
        self.norm_post = float(self.attr("norm_coefficient_post", 0.0))

    def run(self, r: torch.Tensor, t: torch.Tensor, *rest: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        step = int(t)
        rate = float(r)
        if step > 0:  # bias correction from the second step on
            rate = rate * math.sqrt(1 - self.beta**step) / (1 - self.alpha**step)
        xs, vs, hs = [], [], []
        for x, g, v, h in _groups(rest, 4, "Adam"):
            g = self.norm * x + g
            v_new = self.alpha * v + (1 - self.alpha) * g
            h_new = self.beta * h + (1 - self.beta) * g * g
            x_new = x - rate * (v_new / (torch.sqrt(h_new) + self.eps))
            xs.append(((1 - self.norm_post) * x_new).to(x.dtype))
            vs.append(v_new.to(v.dtype))
            hs.append(h_new.to(h.dtype))
        return (*xs, *vs, *hs)


@kernel("Momentum", since=1, domain=_DOMAIN)
class Momentum(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha"))
        self.beta = float(self.attr("beta"))
        self.norm = float(self.attr("norm_coefficient"))
        self.mode = str(self.attr("mode"))
        if self.mode not in ("standard", "nesterov"):
            raise UnsupportedVariantError(f"Momentum with mode={self.mode!r}: the spec defines standard and nesterov")

    def run(self, r: torch.Tensor, t: torch.Tensor, *rest: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        rate = float(r)
        beta = self.beta if int(t) > 0 else 1.0  # the first step takes the whole gradient
        xs, vs = [], []
        for x, g, v in _groups(rest, 3, "Momentum"):
            g = self.norm * x + g
            v_new = self.alpha * v + beta * g
            step = v_new if self.mode == "standard" else g + self.alpha * v_new
            xs.append((x - rate * step).to(x.dtype))
            vs.append(v_new.to(v.dtype))
        return (*xs, *vs)
