"""Control-flow kernels (ONNX's controlflow family): If, Loop and Scan, their subgraphs run by the evaluator.

A body is compiled once by the TorchEvaluator building the kernel (same registry, overrides, device and
compute_dtype); the values of enclosing graphs it reads come after the node's own inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["If", "Loop", "Scan", "Scan8", "Subgraph", "SubgraphKernel", "empty_stack"]


class Subgraph(Protocol):
    """A graph attribute (a branch, a body) as the evaluator compiled it, as the kernels running it see it:
    the evaluator's `Subgraph` is one. Declared here, below the evaluator, so that the kernels never import it."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: the declared type of each output (what a loop that runs no iteration makes its scan outputs of)
    output_types: tuple[onnx.TypeProto, ...]
    #: the values of enclosing graphs it reads: the kernel's extra inputs
    outer_inputs: tuple[str, ...]

    def scope(self, outer: Mapping[str, Any]) -> dict[str, Any]:
        """What every run starts from: the outer values it reads and its initializers."""
        ...

    def run(self, args: Sequence[Any], scope: Mapping[str, Any], collect: dict[str, Any] | None = None) -> list[Any]:
        """Its outputs for `args` bound to its inputs; every value computed goes into `collect` too (a dict)."""
        ...


class SubgraphKernel(Kernel):
    """A kernel whose node carries graphs.

    `outer_inputs` names the values of enclosing graphs its subgraphs read: the evaluator passes them to
    `run` after the node's inputs (so its plan keeps them alive until then), and in a run that keeps every
    value it calls `run_collecting(values, ...)` instead, where the subgraphs' values go too. Subclasses
    implement `compute(inputs, scope, collect)`: `inputs` the node's own, `scope` the outer values by name.
    """

    outer_inputs: tuple[str, ...] = ()

    def subgraph(self, attribute: str) -> Subgraph:
        compile_graph = getattr(self.ctx, "subgraph", None)
        graph = self.attrs.get(attribute)
        if not isinstance(graph, onnx.GraphProto):
            raise ValueError(f"{self.node.op_type} node {self.node.name or '?'!r} has no graph attribute {attribute!r}")
        if compile_graph is None:
            raise UnsupportedVariantError(
                f"{self.node.op_type} runs its {attribute!r} graph with the evaluator that built it: create it "
                "through TorchEvaluator (this KernelContext cannot compile subgraphs)"
            )
        sg: Subgraph = compile_graph(graph)
        return sg

    def use(self, *graphs: Subgraph) -> None:
        """Declares the subgraphs the kernel runs: their outer-scope values become its extra inputs."""
        self.outer_inputs = tuple(dict.fromkeys(name for g in graphs for name in g.outer_inputs))

    def run(self, *inputs: Any) -> tuple[Any, ...]:
        own, scope = self._split(inputs)
        return self.compute(own, scope, None)

    def run_collecting(self, values: dict[str, Any], *inputs: Any) -> tuple[Any, ...]:
        own, scope = self._split(inputs)
        return self.compute(own, scope, values)

    def _split(self, inputs: Sequence[Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        n, outer = len(self.node.input), self.outer_inputs
        if len(inputs) != n + len(outer):
            raise TypeError(
                f"{self.node.op_type} node {self.node.name or '?'!r} takes its {n} inputs and then the outer-scope "
                f"values its subgraphs read ({', '.join(outer) or 'none'}); got {len(inputs)} values "
                "(TorchEvaluator.iter_kernels names what a kernel's run takes)"
            )
        return inputs[:n], dict(zip(outer, inputs[n:], strict=True))

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        raise NotImplementedError


def _flag(x: Any, what: str) -> bool:
    """A single-element condition as a Python bool (a device sync on CUDA: control flow needs it)."""
    if not isinstance(x, torch.Tensor) or x.numel() != 1:
        raise ValueError(f"{what} must be a tensor of one element; got {_kind(x)}")
    return bool(x)


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    return "an empty optional" if x is None else type(x).__name__


def empty_stack(declared: onnx.TypeProto, ctx: KernelContext, what: str) -> torch.Tensor:
    """What stacking zero iterations of a scan output gives: shape [0, *declared dims], the declared dtype.
    Refused when the body does not declare the element's full shape (the result's shape is unknown)."""
    t = declared.tensor_type if declared.HasField("tensor_type") else None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t is not None and t.HasField("shape") else None
    if t is None or not t.elem_type or dims is None or None in dims:
        raise UnsupportedVariantError(f"{what} ran no iteration, and its body does not declare the full shape of the scan output: the empty result's shape is unknown")
    try:
        dtype = ctx.torch_dtype(t.elem_type)
    except ValueError:
        raise UnsupportedVariantError(f"{what}: scan output of onnx element type {t.elem_type}, which torch does not hold") from None
    return torch.empty((0, *[int(d) for d in dims if d is not None]), dtype=dtype, device=ctx.device)


@kernel("If", since=1)
class If(SubgraphKernel):
    """Runs `then_branch` or `else_branch` on the values of the enclosing graphs. Versions 11 to 25 widen the
    types (sequences 13, optionals 16, more element types later) and let the branches' shapes differ (11):
    what runs is the same."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.then_branch = self.subgraph("then_branch")
        self.else_branch = self.subgraph("else_branch")
        for g in (self.then_branch, self.else_branch):
            if len(g.outputs) != len(node.output):
                raise ValueError(f"If node {node.name or '?'!r}: branch {g.name!r} has {len(g.outputs)} outputs, the node {len(node.output)}")
        self.use(self.then_branch, self.else_branch)

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        branch = self.then_branch if _flag(inputs[0], "If's cond") else self.else_branch
        return tuple(branch.run((), branch.scope(scope), collect))


@kernel("Loop", since=1)
class Loop(SubgraphKernel):
    """`for (i = 0; i < M && cond; ++i) { cond, v = body(i, cond, v); scan_outputs += ... }`.

    An omitted `M` has no trip limit; an omitted `cond` starts true, and the body's cond output then
    still ends the loop (as onnxruntime does; the spec's table says it is ignored, which with `M` omitted
    too would never end). Scan outputs are the body's extra outputs, stacked along a new first axis.
    Versions 11 to 25 widen the types (sequences 13, optionals 16, ...): what runs is the same.
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.body = self.subgraph("body")
        self.n_carried = len(self.body.inputs) - 2
        self.n_scan = len(self.body.outputs) - 1 - self.n_carried
        fits = len(node.input) == 2 + self.n_carried if self.n_carried else len(node.input) <= 2
        if self.n_carried < 0 or self.n_scan < 0 or not fits:
            raise ValueError(
                f"Loop node {node.name or '?'!r}: its body takes {len(self.body.inputs)} inputs (iteration, cond, "
                f"loop-carried) and returns {len(self.body.outputs)} (cond, loop-carried, scan outputs); the node has "
                f"{len(node.input)} inputs"
            )
        if len(node.output) > self.n_carried + self.n_scan:
            raise ValueError(f"Loop node {node.name or '?'!r} has {len(node.output)} outputs, its body makes {self.n_carried + self.n_scan}")
        self.use(self.body)

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        m = inputs[0] if len(inputs) > 0 else None
        cond = inputs[1] if len(inputs) > 1 else None
        carried = list(inputs[2:])
        body, n = self.body, self.n_carried
        trips = int(m.reshape(-1)[0]) if m is not None else None
        going = _flag(cond, "Loop's cond") if cond is not None else True
        cond_in = cond if cond is not None else torch.ones((), dtype=torch.bool, device=self.ctx.device)
        base = body.scope(scope)
        scans: list[list[Any]] = [[] for _ in range(self.n_scan)]
        i = 0
        while going and (trips is None or i < trips):
            outs = body.run((torch.tensor(i, dtype=torch.int64, device=self.ctx.device), cond_in, *carried), base, collect)
            cond_in, carried = outs[0], outs[1 : 1 + n]
            for acc, y in zip(scans, outs[1 + n :], strict=True):
                acc.append(y)
            going = _flag(cond_in, "the cond output of Loop's body")
            i += 1
        stacked = [
            torch.stack(acc) if acc else empty_stack(body.output_types[1 + n + k], self.ctx, f"Loop node {self.node.name or '?'!r}")
            for k, acc in enumerate(scans)
        ]
        return (*carried, *stacked)


def _axes(values: Any, count: int, what: str) -> list[int]:
    axes = [int(a) for a in (values or [])] + [0] * count
    if values is not None and len(values) != count:
        raise ValueError(f"Scan: {what} has {len(values)} entries for {count} tensors")
    return axes[:count]


@kernel("Scan", since=9)
class Scan(SubgraphKernel):
    """The body over slices of the scan inputs (`scan_input_axes`, `scan_input_directions`: 1 = from the
    end), carrying state; scan outputs stacked along `scan_output_axes`, in reverse where
    `scan_output_directions` is 1. Version 11 allows negative axes (accepted here from 9 on); 16 to 25
    widen the types."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.body = self.subgraph("body")
        self.m = int(self.attr("num_scan_inputs"))
        self.n = len(self.body.inputs) - self.m
        self.k = len(self.body.outputs) - self.n
        if self.n < 0 or self.k < 0 or len(node.input) != self.n + self.m:
            raise ValueError(f"Scan node {node.name or '?'!r}: {len(node.input)} inputs, num_scan_inputs={self.m}, a body of {len(self.body.inputs)} inputs and {len(self.body.outputs)} outputs do not fit")
        self.in_axes = _axes(self.attr("scan_input_axes"), self.m, "scan_input_axes")
        self.in_dirs = _axes(self.attr("scan_input_directions"), self.m, "scan_input_directions")
        self.out_axes = _axes(self.attr("scan_output_axes"), self.k, "scan_output_axes")
        self.out_dirs = _axes(self.attr("scan_output_directions"), self.k, "scan_output_directions")
        self.use(self.body)

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        states, xs = list(inputs[: self.n]), inputs[self.n :]
        slices = []
        length = None
        for j, (x, axis, direction) in enumerate(zip(xs, self.in_axes, self.in_dirs, strict=True)):
            if not -x.dim() <= axis < x.dim():
                raise ValueError(f"Scan: scan_input_axes[{j}] = {axis} is out of range for scan input {j} of shape {list(x.shape)}")
            parts = torch.unbind(x, axis)
            if length is not None and len(parts) != length:
                raise ValueError(f"Scan: scan input {j} has {len(parts)} elements along axis {axis}, scan input 0 has {length}")
            length = len(parts)
            slices.append(parts[::-1] if direction else parts)
        states, ys = _scan(self.body, states, slices, length or 0, scope, collect)
        return (*states, *self._stack(ys))

    def _stack(self, ys: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        out = []
        for k, (acc, axis, direction) in enumerate(zip(ys, self.out_axes, self.out_dirs, strict=True)):
            if not acc:
                out.append(empty_stack(self.body.output_types[self.n + k], self.ctx, f"Scan node {self.node.name or '?'!r}").movedim(0, axis))
                continue
            rank = acc[0].dim() + 1
            if not -rank <= axis < rank:
                raise ValueError(f"Scan: scan_output_axes[{k}] = {axis} is out of range for a scan output of rank {rank}")
            out.append(torch.stack(acc[::-1] if direction else acc, dim=axis))
        return out


def _scan(body: Subgraph, states: list[Any], slices: Sequence[Sequence[torch.Tensor]], length: int, scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[list[Any], list[list[torch.Tensor]]]:
    """`length` iterations of `body` on (states, the t-th slice of each input): final states, outputs per iteration."""
    n = len(states)
    base = body.scope(scope)
    ys: list[list[torch.Tensor]] = [[] for _ in range(len(body.outputs) - n)]
    for t in range(length):
        outs = body.run((*states, *[s[t] for s in slices]), base, collect)
        states = outs[:n]
        for acc, y in zip(ys, outs[n:], strict=True):
            acc.append(y)
    return states, ys


@kernel("Scan", since=8)
class Scan8(SubgraphKernel):
    """Opset 8: every input has a batch axis 0 and the scan inputs their sequence on axis 1; the optional
    `sequence_lens` shortens a batch entry's sequence (its scan outputs padded with zeros to the longest);
    `directions` reverses scan inputs (outputs stay in iteration order)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.body = self.subgraph("body")
        self.m = int(self.attr("num_scan_inputs"))
        self.n = len(self.body.inputs) - self.m
        self.k = len(self.body.outputs) - self.n
        if self.n < 0 or self.k < 0 or len(node.input) != 1 + self.n + self.m:
            raise ValueError(f"Scan node {node.name or '?'!r}: {len(node.input)} inputs, num_scan_inputs={self.m}, a body of {len(self.body.inputs)} inputs and {len(self.body.outputs)} outputs do not fit")
        self.dirs = _axes(self.attr("directions"), self.m, "directions")
        self.use(self.body)

    def compute(self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None) -> tuple[Any, ...]:
        lens, states, xs = inputs[0], inputs[1 : 1 + self.n], inputs[1 + self.n :]
        batch, steps = xs[0].shape[0], xs[0].shape[1]
        for j, x in enumerate(xs):
            if x.dim() < 2 or x.shape[0] != batch or x.shape[1] != steps:
                raise ValueError(f"Scan (opset 8): scan input {j} has shape {list(x.shape)}; every scan input must be [batch={batch}, sequence={steps}, ...]")
        lengths = [steps] * batch if lens is None else [int(v) for v in lens.tolist()]
        if len(lengths) != batch or any(not 0 <= v <= steps for v in lengths):
            raise ValueError(f"Scan (opset 8): sequence_lens {lengths} must have {batch} entries in [0, {steps}]")
        finals: list[list[Any]] = [[] for _ in range(self.n)]
        outs: list[list[torch.Tensor]] = [[] for _ in range(self.k)]
        for b, length in enumerate(lengths):
            slices = []
            for x, direction in zip(xs, self.dirs, strict=True):
                parts = torch.unbind(x[b, :length], 0)
                slices.append(parts[::-1] if direction else parts)
            st, ys = _scan(self.body, [s[b] for s in states], slices, length, scope, collect)
            for acc, s in zip(finals, st, strict=True):
                acc.append(s)
            for k, (acc, y) in enumerate(zip(outs, ys, strict=True)):
                if not y:
                    raise UnsupportedVariantError(f"Scan (opset 8): batch entry {b} has sequence length 0, so the shape of scan output {k} is unknown")
                seq = torch.stack(y)
                if length < steps:  # padded with zeros to the longest sequence
                    seq = torch.cat([seq, seq.new_zeros((steps - length, *seq.shape[1:]))])
                acc.append(seq)
        return (*[torch.stack(f) for f in finals], *[torch.stack(o) for o in outs])
