"""Indexing kernels (ONNX's tensor family): Gather/GatherElements/GatherND, Scatter*, Slice, Compress,
OneHot, NonZero, Unique, ReverseSequence, Trilu.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['Compress', 'Gather', 'GatherElements', 'GatherND', 'NonZero', 'OneHot', 'ReverseSequence', 'Scatter', 'ScatterElements', 'ScatterND', 'Slice', 'Slice10', 'TensorScatter', 'Trilu', 'Unique']


def _wrap(indices: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    """Negative indices made positive; int32 indices widened (torch indexes with int64)."""
    if indices.dtype != torch.int64:
        indices = indices.to(torch.int64)
    return torch.where(indices < 0, indices + size, indices)


@kernel("Gather", since=1)
class Gather(Kernel):
    """out = data indexed along `axis` by `indices` (any shape): data.shape[:axis] + indices.shape + data.shape[axis+1:]."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))

    def run(self, data: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        axis = self.axis + data.dim() if self.axis < 0 else self.axis
        if indices.dim() == 0:
            i = int(indices)
            return (data.select(axis, i + data.shape[axis] if i < 0 else i),)
        if axis == 0 and data.is_contiguous():
            if data.device.type == "cpu":
                # index_select copies the rows (5x faster than indexing for an embedding table of 50,000
                # rows) and raises on a negative index, which indexing then wraps (a CUDA index_select
                # would assert on the device instead of raising: there indexing does it all)
                try:
                    return (data.index_select(0, indices.reshape(-1)).reshape(indices.shape + data.shape[1:]),)
                except IndexError:
                    pass
            # indexing wraps negative indices and checks bounds itself: one op for _wrap's three and
            # index_select's (the same contiguous copy of the same rows)
            return (data[indices if indices.dtype == torch.int64 else indices.to(torch.int64)],)
        idx = _wrap(indices, data.shape[axis])
        flat = data.index_select(axis, idx.reshape(-1))
        return (flat.reshape(data.shape[:axis] + indices.shape + data.shape[axis + 1 :]),)


@kernel("GatherElements", since=11)
class GatherElements(Kernel):
    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))

    def run(self, data: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.gather(data, self.axis, _wrap(indices, data.shape[self.axis])),)


@kernel("GatherND", since=11)
class GatherND(Kernel):
    """The last dim of `indices` indexes the leading dims of data after `batch_dims` (opset 12+) batch dims."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.batch_dims = int(self.attr("batch_dims", 0))

    def run(self, data: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = self.batch_dims
        k = indices.shape[-1]
        batch_shape = data.shape[:b]
        nb = math.prod(batch_shape)
        idx_mid = indices.shape[b:-1]
        d = data.reshape((nb, *data.shape[b:]))
        sizes = torch.tensor(d.shape[1 : 1 + k], dtype=torch.int64, device=data.device)
        ix = _wrap(indices.reshape(nb, -1, k), sizes)
        batch = torch.arange(nb, device=data.device).reshape(nb, 1)
        picked = d[(batch, *ix.unbind(-1))]  # (nb, m, *rest)
        return (picked.reshape(tuple(batch_shape) + tuple(idx_mid) + tuple(d.shape[1 + k :])),)


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(kernel: Kernel) -> str:
    reduction = kernel.attr("reduction", "none")
    if reduction != "none" and reduction not in _REDUCE:
        raise UnsupportedVariantError(f"{kernel.node.op_type} with reduction={reduction!r}")
    return reduction


@kernel("ScatterElements", since=11)
class ScatterElements(Kernel):
    """A copy of data with updates written (opset 16+: added, multiplied; 18+: max/min) at indices along `axis`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 0))
        self.reduction = _reduction(self)

    def run(
        self, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        idx = _wrap(indices, data.shape[self.axis])
        if self.reduction == "none":
            return (torch.scatter(data, self.axis, idx, updates),)
        return (
            torch.scatter_reduce(data, self.axis, idx, updates, _REDUCE[self.reduction], include_self=True),
        )


@kernel("Scatter", since=9)
class Scatter(ScatterElements):
    """Deprecated in opset 11 for ScatterElements, which it equals without reduction."""


@kernel("ScatterND", since=11)
class ScatterND(Kernel):
    """updates written at the index tuples of the last dim of `indices` (reductions from opset 16/18)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.reduction = _reduction(self)

    def run(
        self, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        k = indices.shape[-1]
        sizes = torch.tensor(data.shape[:k], dtype=torch.int64, device=data.device)
        ix = _wrap(indices, sizes).reshape(-1, k)
        # one linear index into the flattened leading k dims
        strides = [math.prod(data.shape[i + 1 : k]) for i in range(k)]
        lin = (ix * torch.tensor(strides, dtype=torch.int64, device=data.device)).sum(-1)
        rest = data.shape[k:]
        out = data.clone().reshape((math.prod(data.shape[:k]), *rest))
        upd = updates.reshape((lin.shape[0], *rest))
        if self.reduction == "none":
            out[lin] = upd
        else:
            expanded = lin.reshape((-1,) + (1,) * len(rest)).expand(upd.shape)
            out.scatter_reduce_(0, expanded, upd, _REDUCE[self.reduction], include_self=True)
        return (out.reshape(data.shape),)


def _slice(x: torch.Tensor, starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> torch.Tensor:
    """numpy's slicing (Python's clamping of out-of-range starts/ends), negative steps included."""
    rank = x.dim()
    index: list[slice | torch.Tensor] = [slice(None)] * rank
    flips = []
    for s, e, a, d in zip(starts, ends, axes, steps, strict=True):
        a = a + rank if a < 0 else a
        if d == 0:
            raise ValueError("Slice: a step of 0")
        start, stop, step = slice(s, e, d).indices(x.shape[a])
        if step > 0:
            index[a] = slice(start, max(stop, start), step)
        else:
            flips.append((a, torch.arange(start, stop, step, device=x.device)))
    y = x[tuple(index)]
    for a, idx in flips:
        y = y.index_select(a, idx)
    return y


@kernel("Slice", since=1)
class Slice(Kernel):
    """Opsets 1-9: starts, ends and axes in attributes, step 1."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.starts = [int(v) for v in self.attr("starts")]
        self.ends = [int(v) for v in self.attr("ends")]
        axes = self.attr("axes")
        self.axes = None if axes is None else [int(v) for v in axes]

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        axes = self.axes if self.axes is not None else list(range(len(self.starts)))
        return (_slice(x, self.starts, self.ends, axes, [1] * len(axes)),)


