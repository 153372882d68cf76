"""blame(): which node explains the gap between the torch evaluator and onnxruntime, and who is right.

Every node is swapped to onnxruntime one at a time inside the torch evaluator, recomputing only what the
swap changes; its local error (same inputs, both kernels) and every run's error against the float64
oracle are measured too, and the blame is summed per module scope of the exporter's metadata.
"""

from __future__ import annotations

import ast
import heapq
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import onnx
import onnx.helper as oh
import torch

from . import progress
from .diff import DiffReport, compare
from .dtypes import DType, dtype_of
from .formatting import g, table
from .model_io import expose_all_values, load_model
from .providers import KNOWN, parse_provider, torch_device
from .results import closer_to_oracle
from .runtimes.evaluator import MissingKernelError, TorchEvaluator
from .runtimes.ort import OrtRunner
from .runtimes.ort_kernel import OrtKernel
from .tolerance import Tolerance

__all__ = ["BlameRow", "BlameTable", "ScopeBlame", "blame", "node_key", "node_scope", "ort_intermediates"]


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
    - `skipped`: onnxruntime's output of the node is bit-identical to torch's from the same inputs, so the
      swap changes nothing and was not run: its numbers are the torch run's (explains 0 %), exactly.
    - `scope`: the module the node comes from (exporter metadata or node-name prefix; "" when unknown).
    - `exact`: the swap was run. False on a large graph for a node outside the exact budget (see `blame`):
      `explained` is then a first-order estimate (the gap's gradient through the torch run times the
      node's local difference) and `vs_ort`, `vs_torch` and the oracle's numbers are None.
    """

    node: str
    op_type: str
    explained: float
    vs_ort: float | None
    vs_torch: float | None
    local_max_abs: float
    local_max_ulp: float
    drift_max_abs: float | None = None
    oracle_max_abs: float | None = None
    oracle_max_ulp: float | None = None
    skipped: bool = False
    scope: str = ""
    exact: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ScopeBlame:
    """One module scope: the share of the gap its nodes explain (their `explained` summed, at most 1), how
    many nodes it has, and its node most to blame."""

    scope: str
    explained: float
    nodes: int
    top_node: str
    top_explained: float

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
    #: nodes the swaps ran again (torch or onnxruntime kernels), all swaps together: the algorithm's cost
    nodes_recomputed: int = 0
    #: seconds spent per phase of blame() (what bench_blame.py prints)
    timings: dict[str, float] = field(default_factory=dict)

    #: a node must explain at least this share of the gap to be named the culprit
    CULPRIT_MIN = 0.1
    #: rows `render()` shows before "... N more nodes"
    TOP = 15

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

    def by_scope(self) -> list[ScopeBlame]:
        """The gap per module scope (the exporter's metadata), most to blame first, an enclosing scope before
        the scopes inside it; empty when no node names its scope. A scope holds its own nodes and those of
        the scopes inside it (`layers.1` holds `layers.1.self_attn`'s); its share is their `explained`
        summed (at most 100 %)."""
        known = {r.scope for r in self.rows if r.scope}
        groups: dict[str, list[BlameRow]] = {}
        for r in self.rows:
            if not r.scope:
                continue
            parts = r.scope.split(".")
            for cut in range(1, len(parts) + 1):
                scope = ".".join(parts[:cut])
                if scope in known:
                    groups.setdefault(scope, []).append(r)
        out = []
        for scope, members in groups.items():
            top = max(members, key=lambda r: r.explained)
            out.append(ScopeBlame(scope, min(1.0, sum(r.explained for r in members)), len(members), top.node, top.explained))
        out.sort(key=lambda s: (-s.explained, s.scope.count("."), s.scope))
        return out

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
            "by_scope": [s.to_dict() for s in self.by_scope()],
            "nodes_recomputed": self.nodes_recomputed,
        }

    def render(self, top: int | None = None) -> str:
        """The table: the `top` nodes most to blame (default `TOP`; every node when the graph is that small),
        then "... N more nodes", the summary per module scope, the oracle's verdict."""
        gap = self.gap
        lines = [f"blame: torch evaluator vs onnxruntime {self.provider} {self.dtype}: gap max abs {g(gap.max_abs)}, {gap.mismatches:,}/{gap.n:,} elements differ"]
        if gap.is_exact:
            lines.append("  no discrepancy: nothing to blame")
        top = self.TOP if top is None else top
        shown = self.rows if len(self.rows) <= top + 1 else self.rows[:top]
        head = ("node", "op", "explained", "vs ort", "vs torch", "local abs", "local ulp", "drift abs", "vs f64 abs", "vs f64 ulp")
        body = [
            (r.node, r.op_type, f"{r.explained * 100:.0f} %" if r.exact else f"~{r.explained * 100:.0f} %", g(r.vs_ort), g(r.vs_torch), g(r.local_max_abs), g(r.local_max_ulp), g(r.drift_max_abs), g(r.oracle_max_abs), g(r.oracle_max_ulp))
            for r in shown
        ]
        lines += _table(head, body)
        estimated = sum(not r.exact for r in self.rows)
        if estimated:
            lines.append(
                f"  ~: {estimated:,} of {len(self.rows):,} rows are first-order estimates (their swap was not run: outside blame's budget); the others are exact"
            )
        rest = self.rows[len(shown) :]
        if rest:
            skipped = sum(r.skipped for r in rest)
            lines.append(f"  ... {len(rest):,} more nodes, each explaining at most {max(r.explained for r in rest) * 100:.0f} % ({skipped:,} of them bit-identical on onnxruntime: 0 %)")
        scopes = self.by_scope()
        if scopes and not gap.is_exact:
            lines.append("by module scope (its nodes' explained summed, the scopes inside it included):")
            shown_scopes = [s for s in scopes if s.explained > 0][:10]
            for s in shown_scopes:
                lines.append(f"  {s.scope}: {s.explained * 100:.0f} % of the gap ({s.nodes} nodes; most: {s.top_node} {s.top_explained * 100:.0f} %)")
            if len(scopes) > len(shown_scopes):
                lines.append(f"  ... {len(scopes) - len(shown_scopes)} more scopes, {sum(s.explained == 0 for s in scopes)} of them explaining 0 %")
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
    exposed = expose_all_values(load_model(model))
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


def _same_bits(a: Any, b: Any) -> bool:
    """`a` and `b` are the same tensor bit for bit (signed zeros and NaN payloads count) and laid out alike
    (a torch kernel may pick another algorithm for a transposed view than for a contiguous copy): what makes
    a node's swap a no-op. Anything but a pair of tensors is the same only if it is the same object."""
    if a is b:
        return True
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or a.stride() != b.stride():
        return False
    view = _BIT_VIEW.get(a.dtype)
    if view is not None:
        return torch.equal(a.view(view), b.view(view))  # same item size: a view of any strides
    if a.is_floating_point() or a.is_complex():
        return False  # no integer view to compare bits through (float8, complex): assume it changed
    return torch.equal(a, b)


_BIT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


class _Graph:
    """The main graph's nodes with their kernels and the names each kernel reads (outer-scope values of a
    body included), its consumers, and how many nodes depend on each node: what a swap recomputes."""

    def __init__(self, ev: TorchEvaluator) -> None:
        nodes = ev.nodes
        self.nodes = nodes
        self.kernels: list[Any] = []
        self.inputs: list[tuple[str, ...]] = []
        # iter_kernels() lists a node before its body's nodes: the main graph's are `ev.nodes`, the same objects
        at = 0
        for node, k, ins in ev.iter_kernels():
            if at < len(nodes) and node is nodes[at]:
                self.kernels.append(k)
                self.inputs.append(ins)
                at += 1
        assert at == len(nodes), "every main-graph node has a kernel"
        self.consumers: dict[str, list[int]] = {}
        for i, ins in enumerate(self.inputs):
            for x in dict.fromkeys(ins):
                if x:
                    self.consumers.setdefault(x, []).append(i)
        self.subgraph = [_has_graph(n) for n in nodes]

    def descendants(self) -> list[int]:
        """How many nodes depend on each node (a bitset per node, from the last node up)."""
        below = [0] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            bits = 0
            for o in self.nodes[i].output:
                for j in self.consumers.get(o, ()):
                    bits |= below[j] | (1 << j)
            below[i] = bits
        return [b.bit_count() for b in below]


def _has_graph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _has_onnx_type(t: torch.Tensor) -> bool:
    try:
        dtype_of(t.dtype).onnx  # noqa: B018 (raises for a dtype ONNX has no name for)
    except ValueError:
        return False
    return True


def _local_outputs(m: onnx.ModelProto, graph: _Graph, values: Mapping[str, Any], provider: str, opsets: Mapping[str, int]) -> dict[int, tuple[Any, ...]]:
    """Every node's outputs computed by onnxruntime from the torch run's inputs, in one session: a model
    holding a copy of each node, its inputs renamed to fresh graph inputs fed with the torch run's values.
    Nodes carrying graphs (their bodies read outer-scope values) and nodes reading anything but tensors
    are left out. Falls back to one session per node when onnxruntime refuses the combined model."""
    picked: list[int] = []
    for i, node in enumerate(graph.nodes):
        if graph.subgraph[i]:
            continue
        ins = [values.get(x) for x in node.input if x]
        if all(isinstance(t, torch.Tensor) and _has_onnx_type(t) for t in ins):
            picked.append(i)
    if not picked:
        return {}
    nodes, graph_inputs, graph_outputs, feeds = [], [], [], {}
    for i in picked:
        node = graph.nodes[i]
        in_names = []
        for j, x in enumerate(node.input):
            if not x:
                in_names.append("")
                continue
            name = f"n{i}:i{j}"
            t = values[x]
            graph_inputs.append(oh.make_tensor_value_info(name, dtype_of(t.dtype).onnx, [f"n{i}:d{j}_{a}" for a in range(t.dim())]))
            feeds[name] = t
            in_names.append(name)
        out_names = [f"n{i}:o{j}" if o else "" for j, o in enumerate(node.output)]
        graph_outputs += [oh.make_empty_tensor_value_info(o) for o in out_names if o]
        copy = oh.make_node(node.op_type, in_names, out_names, domain=node.domain, name=node.name or f"{node.op_type}_{i}")
        copy.attribute.extend(node.attribute)
        nodes.append(copy)
    combined = oh.make_model(oh.make_graph(nodes, "blame_local", graph_inputs, graph_outputs), opset_imports=list(m.opset_import), ir_version=max(m.ir_version, 9))
    combined.functions.extend(m.functions)
    try:
        runner = OrtRunner(combined, provider=provider)
        names = runner.output_names
        got = dict(zip(names, runner.run(names, feeds), strict=True))
    except Exception:  # one node onnxruntime refuses in this form: ask node by node, as before
        return _local_outputs_one_by_one(graph, picked, values, opsets)
    return {i: tuple(got.get(f"n{i}:o{j}") if o else None for j, o in enumerate(graph.nodes[i].output)) for i in picked}


def _local_outputs_one_by_one(graph: _Graph, picked: Sequence[int], values: Mapping[str, Any], opsets: Mapping[str, int]) -> dict[int, tuple[Any, ...]]:
    out: dict[int, tuple[Any, ...]] = {}
    for i in picked:
        node, k = graph.nodes[i], graph.kernels[i]
        ort = OrtKernel(node, k.ctx, opsets)
        res = ort.run(*[values[x] if x else None for x in node.input])
        out[i] = tuple(r if o else None for r, o in zip(res, node.output, strict=False))
    return out


def _local_error(node: onnx.NodeProto, values: Mapping[str, Any], local: tuple[Any, ...] | None) -> tuple[float, float]:
    """The node's own error: its output in the torch run against onnxruntime's from the same inputs. A
    node carrying graphs (If, Loop, Scan, ...) has none of its own: its body's nodes make its error, and a
    one-node onnxruntime model could not see the outer-scope values its body reads."""
    if local is None:
        return 0.0, 0.0
    worst_abs = worst_ulp = 0.0
    for name, y in zip(node.output, local, strict=False):
        x = values.get(name) if name else None
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
            continue
        r = compare(x, y)
        worst_abs = max(worst_abs, r.max_abs)
        worst_ulp = max(worst_ulp, r.max_ulp)
    return worst_abs, worst_ulp


class _Swapper:
    """Runs the torch evaluator with some nodes on onnxruntime, reusing the torch run's values: only the
    nodes downstream of a value that changed (bit for bit) run again. A swapped node whose inputs did not
    change takes onnxruntime's output from the one-session local run."""

    def __init__(self, graph: _Graph, values: Mapping[str, Any], local: Mapping[int, tuple[Any, ...]], outputs: Sequence[str], opsets: Mapping[str, int]) -> None:
        self.graph, self.values, self.local, self.outputs, self.opsets = graph, values, local, list(outputs), dict(opsets)
        self._ort: dict[bytes, OrtKernel] = {}  # one onnxruntime kernel per (op, attributes, outputs) shape of node
        #: nodes run (torch or onnxruntime) by all swaps so far
        self.executed = 0

    def ort_kernel(self, i: int) -> OrtKernel:
        node = self.graph.nodes[i]
        key = onnx.NodeProto(op_type=node.op_type, domain=node.domain, attribute=node.attribute, input=["x" if x else "" for x in node.input], output=["y" if o else "" for o in node.output]).SerializeToString()
        k = self._ort.get(key)
        if k is None:
            k = self._ort[key] = OrtKernel(node, self.graph.kernels[i].ctx, self.opsets)
        return k

    def run(self, swapped: Collection[int]) -> list[Any]:
        """The graph's outputs with `swapped` on onnxruntime (each must have a local output)."""
        g, base = self.graph, self.values
        changed: dict[str, Any] = {}
        heap = sorted(swapped)
        heapq.heapify(heap)
        queued = set(heap)
        while heap:
            i = heapq.heappop(heap)
            ins = g.inputs[i]
            dirty = any(x in changed for x in ins if x)
            if i in swapped:
                if dirty:
                    res = self.ort_kernel(i).run(*[changed.get(x, base.get(x)) if x else None for x in g.nodes[i].input])
                    self.executed += 1
                else:
                    res = self.local[i]
            else:
                res = g.kernels[i].run(*[changed.get(x, base.get(x)) if x else None for x in ins])
                self.executed += 1
            for o, y in zip(g.nodes[i].output, res, strict=False):
                if o and not _same_bits(y, base.get(o)):
                    changed[o] = y
                    for j in g.consumers.get(o, ()):
                        if j not in queued:
                            queued.add(j)
                            heapq.heappush(heap, j)
        return [changed.get(o, base.get(o)) for o in self.outputs]


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
    budget: float | None = 20.0,
) -> BlameTable:
    """Swap every node to onnxruntime in turn and measure how much of the torch/onnxruntime gap it explains.

    `kernels` applies overrides to the torch side (to test your own kernel); `missing="ort"` runs every op
    without a torch kernel on onnxruntime (it explains nothing then); `tolerance` decides which node output
    is the first to drift (default: any difference).

    Linear in the graph, not quadratic: one torch run keeping every value, one onnxruntime session giving
    every node's output from the torch run's inputs (its local error), and per swap only the nodes
    downstream of a value that changed run again. A node whose onnxruntime output is bit-identical to
    torch's changes nothing when swapped: its row is known without running it (`BlameRow.skipped`).

    `budget`: how much recomputation the single-node swaps may cost, in runs of the graph (nodes run again,
    all swaps together, over the graph's node count). When swapping every node would cost more (a large
    graph with many nodes whose result differs), each node's share of the gap is first estimated to first
    order (one backward pass through the torch run), and the swaps run exactly in the order of that
    estimate until the budget is spent (the 3 first always); the other rows keep the estimate
    (`BlameRow.exact` False). None: every swap runs exactly.
    """
    m = load_model(model)
    provider = parse_provider(provider)
    device = torch_device(provider)
    kernels = dict(kernels or {})
    extra: dict[str, Any] = {"missing": missing} if missing != "error" else {}  # the evaluator's default
    clock = _Clock()
    base = TorchEvaluator(m, device=device, kernels=kernels, **extra)
    clock.lap("torch evaluator built")
    outputs = list(base.output_names)
    declared = [base.output_dtypes.get(o) for o in outputs]
    label = dtype_of(dtype).short if dtype is not None else _first_float_dtype(declared)

    ort_all = ort_intermediates(m, feeds, provider)
    clock.lap("onnxruntime run (every value)")
    ort_out = [ort_all[o] for o in outputs]
    torch_all = base.run(None, feeds, intermediates=True)
    clock.lap("torch run (every value)")
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
        clock.lap("float64 oracle")

    def measured(sub: list[Any]) -> tuple[float, float, float, float | None, float | None]:
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

    def substituted(keys: list[str]) -> tuple[float, float, float, float | None, float | None]:
        # the whole graph again: only for swaps of control flow and of nodes reading sequences
        ev = TorchEvaluator(named, device=device, kernels={**kernels, **dict.fromkeys(keys, "ort")}, check_model=False, **extra)
        return measured(ev.run(None, feeds))

    graph = _Graph(base)
    clock.lap("graph")
    local = _local_outputs(named, graph, torch_all, provider, base.opsets)
    swapper = _Swapper(graph, torch_all, local, outputs, base.opsets)
    clock.lap("onnxruntime local outputs (one session)")
    unchanged = measured(torch_out)  # a swap that changes nothing: the torch run itself

    no_ops: dict[int, bool] = {}

    def no_op(i: int) -> bool:
        if i not in no_ops:
            got = local.get(i)
            no_ops[i] = got is not None and all(not o or _same_bits(y, torch_all.get(o)) for o, y in zip(graph.nodes[i].output, got, strict=False))
        return no_ops[i]

    def swap(indices: list[int]) -> tuple[float, float, float, float | None, float | None]:
        if any(i not in local for i in indices):
            return substituted([named.graph.node[i].name for i in indices])
        return measured(swapper.run(set(indices)))

    drift_tol = tolerance
    first_divergence = None
    rows: list[BlameRow] = []
    scopes = [node_scope(n) for n in named.graph.node]
    candidates = [i for i in range(len(graph.nodes)) if not no_op(i)]
    estimates: dict[int, float] = {}
    run_exactly = set(candidates)
    if budget is not None and candidates and gap_mean > 0:
        reach = graph.descendants()
        cost = sum(reach[i] + 1 for i in candidates)
        allowed = budget * len(graph.nodes)
        if cost > allowed:
            estimates = _first_order(graph, torch_all, local, candidates, outputs, ort_out, gap_mean)
            clock.lap("first-order estimate")
            run_exactly, spent = set(), 0
            for rank, i in enumerate(sorted(candidates, key=lambda i: -estimates.get(i, 0.0))):
                if rank >= 3 and spent + reach[i] + 1 > allowed:
                    continue
                run_exactly.add(i)
                spent += reach[i] + 1
    # a large graph takes seconds: a bar on a terminal (silent in CI, under -q and in xdist workers)
    with progress.bar(len(named.graph.node), "ortdiff blame", unit="node", min_total=progress.BLAME_MIN_NODES) as shown:
        for i, node in enumerate(named.graph.node):
            key = node.name
            skipped = no_op(i)
            exact = skipped or i in run_exactly
            if skipped:
                explained, vs_ort, vs_torch, o_abs, o_ulp = unchanged
            elif exact:
                explained, vs_ort, vs_torch, o_abs, o_ulp = swap([i])
            else:
                explained, vs_ort, vs_torch, o_abs, o_ulp = estimates.get(i, 0.0), None, None, None, None
            local_abs, local_ulp = (0.0, 0.0) if skipped else _local_error(node, torch_all, local.get(i))
            d = _drift(node, torch_all, ort_all, drift_tol)
            drift = d.max_abs if d is not None else None
            if d is not None and not d.is_exact and first_divergence is None and (bool(drift_tol.check(d)) if drift_tol is not None else not d.is_exact):
                first_divergence = f"{key} ({node.op_type}): max abs {g(d.max_abs)}, {d.mismatches:,}/{d.n:,} elements differ"
            rows.append(BlameRow(key, node.op_type, explained, vs_ort, vs_torch, local_abs, local_ulp, drift, o_abs, o_ulp, skipped=skipped, scope=scopes[i], exact=exact))
            shown.update()

    clock.lap("node swaps")
    op_rows: list[BlameRow] = []
    for op in dict.fromkeys(n.op_type for n in named.graph.node):
        members = [r for r in rows if r.op_type == op]
        if len(members) == 1:
            op_rows.append(replace(members[0], node=op, scope=""))
            continue
        indices = [i for i, n in enumerate(named.graph.node) if n.op_type == op]
        # every member bit-identical on onnxruntime: swapping them all changes nothing either (each one's
        # inputs stay the torch run's, by induction along the graph)
        skipped = all(no_op(i) for i in indices)
        explained, vs_ort, vs_torch, o_abs, o_ulp = unchanged if skipped else swap(indices)
        local_abs = max(r.local_max_abs for r in members)
        local_ulp = max(r.local_max_ulp for r in members)
        drifts = [r.drift_max_abs for r in members if r.drift_max_abs is not None]
        op_rows.append(BlameRow(op, op, explained, vs_ort, vs_torch, local_abs, local_ulp, max(drifts) if drifts else None, o_abs, o_ulp, skipped=skipped))

    rows.sort(key=lambda r: (-r.explained, -r.local_max_ulp))  # stable: graph order among equals
    op_rows.sort(key=lambda r: -r.explained)
    clock.lap("op-type swaps")
    notes = ort_graph_notes(named, provider) if not gap.is_exact else []
    clock.lap("onnxruntime graph notes")
    return BlameTable(rows=rows, provider=provider, dtype=label, gap=gap, oracle=table_oracle, op_rows=op_rows, first_divergence=first_divergence, notes=notes, nodes_recomputed=swapper.executed, timings=clock.laps)


def _first_order(
    graph: _Graph,
    values: Mapping[str, Any],
    local: Mapping[int, tuple[Any, ...]],
    candidates: Sequence[int],
    outputs: Sequence[str],
    ort_out: Sequence[Any],
    gap_mean: float,
) -> dict[int, float]:
    """Each candidate's share of the gap to first order: the torch run again under autograd, each candidate's
    floating outputs shifted by `s_i * (onnxruntime's - torch's)` with a scalar `s_i = 0`; the gradient of
    mean|outputs - onnxruntime's| with respect to `s_i` is the change its swap makes, to first order. A
    kernel that cannot run under autograd runs detached (no gradient flows through it). {} when the
    graph's outputs carry no gradient at all."""
    shifts: dict[int, torch.Tensor] = {}
    vals: dict[str, Any] = {}
    chosen = set(candidates)
    with torch.enable_grad():
        for i, node in enumerate(graph.nodes):
            ins = [vals.get(x, values.get(x)) if x else None for x in graph.inputs[i]]
            if any(isinstance(x, torch.Tensor) and x.requires_grad for x in ins):
                try:
                    res = graph.kernels[i].run(*ins)
                except Exception:  # not differentiable as written (numpy, in-place): no gradient through it
                    res = tuple(values.get(o) for o in node.output)
            else:
                res = tuple(values.get(o) for o in node.output)
            got = local.get(i) if i in chosen else None
            for j, (o, y) in enumerate(zip(node.output, res, strict=False)):
                if not o or not isinstance(y, torch.Tensor):
                    continue
                theirs = got[j] if got is not None and j < len(got) else None
                if isinstance(theirs, torch.Tensor) and y.is_floating_point() and theirs.shape == y.shape and theirs.dtype == y.dtype:
                    s = shifts.setdefault(i, torch.zeros((), dtype=torch.float64, device=y.device, requires_grad=True))
                    delta = torch.nan_to_num((theirs.detach() - values[o]).to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
                    y = (y.to(torch.float64) + s * delta).to(y.dtype)
                vals[o] = y
        outs = [vals.get(o, values.get(o)) for o in outputs]
        terms = [
            (a.to(torch.float64) - b.to(a.device, torch.float64)).abs().nan_to_num(0.0, 0.0, 0.0).sum()
            for a, b in zip(outs, ort_out, strict=True)
            if isinstance(a, torch.Tensor) and a.requires_grad and isinstance(b, torch.Tensor) and a.is_floating_point()
        ]
        if not terms or not shifts:
            return {}
        n = sum(int(b.numel()) for b in ort_out if isinstance(b, torch.Tensor))
        loss = torch.stack(terms).sum() / max(n, 1)
        order = list(shifts)
        grads = torch.autograd.grad(loss, [shifts[i] for i in order], allow_unused=True)
    return {i: max(0.0, min(1.0, -float(gr) / gap_mean)) if gr is not None else 0.0 for i, gr in zip(order, grads, strict=True)}


class _Clock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        self.laps[what] = now - self._t
        self._t = now


def _drift(node: onnx.NodeProto, torch_all: Mapping[str, Any], ort_all: Mapping[str, Any], tol: Tolerance | None) -> DiffReport | None:
    """The node's first output in the torch run against the onnxruntime run (accumulated error), or None
    when they cannot be compared."""
    out0 = node.output[0] if node.output else ""
    x, y = torch_all.get(out0), ort_all.get(out0)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
        return None
    if torch.equal(x, y):  # most nodes: no report to build
        return DiffReport(n=x.numel())
    return compare(x, y, tolerance=tol.allclose if tol is not None else None)


def node_scope(node: onnx.NodeProto) -> str:
    """The module a node comes from, from the exporter's metadata: dynamo exports' `pkg.torch.onnx.name_scopes`
    (`['', 'layers.1', 'layers.1.self_attn', 'matmul']`: the last module) or `namespace`
    (`: M/layers.1: L/layers.1.self_attn: A/matmul: aten.matmul`); TorchScript exports' node names
    (`/layers.1/self_attn/MatMul`). "" when the node says nothing (a hand-built graph)."""
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            parts = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            parts = None
        if isinstance(parts, list) and len(parts) >= 2:
            modules = [str(p) for p in parts[:-1] if p]  # the last one is the op itself
            return modules[-1] if modules else ""
    namespace = meta.get("namespace")
    if namespace:
        parts = [p.split(":", 1)[0].strip() for p in namespace.split("/")][:-1]
        parts = [p for p in parts if p]
        return parts[-1] if parts else ""
    if node.name.startswith("/") and node.name.count("/") >= 2:
        return ".".join(p for p in node.name.split("/")[1:-1] if p)
    return ""


def _oracle(m: onnx.ModelProto, device: Any, kernels: Mapping[Any, Any], extra: Mapping[str, Any]) -> TorchEvaluator:
    """The float64 evaluator. The user's kernels under test stay out of it; only the overrides that
    name a runtime ("ort" for an op without a torch kernel, ...) go in, and a callable only where the
    oracle cannot be built without it (an op no runtime here has)."""
    named = {k: v for k, v in kernels.items() if isinstance(v, str)}
    try:
        return TorchEvaluator(m, device=device, compute_dtype=torch.float64, kernels=named, **extra)
    except MissingKernelError:
        return TorchEvaluator(m, device=device, compute_dtype=torch.float64, kernels=kernels, **extra)


def _first_float_dtype(dtypes: Sequence[torch.dtype | None]) -> str:
    for dt in dtypes:
        if dt is not None and dt.is_floating_point:
            return dtype_of(dt).short
    return "float32"
