"""The float16/bfloat16 range audit: every node's float32 output range over many inputs (streamed, one
reduction per value), and the nodes whose values a half-precision conversion turns to inf, 0 or subnormals
where it matters, each with the reason and the consumers it feeds."""

from __future__ import annotations

import contextlib
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ...engine.check import NothingCompared
from ...numerics.dtypes import dtype_of
from ...numerics.formatting import g, pct_frac, table
from ...runtimes.evaluator import TorchEvaluator

__all__ = ["AuditReport", "EmptyOutputs", "NodeAudit", "audit"]


class EmptyOutputs(NothingCompared, ValueError):
    """`audit`, `keep_float32` or `check_conversion` given feeds for which every output of the model is empty (a
    dim of 0): nothing was compared, which is not a pass. A NothingCompared (a test fails on it, as on
    `Checker.check`'s), and a ValueError: the feeds cannot judge a conversion (the command line: one error
    line, exit 2). `result` is None."""


def _elements(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, list | tuple):
        return sum(_elements(e) for e in x)
    return 0


def _described(name: str, x: Any, dtype: str | None) -> str:
    if isinstance(x, torch.Tensor):
        return f"{name}: {dtype or dtype_of(x.dtype).short}[{'x'.join(str(d) for d in x.shape)}]"
    return f"{name}: {type(x).__name__}"


def _declared(model: onnx.ModelProto) -> dict[str, str]:
    """The model's outputs' declared dtypes (where they have one)."""
    out = {}
    for o in model.graph.output:
        with contextlib.suppress(ValueError):  # (no dtype declared, or none of ours)
            out[o.name] = dtype_of(o.type.tensor_type.elem_type).short
    return out


def refuse_empty(
    what: str,
    model: onnx.ModelProto,
    outputs: Sequence[Sequence[Any]],
    feeds: Sequence[Mapping[str, Any]],
) -> None:
    """Raises EmptyOutputs when every output of `model` is empty for every feed dict (`outputs[i]`: those of
    `feeds[i]`), naming the outputs (with their declared dtypes) and the empty feeds as `Checker.check`'s
    NothingCompared does."""
    if not outputs or any(_elements(o) for outs in outputs for o in outs):
        return
    declared = _declared(model)
    names = [o.name for o in model.graph.output]
    shown = ", ".join(_described(n, o, declared.get(n)) for n, o in zip(names, outputs[0], strict=False))
    empty = dict.fromkeys(
        f"{name} {list(value.shape)}" for f in feeds for name, value in f.items() if 0 in tuple(getattr(value, "shape", ()))
    )
    why = (
        f" for the feeds given (empty: {', '.join(empty)}); feed a non-empty input"
        if empty
        else " for the feeds given; feed inputs for which the model's outputs have elements"
    )
    raise EmptyOutputs(f"{what}: compared 0 elements: every output is empty ({shown}){why}; nothing was compared, which is not a pass")

# float32's extreme values (`torch.finfo(float32).min` and what a mask built from it adds up to): the
# masks of attention layers, not numbers a layer computes. Converters clip the constants they come from
# to the half type's max (onnxruntime's float16 converter: ±65504), so their overflow is a note.
_SENTINEL = 2.0**127
# elements reduced at a time: on CPU a chunk and its temporaries stay in cache (several passes over one
# chunk cost about one pass over memory); on a GPU, few launches and syncs matter more
_CHUNK, _CHUNK_GPU = 1 << 16, 1 << 24
_MOSTLY = 0.5  # a value whose share of half-precision underflow/subnormals reaches this carries the zeros on
_MAX_SINKS = 3  # sensitive consumers named per node
# their values are the model's own, which converters clip to the half type's range
_LITERALS = frozenset({"Constant", "ConstantOfShape"})

