"""Runtime: what the engine asks of anything that computes a model's outputs.

OrtRunner and TorchEvaluator satisfy it; a user's own runtime needs only `run(output_names, feeds)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["Runtime"]


@runtime_checkable
class Runtime(Protocol):
    """Anything with `run(output_names, feeds)`: the outputs named (all of them for None), in that
    order, as torch tensors, for feeds {input name: torch tensor or numpy array}."""

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], /) -> Sequence[torch.Tensor]: ...