@kernel("Slice", since=10)
class Slice10(Kernel):
    """Opset 10+: starts, ends, axes and steps are inputs; a negative step walks backwards."""

    def run(
        self,
        x: torch.Tensor,
        starts: torch.Tensor,
        ends: torch.Tensor,
        axes: torch.Tensor | None = None,
        steps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        s = starts.tolist()
        dims = list(range(len(s))) if axes is None else axes.tolist()
        step = [1] * len(s) if steps is None else steps.tolist()
        return (_slice(x, s, ends.tolist(), dims, step),)

    def direct(self, static: dict[int, Any]) -> Callable[..., torch.Tensor] | None:
        if set(static) != set(range(1, len(self.node.input))) or static[1] is None or static[2] is None:
            return None
        s, e = static[1].tolist(), static[2].tolist()
        axes, steps = static.get(3), static.get(4)
        dims = list(range(len(s))) if axes is None else axes.tolist()
        step = [1] * len(s) if steps is None else steps.tolist()
        if len(s) == len(e) == len(dims) == len(step) == 1 and step[0] == 1:
            # one axis, step 1 (the common case): x.narrow, the very view x[..., start:stop] is
            (s0,), (e0,), (axis,) = s, e, dims

            def narrow(x: torch.Tensor) -> torch.Tensor:
                a = axis + x.dim() if axis < 0 else axis
                start, stop, _ = slice(s0, e0, 1).indices(x.shape[a])
                return x.narrow(a, start, max(stop - start, 0))

            return narrow
        return lambda x: _slice(x, s, e, dims, step)


@kernel("Compress", since=9)
class Compress(Kernel):
    """Keep the slices along `axis` (or of the flattened input) where the bool condition is True; a
    condition shorter than the axis drops the rest."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        axis = self.attr("axis")
        self.axis = None if axis is None else int(axis)

    def run(self, x: torch.Tensor, condition: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.axis is None:
            x = x.reshape(-1)
            axis = 0
        else:
            axis = self.axis
        keep = torch.nonzero(condition.reshape(-1)[: x.shape[axis]]).reshape(-1)
        return (x.index_select(axis, keep),)


@kernel("OneHot", since=9)
class OneHot(Kernel):
    """values = [off, on]; an index in [-depth, depth) (negative wrapped, opset 11+) turns its position on,
    others (out of range included) stay off. The new axis is `axis` of the output."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", -1))

    def run(
        self, indices: torch.Tensor, depth: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        n = int(depth.reshape(-1)[0])
        rank = indices.dim()
        axis = self.axis + rank + 1 if self.axis < 0 else self.axis
        idx = indices if indices.is_floating_point() else indices.to(torch.int64)
        idx = torch.where(idx < 0, idx + n, idx).unsqueeze(axis)
        shape = [1] * (rank + 1)
        shape[axis] = n
        targets = torch.arange(n, device=indices.device).reshape(shape)
        on = targets == idx
        return (torch.where(on, values[1], values[0]),)


@kernel("NonZero", since=9)
class NonZero(Kernel):
    """Indices of the nonzero elements, (rank, count) int64, in row-major order."""

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() == 0:
            return (torch.zeros((0, int(bool(x))), dtype=torch.int64, device=x.device),)
        return (torch.nonzero(x).T.contiguous(),)


@kernel("Unique", since=11)
class Unique(Kernel):
    """Unique values (sorted, or in order of first occurrence with `sorted=0`), their first indices, the
    inverse indices and counts. Computed with numpy's unique on the host: torch.unique has no first index."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        axis = self.attr("axis")
        self.axis = None if axis is None else int(axis)
        self.sorted = bool(self.attr("sorted", 1))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dtype == torch.bfloat16:
            raise UnsupportedVariantError("Unique of bfloat16: numpy has no bfloat16 to sort it")
        a = x.detach().cpu().numpy()
        y, first, inverse, counts = np.unique(
            a, return_index=True, return_inverse=True, return_counts=True, axis=self.axis
        )
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            first, counts, inverse = first[order], counts[order], rank[inverse]
            y = a.reshape(-1)[first] if self.axis is None else np.take(a, first, axis=self.axis)
        dev = x.device
        outs = (
            torch.from_numpy(np.ascontiguousarray(y)).to(dev),
            torch.from_numpy(first.astype(np.int64)).to(dev),
            torch.from_numpy(inverse.astype(np.int64)).to(dev),
            torch.from_numpy(counts.astype(np.int64)).to(dev),
        )
        return outs[: len(self.node.output)]


@kernel("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    """For each batch entry b, its first sequence_lens[b] steps along `time_axis` reversed."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.batch_axis = int(self.attr("batch_axis", 1))
        self.time_axis = int(self.attr("time_axis", 0))

    def run(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.shape[self.time_axis]
        steps = torch.arange(t, device=x.device).reshape(t, 1)  # (time, batch)
        n = lens.to(torch.int64).reshape(1, -1)
        src = torch.where(steps < n, n - 1 - steps, steps)
        # move (time, batch) to where they sit in x, broadcast over the other dims
        shape = [1] * x.dim()
        shape[self.time_axis], shape[self.batch_axis] = t, x.shape[self.batch_axis]
        if self.time_axis > self.batch_axis:
            src = src.T
        return (torch.gather(x, self.time_axis, src.reshape(shape).expand(x.shape)),)


@kernel("Trilu", since=14)
class Trilu(Kernel):
    """The upper (default) or lower triangle of the last two dims, from diagonal k (optional input)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.upper = bool(self.attr("upper", 1))

    def run(self, x: torch.Tensor, k: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        diagonal = 0 if k is None else int(k)
        if self.upper:
            return (torch.triu(x, diagonal),)
        return (torch.tril(x, diagonal),)


@kernel("TensorScatter", since=24)
class TensorScatter(Kernel):
    """A KV-cache write: `update` copied into `past_cache` along `axis` from each batch row's write index
    (`mode` linear, or circular modulo the cache's length)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.mode = str(self.attr("mode", "linear"))
        if self.mode not in ("linear", "circular"):
            raise UnsupportedVariantError(f"TensorScatter with mode={self.mode!r}: the spec defines linear and circular")
        self.axis = int(self.attr("axis", -2))

    def run(
        self, past: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        axis = self.axis % past.dim()
        if axis == 0:
            raise ValueError("TensorScatter: axis 0 is the batch axis; the sequence axis must come after it")
        if past.dim() != update.dim() or any(
            p != u for i, (p, u) in enumerate(zip(past.shape, update.shape, strict=True)) if i != axis
        ):
            raise ValueError(f"TensorScatter: update {list(update.shape)} does not fit cache {list(past.shape)} outside axis {axis}")
        length, steps = past.shape[axis], update.shape[axis]
        start = (
            torch.zeros(past.shape[0], dtype=torch.int64, device=past.device)
            if write_indices is None
            else write_indices.to(torch.int64)
        )
        pos = start.reshape(-1, 1) + torch.arange(steps, device=past.device)  # [batch, steps]
        if self.mode == "circular":
            pos = pos % length
        elif bool((pos >= length).any()) or bool((start < 0).any()):
            raise ValueError(f"TensorScatter: write indices {start.tolist()} + {steps} steps leave the cache of length {length}")
        shape = [1] * past.dim()
        shape[0], shape[axis] = past.shape[0], steps
        index = pos.reshape(shape).expand(update.shape)
        return (past.scatter(axis, index, update),)