# Inputs at which a consumer computes 0 from 0 whatever its other inputs (None: every input): an element
# that underflowed to 0 stays 0 through them, and reaches whatever reads their output.
# fmt: off
_ZERO_PRESERVING: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys((
        "Abs", "Neg", "Sqrt", "Relu", "LeakyRelu", "Cast", "CastLike", "Identity", "Dropout", "Flatten",
        "Transpose", "Tanh", "Sin", "Sinh", "Tan", "Erf", "Atan", "Asin", "Asinh", "Atanh", "Softsign",
        "DepthToSpace", "SpaceToDepth", "Mul", "Concat",
    )),
    **dict.fromkeys((
        "Reshape", "Squeeze", "Unsqueeze", "Expand", "Slice", "Gather", "GatherElements", "GatherND", "Split",
        "Tile", "Pad", "Div", "Pow",
    ), (0,)),
    "Where": (1, 2),
}
# fmt: on


@dataclass(frozen=True)
class _Limits:
    """Where float32 values stop being themselves in the half type."""

    dtype: str
    max: float
    overflow: float  # |x| >= overflow rounds to ±inf (max + half an ulp: round to nearest even)
    tiny: float  # the smallest normal: below it, subnormals (fewer significant bits)
    underflow: float  # 0 < |x| <= underflow rounds to 0 (half the smallest subnormal)
    mantissa_bits: int

    @classmethod
    def of(cls, dtype: Any) -> _Limits:
        try:
            dt = dtype_of(dtype)
        except ValueError:
            dt = None
        if dt is None or dt.short not in ("float16", "bfloat16"):
            raise ValueError(
                f"audit: dtype={dtype!r} is not a half-precision type; use 'float16' or 'bfloat16'"
            )
        m, top = dt.mantissa_bits, dt.max
        emax = math.floor(math.log2(top))
        return cls(
            dt.short, top, top + 2.0 ** (emax - m - 1), dt.tiny, dt.tiny * 2.0 ** (-m - 1), m
        )


@dataclass
class _Acc:
    """One node's statistics over every input so far: counts and extremes, no tensor kept."""

    n: int = 0  # float32 elements seen (all outputs, all inputs)
    runs: int = 0
    nan: int = 0
    inf: int = 0
    min: float = math.inf  # of the finite elements
    max: float = -math.inf
    absmax: float = 0.0
    min_nonzero: float = math.inf
    overflow: int = 0
    sentinel: int = 0
    underflow_zero: int = 0
    subnormal: int = 0
    produced: int = 0  # NaN/Inf elements in runs where every input of the node was finite
    runs_producing: int = 0

    def add(self, x: torch.Tensor, lim: _Limits, be: _Backend) -> int:
        """Folds `x` in; returns its number of NaN/Inf elements."""
        if be.xp is np:  # a CPU tensor: its chunks as numpy arrays (views, no copy)
            return sum(self._add(part.detach().numpy(), lim, be) for part in _chunks(x, _CHUNK))
        return sum(self._add(part, lim, be) for part in _chunks(x, _CHUNK_GPU))

    def _add(self, x: Any, lim: _Limits, be: _Backend) -> int:
        """`x`: a 1-D float32 numpy array or torch tensor, as `be` says. Every pass but the first two is
        skipped when the extremes already answer it."""
        n = len(x)
        self.n += n
        if n == 0:
            return 0
        xp = be.xp
        lo, hi = float(x.min()), float(x.max())
        bad = 0
        if not (math.isfinite(lo) and math.isfinite(hi)):  # rare: NaN/Inf, counted and left out
            finite = xp.isfinite(x)
            nan = int(xp.count_nonzero(xp.isnan(x)))
            bad = n - int(xp.count_nonzero(finite))
            self.nan += nan
            self.inf += bad - nan
            x = x[finite]
            if len(x) == 0:
                return bad
            lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        absmax = max(-lo, hi)
        self.absmax = max(self.absmax, absmax)
        if (lo > 0 or hi < 0) and min(abs(lo), abs(hi)) >= lim.tiny and absmax < lim.overflow:
            self.min_nonzero = min(self.min_nonzero, abs(lo) if lo > 0 else abs(hi))
            return bad  # the common case: one sign, every element a normal number of the half type
        a = x if lo >= 0 else xp.abs(x)
        amin = lo if lo >= 0 else (-hi if hi <= 0 else float(a.min()))
        zeros = int(xp.count_nonzero(a == be.zero)) if amin == 0 else 0
        if amin > 0:
            nonzero = amin
        elif zeros < n:
            nonzero = _min_nonzero(a, be)
        else:
            nonzero = math.inf
        self.min_nonzero = min(self.min_nonzero, nonzero)
        if absmax >= lim.overflow:
            self.overflow += int(xp.count_nonzero(a >= be.overflow))
            if absmax >= _SENTINEL:
                self.sentinel += int(xp.count_nonzero(a >= be.sentinel))
        if amin < lim.tiny:
            below = int(xp.count_nonzero(a < be.tiny))
            to_zero = (
                int(xp.count_nonzero(a <= be.underflow)) if nonzero <= lim.underflow else zeros
            )
            self.underflow_zero += to_zero - zeros
            self.subnormal += below - to_zero
        return bad


