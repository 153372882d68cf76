"""TorchEvaluator: runs an ONNX graph node by node with torch kernels, on CPU or CUDA.

Kernels come from the opset-aware registry unless `kernels=` overrides them per op type, node name or
predicate; `compute_dtype=torch.float64` turns it into the float64 oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import torch

from ..dtypes import DType
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
            compute_dtype = DType[compute_dtype.upper()].torch if compute_dtype.upper() in DType.__members__ else getattr(torch, compute_dtype)
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
        self.output_names = [o.name for o in graph.output]
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
        self._plans: dict[tuple[Any, ...], list[tuple[Kernel, tuple[str, ...], tuple[str, ...], tuple[str, ...]]]] = {}

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
    def _plan(self, outputs: tuple[str, ...], keep_all: bool) -> list[tuple[Kernel, tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
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
        plan = []
        for i in order:
            node = self.nodes[i]
            free: tuple[str, ...] = ()
            if not keep_all:
                free = tuple(sorted({x for x in node.input if x and last_use.get(x) == i and x not in keep}))
            plan.append((self._kernels[i], tuple(node.input), tuple(node.output), free))
        self._plans[key] = plan
        return plan

    def _prepare_feeds(self, feeds: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        missing = [n for n in self.input_types if n not in feeds]
        extra = [n for n in feeds if n not in self.input_types]
        if missing or extra:
            raise ValueError(
                f"feeds do not match the model's inputs: missing {missing}, unknown {extra}; inputs are "
                + ", ".join(f"{n}: {_describe(t)}" for n, t in self.input_types.items())
            )
        out = {}
        for name, value in feeds.items():
            t = to_torch(value, self.device)
            declared = self.input_types[name]
            if declared.elem_type:
                want = DType(declared.elem_type).torch
                if t.dtype != want:
                    raise TypeError(f"feed {name!r} has dtype {str(t.dtype).replace('torch.', '')}, the model declares {_describe(declared)}; cast it (e.g. .to(torch.{str(want).replace('torch.', '')}))")
            if declared.HasField("shape"):
                dims = declared.shape.dim
                if len(dims) != t.dim():
                    raise ValueError(f"feed {name!r} has shape {tuple(t.shape)} (rank {t.dim()}), the model declares {_describe(declared)}")
                for axis, (d, s) in enumerate(zip(dims, t.shape, strict=True)):
                    if d.HasField("dim_value") and d.dim_value != s:
                        raise ValueError(f"feed {name!r} has shape {tuple(t.shape)}, the model declares {_describe(declared)} (axis {axis} must be {d.dim_value})")
            if self.compute_dtype is not None and t.is_floating_point():
                t = t.to(self.compute_dtype)
            out[name] = t
        return out

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], intermediates: bool = False) -> Any:
        """Outputs as a list of tensors (in `output_names` order; None = the graph's outputs), or with
        `intermediates=True` a dict of every value computed (feeds included)."""
        outputs = tuple(output_names) if output_names else tuple(self.output_names)
        plan = self._plan(outputs, intermediates)
        values: dict[str, Any] = dict(self._initializers)
        values.update(self._prepare_feeds(feeds))
        step = 0
        try:
            for step, (k, ins, outs, free) in enumerate(plan):  # noqa: B007  (step names the failing node)
                res = k.run(*[values[x] if x else None for x in ins])
                values.update(zip(outs, res, strict=False))
                for x in free:
                    del values[x]
        except Exception as exc:
            k, ins, _, _ = plan[step]
            node = k.node
            described = ", ".join(_describe_value(x, values.get(x)) for x in ins)
            raise RuntimeError(f"torch kernel {type(k).__name__} failed on node {node.name or '?'!r} ({node.op_type}) with inputs {described}: {exc}") from exc
        values.pop("", None)  # omitted optional outputs
        if intermediates:
            return values
        return [values[o] for o in outputs]


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
