"""The smallest keep-in-float32 list for a float16/bfloat16 conversion of a float32 model: searched in the
torch evaluator's simulation of the mixed model against the float64 oracle, verified on the converted model.

The simulation computes each node in float32 or in the half type as the converted model does: a node out
of the list runs its kernel on half-precision tensors (weights and literals clipped and rounded as the
converter stores them) and its outputs are half; a kept node reads its kept producers' float32 values as
they are. One evaluator serves every list (each node's kernel switches per run), so the search costs
evaluator runs, not conversions.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import onnx
import torch
from onnx import numpy_helper

from ...engine.check import Checker, ToleranceLike, row_for
from ...numerics.dtypes import dtype_of
from ...numerics.formatting import g, table
from ...numerics.tolerance import parse_budget  # (the command line's; kept importable from here)
from ...runtimes.evaluator import TorchEvaluator
from ...runtimes.model_io import check_model, has_subgraph, iter_graphs, load_model
from ...runtimes.ort_kernel import OrtKernel
from .audit import AuditReport, EmptyOutputs, audit, refuse_empty

if TYPE_CHECKING:
    from ...numerics.diff import DiffReport
    from ...numerics.results import CheckRow
    from ...numerics.tolerance import Tolerance

__all__ = [
    "OP_TYPE_BLOCK_LIST",
    "ConversionCheck",
    "EmptyOutputs",
    "KeepReport",
    "ListResult",
    "Outcome",
    "check_conversion",
    "convert_half",
    "keep_float32",
    "parse_budget",
    "range_flagged",
    "range_only_list",
]

#: onnxruntime's T5 demo list (the op-type block list of onnxruntime's T5 notebook): these op
#: types stay in float32, on top of the converter's own DEFAULT_OP_BLOCK_LIST
OP_TYPE_BLOCK_LIST = ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Softmax", "Relu")
_HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_ONNX_HALF = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
# onnxruntime's converter: float32 literals and initializers of float16 nodes are clipped to these
_MIN_POSITIVE, _MAX_FINITE = 5.96e-08, 65504.0
_BF16_MAX = float(torch.finfo(torch.bfloat16).max)


_RULES = {
    "not verified": "this search: grown from the audit's flags, pruned to 1-minimal in simulation, then converted",
    "nothing to keep": "this search: the plain conversion meets the tolerance already",
    "stopped": "this search, stopped at max_runs: the smallest passing list it simulated",
}


class _OutOfRuns(Exception):
    """The search spent `max_runs` evaluator runs."""


# ------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class Outcome:
    """One runtime's verdict on one mixed model, over every input: the error of the worst input against
    the float64 oracle (`max_abs` inf where an output is NaN/Inf and the oracle's is not), or why it did
    not run (`ran` False)."""

    runtime: str  # "simulated", "onnxruntime CPU", "float16 arithmetic"
    passed: bool
    max_abs: float = math.nan
    violation: str = ""  # the first broken rule, or why it did not run
    report: DiffReport | None = field(default=None, compare=False, repr=False)
    ran: bool = True

    def cell(self) -> str:
        if not self.ran:
            return "not run"
        return f"{g(self.max_abs)} {'ok' if self.passed else 'broken'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "ran": self.ran,
            "passed": self.passed,
            "max_abs": _json(self.max_abs),
            "violation": self.violation,
            "report": self.report.to_dict() if self.report is not None else None,
        }


@dataclass(frozen=True)
class ListResult:
    """A keep list (which nodes stay float32) and what the model converted with it computes."""

    method: str  # "keep_float32", "op-type block list", "range-only rule", "no list"
    rule: str  # how the list is made
    nodes: tuple[str, ...]
    #: simulated, then the converted model's: onnxruntime, half arithmetic (the torch evaluator)
    outcomes: tuple[Outcome, ...]

    @property
    def verified(self) -> bool:
        """Every runtime that ran the converted model met the tolerance (and the half arithmetic ran)."""
        converted = self.outcomes[1:]
        return bool(converted) and all(o.passed for o in converted if o.ran) and converted[-1].ran

    @property
    def error(self) -> float:
        """The largest error of the converted model (NaN/Inf: inf) over the runtimes that ran it."""
        errors = [o.max_abs for o in self.outcomes[1:] if o.ran]
        return max(errors) if errors else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "rule": self.rule,
            "size": len(self.nodes),
            "nodes": list(self.nodes),
            "verified": self.verified,
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


@dataclass(frozen=True)
class KeepReport:
    """`keep_float32`'s result: the list (`keep`), how it was found and checked, and the comparison with the
    op-type block list and the range-only rule (`results`: this list first). `render()` for people,
    `to_dict()` for JSON, `converted_model` / `write_converted(path)` for the verified model."""

    model: str
    dtype: str
    provider: str
    tolerance: Tolerance
    keep_io_types: bool
    inputs: int
    nodes: int  # nodes of the graph (subgraphs included)
    candidates: int  # nodes with floating values that a list may keep
    keep: tuple[str, ...]
    status: str  # "verified", "not verified", "unreachable", "stopped", "nothing to keep"
    minimality: str
    why: Mapping[str, str]  # kept node -> the error without it (simulated)
    start: tuple[str, ...]  # the audit's flags the search started from
    runs: int  # evaluator runs of the search
    subsets: int  # keep lists simulated
    results: tuple[ListResult, ...]
    #: nodes the converter keeps in float32 whatever the list (its own op_block_list)
    always_float32: tuple[str, ...] = ()
    ops: Mapping[str, str] = field(default_factory=dict)  # kept node -> its op type
    named: int = 0  # nodes without a name, named as the audit labels them
    notes: tuple[str, ...] = ()
    audit: AuditReport | None = field(default=None, compare=False, repr=False)
    _converted: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.keep)

    @property
    def verified(self) -> bool:
        return self.status in ("verified", "nothing to keep")

    @property
    def converted_model(self) -> onnx.ModelProto | None:
        """The model converted with the list (float32 nodes: `keep` and the converter's own list), or None
        when the search found no list."""
        return self._converted

    def write_converted(self, path: str | Path) -> Path:
        """Saves `converted_model` to `path` (ValueError when there is none, saying why), atomically: a
        full disk or a killed process leaves the file that was at `path` as it was, never half a model."""
        from ...numerics.results import write_atomically

        if self._converted is None:
            raise ValueError(
                f"no converted model to write: the search ended {self.status!r} ({self.minimality})"
            )
        out = Path(path)
        # serialized before anything is touched: a model protobuf cannot encode fails here
        write_atomically(out, self._converted.SerializeToString())
        return out

    def result(self, method: str) -> ListResult:
        for r in self.results:
            if r.method == method:
                return r
        raise KeyError(f"no result for {method!r}; methods: {[r.method for r in self.results]}")

    def render(self) -> str:
        head = (
            f"keep_float32: {self.dtype} conversion of {self.model!r} ({self.nodes} nodes, {self.candidates} with floating values), "
            f"{self.inputs} input{'s' if self.inputs != 1 else ''}, against the float64 oracle, tolerance {self.tolerance.describe()}"
        )
        lines = [head]
        if self.status == "nothing to keep":
            lines.append(
                f"nothing to keep in float32: the {self.dtype} conversion meets the tolerance as it is"
            )
        elif self.keep:
            lines.append(
                f"keep in float32: {self.size} node{'s' if self.size != 1 else ''}, {self.minimality}"
            )
            rows = [[self.ops.get(n, ""), n, self.why.get(n, "")] for n in self.keep]
            lines += table(["op", "node", "without it (simulated)"], rows, indent="  ")
        lines.append(
            f"status: {self.status}"
            + (f": {self.minimality}" if self.status in ("unreachable", "stopped") else "")
        )
        if self.verified and self.results and self.results[0].outcomes:
            ran = [o.runtime for o in self.results[0].outcomes[1:] if o.ran]
            lines[-1] += f" (the converted model meets the tolerance: {' and '.join(ran)})"
        lines += [
            "",
            f"the lists compared on this model ({self.dtype}, keep_io_types={self.keep_io_types}; error: max |expected - got| over all inputs):",
        ]
        runtimes = [o.runtime for o in next((r.outcomes for r in self.results if r.outcomes), ())]
        body = []
        for r in self.results:
            cells = [o.cell() for o in r.outcomes] or ["-"] * len(runtimes)
            body.append([r.method, str(len(r.nodes)), *cells, "yes" if r.verified else "no"])
        lines += table(["method", "float32 nodes", *runtimes, "meets tolerance"], body, indent="  ")
        for r in self.results:
            lines.append(f"  {r.method}: {r.rule}")
        skipped = dict.fromkeys(o.violation for r in self.results for o in r.outcomes if not o.ran)
        lines += [f"  not run: {why}" for why in skipped]
        lines.append("")
        lines.append(
            f"search: {self.subsets} keep lists simulated in {self.runs} evaluator runs, from the audit's {len(self.start)} flagged "
            f"node{'s' if len(self.start) != 1 else ''}"
            + (
                f"; the converter keeps {len(self.always_float32)} more in float32 whatever the list ({', '.join(self.always_float32[:4])}{', ...' if len(self.always_float32) > 4 else ''})"
                if self.always_float32
                else ""
            )
        )
        if self.named:
            lines.append(
                f"{self.named} nodes had no name: named as the audit labels them (op type _ index); the converted model keeps these names"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dtype": self.dtype,
            "provider": self.provider,
            "tolerance": self.tolerance.describe(),
            "keep_io_types": self.keep_io_types,
            "inputs": self.inputs,
            "nodes": self.nodes,
            "candidates": self.candidates,
            "keep": list(self.keep),
            "size": self.size,
            "status": self.status,
            "minimality": self.minimality,
            "why": dict(self.why),
            "start": list(self.start),
            "runs": self.runs,
            "subsets": self.subsets,
            "always_float32": list(self.always_float32),
            "results": [r.to_dict() for r in self.results],
            "notes": list(self.notes),
            "audit": self.audit.to_dict() if self.audit is not None else None,
        }


def _json(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


# ------------------------------------------------------------------------------------------------
# the model: names, types, the converter


def _named(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy whose every node has a unique name (the converter's node_block_list goes by name): a nameless
    top-level node gets the audit's label, op type + index ("Pow_3")."""
    out = copy.deepcopy(model)
    taken = {n.name for g in iter_graphs(out.graph) for n in g.node if n.name}
    count = 0
    for depth, graph in enumerate(iter_graphs(out.graph)):
        for i, node in enumerate(graph.node):
            if node.name:
                continue
            base = (
                f"{node.op_type}_{i}"
                if depth == 0
                else f"{graph.name or 'body'}/{node.op_type}_{i}"
            )
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            node.name = name
            taken.add(name)
            count += 1
    return out, count


def _float32_values(model: onnx.ModelProto) -> set[str]:
    """Names of the values (all graphs) whose inferred element type is float32: what the converter converts."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is best effort (custom ops): such a model's values stay unknown
        inferred = model
    out: set[str] = set()
    for graph in iter_graphs(inferred.graph):
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if t is not None and t.elem_type == onnx.TensorProto.FLOAT:
                out.add(vi.name)
        out.update(
            init.name for init in graph.initializer if init.data_type == onnx.TensorProto.FLOAT
        )
    return out


def _default_op_block_list() -> tuple[str, ...]:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return tuple(DEFAULT_OP_BLOCK_LIST)


def _converter_rounding(t: torch.Tensor, half: str) -> torch.Tensor:
    """`t` (float32) as the converter stores it for a half-precision node, back in float32: float16 clips to
    ±65504 and keeps tiny non-zero values at ±5.96e-8 (onnxruntime's convert_np_to_float16); bfloat16 clips
    to its own max likewise (float32's max, the `finfo.min` of attention masks, would round to inf: a mask
    (1 - m) * min would be 0 * -inf = NaN), then rounds."""
    if half == "float16":
        tiny = (t != 0) & (t.abs() < _MIN_POSITIVE)
        t = torch.where(tiny, torch.copysign(torch.full_like(t, _MIN_POSITIVE), t), t)
    top = _MAX_FINITE if half == "float16" else _BF16_MAX
    t = torch.where(torch.isfinite(t), t.clamp(-top, top), t)
    return t.to(_HALF[half]).to(t.dtype)


def convert_half(
    model: Any,
    keep: Iterable[str] = (),
    *,
    dtype: str = "float16",
    keep_io_types: bool = True,
    op_block_list: Sequence[str] | None = None,
) -> onnx.ModelProto:
    """`model` converted by onnxruntime's `convert_float_to_float16`, the nodes named in `keep` (and the op
    types of `op_block_list`, default the converter's DEFAULT_OP_BLOCK_LIST) left in float32.

    The converter rounds every kept node's output through float16 before a kept consumer reads it back
    (kept → Cast(float16) → Cast(float32) → kept), so a kept chain would still overflow: those Cast pairs
    are removed, as onnxconverter-common's `remove_unnecessary_cast_node` does. `dtype="bfloat16"`: the
    float16 model's half values retyped to bfloat16, its weights and literals rounded from the float32
    originals (the converter writes float16 only)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = _half_name(dtype)
    src = load_model(model)
    blocked = list(op_block_list) if op_block_list is not None else list(_default_op_block_list())
    out = convert_float_to_float16(
        copy.deepcopy(src),
        keep_io_types=keep_io_types,
        node_block_list=list(keep),
        op_block_list=blocked,
    )
    _merge_identical_nodes(out.graph)
    _one_output_cast(out.graph)
    _place_body_casts(out)
    _drop_cast_pairs(out)
    for graph in iter_graphs(out.graph):
        _sort_topologically(graph)
    if half == "bfloat16":
        _retype_bfloat16(out, src)
    return out


def _merge_identical_nodes(graph: onnx.GraphProto) -> None:
    """onnxruntime 1.31's converter writes one Cast per float32 consumer of a float16 value, all the same node
    (name, input and output): one of them is the graph 1.32's converter writes."""
    seen: set[bytes] = set()
    kept = []
    for node in graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            kept.append(node)
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _one_output_cast(graph: onnx.GraphProto) -> None:
    """A graph that lists an output twice (valid ONNX): keep_io_types makes the converter write one Cast to
    float32 per entry of the list (`graph_output_cast0`, `graph_output_cast1`), each writing the output, and
    only the last one's input is computed (the others read a value nothing writes). The one whose input is
    computed stays; the output is still listed twice."""
    defined = {x.name for x in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output if o}
    writers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if _cast_to(node) == onnx.TensorProto.FLOAT and re.fullmatch(r"graph_output_cast\d+", node.name):
            writers.setdefault(node.output[0], []).append(node)
    gone: set[int] = set()
    dangling: set[str] = set()
    for casts in writers.values():
        if len(casts) < 2:
            continue
        keep = next((n for n in casts if n.input[0] in defined), casts[-1])
        for n in casts:
            if n is not keep:
                gone.add(id(n))
                if n.input[0] not in defined:
                    dangling.add(n.input[0])
    if gone:  # (`writers` holds the nodes: the ids stay theirs)
        _delete(graph.node, lambda n: id(n) in gone)
        _delete(graph.value_info, lambda vi: vi.name in dangling)


def _place_body_casts(model: onnx.ModelProto) -> None:
    """onnxruntime's converter appends the Casts around a float32 node inside a body (an If branch, a Loop or
    Scan body) to the main graph, where the body's values are out of scope: the branch's output is then
    written by a node outside the branch, and onnxruntime refuses the model ("Graph output (t) does not exist
    in the graph"). Each Cast of the main graph that reads a value of a body goes into that body (with its
    value_info); one reading a value of the main graph stays, where every body sees what it writes."""
    top = model.graph
    home: dict[str, onnx.GraphProto] = {}  # a body's value -> the body
    for graph in list(iter_graphs(top))[1:]:
        names = [*(x.name for x in graph.input), *(t.name for t in graph.initializer)]
        names += [o for n in graph.node for o in n.output if o]
        home.update((x, graph) for x in names)
    infos = {vi.name: vi for vi in top.value_info}
    moved: list[onnx.NodeProto] = []
    todo = [n for n in top.node if n.op_type == "Cast" and n.input and n.output]
    while True:  # (a Cast reading what a moved Cast writes goes into its body too)
        now = [n for n in todo if n.input[0] in home]
        if not now:
            break
        for node in now:
            body = home[node.input[0]]
            body.node.append(node)
            home[node.output[0]] = body
            for x in (node.input[0], node.output[0]):
                if x in infos:
                    body.value_info.append(infos.pop(x))
        moved += now
        todo = [n for n in todo if all(n is not m for m in now)]
    if not moved:
        return
    ids = {id(n) for n in moved}  # (`moved` holds them: the ids stay theirs)
    _delete(top.node, lambda n: id(n) in ids)
    _delete(top.value_info, lambda vi: vi.name not in infos)


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """The converter appends its Casts at the end of the node list; ONNX wants producers first (stable:
    the model's order otherwise)."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    # a node's subgraphs may read outer values too: they are its inputs for the order
    needs = [
        {producer[x] for x in _reads(n) if x in producer and producer[x] != i}
        for i, n in enumerate(nodes)
    ]
    done: set[int] = set()
    order: list[int] = []
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            stack.extend((j, False) for j in sorted(needs[i], reverse=True) if j not in done)
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def _reads(node: onnx.NodeProto) -> list[str]:
    out = [x for x in node.input if x]
    for a in node.attribute:
        subs = (
            [a.g]
            if a.type == onnx.AttributeProto.GRAPH
            else list(a.graphs)
            if a.type == onnx.AttributeProto.GRAPHS
            else []
        )
        for sub in subs:
            out += [x for g_ in iter_graphs(sub) for n in g_.node for x in n.input if x]
    return out


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _to_half_cast(node: onnx.NodeProto) -> bool:
    """A Cast to float16 the converter inserted: after a kept node, or after a float32 graph input."""
    return _cast_to(node) == onnx.TensorProto.FLOAT16 and (
        node.name.endswith("_cast_to_fp16_node")
        or re.fullmatch(r"graph_input_cast\d+", node.name) is not None
    )


def _to_float_cast(node: onnx.NodeProto) -> bool:
    """A Cast to float32 the converter inserted: before a kept node, or before a float32 graph output."""
    return _cast_to(node) == onnx.TensorProto.FLOAT and (
        node.name.endswith("_cast_to_fp32_node")
        or re.fullmatch(r"graph_output_cast\d+", node.name) is not None
    )


def _drop_cast_pairs(model: onnx.ModelProto) -> None:
    """Removes the converter's Cast(float16) → Cast(float32) round trips between float32 values: the reader
    of the second Cast reads the first one's float32 input. In every graph: a body reads the main graph's
    values (the second Cast is in the first one's graph, or in a body of it)."""
    graphs = list(iter_graphs(model.graph))
    # (held to the end: protobuf gives the same node object while one is alive, so ids stay the nodes')
    nodes = [(n, g_) for g_ in graphs for n in g_.node]
    home = {id(n): g_ for n, g_ in nodes}
    producer = {o: n for n, _ in nodes for o in n.output}
    outputs = {o.name for g_ in graphs for o in g_.output}
    rename: dict[str, str] = {}  # value read -> the float32 value to read instead
    # float32 value -> the graph output its producer now writes
    renamed_outputs: dict[str, str] = {}
    drop: set[int] = set()
    for node, _ in nodes:
        first = producer.get(node.input[0]) if _to_float_cast(node) else None
        if first is None or not _to_half_cast(first):
            continue
        src = first.input[0]
        if node.output[0] in outputs:
            # the graph output: the kept node writes it itself (its name stays the model's), in its own graph
            src_node = producer.get(src)
            if (
                src_node is None
                or src in outputs
                or src in renamed_outputs
                or home[id(src_node)] is not home[id(node)]
            ):
                continue
            src_node.output[list(src_node.output).index(src)] = node.output[0]
            renamed_outputs[src] = node.output[0]
        else:
            rename[node.output[0]] = src
        drop.add(id(node))
    if not drop:
        return
    read: set[str] = set(outputs)
    for graph in graphs:
        _delete(graph.node, lambda n: id(n) in drop)
        for n in graph.node:
            for i, x in enumerate(n.input):
                x = rename.get(x, x)
                n.input[i] = renamed_outputs.get(x, x)
            read.update(n.input)
    # a to-half Cast nobody reads any more goes too
    live = {i.name for g_ in graphs for i in g_.input}
    for graph in graphs:
        _delete(graph.node, lambda n: _to_half_cast(n) and n.output[0] not in read)
        live.update(o for n in graph.node for o in n.output)
    for graph in graphs:
        _delete(graph.value_info, lambda vi: vi.name not in live)


def _delete(items: Any, gone: Callable[[Any], bool]) -> None:
    """Deletes the elements `gone` says of a repeated protobuf field in place: the others (a node whose body a
    caller holds) stay the same objects, as deleting and extending would not keep them."""
    for i in reversed([i for i, x in enumerate(items) if gone(x)]):
        del items[i]


def _retype_bfloat16(model: onnx.ModelProto, src: onnx.ModelProto) -> None:
    """The float16 model as bfloat16: types, Cast targets, and the half weights and literals rounded from
    their float32 originals."""
    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    originals = {t.name: t for t in src.graph.initializer}
    src_nodes = {n.name: n for g in iter_graphs(src.graph) for n in g.node if n.name}

    def bf16_tensor(orig: onnx.TensorProto, name: str) -> onnx.TensorProto:
        arr = torch.from_numpy(numpy_helper.to_array(orig).astype("float32"))
        arr = _converter_rounding(arr, "bfloat16")  # clipped to bfloat16's range, rounded (exact)
        t = onnx.TensorProto()
        t.name, t.data_type = name, bf16
        t.dims.extend(orig.dims)
        t.raw_data = arr.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        return t

    for graph in iter_graphs(model.graph):
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == f16:
                vi.type.tensor_type.elem_type = bf16
        for i, init in enumerate(graph.initializer):
            if init.data_type == f16 and init.name in originals:
                graph.initializer[i].CopyFrom(bf16_tensor(originals[init.name], init.name))
        for node in graph.node:
            for a in node.attribute:
                if a.name == "to" and a.type == onnx.AttributeProto.INT and a.i == f16:
                    a.i = bf16
                elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f16:
                    before = src_nodes[node.name].attribute if node.name in src_nodes else []
                    orig = next((b.t for b in before if b.name == a.name), None)
                    if orig is not None and orig.data_type == onnx.TensorProto.FLOAT:
                        a.t.CopyFrom(bf16_tensor(orig, a.t.name))
                    else:  # a value the converter made up (ConstantOfShape's default 0)
                        arr = torch.from_numpy(numpy_helper.to_array(a.t).astype("float32"))
                        a.t.CopyFrom(
                            bf16_tensor(numpy_helper.from_array(arr.numpy(), a.t.name), a.t.name)
                        )


def _half_name(dtype: Any) -> str:
    try:
        name = dtype_of(dtype).short
    except ValueError:
        name = ""
    if name not in _HALF:
        raise ValueError(f"dtype={dtype!r}: the conversion is to 'float16' or 'bfloat16'")
    return name


# ------------------------------------------------------------------------------------------------
# the simulation


class _Simulator:
    """The float32 model whose switchable nodes compute in float32 or in the half type, chosen per run.

    A half node runs its float32 kernel on half-precision tensors and rounds what it outputs to the half type:
    what the evaluator computes on the converted model, where the node's inputs and outputs are half and its
    attributes (a normalization's float32 stash type, ...) are the model's. Literals (Constant,
    ConstantOfShape) are clipped as the converter clips them. Initializers follow the converter: a half node
    reads one clipped and rounded, and so does a kept node when some half node reads the same initializer
    (the converter then stores it in the half type and casts it back for the kept node)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        half: str,
        candidates: frozenset[str],
        float32: set[str],
        *,
        keep_io_types: bool,
        device: str,
        missing: Literal["error", "ort"] = "error",
    ) -> None:
        self.half = half
        self.half_dtype = _HALF[half]
        self.keep_io_types = keep_io_types
        self.candidates = candidates
        self.float32 = float32
        initializers = {
            t.name: t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT
        }
        self.init_inputs: dict[str, list[tuple[int, str]]] = {}
        for graph in iter_graphs(model.graph):
            for node in graph.node:
                pos = [(i, x) for i, x in enumerate(node.input) if x in initializers]
                if pos:
                    self.init_inputs[node.name] = pos
        self.init_users: dict[str, set[str]] = {}
        for name, pos in self.init_inputs.items():
            for _, x in pos:
                self.init_users.setdefault(x, set()).add(name)
        switched = set(candidates) | set(self.init_inputs)
        plain = TorchEvaluator(model, device=device, check_model=False, missing=missing)
        kernels = {n.name: (n, k) for n, k, _ in plain.iter_kernels() if n.name in switched}
        #: the candidates onnxruntime runs (missing="ort"): its kernels may not take the half type
        self.on_ort = frozenset(n for n in candidates if isinstance(kernels[n][1], OrtKernel))
        #: node -> why it stays float32: onnxruntime refused to compute it in the half type (`probe`)
        self.no_half: dict[str, str] = {}
        self.probing = False
        self.rounded = _Rounded(initializers, half, device)
        self.lowered: frozenset[str] = frozenset()
        self.shared: frozenset[str] = frozenset()  # initializers stored in the half type this run
        #: with a dict: each half node's local rounding error (relative, at the output's scale) goes in
        self.local: dict[str, float] | None = None
        self.ev = TorchEvaluator(
            model,
            device=device,
            missing=missing,
            kernels={n: self._switch(*kernels[n]) for n in switched},
            check_model=False,
        )
        self.output_names = self.ev.output_names

    def _switch(self, node: onnx.NodeProto, plain: Any) -> Callable[..., Any]:
        name = node.name
        inits = self.init_inputs.get(name, [])
        dtype, half = self.half_dtype, self.half
        literal = node.op_type in ("Constant", "ConstantOfShape")
        back = tuple(o in self.float32 for o in node.output)

        def in_half(xs: Sequence[Any]) -> tuple[Any, ...]:
            try:
                outs = plain.run(*[_as(x, torch.float32, dtype) for x in xs])
            # the evaluator names the node; say what the simulation asked of it
            except Exception as exc:
                if self.probing and _refused_by_onnxruntime(exc):
                    text = str(exc).strip()
                    self.no_half[name] = text.splitlines()[0][:300] if text else type(exc).__name__
                    return tuple(plain.run(*xs))
                raise RuntimeError(
                    f"{node.op_type} node {name!r} cannot compute in {half} in the torch evaluator: {exc}"
                ) from exc
            return tuple(
                _rounded_output(o, dtype, literal, half) if b else o
                for o, b in zip(outs, back, strict=False)
            )

        def run(*xs: Any) -> Any:
            if name in self.lowered:
                args = list(xs)
                for pos, x in inits:
                    args[pos] = self.rounded[x]
                out = in_half(args)
                if self.local is not None:
                    self.local[name] = max(
                        self.local.get(name, 0.0), _local_error(out, plain.run(*xs))
                    )
                return out
            if inits and self.shared:
                args = list(xs)
                for pos, x in inits:
                    if x in self.shared:
                        args[pos] = self.rounded[x]
                return plain.run(*args)
            return plain.run(*xs)

        return run

    def probe(self, feeds: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """The nodes run on onnxruntime (missing="ort") that it refuses to compute in the half type (no
        kernel for it, or an op schema without the type: com.microsoft's CDist), each run in the half type on
        every input: they stay float32 whatever the list, as the converted model must keep them. Node -> the
        first line of onnxruntime's refusal."""
        if self.on_ort:
            self.probing = True
            try:
                for f in feeds:
                    self.run(f, self.on_ort)
            finally:
                self.probing = False
        return dict(self.no_half)

    def run(
        self, feeds: Mapping[str, Any], lowered: frozenset[str], observe: Any = None
    ) -> list[Any]:
        self.lowered = lowered
        self.shared = frozenset(x for x, users in self.init_users.items() if users & lowered)
        if not self.keep_io_types:  # the converted model takes and gives half-precision tensors
            feeds = {k: _round_to(v, self.half_dtype) for k, v in feeds.items()}
        outs = self.ev.run(None, feeds, observe=observe)
        if not self.keep_io_types:
            outs = [
                o.to(self.half_dtype)
                if isinstance(o, torch.Tensor) and o.is_floating_point()
                else o
                for o in outs
            ]
        return list(outs)


def _refused_by_onnxruntime(exc: BaseException) -> bool:
    """onnxruntime refused the node at this type: no kernel for it (NOT_IMPLEMENTED), or a schema without the
    type ("Type 'tensor(float16)' of input parameter (i0) of operator (CDist) ... is invalid")."""
    from ...engine.check import _from_onnxruntime
    from ...runtimes.ort import UnsupportedByProviderError

    return isinstance(exc, UnsupportedByProviderError) or _from_onnxruntime(exc)


class _Rounded(dict[str, torch.Tensor]):
    """Initializer name -> its value as the converter stores it for a half node, made on first use."""

    def __init__(
        self, initializers: Mapping[str, onnx.TensorProto], half: str, device: str
    ) -> None:
        super().__init__()
        self.initializers, self.half, self.device = initializers, half, device

    def __missing__(self, name: str) -> torch.Tensor:
        value = torch.from_numpy(numpy_helper.to_array(self.initializers[name]).copy()).to(
            self.device
        )
        self[name] = out = _converter_rounding(value, self.half)
        return out


def _as(x: Any, source: torch.dtype, target: torch.dtype) -> Any:
    """`x` (a tensor, or a sequence of them) with its `source`-typed tensors cast to `target`."""
    if isinstance(x, torch.Tensor):
        return x.to(target) if x.dtype == source else x
    if isinstance(x, list):
        return [_as(e, source, target) for e in x]
    return x


def _rounded_output(x: Any, half: torch.dtype, literal: bool, half_name: str) -> Any:
    """A half node's float32 output as the converted model holds it: rounded to the half type (a literal
    clipped as the converter clips it), back in float32 for the float32 nodes around it."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, half):
        return (
            _converter_rounding(x.float(), half_name) if literal else x.to(half).to(torch.float32)
        )
    if isinstance(x, list):
        return [_rounded_output(e, half, literal, half_name) for e in x]
    return x


def _round_to(x: Any, dtype: torch.dtype) -> Any:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t.to(dtype).to(t.dtype) if t.is_floating_point() else x


def _local_error(low: Sequence[Any], plain: Sequence[Any]) -> float:
    """max |half - float32| / max |float32| over a node's floating outputs (inf where only one is finite)."""
    worst = 0.0
    for a, b in zip(low, plain, strict=False):
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel()):
            continue
        a64, b64 = a.double(), b.double()
        if not torch.equal(torch.isfinite(a64), torch.isfinite(b64)):
            return math.inf
        fin = torch.isfinite(b64)
        if not bool(fin.any()):
            continue
        scale = float(b64[fin].abs().max()) or 1.0
        worst = max(worst, float((a64[fin] - b64[fin]).abs().max()) / scale)
    return worst


# ------------------------------------------------------------------------------------------------
# the search


@dataclass(frozen=True)
class _Check:
    passed: bool
    max_abs: float
    violation: str
    report: DiffReport | None
    sample: int | None  # the input that broke it


class _Search:
    """Judges keep lists in the simulation (cached), grows one until it passes, then prunes it."""

    def __init__(
        self,
        sim: _Simulator,
        feeds: Sequence[Mapping[str, Any]],
        oracle: Sequence[list[Any]],
        checker: Checker,
        max_runs: int | None,
        report: AuditReport,
    ) -> None:
        self.sim = sim
        self.feeds = feeds
        self.oracle = oracle
        self.checker = checker
        self.judge = _judge(checker, oracle, sim.output_names)
        self.max_runs = max_runs
        self.runs = 0
        self.cache: dict[frozenset[str], _Check] = {}
        self.order = list(range(len(feeds)))  # inputs, the last to break a list first
        self.best: frozenset[str] | None = None
        self.audit = {n.node_name or n.name: n for n in report.nodes}
        nodes = [n for graph in iter_graphs(sim.ev.model.graph) for n in graph.node]
        self.producer = {o: n.name for n in nodes for o in n.output if o}
        self.inputs = {n.name: [x for x in n.input if x] for n in nodes}
        self.consumers: dict[str, set[str]] = {}
        for n in nodes:
            for x in n.input:
                if x in self.producer:
                    self.consumers.setdefault(self.producer[x], set()).add(n.name)

    # -- judging -------------------------------------------------------------------------------
    def check(self, keep: frozenset[str]) -> _Check:
        """Does the mixed model with `keep` in float32 meet the tolerance on every input? Stops at the
        first input that breaks it (the inputs that broke a list are tried first)."""
        cached = self.cache.get(keep)
        if cached is not None:
            return cached
        lowered = self.sim.candidates - keep
        worst: tuple[float, DiffReport | None] = (-1.0, None)
        result: _Check | None = None
        for i in list(self.order):
            if self.max_runs is not None and self.runs >= self.max_runs:
                raise _OutOfRuns
            self.runs += 1
            report, violations = self.judge(i, self.sim.run(self.feeds[i], lowered))
            err = _error(report)
            if violations:
                self.order.remove(i)
                self.order.insert(0, i)
                result = _Check(False, err, violations[0], report, i)
                break
            if err > worst[0]:
                worst = (err, report)
        if result is None:
            result = _Check(True, worst[0], "", worst[1], None)
            if self.best is None or len(keep) < len(self.best):
                self.best = keep
        self.cache[keep] = result
        return result

    def passes(self, keep: frozenset[str]) -> bool:
        return self.check(keep).passed

    def measure(self, keep: frozenset[str]) -> _Check:
        """`check` on every input, for the report: the worst input's error, not the first that breaks it."""
        first = self.check(keep)
        if first.passed:
            return first
        lowered = self.sim.candidates - keep
        worst = first
        for i in range(len(self.feeds)):
            if i == first.sample:
                continue
            if self.max_runs is not None and self.runs >= self.max_runs:
                raise _OutOfRuns
            self.runs += 1
            report, violations = self.judge(i, self.sim.run(self.feeds[i], lowered))
            err = _error(report)
            if violations and err > worst.max_abs:
                worst = _Check(False, err, violations[0], report, i)
        return worst

    # -- growing -------------------------------------------------------------------------------
    def closure(self, keep: set[str]) -> set[str]:
        """`keep` and the consumers of its nodes whose float32 values overflow the half type: reading them
        through a Cast to the half type would overflow again."""
        out = set(keep)
        stack = list(keep)
        while stack:
            name = stack.pop()
            a = self.audit.get(name)
            if a is None or a.overflow <= a.sentinel:
                continue
            for c in self.consumers.get(name, ()):
                if c in self.sim.candidates and c not in out:
                    out.add(c)
                    stack.append(c)
        return out

    def diagnose(self, keep: frozenset[str], i: int) -> tuple[set[str], dict[str, float]]:
        """One observed run of input `i`: the nodes where NaN/Inf start that float32 does not make (the
        origins), and every half node's local rounding error."""
        bad: set[str] = set()
        origins: set[str] = set()
        audit = self.audit

        def observe(node: onnx.NodeProto, outputs: Mapping[str, Any]) -> None:
            a = audit.get(node.name)
            if a is not None and a.nan_inf > 0:
                return  # float32 makes NaN/Inf here too
            new = [
                n
                for n, v in outputs.items()
                if isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and not bool(torch.isfinite(v).all())
            ]
            if not new:
                return
            if not any(x in bad for x in node.input):
                origins.add(node.name)
            bad.update(new)

        self.sim.local = {}
        try:
            if self.max_runs is not None and self.runs >= self.max_runs:
                raise _OutOfRuns
            self.runs += 1
            self.sim.run(self.feeds[i], self.sim.candidates - keep, observe=observe)
            local = self.sim.local
        finally:
            self.sim.local = None
        found: set[str] = set()
        for name in origins:
            if name in keep:  # kept, yet NaN/Inf: its half inputs were rounded too far
                found.update(
                    p
                    for x in self.inputs.get(name, ())
                    if (p := self.producer.get(x)) in self.sim.candidates and p not in keep
                )
            elif name in self.sim.candidates:
                found.add(name)
        return found, local

    def grow(self, keep: set[str]) -> set[str]:
        """Adds nodes until the simulated model passes: where NaN/Inf start, else the half nodes with the
        largest local rounding error, 1, 2, 4, ... at a time."""
        batch = 1
        keep = self.closure(keep)
        while True:
            result = self.check(frozenset(keep))
            if result.passed:
                return keep
            if keep >= self.sim.candidates:
                raise _Unreachable(result)
            assert result.sample is not None
            origins, local = self.diagnose(frozenset(keep), result.sample)
            new = origins - keep
            if new:
                keep = self.closure(keep | new)
                continue
            ranked = sorted((n for n in local if n not in keep), key=lambda n: -local[n])
            if not ranked:
                ranked = sorted(self.sim.candidates - keep)
            keep = self.closure(keep | set(ranked[:batch]))
            batch *= 2

    # -- pruning -------------------------------------------------------------------------------
    def prune(self, keep: set[str]) -> tuple[set[str], dict[str, str]]:
        """Drops what the tolerance does not need: whole chains of kept nodes first (the connected parts of
        the list), then node by node until none can go: a 1-minimal list. Returns it with, per node, the
        error without it."""
        for part in sorted(self._parts(keep), key=len, reverse=True):
            if len(part) < len(keep) and self.passes(frozenset(keep - part)):
                keep = keep - part
        why: dict[str, str] = {}
        changed = True
        while changed:
            changed = False
            for name in sorted(keep, key=self._position):
                result = self.check(frozenset(keep - {name}))
                if result.passed:
                    keep = keep - {name}
                    changed = True
                    break
                why[name] = _why(result)
        return keep, {n: why[n] for n in keep if n in why}

    def _parts(self, keep: set[str]) -> list[set[str]]:
        parts: list[set[str]] = []
        seen: set[str] = set()
        for start in sorted(keep, key=self._position):
            if start in seen:
                continue
            part, stack = set(), [start]
            while stack:
                n = stack.pop()
                if n in part:
                    continue
                part.add(n)
                near = set(self.consumers.get(n, ())) | {
                    p for x in self.inputs.get(n, ()) if (p := self.producer.get(x)) is not None
                }
                stack.extend(near & keep - part)
            seen |= part
            parts.append(part)
        return parts

    def _position(self, name: str) -> int:
        a = self.audit.get(name)
        return a.index if a is not None else 1 << 30


class _Unreachable(Exception):
    def __init__(self, result: _Check) -> None:
        super().__init__(result.violation)
        self.result = result


def _error(report: DiffReport) -> float:
    return math.inf if report.nan_mismatch or report.inf_mismatch else float(report.max_abs)


def _why(result: _Check) -> str:
    if result.report is not None and (result.report.nan_mismatch or result.report.inf_mismatch):
        r = result.report
        return f"{r.nan_mismatch + r.inf_mismatch:,} of {r.n:,} output elements NaN/Inf"
    return f"max abs error {g(result.max_abs)} ({result.violation.split(': ', 1)[-1]})"


# ------------------------------------------------------------------------------------------------
# verification: the converted model, on onnxruntime and in float16 arithmetic


def _feeds_list(
    feeds_iter: Mapping[str, Any] | Iterable[Mapping[str, Any]], what: str
) -> list[Mapping[str, Any]]:
    batches = [feeds_iter] if isinstance(feeds_iter, Mapping) else list(feeds_iter)
    for feeds in batches:
        if not isinstance(feeds, Mapping):
            raise TypeError(
                f"{what}: feeds_iter yields a {type(feeds).__name__}; it must yield dicts input name -> tensor (or be one dict)"
            )
    if not batches:
        raise ValueError(
            f"{what}: feeds_iter yielded no feeds; pass one dict of inputs or an iterable of them"
        )
    return batches


def _oracle(
    model: onnx.ModelProto, feeds: Sequence[Mapping[str, Any]], device: str, missing: Literal["error", "ort"] = "error"
) -> list[list[Any]]:
    ev = TorchEvaluator(model, device=device, compute_dtype=torch.float64, check_model=False, missing=missing)
    return [list(ev.run(None, f)) for f in feeds]


def _half_feeds(feeds: Mapping[str, Any], half: torch.dtype, keep_io_types: bool) -> dict[str, Any]:
    if keep_io_types:
        return dict(feeds)
    out = {}
    for k, v in feeds.items():
        t = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
        out[k] = t.to(half) if t.is_floating_point() else v
    return out


def _run_outcome(
    title: str,
    run: Callable[[Mapping[str, Any]], list[Any]],
    feeds: Sequence[Mapping[str, Any]],
    judge: _Judge,
) -> Outcome:
    worst: Outcome | None = None
    for i, f in enumerate(feeds):
        report, violations = judge(i, run(f))
        err = _error(report)
        o = Outcome(title, not violations, err, violations[0] if violations else "", report)
        if worst is None or (not o.passed, err) > (not worst.passed, worst.max_abs):
            worst = o
    assert worst is not None
    return worst


_Judge = Callable[[int, Sequence[Any]], tuple["DiffReport", list[str]]]


def _verify(
    converted: onnx.ModelProto,
    inputs: Sequence[Mapping[str, Any]],
    judge: _Judge,
    provider: str,
    device: str,
    half: str,
    keep_io_types: bool,
    missing: Literal["error", "ort"] = "error",
) -> tuple[Outcome, Outcome]:
    """The converted model against the oracle: on onnxruntime (the provider), and in the torch evaluator,
    which computes its half-precision nodes in half precision."""
    from ...engine.check import UnsupportedByProvider
    from ...runtimes.ort import OrtRunner, UnsupportedByProviderError

    feeds = [_half_feeds(f, _HALF[half], keep_io_types) for f in inputs]
    data = converted.SerializeToString()
    title = f"onnxruntime {provider}"
    try:
        runner = OrtRunner(data, provider=provider)
        ort = _run_outcome(title, lambda f: runner.run(None, f), feeds, judge)
    except (UnsupportedByProviderError, UnsupportedByProvider) as exc:
        ort = Outcome(
            title,
            False,
            violation=f"onnxruntime {provider} has no {half} kernel for {getattr(exc, 'op', '?')}",
            ran=False,
        )
    # onnxruntime refusing the converted model is a finding, reported in one line
    except Exception as exc:
        ort = Outcome(
            title,
            False,
            violation=f"onnxruntime {provider} cannot run it: {str(exc).strip().splitlines()[0][:200]}",
            ran=False,
        )
    ev = TorchEvaluator(converted, device=device, check_model=False, missing=missing)
    arith = _run_outcome(f"{half} arithmetic", lambda f: list(ev.run(None, f)), feeds, judge)
    return ort, arith


def _ort_upcasts(converted: onnx.ModelProto, half: str) -> tuple[int, int, tuple[str, ...]]:
    """How onnxruntime's CPU provider runs the converted model: (half-precision nodes it computes in float32,
    half-precision nodes, their op types), read from the graph it holds after loading (where it inserted
    Casts around the nodes it has no half-precision kernel for)."""
    import os
    import tempfile

    import onnxruntime

    code = _ONNX_HALF[half]

    def half_nodes(model: onnx.ModelProto) -> dict[str, str]:
        types = {
            vi.name: vi.type.tensor_type.elem_type
            for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]
        }
        types.update({t.name: t.data_type for t in model.graph.initializer})
        return {
            n.name: n.op_type
            for n in model.graph.node
            if n.op_type != "Cast" and any(types.get(x) == code for x in [*n.input, *n.output])
        }

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "loaded.onnx")
        onnxruntime.InferenceSession(
            converted.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        loaded = onnx.load(options.optimized_model_filepath)
    before = half_nodes(onnx.shape_inference.infer_shapes(converted))
    after = half_nodes(onnx.shape_inference.infer_shapes(loaded))
    upcast = {name: op for name, op in before.items() if name not in after}
    return len(upcast), len(before), tuple(sorted(set(upcast.values())))


def _upcast_notes(converted: onnx.ModelProto, half: str, *, always: bool = False) -> tuple[str, ...]:
    """The note on the float16 nodes onnxruntime's CPU provider computes in float32 (when there are any, or
    `always`); when that cannot be told — the graph onnxruntime loads is read back from a temporary file, and
    the temporary directory may be full or unwritable — a short note saying so instead: an optional note is
    never worth the finished search's result."""
    try:
        upcast, total, ops = _ort_upcasts(converted, half)
    except Exception as exc:  # whatever onnxruntime, the file system or onnx.load raise: the note only is lost
        text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)).strip()
        why = (text.splitlines()[0] if text else type(exc).__name__)[:200]
        return (
            "not told whether onnxruntime's CPU provider computes some float16 nodes in float32: reading the graph "
            f"it loads needs a file in the temporary directory, which failed ({why}); free space there or point "
            "TMPDIR elsewhere to have this note",
        )
    return (_upcast_note(upcast, total, ops, "of the converted model"),) if upcast or always else ()


def _upcast_note(upcast: int, total: int, ops: Sequence[str], what: str) -> str:
    shown = ", ".join(ops[:8]) + (", ..." if len(ops) > 8 else "")
    return (
        f"onnxruntime's CPU provider computes {upcast} of the {total} float16 nodes {what} in float32 (it has no "
        f"float16 kernel for {shown} and inserts Casts when it loads the model): a model that overflows float16 can "
        "pass there; 'float16 arithmetic' (the torch evaluator on the converted model) is what a provider with "
        "float16 kernels (CUDA) computes"
    )


def _judge(checker: Checker, oracle: Sequence[Sequence[Any]], names: Sequence[str]) -> _Judge:
    """judge(i, got): the DiffReport of outputs `got` of input `i` against the oracle (cast to their dtypes)
    and the rules it breaks."""

    def judge(i: int, got: Sequence[Any]) -> tuple[DiffReport, list[str]]:
        expected = [
            o.to(t.dtype)
            if isinstance(o, torch.Tensor) and o.is_floating_point() and t.is_floating_point()
            else o
            for o, t in zip(oracle[i], got, strict=True)
        ]
        report = checker.compare(expected, list(got), names=names)
        return report, [str(v) for v in checker.tolerance.check(report)]

    return judge


def range_only_list(report: AuditReport) -> tuple[str, ...]:
    """The range-only rule as transformer-deploy applies it (its `get_keep_fp32_nodes`): the
    nodes `find_node_fp32` flags (`range_flagged`), each followed by the consumer of its output that
    transformer-deploy keeps with it ("they will receive FP32 values as input"; its mapping from a value to
    its reader keeps the last reader in graph order, so one consumer per node). Graph order, no repeats."""
    flagged = set(range_flagged(report))
    out: dict[str, None] = {}
    for n in report.nodes:
        name = n.node_name or n.name
        if name in flagged:
            out[name] = None
            if n.consumers:
                out[n.consumers[-1][1]] = None
    return tuple(out)


def range_flagged(report: AuditReport) -> tuple[str, ...]:
    """transformer-deploy's `find_node_fp32` over the audited inputs: every
    node one of whose float32 output elements, on some input, is beyond float16's max (|x| > 65504, ±inf
    included) or non-zero and below 5.96e-8 in magnitude (float16's smallest subnormal: it rounds to 0 or
    to that). NaN alone does not count (its comparisons are false there too). The thresholds are float16's
    whatever the half type: the tool has no other."""
    return tuple(
        n.node_name or n.name
        for n in report.nodes
        if n.audited
        and (
            n.inf > 0
            or (n.absmax is not None and n.absmax > _MAX_FINITE)
            or (n.min_nonzero is not None and n.min_nonzero < _MIN_POSITIVE)
        )
    )


def _not_full_precision_count(report: AuditReport) -> int:
    """Nodes with a float32 output element the half type does not hold at full precision on some input:
    overflow, underflow to 0, a subnormal, or NaN/Inf (a broader count than transformer-deploy's rule)."""
    return sum(
        1
        for n in report.nodes
        if n.audited and (n.overflow or n.underflow_zero or n.subnormal or n.nan_inf)
    )


# ------------------------------------------------------------------------------------------------
# the entry point


def keep_float32(
    model: Any,
    feeds_iter: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    dtype: str = "float16",
    tolerance: ToleranceLike = None,
    keep_io_types: bool = True,
    provider: str = "CPU",
    max_runs: int | None = None,
    audit_report: AuditReport | None = None,
    missing: Literal["error", "ort"] = "error",
) -> KeepReport:
    """The smallest set of nodes to keep in float32 so that the `dtype` conversion of the float32 `model`
    meets `tolerance` against the float64 oracle on every input of `feeds_iter` (one dict or an iterable).

    The search runs in the torch evaluator's simulation of the mixed model (see the module docstring). It
    starts from the audit's flagged nodes (`audit_report`, else `audit(model, feeds, dtype=dtype)`) and the
    consumers of their overflowing values; while the tolerance breaks, it adds the nodes where NaN/Inf
    start, else the nodes with the largest local rounding error (1, 2, 4, ... at a time). Then it prunes:
    whole chains of kept nodes, then node by node until no single node can go. The list is **1-minimal in
    the simulation**: dropping any one of its nodes breaks the tolerance on some input (each is checked, and
    `why` says by how much); it is not proven the globally smallest (that search is exponential).

    The list is then verified on the model converted with onnxruntime's `convert_float_to_float16`
    (`node_block_list`, `keep_io_types`; see `convert_half`), run on onnxruntime on `provider` and in the
    torch evaluator (half-precision nodes in half precision), both against the oracle. The report compares
    it with the op-type block list (`OP_TYPE_BLOCK_LIST`) and the range-only rule (`range_only_list`) on the
    same model and inputs. `tolerance`: a Tolerance, a dict of its arguments or (atol, rtol), resolved for
    `dtype` (None: its default atol/rtol). A tolerance the model cannot meet with every node in float32 ends
    "unreachable"; a search past `max_runs` evaluator runs ends "stopped" with the best list it verified.
    `missing="ort"`: the ops the torch evaluator has no kernel for run on onnxruntime (TorchEvaluator's `missing`).
    """
    half = _half_name(dtype)
    checker = Checker(provider, half, tolerance=tolerance)
    src = load_model(model)
    check_model(src)
    named, renamed = _named(src)
    feeds = _feeds_list(feeds_iter, "keep_float32")
    device = checker.device
    oracle = _oracle(named, feeds, device, missing)
    # every output empty: no list can be judged, and "nothing to keep" would read as a pass
    refuse_empty("keep_float32", named, oracle, feeds)
    report = (
        audit_report if audit_report is not None else audit(named, feeds, dtype=half, device=device, missing=missing)
    )
    nodes = _Nodes.of(named)
    sim = _Simulator(named, half, nodes.candidates, nodes.floats, keep_io_types=keep_io_types, device=device, missing=missing)
    no_half = sim.probe(feeds)  # nodes onnxruntime runs and cannot run in the half type: float32, whatever the list
    if no_half:
        nodes = replace(nodes, candidates=nodes.candidates - set(no_half), forced=tuple(no_half))
        sim.candidates = nodes.candidates
    search = _Search(sim, feeds, oracle, checker, max_runs, report)
    flagged = tuple(
        n.node_name or n.name for n in report.flagged if (n.node_name or n.name) in nodes.candidates
    )
    status, minimality, keep, why = _search_list(search, flagged, max_runs)
    keep_tuple = tuple(sorted(keep, key=search._position))
    lists = _Lists(nodes, search, named, half, checker, keep_io_types, missing)
    results, status, converted_ours = _compared_lists(lists, status, keep_tuple, report)
    return KeepReport(
        model=named.graph.name or "model",
        dtype=half,
        provider=checker.provider,
        tolerance=checker.tolerance,
        keep_io_types=keep_io_types,
        inputs=len(feeds),
        nodes=len(nodes.all_nodes),
        candidates=len(nodes.candidates),
        keep=keep_tuple,
        status=status,
        minimality=minimality,
        why=why,
        start=flagged,
        runs=search.runs,
        subsets=len(search.cache),
        results=tuple(results),
        always_float32=tuple(n.name for n in nodes.all_nodes if n.op_type in nodes.default_blocked or n.name in no_half),
        ops={n.name: n.op_type for n in nodes.all_nodes if n.name in keep},
        named=renamed,
        notes=(*_no_half_notes(nodes, no_half, half), *_keep_notes(checker.provider, half, status, converted_ours)),
        audit=report,
        _converted=converted_ours if status in ("verified", "nothing to keep", "stopped") else None,
    )


def _search_list(search: _Search, flagged: tuple[str, ...], max_runs: int | None) -> tuple[str, str, set[str], dict[str, str]]:
    """The search in simulation: nothing to keep, or a list grown from the `flagged` nodes and pruned to
    1-minimal; else why it ended without one (the tolerance unreachable, `max_runs` spent). Its status,
    its minimality in words, the list, and why each node of it stays."""
    status, minimality = "not verified", ""
    why: dict[str, str] = {}
    keep: set[str] = set()
    try:
        if search.passes(frozenset()):
            status, minimality = "nothing to keep", "empty"
        else:
            keep = search.grow(set(flagged))
            keep, why = search.prune(keep)
            minimality = "1-minimal (dropping any one of them breaks the tolerance, simulated)"
    except _Unreachable as exc:
        status = "unreachable"
        minimality = (
            f"the tolerance cannot be met even with every node in float32: {exc.result.violation}; "
            "loosen it (budget=, atol=, rtol=) or compare against the float32 model instead"
        )
    except _OutOfRuns:
        status = "stopped"
        best = search.best
        keep = set(best) if best is not None else set()
        minimality = (
            f"the search stopped at max_runs={max_runs} evaluator runs"
            + (
                f"; the smallest passing list it simulated has {len(keep)} nodes, not shown minimal"
                if best is not None
                else " before any list passed"
            )
            + "; raise max_runs"
        )
    return status, minimality, keep, why


@dataclass(frozen=True)
class _Nodes:
    """The model's nodes (its bodies' too), the op types the converter keeps in float32 whatever the list, its
    float32 values, and the nodes a list may keep: not of those op types, not control flow, touching a float32 value."""

    all_nodes: list[onnx.NodeProto]
    default_blocked: set[str]
    floats: set[str]
    candidates: frozenset[str]
    #: nodes kept in float32 in every conversion besides the converter's op types: onnxruntime runs them and has
    #: no half-precision kernel for them
    forced: tuple[str, ...] = ()

    @classmethod
    def of(cls, named: onnx.ModelProto) -> _Nodes:
        floats = _float32_values(named)
        default_blocked = set(_default_op_block_list())
        all_nodes = [n for g_ in iter_graphs(named.graph) for n in g_.node]
        candidates = frozenset(
            n.name
            for n in all_nodes
            if n.op_type not in default_blocked
            and not has_subgraph(n)
            and any(x in floats for x in [*n.input, *n.output] if x)
        )
        return cls(all_nodes, default_blocked, floats, candidates)


class _Lists:
    """The keep lists the report compares, each simulated by the search, converted with onnxruntime's
    converter and verified (`result`)."""

    def __init__(self, nodes: _Nodes, search: _Search, named: onnx.ModelProto, half: str, checker: Checker, keep_io_types: bool, missing: Literal["error", "ort"]) -> None:
        self.nodes, self.search, self.named, self.half, self.checker = nodes, search, named, half, checker
        self.keep_io_types, self.missing = keep_io_types, missing

    def result(
        self, method: str, rule: str, nodes: Sequence[str], *, op_block: Sequence[str] | None = None
    ) -> tuple[ListResult, onnx.ModelProto]:
        """The list `nodes` (or every node of the op types `op_block`) simulated, then converted and verified on
        onnxruntime and in half arithmetic; and the converted model."""
        search = self.search
        blocked_ops = set(op_block or ())
        kept = frozenset(nodes) | frozenset(
            n.name for n in self.nodes.all_nodes if n.op_type in blocked_ops and n.name in self.nodes.candidates
        )
        try:
            simulated = search.measure(kept & self.nodes.candidates)
            sim_outcome = Outcome(
                "simulated",
                simulated.passed,
                simulated.max_abs,
                simulated.violation,
                simulated.report,
            )
        except _OutOfRuns:
            sim_outcome = Outcome(
                "simulated", False, violation="not simulated: max_runs spent", ran=False
            )
        ops = sorted(self.nodes.default_blocked | blocked_ops)
        converted = convert_half(
            self.named, [*nodes, *self.nodes.forced], dtype=self.half, keep_io_types=self.keep_io_types, op_block_list=ops
        )
        ort, arith = _verify(
            converted, search.feeds, search.judge, self.checker.provider, self.checker.device, self.half, self.keep_io_types, self.missing
        )
        shown = (
            tuple(nodes)
            if op_block is None
            else tuple(n.name for n in self.nodes.all_nodes if n.op_type in blocked_ops)
        )
        return ListResult(method, rule, shown, (sim_outcome, ort, arith)), converted


def _compared_lists(
    lists: _Lists, status: str, keep: tuple[str, ...], report: AuditReport
) -> tuple[list[ListResult], str, onnx.ModelProto | None]:
    """The search's list (unless unreachable) and the three it is compared with (the op-type block list, the
    range-only rule, no list), each verified; the status once the search's list is verified, and its
    converted model (None where it did not verify a stopped search's list)."""
    half = lists.half
    results = []
    converted_ours: onnx.ModelProto | None = None
    if status != "unreachable":
        ours, converted_ours = lists.result("keep_float32", _RULES[status], keep)
        results.append(ours)
        if status == "not verified" and ours.verified:
            status = "verified"
        if status == "nothing to keep" and not ours.verified:
            status = "not verified"
        if status == "stopped" and not ours.verified:
            converted_ours = None
    else:
        results.append(ListResult("keep_float32", "no list meets the tolerance", (), ()))
    op_nodes = ", ".join(OP_TYPE_BLOCK_LIST)
    results.append(
        lists.result(
            "op-type block list",
            f"every {op_nodes} node (onnxruntime's T5 demo list)",
            (),
            op_block=OP_TYPE_BLOCK_LIST,
        )[0]
    )
    ranged = range_only_list(report)
    results.append(
        lists.result(
            "range-only rule",
            f"every node with a float32 output element beyond float16's ±65504 or non-zero below float16's 5.96e-08 on some input "
            f"({len(range_flagged(report))}: transformer-deploy's find_node_fp32"
            + ("; float16's thresholds: the tool has none for bfloat16" if half != "float16" else "")
            + "), and the consumer of each that transformer-deploy's get_keep_fp32_nodes keeps with it; "
            f"{_not_full_precision_count(report)} nodes hold a value {half} does not hold at full precision (subnormals included)",
            ranged,
        )[0]
    )
    results.append(lists.result("no list", "the converter's defaults", ())[0])
    return results, status, converted_ours


def _no_half_notes(nodes: _Nodes, no_half: Mapping[str, str], half: str) -> tuple[str, ...]:
    """The note on the nodes kept in float32 because onnxruntime cannot compute them in the half type."""
    if not no_half:
        return ()
    ops = {n.name: (f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in nodes.all_nodes}
    named = ", ".join(f"{name!r} ({ops.get(name, '?')})" for name in list(no_half)[:4]) + (", ..." if len(no_half) > 4 else "")
    first = next(iter(no_half.values()))
    return (
        f"kept in float32 in every list: {len(no_half)} node{'s' if len(no_half) != 1 else ''} run on onnxruntime (missing='ort') "
        f"that it cannot compute in {half}: {named} (onnxruntime: {first})",
    )


def _keep_notes(provider: str, half: str, status: str, converted: onnx.ModelProto | None) -> tuple[str, ...]:
    """What the report notes besides its lists: the Casts onnxruntime's CPU provider adds around float16
    nodes, bfloat16's rounding, a simulation the converted model disagrees with."""
    notes: list[str] = []
    if provider == "CPU" and half == "float16" and converted is not None:
        notes += _upcast_notes(converted, half)
    if half == "bfloat16":
        notes.append(
            "bfloat16 keeps float32's range: overflow is float16's problem, bfloat16's is rounding (8 significant bits)"
        )
    if status == "not verified":
        notes.append(
            "the simulation and the converted model disagree: the list passes in simulation only; see the columns"
        )
    return tuple(notes)


# ------------------------------------------------------------------------------------------------
# the test-time check and the command line's budget


@dataclass(frozen=True)
class ConversionCheck:
    """`check_conversion`'s verdict on the plain conversion (no keep list): its outcomes on onnxruntime and
    in half arithmetic, and when it breaks the tolerance the audit and the keep list that fixes it."""

    dtype: str
    provider: str
    tolerance: Tolerance
    outcomes: tuple[Outcome, ...]
    keep: KeepReport | None = None
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes if o.ran)

    @property
    def worst(self) -> Outcome:
        ran = [o for o in self.outcomes if o.ran and o.report is not None]
        return max(ran, key=lambda o: (not o.passed, o.max_abs))

    def render(self) -> str:
        lines = [
            f"ortdiff: {self.dtype} conversion on {self.provider}: {'passed' if self.passed else 'tolerance broken'} ({self.tolerance.describe()})"
        ]
        lines += [
            f"  {o.runtime}: "
            + (
                f"max abs {g(o.max_abs)}" + (f"; {o.violation}" if o.violation else "")
                if o.ran
                else o.violation
            )
            for o in self.outcomes
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if not self.passed:
            w = self.worst
            if w.report is not None:
                lines.append(w.report.render())
        if self.keep is not None:
            if self.keep.audit is not None:
                lines += ["", self.keep.audit.render()]
            lines += ["", self.keep.render()]
        return "\n".join(lines)

    def rows(self) -> tuple[CheckRow, ...]:
        w = self.worst
        assert w.report is not None
        return (
            row_for(
                w.report,
                self.tolerance,
                self.passed,
                provider=self.provider,
                dtype=self.dtype,
                suffix=f" [{self.dtype} conversion]",
            ),
        )


def check_conversion(
    model: Any,
    feeds_iter: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    dtype: str = "float16",
    tolerance: ToleranceLike = None,
    keep_io_types: bool = True,
    provider: str = "CPU",
    search: bool = True,
) -> ConversionCheck:
    """The float32 `model` converted to `dtype` as it is (the converter's defaults), run on onnxruntime on
    `provider` and in half arithmetic against the float64 oracle; when it breaks `tolerance` and `search`,
    the audit and `keep_float32`'s list come with the verdict."""
    half = _half_name(dtype)
    checker = Checker(provider, half, tolerance=tolerance)
    src = load_model(model)
    check_model(src)
    named, _ = _named(src)
    feeds = _feeds_list(feeds_iter, "check_conversion")
    oracle = _oracle(named, feeds, checker.device)
    names = [o.name for o in named.graph.output]
    refuse_empty("check_conversion", named, oracle, feeds)

    judge = _judge(checker, oracle, names)
    converted = convert_half(named, (), dtype=half, keep_io_types=keep_io_types)
    ort, arith = _verify(
        converted, feeds, judge, checker.provider, checker.device, half, keep_io_types
    )
    notes: tuple[str, ...] = ()
    if checker.provider == "CPU" and half == "float16" and ort.passed and not arith.passed:
        notes = _upcast_notes(converted, half, always=True)
    verdict = ConversionCheck(half, checker.provider, checker.tolerance, (ort, arith), notes=notes)
    if verdict.passed or not search:
        return verdict
    keep = keep_float32(
        named,
        feeds,
        dtype=half,
        tolerance=checker.tolerance,
        keep_io_types=keep_io_types,
        provider=provider,
    )
    return ConversionCheck(half, checker.provider, checker.tolerance, (ort, arith), keep, notes)
