"""TorchEvaluator: runs an ONNX graph node by node with torch kernels, on CPU or CUDA, subgraphs included.

Kernels come from the opset-aware registry unless `kernels=` overrides them per op type, node name or
predicate (inside If/Loop/Scan bodies too); `compute_dtype=torch.float64` turns it into the float64 oracle.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, Literal, NamedTuple

import onnx
import torch

from ..numerics.dtypes import DType, dtype_of
from ..numerics.tensors import to_torch
from . import kernels as _kernels  # registers every kernel family
from .kernels.base import Kernel, KernelContext, UnsupportedVariantError, lookup
from .model_io import (
    InvalidModelError,
    has_subgraph,
    in_topological_order,
    iter_graphs,
    load_model,
    model_shell,
)
from .model_io import check_model as _check_model
from .tf32 import ieee_float32

__all__ = ["EvaluatorContext", "KernelOverride", "MissingKernelError", "Subgraph", "TorchEvaluator"]

KernelOverride = Any  # "torch" | "ort" | "float64" | "float32" | "float16" | "bfloat16" | type[Kernel] | Callable[..., Tensor | tuple[Tensor, ...]]
#: `TorchEvaluator.run(observe=...)`: called with each node and its outputs as they are computed
Observer = Callable[[onnx.NodeProto, Mapping[str, Any]], None]
#: override values that compute a node in another floating dtype (its floating outputs cast back)
_COMPUTE_IN = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KEY_HELP = 'keys: an op type ("", "LayerNormalization"), a node name, or a predicate f(node) -> bool; values: "torch", "ort", "float64", "float32", "float16", "bfloat16", a Kernel subclass or a callable f(*inputs)'
# Every torch op passes through autograd's dispatch layers (Autograd, ADInplaceOrView) even when nothing
# needs a gradient: about a sixth of a small op's time. A run no gradient can flow through dispatches below
# them (the tensors it makes are ordinary tensors, unlike inference_mode's). torch's private guard, looked
# up once: without it runs go through autograd as before.
_BELOW_AUTOGRAD: Callable[[], contextlib.AbstractContextManager[Any]] | None = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)


class MissingKernelError(NotImplementedError):
    """The evaluator has no torch kernel for some ops of the model: `.ops` names them all (sorted labels,
    "Conv" for the default domain, "com.microsoft::FusedMatMul" otherwise)."""

    def __init__(self, message: str, ops: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ops: tuple[str, ...] = tuple(ops)

    def __reduce__(self) -> Any:  # keeps `.ops` across pickling (pytest-xdist workers)
        return (type(self), (str(self), self.ops))


@dataclass(frozen=True)
class EvaluatorContext(KernelContext):
    """A KernelContext that can also compile a graph attribute (a branch, a loop body) into a Subgraph run
    by the same evaluator: `ctx.subgraph(graph)`. Only kernels built by TorchEvaluator get one."""

    subgraph: Callable[[onnx.GraphProto], Subgraph] | None = field(default=None, compare=False, repr=False)


class _CallableKernel(Kernel):
    """A user's function as a kernel: f(*inputs) -> Tensor | tuple[Tensor, ...]."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext, fn: Callable[..., Any]) -> None:
        super().__init__(node, ctx)
        self.fn = fn
        self.op_type = node.op_type  # type: ignore[misc]

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        out = self.fn(*inputs)
        return out if isinstance(out, tuple) else (tuple(out) if isinstance(out, list) else (out,))


class _ComputeInKernel(Kernel):
    """The registry's kernel computed in another floating dtype (float64: a node of the oracle; float16 or
    bfloat16: a node of a half-precision conversion, simulated), its floating outputs cast back to their
    declared dtypes. float8 inputs stay float8: their rounding is the model's arithmetic."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext, inner: Kernel, out_dtypes: Sequence[torch.dtype | None], dtype: torch.dtype) -> None:
        super().__init__(node, ctx)
        self.inner = inner
        self.out_dtypes = out_dtypes
        self.dtype = dtype

    def run(self, *inputs: Any) -> tuple[Any, ...]:
        outs = self.inner.run(*[_to_dtype(x, self.dtype) for x in inputs])
        return tuple(_cast_back(o, dt) for o, dt in zip(outs, self.out_dtypes, strict=False))


def _to_dtype(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() and x.element_size() >= 2 and x.dtype != dtype else x
    if isinstance(x, list):  # a sequence
        return [_to_dtype(e, dtype) for e in x]
    return x


def _cast_back(x: Any, dt: torch.dtype | None) -> Any:
    if dt is None:
        return x
    if isinstance(x, torch.Tensor):
        return x.to(dt) if x.is_floating_point() and x.dtype != dt else x
    if isinstance(x, list):
        return [_cast_back(e, dt) for e in x]
    return x


# How a step fetches its inputs: the common one- and two-input nodes index the values directly (no
# argument list built per node); nodes with more inputs go through an itemgetter, and the rare ones
# with an omitted optional input (or none at all) through the general path. _COLLECT is a node with a
# subgraph in a run that keeps every value: its kernel also gets the values, to put its body's in.
# _UNARY1 and _BINARY1 call a kernel's `direct` callable (often a bare torch function), which returns the
# output itself: no kernel frame, no tuple.
_GENERAL, _UNARY, _BINARY, _MANY, _COLLECT, _UNARY1, _BINARY1 = 0, 1, 2, 3, 4, 5, 6
_NO_TORCH_DTYPE: Any = object()  # a declared input type DType does not know


class _Step(NamedTuple):
    """One node of a run's plan, with everything the hot loop needs resolved once. Plans hold them as
    plain tuples (`tuple(step)`): the interpreter unpacks an exact tuple without iterating it; `_Step._make`
    names the fields again where speed does not matter."""

    run: Callable[..., Any]  # the kernel's bound run, or its direct() callable (_UNARY1, _BINARY1)
    arity: int  # _UNARY, _BINARY, _MANY, _GENERAL, _COLLECT, _UNARY1 or _BINARY1
    a: str | None  # first argument (_UNARY, _BINARY, _UNARY1, _BINARY1)
    b: str | None  # second argument (_BINARY, _BINARY1)
    get: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None  # all arguments (_MANY)
    out: str | None  # the output when the node has exactly one
    outputs: tuple[str, ...]
    free1: str | None  # the one value whose last use is this node
    free: tuple[str, ...]  # the values whose last use is this node, when there are several
    args: tuple[str, ...]  # the values `run` takes: the inputs, less those a direct() callable built in
    kernel: Kernel
    inputs: tuple[str, ...]  # the node's inputs (then the outer values its subgraphs read)


_Plan = tuple[tuple[Any, ...], ...]  # _Steps as plain tuples


def _step(k: Kernel, run: Callable[..., Any], args: tuple[str, ...], outs: tuple[str, ...], free: tuple[str, ...], collect: bool, ins: tuple[str, ...], direct: bool = False) -> _Step:
    if collect:
        arity = _COLLECT
    elif args and all(args):
        arity = _UNARY if len(args) == 1 else _BINARY if len(args) == 2 else _MANY
        if direct:
            arity = _UNARY1 if arity == _UNARY else _BINARY1
    else:
        arity = _GENERAL
    return _Step(
        run=run,
        arity=arity,
        a=args[0] if arity in (_UNARY, _BINARY, _UNARY1, _BINARY1) else None,
        b=args[1] if arity in (_BINARY, _BINARY1) else None,
        get=itemgetter(*args) if arity == _MANY else None,
        out=outs[0] if len(outs) == 1 else None,
        outputs=outs,
        free1=free[0] if len(free) == 1 else None,
        free=free if len(free) > 1 else (),
        args=args,
        kernel=k,
        inputs=ins,
    )


def _direct(k: Kernel, n_outputs: int, ins: tuple[str, ...], static: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[str, ...]] | None:
    """The kernel's `direct` callable and the inputs it takes: built for its inputs whose values `static`
    holds (omitted ones: None) if it can, else taking every input; None when it has none, or the node
    has more than one output, or the callable would take no input or more than two."""
    if n_outputs != 1 or type(k).direct is Kernel.direct:
        return None
    consts = {j: static[x] if x else None for j, x in enumerate(ins) if not x or x in static}
    args = tuple(x for j, x in enumerate(ins) if j not in consts)
    if consts and len(args) in (1, 2):
        fn = k.direct(consts)
        if fn is not None:
            return fn, args
    if len(ins) in (1, 2) and all(ins):
        fn = k.direct({})
        if fn is not None:
            return fn, ins
    return None


def _build_plan(
    node_outputs: Sequence[tuple[str, ...]],
    kernels: Sequence[Kernel | None],
    step_inputs: Sequence[tuple[str, ...]],
    outputs: Sequence[str],
    keep_all: bool,
    *,
    static: Mapping[str, Any] | None = None,
    folded: Collection[int] = (),
    guards: Mapping[int, Callable[..., Any]] | None = None,
    keep: Collection[str] = (),
) -> _Plan:
    """The steps computing `outputs`: only the nodes they depend on, in graph order, each freeing the
    values it is the last to read (nothing with `keep_all`, whose nodes with a subgraph collect theirs;
    nor any of `keep`).

    `static`: values that are the same in every run of the plan (initializers; a shape-specialised plan's
    folded values), which a kernel's `direct` callable may build in (`Kernel.direct`).
    A shape-specialised plan leaves out the `folded` nodes (their values are put in before it runs), but for
    those in `guards`: there the guard runs instead of the kernel, on the node's first input."""
    guards = guards or {}
    static = static or {}
    order = [i for i in _needed(node_outputs, step_inputs, outputs) if i not in folded or i in guards]
    runs: dict[int, tuple[Callable[..., Any], tuple[str, ...]]] = {}
    direct: set[int] = set()
    for i in order:
        k = kernels[i]
        assert k is not None  # a missing kernel raised MissingKernelError before any plan
        ins = step_inputs[i]
        if i in guards:
            runs[i] = (guards[i], ins[:1])
        elif keep_all and hasattr(k, "run_collecting"):
            runs[i] = (k.run_collecting, ins)
        elif (fast := _direct(k, len(node_outputs[i]), ins, static)) is not None:
            runs[i] = fast
            direct.add(i)
        else:
            runs[i] = (k.run, ins)
    last_use: dict[str, int] = {}
    for i in order:
        for x in runs[i][1]:
            if x:
                last_use[x] = i
    kept = set(outputs) | set(keep)
    steps = []
    for i in order:
        k = kernels[i]
        assert k is not None
        run, args = runs[i]
        free: tuple[str, ...] = ()
        if not keep_all:
            free = tuple(sorted({x for x in args if x and last_use.get(x) == i and x not in kept}))
        outs = () if i in guards else node_outputs[i]
        collect = i not in guards and keep_all and hasattr(k, "run_collecting")
        steps.append(tuple(_step(k, run, args, outs, free, collect, step_inputs[i], i in direct)))
    return tuple(steps)


