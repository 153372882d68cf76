"""blame(): which node explains the gap between the torch evaluator and onnxruntime, and who is right.

Every node is swapped to onnxruntime one at a time inside the torch evaluator, recomputing only what the
swap changes; its local error (same inputs, both kernels) and every run's error against the float64
oracle are measured too, and the blame is summed per module scope of the exporter's metadata.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import operator
import os
import textwrap
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from .. import progress
from ..numerics import (
    diff as _diff,  # (its chunking constants: blame's statistics sum in compare's order)
)
from ..numerics.diff import DiffReport, compare
from ..numerics.dtypes import DType, dtype_of
from ..numerics.formatting import g, table
from ..numerics.results import closer_to_oracle
from ..numerics.tolerance import Tolerance
from ..runtimes.evaluator import MissingKernelError, TorchEvaluator
from ..runtimes.model_io import (
    EXTERNAL_DATA_FOLDER,
    CheckedModel,
    check_model,
    exposed_for_ort,
    has_subgraph,
    in_topological_order,
    load_model,
    model_path,
    serialized,
    too_large,
)
from ..runtimes.ort import OrtRunner
from ..runtimes.ort_kernel import CONSTANT_SENSITIVE, OrtKernel
from ..runtimes.providers import (
    KNOWN,
    TF32_OPS,
    options_in_force,
    parse_provider,
    tf32_in_play,
    tf32_line,
    torch_device,
)
from ..runtimes.tf32 import ieee_float32

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
    #: onnxruntime ran this node's float32 math with TF32 allowed (CUDA, use_tf32=1, a GEMM or convolution)
    tf32: bool = False

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
    #: the ULP error at the output's scale (what `closer_to_oracle` decides on); None in tables read back from JSON
    max_ulp_floored: float | None = None


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
        """One row per op type, every node of that type swapped at once (the op-type table: which op type, run by onnxruntime, explains the gap)."""
        return self.op_rows

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """The table as JSON data; `top`: only the first `top` node rows, op-type rows and module scopes (what
        a report keeps of a large graph's table; `nodes` and `estimated` still count every row)."""
        cut = slice(None) if top is None else slice(top)
        return {
            "provider": self.provider,
            "dtype": self.dtype,
            "gap": self.gap.to_dict(),
            "nodes": len(self.rows),
            "estimated": sum(not r.exact for r in self.rows),
            "rows": [r.to_dict() for r in self.rows[cut]],
            "by_op_type": [r.to_dict() for r in self.op_rows[cut]],
            "oracle": {k: dict(v.__dict__) for k, v in self.oracle.items()},
            "first_divergence": self.first_divergence,
            "culprit": self.culprit.node if self.culprit else None,
            "closer_to_oracle": self.closer_to_oracle,
            "notes": list(self.notes),
            "by_scope": [s.to_dict() for s in self.by_scope()[cut]],
            "nodes_recomputed": self.nodes_recomputed,
        }

    def render(self, top: int | None = None) -> str:
        """The table: the `top` nodes most to blame (default `TOP`; every node when the graph is that small),
        then "... N more nodes", the summary per module scope, the oracle's verdict."""
        gap = self.gap
        lines = [f"blame: torch evaluator vs onnxruntime {self.provider} {self.dtype}: gap max abs {g(gap.max_abs)}, {gap.mismatches:,}/{gap.n:,} elements differ"]
        if gap.n == 0:
            lines.append("  compared 0 elements (every output is empty on these feeds): nothing to blame; feed inputs whose outputs have elements")
        elif gap.is_exact:
            lines.append("  no discrepancy: nothing to blame")
        top = self.TOP if top is None else top
        shown = self.rows if len(self.rows) <= top + 1 else self.rows[:top]
        head = ("node", "op", "explained", "vs ort", "vs torch", "local abs", "local ulp", "drift abs", "vs f64 abs", "vs f64 ulp")
        body = [
            (r.node, f"{r.op_type} (TF32)" if r.tf32 else r.op_type, f"{r.explained * 100:.0f} %" if r.exact else f"~{r.explained * 100:.0f} %", g(r.vs_ort), g(r.vs_torch), g(r.local_max_abs), g(r.local_max_ulp), g(r.drift_max_abs), g(r.oracle_max_abs), g(r.oracle_max_ulp))
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
        shown_scopes = [s for s in scopes if s.explained > 0][:10]
        if scopes and not gap.is_exact and not shown_scopes:
            lines.append(f"by module scope: none of the {len(scopes)} scope{'' if len(scopes) == 1 else 's'} explains any of the gap (no node's swap alone closes a share of it)")
        elif scopes and not gap.is_exact:
            lines.append("by module scope (its nodes' explained summed, the scopes inside it included):")
            for s in shown_scopes:
                lines.append(f"  {s.scope}: {s.explained * 100:.0f} % of the gap ({s.nodes} node{'' if s.nodes == 1 else 's'}; most: {s.top_node} {s.top_explained * 100:.0f} %)")
            if len(scopes) > len(shown_scopes):
                lines.append(f"  ... {len(scopes) - len(shown_scopes)} more scopes, {sum(s.explained == 0 for s in scopes)} of them explaining 0 %")
        if self.oracle:
            lines.append("against the float64 oracle (in the tested dtype; ULPs at the output's scale):")
            for rt in self.oracle.values():
                ulp = rt.max_ulp if rt.max_ulp_floored is None else rt.max_ulp_floored  # (at the output's scale: what decides "closer")
                lines.append(f"  {rt.name:<12} max abs {g(rt.max_abs):<10} max ulp {g(ulp):<6} {rt.mismatches:,}/{rt.n:,} elements off")
            closer = self.closer_to_oracle
            if closer:
                lines.append(f"  closer to the oracle: {closer}")
        if self.first_divergence:
            lines.append(f"first node whose output drifts beyond the tolerance: {self.first_divergence}")
        if self.culprit:
            lines.append(f"most to blame: {self.culprit.node} ({self.culprit.op_type}), explains {self.culprit.explained * 100:.0f} % of the gap")
        elif not gap.is_exact:
            lines.append(f"no single node explains {self.CULPRIT_MIN * 100:.0f} % of the gap: the difference comes from how onnxruntime runs the graph as a whole")
        for n in self.notes:  # (wrapped: a note is a sentence, not a line of the table)
            lines += textwrap.wrap(f"note: {n}", 110, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        return "\n".join(lines)

    def render_by_op_type(self) -> str:
        """The op-type table: each op type run by onnxruntime inside torch, diff against torch and against ort."""
        head = ("swapped to ort", "diff vs ort", "diff vs torch", "explained")
        body = [(r.op_type, g(r.vs_ort), g(r.vs_torch), f"{r.explained * 100:.0f} %" if r.exact else f"~{r.explained * 100:.0f} %") for r in self.op_rows]
        lines = [f"{self.provider} {self.dtype}", *_table(head, body)]
        estimated = sum(not r.exact for r in self.op_rows)
        if estimated:
            lines.append(f"  ~: {estimated} of {len(self.op_rows)} op types are first-order estimates (their nodes' estimates summed; outside blame's budget)")
        return "\n".join(lines)


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return table(head, body, indent="  ")


# ------------------------------------------------------------------------------------------------


def ort_intermediates(model: Any, feeds: Mapping[str, Any], provider: str = "CPU") -> dict[str, torch.Tensor]:
    """Every node output as computed by onnxruntime (each exposed as a graph output). A model above 2 GB
    is given by its path (its weights stay in their files)."""
    m = load_model(model)
    path = model_path(model)
    data = serialized(m, path)
    if data is None and path is None:
        raise too_large("the model", m)
    return _ort_values(*exposed_for_ort(m, data, path), feeds, provider)


def _ort_values(exposed: bytes, config: Mapping[str, str], feeds: Mapping[str, Any], provider: str) -> dict[str, torch.Tensor]:
    # a session for one run: not kept, and without onnxruntime's memory arena (an arena grown for one run
    # costs more than it saves: session and run ~2/3 of the time at hidden 256)
    runner = OrtRunner(exposed, provider=provider, session_options={**_ONE_RUN, **config}, cache=False)
    names = runner.output_names
    return dict(zip(names, runner.run(names, feeds), strict=True))


def _checked_ort_values(checked: Callable[[], CheckedModel], feeds: Mapping[str, Any], provider: str) -> dict[str, torch.Tensor]:
    """`ort_intermediates` from the checked model's serialized bytes (the model is not serialized again;
    one above 2 GB is read from its file without its weights, which onnxruntime reads from their files)."""
    c = checked()
    return _ort_values(*exposed_for_ort(c.proto, c.data or None, c.path), feeds, provider)


#: onnxruntime's session options for a session blame runs once (the CPU allocator's arena off)
_ONE_RUN: dict[str, Any] = {"enable_cpu_mem_arena": False}


def ort_graph_notes(model: Any, provider: str = "CPU") -> list[str]:
    """What onnxruntime changes in the graph on `provider` that shifts precision: the nodes it runs in
    another dtype through inserted Casts (its CPU provider lacks float16 kernels for many ops)."""
    m = load_model(model)
    path = model_path(model)
    data = serialized(m, path)
    if data is None:  # above 2 GB: from its file, the weights read where they are
        if path is None:
            return []  # (notes are a bonus: no error for them)
        m = onnx.load_model(str(path), load_external_data=False)
        data, config = m.SerializeToString(), {EXTERNAL_DATA_FOLDER: str(path.resolve().parent)}
    else:
        config = {}
    return _graph_notes(m, data, config, provider)


def _named_notes(named: Callable[[], onnx.ModelProto], large_file: str | None, keys: Sequence[str], provider: str) -> list[str]:
    """`ort_graph_notes` of the model with its nodes named by their keys: `named()`'s copy, or for a model
    above 2 GB its file without the weights, renamed, onnxruntime reading the weights from their files."""
    if large_file is None:
        copy = named()
        return _graph_notes(copy, copy.SerializeToString(), {}, provider)
    skeleton = onnx.load_model(large_file, load_external_data=False)
    for node, key in zip(skeleton.graph.node, keys, strict=True):
        node.name = key
    return _graph_notes(skeleton, skeleton.SerializeToString(), {EXTERNAL_DATA_FOLDER: os.path.dirname(large_file)}, provider)


def _done(value: Any) -> Future[Any]:
    """A future holding `value` already."""
    f: Future[Any] = Future()
    f.set_result(value)
    return f


def _graph_notes(m: onnx.ModelProto, data: bytes, config: Mapping[str, str], provider: str) -> list[str]:
    import tempfile

    import onnxruntime

    ep = KNOWN[parse_provider(provider)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "optimized.onnx")
            so = onnxruntime.SessionOptions()
            so.optimized_model_filepath = path
            # no optimizations: only the transformations onnxruntime always applies (Cast insertion)
            so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            for key, value in config.items():
                so.add_session_config_entry(key, value)
            if config:  # (the optimized copy's weights go to a file of its own in `tmp`, not into the model's)
                so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
            onnxruntime.InferenceSession(data, so, providers=[ep])
            if not os.path.exists(path):
                return []
            optimized = onnx.load(path, load_external_data=False)  # (its graph is all that is read)
    except Exception:  # session errors (the caller's own run reports them), a full or unwritable temporary
        return []  # directory, a half-written copy: notes are a bonus, never worth the blame table
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
    more = f" and {len(promoted) - _NOTE_NODES:,} more" if len(promoted) > _NOTE_NODES else ""  # (a large graph's list was one endless line)
    return [
        f"onnxruntime {ep} inserted {len(inserted)} Cast node(s) and runs {', '.join(promoted[:_NOTE_NODES])}{more}: "
        "values between those nodes are not rounded to the model's dtype, which no single-node swap reproduces"
    ]


#: nodes a note names before "and N more"
_NOTE_NODES = 5


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


class _Errors(NamedTuple):
    """The few numbers of a comparison that blame's rows show, exactly as `compare()` reports them."""

    max_abs: float
    max_ulp: float
    mean_abs: float
    n: int
    #: NaN/Inf mismatches (what besides max_abs makes a report not exact)
    mismatched: bool

    @property
    def is_exact(self) -> bool:
        return self.max_abs == 0 and not self.mismatched


_NO_ERROR = _Errors(0.0, 0.0, 0.0, 0, False)


def _errors(expected: Any, got: Any, *, ulp: bool = True, mean: bool = True) -> _Errors:
    """`compare(expected, got)`'s max_abs, max_ulp and mean_abs (and whether NaN/Inf mismatch), without
    the histogram, the floored and relative errors and the report: blame asks for these thousands of
    times on small tensors, where compare's fixed cost (~0.5 ms) is most of the swap. A tensor or a list
    of tensors, as compare takes them; anything else (nested values, integers, another device) goes to
    compare itself. The same numbers bit for bit: the same |e - g| in the same work dtype, the same
    summation order (tests/test_blame.py holds the two to it on NaN/Inf/zero-crossing inputs).
    `ulp=False`, `mean=False`: that number is not needed (NaN in the result) and not computed."""
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple) and len(expected) == len(got):
        leaves = [_leaf_errors(e, g, ulp, mean) for e, g in zip(expected, got, strict=True)]
        if all(leaf is not None for leaf in leaves):
            return _aggregate_errors(leaves)  # type: ignore[arg-type]
    elif isinstance(expected, torch.Tensor):
        leaf = _leaf_errors(expected, got, ulp, mean)
        if leaf is not None:
            return leaf
    r = compare(expected, got)
    return _Errors(r.max_abs, r.max_ulp, r.mean_abs, r.n, bool(r.nan_mismatch or r.inf_mismatch))


def _aggregate_errors(leaves: Sequence[_Errors]) -> _Errors:
    """As compare's aggregate of a list: maxima over the outputs, the mean weighted by their sizes."""
    n = sum(r.n for r in leaves)
    if not leaves:
        return _NO_ERROR
    return _Errors(
        max(r.max_abs for r in leaves),
        max(r.max_ulp for r in leaves),
        sum(r.mean_abs * r.n for r in leaves) / n if n else 0.0,
        n,
        any(r.mismatched for r in leaves),
    )


def _leaf_errors(e: Any, g: Any, ulp: bool = True, mean: bool = True) -> _Errors | None:
    """One pair of CPU floating tensors of one shape and dtype (None for anything else: compare's)."""
    if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
        return None
    bits = _BIT_VIEW.get(e.dtype)
    if bits is None or e.dtype != g.dtype or e.shape != g.shape or e.device.type != "cpu" or g.device.type != "cpu":
        return None
    n = e.numel()
    if n == 0:
        return _NO_ERROR
    e, g = e.detach(), g.detach()
    if e.dtype in (torch.float16, torch.bfloat16):  # compare's work dtype: float32
        ew, gw = e.float(), g.float()
    else:
        ew, gw = e, g
    d = (ew - gw).abs_()  # (IEEE: the same |e - g| as compare's numpy)
    top = float(d.max())
    if math.isfinite(top):  # every pair finite (compare's fast chunks)
        max_ulp = 0.0 if ulp else math.nan  # (equal everywhere: 0 ULPs)
        if ulp and top:
            max_ulp = _max_ulp(e.reshape(-1).view(bits).numpy(), g.reshape(-1).view(bits).numpy())
        mean_abs = _sum_abs(d.reshape(-1).numpy(), None, e.dtype) / n if mean else math.nan
        return _Errors(top, max_ulp, mean_abs, n, False)
    # NaN/Inf somewhere (compare's exact chunks): a NaN or Inf on one side only is a mismatch, equal
    # NaNs and equal Infs count as equal; what is left is a difference (inf where one overflows)
    ef, gf = e.reshape(-1), g.reshape(-1)
    ewn, gwn, dn = ew.reshape(-1).numpy(), gw.reshape(-1).numpy(), d.reshape(-1).numpy()
    en, gn = np.isnan(ewn), np.isnan(gwn)
    ei, gi = np.isinf(ewn), np.isinf(gwn)
    same_inf = ei & gi & (ewn == gwn)
    mis = (en ^ gn) | ((ei | gi) & ~same_inf & ~(en | gn))
    d64 = np.where(mis | (en & gn) | same_inf, 0.0, dn.astype(np.float64))
    n_mis = int(np.count_nonzero(mis))
    max_abs = float(np.where(mis, -1.0, d64).max()) if n_mis < n else 0.0
    pos = d64 > 0
    max_ulp = _max_ulp(ef.view(bits).numpy()[pos], gf.view(bits).numpy()[pos]) if pos.any() else 0.0
    return _Errors(max(max_abs, 0.0), max_ulp, _sum_abs(dn, d64, e.dtype) / n, n, n_mis > 0)


def _max_ulp(eb: np.ndarray, gb: np.ndarray) -> float:
    """Max ULP distance of pairs of IEEE bit patterns (as signed integers): for a same-sign pair the
    difference of the patterns (it fits their type), for an opposite-sign pair the difference of the
    ordered patterns (a negative pattern b orders as -(b & magnitude)), exactly, rounded once to float64."""
    if not eb.size:
        return 0.0
    u = np.subtract(eb, gb)  # (wraps for opposite signs: those are redone below)
    opposite = np.bitwise_xor(eb, gb) < 0
    if not opposite.any():
        return float(np.abs(u).max())
    same = u[~opposite]
    top = float(np.abs(same).max()) if same.size else 0.0
    eo, go = eb[opposite], gb[opposite]
    if eb.dtype != np.int64:
        mag = np.iinfo(eb.dtype).max
        e64, g64 = eo.astype(np.int64), go.astype(np.int64)
        oe, og = np.where(e64 < 0, -(e64 & mag), e64), np.where(g64 < 0, -(g64 & mag), g64)
        return max(top, float(np.abs(oe - og).max()))
    mag64 = np.int64(0x7FFFFFFFFFFFFFFF)
    oe, og = np.where(eo < 0, -(eo & mag64), eo), np.where(go < 0, -(go & mag64), go)
    hi = (oe >> 11) - (og >> 11)  # |hi| < 2**53: exact as float64
    lo = (oe & 2047) - (og & 2047)
    return max(top, float(np.abs(hi * 2048.0 + lo).max()))


def _sum_abs(d: np.ndarray, masked64: np.ndarray | None, dtype: torch.dtype) -> float:
    """sum |e - g| in compare's order: its chunks and worker ranges (see diff._cpu_pass), a chunk of finite
    differences summed as diff._fast_chunk does (diff.lane_sum), one holding NaN/Inf as diff._exact_chunk does (in float64,
    mismatches and equal NaN/Inf as 0). `d`: the flat |e - g| in the work dtype; `masked64`: that, masked,
    in float64 (None when every difference is finite)."""
    with np.errstate(all="ignore"):  # (a float32 sum that overflows is redone in float64)
        return _chunked_sum(d, masked64, dtype)


def _chunked_sum(d: np.ndarray, masked64: np.ndarray | None, dtype: torch.dtype) -> float:
    n = d.size
    convert = dtype in (torch.float16, torch.bfloat16)  # (their chunks are whole pieces of the cast)
    if masked64 is None and n <= (_diff._SERIAL if convert else _diff._CHUNK):  # the usual case: one chunk
        return _diff.lane_sum(d)
    chunk = max(1, min(_diff._CHUNK, n))
    n_chunks = -(-n // chunk)
    workers = min(_diff._MAX_WORKERS, torch.get_num_threads(), n_chunks)
    bounds = [0, n] if workers <= 1 else [min(n, (i * n_chunks // workers) * chunk) for i in range(workers + 1)]
    total = 0.0
    for lo, hi in itertools.pairwise(bounds):
        part = 0.0
        step = max(1, min(chunk, hi - lo))
        if convert:
            piece = min(_diff._SERIAL, step)
            step = step // piece * piece
        for start in range(lo, hi, step):
            stop = min(hi, start + step)
            c = d[start:stop]
            if masked64 is None or math.isfinite(float(c.max())):
                part += _diff.lane_sum(c)
            else:
                part += float(masked64[start:stop].sum())
        total += part
    return total


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
        self.subgraph = [has_subgraph(n) for n in nodes]
        self.outputs = [tuple(n.output) for n in nodes]
        self.runs = [k.run for k in self.kernels]
        self.graph_outputs = tuple(ev.output_names)
        #: the model's constant values (OrtKernel holds those of MatMulNBits as onnxruntime does)
        self.constants = ev.constants

    def live(self) -> list[bool]:
        """Per node: whether the graph's outputs depend on it (a run computes only those)."""
        produced = {o: i for i, outs in enumerate(self.outputs) for o in outs if o}
        live = [False] * len(self.nodes)
        stack = [produced[o] for o in self.graph_outputs if o in produced]
        while stack:
            i = stack.pop()
            if live[i]:
                continue
            live[i] = True
            stack.extend(produced[x] for x in self.inputs[i] if x in produced)
        return live

    def descendants(self) -> list[int]:
        """How many nodes depend on each node."""
        return [b.bit_count() for b in self.reach()]

    def reach(self) -> list[int]:
        """Each node and the nodes that depend on it, as a bitset (bit j: node j), from the last node up:
        what swapping it may run again."""
        below = [0] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            bits = 1 << i
            for o in self.nodes[i].output:
                for j in self.consumers.get(o, ()):
                    bits |= below[j]
            below[i] = bits
        return below

    def costs(self, values: Mapping[str, Any]) -> np.ndarray:
        """Each node's share of a run's time, by a model of it (deterministic, unlike a clock): a fixed cost
        per node (the evaluator's dispatch, a few µs), plus one per element read or written, plus one per
        multiply-add of the ops that do many per element (MatMul, Gemm, Conv), in ns of a typical CPU core
        (3,000 + 0.15 per element + 0.02 per multiply-add)."""
        cost = np.empty(len(self.nodes), np.float64)
        for i, node in enumerate(self.nodes):
            elements = 0
            for x in (*self.inputs[i], *self.outputs[i]):
                t = values.get(x) if x else None
                if isinstance(t, torch.Tensor):
                    elements += t.numel()
            cost[i] = 3000.0 + 0.15 * elements + 0.02 * _multiply_adds(node, values)
        return cost


def _multiply_adds(node: onnx.NodeProto, values: Mapping[str, Any]) -> int:
    """Multiply-adds of a MatMul/Gemm (output elements x the reduced length) or a Conv (output elements x
    input channels per group x kernel size); 0 for the ops whose work is their elements'."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Conv", "ConvTranspose") or len(node.input) < 2:
        return 0
    a, w = values.get(node.input[0]), values.get(node.input[1])
    y = values.get(node.output[0]) if node.output else None
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (a, w, y)):
        return 0
    assert isinstance(a, torch.Tensor) and isinstance(w, torch.Tensor) and isinstance(y, torch.Tensor)
    if node.op_type == "MatMul":
        return y.numel() * a.shape[-1]
    if node.op_type == "Gemm":
        trans_a = next((a_.i for a_ in node.attribute if a_.name == "transA"), 0)
        return y.numel() * a.shape[0 if trans_a else -1]
    if node.op_type == "Conv":
        return y.numel() * (w.numel() // max(1, w.shape[0]))  # (C_in/group x kernel per output element)
    return a.numel() * (w.numel() // max(1, w.shape[0]))  # ConvTranspose: per input element


#: a node run again by a swap, against the same node in a run (`_Graph.costs`): its time scaled, plus a fixed
#: cost (the kernel's own run rather than the plan's direct call, the bit test of its outputs, the
#: bookkeeping): measured on the stacked Llama exports, 17 µs a node at hidden 64 (3.4 in a run), 170 µs at
#: hidden 256 (90 modelled)
_SWAP_SCALE = 1.5
_SWAP_NODE_NS = 12_000.0

#: swaps modelled (`_Graph.costs`) to take less than this in all always run exactly: 5 ms (a graph whose
#: whole blame takes milliseconds gets an exact table; a larger one's budget is in runs of it)
_EXACT_FLOOR_NS = 5e6


def _weight(bits: int, costs: np.ndarray) -> float:
    """The summed cost of the nodes in a bitset (bit j: node j)."""
    flags = np.unpackbits(np.frombuffer(bits.to_bytes((costs.size + 7) // 8, "little"), np.uint8), bitorder="little")[: costs.size]
    return float(costs @ flags)


_ONNX_TYPES: dict[torch.dtype, int | None] = {}


def _onnx_type(dt: torch.dtype) -> int | None:
    """torch dtype -> ONNX element type (None: a dtype ONNX has no name for), looked up once per dtype."""
    if dt not in _ONNX_TYPES:
        try:
            _ONNX_TYPES[dt] = dtype_of(dt).onnx
        except ValueError:
            _ONNX_TYPES[dt] = None
    return _ONNX_TYPES[dt]


def _local_outputs(
    m: onnx.ModelProto,
    graph: _Graph,
    values: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    provider: str,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto.Tensor] | None = None,
) -> dict[int, tuple[Any, ...]]:
    """Every node's outputs computed by onnxruntime from the torch run's inputs, in one session: a model
    holding a copy of each node, its inputs renamed to graph inputs fed with the torch run's values (one
    per value: nodes reading the same value share it).
    Nodes carrying graphs (their bodies read outer-scope values) and nodes reading anything but tensors
    are left out. Falls back to one session per node when onnxruntime refuses the combined model.

    `types` (each value's declared type, from shape inference): the session is built from them before
    the torch run's values are asked for (`values` may then be a callable that waits for them), so that
    onnxruntime creates it while torch runs. A node reading a value of no known type is asked on its own
    afterwards; a torch value of another type than its declared one makes the whole model again from the
    values' own types."""
    known: dict[str, int] | None = None
    if types is not None:
        known = {}
        for name, t in types.items():
            try:
                torch_dt = DType(t.elem_type).torch if t.elem_type else None
            except ValueError:
                torch_dt = None
            if torch_dt is not None and _onnx_type(torch_dt) == t.elem_type:
                known[name] = t.elem_type
        # the nodes the torch run computes (the graph's outputs need them): their inputs will have values
        live = graph.live()
        picked = [i for i, node in enumerate(graph.nodes) if live[i] and not graph.subgraph[i] and all(x in known for x in node.input if x)]
        vals: Mapping[str, Any] | None = None
    else:
        vals = values() if callable(values) else values
        picked = _readable(graph, vals)
    # Constant nodes (a third of a TorchScript export) need no session: their output is their tensor
    constants: dict[int, tuple[Any, ...]] = {}
    for i in picked:
        value = _constant_value(graph.nodes[i])
        if value is not None:  # (decoded on the host: on the torch run's device, as the value it stands for)
            constants[i] = (value.to(graph.kernels[i].ctx.device),)
    picked = [i for i in picked if i not in constants]
    session = _combined_session(m, graph, picked, provider, known, vals) if picked else None
    if vals is None:
        vals = values() if callable(values) else values
    got: dict[int, tuple[Any, ...]] = dict(constants)
    if picked:
        if session is None:  # onnxruntime refused the combined model: node by node, as before
            got.update(_local_outputs_one_by_one(graph, picked, vals, opsets))
        else:
            runner, fed = session
            feeds: dict[str, Any] = {name: vals.get(x) for x, name in fed.items()}
            if known is not None and any(not isinstance(t, torch.Tensor) or _onnx_type(t.dtype) != known[x] for x, t in ((x, feeds[n]) for x, n in fed.items())):
                return _local_outputs(m, graph, vals, provider, opsets)  # a value's type is not its declared one
            try:
                names = runner.output_names
                out = dict(zip(names, _run_own_feeds(runner, names, feeds), strict=True))
            except Exception:  # one node onnxruntime refuses in this form: ask node by node, as before
                got.update(_local_outputs_one_by_one(graph, picked, vals, opsets))
            else:
                got.update({i: tuple(out.get(f"n{i}:o{j}") if o else None for j, o in enumerate(graph.nodes[i].output)) for i in picked})
    if known is not None:  # nodes reading a value shape inference gave no type: on their own
        rest = [i for i in _readable(graph, vals) if i not in got]
        got.update(_local_outputs_one_by_one(graph, rest, vals, opsets))
    return got


class _Local(NamedTuple):
    """What the local outputs' thread hands blame: onnxruntime's output of each node from the torch run's
    inputs, and whether it is bit-identical to torch's (the swap is a no-op)."""

    outputs: dict[int, tuple[Any, ...]]
    no_op: list[bool]


def _local_job(
    m: onnx.ModelProto,
    graph: _Graph,
    values: Callable[[], Mapping[str, Any]],
    provider: str,
    opsets: Mapping[str, int],
    types: Mapping[str, onnx.TypeProto.Tensor] | None,
) -> _Local:
    """`_local_outputs`, then each node's no-op verdict, in the thread that made them. A no-op node's
    outputs are the torch run's own tensors afterwards (the same bits and layout, by the verdict): the
    copies onnxruntime made are let go."""
    local = _local_outputs(m, graph, values, provider, opsets, types)
    vals = values()
    no_op = []
    for i, node in enumerate(graph.nodes):
        got = local.get(i)
        same = got is not None and all(not o or _same_bits(y, vals.get(o)) for o, y in zip(node.output, got, strict=False))
        no_op.append(same)
        if same:
            local[i] = tuple(vals.get(o) if o else None for o in node.output)
    return _Local(local, no_op)


def _local_errors(graph: _Graph, values: Callable[[], Mapping[str, Any]], local: Callable[[], _Local]) -> dict[int, tuple[float, float]]:
    """Each node's own error (max abs, max ULP) where its swap is not a no-op (0 where it is)."""
    vals, got = values(), local()
    return {i: _local_error(node, vals, got.outputs.get(i)) for i, node in enumerate(graph.nodes) if not got.no_op[i]}


def _drifts(
    nodes: Sequence[onnx.NodeProto],
    keys: Sequence[str],
    values: Callable[[], Mapping[str, Any]],
    ort_values: Callable[[], dict[str, Any]],
    tolerance: Tolerance | None,
    keep: Collection[str],
) -> tuple[list[float | None], str | None]:
    """Each node's drift (its first output in the torch run against the onnxruntime run, max abs; None
    where they cannot be compared) and the first node whose drift `tolerance` rejects (any drift without
    one), described. Then the onnxruntime run's values but `keep` (the graph's outputs) are let go: nothing
    else reads them, and on a large graph they are as much memory as the torch run's."""
    torch_all, ort_all = values(), ort_values()
    drifts: list[float | None] = []
    first = None
    for key, node in zip(keys, nodes, strict=True):
        d = _drift(node, torch_all, ort_all)
        drifts.append(d.max_abs if d is not None else None)
        if d is not None and not d.is_exact and first is None:
            # the full report only here: the message's counts, and the tolerance's verdict
            x, y = torch_all[node.output[0]], ort_all[node.output[0]]
            full = compare(x, y, tolerance=tolerance.allclose if tolerance is not None else None)
            if bool(tolerance.check(full)) if tolerance is not None else True:
                first = f"{key} ({node.op_type}): max abs {g(full.max_abs)}, {full.mismatches:,}/{full.n:,} elements differ"
    for name in [n for n in ort_all if n not in keep]:
        del ort_all[name]
    return drifts, first


def _readable(graph: _Graph, values: Mapping[str, Any]) -> list[int]:
    """The nodes without a body whose every input is a tensor of a dtype ONNX names."""
    picked = []
    for i, node in enumerate(graph.nodes):
        if graph.subgraph[i]:
            continue
        ins = [values.get(x) for x in node.input if x]
        if all(isinstance(t, torch.Tensor) and _onnx_type(t.dtype) is not None for t in ins):
            picked.append(i)
    return picked


def _combined_session(
    m: onnx.ModelProto,
    graph: _Graph,
    picked: Sequence[int],
    provider: str,
    known: Mapping[str, int] | None,
    values: Mapping[str, Any] | None,
) -> tuple[OrtRunner, dict[str, str]] | None:
    """The one-session model of `_local_outputs` and its created session, with the graph input feeding
    each value; None when onnxruntime refuses it. Element types from `known`, else from `values`."""
    # built field by field (onnx.helper's constructors cost more than the session on a large graph); the
    # same model as make_model(make_graph(...)) with make_tensor_value_info/make_node/make_empty_tensor_value_info
    combined = onnx.ModelProto(ir_version=max(m.ir_version, 9))
    combined.opset_import.extend(m.opset_import)
    combined.functions.extend(m.functions)
    g = combined.graph
    g.name = "blame_local"
    fed: dict[str, str] = {}  # value -> the graph input holding it (one per value, whatever reads it)
    held: dict[str, str] = {}  # constant value -> the initializer holding it (see OrtKernel's CONSTANT_SENSITIVE)
    weights: dict[str, onnx.TensorProto] | None = None
    for i in picked:
        node = graph.nodes[i]
        in_names = []
        sensitive = (node.domain or "", node.op_type) in CONSTANT_SENSITIVE
        for x in node.input:
            if not x:
                in_names.append("")
                continue
            if sensitive and x in graph.constants:
                if weights is None:
                    weights = {t.name: t for t in m.graph.initializer}
                if x in weights:
                    if x not in held:
                        held[x] = f"c{len(held)}"
                        g.initializer.add().CopyFrom(weights[x])
                        g.initializer[-1].name = held[x]
                    in_names.append(held[x])
                    continue
            name = fed.get(x)
            if name is None:
                name = fed[x] = f"v{len(fed)}"
                vi = g.input.add()
                vi.name = name
                # the element type only, no shape (any rank): the values' shapes are not known yet, and
                # a kernel's arithmetic never depends on what the graph declares of them (OrtKernel's
                # one-node model declares ranks: onnxruntime's shape inference refuses a few nodes there,
                # e.g. a linear Resize given `sizes`, that it accepts here)
                vi.type.tensor_type.elem_type = known[x] if known is not None else _onnx_type(values[x].dtype)  # type: ignore[index]
            in_names.append(name)
        out_names = [f"n{i}:o{j}" if o else "" for j, o in enumerate(node.output)]
        for o in out_names:
            if o:
                g.output.add().name = o
        copy = g.node.add()
        copy.op_type = node.op_type
        copy.input.extend(in_names)
        copy.output.extend(out_names)
        copy.name = node.name or f"{node.op_type}_{i}"
        copy.domain = node.domain
        copy.attribute.extend(node.attribute)
    try:
        # no graph optimizations: no transformer of any level applies to nodes that share no edge and read
        # no initializer (every fusion needs an edge, every folding or elimination a constant input or a
        # node whose output is not a graph output), so each node runs as OrtKernel's one-node model runs
        # it (the tests hold the two to the same bits); the optimizers' passes over a graph of thousands
        # of nodes cost as much as the rest of the session
        runner = OrtRunner(combined, provider=provider, session_options={**_ONE_RUN, "graph_optimization_level": "disable"}, cache=False)
        runner.session  # noqa: B018  (created here, in the caller's thread, while torch runs)
    except Exception:
        return None
    return runner, fed


def _constant_value(node: onnx.NodeProto) -> torch.Tensor | None:
    """A Constant node's output as ONNX defines it: its `value` tensor, decoded by onnx's own numpy_helper
    (not by the code the torch kernel uses), for the dtypes numpy holds; None for any other node."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or [a.name for a in node.attribute] != ["value"]:
        return None
    t = node.attribute[0].t
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    array = onnx.numpy_helper.to_array(t)
    if array.dtype not in _NUMPY_TYPES:
        return None
    return torch.from_numpy(np.array(array, copy=True))  # (a writable copy of its own)


# the dtypes numpy holds as they are (bfloat16 and the float8s are not among them)
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})
_NUMPY_TYPES = frozenset(np.dtype(t) for t in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"))


def _run_own_feeds(runner: OrtRunner, names: list[str], feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """`runner.run` for feeds blame made itself (their names, dtypes and ranks are the model's by
    construction): on CPU straight through the session with numpy arrays, without OrtRunner's feed checks
    and I/O binding, which cost as much as the run for a model with a thousand inputs."""
    if runner.provider != "CPU" or any(t.device.type != "cpu" or t.dtype not in _NUMPY_DTYPES for t in feeds.values()):
        return runner.run(names, feeds)
    arrays = {k: t.detach().contiguous().numpy() for k, t in feeds.items()}
    session = runner.session
    # InferenceSession.run checks that every graph input is fed by looking each one up in a list of the
    # feeds' names: quadratic in the inputs (0.1 s, a run's time, at 3,000 nodes). The feeds are the
    # model's inputs by construction: its binding's own run, where this onnxruntime has it
    inner = getattr(session, "_sess", None)
    run = inner.run if inner is not None and callable(getattr(inner, "run", None)) else session.run
    outs = [torch.from_numpy(_own_array(y)) for y in run(names, arrays, None)]
    if any(t.dtype == torch.uint8 for t in outs):  # (numpy has no float8: onnxruntime hands them back as their bits)
        declared = runner.output_dtypes
        outs = [_float8_view(t, declared.get(n)) for n, t in zip(names, outs, strict=True)]
    return outs


def _float8_view(t: torch.Tensor, declared: torch.dtype | None) -> torch.Tensor:
    """`t` in its declared one-byte floating dtype (a float8) when it holds that dtype's bits as uint8."""
    if declared is not None and t.dtype == torch.uint8 and declared.is_floating_point and declared.itemsize == 1:
        return t.view(declared)
    return t


def _own_array(y: np.ndarray) -> np.ndarray:
    """A C-contiguous, writable array torch can take without copying (onnxruntime's usually is); a copy
    otherwise (np.ascontiguousarray would make a scalar 1-d)."""
    return y if y.flags.c_contiguous and y.flags.writeable else np.array(y, order="C", copy=True)


def _local_outputs_one_by_one(graph: _Graph, picked: Sequence[int], values: Mapping[str, Any], opsets: Mapping[str, int]) -> dict[int, tuple[Any, ...]]:
    out: dict[int, tuple[Any, ...]] = {}
    for i in picked:
        node, k = graph.nodes[i], graph.kernels[i]
        ort = OrtKernel(node, k.ctx, opsets, constants=graph.constants)
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
        r = _errors(x, y, mean=False)
        worst_abs = max(worst_abs, r.max_abs)
        worst_ulp = max(worst_ulp, r.max_ulp)
    return worst_abs, worst_ulp


class _Swapper:
    """Runs the torch evaluator with some nodes on onnxruntime, reusing the torch run's values: only the
    nodes downstream of a value that changed (bit for bit) run again. A swapped node whose inputs did not
    change takes onnxruntime's output from the one-session local run."""

    def __init__(
        self, graph: _Graph, values: Mapping[str, Any], local: Mapping[int, tuple[Any, ...]], outputs: Sequence[str], opsets: Mapping[str, int], dead: Collection[int] = ()
    ) -> None:
        self.graph, self.values, self.local, self.outputs, self.opsets = graph, values, local, list(outputs), dict(opsets)
        # nodes no graph output depends on (the torch run computed none of their values): never run again
        self._dead = frozenset(dead)
        self._ort: dict[bytes, OrtKernel] = {}  # one onnxruntime kernel per (op, attributes, outputs) shape of node
        # the values each node is the last to read (the graph's outputs aside): a swap drops its changed
        # values there, so that it holds the values in flight, not every value downstream of the swap (on a
        # graph of thousands of nodes, memory the system would otherwise have to hand out again each swap)
        last: dict[str, int] = {}
        for i, ins in enumerate(graph.inputs):
            for x in ins:
                if x:
                    last[x] = i
        kept = set(self.outputs)
        self._frees: list[tuple[str, ...]] = [() for _ in graph.nodes]
        by_node: dict[int, list[str]] = {}
        for x, i in last.items():
            if x not in kept:
                by_node.setdefault(i, []).append(x)
        for i, xs in by_node.items():
            self._frees[i] = tuple(xs)
        #: nodes run (torch or onnxruntime) by all swaps so far (swaps may run in several threads)
        self.executed = 0
        self._count = threading.Lock()

    def ort_kernel(self, i: int) -> OrtKernel:
        node = self.graph.nodes[i]
        # (an op whose onnxruntime kernel holds its constant inputs has a kernel per node: their names are its weights)
        sensitive = (node.domain or "", node.op_type) in CONSTANT_SENSITIVE
        key = onnx.NodeProto(op_type=node.op_type, domain=node.domain, attribute=node.attribute, input=[(x if sensitive else "x") if x else "" for x in node.input], output=["y" if o else "" for o in node.output]).SerializeToString()
        k = self._ort.get(key)
        if k is None:
            k = self._ort[key] = OrtKernel(node, self.graph.kernels[i].ctx, self.opsets, constants=self.graph.constants)
        return k

    def run(self, swapped: Collection[int]) -> list[Any]:
        """The graph's outputs with `swapped` on onnxruntime (each must have a local output)."""
        g, base, local, frees = self.graph, self.values, self.local, self._frees
        runs, inputs, outputs, consumers = g.runs, g.inputs, g.outputs, g.consumers
        changed: dict[str, Any] = {}
        get, base_get = changed.get, base.get
        Tensor, equal = torch.Tensor, torch.equal  # (looked up once per swap)
        # nodes run in graph order (a topological one): a node's inputs are final when its turn comes.
        # A flag per node says whether one of its inputs changed; the walk ends after the last flagged one
        dirty = bytearray(len(g.nodes))
        for i in swapped:
            dirty[i] = 1
        last = max(swapped, default=-1)
        executed = 0
        i = min(swapped, default=0)
        while i <= last:
            if not dirty[i]:
                i += 1
                continue
            if i in swapped:
                if any(x in changed for x in inputs[i] if x):
                    res = self.ort_kernel(i).run(*[get(x, base_get(x)) if x else None for x in g.nodes[i].input])
                    executed += 1
                else:
                    res = local[i]
            else:
                res = runs[i](*[get(x, base_get(x)) if x else None for x in inputs[i]])
                executed += 1
            for o, y in zip(outputs[i], res, strict=False):
                if not o:
                    continue
                before = base_get(o)
                # changed: not `_same_bits`, after a cheap first test (this runs for every output of every
                # node a swap runs again): a floating tensor whose values differ has changed. One whose
                # NaNs hide identical bits counts as changed too: its consumers run again and compute
                # what they computed before, which costs time, never exactness
                if y is before:
                    continue
                if not (type(y) is Tensor and type(before) is Tensor and y.dtype is before.dtype and y.dtype.is_floating_point and y.shape == before.shape and y.device == before.device and not equal(y, before)) and _same_bits(y, before):
                    continue
                changed[o] = y
                for j in consumers.get(o, ()):
                    if j in self._dead:
                        continue
                    dirty[j] = 1
                    if j > last:
                        last = j
            for x in frees[i]:
                changed.pop(x, None)
            i += 1
        with self._count:
            self.executed += executed
        return [get(o, base_get(o)) for o in self.outputs]


def _in_ieee_float32(fn: Callable[..., BlameTable]) -> Callable[..., BlameTable]:
    """`fn` (provider= keyword) run with the torch side in IEEE float32 on the provider's device: blame runs
    kernels one by one outside TorchEvaluator.run, which sets it for its own runs."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> BlameTable:
        with ieee_float32(torch_device(parse_provider(kwargs.get("provider", "CPU")))):
            return fn(*args, **kwargs)

    return run


@_in_ieee_float32
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
    budget: float | None = 5.0,
) -> BlameTable:
    """Swap every node to onnxruntime in turn and measure how much of the torch/onnxruntime gap it explains.

    `kernels` applies overrides to the torch side (to test your own kernel); `missing="ort"` runs every op
    without a torch kernel on onnxruntime (it explains nothing then); `tolerance` decides which node output
    is the first to drift (default: any difference).

    Linear in the graph, not quadratic: one torch run keeping every value, one onnxruntime session giving
    every node's output from the torch run's inputs (its local error), and per swap only the nodes
    downstream of a value that changed run again. A node whose onnxruntime output is bit-identical to
    torch's changes nothing when swapped: its row is known without running it (`BlameRow.skipped`).

    `budget`: how much work the swaps (single nodes and op types) may cost, in runs of the graph: each
    swap is charged the nodes it may run again (itself and every node downstream), weighted by a model of
    each node's time (`_Graph.costs`: a fixed cost per node plus its elements and multiply-adds, and what
    running a node again in a swap costs more than in a run; a model, not a clock, so that the same graph
    gets the same table). When swapping everything would cost more (a
    large graph with many nodes whose result differs), each node's share of the gap is first estimated to
    first order (one backward pass through the torch run; an op type's is its nodes' estimates summed), and
    the swaps run exactly in the order of that estimate until the budget is spent (the 3 first nodes and
    the first op type always; then, beyond the budget, any whose estimate of 2 % or more would still head
    the node or the op-type table: the row heading each table is exact, though a larger share may hide
    in an estimate below it); the other rows keep the estimate
    (`BlameRow.exact` False). Default 5 (the swaps may run side by side: in wall time less on a machine
    with cores torch leaves idle). Whatever the budget, swaps modelled to take under 5 ms in all run exactly, so a small
    graph's table is exact throughout. 0: only the 3 nodes and the op type ranked first run (the floor of
    the cost, with those the head of the table needs). None: every swap runs exactly.
    """
    setup = _Setup(model, feeds, parse_provider(provider), dict(kernels or {}), {"missing": missing} if missing != "error" else {})
    clock = _Clock()
    # onnxruntime's two sessions and the float64 oracle run in threads beside the torch run and the
    # first-order pass (kernels release the GIL while they compute), as many threads as the cores torch's
    # own threads leave idle: there they cost little wall time. A thread takes its jobs in the order they
    # are given (the every-value session, the drifts, the oracle, the local errors): no more jobs at once
    # than idle cores, so that the job the first-order pass waits for is not slowed by those it does not
    # (on 2 cores, 6 threads at once took 23 runs' worth at 172 nodes, medians of 15; one thread 20). With
    # one thread, this thread makes the local outputs' session after the torch run and runs it; with more,
    # a thread makes it while torch runs. The oracle is read only by the swaps' rows.
    # (each thread runs torch ops with the calling thread's torch thread count: a new thread would otherwise
    # leave OpenMP/MKL at their defaults, and a MatMul there could take another path and give other bits)
    # Where torch's threads take every core (torch's default: a thread per core), the same jobs run one after
    # the other in this thread, each when its result is first asked for: torch's threads wait for one another
    # at every op, and a thread of onnxruntime's or a second torch run taking a core from them costs more than
    # it saves (blame took 1.2-2x the time, 2 torch threads on 2 cores). The thread counts stay as they are:
    # they can change a MatMul's bits.
    helpers = _helper_threads()
    helper: ThreadPoolExecutor | _InCaller = _started_pool(helpers, "ortdiff-blame") if helpers else _InCaller()
    torch_done: Future[dict[str, Any]] = Future()
    try:
        runs = _run_both(setup, helper, helpers == 1, torch_done, tolerance, oracle, dtype, clock)
        plan = _plan_swaps(runs, budget, clock)
        local_errors = runs.local_errors.result()  # (in this thread with one helper thread: before waiting for it)
        # the oracle's outputs: the thread computing them has had the torch run and the first-order pass to do it
        oracle_out = runs.oracle.result() if runs.oracle is not None else None
        clock.lap("float64 oracle, waited for")
        table_oracle: dict[str, OracleError] = {}
        if oracle_out is not None:
            for name, outs in (("torch", runs.torch_out), ("onnxruntime", runs.ort_out)):
                r = compare(oracle_out, outs)
                table_oracle[name] = OracleError(name, r.max_abs, r.max_ulp, r.mismatches, r.n, r.max_ulp_floored)
        swaps = _Swaps(setup, runs, plan, oracle_out)
        drifts, first_divergence = runs.drifts.result()
        swaps.run_exact(clock)
        options = options_in_force(setup.provider)
        tf32 = tf32_in_play(setup.provider, runs.label, options)  # (the rows onnxruntime may have computed in TF32 say so)
        rows, op_rows = _rows(runs, swaps, local_errors, drifts, tf32)
        clock.lap("rows")
        notes = _notes(runs, swaps, setup.provider, options, any(r.tf32 for r in rows), clock)
        return BlameTable(
            rows=rows, provider=setup.provider, dtype=runs.label, gap=runs.gap, oracle=table_oracle, op_rows=op_rows,
            first_divergence=first_divergence, notes=notes, nodes_recomputed=swaps.swapper.executed, timings=clock.laps,
        )  # fmt: skip
    finally:
        if not torch_done.done():
            torch_done.cancel()  # (the threads waiting for the torch run end)
        helper.shutdown(wait=False, cancel_futures=True)  # (after an error: what still runs ends on its own)


class _Setup:
    """What blame was asked: the model (nodes in an order they run in: the gate's proto, or the file's sorted
    where it is not one), the feeds, the provider and its device, and the torch side's overrides."""

    def __init__(self, model: Any, feeds: Mapping[str, Any], provider: str, kernels: dict[Any, Any], extra: dict[str, Any]) -> None:
        self.model = model
        self.checked = model if isinstance(model, CheckedModel) else None  # (Checker.check's, checked already)
        self.m = self.checked.proto if self.checked is not None else in_topological_order(load_model(model))
        self.feeds = feeds
        self.provider = provider
        self.device = torch_device(provider)
        self.kernels = kernels
        self.extra = extra  # (missing=: the evaluator's own default when not given)


@dataclass
class _Runs:
    """The runs every row reads: the torch run (every value), onnxruntime's run and each node's local output
    (onnxruntime's kernel on the torch run's inputs), the gap between the two runs' outputs, and the jobs still
    running beside them (each node's drift, its local error, the float64 oracle)."""

    base: TorchEvaluator
    graph: _Graph
    #: node names the evaluator can be keyed by (unnamed nodes: `OpType_<index>`)
    keys: list[str]
    label: str
    torch_all: dict[str, Any]
    torch_out: list[Any]
    ort_out: list[Any]
    local: dict[int, tuple[Any, ...]]
    no_op: list[bool]
    #: nodes no graph output depends on: the torch run computed none of their values
    dead: set[int]
    gap: DiffReport
    #: the model's file, for a model above 2 GB read from it
    large_file: str | None
    drifts: Future[tuple[list[float | None], str | None]]
    local_errors: Future[dict[int, tuple[float, float]]]
    oracle: Future[list[torch.Tensor]] | None

    @property
    def outputs(self) -> list[str]:
        return list(self.base.output_names)


def _run_both(
    setup: _Setup,
    helper: ThreadPoolExecutor | _InCaller,
    local_here: bool,
    torch_done: Future[dict[str, Any]],
    tolerance: Tolerance | None,
    oracle: bool,
    dtype: Any,
    clock: _Clock,
) -> _Runs:
    """The torch run keeping every value, here, with onnxruntime's jobs in `helper`'s threads beside it: the
    run exposing every value, each node's local output (its session made while torch runs, unless
    `local_here`: then here, after it), the drifts and local errors once those are there, and the oracle
    after the torch run. An invalid model fails with onnx.checker's message before anything runs on it."""
    m, feeds, provider = setup.m, setup.feeds, setup.provider
    # onnx.checker's verdict (cached per model) and the serialized bytes onnxruntime's session is made
    # from, once: the session with every value exposed takes them as they are, plus its outputs
    # (a model above 2 GB is checked from its file, and onnxruntime reads its weights from theirs)
    checked = _done(setup.checked) if setup.checked is not None else helper.submit(functools.partial(check_model, m, path=model_path(setup.model)))
    ort_future = helper.submit(_checked_ort_values, checked.result, feeds, provider)
    try:
        base = TorchEvaluator(m, device=setup.device, kernels=setup.kernels, check_model=False, **setup.extra)
    except Exception:
        if checked.exception() is not None:  # an invalid model: the checker's message, not the evaluator's stumble on it
            raise checked.exception() from None  # type: ignore[misc]
        raise
    clock.lap("torch evaluator built")
    outputs = list(base.output_names)
    declared = [base.output_dtypes.get(o) for o in outputs]
    label = dtype_of(dtype).short if dtype is not None else _first_float_dtype(declared)
    keys = [node_key(node, i) for i, node in enumerate(m.graph.node)]
    graph = _Graph(base)
    # the local outputs' session is made from the values' declared types while torch runs; it is run
    # on the torch run's values once they are there
    local_future = None if local_here else helper.submit(_local_job, m, graph, torch_done.result, provider, base.opsets, base.value_types)
    # each node's drift (its output in the torch run against the onnxruntime run) once both are there,
    # and its local error once the local outputs are
    drift_future = helper.submit(_drifts, m.graph.node, keys, torch_done.result, ort_future.result, tolerance, base.output_names)
    errors_future = None if local_future is None else helper.submit(_local_errors, graph, torch_done.result, local_future.result)
    clock.lap("graph")
    # every value of one torch run, through the plain plan (a run that happens once records no
    # shape-specialised plan)
    try:
        torch_all: dict[str, Any] = base.run(None, feeds, intermediates=True, specialise=False)
    except Exception:
        if checked.exception() is not None:
            raise checked.exception() from None  # type: ignore[misc]
        raise
    torch_done.set_result(torch_all)
    # the checker's verdict, done by now (the torch run did not wait for it): an invalid model fails
    # with its message before anything else runs on it
    large_file = checked.result().path  # (set only for a model above 2 GB, read from its file)
    del checked  # (its serialized model: the onnxruntime thread holds it only while it needs it)
    clock.lap("torch run (every value)")
    # the float64 oracle in a thread of its own, after the torch run (whose values the local outputs
    # and the first-order pass wait for): only the swaps' rows read it
    oracle_future = helper.submit(_oracle_outputs, base, setup.kernels, feeds, declared) if oracle else None
    torch_out = [torch_all[o] for o in outputs]
    if local_future is None:  # (one helper thread: made here, from the torch run's values)
        local_future = Future()
        local_future.set_result(_local_job(m, graph, torch_done.result, provider, base.opsets, None))
        # their local errors here too, once the first-order pass is done (the helper thread has the
        # drifts and the oracle to do by then)
        errors_future = _InCaller().submit(_local_errors, graph, torch_done.result, local_future.result)
        clock.lap("onnxruntime local outputs (one session)")
    ort_all = _as_torch_dtypes(ort_future.result(), torch_all)
    clock.lap("onnxruntime run (every value), waited for")
    if isinstance(helper, _InCaller):
        drift_future.result()  # (one thread: the onnxruntime run's values are let go before the local outputs come)
    local, no_op = local_future.result()
    clock.lap("onnxruntime local outputs (one session), waited for")
    ort_out = [ort_all[o] for o in outputs]
    gap = compare(dict(zip(outputs, torch_out, strict=True)), dict(zip(outputs, ort_out, strict=True)))
    # dead code (no graph output depends on it; onnxruntime-genai's builder, taking an MLP's Linear for the LM
    # head, left a model's last MLP so): the torch run computed none of its values, and swapping it changes nothing
    dead = {i for i, node in enumerate(graph.nodes) if all(not o or o not in torch_all for o in node.output)}
    assert errors_future is not None
    return _Runs(base, graph, keys, label, torch_all, torch_out, ort_out, local, no_op, dead, gap, large_file, drift_future, errors_future, oracle_future)


@dataclass
class _Plan:
    """Which swaps run exactly, and the first-order estimate of the others' shares (empty when every swap fits
    the budget). Op types with several nodes get a row of their own: all of them swapped at once."""

    #: op type -> its nodes, in graph order
    members_of: dict[str, list[int]]
    run_exactly: set[int]
    ops_exactly: set[str]
    estimates: dict[int, float] = field(default_factory=dict)
    op_estimates: dict[str, float] = field(default_factory=dict)
    #: a node's mean modelled time in ns (`_Graph.costs`): whether swaps run side by side
    node_ns: float = 0.0


def _plan_swaps(runs: _Runs, budget: float | None, clock: _Clock) -> _Plan:
    """The swaps that run exactly: all of them when they fit `budget` (see `blame`); else the 3 nodes and the
    op type the first-order estimate ranks first, then the others by estimate while the budget lasts (one
    that does not fit leaves room for a cheaper one after it)."""
    graph, no_op = runs.graph, runs.no_op
    candidates = [i for i in range(len(graph.nodes)) if not no_op[i] and i not in runs.dead]
    members_of: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        members_of.setdefault(n.op_type, []).append(i)
    op_candidates = [op for op, idx in members_of.items() if len(idx) > 1 and not all(no_op[i] for i in idx)]
    ns = graph.costs(runs.torch_all) if candidates or op_candidates else np.zeros(0)
    plan = _Plan(members_of, set(candidates), set(op_candidates), node_ns=float(ns.mean()) if ns.size else 0.0)
    gap_mean = runs.gap.mean_abs
    if budget is None or not (candidates or op_candidates) or gap_mean <= 0:
        return plan
    # a swap costs at most the nodes it may run again, weighted by their share of a run's time
    reach = graph.reach()
    # in runs of the graph: what a swap redoes at most, a node run again costing more in a swap than in
    # a run (its kernel's own run, the test of whether its output changed: `_SWAP_SCALE`, `_SWAP_NODE_NS`)
    costs = (ns * _SWAP_SCALE + _SWAP_NODE_NS) / ns.sum()
    node_cost = {i: _weight(reach[i], costs) for i in candidates}
    op_cost = {op: _weight(functools.reduce(operator.or_, (reach[i] for i in members_of[op])), costs) for op in op_candidates}
    # swaps modelled to take under _EXACT_FLOOR_NS in all run exactly whatever the budget (0 aside): a
    # small graph is blamed exactly (its runs take microseconds)
    if budget > 0:
        budget = max(budget, _EXACT_FLOOR_NS / float(ns.sum()))
    if sum(node_cost.values()) + sum(op_cost.values()) <= budget:
        return plan
    shares = _first_order(graph, runs.torch_all, runs.local, candidates, runs.outputs, runs.ort_out, gap_mean)
    clock.lap("first-order estimate")
    plan.estimates = {i: max(0.0, min(1.0, shares.get(i, 0.0))) for i in candidates}
    # to first order, swapping several nodes changes the run by the sum of their changes
    plan.op_estimates = {op: max(0.0, min(1.0, sum(shares.get(i, 0.0) for i in members_of[op]))) for op in op_candidates}
    node_rank = sorted(candidates, key=lambda i: -plan.estimates[i])
    op_rank = sorted(op_candidates, key=lambda op: -plan.op_estimates[op])
    plan.run_exactly, plan.ops_exactly = set(node_rank[:3]), set(op_rank[:1])
    spent = sum(node_cost[i] for i in plan.run_exactly) + sum(op_cost[op] for op in plan.ops_exactly)
    ranked: list[tuple[float, int, Any]] = [(plan.estimates[i], 0, i) for i in node_rank[3:]] + [(plan.op_estimates[op], 1, op) for op in op_rank[1:]]
    for _, kind, what in sorted(ranked, key=lambda r: -r[0]):
        c = node_cost[what] if kind == 0 else op_cost[what]
        if spent + c <= budget:
            (plan.run_exactly if kind == 0 else plan.ops_exactly).add(what)
            spent += c
    return plan


#: a swap's numbers: the share of the gap it explains, its outputs' max abs error against onnxruntime's and
#: against torch's, and the oracle's max abs and ULP errors against them (None without the oracle)
_Measured = tuple[float, float, float, float | None, float | None]


def _as_torch_dtypes(ort_all: dict[str, Any], torch_all: Mapping[str, Any]) -> dict[str, Any]:
    """onnxruntime's every-value run with the float8 values it hands back as their uint8 bits (numpy has no
    float8) viewed in the dtype the torch run has for them: the two runs' values then compare as values."""
    for name, value in ort_all.items():
        ours = torch_all.get(name)
        if isinstance(value, torch.Tensor) and isinstance(ours, torch.Tensor) and value.shape == ours.shape:
            ort_all[name] = _float8_view(value, ours.dtype)
    return ort_all


class _Swaps:
    """The swaps, run and measured: each against onnxruntime's, torch's and the oracle's outputs; the exact ones
    of the plan (side by side where torch leaves cores idle), then those the head of each table needs; and
    each row's figures: exact where its swap ran or is a no-op, else its first-order estimate."""

    def __init__(self, setup: _Setup, runs: _Runs, plan: _Plan, oracle_out: list[torch.Tensor] | None) -> None:
        self.setup, self.runs, self.plan, self.oracle_out = setup, runs, plan, oracle_out
        self.swapper = _Swapper(runs.graph, runs.torch_all, runs.local, runs.outputs, runs.base.opsets, runs.dead)
        self.nodes: dict[int, _Measured] = {}  # single-node swaps run so far
        self.ops: dict[str, _Measured] = {}  # op-type swaps run so far
        self._named: onnx.ModelProto | None = None
        #: a swap that changes nothing: the torch run itself
        self.unchanged = self.measured(runs.torch_out)

    def measured(self, outs: list[Any]) -> _Measured:
        runs, gap_mean = self.runs, self.runs.gap.mean_abs
        vs_ort = _errors(outs, runs.ort_out, ulp=False)
        vs_torch = _errors(outs, runs.torch_out, ulp=False, mean=False)
        explained = 0.0 if gap_mean == 0 else max(0.0, min(1.0, 1.0 - vs_ort.mean_abs / gap_mean))
        o_abs = o_ulp = None
        if self.oracle_out is not None:
            r = _errors(self.oracle_out, outs, mean=False)
            o_abs, o_ulp = r.max_abs, r.max_ulp
        return explained, vs_ort.max_abs, vs_torch.max_abs, o_abs, o_ulp

    def named(self) -> onnx.ModelProto:
        """A copy of the model whose unnamed nodes are named by their key (what `kernels=` and onnxruntime's
        optimized graph are matched by); made only where needed (it copies the weights)."""
        if self._named is None:
            copy = onnx.ModelProto()
            copy.CopyFrom(self.setup.m)
            for node, key in zip(copy.graph.node, self.runs.keys, strict=True):
                node.name = key
            self._named = copy
        return self._named

    def swap(self, indices: list[int]) -> _Measured:
        indices = [i for i in indices if i not in self.runs.dead]
        if any(i not in self.runs.local for i in indices):
            # the whole graph again: only for swaps of control flow and of nodes reading sequences
            s = self.setup
            swapped = dict.fromkeys((self.runs.keys[i] for i in indices), "ort")
            ev = TorchEvaluator(self.named(), device=s.device, kernels={**s.kernels, **swapped}, check_model=False, **s.extra)
            return self.measured(ev.run(None, s.feeds))
        return self.measured(self.swapper.run(set(indices)))

    def run(self, node_jobs: list[int], op_jobs: list[str], tick: Callable[[], Any]) -> None:
        """Swap each of `node_jobs`, then each op type of `op_jobs` (all its nodes at once), calling `tick`
        after each."""
        jobs = [[i] for i in node_jobs] + [self.plan.members_of[op] for op in op_jobs]
        results: list[_Measured] = []
        # (your own kernels, callables, run one swap at a time: they need not be thread-safe)
        workers = 1 if any(callable(v) for v in self.setup.kernels.values()) else _swap_workers(len(jobs), self.plan.node_ns)
        if workers > 1:
            with _started_pool(workers, "ortdiff-swap") as pool:
                for res in pool.map(self.swap, jobs):  # (in order: the same table whatever the threads)
                    results.append(res)
                    tick()
        else:
            for job in jobs:
                results.append(self.swap(job))
                tick()
        self.nodes.update(zip(node_jobs, results, strict=False))
        self.ops.update(zip(op_jobs, results[len(node_jobs) :], strict=True))

    def run_exact(self, clock: _Clock) -> None:
        """The plan's exact swaps (single nodes, then op types), then those whose estimate could head a table;
        a large graph takes seconds: a bar on a terminal (silent in CI, under -q and in xdist workers)."""
        plan, no_op, n = self.plan, self.runs.no_op, len(self.runs.keys)
        node_jobs = [i for i in range(n) if not no_op[i] and i in plan.run_exactly]
        op_jobs = [op for op, idx in plan.members_of.items() if len(idx) > 1 and op in plan.ops_exactly and not all(no_op[i] for i in idx)]
        jobs = len(node_jobs) + len(op_jobs)
        shown_from = 1 if n >= progress.BLAME_MIN_NODES else jobs + 2
        with progress.bar(jobs + 1, "ortdiff blame", unit="swap", min_total=shown_from) as shown:
            self.run(node_jobs, op_jobs, shown.update)
            clock.lap("swaps")
            if plan.estimates or plan.op_estimates:
                # the row heading each table is exact: the estimated rows that could head one run too, beyond
                # the budget (one or two swaps on the BERT- and Llama-like exports of benchmarks/real_graphs.py
                # at the default budget, none on most graphs); one round, but where more than `_SETTLE_MAX`
                # could. It ends: each round swaps rows not swapped before, and the bars only rise
                while True:
                    more_nodes, more_ops = self.estimated_on_top()
                    if not more_nodes and not more_ops:
                        break
                    if isinstance(getattr(shown, "total", None), int):  # (a drawn bar: it counts them too)
                        shown.total += len(more_nodes) + len(more_ops)  # type: ignore[attr-defined]
                    self.run(more_nodes, more_ops, shown.update)
                clock.lap("swaps for the rows heading the tables")
            shown.update()

    def share(self, i: int) -> float:
        got = self.nodes.get(i)
        return got[0] if got is not None else self.unchanged[0] if self.runs.no_op[i] else self.plan.estimates.get(i, 0.0)

    def op_exact(self, op: str) -> bool:
        idx, no_op = self.plan.members_of[op], self.runs.no_op
        if len(idx) == 1:  # (an op type of one node: its row is the node's)
            return no_op[idx[0]] or idx[0] in self.nodes
        return all(no_op[i] for i in idx) or op in self.ops

    def op_share(self, op: str) -> float:
        idx = self.plan.members_of[op]
        if len(idx) == 1:
            return self.share(idx[0])
        if all(self.runs.no_op[i] for i in idx):
            return self.unchanged[0]
        return self.ops[op][0] if op in self.ops else self.plan.op_estimates.get(op, 0.0)

    def estimated_on_top(self) -> tuple[list[int], list[str]]:
        """The estimated rows that could head a table: those whose estimate of 2 % or more reaches the
        highest exact figure (of the node rows; of the op-type rows). Their swaps settle the head: the
        others' estimates stay below an exact figure, which further swaps only raise. First order
        misjudges a node (a slope at the torch run, where a swap is a finite step), or its swap did not
        fit the budget: without this an estimate could head the table, or name the culprit. At most
        `_SETTLE_MAX`, highest first."""
        estimates, members_of, no_op = self.plan.estimates, self.plan.members_of, self.runs.no_op
        bar = max(_SETTLE_MIN, max((self.share(i) for i in range(len(self.runs.keys)) if no_op[i] or i in self.nodes), default=0.0))
        nodes = [i for i in estimates if i not in self.nodes and estimates[i] >= bar]
        op_figures = [self.op_share(op) for op in members_of if self.op_exact(op)]
        op_bar = max(_SETTLE_MIN, max(op_figures, default=0.0))
        ops: list[str] = []
        for op in members_of:
            if self.op_exact(op) or self.op_share(op) < op_bar:
                continue
            idx = members_of[op]
            if len(idx) == 1:
                if idx[0] not in nodes:
                    nodes.append(idx[0])
            else:
                ops.append(op)
        # each table's highest estimate first (the one that could head it), then the others, highest first
        by_node = sorted(nodes, key=lambda i: -self.share(i))
        by_op = sorted(ops, key=lambda op: -self.op_share(op))
        rest: list[tuple[float, int | str]] = sorted([(self.share(i), i) for i in by_node[1:]] + [(self.op_share(op), op) for op in by_op[1:]], key=lambda r: -r[0])
        kept = {*by_node[:1], *by_op[:1], *(what for _, what in rest[: max(0, _SETTLE_MAX - len(by_node[:1]) - len(by_op[:1]))])}
        return [i for i in sorted(nodes) if i in kept], [op for op in ops if op in kept]

    def figures(self, skipped: bool, got: _Measured | None, estimate: float) -> tuple[float, float | None, float | None, float | None, float | None]:
        """A row's numbers: the torch run's for a no-op swap, the swap's where it ran, else the estimate."""
        return self.unchanged if skipped else got if got is not None else (estimate, None, None, None, None)


def _rows(runs: _Runs, swaps: _Swaps, local_errors: Mapping[int, tuple[float, float]], drifts: Sequence[float | None], tf32: bool) -> tuple[list[BlameRow], list[BlameRow]]:
    """The table's rows, a node's and an op type's, most explaining first (graph order among equals), those
    onnxruntime may compute in TF32 marked when `tf32`."""
    rows: list[BlameRow] = []
    for i, node in enumerate(swaps.setup.m.graph.node):
        skipped = runs.no_op[i]
        exact = skipped or i in swaps.nodes
        explained, vs_ort, vs_torch, o_abs, o_ulp = swaps.figures(skipped, swaps.nodes.get(i), swaps.plan.estimates.get(i, 0.0))
        local_abs, local_ulp = local_errors.get(i, (0.0, 0.0))
        rows.append(BlameRow(runs.keys[i], node.op_type, explained, vs_ort, vs_torch, local_abs, local_ulp, drifts[i], o_abs, o_ulp, skipped=skipped, scope=node_scope(node), exact=exact))
    op_rows: list[BlameRow] = []
    for op, indices in swaps.plan.members_of.items():
        members = [r for r in rows if r.op_type == op]
        if len(members) == 1:
            op_rows.append(replace(members[0], node=op, scope=""))
            continue
        # every member bit-identical on onnxruntime: swapping them all changes nothing either (each one's
        # inputs stay the torch run's, by induction along the graph)
        skipped = all(runs.no_op[i] for i in indices)
        exact = skipped or op in swaps.ops
        explained, vs_ort, vs_torch, o_abs, o_ulp = swaps.figures(skipped, swaps.ops.get(op), swaps.plan.op_estimates.get(op, 0.0))
        local_abs = max(r.local_max_abs for r in members)
        local_ulp = max(r.local_max_ulp for r in members)
        member_drifts = [r.drift_max_abs for r in members if r.drift_max_abs is not None]
        op_rows.append(BlameRow(op, op, explained, vs_ort, vs_torch, local_abs, local_ulp, max(member_drifts) if member_drifts else None, o_abs, o_ulp, skipped=skipped, exact=exact))
    if tf32:
        rows = [replace(r, tf32=True) if r.op_type in TF32_OPS else r for r in rows]
        op_rows = [replace(r, tf32=True) if r.op_type in TF32_OPS else r for r in op_rows]
    # among equals, the node with its own error first, then the one whose value drifted most between the two
    # runs (where every node explains 0 % the table would otherwise be Constants and Shapes in graph order);
    # stable: graph order among equals
    rows.sort(key=lambda r: (-r.explained, -r.local_max_ulp, -(r.drift_max_abs or 0.0) if r.drift_max_abs == r.drift_max_abs else 0.0))
    op_rows.sort(key=lambda r: -r.explained)
    return rows, op_rows


def _notes(runs: _Runs, swaps: _Swaps, provider: str, options: Mapping[str, str], tf32_rows: bool, clock: _Clock) -> list[str]:
    """The table's notes: the Casts onnxruntime inserts, the TF32 rows, where onnxruntime's kernels depart
    from an op's meaning on purpose (none when the two runs agree bit for bit)."""
    # onnxruntime inserts Casts only around nodes reading float16 (its InsertCastTransformer): without a
    # float16 value there is nothing to note, and no session to build for it
    has_fp16 = any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in runs.torch_all.values())
    notes = _named_notes(swaps.named, runs.large_file, runs.keys, provider) if has_fp16 and not runs.gap.is_exact else []
    if tf32_rows:
        notes.append("(TF32) rows: " + tf32_line(options).removeprefix("note: "))
    clock.lap("onnxruntime graph notes")
    if not runs.gap.is_exact:
        notes += _departure_notes(runs.graph, runs.torch_all, runs.local, runs.keys)
        clock.lap("departures")
    return notes


def _departure_notes(graph: _Graph, values: Mapping[str, Any], local: Mapping[int, tuple[Any, ...]], keys: Sequence[str]) -> list[str]:
    """Where onnxruntime's kernel departs from an op's meaning on purpose (`Kernel.departure()`: MatMulNBits'
    int8 activations at accuracy_level=4), what that choice costs: the node computed as onnxruntime does
    against the meaning (ours), and how much of the node's own gap to onnxruntime it closes. One note per
    kind of departure, its nodes' largest figures."""
    found: dict[str, list[tuple[str, float, float, float]]] = {}
    how: dict[str, str] = {}  # departure -> the kernels= entry that runs the evaluator that way
    for i, (node, k) in enumerate(zip(graph.nodes, graph.kernels, strict=True)):
        departure = getattr(k, "departure", None)
        d = departure() if departure is not None else None
        got = local.get(i)
        if d is None or got is None or not node.output or got[0] is None or node.output[0] not in values:
            continue
        try:
            as_ort = d.kernel.run(*[values.get(x) if x else None for x in node.input])[0]
        except Exception:  # (a note is a bonus: the table stands without it)
            continue
        ours, theirs = values[node.output[0]], got[0]
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (ours, theirs, as_ort)) or ours.shape != theirs.shape:
            continue
        cost = float((as_ort.double() - ours.double()).abs().max()) if ours.numel() else 0.0
        left = float((as_ort.double() - theirs.double()).abs().max()) if ours.numel() else 0.0
        gap = float((ours.double() - theirs.double()).abs().max()) if ours.numel() else 0.0
        found.setdefault(d.what, []).append((keys[i], cost, left, gap))
        how[d.what] = f"kernels={{({node.domain!r}, {node.op_type!r}): {type(d.kernel).__name__}}}"
    notes = []
    for what, nodes in found.items():
        worst = max(nodes, key=lambda n: n[3])
        cost, left, gap = max(n[1] for n in nodes), max(n[2] for n in nodes), max(n[3] for n in nodes)
        where = f"{len(nodes)} nodes (largest gap: {worst[0]})" if len(nodes) > 1 else worst[0]
        notes.append(
            f"{what}. {where}: computed as onnxruntime does, the output moves by up to {g(cost)} from the meaning "
            f"and comes within {g(left)} of onnxruntime's (the meaning is {g(gap)} from it); {how[what]} runs "
            "the evaluator that way"
        )
    return notes


def _swap_workers(jobs: int, node_ns: float) -> int:
    """How many swaps run side by side: the cores torch's own threads leave idle (cores // torch's
    threads: one at torch's default of a thread per core), at most 4; one where a node's modelled time
    (`node_ns`, `_Graph.costs`' mean) is mostly the evaluator's Python, not tensor work: threads holding
    the GIL in turn are slower than one."""
    if node_ns < _PARALLEL_NODE_NS:
        return 1
    return max(1, min(4, jobs, _cores() // max(1, torch.get_num_threads())))


def _started_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
    """A thread pool whose `workers` threads are all started before it gets a job. A thread's start waits
    until the new thread holds the GIL; with a job already building protos or running the evaluator's Python
    (which hand the GIL on only every switch interval), each start took 5-30 ms, a quarter of a small
    graph's blame. Each thread runs torch with the calling thread's torch thread count."""
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix, initializer=_thread_setup, initargs=(torch.get_num_threads(), device))
    gate = threading.Event()
    for _ in range(workers):  # (none idle while the gate is shut: each of these starts a thread)
        pool.submit(gate.wait)
    gate.set()
    return pool


def _thread_setup(threads: int, device: int | None) -> None:
    """A pool thread runs torch with `threads` threads, and on `device` (the caller's CUDA device, when CUDA is
    in use) with its context current: a new thread has none, and its first cuBLAS call would warn ("Attempting to
    run cuBLAS, but there was no current CUDA context!"), an error under filterwarnings=error. Any CUDA runtime
    call makes the device's primary context current; a stream query waits for nothing."""
    torch.set_num_threads(threads)
    if device is not None:
        torch.cuda.set_device(device)
        torch.cuda.current_stream(device).query()


def _helper_threads() -> int:
    """blame's helper threads: the cores torch's threads leave idle (at most 6); 0 where they take every
    core (the jobs then run one after the other in blame's own thread)."""
    return max(0, min(6, _cores() - torch.get_num_threads()))


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Deferred(Future[Any]):
    """A job of `_InCaller`: run in the thread that first asks for its result (or its exception)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__()
        self._job: tuple[Callable[..., Any], tuple[Any, ...]] | None = (fn, args)

    def _run(self) -> None:
        job, self._job = self._job, None
        if job is None:
            if not self.done():  # (it would wait for itself forever)
                raise RuntimeError("a job of blame's asked for its own result while running")
            return
        try:
            result = job[0](*job[1])
        except BaseException as exc:  # (handed to whoever asks, as a thread's future does)
            self.set_exception(exc)
        else:
            self.set_result(result)

    def result(self, timeout: float | None = None) -> Any:
        self._run()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._run()
        return super().exception(timeout)


class _InCaller:
    """The helper pool's interface, its jobs run in the caller's thread when their result is asked for
    (in the order blame asks for them; a job that is never asked for never runs)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        return _Deferred(fn, args)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


#: the most swaps of one round of those blame runs beyond its budget so that the row heading each table is
#: exact, and the least estimate that makes such a row run: 2 % (below, the shares are rounding spread over
#: the graph, and an op type's swap there costs a run of the graph: 1.9 runs' worth for ReduceMean's ~1 % on
#: the 3,000-node stacked Llama export, where nothing explains more than 2 %)
_SETTLE_MAX = 6
_SETTLE_MIN = 0.02

#: swaps run side by side only where a node's modelled time is at least this (its fixed 3 µs a third of it)
_PARALLEL_NODE_NS = 10_000.0


def _first_order(
    graph: _Graph,
    values: Mapping[str, Any],
    local: Mapping[int, tuple[Any, ...]],
    candidates: Sequence[int],
    outputs: Sequence[str],
    ort_out: Sequence[Any],
    gap_mean: float,
) -> dict[int, float]:
    """Each candidate's share of the gap to first order: the torch run again under autograd, then one
    backward pass giving the gradient g of mean|outputs - onnxruntime's| at each candidate's floating
    outputs; <g, onnxruntime's output - torch's> is the change its swap makes, to first order (the
    derivative in s of the run with the output shifted by s times that difference). A kernel that
    cannot run under autograd runs detached (no gradient flows through it). {} when the graph's outputs
    carry no gradient at all. Unclipped (a sum of them estimates a swap of several nodes at once)."""
    at: list[tuple[int, torch.Tensor, torch.Tensor, str]] = []  # (candidate, its output in the graph, onnxruntime's, name)
    vals: dict[str, Any] = {}
    chosen = set(candidates)
    # each recomputed value is dropped after its last reader (what backward needs, autograd keeps): the
    # memory freed is handed out again to the nodes after, instead of new pages on a large graph
    last: dict[str, int] = {}
    for i, reads in enumerate(graph.inputs):
        for x in reads:
            if x:
                last[x] = i
    kept = set(outputs)
    frees: dict[int, list[str]] = {}
    for x, i in last.items():
        if x not in kept:
            frees.setdefault(i, []).append(x)
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
                    # a tensor of its own (a kernel may return its input) that the gradient reaches
                    y = y.view_as(y) if y.requires_grad else y.detach().requires_grad_()
                    at.append((i, y, theirs, o))
                if o in last or o in kept:  # (an output nobody reads is not kept either)
                    vals[o] = y
            for x in frees.get(i, ()):
                vals.pop(x, None)
        outs = [vals.get(o, values.get(o)) for o in outputs]
        terms = [
            (a.to(torch.float64) - b.to(a.device, torch.float64)).abs().nan_to_num(0.0, 0.0, 0.0).sum()
            for a, b in zip(outs, ort_out, strict=True)
            if isinstance(a, torch.Tensor) and a.requires_grad and isinstance(b, torch.Tensor) and a.is_floating_point()
        ]
        if not terms or not at:
            return {}
        n = sum(int(b.numel()) for b in ort_out if isinstance(b, torch.Tensor))
        loss = torch.stack(terms).sum() / max(n, 1)
        grads = torch.autograd.grad(loss, [y for _, y, _, _ in at], allow_unused=True)
    slopes: dict[int, float] = {}
    reached: set[int] = set()
    for (i, _, theirs, o), gr in zip(at, grads, strict=True):
        slopes.setdefault(i, 0.0)
        if gr is None:
            continue
        reached.add(i)
        # in float32 (float64 for float64 values): an estimate, one pass cheaper per candidate than float64
        w = torch.float64 if theirs.dtype == torch.float64 else torch.float32
        delta = torch.nan_to_num_(theirs.detach().to(w) - values[o].to(w), nan=0.0, posinf=0.0, neginf=0.0)
        slopes[i] += float(torch.dot(gr.to(w).reshape(-1), delta.reshape(-1)))
    return {i: -slope / gap_mean if i in reached else 0.0 for i, slope in slopes.items()}


class _Clock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        self.laps[what] = now - self._t
        self._t = now


def _drift(node: onnx.NodeProto, torch_all: Mapping[str, Any], ort_all: Mapping[str, Any]) -> _Errors | None:
    """The node's first output in the torch run against the onnxruntime run (accumulated error), or None
    when they cannot be compared."""
    out0 = node.output[0] if node.output else ""
    x, y = torch_all.get(out0), ort_all.get(out0)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
        return None
    if torch.equal(x, y):  # most nodes: nothing to measure
        return _NO_ERROR
    return _errors(x, y, ulp=False, mean=False)


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


def _oracle(base: TorchEvaluator, kernels: Mapping[Any, Any]) -> TorchEvaluator:
    """The float64 evaluator: the built one's twin (its model, checks, types and decoded tensors reused).
    The user's kernels under test stay out of it; only the overrides that name a runtime ("ort" for an
    op without a torch kernel, ...) go in, and a callable only where the oracle cannot be built without
    it (an op no runtime here has)."""
    named = {k: v for k, v in kernels.items() if isinstance(v, str)}
    try:
        return base.with_compute_dtype(torch.float64, kernels=named)
    except MissingKernelError:
        return base.with_compute_dtype(torch.float64, kernels=dict(kernels))


def _oracle_outputs(base: TorchEvaluator, kernels: Mapping[Any, Any], feeds: Mapping[str, Any], declared: Sequence[torch.dtype | None]) -> list[torch.Tensor]:
    """The float64 oracle's outputs, in the model's declared dtypes, through the plain plan (a first run
    would otherwise also record a shape-specialised plan for the runs to come, and there are none)."""
    return _to_declared(_oracle(base, kernels).run(None, feeds, specialise=False), declared)


def _first_float_dtype(dtypes: Sequence[torch.dtype | None]) -> str:
    for dt in dtypes:
        if dt is not None and dt.is_floating_point:
            return dtype_of(dt).short
    return "float32"
