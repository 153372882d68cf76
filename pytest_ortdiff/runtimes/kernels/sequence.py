"""Sequence kernels (ONNX's sequence family): a sequence of tensors is a Python list of torch tensors.

Kernels never change a list they are given (a sequence value may have other readers): they build new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel
from .controlflow import SubgraphKernel

__all__ = [
    "ConcatFromSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
]


def _sequence(x: Any, op: str) -> list[torch.Tensor]:
    if not isinstance(x, list):
        raise TypeError(f"{op}: the input sequence is {'an empty optional' if x is None else type(x).__name__}, not a sequence (a list of tensors)")
    return x


def _position(pos: torch.Tensor, n: int, op: str, end_ok: bool = False) -> int:
    """A position in [-n, n - 1] (or [-n, n] with `end_ok`) as an index in [0, n] (ONNX says out of range is an error)."""
    if pos.numel() != 1:
        raise ValueError(f"{op}: position must be a scalar; got shape {list(pos.shape)}")
    p = int(pos.reshape(-1)[0])
    hi = n if end_ok else n - 1
    if not -n <= p <= hi:
        raise IndexError(f"{op}: position {p} is out of range [{-n}, {hi}] for a sequence of {n} tensors")
    return p + n if p < 0 else p


@kernel("SequenceEmpty", since=11)
class SequenceEmpty(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        dtype = int(self.attr("dtype", onnx.TensorProto.FLOAT))
        if dtype == onnx.TensorProto.STRING:
            raise UnsupportedVariantError("SequenceEmpty dtype=STRING: a sequence of string tensors, which torch cannot hold")

    def run(self) -> tuple[Any, ...]:
        return ([],)


@kernel("SequenceConstruct", since=11)
class SequenceConstruct(Kernel):
    def run(self, *inputs: Any) -> tuple[Any, ...]:
        return (list(inputs),)


@kernel("SequenceAt", since=11)
class SequenceAt(Kernel):
    def run(self, seq: Any, pos: torch.Tensor) -> tuple[Any, ...]:
        s = _sequence(seq, "SequenceAt")
        return (s[_position(pos, len(s), "SequenceAt")],)


@kernel("SequenceInsert", since=11)
class SequenceInsert(Kernel):
    """Inserts at `position` (default: the end; `len` also means the end, negative counts from it)."""

    def run(self, seq: Any, t: torch.Tensor, pos: torch.Tensor | None = None) -> tuple[Any, ...]:
        s = list(_sequence(seq, "SequenceInsert"))
        if pos is None:
            s.append(t)
        else:
            s.insert(_position(pos, len(s), "SequenceInsert", end_ok=True), t)
        return (s,)


@kernel("SequenceErase", since=11)
class SequenceErase(Kernel):
    """Removes the tensor at `position` (default: the last)."""

    def run(self, seq: Any, pos: torch.Tensor | None = None) -> tuple[Any, ...]:
        s = list(_sequence(seq, "SequenceErase"))
        if not s:
            raise IndexError("SequenceErase: the sequence is empty")
        i = len(s) - 1 if pos is None else _position(pos, len(s), "SequenceErase")
        del s[i]
        return (s,)


@kernel("SequenceLength", since=11)
class SequenceLength(Kernel):
    def run(self, seq: Any) -> tuple[Any, ...]:
        return (torch.tensor(len(_sequence(seq, "SequenceLength")), dtype=torch.int64, device=self.ctx.device),)


@kernel("ConcatFromSequence", since=11)
class ConcatFromSequence(Kernel):
    """Concatenates along `axis`, or with `new_axis=1` stacks along a new axis (`axis` then in [-r-1, r])."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        axis = self.attr("axis")
        if axis is None:
            raise ValueError("ConcatFromSequence: the attribute axis is required")
        self.axis = int(axis)
        self.new_axis = int(self.attr("new_axis", 0))
        if self.new_axis not in (0, 1):
            raise UnsupportedVariantError(f"ConcatFromSequence new_axis={self.new_axis}: the spec allows 0 and 1")

    def run(self, seq: Any) -> tuple[Any, ...]:
        s = _sequence(seq, "ConcatFromSequence")
        if not s:
            raise ValueError("ConcatFromSequence: the sequence is empty (the result's shape is unknown)")
        rank = s[0].dim() + self.new_axis
        if not -rank <= self.axis < rank:
            raise ValueError(f"ConcatFromSequence: axis {self.axis} is out of range for {'stacking' if self.new_axis else 'concatenating'} rank-{s[0].dim()} tensors")
        return (torch.stack(s, dim=self.axis) if self.new_axis else torch.cat(s, dim=self.axis),)


@kernel("SplitToSequence", since=11)
class SplitToSequence(Kernel):
    """Splits along `axis`: into pieces of 1 (squeezed unless `keepdims=1`, the default) without `split`,
    of `split` each (the last one shorter) for a scalar, of the given lengths for a 1-D `split`. Version 24
    only widens the types."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))
        self.keepdims = int(self.attr("keepdims", 1))

    def run(self, x: torch.Tensor, split: torch.Tensor | None = None) -> tuple[Any, ...]:
        if not -x.dim() <= self.axis < x.dim():
            raise ValueError(f"SplitToSequence: axis {self.axis} is out of range for shape {list(x.shape)}")
        if split is None:
            return (list(torch.split(x, 1, dim=self.axis)) if self.keepdims else list(torch.unbind(x, self.axis)),)
        if split.dim() == 0:
            size = int(split)
            if size <= 0:
                raise ValueError(f"SplitToSequence: split must be positive; got {size}")
            return (list(torch.split(x, size, dim=self.axis)),)
        lengths = [int(v) for v in split.tolist()]
        if any(v < 0 for v in lengths) or sum(lengths) != x.shape[self.axis]:
            raise ValueError(f"SplitToSequence: split {lengths} does not cut axis {self.axis} of shape {list(x.shape)} (lengths must be positive and sum to {x.shape[self.axis]})")
        return (list(torch.split(x, lengths, dim=self.axis)),)


@kernel("SequenceMap", since=17)
class SequenceMap(SubgraphKernel):
    """The body once per element of the input sequence; the other inputs are sequences of the same length
    (their element at that position) or tensors (whole, every time). Each body output makes a sequence."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.body = self.subgraph("body")
        if len(self.body.inputs) != len(node.input) or len(self.body.outputs) != len(node.output):
            raise ValueError(
                f"SequenceMap node {node.name or '?'!r}: its body takes {len(self.body.inputs)} inputs and makes "
                f"{len(self.body.outputs)} outputs; the node has {len(node.input)} and {len(node.output)}"
            )
        self.use(self.body)

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        n = len(_sequence(inputs[0], "SequenceMap"))
        for j, x in enumerate(inputs):
            if isinstance(x, list) and len(x) != n:
                raise ValueError(f"SequenceMap: input {j} is a sequence of {len(x)} tensors, the input sequence has {n}")
        base = self.body.scope(scope)
        outs: list[list[Any]] = [[] for _ in self.node.output]
        for i in range(n):
            ys = self.body.run([x[i] if isinstance(x, list) else x for x in inputs], base, collect)
            for acc, y in zip(outs, ys, strict=True):
                acc.append(y)
        return tuple(outs)
