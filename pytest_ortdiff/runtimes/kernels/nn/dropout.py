"""Dropout (ONNX's nn family): the identity at inference, with an all-true mask output.
"""

from __future__ import annotations

import torch

from ..base import Kernel, UnsupportedVariantError, kernel

__all__ = ['Dropout', 'Dropout12']


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