def _needed(node_outputs: Sequence[tuple[str, ...]], step_inputs: Sequence[tuple[str, ...]], outputs: Collection[str]) -> list[int]:
    """The nodes `outputs` depend on, in graph order (`node_outputs`: each node's outputs)."""
    produced = {o: i for i, outs in enumerate(node_outputs) for o in outs if o}
    needed: set[int] = set()
    stack = [produced[o] for o in outputs if o in produced]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        stack.extend(produced[x] for x in step_inputs[i] if x in produced)
    return sorted(needed)


class _ShapeChanged(Exception):
    """A shape-specialised plan's guard: a value whose shape its folded values were computed from has
    another shape this run (shapes that depend on more than the feeds' shapes: NonZero, data-dependent
    Reshape targets, ...)."""


class _NodeFailed(RuntimeError):
    """A kernel raised: names the node, its op and its inputs (the kernel's exception is the cause)."""


def _execute(plan: _Plan, values: dict[Any, Any]) -> None:
    """Runs `plan` on `values` (which it fills with the outputs and empties of the freed values)."""
    # The hot loop: everything per node was resolved into its _Step by _build_plan. No per-node
    # bookkeeping for errors either: `step` is still the failing node when the except runs.
    step: tuple[Any, ...] | None = None
    try:
        for step in plan:
            run, arity, a, b, get, out, outs, free1, free, args, k, ins = step
            # (no local names for the inputs: they would keep a freed value alive past its last use)
            if arity == _BINARY1:
                try:
                    values[out] = run(values[a], values[b])
                except Exception:  # the kernel's own run decides: its fallback (uint32 arithmetic), or its error
                    values[out] = k.run(*[values[x] if x else None for x in ins])[0]
            elif arity == _UNARY1:
                try:
                    values[out] = run(values[a])
                except Exception:
                    values[out] = k.run(*[values[x] if x else None for x in ins])[0]
            else:
                if arity == _BINARY:
                    res = run(values[a], values[b])
                elif arity == _UNARY:
                    res = run(values[a])
                elif arity == _MANY:
                    res = run(*get(values))
                elif arity == _GENERAL:
                    res = run(*[values[x] if x else None for x in args])
                else:  # _COLLECT
                    res = run(values, *[values[x] if x else None for x in args])
                if out is not None:
                    values[out] = res[0]
                else:
                    values.update(zip(outs, res, strict=False))
                res = None  # nor would the outputs' tuple, past the next step
            if free1 is not None:
                del values[free1]
            elif free:
                for x in free:
                    del values[x]
    except Exception as exc:
        if step is None or isinstance(exc, _ShapeChanged):  # an empty plan fails nowhere; a guard is no node
            raise
        raise _failure(_Step._make(step), values, exc) from (exc.__cause__ if isinstance(exc, _NodeFailed) else exc)


def _execute_observed(plan: _Plan, values: dict[Any, Any], keep: Collection[str], observe: Observer, below_autograd: bool) -> None:
    """`_execute` calling `observe(node, outputs)` after each node, then freeing what no later node reads
    (outputs nobody reads included): memory stays at the live values, whatever `observe` looks at. The
    kernels run below autograd when `below_autograd`, `observe` never does (it may use autograd)."""
    steps = [_Step._make(step) for step in plan]
    # a direct step runs its kernel's own run here, which reads every input, the initializers its direct
    # callable built in too: the values are freed after their last read by what runs here, not by the
    # plan's frees (an initializer read by an Identity and built into a later LayerNorm would be gone)
    names_of = [step.inputs if step.arity in (_UNARY1, _BINARY1) else step.args for step in steps]
    kept = set(keep)
    last: dict[str, int] = {}
    for j, names in enumerate(names_of):
        for x in names:
            if x:
                last[x] = j
    frees: list[list[str]] = [[] for _ in steps]
    for x, j in last.items():
        if x not in kept:
            frees[j].append(x)
    read = set(last) | kept
    step: _Step | None = None
    try:
        for step, names, free in zip(steps, names_of, frees, strict=True):
            run = step.kernel.run if step.arity in (_UNARY1, _BINARY1) else step.run  # the tuple-returning run
            with _BELOW_AUTOGRAD() if below_autograd else contextlib.nullcontext():  # type: ignore[misc]
                res = run(*[values[x] if x else None for x in names])
            outs = dict(zip(step.outputs, res, strict=False))
            outs.pop("", None)
            values.update(outs)
            observe(step.kernel.node, outs)
            for x in free:
                del values[x]
            for x in outs:
                if x not in read:
                    del values[x]
    except Exception as exc:
        if step is None:
            raise
        raise _failure(step, values, exc) from (exc.__cause__ if isinstance(exc, _NodeFailed) else exc)


