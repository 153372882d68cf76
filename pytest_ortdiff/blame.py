"""blame(): which node explains the gap between the torch evaluator and onnxruntime, and who is right.

Every node is swapped to onnxruntime one at a time inside the torch evaluator; its local error (same
inputs, both kernels) and every run's error against the float64 oracle are measured too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import onnx
import onnx.helper as oh
import torch

from .diff import DiffReport, compare
from .dtypes import DType, dtype_of
from .formatting import g, table
from .model_io import load_model
from .providers import KNOWN, parse_provider, torch_device
from .results import closer_to_oracle
from .runtimes.evaluator import MissingKernelError, TorchEvaluator
from .runtimes.ort import OrtRunner
from .runtimes.ort_kernel import OrtKernel
from .tolerance import Tolerance

__all__ = ["BlameRow", "BlameTable", "blame", "node_key", "ort_intermediates"]


def node_key(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or `OpType_<index>` for unnamed nodes (a name TorchEvaluator's kernels= accepts)."""
    return node.name or f"{node.op_type}_{index}"


@dataclass(frozen=True)
class BlameRow:
    """One node: how much of the torch-vs-onnxruntime gap swapping it to onnxruntime closes, and its own error.

    - `explained`: 0..1, `1 - mean|sub - ort| / mean|torch - ort|` (1: with this node on onnxruntime the
      torch evaluator reproduces onnxruntime; 0: no change or worse).
    - `vs_ort`, `vs_torch`: max abs error of that substituted run against all-onnxruntime / all-torch.
    - `local_max_abs`, `local_max_ulp`: the node's own error, same inputs (from the torch run) through the
      torch kernel and the onnxruntime kernel, first output.
    - `drift_max_abs`: the node's output in the torch run vs in the onnxruntime run (accumulated error).
    - `oracle_max_abs`, `oracle_max_ulp`: the substituted run against the float64 oracle.
    """

    node: str
    op_type: str
    explained: float
    vs_ort: float
    vs_torch: float
    local_max_abs: float
    local_max_ulp: float
    drift_max_abs: float | None = None
    oracle_max_abs: float | None = None
    oracle_max_ulp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class OracleError:
    """A whole run against the float64 oracle."""

    name: str
    max_abs: float
    max_ulp: float
    mismatches: int
    n: int


@dataclass
class BlameTable(Sequence[BlameRow]):
    """Rows sorted by `explained` (first = most to blame) plus the runtimes' errors against the oracle."""

    rows: list[BlameRow]
    provider: str
    dtype: str
    gap: DiffReport
    oracle: dict[str, OracleError] = field(default_factory=dict)
    op_rows: list[BlameRow] = field(default_factory=list)
    first_divergence: str | None = None
    #: what onnxruntime did to the graph that no single-node swap can reproduce (inserted Casts, ...)
    notes: list[str] = field(default_factory=list)

    #: a node must explain at least this share of the gap to be named the culprit
    CULPRIT_MIN = 0.1

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        return self.rows[i]

    def __iter__(self) -> Iterator[BlameRow]:
        return iter(self.rows)

    @property
    def culprit(self) -> BlameRow | None:
        """The node that explains most of the gap, or None when there is no gap or no node explains it."""
        if not self.rows or self.gap.is_exact or self.rows[0].explained < self.CULPRIT_MIN:
            return None
        return self.rows[0]

    @property
    def closer_to_oracle(self) -> str | None:
        """'onnxruntime', 'torch' or 'tie': which runtime is closer to the float64 oracle (max ULP, then
        number of elements off)."""
        t, o = self.oracle.get("torch"), self.oracle.get("onnxruntime")
        if t is None or o is None:
            return None
        return closer_to_oracle(o, t)

    def by_op_type(self) -> list[BlameRow]:
        """One row per op type, every node of that type swapped at once (the seed-000 table's form)."""
        return self.op_rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "dtype": self.dtype,
            "gap": self.gap.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "by_op_type": [r.to_dict() for r in self.op_rows],
            "oracle": {k: dict(v.__dict__) for k, v in self.oracle.items()},
            "first_divergence": self.first_divergence,
            "culprit": self.culprit.node if self.culprit else None,
            "closer_to_oracle": self.closer_to_oracle,
            "notes": list(self.notes),
        }

    def render(self) -> str:
        gap = self.gap
        lines = [f"blame: torch evaluator vs onnxruntime {self.provider} {self.dtype}: gap max abs {g(gap.max_abs)}, {gap.mismatches:,}/{gap.n:,} elements differ"]
        if gap.is_exact:
            lines.append("  no discrepancy: nothing to blame")
        head = ("node", "op", "explained", "vs ort", "vs torch", "local abs", "local ulp", "drift abs", "vs f64 abs", "vs f64 ulp")
        body = [
            (r.node, r.op_type, f"{r.explained * 100:.0f} %", g(r.vs_ort), g(r.vs_torch), g(r.local_max_abs), g(r.local_max_ulp), g(r.drift_max_abs), g(r.oracle_max_abs), g(r.oracle_max_ulp))
            for r in self.rows
        ]
        lines += _table(head, body)
        if self.oracle:
            lines.append("against the float64 oracle (in the tested dtype):")
            for rt in self.oracle.values():
                lines.append(f"  {rt.name:<12} max abs {g(rt.max_abs):<10} max ulp {g(rt.max_ulp):<6} {rt.mismatches:,}/{rt.n:,} elements off")
            closer = self.closer_to_oracle
            if closer:
                lines.append(f"  closer to the oracle: {closer}")
        if self.first_divergence:
            lines.append(f"first node whose output drifts: {self.first_divergence}")
        if self.culprit:
            lines.append(f"most to blame: {self.culprit.node} ({self.culprit.op_type}), explains {self.culprit.explained * 100:.0f} % of the gap")
        elif not gap.is_exact:
            lines.append(f"no single node explains {self.CULPRIT_MIN * 100:.0f} % of the gap: the difference comes from how onnxruntime runs the graph as a whole")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def render_by_op_type(self) -> str:
        """The seed-000 table: each op type run by onnxruntime inside torch, diff against torch and against ort."""
        head = ("swapped to ort", "diff vs ort", "diff vs torch", "explained")
        body = [(r.op_type, g(r.vs_ort), g(r.vs_torch), f"{r.explained * 100:.0f} %") for r in self.op_rows]
        return "\n".join([f"{self.provider} {self.dtype}", *_table(head, body)])


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return table(head, body, indent="  ")


