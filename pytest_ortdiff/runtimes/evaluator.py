"""TorchEvaluator: runs an ONNX graph node by node with torch kernels, on CPU or CUDA.

Kernels come from the opset-aware registry unless `kernels=` overrides them per op type, node name or
predicate; `compute_dtype=torch.float64` turns it into the float64 oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import onnx
import torch

from ..dtypes import DType, dtype_of
from . import kernels as _kernels  # registers every kernel family
from .kernels.base import Kernel, KernelContext, lookup
from .ort import load_model
from .tensors import to_torch

__all__ = ["KernelOverride", "MissingKernelError", "TorchEvaluator"]

KernelOverride = Any  # "torch" | "ort" | "float64" | Callable[..., Tensor | tuple[Tensor, ...]]
_KEY_HELP = 'keys: an op type ("", "LayerNormalization"), a node name, or a predicate f(node) -> bool; values: "torch", "ort", "float64" or a callable f(*inputs)'


class MissingKernelError(NotImplementedError):
    """The evaluator has no torch kernel for some op of the model."""


class _CallableKernel(Kernel):
    """A user's function as a kernel: f(*inputs) -> Tensor | tuple[Tensor, ...]."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext, fn: Callable[..., Any]) -> None:
        super().__init__(node, ctx)
        self.fn = fn
        self.op_type = node.op_type  # type: ignore[misc]

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        out = self.fn(*inputs)
        return out if isinstance(out, tuple) else (tuple(out) if isinstance(out, list) else (out,))


class _Float64Kernel(Kernel):
    """The registry's kernel computed in float64, its floating outputs cast back to their declared dtypes."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext, inner: Kernel, out_dtypes: Sequence[torch.dtype | None]) -> None:
        super().__init__(node, ctx)
        self.inner = inner
        self.out_dtypes = out_dtypes

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        wide = [x.to(torch.float64) if x is not None and x.is_floating_point() else x for x in inputs]
        outs = self.inner.run(*wide)
        return tuple(
            o.to(dt) if dt is not None and o.is_floating_point() and o.dtype != dt else o
            for o, dt in zip(outs, self.out_dtypes, strict=False)
        )


# How a step fetches its inputs: the common one- and two-input nodes index the values directly (no
# argument list built per node); nodes with more inputs go through an itemgetter, and the rare ones
# with an omitted optional input (or none at all) through the general path.
_GENERAL, _UNARY, _BINARY, _MANY = 0, 1, 2, 3
_NO_TORCH_DTYPE: Any = object()  # a declared input type DType does not know


class _Step(NamedTuple):
    """One node of a run's plan, with everything the hot loop needs resolved once."""

    run: Callable[..., Any]  # the kernel's bound run
    arity: int  # _UNARY, _BINARY, _MANY or _GENERAL
    a: str | None  # first input (_UNARY, _BINARY)
    b: str | None  # second input (_BINARY)
    get: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None  # all inputs (_MANY)
    out: str | None  # the output when the node has exactly one
    outputs: tuple[str, ...]
    free1: str | None  # the one value whose last use is this node
    free: tuple[str, ...]  # the values whose last use is this node, when there are several
    kernel: Kernel
    inputs: tuple[str, ...]


def _step(k: Kernel, ins: tuple[str, ...], outs: tuple[str, ...], free: tuple[str, ...]) -> _Step:
    if ins and all(ins):
        arity = _UNARY if len(ins) == 1 else _BINARY if len(ins) == 2 else _MANY
    else:
        arity = _GENERAL
    return _Step(
        run=k.run,
        arity=arity,
        a=ins[0] if arity in (_UNARY, _BINARY) else None,
        b=ins[1] if arity == _BINARY else None,
        get=itemgetter(*ins) if arity == _MANY else None,
        out=outs[0] if len(outs) == 1 else None,
        outputs=outs,
        free1=free[0] if len(free) == 1 else None,
        free=free if len(free) > 1 else (),
        kernel=k,
        inputs=ins,
    )