def _failure(step: _Step, values: Mapping[str, Any], exc: Exception) -> _NodeFailed:
    node = step.kernel.node
    if isinstance(exc, _NodeFailed):  # a node of this one's subgraph: say where it sits
        return _NodeFailed(f"{exc} (inside {node.op_type} node {node.name or '?'!r})")
    described = ", ".join(_describe_value(x, values.get(x)) for x in step.inputs)
    why = str(exc)
    if isinstance(exc, IndexError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
        why = f"it returned no outputs, the node has {len(step.outputs)}"  # res[0] in _execute, not the kernel
    return _NodeFailed(f"torch kernel {type(step.kernel).__name__} failed on node {node.name or '?'!r} ({node.op_type}) with inputs {described}: {why}")


class Subgraph:
    """A graph attribute (If's branches, Loop's and Scan's body, SequenceMap's body) compiled once, by the
    evaluator running its node: the same kernel registry, overrides, device and compute_dtype.

    `run(args, scope)` binds `args` to its inputs and returns its outputs; `scope(outer)` is what every run
    starts from: the outer-scope values it reads (`outer_inputs`, subgraphs inside it included) and its
    initializers. With `collect` (a dict), every value the run computed goes into it as well.
    """

    def __init__(
        self,
        graph: onnx.GraphProto,
        kernels: list[Kernel | None],
        step_inputs: list[tuple[str, ...]],
        initializers: dict[str, Any],
    ) -> None:
        self.name = graph.name
        self.nodes = list(graph.node)
        self.kernels = kernels
        self.inputs = tuple(vi.name for vi in graph.input)
        self.outputs = tuple(vi.name for vi in graph.output)
        #: the declared type of each output (what a loop that runs no iteration makes its scan outputs of)
        self.output_types = tuple(vi.type for vi in graph.output)
        self._step_inputs = step_inputs
        self._initializers = initializers
        self._node_outputs = [tuple(n.output) for n in self.nodes]
        defined = set(self.inputs) | set(initializers) | {o for outs in self._node_outputs for o in outs if o}
        used = [x for ins in step_inputs for x in ins if x] + list(self.outputs)
        #: the values of enclosing graphs it reads, in a fixed order
        self.outer_inputs = tuple(dict.fromkeys(x for x in used if x not in defined))
        self._plan: _Plan = ()
        self._plan_all: _Plan = ()

    def prepare(self) -> None:
        """Builds the plans, once every kernel (of this graph and the graphs around it) exists."""
        init = self._initializers
        self._plan = _build_plan(self._node_outputs, self.kernels, self._step_inputs, self.outputs, keep_all=False, static=init)
        self._plan_all = _build_plan(self._node_outputs, self.kernels, self._step_inputs, self.outputs, keep_all=True, static=init)

    def scope(self, outer: Mapping[str, Any]) -> dict[str, Any]:
        values = {name: outer[name] for name in self.outer_inputs}
        values.update(self._initializers)
        return values

    def run(self, args: Sequence[Any], scope: Mapping[str, Any], collect: dict[str, Any] | None = None) -> list[Any]:
        values = dict(scope)
        values.update(zip(self.inputs, args, strict=False))
        if collect is None:
            _execute(self._plan, values)
        else:
            _execute(self._plan_all, values)
            values.pop("", None)
            collect.update(values)
        return [values[o] for o in self.outputs]

    def __repr__(self) -> str:
        return f"Subgraph({self.name!r}, {len(self.nodes)} nodes, inputs {list(self.inputs)}, outer {list(self.outer_inputs)})"


# Ops that never fold, whatever their inputs: their values are draws, not functions of their inputs.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"})
_SHAPE_SOURCES = frozenset({"Shape", "Size"})  # they read their input's shape, never its values
# Ops whose outputs' shapes follow from their inputs' shapes and attributes, and from the values of the
# inputs at these positions only (a Reshape's target, a Slice's bounds): a Shape of such a value, when those
# inputs are fixed by the feeds' shapes too, needs no guard. An op not listed keeps its Shapes guarded
# (NonZero, Unique, Compress, TopK, Loop, ...: shapes that can follow data).
_SHAPE_ONLY = dict.fromkeys(
    (
        "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "Cast",
        "CastLike", "Ceil", "Celu", "Clip", "Concat", "Cos", "Cosh", "CumSum", "Div", "Einsum", "Elu", "Equal", "Erf",
        "Exp", "Flatten", "Floor", "Gather", "GatherElements", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "Hardmax",
        "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual",
        "Log", "LogSoftmax", "MatMul", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu",
        "Reciprocal", "Relu", "RMSNormalization", "Round", "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
        "Size", "Softmax", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Swish", "Tan", "Tanh", "ThresholdedRelu",
        "Transpose", "Trilu", "Where", "Xor",
    ),
    (),
) | {
    "Reshape": (1,), "Expand": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,), "Tile": (1,),
    "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    **dict.fromkeys(
        ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"),
        (1,),
    ),
}
_MAX_SIGNATURES = 8  # shape-specialised plans kept per output set (the least recently used goes first)
_UNFOLDABLE: Any = object()  # a signature whose run is the plain plan's


class _ShapePlans:
    """One output set's plans specialised per feed-shape signature: the values that depend only on the
    feeds' shapes (and initializers, constants) are computed by the first run with a signature and put in
    as they are by the next ones, which run only the other nodes.

    `folded` are the plan's nodes whose every input is such a value (Shape and Size read only their input's
    shape); a Shape/Size of a value that is neither a feed nor folded keeps a guard in the specialised plan,
    comparing its input's shape with the recorded one (a shape may depend on data: NonZero), and a run whose
    guard fails is rerun by the plain plan, as every later run with that signature."""

    def __init__(self, ev: TorchEvaluator, outputs: tuple[str, ...], keep_all: bool, plain: _Plan) -> None:
        self.ev, self.outputs, self.keep_all, self.plain = ev, outputs, keep_all, plain
        node_outputs = ev._facts.node_outputs
        needed = _needed(node_outputs, ev._inputs, outputs)
        wanted = set(outputs)
        # a node making an asked-for output runs: the caller gets a tensor of its own, not the cached one
        self.folded = {i for i in needed if i in ev._foldable and not wanted.intersection(node_outputs[i])}
        self.sources = [i for i in needed if i in self.folded and i in ev._guarded_sources]
        consumed = {x for i in needed if i not in self.folded for x in ev._inputs[i] if x}
        made = {o for i in self.folded for o in node_outputs[i] if o}
        # what the specialised plan needs put in: every folded value with keep_all, else those read by a
        # node it runs (the other folded values are only read by folded nodes, which it does not run)
        self.cached_names = tuple(sorted(made if keep_all else made & (consumed | set(outputs))))
        self.by_signature: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def run(self, values: dict[str, Any], signature: tuple[Any, ...]) -> bool:
        """Runs on `values` (the initializers and the feeds); False when a guard failed (values half-done)."""
        entry = self.by_signature.get(signature)
        if entry is None:
            self._record(values, signature)
            return True
        self.by_signature.move_to_end(signature)
        if entry is _UNFOLDABLE:
            _execute(self.plain, values)
            return True
        plan, cached = entry
        values.update(cached)
        try:
            _execute(plan, values)
        except _ShapeChanged:
            self.by_signature[signature] = _UNFOLDABLE
            return False
        return True

    def _record(self, values: dict[str, Any], signature: tuple[Any, ...]) -> None:
        ev = self.ev
        shapes: dict[int, Any] = {}

        def recording(i: int, run: Callable[..., Any]) -> Callable[..., Any]:
            def record(x: Any) -> Any:
                shapes[i] = x.shape if isinstance(x, torch.Tensor) else None
                return run(x)

            return record

        # the plain plan, but keeping the values to cache, its guarded Shape/Size recording their input's shape
        recorders = {id(ev._kernels[i]): recording(i, ev._kernels[i].run) for i in self.sources}
        plan = _build_plan(ev._facts.node_outputs, ev._kernels, ev._inputs, self.outputs, self.keep_all, static=ev._initializers, keep=self.cached_names)
        steps = [_Step._make(st) for st in plan]
        _execute(tuple(tuple(st._replace(run=recorders[id(st.kernel)])) if id(st.kernel) in recorders else tuple(st) for st in steps), values)
        cached = {n: values[n] for n in self.cached_names}
        if any(not isinstance(v, torch.Tensor) for v in cached.values()) or any(v is None for v in shapes.values()):
            entry: Any = _UNFOLDABLE  # sequences and optionals may be built on in place: never shared
        else:
            guards = {i: _guard(shapes[i]) for i in self.sources if i in shapes}
            static = {**ev._initializers, **cached}  # this signature's plan builds its folded values in
            plan = _build_plan(ev._facts.node_outputs, ev._kernels, ev._inputs, self.outputs, self.keep_all, static=static, folded=self.folded, guards=guards)
            entry = (plan, cached)
        self.by_signature[signature] = entry
        if len(self.by_signature) > _MAX_SIGNATURES:
            self.by_signature.popitem(last=False)