# ------------------------------------------------------------------------------------------------


def ort_intermediates(model: Any, feeds: Mapping[str, Any], provider: str = "CPU") -> dict[str, torch.Tensor]:
    """Every node output as computed by onnxruntime (each exposed as a graph output)."""
    m = load_model(model)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(m)
    present = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for o in node.output:
            if o and o not in present:
                exposed.graph.output.append(oh.make_empty_tensor_value_info(o))
                present.add(o)
    runner = OrtRunner(exposed, provider=provider)
    names = runner.output_names
    return dict(zip(names, runner.run(names, feeds), strict=True))


def ort_graph_notes(model: Any, provider: str = "CPU") -> list[str]:
    """What onnxruntime changes in the graph on `provider` that shifts precision: the nodes it runs in
    another dtype through inserted Casts (its CPU provider lacks float16 kernels for many ops)."""
    import os
    import tempfile

    import onnxruntime

    m = load_model(model)
    ep = KNOWN[parse_provider(provider)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        so = onnxruntime.SessionOptions()
        so.optimized_model_filepath = path
        # no optimizations: only the transformations onnxruntime always applies (Cast insertion)
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            onnxruntime.InferenceSession(m.SerializeToString(), so, providers=[ep])
        except Exception:  # the caller's own run reports session errors; notes are a bonus
            return []
        if not os.path.exists(path):
            return []
        optimized = onnx.load(path)
    inserted = {n.output[0]: n for n in optimized.graph.node if n.op_type == "Cast" and "Inserted" in n.name}
    if not inserted:
        return []
    # The element type every value has in the optimized graph: a node of the model whose (first
    # floating) input changed type runs in that type, fed by an inserted Cast or by another such node.
    types = _value_types(optimized)
    before = _value_types(m)
    original = {n.name for n in m.graph.node if n.name}
    promoted = []
    for node in optimized.graph.node:
        if node.name not in original:
            continue
        orig = next((n for n in m.graph.node if n.name == node.name), None)
        pairs = [
            (types.get(x), before.get(y))
            for x, y in zip(node.input, orig.input if orig is not None else [], strict=False)
            if x and y
        ]
        changed = next((t for t, b in pairs if t is not None and b is not None and t != b and DType(b).is_floating_point), None)
        if changed is not None:
            promoted.append(f"{node.name} ({node.op_type}) in {dtype_of(changed).short}")
    if not promoted:
        return []
    return [
        f"onnxruntime {ep} inserted {len(inserted)} Cast node(s) and runs {', '.join(promoted)}: "
        "values between those nodes are not rounded to the model's dtype, which no single-node swap reproduces"
    ]


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Value name -> element type, from graph inputs, initializers, outputs and shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an optimized graph with contrib ops: what is declared is still useful
        inferred = model
    graph = inferred.graph
    types = {i.name: i.data_type for i in graph.initializer}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for n in graph.node:
        if n.op_type == "Cast":
            to = next((a.i for a in n.attribute if a.name == "to"), None)
            if to is not None:
                types.setdefault(n.output[0], to)
    return types


def _to_declared(outs: list[torch.Tensor], dtypes: Sequence[torch.dtype | None]) -> list[torch.Tensor]:
    return [o.to(dt) if dt is not None and o.dtype != dt else o for o, dt in zip(outs, dtypes, strict=True)]


def blame(
    model: Any,
    feeds: Mapping[str, Any],
    *,
    provider: str = "CPU",
    dtype: Any = None,
    kernels: Mapping[Any, Any] | None = None,
    oracle: bool = True,
    tolerance: Tolerance | None = None,
    missing: Literal["error", "ort"] = "error",
) -> BlameTable:
    """Swap every node to onnxruntime in turn and measure how much of the torch/onnxruntime gap it explains.

    `kernels` applies overrides to the torch side (to test your own kernel); `missing="ort"` runs every op
    without a torch kernel on onnxruntime (it explains nothing then); `tolerance` decides which node output
    is the first to drift (default: any difference).
    """
    m = load_model(model)
    provider = parse_provider(provider)
    device = torch_device(provider)
    kernels = dict(kernels or {})
    extra: dict[str, Any] = {"missing": missing} if missing != "error" else {}  # the evaluator's default
    base = TorchEvaluator(m, device=device, kernels=kernels, **extra)
    outputs = list(base.output_names)
    declared = [base.output_dtypes.get(o) for o in outputs]
    label = dtype_of(dtype).short if dtype is not None else _first_float_dtype(declared)

    ort_all = ort_intermediates(m, feeds, provider)
    ort_out = [ort_all[o] for o in outputs]
    torch_all = base.run(None, feeds, intermediates=True)
    torch_out = [torch_all[o] for o in outputs]
    gap = compare(dict(zip(outputs, torch_out, strict=True)), dict(zip(outputs, ort_out, strict=True)))
    gap_mean = gap.mean_abs

    oracle_out: list[torch.Tensor] | None = None
    table_oracle: dict[str, OracleError] = {}
    if oracle:
        ev64 = _oracle(m, device, kernels, extra)
        oracle_out = _to_declared(ev64.run(None, feeds), declared)
        for name, outs in (("torch", torch_out), ("onnxruntime", ort_out)):
            r = compare(oracle_out, outs)
            table_oracle[name] = OracleError(name, r.max_abs, r.max_ulp, r.mismatches, r.n)

    def substituted(keys: list[str]) -> tuple[float, float, float, float | None, float | None]:
        ev = TorchEvaluator(m, device=device, kernels={**kernels, **dict.fromkeys(keys, "ort")}, check_model=False, **extra)
        sub = ev.run(None, feeds)
        vs_ort = compare(sub, ort_out)
        vs_torch = compare(sub, torch_out)
        explained = 0.0 if gap_mean == 0 else max(0.0, min(1.0, 1.0 - vs_ort.mean_abs / gap_mean))
        o_abs = o_ulp = None
        if oracle_out is not None:
            r = compare(oracle_out, sub)
            o_abs, o_ulp = r.max_abs, r.max_ulp
        return explained, vs_ort.max_abs, vs_torch.max_abs, o_abs, o_ulp

    # node names the evaluator can be keyed by: unnamed nodes get one on a copy of the model
    named = onnx.ModelProto()
    named.CopyFrom(m)
    for i, node in enumerate(named.graph.node):
        if not node.name:
            node.name = node_key(node, i)
    m = named

    drift_tol = tolerance
    first_divergence = None
    rows: list[BlameRow] = []
    for i, node in enumerate(m.graph.node):
        key = node.name
        explained, vs_ort, vs_torch, o_abs, o_ulp = substituted([key])
        local_abs, local_ulp = _local_error(node, base, torch_all, i)
        drift = None
        out0 = node.output[0] if node.output else ""
        if out0 in torch_all and out0 in ort_all and torch_all[out0].shape == ort_all[out0].shape and torch_all[out0].dtype == ort_all[out0].dtype:
            d = compare(torch_all[out0], ort_all[out0], tolerance=drift_tol.allclose if drift_tol is not None else None)
            drift = d.max_abs
            broke = bool(drift_tol.check(d)) if drift_tol is not None else not d.is_exact
            if first_divergence is None and broke:
                first_divergence = f"{key} ({node.op_type}): max abs {g(d.max_abs)}, {d.mismatches:,}/{d.n:,} elements differ"
        rows.append(BlameRow(key, node.op_type, explained, vs_ort, vs_torch, local_abs, local_ulp, drift, o_abs, o_ulp))

    op_rows: list[BlameRow] = []
    for op in dict.fromkeys(n.op_type for n in m.graph.node):
        members = [r for r in rows if r.op_type == op]
        if len(members) == 1:
            op_rows.append(BlameRow(op, op, *_row_numbers(members[0])))
            continue
        keys = [n.name for n in m.graph.node if n.op_type == op]
        explained, vs_ort, vs_torch, o_abs, o_ulp = substituted(keys)
        local_abs = max(r.local_max_abs for r in members)
        local_ulp = max(r.local_max_ulp for r in members)
        drifts = [r.drift_max_abs for r in members if r.drift_max_abs is not None]
        op_rows.append(BlameRow(op, op, explained, vs_ort, vs_torch, local_abs, local_ulp, max(drifts) if drifts else None, o_abs, o_ulp))

    rows.sort(key=lambda r: (-r.explained, -r.local_max_ulp))
    op_rows.sort(key=lambda r: -r.explained)
    notes = ort_graph_notes(m, provider) if not gap.is_exact else []
    return BlameTable(rows=rows, provider=provider, dtype=label, gap=gap, oracle=table_oracle, op_rows=op_rows, first_divergence=first_divergence, notes=notes)


def _oracle(m: onnx.ModelProto, device: Any, kernels: Mapping[Any, Any], extra: Mapping[str, Any]) -> TorchEvaluator:
    """The float64 evaluator. The user's kernels under test stay out of it; only the overrides that
    name a runtime ("ort" for an op without a torch kernel, ...) go in, and a callable only where the
    oracle cannot be built without it (an op no runtime here has)."""
    named = {k: v for k, v in kernels.items() if isinstance(v, str)}
    try:
        return TorchEvaluator(m, device=device, compute_dtype=torch.float64, kernels=named, **extra)
    except MissingKernelError:
        return TorchEvaluator(m, device=device, compute_dtype=torch.float64, kernels=kernels, **extra)


def _row_numbers(r: BlameRow) -> tuple[Any, ...]:
    return (r.explained, r.vs_ort, r.vs_torch, r.local_max_abs, r.local_max_ulp, r.drift_max_abs, r.oracle_max_abs, r.oracle_max_ulp)


def _first_float_dtype(dtypes: Sequence[torch.dtype | None]) -> str:
    for dt in dtypes:
        if dt is not None and dt.is_floating_point:
            return dtype_of(dt).short
    return "float32"


def _local_error(node: onnx.NodeProto, ev: TorchEvaluator, values: Mapping[str, torch.Tensor], index: int) -> tuple[float, float]:
    """The node's own error: the same inputs through its torch kernel and through onnxruntime. A node
    carrying graphs (If, Loop, Scan, ...) has none of its own: its body's nodes make its error, and a
    one-node onnxruntime model could not see the outer-scope values its body reads."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return 0.0, 0.0
    inputs = tuple(values[x] if x else None for x in node.input)
    if any(x is not None and not isinstance(x, torch.Tensor) for x in inputs):
        return 0.0, 0.0
    torch_kernel = ev._kernels[index]
    ort_kernel = OrtKernel(node, torch_kernel.ctx, ev.opsets)
    a = torch_kernel.run(*inputs)
    b = ort_kernel.run(*inputs)
    worst_abs = worst_ulp = 0.0
    for name, x, y in zip(node.output, a, b, strict=False):
        if not name or x.shape != y.shape or x.dtype != y.dtype:
            continue
        r = compare(x, y)
        worst_abs = max(worst_abs, r.max_abs)
        worst_ulp = max(worst_ulp, r.max_ulp)
    return worst_abs, worst_ulp