def _min_nonzero(a: Any, be: _Backend) -> float:
    """The smallest non-zero element of `a` (float32, >= 0, some element non-zero) without a branch per
    element (torch.where and masking branch on CPU, 10x slower on a mask's random zeros): as int32 bits,
    `(bits - 1) & 0x7FFFFFFF` makes 0 the largest value and moves every other element down by one, in the
    order of the floats."""
    low = int(((a.view(be.int32) - 1) & 0x7FFFFFFF).min()) + 1
    return float(struct.unpack("<f", struct.pack("<i", low))[0])


class _Backend(NamedTuple):
    """What `_Acc._add` computes with: numpy for CPU tensors (its compare-and-count is several times
    faster than torch's on CPU, and its per-call cost lower on the many small values of a graph), torch
    on the tensors' GPU; and the _Limits as float32 scalars of it (each exact in float32)."""

    xp: Any  # numpy or torch: abs, count_nonzero, isfinite, isnan
    int32: Any
    zero: Any
    overflow: Any
    sentinel: Any
    tiny: Any
    underflow: Any

    @classmethod
    def of(cls, lim: _Limits, device: torch.device) -> _Backend:
        values = (0.0, lim.overflow, _SENTINEL, lim.tiny, lim.underflow)
        if device.type == "cpu":
            return cls(np, np.int32, *(np.float32(v) for v in values))
        return cls(
            torch,
            torch.int32,
            *(torch.tensor(v, dtype=torch.float32, device=device) for v in values),
        )


def _chunks(x: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    """`x`'s elements as 1-D tensors of at most about `size` elements, copying a non-contiguous `x` one
    chunk at a time (never the whole tensor)."""
    if x.is_contiguous():
        flat = x.view(-1)
        yield from flat.split(size) if flat.numel() > size else (flat,)
    elif x.numel() <= size or x.dim() <= 1:
        yield x.reshape(-1)
    else:
        rows = size // max(1, x[0].numel())
        if rows <= 1:  # a row is a chunk or more: into the rows
            for row in x:
                yield from _chunks(row, size)
        else:
            for i in range(0, x.shape[0], rows):
                yield x[i : i + rows].reshape(-1)


@dataclass(frozen=True)
class NodeAudit:
    """One node's float32 outputs, as the half type would hold them, over every input audited.

    Shares are of all the node's float32 output elements over all inputs; `min`/`max`/`absmax`/
    `min_nonzero` are over its finite elements (None when it had none). `consumers` are the nodes reading
    its outputs, `reaches` the consumers where an underflowed value does harm (Log, a Div's divisor,
    Reciprocal, Pow with a negative exponent), directly or through ops that keep a zero a zero.
    `reasons` say why it is flagged; `notes` are findings that do not flag it (mask values, literals, NaN/Inf
    the float32 model makes itself)."""

    index: int  # position in graph.node
    name: str  # the node's name, or op type + index ("Pow_3") for a node without one
    op_type: str
    outputs: tuple[str, ...]
    elements: int  # float32 output elements seen (0: no float32 output, or the node did not run)
    runs: int
    min: float | None
    max: float | None
    absmax: float | None
    min_nonzero: float | None
    overflow: float
    sentinel: float
    underflow_zero: float
    subnormal: float
    nan_inf: float
    nan_inf_produced: float
    consumers: tuple[tuple[str, str], ...]
    reaches: tuple[tuple[str, str], ...]
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: the half type's max divided by `absmax` (inf for a node of zeros; None: not audited)
    headroom: float | None = None
    node_name: str = field(default="", repr=False)  # the node's own name ("" when it has none)
    inf: float = 0.0  # the share of ±inf elements (of `nan_inf`): a range rule counts them, not NaN

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)

    @property
    def audited(self) -> bool:
        return self.elements > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "node_name": self.node_name,
            "op_type": self.op_type,
            "outputs": list(self.outputs),
            "elements": self.elements,
            "runs": self.runs,
            "min": self.min,
            "max": self.max,
            "absmax": self.absmax,
            "min_nonzero": self.min_nonzero,
            "overflow": self.overflow,
            "sentinel": self.sentinel,
            "underflow_zero": self.underflow_zero,
            "subnormal": self.subnormal,
            "nan_inf": self.nan_inf,
            "inf": self.inf,
            "nan_inf_produced": self.nan_inf_produced,
            "headroom": None
            if self.headroom is None or math.isinf(self.headroom)
            else self.headroom,
            "consumers": [list(c) for c in self.consumers],
            "reaches": [list(c) for c in self.reaches],
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "flagged": self.flagged,
        }


