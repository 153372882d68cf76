"""Optional kernels (ONNX's optional family): an empty optional is None, a full one its value itself.

An omitted optional input is None as well, which is what OptionalHasElement (opset 18) says of it.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Kernel, kernel

__all__ = ["Optional", "OptionalGetElement", "OptionalHasElement"]


@kernel("Optional", since=15)
class Optional(Kernel):
    """The input as a full optional, or without one an empty optional (None) of the `type` attribute.
    Version 28 only widens the types."""

    def run(self, x: Any = None) -> tuple[Any, ...]:
        return (x,)


@kernel("OptionalHasElement", since=15)
class OptionalHasElement(Kernel):
    """A bool scalar: whether the input holds a value (opset 18 also takes a tensor or a sequence: true,
    and no input: false)."""

    def run(self, x: Any = None) -> tuple[Any, ...]:
        return (torch.tensor(x is not None, device=self.ctx.device),)


@kernel("OptionalGetElement", since=15)
class OptionalGetElement(Kernel):
    """The value of a full optional (opset 18: a tensor or sequence given as is); an empty one is an error."""

    def run(self, x: Any = None) -> tuple[Any, ...]:
        if x is None:
            raise ValueError("OptionalGetElement: the optional is empty")
        return (x,)