def _guard(shape: torch.Size) -> Callable[[torch.Tensor], tuple[()]]:
    def guard(x: torch.Tensor) -> tuple[()]:
        if x.shape != shape:
            raise _ShapeChanged
        return ()

    return guard


class _Same:
    """`with_compute_dtype`'s default for `kernels`: the evaluator's own overrides."""

    def __repr__(self) -> str:
        return "<the same kernels>"


_SAME = _Same()


def _parse_compute_dtype(compute_dtype: torch.dtype | str | None) -> torch.dtype | None:
    if isinstance(compute_dtype, str):
        try:
            compute_dtype = dtype_of(compute_dtype).torch  # the project's spellings: float64, fp64, double
        except ValueError:
            raise ValueError(f"compute_dtype {compute_dtype!r} is not a dtype name; use 'float64' (the oracle), 'float32' or None") from None
    if compute_dtype not in (None, torch.float64, torch.float32):
        raise ValueError(f"compute_dtype must be torch.float64 (the oracle), torch.float32 or None; got {compute_dtype}")
    return compute_dtype


def _promote(t: torch.Tensor, compute_dtype: torch.dtype | None) -> torch.Tensor:
    """A decoded initializer as `KernelContext.tensor` gives it in an evaluator computing in `compute_dtype`
    (float8 stays float8); the tensor itself when that changes nothing."""
    if compute_dtype is not None and t.is_floating_point() and t.element_size() >= 2 and t.dtype != compute_dtype:
        return t.to(compute_dtype)
    return t


# floating initializers of this many elements or more are weights: no op's shape inference reads their values
_WEIGHT_ELEMENTS = 1024
_FLOAT_CODES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


class _ModelFacts:
    """What the evaluator reads off its model whatever its compute dtype and overrides: inputs, outputs,
    nodes, and, worked out on first use, the types shape inference gives, the node names, per-node facts.
    An evaluator and the twins `with_compute_dtype` makes share one; nothing in it changes once made."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
        _refuse_untorchable(graph, "the model's")
        _refuse_reassigned(graph)
        self.input_types: dict[str, onnx.TypeProto.Tensor] = {}
        self.input_kinds: dict[str, onnx.TypeProto] = {}
        init_names = {i.name for i in graph.initializer}
        for vi in graph.input:
            if vi.name in init_names:
                continue
            self.input_types[vi.name] = vi.type.tensor_type
            if vi.type.WhichOneof("value") != "tensor_type":
                self.input_kinds[vi.name] = vi.type
        self.feed_specs = {name: _feed_spec(t) for name, t in self.input_types.items()}
        self.output_names = [o.name for o in graph.output]
        self.nodes = list(graph.node)
        self.value_types: Mapping[str, onnx.TypeProto.Tensor] = _InferredTypes(self)
        self._output_dtypes: dict[str, torch.dtype | None] | None = None

    @functools.cached_property
    def types(self) -> tuple[dict[str, onnx.TypeProto.Tensor], dict[str, onnx.TypeProto.Tensor]]:
        """Declared tensor types by value name (subgraphs included), and the element types of sequence
        and optional values, as shape inference gives them."""
        types: dict[str, Any] = {}
        elements: dict[str, Any] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(_without_weights(self.model), strict_mode=False)
        except Exception:  # inference is a convenience here; models with custom ops may defeat it
            inferred = self.model
        for g in iter_graphs(inferred.graph):
            for vi in list(g.input) + list(g.value_info) + list(g.output):
                if vi.type.HasField("tensor_type"):
                    types[vi.name] = vi.type.tensor_type
                else:
                    element = _element_type(vi.type)
                    if element is not None:
                        elements[vi.name] = element
            for init in g.initializer:
                t = onnx.TypeProto.Tensor()
                t.elem_type = init.data_type
                types.setdefault(init.name, t)
        return types, elements

    @functools.cached_property
    def constants(self) -> frozenset[str]:
        """The values that are constant in the model: initializers (of bodies too) and Constant outputs,
        as onnxruntime holds them (OrtKernel gives them to the ops that prepack them)."""
        names: set[str] = set()
        for g in iter_graphs(self.model.graph):
            names.update(i.name for i in g.initializer)
            names.update(n.output[0] for n in g.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output)
        return frozenset(names)

    def declared_torch_dtype(self, name: str, elements: bool = False) -> torch.dtype | None:
        types, element_types = self.types
        t = types.get(name)
        if t is None and elements:
            t = element_types.get(name)
        if t is None or not t.elem_type:
            return None
        try:
            return DType(t.elem_type).torch
        except ValueError:
            return None

    def output_dtypes(self, kernels: Sequence[Kernel]) -> dict[str, torch.dtype | None]:
        """The declared dtype of each graph output: as the graph declares it when it declares every
        output's element type and no value of a body can share an output's name (none of the main graph's
        `kernels` has a body), else as shape inference gives it."""
        if self._output_dtypes is None:
            declared: dict[str, torch.dtype | None] | None = {}
            for vi in self.model.graph.output:
                t = vi.type
                if declared is None or not (t.HasField("tensor_type") and t.tensor_type.elem_type):
                    declared = None
                    break
                try:
                    declared[vi.name] = DType(t.tensor_type.elem_type).torch
                except ValueError:
                    declared[vi.name] = None
            if declared is None or any(self.bodies(kernels)):
                declared = {n: self.declared_torch_dtype(n) for n in self.output_names}
            self._output_dtypes = declared
        return self._output_dtypes

    _bodies: list[bool] | None = None

    def bodies(self, kernels: Sequence[Kernel]) -> list[bool]:
        """Per main-graph node, whether it has a body, read off the attributes `kernels` (its kernels,
        whichever evaluator of the model built them) parsed."""
        if self._bodies is None:
            self._bodies = [_has_body(k) for k in kernels]
        return self._bodies

    def fold_candidates(self, kernels: Sequence[Kernel]) -> list[bool]:
        """Per main-graph node: whether it may fold at all (default domain, no random draw, no body)."""
        if self._candidates is None:
            domains = (n.domain for n in self.nodes)
            self._candidates = [
                not body and op not in _NONDETERMINISTIC and domain in ("", "ai.onnx")
                for body, op, domain in zip(self.bodies(kernels), self.op_types, domains, strict=True)
            ]
        return self._candidates

    _candidates: list[bool] | None = None

    @functools.cached_property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.nodes]

    @functools.cached_property
    def inputs(self) -> list[tuple[str, ...]]:
        """Each main-graph node's inputs ("" where an optional one is omitted)."""
        return [tuple(n.input) for n in self.nodes]

    @functools.cached_property
    def node_outputs(self) -> list[tuple[str, ...]]:
        """Each main-graph node's outputs ("" where an optional one is omitted)."""
        return [tuple(n.output) for n in self.nodes]

    @functools.cached_property
    def outputs(self) -> list[tuple[str, ...]]:
        """Each main-graph node's outputs, the omitted ones left out."""
        return [tuple(o for o in outs if o) for outs in self.node_outputs]

    @functools.cached_property
    def names(self) -> tuple[frozenset[str], frozenset[str]]:
        """The names and the op types of every node, subgraphs included (what `kernels=` keys may name)."""
        every = [n for g in iter_graphs(self.model.graph) for n in g.node]
        return frozenset(n.name for n in every if n.name), frozenset(n.op_type for n in every)


class _InferredTypes(Mapping[str, onnx.TypeProto.Tensor]):
    """The inferred tensor types of a model's values, inferred when first read (OrtKernel takes them)."""

    def __init__(self, facts: _ModelFacts) -> None:
        self._facts = facts

    def __getitem__(self, name: str) -> onnx.TypeProto.Tensor:
        return self._facts.types[0][name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._facts.types[0])

    def __len__(self) -> int:
        return len(self._facts.types[0])