def _bf16_header() -> str:
    return (
        "bfloat16 keeps float32's range (max 3.4e+38, smallest normal 1.2e-38): only values at float32's "
        "extremes leave it. What bfloat16 changes is rounding (8 significant bits, a relative step of "
        "2^-8 = 0.39 %): see precision.keep_float32 for the search that measures it against the oracle."
    )


@dataclass(frozen=True)
class AuditReport:
    """`audit()`'s result: `.nodes` (every node, graph order), `.flagged`, `.render()`, `.to_dict()`."""

    dtype: str
    model: str  # the graph's name
    inputs: int  # feed dicts audited
    nodes: tuple[NodeAudit, ...]

    @property
    def flagged(self) -> list[NodeAudit]:
        return [n for n in self.nodes if n.flagged]

    @property
    def noted(self) -> list[NodeAudit]:
        return [n for n in self.nodes if n.notes and not n.flagged]

    def node(self, name: str) -> NodeAudit:
        """The audit of the node named (or labelled) `name`."""
        for n in self.nodes:
            if name in (n.name, n.node_name):
                return n
        raise KeyError(
            f"no node {name!r} in this audit; nodes: {[n.name for n in self.nodes][:20]}"
        )

    def summary(self) -> str:
        audited = sum(n.audited for n in self.nodes)
        flagged = self.flagged
        kinds = [
            ("overflow", sum(n.overflow > n.sentinel for n in flagged)),
            ("underflow", sum(bool(n.reaches) for n in flagged)),
        ]
        what = ", ".join(f"{k} {v}" for k, v in kinds if v)
        noted = len(self.noted)
        return (
            f"{self.dtype} audit of {self.model!r}: {len(self.nodes)} nodes ({audited} with float32 outputs) over "
            f"{self.inputs} input{'s' if self.inputs != 1 else ''}: {len(flagged)} flagged"
            + (f" ({what})" if what else "")
            + (f", {noted} with notes" if noted else "")
        )

    def render(self, top: int = 5) -> str:
        """Flagged nodes first, each with its reasons; then the notes; then the `top` unflagged nodes with
        the least headroom; the summary line last."""
        lines = [f"{self.dtype} range audit of {self.model!r}"]
        if self.dtype == "bfloat16":
            lines.append(_bf16_header())
        flagged = self.flagged
        if flagged:
            lines += ["", "flagged:"]
            lines += _node_table(flagged, with_reasons=True)
        by_note: dict[str, list[NodeAudit]] = {}
        for n in self.noted:
            for note in n.notes:
                by_note.setdefault(note, []).append(n)
        if by_note:
            lines += ["", "notes (not flagged):"]
            lines += [
                f"  {note}: {_names([(n.op_type, n.name) for n in ns], 4)}"
                for note, ns in by_note.items()
            ]
        rest = sorted(
            (
                n
                for n in self.nodes
                if n.audited
                and not n.flagged
                and not n.notes
                and n.op_type not in _LITERALS
                and n.headroom is not None
            ),
            key=lambda n: n.headroom or 0.0,
        )
        if top and rest:
            lines += [
                "",
                f"least headroom, not flagged (max |x| against {self.dtype}'s max {g(_Limits.of(self.dtype).max)}):",
            ]
            lines += _node_table(rest[:top], with_reasons=False)
        lines += ["", self.summary()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "model": self.model,
            "inputs": self.inputs,
            "summary": self.summary(),
            "flagged": [n.name for n in self.flagged],
            "nodes": [n.to_dict() for n in self.nodes],
        }