class TorchEvaluator:
    """Runs `model` with torch kernels.

    - `device`: "cpu" or "cuda" (or a torch.device).
    - `kernels`: overrides, `{key: value}`; a key is an op type `("", "LayerNormalization")` (or a plain
      op type string that names no node), a node name, or a predicate `f(node) -> bool`; a value is
      `"torch"`, `"ort"` (the node run by onnxruntime on the matching provider), `"float64"` (the torch
      kernel computed in float64, cast back) or a callable `f(*inputs)`. Node names win over op types,
      op types over predicates.
    - `compute_dtype=torch.float64`: every floating tensor, initializer and Cast target promoted to
      float64 — the oracle. Declared output dtypes stay available in `output_dtypes`.
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device = "cpu",
        kernels: Mapping[Any, KernelOverride] | None = None,
        compute_dtype: torch.dtype | str | None = None,
        check_model: bool = True,
    ) -> None:
        self.model = load_model(model)
        if check_model:
            try:
                onnx.checker.check_model(self.model)
            except onnx.checker.ValidationError as exc:
                raise ValueError(f"the model fails onnx.checker: {str(exc).strip().splitlines()[0]}; fix the graph (or pass check_model=False to try anyway)") from None
        self.device = torch.device(device)
        if isinstance(compute_dtype, str):
            try:
                compute_dtype = dtype_of(compute_dtype).torch  # the project's spellings: float64, fp64, double
            except ValueError:
                raise ValueError(f"compute_dtype {compute_dtype!r} is not a dtype name; use 'float64' (the oracle), 'float32' or None") from None
        if compute_dtype not in (None, torch.float64, torch.float32):
            raise ValueError(f"compute_dtype must be torch.float64 (the oracle), torch.float32 or None; got {compute_dtype}")
        self.compute_dtype = compute_dtype
        graph = self.model.graph
        self.opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in self.model.opset_import}
        self._ctx = {domain: KernelContext(self.device, version, compute_dtype) for domain, version in self.opsets.items()}
        default_ctx = KernelContext(self.device, self.opsets.get("", 1), compute_dtype)

        self.input_types = {}
        init_names = {i.name for i in graph.initializer}
        for vi in graph.input:
            if vi.name in init_names:
                continue
            self.input_types[vi.name] = vi.type.tensor_type
        # per input, resolved once: (declared, torch dtype or None, fixed dims by axis or None when the
        # rank is unknown); run() checks feeds against these and describes `declared` only on failure
        self._feed_specs = {name: _feed_spec(t) for name, t in self.input_types.items()}
        self.output_names = [o.name for o in graph.output]
        self._output_tuple = tuple(self.output_names)
        self._value_types = self._infer_types()
        #: declared dtype of every graph output (what a non-oracle run produces)
        self.output_dtypes = {n: self._declared_torch_dtype(n) for n in self.output_names}

        self._initializers: dict[str, torch.Tensor] = {}
        for init in graph.initializer:
            self._initializers[init.name] = default_ctx.tensor(init)

        self.nodes = list(graph.node)
        self._overrides = dict(kernels or {})
        self._validate_overrides()
        self._kernels: list[Kernel] = []
        missing: list[str] = []
        for node in self.nodes:
            k = self._make_kernel(node, self._ctx.get(node.domain or "", default_ctx), missing)
            self._kernels.append(k)  # type: ignore[arg-type]
        if missing:
            ops = sorted(set(missing))
            first = ops[0].split(" ")[0]
            dom, _, op = first.rpartition("::")
            raise MissingKernelError(
                f"no torch kernel for {', '.join(ops)}; known ops: {', '.join(_kernels.known_ops())}; "
                f"run it with onnxruntime instead: TorchEvaluator(model, kernels={{({dom!r}, {op!r}): 'ort'}})"
            )
        self._plans: dict[tuple[tuple[str, ...], bool], tuple[_Step, ...]] = {}

    # -- construction ------------------------------------------------------------------------
    def _infer_types(self) -> dict[str, onnx.TypeProto.Tensor]:
        types: dict[str, Any] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
        except Exception:  # inference is a convenience here; models with custom ops may defeat it
            inferred = self.model
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type
        for init in g.initializer:
            t = onnx.TypeProto.Tensor()
            t.elem_type = init.data_type
            types.setdefault(init.name, t)
        return types

    def _declared_torch_dtype(self, name: str) -> torch.dtype | None:
        t = self._value_types.get(name)
        if t is None or not t.elem_type:
            return None
        try:
            return DType(t.elem_type).torch
        except ValueError:
            return None

    def _validate_overrides(self) -> None:
        names = {n.name for n in self.nodes if n.name}
        for key, value in self._overrides.items():
            if not (isinstance(key, tuple | str) or callable(key)):
                raise TypeError(f"kernels key {key!r} is not valid; {_KEY_HELP}")
            if isinstance(key, tuple) and (len(key) != 2 or not all(isinstance(p, str) for p in key)):
                raise TypeError(f"kernels key {key!r}: an op type is a (domain, op_type) pair such as ('', 'MatMul')")
            if isinstance(key, str) and key not in names and not any(n.op_type == key for n in self.nodes):
                raise KeyError(f"kernels key {key!r} names no node and no op type of this model; node names: {sorted(names)[:20]}")
            if not (value in ("torch", "ort", "float64") or callable(value)):
                raise ValueError(f"kernels[{key!r}] = {value!r} is not valid; {_KEY_HELP}")

    def _override_for(self, node: onnx.NodeProto) -> KernelOverride | None:
        if not self._overrides:
            return None
        if node.name and node.name in self._overrides:
            return self._overrides[node.name]
        key = (node.domain or "", node.op_type)
        if key in self._overrides:
            return self._overrides[key]
        if node.op_type in self._overrides and not any(n.name == node.op_type for n in self.nodes):
            return self._overrides[node.op_type]
        for k, v in self._overrides.items():
            if callable(k) and not isinstance(k, tuple | str) and k(node):
                return v
        return None

    def _make_kernel(self, node: onnx.NodeProto, ctx: KernelContext, missing: list[str]) -> Kernel | None:
        override = self._override_for(node)
        if callable(override):
            return _CallableKernel(node, ctx, override)
        if override == "ort":
            from .ort_kernel import OrtKernel

            return OrtKernel(node, ctx, self.opsets, self._value_types)
        cls = lookup(node.domain or "", node.op_type, ctx.opset)
        if cls is None:
            where = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            missing.append(f"{where} (opset {ctx.opset})")
            return None
        if override == "float64":
            wide = KernelContext(ctx.device, ctx.opset, torch.float64)
            out_dtypes = [self._declared_torch_dtype(o) if o else None for o in node.output]
            if self.compute_dtype is not None:
                out_dtypes = [self.compute_dtype if dt is not None and dt.is_floating_point else dt for dt in out_dtypes]
            return _Float64Kernel(node, ctx, cls(node, wide), out_dtypes)
        return cls(node, ctx)

    # -- running -----------------------------------------------------------------------------
    def _plan(self, outputs: tuple[str, ...], keep_all: bool) -> tuple[_Step, ...]:
        key = (outputs, keep_all)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        produced = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        known = set(self.input_types) | set(self._initializers)
        for name in outputs:
            if name not in produced and name not in known:
                raise KeyError(f"{name!r} is not a value of this graph; outputs: {self.output_names}")
        needed: set[int] = set()
        stack = [produced[o] for o in outputs if o in produced]
        while stack:
            i = stack.pop()
            if i in needed:
                continue
            needed.add(i)
            stack.extend(produced[x] for x in self.nodes[i].input if x in produced)
        order = sorted(needed)
        last_use: dict[str, int] = {}
        for i in order:
            for x in self.nodes[i].input:
                if x:
                    last_use[x] = i
        keep = set(outputs)
        steps = []
        for i in order:
            node = self.nodes[i]
            free: tuple[str, ...] = ()
            if not keep_all:
                free = tuple(sorted({x for x in node.input if x and last_use.get(x) == i and x not in keep}))
            steps.append(_step(self._kernels[i], tuple(node.input), tuple(node.output), free))
        self._plans[key] = plan = tuple(steps)
        return plan

    def _prepare_feeds(self, feeds: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        specs = self._feed_specs
        if len(feeds) != len(specs) or any(n not in specs for n in feeds):
            missing = [n for n in specs if n not in feeds]
            extra = [n for n in feeds if n not in specs]
            raise ValueError(
                f"feeds do not match the model's inputs: missing {missing}, unknown {extra}; inputs are "
                + ", ".join(f"{n}: {_describe(t)}" for n, t in self.input_types.items())
            )
        device, compute_dtype = self.device, self.compute_dtype
        out = {}
        for name, value in feeds.items():
            t = value if isinstance(value, torch.Tensor) and value.device == device else to_torch(value, device)
            declared, want, dims = specs[name]
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
            out[name] = t
        return out

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], intermediates: bool = False) -> Any:
        """Outputs as a list of tensors (in `output_names` order; None = the graph's outputs), or with
        `intermediates=True` a dict of every value computed (feeds included)."""
        outputs = tuple(output_names) if output_names else self._output_tuple
        plan = self._plans.get((outputs, intermediates)) or self._plan(outputs, intermediates)
        values: dict[str, Any] = dict(self._initializers)
        values.update(self._prepare_feeds(feeds))
        # The hot loop: everything per node was resolved into its _Step by _plan. No per-node
        # bookkeeping for errors either: `step` is still the failing node when the except runs.
        step: _Step | None = None
        try:
            for step in plan:
                run, arity, a, b, get, out, outs, free1, free, _, _ = step
                if arity == _BINARY:
                    res = run(values[a], values[b])
                elif arity == _UNARY:
                    res = run(values[a])
                elif arity == _MANY:
                    res = run(*get(values))  # type: ignore[misc]
                else:
                    res = run(*[values[x] if x else None for x in step.inputs])
                if out is not None:
                    values[out] = res[0]
                else:
                    values.update(zip(outs, res, strict=False))
                if free1 is not None:
                    del values[free1]
                elif free:
                    for x in free:
                        del values[x]
        except Exception as exc:
            if step is None:  # an empty plan runs nothing that can fail; for the type checker
                raise
            k, ins = step.kernel, step.inputs
            node = k.node
            described = ", ".join(_describe_value(x, values.get(x)) for x in ins)
            why = str(exc)
            if isinstance(exc, IndexError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
                why = f"it returned no outputs, the node has {len(step.outputs)}"  # res[0] above, not the kernel
            raise RuntimeError(f"torch kernel {type(k).__name__} failed on node {node.name or '?'!r} ({node.op_type}) with inputs {described}: {why}") from exc
        values.pop("", None)  # omitted optional outputs
        if intermediates:
            return values
        return [values[o] for o in outputs]


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
        dt = f"type {t.elem_type}"
    if not t.HasField("shape"):
        return dt
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return f"{dt}[{', '.join(dims)}]"


def _describe_value(name: str, v: Any) -> str:
    if name == "":
        return "<omitted>"
    if isinstance(v, torch.Tensor):
        return f"{name}: {str(v.dtype).replace('torch.', '')}{list(v.shape)}"
    return f"{name}: {type(v).__name__}"
