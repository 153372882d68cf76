"""Loss kernels (ONNX's math family): SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Both follow torch's nll_loss semantics exactly as the spec defines them: `mean` divides by the summed
weights of the targets that are not `ignore_index` (0/0 = NaN when every target is ignored).
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]

_REDUCTIONS = ("none", "sum", "mean")
# torch's nll_loss has CPU kernels for these; half types go through float32 and come back
_NLL_TYPES = (torch.float32, torch.float64)


class _Loss(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.reduction = str(self.attr("reduction", "mean"))
        if self.reduction not in _REDUCTIONS:
            raise UnsupportedVariantError(
                f"{node.op_type} with reduction={self.reduction!r}: the spec defines {', '.join(_REDUCTIONS)}"
            )
        ignore = self.attr("ignore_index")
        self.ignore_index: int | None = None if ignore is None else int(ignore)

    def _nll(
        self, log_prob: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
    ) -> torch.Tensor:
        target = target.long()
        if self.ignore_index is None:
            # torch's default ignore_index is -100: a target of -100 must then be an error, as in the spec
            ignore = -100
            if bool((target == ignore).any()):
                raise ValueError(f"{self.node.op_type}: target -100 is out of range and no ignore_index is set")
        else:
            ignore = self.ignore_index
        wide = log_prob if log_prob.dtype in _NLL_TYPES else log_prob.float()
        w = None if weight is None else weight.to(wide.dtype)
        loss = F.nll_loss(wide, target, weight=w, ignore_index=ignore, reduction=self.reduction)
        return loss.to(log_prob.dtype)


@kernel("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(_Loss):
    """input [N, C, d1..dk] of log-probabilities, target [N, d1..dk], optional weight [C]."""

    def run(
        self, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        return (self._nll(x, target, weight),)


@kernel("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(_Loss):
    """scores [N, C, d1..dk] -> LogSoftmax over C -> NegativeLogLikelihoodLoss; the optional second output
    is the log-probabilities."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.want_log_prob = len(node.output) > 1 and bool(node.output[1])

    def run(
        self, scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        wide = scores if scores.dtype in _NLL_TYPES else scores.float()
        log_prob = torch.log_softmax(wide, dim=1) if scores.dim() > 1 else torch.log_softmax(wide, 0)
        loss = self._nll(log_prob, labels, weights).to(scores.dtype)
        if self.want_log_prob:
            return (loss, log_prob.to(scores.dtype))
        return (loss,)