def _node_table(nodes: Sequence[NodeAudit], *, with_reasons: bool) -> list[str]:
    head = [
        "op",
        "name",
        "min",
        "max",
        "min|x|>0",
        "overflow",
        "→0",
        "subnormal",
        "NaN/Inf new",
        "headroom",
        "feeds",
    ]
    rows = [
        [
            n.op_type,
            n.name,
            g(n.min),
            g(n.max),
            g(n.min_nonzero),
            _share(n.overflow),
            _share(n.underflow_zero),
            _share(n.subnormal),
            _share(n.nan_inf_produced),
            _headroom(n.headroom),
            _names(n.consumers, 2) or "(output)",
        ]
        for n in nodes
    ]
    head_line, *body = table(head, rows, indent="  ")
    out = [head_line]
    for n, line in zip(nodes, body, strict=True):
        out.append(line)
        if with_reasons:
            out += [f"    ↳ {r}" for r in n.reasons]
    return out


def _headroom(h: float | None) -> str:
    return "-" if h is None else "∞" if math.isinf(h) else f"{g(h, 2)}×"


def _share(x: float) -> str:
    return "0" if x == 0 else pct_frac(x)


def _names(nodes: Sequence[tuple[str, str]], most: int = 3) -> str:
    shown = ", ".join(f"{op} {name!r}" for op, name in nodes[:most])
    return shown + (f" +{len(nodes) - most} more" if len(nodes) > most else "")


# -- the graph: labels, consumers, where zeros do harm --------------------------------------------------


class _Graph:
    """The facts about the top-level graph the flags need: labels, who reads what, Pow exponents."""

    def __init__(self, model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> None:
        self.nodes = nodes
        self.labels = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)]
        self.producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in nodes]
        for j, n in enumerate(nodes):
            for pos, x in enumerate(n.input):
                i = self.producer.get(x)
                if i is not None:
                    self.consumers[i].append((j, pos))
        self._initializers = {init.name: init for init in model.graph.initializer}
        self._exponents: dict[int, str] = {}  # Pow node -> what its exponent does to a 0

    def constant(self, name: str) -> np.ndarray | None:
        """The value of `name` when an initializer or a Constant node holds it."""
        if name in self._initializers:
            return numpy_helper.to_array(self._initializers[name])
        i = self.producer.get(name)
        if i is None or self.nodes[i].op_type != "Constant":
            return None
        for a in self.nodes[i].attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t)
            if a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                return np.asarray(onnx.helper.get_attribute_value(a))
        return None

    def sink_role(self, j: int, pos: int) -> str | None:
        """How input `pos` of node `j` is harmed by a 0 (or by a subnormal's lost bits): None if it is not."""
        op = self.nodes[j].op_type
        if op in ("Log", "Reciprocal") and pos == 0:
            return ""
        if op == "Div" and pos == 1:
            return "divisor"
        if op == "Pow" and pos == 0:
            return {"positive": None, "zero": None, "negative": "base, exponent < 0"}.get(
                self._exponent(j), "base, exponent not a constant"
            )
        return None

    def keeps_zero(self, j: int, pos: int) -> bool:
        node = self.nodes[j]
        if node.op_type == "Pow" and self._exponent(j) != "positive":
            return False
        positions = _ZERO_PRESERVING.get(node.op_type, ())
        return positions is None or pos in positions

    def _exponent(self, j: int) -> str:
        """Pow node `j`'s exponent: "positive" (0 stays 0), "negative" (0 becomes inf), "zero" (some
        exponent 0, none negative: x**0 = 1), or "unknown" (not a constant)."""
        kind = self._exponents.get(j)
        if kind is None:
            node = self.nodes[j]
            value = self.constant(node.input[1]) if len(node.input) > 1 else None
            if value is None or value.size == 0:
                kind = "unknown"
            else:
                e = np.asarray(value, dtype=np.float64)
                kind = "negative" if (e < 0).any() else "zero" if (e == 0).any() else "positive"
            self._exponents[j] = kind
        return kind


