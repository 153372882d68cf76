"""The kernel registry: `(domain, op_type, since_version)` -> torch kernel class, opset-aware lookup.

A kernel parses its node's attributes once in `__init__`; `run(*inputs)` takes torch tensors (None for
an omitted optional input) and returns a tuple of torch tensors, one per node output.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import onnx
import torch

from ...numerics.dtypes import DType
from ...numerics.tensors import from_onnx_tensor

__all__ = ["REGISTRY", "Departure", "Kernel", "KernelContext", "UnsupportedVariantError", "kernel", "lookup"]


class UnsupportedVariantError(NotImplementedError):
    """A kernel exists for the op, but not for this attribute/dtype variant: better an error than a wrong answer."""


@dataclass(frozen=True)
class KernelContext:
    """What a kernel may need beyond its node: the device, the oracle's promotion, the opset."""

    device: torch.device
    opset: int
    compute_dtype: torch.dtype | None = None

    def torch_dtype(self, onnx_type: int) -> torch.dtype:
        """The torch dtype a kernel creates for an onnx element type (floats promoted in oracle mode)."""
        dt = DType(onnx_type)
        if self.compute_dtype is not None and dt.is_floating_point:
            return self.compute_dtype
        return dt.torch

    def tensor(self, value: Any, onnx_type: int | None = None) -> torch.Tensor:
        """A tensor from an onnx TensorProto or a numpy array, on the device, promoted in oracle mode."""
        t = from_onnx_tensor(value) if isinstance(value, onnx.TensorProto) else torch.as_tensor(value)
        # float8 values stay float8 in the oracle: their rounding is the model's arithmetic (as int8's is)
        if self.compute_dtype is not None and t.is_floating_point() and t.element_size() >= 2:
            t = t.to(self.compute_dtype)
        elif onnx_type is not None:
            t = t.to(self.torch_dtype(onnx_type))
        return t if t.device == self.device else t.to(self.device)


@dataclass(frozen=True)
class Departure:
    """Where onnxruntime's kernel for a node departs from the op's meaning on purpose (int8 activations, an
    approximation): what it does, in words a report can print, and a kernel computing the node as
    onnxruntime does, so that the cost of the choice is measured against the meaning."""

    what: str
    kernel: Kernel


class Kernel:
    """Base class: subclasses set nothing by hand; `@kernel(...)` registers them."""

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    since: ClassVar[int] = 1

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        self.node = node
        self.ctx = ctx
        self.attrs: dict[str, Any] = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if isinstance(value, bytes):
            return value.decode()
        return value

    if TYPE_CHECKING:
        # each kernel's run names its op's own inputs (`run(self, x, w, b=None)`), which no single base
        # signature covers: typed as any callable returning the outputs, so mypy checks the subclasses' own
        run: Callable[..., tuple[Any, ...]]
    else:

        def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            raise NotImplementedError

    def direct(self, static: dict[int, Any]) -> Callable[..., Any] | None:
        """For a kernel with one output, a faster way to its `run`: a callable returning the output itself
        (no tuple; at best a torch function or method, called without a Python frame). `static` maps the
        positions of inputs that are the same in every run of a plan (initializers; the shape arithmetic a
        shape-specialised plan folded) to their values (None: omitted); the callable takes the other
        inputs in order, those built in once (a target shape, axes read into Python). The evaluator asks
        with `static` empty when it gets None for the fixed inputs: then it takes every input.

        Whenever the callable returns, it returns `run(*inputs)[0]` bit for bit; when it raises, the
        evaluator calls `run`, whose fallbacks or error decide. None (the default): `run` runs."""
        return None

    def departure(self) -> Departure | None:
        """How onnxruntime departs from the op's meaning on this node on purpose (None, the default: it
        does not, as far as this kernel knows); blame measures the departure kernel where the node is blamed."""
        return None

    def for_context(self, ctx: KernelContext) -> Kernel | None:
        """This kernel's node for another context (the evaluator's float64 twin: another compute dtype,
        the same device and opset), built from what this kernel worked out where that is cheaper than
        `type(self)(self.node, ctx)` and gives the same kernel: a new kernel sharing no state that a run
        changes. The evaluator asks only when this kernel's compute dtype is None or `ctx`'s. None (the
        default): it builds the kernel anew."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.domain or 'ai.onnx'}::{self.op_type}, since={self.since})"


# (domain, op_type) -> sorted list of (since, kernel class)
REGISTRY: dict[tuple[str, str], list[tuple[int, type[Kernel]]]] = {}
# lookup's answers: every node of a model asks, most of them the same few questions (a registration
# clears it)
_LOOKED_UP: dict[tuple[str, str, int], type[Kernel] | None] = {}


def kernel(op_type: str, since: int = 1, domain: str = "") -> Callable[[type[Kernel]], type[Kernel]]:
    """Class decorator: register a torch kernel for `domain::op_type` from opset `since` on."""

    def register(cls: type[Kernel]) -> type[Kernel]:
        cls.op_type = op_type
        cls.domain = domain
        cls.since = since
        versions = REGISTRY.setdefault((domain, op_type), [])
        if any(v == since for v, _ in versions):
            raise ValueError(f"two kernels registered for {domain or 'ai.onnx'}::{op_type} since {since}")
        bisect.insort(versions, (since, cls), key=lambda vc: vc[0])
        _LOOKED_UP.clear()
        return cls

    return register


def lookup(domain: str, op_type: str, opset: int) -> type[Kernel] | None:
    """The kernel with the highest `since` that is at most `opset`, or None."""
    key = (domain, op_type, opset)
    try:
        return _LOOKED_UP[key]
    except KeyError:
        pass
    versions = REGISTRY.get((domain, op_type))
    found = None
    if versions:
        i = bisect.bisect_right([v for v, _ in versions], opset)
        found = versions[i - 1][1] if i else None
    _LOOKED_UP[key] = found
    return found


def known_ops() -> list[str]:
    return sorted(f"{d}::{o}" if d else o for d, o in REGISTRY)