def _has_body(k: Kernel) -> bool:
    """Whether the kernel's node has a GRAPH or GRAPHS attribute (as `has_subgraph`), from the attributes
    its kernel parsed: reading them off the node again costs more than the rest of the fold analysis."""
    attrs = getattr(k, "attrs", None)
    if attrs is None:  # a kernel that kept no attributes
        return has_subgraph(k.node)
    for v in attrs.values():
        if isinstance(v, onnx.GraphProto) or (isinstance(v, list) and v and isinstance(v[0], onnx.GraphProto)):
            return True
        if isinstance(v, list) and not v:  # an empty GRAPHS attribute, or another empty list: the node says
            return has_subgraph(k.node)
    return False


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` for shape inference: its floating initializers of `_WEIGHT_ELEMENTS` or more without their
    data (no op infers a shape from such values: shapes, axes, counts and scales are integers or a few
    floats), so that inference does not copy the weights twice (a quarter of a build at hidden size 256)."""
    graph = model.graph
    heavy = {i for i, t in enumerate(graph.initializer) if t.data_type in _FLOAT_CODES and math.prod(t.dims) >= _WEIGHT_ELEMENTS}
    if not heavy:
        return model
    light = model_shell(model)
    g = light.graph
    for i, init in enumerate(graph.initializer):
        if i in heavy:
            t = g.initializer.add()
            t.name, t.data_type = init.name, init.data_type
            t.dims.extend(init.dims)
        else:
            g.initializer.append(init)
    return light


class _Compiler:
    """What `EvaluatorContext.subgraph` calls: the evaluator compiling a subgraph, with the override its node
    hands down to the body's nodes ("ort", "float64" or none). Detached once the evaluator is built, so
    that kernels do not keep the evaluator alive."""

    def __init__(self, evaluator: TorchEvaluator, inherited: str | None) -> None:
        self.evaluator: TorchEvaluator | None = evaluator
        self.inherited = inherited

    def __call__(self, graph: onnx.GraphProto) -> Subgraph:
        if self.evaluator is None:
            raise RuntimeError("subgraphs are compiled while TorchEvaluator builds its kernels, not after")
        return self.evaluator._compile(graph, self.inherited)


class TorchEvaluator:
    """Runs `model` with torch kernels.

    - `device`: "cpu" or "cuda" (or a torch.device).
    - `kernels`: overrides, `{key: value}`; a key is an op type `("", "LayerNormalization")` (or a plain
      op type string that names no node), a node name, or a predicate `f(node) -> bool`; a value is
      `"torch"`, `"ort"` (the node run by onnxruntime on the matching provider), `"float64"` (the torch
      kernel computed in float64, cast back; likewise `"float32"`, `"float16"`, `"bfloat16"`: a node of a
      mixed-precision model, simulated) or a callable `f(*inputs)`. Node names win over op types,
      op types over predicates. Keys reach the nodes inside If/Loop/Scan/SequenceMap bodies too; "ort" or
      "float64" on a node with a body applies to every node of the body without an override of its own
      (the control flow itself stays in torch: it computes nothing).
    - `compute_dtype=torch.float64`: every floating tensor, initializer and Cast target promoted to
      float64 — the oracle (subgraphs included). Declared output dtypes stay available in `output_dtypes`.
      `ev.with_compute_dtype(torch.float64)` builds that oracle from an evaluator already built, for a
      fraction of a build's cost (what it read off the model and the values it decoded are reused).
    - `missing`: "error" (default) raises MissingKernelError naming every op without a torch kernel, with
      the `kernels={...}` that runs them; "ort" runs each such node on onnxruntime (as the "ort" override
      does) and lists those ops in `ops_run_by_ort`.

    Values: tensors; a sequence is a Python list of tensors; an empty optional is None.
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device = "cpu",
        kernels: Mapping[Any, KernelOverride] | None = None,
        compute_dtype: torch.dtype | str | None = None,
        check_model: bool = True,
        missing: Literal["error", "ort"] = "error",
    ) -> None:
        self.model = load_model(model)
        if check_model:
            try:
                # the one gate (cached per model) the fixture and CLI use too; its proto has the nodes in an
                # order they can run in, sorted where the file's were not
                self.model = _check_model(self.model).proto
            except InvalidModelError as exc:
                raise ValueError(f"{exc} (or pass check_model=False to try anyway)") from None
        else:
            self.model = in_topological_order(self.model)  # nodes run in the order they come
        if missing not in ("error", "ort"):
            raise ValueError(f"missing={missing!r} is not valid; use 'error' (name the ops without a torch kernel) or 'ort' (run them on onnxruntime)")
        self.missing = missing
        self.device = torch.device(device)
        self.compute_dtype = _parse_compute_dtype(compute_dtype)
        self._build(_ModelFacts(self.model), kernels, None)

    def with_compute_dtype(self, compute_dtype: torch.dtype | str | None, *, kernels: Mapping[Any, KernelOverride] | _Same | None = _SAME) -> TorchEvaluator:
        """This evaluator's model on its device with another `compute_dtype` (`torch.float64`: the float64
        oracle) and, when given, other `kernels` (default: this evaluator's): what
        `TorchEvaluator(ev.model, device=ev.device, compute_dtype=..., kernels=..., check_model=False,
        missing=ev.missing)` builds, outputs bit for bit, at a fraction of the cost. It reuses what this
        evaluator read off the model (inputs, outputs, types, the checker's verdict), its decoded
        initializers and constants (promoted where the compute dtype promotes them), and its analysis of
        the values that depend only on the feeds' shapes when the overrides are the same. Its kernels,
        plans and values are its own: running one evaluator never changes what the other computes (the
        tensors both hold unchanged, integer initializers and constants, are read, never written, by every
        run)."""
        twin = TorchEvaluator.__new__(TorchEvaluator)
        twin.model, twin.missing, twin.device = self.model, self.missing, self.device
        twin.compute_dtype = _parse_compute_dtype(compute_dtype)
        twin._build(self._facts, self._overrides if isinstance(kernels, _Same) else kernels, self)
        return twin

    # -- construction ------------------------------------------------------------------------
    def _build(self, facts: _ModelFacts, kernels: Mapping[Any, KernelOverride] | None, base: TorchEvaluator | None) -> None:
        """Everything but the model and its check: from `facts` (this model's), and from `base` (an
        evaluator of the same model on the same device) what its compute dtype lets this one reuse."""
        self._facts = facts
        self.opsets = dict(facts.opsets)
        self._compilers: list[_Compiler] = []
        self._ctxs: dict[tuple[str, str | None], EvaluatorContext] = {}
        default_ctx = self._context("")
        self.input_types = dict(facts.input_types)
        self._input_kinds = facts.input_kinds  # sequence and optional inputs: their full type
        # per input, resolved once: (declared, torch dtype or None, fixed dims by axis or None when the
        # rank is unknown); run() checks feeds against these and describes `declared` only on failure
        self._feed_specs = facts.feed_specs
        self.output_names = list(facts.output_names)
        self._output_tuple = tuple(self.output_names)

        # a base without a compute dtype holds every value as decoded; one with this compute dtype, as promoted
        reuse = base is not None and base.device == self.device and base.compute_dtype in (None, self.compute_dtype)
        if reuse:
            assert base is not None
            self._initializers: dict[str, torch.Tensor] = {name: _promote(t, self.compute_dtype) for name, t in base._initializers.items()}
        else:
            self._initializers = {init.name: default_ctx.tensor(init) for init in self.model.graph.initializer}

        self.nodes = list(facts.nodes)
        self._overrides = dict(kernels or {})
        self._validate_overrides()
        self._missing: dict[str, int] = {}  # op label -> opset, for the error
        self._by_ort: set[str] = set()
        self._records: list[tuple[onnx.NodeProto, Kernel | None, tuple[str, ...]]] = []
        self._subgraphs: list[Subgraph] = []
        priors: Sequence[Kernel | None] = base._kernels if reuse and base is not None else [None] * len(self.nodes)
        try:
            self._kernels: list[Kernel] = []
            self._inputs: list[tuple[str, ...]] = []
            for node, prior, node_inputs in zip(self.nodes, priors, facts.inputs, strict=True):
                k, ins = self._add_node(node, None, prior, node_inputs)
                self._kernels.append(k)  # type: ignore[arg-type]
                self._inputs.append(ins)
        finally:
            for c in self._compilers:  # kernels keep their contexts; these must not keep the evaluator
                c.evaluator = None
        if self._missing:
            raise _missing_error(self._missing)
        #: sorted labels of the ops without a torch kernel that missing="ort" runs on onnxruntime
        self.ops_run_by_ort: tuple[str, ...] = tuple(sorted(self._by_ort))
        #: declared dtype of every graph output (what a non-oracle run produces; None for a sequence)
        self.output_dtypes = dict(facts.output_dtypes(self._kernels))
        for sg in self._subgraphs:
            sg.prepare()
        self._plans: dict[tuple[tuple[str, ...], bool], _Plan] = {}
        # (foldable nodes, guarded Shape/Size nodes): worked out by the first run that can use them, as a
        # run streaming to `observe` never does; the same for an evaluator with the same overrides
        self._fold: tuple[frozenset[int], frozenset[int]] | None = None
        if base is not None and base._fold is not None and base._overrides == self._overrides:
            self._fold = base._fold
        #: feed names in a fixed order, for the shape signature; None when some input is a sequence or an
        #: optional (no shape to key on): every run is then the plain plan's
        self._signature_names: tuple[str, ...] | None = None if self._input_kinds else tuple(self.input_types)
        self._shaped: dict[tuple[tuple[str, ...], bool], _ShapePlans | None] = {}
        # a user's kernel may use autograd itself: runs calling one keep torch's autograd layers
        self._below_autograd = _BELOW_AUTOGRAD is not None and not any(isinstance(k, _CallableKernel) for _, k, _ in self._records)

    def _context(self, domain: str, inherited: str | None = None) -> EvaluatorContext:
        key = (domain, inherited)
        ctx = self._ctxs.get(key)
        if ctx is None:
            if inherited is None:
                compiler = _Compiler(self, None)
                self._compilers.append(compiler)
                ctx = EvaluatorContext(self.device, self.opsets.get(domain, 1), self.compute_dtype, subgraph=compiler)
            else:
                compiler = _Compiler(self, inherited)
                self._compilers.append(compiler)
                ctx = replace(self._context(domain), subgraph=compiler)
            self._ctxs[key] = ctx
        return ctx

    def _declared_torch_dtype(self, name: str, elements: bool = False) -> torch.dtype | None:
        return self._facts.declared_torch_dtype(name, elements)

    def _validate_overrides(self) -> None:
        if not self._overrides:
            return
        names, op_types = self._facts.names
        for key, value in self._overrides.items():
            if not (isinstance(key, tuple | str) or callable(key)):
                raise TypeError(f"kernels key {key!r} is not valid; {_KEY_HELP}")
            if isinstance(key, tuple) and (len(key) != 2 or not all(isinstance(p, str) for p in key)):
                raise TypeError(f"kernels key {key!r}: an op type is a (domain, op_type) pair such as ('', 'MatMul')")
            if isinstance(key, str) and key not in names and key not in op_types:
                raise KeyError(f"kernels key {key!r} names no node and no op type of this model; node names: {sorted(names)[:20]}")
            if not (value in ("torch", "ort") or value in _COMPUTE_IN or callable(value)):
                raise ValueError(f"kernels[{key!r}] = {value!r} is not valid; {_KEY_HELP}")

    def _override_for(self, node: onnx.NodeProto) -> KernelOverride | None:
        if not self._overrides:
            return None
        if node.name and node.name in self._overrides:
            return self._overrides[node.name]
        key = (node.domain or "", node.op_type)
        if key in self._overrides:
            return self._overrides[key]
        if node.op_type in self._overrides and node.op_type not in self._facts.names[0]:
            return self._overrides[node.op_type]
        for k, v in self._overrides.items():
            if callable(k) and not isinstance(k, tuple | str) and k(node):
                return v
        return None

    def _add_node(self, node: onnx.NodeProto, inherited: str | None, prior: Kernel | None = None, node_inputs: tuple[str, ...] | None = None) -> tuple[Kernel | None, tuple[str, ...]]:
        """The node's kernel and the names its run takes: the node's inputs (`node_inputs`, when known),
        then the outer-scope values its subgraphs read (a kernel with a body gets those as extra positional
        inputs, so that the plan keeps them alive until it runs and frees them after). `prior`: the node's
        kernel in a base evaluator (`with_compute_dtype`), which a registry kernel of its class may reuse."""
        at = len(self._records)
        self._records.append((node, None, ()))  # a node comes before the nodes of its body
        k = self._make_kernel(node, inherited, prior)
        ins = tuple(node.input) if node_inputs is None else node_inputs
        outer = getattr(k, "outer_inputs", None)
        if outer:
            ins += tuple(outer)
        self._records[at] = (node, k, ins)
        return k, ins

    def _compile(self, graph: onnx.GraphProto, inherited: str | None) -> Subgraph:
        _refuse_untorchable(graph, f"subgraph {graph.name!r}:")
        kernels, step_inputs = [], []
        for node in graph.node:
            k, ins = self._add_node(node, inherited)
            kernels.append(k)
            step_inputs.append(ins)
        ctx = self._context("")
        sg = Subgraph(graph, kernels, step_inputs, {init.name: ctx.tensor(init) for init in graph.initializer})
        self._subgraphs.append(sg)
        return sg

    def _make_kernel(self, node: onnx.NodeProto, inherited: str | None, prior: Kernel | None = None) -> Kernel | None:
        override = self._override_for(node) if self._overrides else None
        if override is None:
            override = inherited
        domain = node.domain or ""
        ctx = self._ctxs.get((domain, None)) or self._context(domain)
        if override is None:  # most nodes: the registry's kernel
            cls = lookup(domain, node.op_type, ctx.opset)
            if cls is not None:
                if prior is not None and type(prior) is cls:
                    k = prior.for_context(ctx)
                    if k is not None:
                        return k
                return cls(node, ctx)
        if isinstance(override, type) and issubclass(override, Kernel):
            return override(node, ctx)  # a kernel class of the user's (or a variant of ours), built as the registry's
        if callable(override):
            return _CallableKernel(node, ctx, override)
        cls = lookup(domain, node.op_type, ctx.opset)
        if cls is not None and (override == "ort" or override in _COMPUTE_IN) and has_subgraph(node):
            # control flow computes nothing itself: the override goes to the nodes of its body
            return cls(node, self._context(domain, override))
        if override == "ort":
            return self._ort_kernel(node, ctx)
        if cls is None:
            label = _label(node)
            if self.missing == "ort":
                self._by_ort.add(label)
                return self._ort_kernel(node, ctx)
            self._missing[label] = ctx.opset
            return None
        if isinstance(override, str) and override in _COMPUTE_IN:
            dtype = _COMPUTE_IN[override]
            wide = KernelContext(ctx.device, ctx.opset, dtype)
            out_dtypes = [self._declared_torch_dtype(o, elements=True) if o else None for o in node.output]
            if self.compute_dtype is not None:
                out_dtypes = [self.compute_dtype if dt is not None and dt.is_floating_point else dt for dt in out_dtypes]
            return _ComputeInKernel(node, ctx, cls(node, wide), out_dtypes, dtype)
        return cls(node, ctx)  # "torch"

    def _ort_kernel(self, node: onnx.NodeProto, ctx: KernelContext) -> Kernel:
        from .ort_kernel import OrtKernel

        return OrtKernel(node, ctx, self.opsets, self._facts.value_types, constants=self._facts.constants)

    @property
    def computes_nothing(self) -> bool:
        """Whether every node that computes (all but Constant, Identity and control flow, the nodes of bodies
        included) runs on onnxruntime (`missing="ort"`, "ort" overrides): a check of this evaluator against
        onnxruntime then compares onnxruntime with itself."""
        from .ort_kernel import OrtKernel

        # every node, those of control-flow bodies too (an "ort" override on an If goes to its branches' nodes);
        # the control-flow nodes themselves compute nothing
        computing = [k for node, k, _ in self._records if node.op_type not in ("Constant", "Identity") and not has_subgraph(node)]
        return bool(computing) and all(isinstance(k, OrtKernel) for k in computing)

    @property
    def constants(self) -> frozenset[str]:
        """The names of the model's constant values: initializers (of bodies too) and Constant outputs."""
        return self._facts.constants

    @property
    def value_types(self) -> Mapping[str, onnx.TypeProto.Tensor]:
        """Each tensor value's type (a body's values included) as the model declares it or shape
        inference gives it (without the weights), inferred when first read; a value shape inference gives
        no type is not in it."""
        return self._facts.value_types

    def iter_kernels(self) -> Iterator[tuple[onnx.NodeProto, Kernel, tuple[str, ...]]]:
        """Every node with its kernel and the value names its kernel's `run` takes (the node's inputs, then
        the outer-scope values its subgraphs read), subgraphs included: a node comes before its body's
        nodes. Inside a body, inputs are the body's values (`run(..., intermediates=True)` holds those of
        the last iteration)."""
        for node, k, ins in self._records:
            assert k is not None
            yield node, k, ins

    @property
    def _foldable(self) -> frozenset[int]:
        if self._fold is None:
            self._fold = self._fold_analysis()
        return self._fold[0]

    @property
    def _guarded_sources(self) -> frozenset[int]:
        if self._fold is None:
            self._fold = self._fold_analysis()
        return self._fold[1]

    def _fold_analysis(self) -> tuple[frozenset[int], frozenset[int]]:
        """The main graph's nodes whose values depend only on the feeds' shapes, initializers and constants
        (Shape and Size read only shapes), and among them the Shape/Size nodes whose input's shape is not
        fixed by the feeds' shapes alone (they keep a guard). A node with an override, a subgraph, a kernel
        not from the registry (onnxruntime's) or a random draw never folds, nor does a non-default domain.

        A value's shape is fixed by the feeds' shapes when it is a feed, folds, or comes from an op of
        `_SHAPE_ONLY` whose inputs' shapes are, and whose inputs that shape it by their values fold."""
        static = set(self._initializers)
        shaped = set(self.input_types) | static  # values whose shapes the feeds' shapes fix
        foldable: set[int] = set()
        guarded: set[int] = set()
        facts = self._facts
        opset = self.opsets.get("", 1)
        overridden = self._override_for if self._overrides else None
        candidates = facts.fold_candidates(self._kernels)
        for i, (op, outs, k, ins) in enumerate(zip(facts.op_types, facts.outputs, self._kernels, self._inputs, strict=True)):
            if not candidates[i] or type(k) is not lookup("", op, opset) or (overridden is not None and overridden(self.nodes[i]) is not None):
                continue
            by_values = _SHAPE_ONLY.get(op)
            if by_values is not None and all(x in shaped for x in ins if x) and all(ins[j] in static for j in by_values if j < len(ins) and ins[j]):
                shaped.update(outs)
            if op in _SHAPE_SOURCES and len(ins) == 1 and ins[0]:
                if ins[0] not in shaped:
                    guarded.add(i)
            elif not all(x in static for x in ins if x):
                continue
            foldable.add(i)
            static.update(outs)
            shaped.update(outs)
        return frozenset(foldable), frozenset(guarded)

    def _shape_plans(self, key: tuple[tuple[str, ...], bool], plain: _Plan) -> _ShapePlans | None:
        shaped = _ShapePlans(self, key[0], key[1], plain) if self._foldable and self._signature_names is not None else None
        if shaped is not None and not shaped.folded:
            shaped = None
        self._shaped[key] = shaped
        return shaped

    # -- running -----------------------------------------------------------------------------
    def _plan(self, outputs: tuple[str, ...], keep_all: bool) -> _Plan:
        key = (outputs, keep_all)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        produced = {o for outs in self._facts.outputs for o in outs}
        known = set(self.input_types) | set(self._initializers)
        for name in outputs:
            if name not in produced and name not in known:
                raise KeyError(f"{name!r} is not a value of this graph; outputs: {self.output_names}")
        self._plans[key] = plan = _build_plan(self._facts.node_outputs, self._kernels, self._inputs, outputs, keep_all, static=self._initializers)
        return plan

    def _prepare_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        specs = self._feed_specs
        if len(feeds) != len(specs) or any(n not in specs for n in feeds):
            missing = [n for n in specs if n not in feeds]
            extra = [n for n in feeds if n not in specs]
            raise ValueError(
                f"feeds do not match the model's inputs: missing {missing}, unknown {extra}; inputs are "
                + ", ".join(f"{n}: {self._describe_input(n)}" for n in self.input_types)
            )
        device, compute_dtype, kinds = self.device, self.compute_dtype, self._input_kinds
        out: dict[str, Any] = {}
        for name, value in feeds.items():
            if kinds and name in kinds:
                out[name] = self._special_feed(name, value, kinds[name])
                continue
            out[name] = self._tensor_feed(name, value, specs[name], device, compute_dtype)
        return out

    def _tensor_feed(self, name: str, value: Any, spec: Any, device: torch.device, compute_dtype: torch.dtype | None) -> torch.Tensor:
        t = value if isinstance(value, torch.Tensor) and value.device == device else to_torch(value, device)
        declared, want, dims = spec
        if want is not None and t.dtype != want:
            if want is _NO_TORCH_DTYPE:
                DType(declared.elem_type)  # raises: "N is not a valid DType"
            raise TypeError(f"feed {name!r} has dtype {str(t.dtype).replace('torch.', '')}, the model declares {_describe(declared)}; cast it (e.g. .to(torch.{str(want).replace('torch.', '')}))")
        if dims is not None:
            shape = t.shape
            if len(dims) != len(shape):
                raise ValueError(f"feed {name!r} has shape {tuple(shape)} (rank {t.dim()}), the model declares {_describe(declared)}")
            for axis, (d, s) in enumerate(zip(dims, shape, strict=True)):
                if d is not None and d != s:
                    raise ValueError(f"feed {name!r} has shape {tuple(shape)}, the model declares {_describe(declared)} (axis {axis} must be {d})")
        if compute_dtype is not None and t.is_floating_point():
            t = t.to(compute_dtype)
        return t

    def _special_feed(self, name: str, value: Any, declared: onnx.TypeProto) -> Any:
        """A feed of a sequence input (a list or tuple of tensors/arrays) or an optional input (None: empty)."""
        kind = declared.WhichOneof("value")
        if kind == "optional_type":
            if value is None:
                return None
            inner = declared.optional_type.elem_type
            if inner.HasField("sequence_type"):
                return self._special_feed(name, value, inner)
            return self._tensor_feed(name, value, _feed_spec(inner.tensor_type), self.device, self.compute_dtype)
        if kind == "sequence_type":
            if not isinstance(value, list | tuple):
                raise TypeError(f"feed {name!r} is a {type(value).__name__}, the model declares {_describe_type(declared)}: feed a list of tensors")
            spec = _feed_spec(declared.sequence_type.elem_type.tensor_type)
            return [self._tensor_feed(f"{name}[{i}]", v, spec, self.device, self.compute_dtype) for i, v in enumerate(value)]
        raise UnsupportedVariantError(f"input {name!r} is {_describe_type(declared)}, which the torch evaluator cannot hold")

    def _describe_input(self, name: str) -> str:
        kind = self._input_kinds.get(name)
        return _describe_type(kind) if kind is not None else _describe(self.input_types[name])

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], intermediates: bool = False, *, observe: Observer | None = None, specialise: bool = True) -> Any:
        """Outputs as a list (in `output_names` order; None = the graph's outputs), or with
        `intermediates=True` a dict of every value computed (feeds included). Values computed inside a
        subgraph are in it too, by their names; a loop body's (Loop, Scan, SequenceMap) are those of its
        last iteration. Tensors are torch tensors, sequences lists of them, an empty optional None.

        `observe(node, outputs)` streams the intermediates instead: it is called after every top-level node
        the outputs depend on, in execution order, with `{name: value}` of the node's outputs, and each
        value is freed as soon as no later node reads it (a body's values are not observed one by one).

        `specialise=False`: run the plain plan and record no shape-specialised one (a first run with a new
        feed-shape signature otherwise records one for the runs to come: for a run that happens once, such
        as blame's, that recording costs more than it saves). The same values bit for bit."""
        outputs = tuple(output_names) if output_names else self._output_tuple
        key = (outputs, intermediates)
        plan = self._plans.get(key) or self._plan(outputs, intermediates)
        prepared = self._prepare_feeds(feeds)
        values: dict[str, Any] = dict(self._initializers)
        values.update(prepared)
        # below autograd unless a gradient could flow (a feed that requires one)
        fast = self._below_autograd and not any(isinstance(v, torch.Tensor) and v.requires_grad for v in prepared.values())
        if observe is not None:
            if intermediates:
                raise ValueError("run(..., intermediates=True, observe=f): pick one; observe streams the intermediates, intermediates=True keeps them all")
            try:
                with ieee_float32(self.device):  # float32 means IEEE float32: no TF32 (see runtimes/tf32.py)
                    _execute_observed(plan, values, outputs, observe, fast)
            except _NodeFailed as exc:
                raise RuntimeError(str(exc)) from exc.__cause__
            return [values[o] for o in outputs]
        shaped = None if not specialise else self._shaped[key] if key in self._shaped else self._shape_plans(key, plan)
        try:
            with _BELOW_AUTOGRAD() if fast else contextlib.nullcontext(), ieee_float32(self.device):  # type: ignore[misc]
                if shaped is None:
                    _execute(plan, values)
                elif not shaped.run(values, tuple([prepared[n].shape for n in self._signature_names])):  # type: ignore[union-attr]
                    values = dict(self._initializers)  # a guard failed: this signature's shapes depend on data
                    values.update(prepared)
                    _execute(plan, values)
        except _NodeFailed as exc:  # a plain RuntimeError naming the node, the kernel's error its cause
            raise RuntimeError(str(exc)) from exc.__cause__
        values.pop("", None)  # omitted optional outputs
        if intermediates:
            return values
        return [values[o] for o in outputs]


def _label(node: onnx.NodeProto) -> str:
    domain = node.domain if node.domain != "ai.onnx" else ""
    return f"{domain}::{node.op_type}" if domain else node.op_type


def _missing_error(missing: Mapping[str, int]) -> MissingKernelError:
    ops = sorted(missing)
    listed = ", ".join(f"{op} (opset {missing[op]})" for op in ops)
    pairs = ", ".join(f'("{d}", "{o}"): "ort"' for d, _, o in (op.rpartition("::") for op in ops))
    them = "it" if len(ops) == 1 else "them"
    return MissingKernelError(
        f"no torch kernel for {listed}; run {them} on onnxruntime: TorchEvaluator(model, kernels={{{pairs}}}), "
        f'or every op without a kernel: TorchEvaluator(model, missing="ort"); {_known_near(ops)}',
        ops,
    )


def _known_near(ops: Sequence[str]) -> str:
    """"known ops: 251, the nearest: MatMul, MatMulInteger, QLinearMatMul (all: runtimes.kernels.known_ops())":
    the known ops named like the missing ones, not all 250 of them on one line."""
    import difflib

    known = _kernels.known_ops()
    by_name = {k.rpartition("::")[2]: k for k in known}
    near = dict.fromkeys(by_name[n] for op in ops for n in difflib.get_close_matches(op.rpartition("::")[2], list(by_name), n=4, cutoff=0.6))
    named = f", the nearest: {', '.join(near)}" if near else ""
    return f"known ops: {len(known)}{named} (all: pytest_ortdiff.runtimes.kernels.known_ops())"


def _element_type(t: onnx.TypeProto) -> onnx.TypeProto.Tensor | None:
    """The tensor type inside a sequence or optional type, or None."""
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return _element_type(t.sequence_type.elem_type) if not t.sequence_type.elem_type.HasField("tensor_type") else t.sequence_type.elem_type.tensor_type
    if kind == "optional_type":
        return _element_type(t.optional_type.elem_type) if not t.optional_type.elem_type.HasField("tensor_type") else t.optional_type.elem_type.tensor_type
    return None


def _untorchable(t: onnx.TypeProto) -> str | None:
    """Why a value of type `t` cannot be held by the evaluator (strings, maps, sparse tensors), or None."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return "a string tensor" if t.tensor_type.elem_type == onnx.TensorProto.STRING else None
    if kind in ("sequence_type", "optional_type"):
        inner = t.sequence_type.elem_type if kind == "sequence_type" else t.optional_type.elem_type
        why = _untorchable(inner)
        return f"{'a sequence' if kind == 'sequence_type' else 'an optional'} of {why.removeprefix('a ').removeprefix('an ')}s" if why else None
    if kind is None:
        return None  # undeclared: the kernels decide
    return f"a {kind.removesuffix('_type').replace('_', ' ')}"


def _refuse_untorchable(graph: onnx.GraphProto, where: str) -> None:
    for what, vis in (("input", graph.input), ("output", graph.output)):
        for vi in vis:
            why = _untorchable(vi.type)
            if why:
                raise UnsupportedVariantError(
                    f"{where} {what} {vi.name!r} is {why} ({_describe_type(vi.type)}): torch has no such values, so the torch evaluator refuses it; run the model with onnxruntime (OrtRunner)"
                )
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.STRING:
            raise UnsupportedVariantError(f"{where} initializer {init.name!r} is a string tensor: torch has no string tensors, so the torch evaluator refuses it; run the model with onnxruntime (OrtRunner)")


def _refuse_reassigned(graph: onnx.GraphProto) -> None:
    """A value written by two nodes: ONNX assigns each value once, and onnxruntime refuses such a graph too. One
    writer of it is known: onnxruntime 1.31's float16 converter, which writes one identical Cast per consumer."""
    writers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for o in node.output:
            if o:
                writers.setdefault(o, []).append(node)
    for value, nodes in writers.items():
        if len(nodes) > 1:
            names = ", ".join(f"{n.name!r} ({n.op_type})" for n in nodes)
            if all(n.op_type == "Cast" for n in nodes) and len({n.SerializeToString(deterministic=True) for n in nodes}) == 1:
                hint = (
                    "onnxruntime 1.31's convert_float_to_float16 writes one such Cast per consumer: convert with onnxruntime >= 1.32, "
                    "or keep one of the identical Casts (pytest_ortdiff.precision.convert_half does)"
                )
            elif all(n.op_type == "Cast" and re.fullmatch(r"graph_output_cast\d+", n.name) for n in nodes):
                hint = (
                    "onnxruntime's convert_float_to_float16 (keep_io_types) writes one such Cast per entry of an output the graph "
                    "lists twice, and computes the input of the last one only: keep that one (pytest_ortdiff.precision.convert_half does)"
                )
            else:
                hint = "give each node's output its own name"
            raise ValueError(f"value {value!r} is the output of {len(nodes)} nodes ({names}): a graph assigns each value once, and onnxruntime refuses it too; {hint}")


def _feed_spec(declared: onnx.TypeProto.Tensor) -> tuple[onnx.TypeProto.Tensor, torch.dtype | None, tuple[int | None, ...] | None]:
    """What a feed must match: the declared dtype (None: any) and dims (None: any rank; a None dim: any size)."""
    try:
        want = DType(declared.elem_type).torch if declared.elem_type else None
    except ValueError:  # no torch dtype: a feed of it is refused when it comes, as before the specs
        from .kernels.quantization import FLOAT8_TYPES, SUB_BYTE_TYPES

        want = FLOAT8_TYPES.get(declared.elem_type) or SUB_BYTE_TYPES.get(declared.elem_type) or _NO_TORCH_DTYPE
    dims = None
    if declared.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in declared.shape.dim)
    return declared, want, dims


def _describe(t: onnx.TypeProto.Tensor) -> str:
    try:
        dt = DType(t.elem_type).short
    except ValueError:
        dt = "string" if t.elem_type == onnx.TensorProto.STRING else f"type {t.elem_type}"
    if not t.HasField("shape"):
        return dt
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return f"{dt}[{', '.join(dims)}]"


def _describe_type(t: onnx.TypeProto) -> str:
    """`float32[2, n]`, `sequence<float32[?]>`, `optional<sequence<int64>>`, `map`, ..."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return _describe(t.tensor_type)
    if kind == "sequence_type":
        return f"sequence<{_describe_type(t.sequence_type.elem_type)}>"
    if kind == "optional_type":
        return f"optional<{_describe_type(t.optional_type.elem_type)}>"
    return kind.removesuffix("_type") if kind else "undeclared"


def _describe_value(name: str, v: Any) -> str:
    if name == "":
        return "<omitted>"
    if isinstance(v, torch.Tensor):
        return f"{name}: {str(v.dtype).replace('torch.', '')}{list(v.shape)}"
    if isinstance(v, list):
        kinds = sorted({str(e.dtype).replace("torch.", "") if isinstance(e, torch.Tensor) else type(e).__name__ for e in v})
        return f"{name}: sequence of {len(v)} {'/'.join(kinds) or 'values'}"
    if v is None:
        return f"{name}: empty optional"
    return f"{name}: {type(v).__name__}"