# -- the run ---------------------------------------------------------------------------------------------


class _Observer:
    """`TorchEvaluator.run(observe=...)`'s callback: folds each node's float32 outputs into its _Acc and
    tells NaN/Inf a node made from finite inputs from NaN/Inf it passed on."""

    def __init__(self, ev: TorchEvaluator, graph: _Graph, lim: _Limits) -> None:
        self.lim = lim
        self.graph = graph
        self.index = {id(n): i for i, n in enumerate(ev.nodes)}
        self.accs = [_Acc() for _ in ev.nodes]
        self.bad: set[str] = set()  # values of this run holding NaN/Inf
        self._initializer_bad: dict[str, bool] = {}
        self._backends: dict[torch.device, _Backend] = {}

    def start(self, feeds: Mapping[str, Any]) -> None:
        self.bad = {name for name, v in feeds.items() if _has_nonfinite(v)}

    def __call__(self, node: onnx.NodeProto, outputs: Mapping[str, Any]) -> None:
        i = self.index.get(id(node))
        if i is None:
            return
        acc = self.accs[i]
        acc.runs += 1
        bad = 0
        for name, v in outputs.items():
            if isinstance(v, torch.Tensor) and v.dtype == torch.float32:
                be = self._backends.get(v.device)
                if be is None:
                    be = self._backends[v.device] = _Backend.of(self.lim, v.device)
                nb = acc.add(v, self.lim, be)
                if nb:
                    bad += nb
                    self.bad.add(name)
        if (
            bad
            and node.op_type not in _LITERALS
            and not any(self._is_bad(x) for x in node.input if x)
        ):
            acc.produced += bad
            acc.runs_producing += 1

    def _is_bad(self, name: str) -> bool:
        if name in self.bad:
            return True
        cached = self._initializer_bad.get(name)
        if cached is None:
            value = self.graph.constant(name) if name not in self.graph.producer else None
            cached = self._initializer_bad[name] = (
                value is not None and value.dtype.kind == "f" and not bool(np.isfinite(value).all())
            )
        return cached


def _has_nonfinite(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.is_floating_point() and not bool(torch.isfinite(v).all())
    if isinstance(v, np.ndarray):
        return v.dtype.kind == "f" and not bool(np.isfinite(v).all())
    if isinstance(v, list | tuple):
        return any(_has_nonfinite(e) for e in v)
    return False


def audit(
    model: Any,
    feeds_iter: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    dtype: str = "float16",
    device: str | torch.device = "cpu",
    kernels: Mapping[Any, Any] | None = None,
    missing: Literal["error", "ort"] = "error",
) -> AuditReport:
    """Audits `model`'s float32 graph for a conversion to `dtype` ("float16" or "bfloat16").

    Runs the graph in the torch evaluator, every floating value in float32 (a float16 model is audited as
    its float32 twin), on each feed dict of `feeds_iter` (an iterable of dicts, a generator included, or one
    dict), streamed: each node's outputs are reduced to a few numbers as they are computed and freed as soon
    as no later node reads them, so memory stays at one run's live tensors whatever the number of inputs.

    Per node, over all inputs: the range of its float32 outputs and the shares of elements that overflow
    the half type (round to ±inf), underflow to 0, or fall to its subnormals; NaN/Inf it produces from
    finite inputs. A node is flagged when its values overflow (float32's ±3.4e38 mask values, literals and
    NaN/Inf the float32 model makes itself only make a note), or when values it underflows or makes
    subnormal (most of them) reach a consumer
    they harm (Log, a Div's divisor, Reciprocal, Pow with a negative exponent) through ops that keep a 0
    a 0 (Mul, Sqrt, reshapes, ...) or whose own outputs mostly underflow too. Nodes inside If/Loop/Scan
    bodies are not audited one by one (their node is).

    `device`, `kernels`, `missing`: as for TorchEvaluator (e.g. `missing="ort"` runs ops without a torch
    kernel on onnxruntime).
    """
    lim = _Limits.of(dtype)
    ev = TorchEvaluator(
        model, device=device, kernels=kernels, compute_dtype=torch.float32, missing=missing
    )
    graph = _Graph(ev.model, ev.nodes)
    obs = _Observer(ev, graph, lim)
    batches: Iterable[Mapping[str, Any]] = (
        [feeds_iter] if isinstance(feeds_iter, Mapping) else feeds_iter
    )
    count = 0
    seen: list[Mapping[str, Any]] = []  # the feeds of a run whose outputs were all empty, so far (a few)
    first: list[Any] = []
    empty = True
    for feeds in batches:
        if not isinstance(feeds, Mapping):
            raise TypeError(
                f"audit: feeds_iter yields a {type(feeds).__name__}; it must yield dicts input name -> tensor (or be one dict)"
            )
        obs.start(feeds)
        outputs = ev.run(None, feeds, observe=obs)
        if empty:
            empty = not any(_elements(o) for o in outputs)
            if empty and len(seen) < 8:
                seen.append({k: v for k, v in feeds.items() if 0 in tuple(getattr(v, "shape", ()))})
                first = first or list(outputs)
        count += 1
    if count == 0:
        raise ValueError(
            "audit: feeds_iter yielded no feeds; pass one dict of inputs or an iterable of them"
        )
    if empty:  # every output empty on every input: the audit saw nothing a conversion would compute
        refuse_empty("audit", ev.model, [first], seen)
    return AuditReport(
        lim.dtype, ev.model.graph.name or "model", count, _node_audits(graph, obs.accs, lim)
    )


def _node_audits(graph: _Graph, accs: Sequence[_Acc], lim: _Limits) -> tuple[NodeAudit, ...]:
    def tiny_share(a: _Acc) -> float:
        return (a.underflow_zero + a.subnormal) / a.n if a.n else 0.0

    # the harmed consumers each node's zeros reach, with the nodes in between: consumers come later in a
    # valid graph, so one pass from the end sees every consumer's answer before its producers ask
    reach: list[dict[int, tuple[int, ...]]] = [{} for _ in graph.nodes]
    for i in range(len(graph.nodes) - 1, -1, -1):
        found: dict[int, tuple[int, ...]] = {}
        for j, pos in graph.consumers[i]:
            if graph.sink_role(j, pos) is not None:
                found[j] = ()
            elif graph.keeps_zero(j, pos) or tiny_share(accs[j]) >= _MOSTLY:
                for sink, via in reach[j].items():
                    if sink not in found or len(via) + 1 < len(found[sink]):
                        found[sink] = (j, *via)
        reach[i] = dict(sorted(found.items(), key=lambda kv: (len(kv[1]), kv[0]))[:_MAX_SINKS])

    out = []
    for i, (node, a) in enumerate(zip(graph.nodes, accs, strict=True)):
        label = graph.labels[i]
        consumers = tuple(
            dict.fromkeys((graph.nodes[j].op_type, graph.labels[j]) for j, _ in graph.consumers[i])
        )
        n = a.n
        finite = n - a.nan - a.inf
        reasons: list[str] = []
        notes: list[str] = []
        sinks: tuple[tuple[str, str], ...] = ()
        if n:
            feeds = f" → feeds {_names(consumers)}" if consumers else " (a graph output)"
            if node.op_type in _LITERALS:
                if a.overflow or a.underflow_zero:
                    notes.append(f"literals beyond {lim.dtype}'s range: converters clip them to it")
            else:
                real = a.overflow - a.sentinel
                if real:
                    reasons.append(
                        f"overflows {lim.dtype}: {pct_frac(real / n)} of elements round to ±inf (|x| ≥ {g(lim.overflow, 5)}), "
                        f"max |x| {g(a.absmax)}" + feeds
                    )
                if a.sentinel:
                    notes.append(
                        f"float32's ±3.4e+38 mask value: ±inf in {lim.dtype}, unless it comes from a literal, "
                        f"which converters clip to ±{g(lim.max)}"
                    )
                if (
                    a.produced
                ):  # the model's own doing: the half type makes it neither better nor worse
                    notes.append(
                        "makes NaN/Inf from finite inputs, in float32 already (see NaN/Inf new)"
                    )
                # a zero does harm however few; subnormals lose bits, which matters when most of a value does
                if (a.underflow_zero or a.subnormal >= _MOSTLY * n) and reach[i]:
                    sinks = tuple((graph.nodes[j].op_type, graph.labels[j]) for j in reach[i])
                    where = "; ".join(_sink_text(graph, i, j, via) for j, via in reach[i].items())
                    if a.underflow_zero:
                        reasons.append(
                            f"underflows to 0 in {lim.dtype}: {pct_frac(a.underflow_zero / n)} of elements "
                            f"(0 < |x| ≤ {g(lim.underflow)}), min |x|>0 {g(a.min_nonzero)} → reaches {where}"
                        )
                    else:
                        reasons.append(
                            f"falls to {lim.dtype} subnormals: {pct_frac(a.subnormal / n)} of elements with |x| < "
                            f"{g(lim.tiny)} keep fewer than {lim.mantissa_bits + 1} significant bits, min |x|>0 "
                            f"{g(a.min_nonzero)} → reaches {where}"
                        )
        has_finite = n > 0 and finite > 0
        out.append(
            NodeAudit(
                index=i,
                name=label,
                op_type=node.op_type,
                outputs=tuple(node.output),
                elements=n,
                runs=a.runs,
                min=a.min if has_finite else None,
                max=a.max if has_finite else None,
                absmax=a.absmax if has_finite else None,
                min_nonzero=a.min_nonzero if has_finite and math.isfinite(a.min_nonzero) else None,
                overflow=a.overflow / n if n else 0.0,
                sentinel=a.sentinel / n if n else 0.0,
                underflow_zero=a.underflow_zero / n if n else 0.0,
                subnormal=a.subnormal / n if n else 0.0,
                nan_inf=(a.nan + a.inf) / n if n else 0.0,
                inf=a.inf / n if n else 0.0,
                nan_inf_produced=a.produced / n if n else 0.0,
                consumers=consumers,
                reaches=sinks,
                reasons=tuple(reasons),
                notes=tuple(notes),
                headroom=(lim.max / a.absmax if a.absmax else math.inf) if has_finite else None,
                node_name=node.name,
            )
        )
    return tuple(out)


def _sink_text(graph: _Graph, i: int, j: int, via: tuple[int, ...]) -> str:
    node = graph.nodes[j]
    role = next(
        r
        for k, p in graph.consumers[via[-1] if via else i]
        if k == j and (r := graph.sink_role(j, p)) is not None
    )
    text = f"{node.op_type} {graph.labels[j]!r}" + (f" ({role})" if role else "")
    if via:
        steps = [f"{graph.nodes[k].op_type} {graph.labels[k]!r}" for k in via]
        text += " via " + (
            ", ".join(steps)
            if len(steps) <= 4
            else f"{', '.join(steps[:2])}, … {steps[-1]} ({len(steps)} nodes)"
        )
    return text
