"""Two graphs of one function side by side: each run's values fingerprinted as they are computed, aligned
by an edit distance and compared pair by pair; and which onnxruntime optimization level moved the numbers."""

from __future__ import annotations

import math
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx.helper
import torch

from ..engine.check import CheckFailed, row_for
from ..numerics.diff import DEFAULT_THRESHOLDS, DiffReport, compare
from ..numerics.dtypes import dtype_of
from ..numerics.formatting import g, table
from ..numerics.results import CheckRow
from ..numerics.tolerance import Tolerance, Violation
from ..runtimes.model_io import (
    CheckedModel,
    check_feeds,
    check_model,
    compute_dtype,
    input_specs,
    load_model,
    model_path,
)

__all__ = [
    "LEVELS",
    "Alignment",
    "DeploymentMoved",
    "DeploymentReport",
    "FusedNode",
    "LevelChange",
    "OptimizationReport",
    "Row",
    "Value",
    "check_deployment",
    "check_optimization",
    "compare_executions",
    "optimized_model",
]

#: onnxruntime's graph optimization levels, from none to all
LEVELS = ("disable", "basic", "extended", "all")

AlignRuntime = Literal["ort", "torch"]

# -- the edit distance's costs, in integers so that the DP's sums are exact ----------------------------
_GAP = 650  # a value only one of the two runs has: two cost less than pairing unlike values
_KIND = 1000  # an input against a computed value
_DTYPE_OTHER_FLOAT = 100  # float32 against float16: the same value, converted
_DTYPE_OTHER = 1000  # a float against an integer
_SHAPE_RESHAPED = 400  # as many elements, another shape
_SHAPE_OTHER = 1000  # another number of elements
_OP = 300  # another operator (GatherND vs Gather, a fused node vs the node it replaced)
_NAME = 100  # another name: a tie-breaker between values alike in all else
_STATS = 600  # x the distance of the moments, in [0, 1]
_SAMPLE = 400  # x the distance of the samples in flat order, in [0, 1] (same shape only)
_SAMPLES = 16  # elements sampled per value, evenly spaced in flat order
_FULL_DP_CELLS = 25_000_000  # above this, the DP runs in a band around the diagonal
_BLOCK = 8  # rows of substitution costs computed per numpy call
_KEEP_EACH = 64 * 1024  # a value this small is kept whole while the runs go on (its pair's error needs no rerun)

_STATUS_LEGEND = (
    "= identical bits, ~ within tolerance, ! beyond tolerance, ? not comparable element by element "
    "(sizes or layouts differ), - only in a, + only in b"
)


# ------------------------------------------------------------------------------------------------
# values


@dataclass(frozen=True)
class Value:
    """One value of one run: where it comes from and its fingerprint (a few moments over its finite
    elements, computed in float64, and a small sample in flat order), never the value itself."""

    index: int
    name: str
    kind: str  # "input", "initializer", "constant" (a Constant node's output) or "result"
    op_type: str = ""  # the producing node's op type ("" for inputs and initializers)
    domain: str = ""
    node: str = ""  # the producing node's name
    output: bool = False  # a graph output
    dtype: str = ""
    shape: tuple[int, ...] = ()
    mean: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0
    abs_mean: float = 0.0
    nan: int = 0
    inf: int = 0
    sample: tuple[float, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def code(self) -> str:
        """Four letters from mean, std, min and max: alike values read alike (float32 and its float16
        conversion too), a changed value mostly reads otherwise."""
        return "".join(_letter(x) for x in (self.mean, self.std, self.min, self.max))

    @property
    def label(self) -> str:
        """What a report calls it: "'mm_1' (MatMul)" or "input 'x'"."""
        if self.kind == "result":
            return f"{self.name!r} ({self.op_type})"
        return f"{self.kind} {self.name!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "kind": self.kind,
            "op_type": self.op_type,
            "domain": self.domain,
            "node": self.node,
            "output": self.output,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "code": self.code,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "abs_mean": self.abs_mean,
            "nan": self.nan,
            "inf": self.inf,
        }


def _letter(x: float) -> str:
    # sign and order of magnitude squeezed into A..Z: log1p keeps small values apart, large ones in range
    u = math.copysign(math.log1p(abs(x)), x) if math.isfinite(x) else math.copysign(40.0, x)
    return chr(ord("A") + int(min(25, max(0, round(12.5 + 5.0 * u)))))


def _fingerprint(x: np.ndarray) -> dict[str, Any]:
    """Moments over the finite elements (float64, in slices: no float64 copy of a large value) and a sample.
    numpy rather than torch: single-threaded, so many small values cost no thread-pool round trips."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n = flat.size
    out: dict[str, Any] = {"dtype": _dtype_name(x.dtype), "shape": tuple(int(d) for d in x.shape)}
    if n == 0:
        return out
    total = total_sq = total_abs = 0.0
    lo, hi = math.inf, -math.inf
    finite_n = nan = inf = 0
    step = 1 << 22
    for start in range(0, n, step):
        part = flat[start : start + step].astype(np.float64)
        ok = np.isfinite(part)
        count = int(np.count_nonzero(ok))
        if count < part.size:
            bad = int(np.count_nonzero(np.isnan(part)))
            nan += bad
            inf += part.size - count - bad
            part = part[ok]
        if count == 0:
            continue
        finite_n += count
        total += float(part.sum())
        total_sq += float(np.square(part).sum())  # not np.dot: BLAS threads cost more than the sum
        total_abs += float(np.abs(part).sum())
        lo = min(lo, float(part.min()))
        hi = max(hi, float(part.max()))
    if finite_n:
        mean = total / finite_n
        out.update(mean=mean, std=math.sqrt(max(0.0, total_sq / finite_n - mean * mean)), min=lo, max=hi, abs_mean=total_abs / finite_n)
    out.update(nan=nan, inf=inf)
    sample = flat[np.linspace(0, n - 1, _SAMPLES).round().astype(np.int64)].astype(np.float64)
    out["sample"] = tuple(float(v) if math.isfinite(v) else 0.0 for v in sample)
    return out


def _dtype_name(dt: Any) -> str:
    try:
        return dtype_of(dt).short
    except ValueError:
        return str(dt)


# ------------------------------------------------------------------------------------------------
# the aligned rows


@dataclass(frozen=True)
class Row:
    """One row of the side by side: a value of a, of b, or a matched pair with its error.

    `status`: "=" identical bits, "~" within tolerance, "!" beyond it, "?" matched but not comparable
    element by element (sizes differ, or as many elements in another layout: a transposed value),
    "-" only in a, "+" only in b."""

    status: str
    a: Value | None = None
    b: Value | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    note: str = ""  # "flattened: shapes differ", "compared as float32", "sizes differ", the tolerance broken

    @property
    def matched(self) -> bool:
        return self.a is not None and self.b is not None

    def describe(self) -> str:
        a = self.a.label if self.a is not None else "-"
        b = self.b.label if self.b is not None else "-"
        err = f": max abs {g(self.max_abs)}" if self.max_abs is not None else ""
        return f"a {a} vs b {b}{err}" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "a": self.a.to_dict() if self.a is not None else None,
            "b": self.b.to_dict() if self.b is not None else None,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "note": self.note,
        }


@dataclass(frozen=True)
class Alignment:
    """Two executions of one function aligned value by value (an edit distance over dtype, shape, value
    fingerprint and op type), each matched pair compared element by element.

    `first_divergence`: the index of the first row beyond the tolerance ("!"), None when there is none;
    `first_change`: the first matched row whose bits differ ("~", "!" or "?")."""

    a: str
    b: str
    rows: tuple[Row, ...]
    tolerance: str
    runs: tuple[int, int] = (0, 0)  # runtime runs per side (values computed in chunks, matched pairs rerun)
    cost: int = 0  # the edit distance, in the units of the costs above (a gap is 1000)
    notes: tuple[str, ...] = ()

    @property
    def first_divergence(self) -> int | None:
        return next((i for i, r in enumerate(self.rows) if r.status == "!"), None)

    @property
    def first_change(self) -> int | None:
        return next((i for i, r in enumerate(self.rows) if r.matched and r.status != "="), None)

    @property
    def divergence(self) -> Row | None:
        """The first pair beyond the tolerance, None when every comparable pair is within it."""
        i = self.first_divergence
        return None if i is None else self.rows[i]

    @property
    def pairs(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.matched)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in "=~!?-+"}
        for r in self.rows:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        na = sum(1 for r in self.rows if r.a is not None)
        nb = sum(1 for r in self.rows if r.b is not None)
        matched = c["="] + c["~"] + c["!"] + c["?"]
        return (
            f"a = {self.a} ({na} values), b = {self.b} ({nb} values): {matched} matched "
            f"({c['=']} identical, {c['~']} within tolerance, {c['!']} beyond, {c['?']} not comparable), "
            f"{c['-']} only in a, {c['+']} only in b"
        )

    def render(self, *, around: int | None = None, max_rows: int | None = None, width: int = 24) -> str:
        """The side by side, one row per aligned pair: status, then for a and b kind, dtype, shape, code,
        op type and name, then the pair's max abs error. `around=k`: only the k rows either side of the
        first divergence (else of the first change); `max_rows`: at most that many rows; `width`: the
        widest name and shape printed."""
        lines = [f"side by side: {self.summary()}", f"tolerance per pair: {self.tolerance} (the narrower dtype's when the two differ)"]
        i = self.first_divergence
        if i is not None:
            lines.append(f"first divergence beyond tolerance: row {i}: {self.rows[i].describe()}")
        else:
            lines.append("no pair diverges beyond tolerance")
            j = self.first_change
            if j is not None:
                lines.append(f"first pair whose bits differ: row {j}: {self.rows[j].describe()}")
        lines.extend(self.notes)
        lines.append(f"legend: {_STATUS_LEGEND}")
        show = list(range(len(self.rows)))
        centre = i if i is not None else self.first_change
        if around is not None and centre is not None:
            show = list(range(max(0, centre - around), min(len(self.rows), centre + around + 1)))
        if max_rows is not None and len(show) > max_rows:
            show = show[:max_rows]
        head = ("#", "", "a: kind", "dtype", "shape", "code", "op", "name", "|", "b: kind", "dtype", "shape", "code", "op", "name", "|", "max abs")
        body = []
        for k in show:
            r = self.rows[k]
            mark = "  <- first divergence" if k == i else ""
            body.append((f"{k:03d}", r.status, *_cells(r.a, width), "|", *_cells(r.b, width), "|", (g(r.max_abs) if r.max_abs is not None else "") + mark))
        rendered = table(head, body)
        if show and show[0] > 0:
            rendered.insert(1, f"... {show[0]} row(s) before")
        if show and show[-1] < len(self.rows) - 1:
            rendered.append(f"... {len(self.rows) - 1 - show[-1]} row(s) after")
        return "\n".join(lines + rendered)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "tolerance": self.tolerance,
            "counts": self.counts(),
            "first_divergence": self.first_divergence,
            "first_change": self.first_change,
            "runs": list(self.runs),
            "cost": self.cost,
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
        }


def _cells(v: Value | None, width: int) -> tuple[str, ...]:
    if v is None:
        return ("", "", "", "", "", "")
    kind = "OUTPUT" if v.output else {"input": "INPUT", "initializer": "INIT", "constant": "CONST"}.get(v.kind, "RESULT")
    shape = "x".join(str(d) for d in v.shape)
    return (kind, v.dtype, _cut(shape, width), v.code, _cut(v.op_type, width), _cut(v.name, width))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 2] + ".."


# ------------------------------------------------------------------------------------------------
# running one graph, a chunk of its values at a time


def _fed(model: onnx.ModelProto, feeds: Any, label: str) -> dict[str, torch.Tensor]:
    """`feeds` for `model`: by name when the model's inputs are all among them, else by position (two
    exporters name inputs differently); floating feeds cast to the input's declared dtype (float32 feeds
    for a float16 conversion)."""
    from ..numerics.tensors import to_torch

    specs = input_specs(model)
    names = list(specs)
    if isinstance(feeds, Mapping):
        if all(n in feeds for n in names):
            chosen = {n: feeds[n] for n in names}
        elif len(feeds) == len(names):
            chosen = dict(zip(names, feeds.values(), strict=True))
        else:
            missing = [n for n in names if n not in feeds]
            raise ValueError(
                f"feeds for {label}: no feed for input(s) {missing} and {len(feeds)} feed(s) for {len(names)} input(s), "
                f"so they cannot be matched by position either; {label}'s inputs: {names}"
            )
    elif isinstance(feeds, Sequence) and not isinstance(feeds, str | bytes):
        if len(feeds) != len(names):
            raise ValueError(f"feeds for {label}: {len(feeds)} value(s) given by position, {label} has {len(names)} input(s): {names}")
        chosen = dict(zip(names, feeds, strict=True))
    else:
        raise TypeError(f"feeds must be a dict {{input name: tensor or array}} or a list of them in input order, got {type(feeds).__name__}")
    out: dict[str, torch.Tensor] = {}
    for name, value in chosen.items():
        t = to_torch(value) if isinstance(value, torch.Tensor | np.ndarray | np.generic) else value
        spec = specs[name]
        want = spec.torch_dtype
        if isinstance(t, torch.Tensor) and want is not None and t.dtype != want and t.is_floating_point() and want.is_floating_point:
            t = t.to(want)
        out[name] = t
    check_feeds(specs, out)  # the one feed check: names, dtypes, ranks, fixed dims, one message each
    return out


class _Execution:
    """One graph run by one runtime: its values in graph order (inputs, then each node's outputs), computed
    a chunk at a time: a run exposes only the chunk's values, so the memory held is the runtime's own live
    values plus about `chunk_bytes` of exposed ones, whatever the graph's size."""

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, torch.Tensor],
        *,
        label: str,
        runtime: AlignRuntime,
        provider: str,
        options: Mapping[str, Any],
        constants: bool,
        chunk_bytes: int,
    ) -> None:
        self.model = model
        self.feeds = dict(feeds)
        self.label = label
        self.runtime = runtime
        self.provider = provider
        self.options = dict(options)
        self.chunk_bytes = chunk_bytes
        self.runs = 0
        self._evaluator: Any = None
        self._np_feeds: dict[str, np.ndarray] | None = None
        graph = model.graph
        outputs = {o.name for o in graph.output}
        #: (name, kind, op_type, domain, node name, is graph output)
        self.slots: list[tuple[str, str, str, str, str, bool]] = [(n, "input", "", "", "", n in outputs) for n in self.feeds]
        self._initializers = {i.name: i for i in graph.initializer}
        if constants:
            self.slots += [(n, "initializer", "", "", "", n in outputs) for n in self._initializers]
        seen = {s[0] for s in self.slots}
        for node in graph.node:
            kind = "constant" if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else "result"
            if kind == "constant" and not constants:
                continue
            for o in node.output:
                if o and o not in seen:
                    seen.add(o)
                    self.slots.append((o, kind, node.op_type, node.domain, node.name, o in outputs))
        self.producer = {o: node for node in graph.node for o in node.output if o}
        self._estimates = _estimated_bytes(model, self.feeds)

    def fetch(self, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
        """(name, value as a numpy array) for each of `names`, in order: feeds and initializers as they are,
        computed values a chunk of about `chunk_bytes` per run; nothing is held once the caller moves on."""
        from ..numerics.tensors import from_onnx_tensor, to_numpy

        fallback = max(self._estimates.values(), default=0) or max((t.numel() * t.element_size() for t in self.feeds.values()), default=1)
        chunk: list[str] = []
        size = 0

        def flush() -> Iterator[tuple[str, np.ndarray]]:
            values = self._run(chunk)
            for name in chunk:
                yield name, values.pop(name)

        for name in names:
            if name in self.feeds:
                yield name, to_numpy(self.feeds[name])
                continue
            if name in self._initializers and name not in self.producer:
                yield name, to_numpy(from_onnx_tensor(self._initializers[name]))
                continue
            est = self._estimates.get(name, fallback)
            if chunk and size + est > self.chunk_bytes:
                yield from flush()
                chunk, size = [], 0
            chunk.append(name)
            size += est
        if chunk:
            yield from flush()

    def stream(self, consume: Callable[[str, np.ndarray], None]) -> None:
        """`consume(name, value)` for every value of the run, each as soon as it is computed. The torch
        evaluator streams them in one run (`run(observe=...)` frees each value once no later node reads
        it); onnxruntime computes them a chunk at a time (`fetch`)."""
        if self.runtime != "torch":
            for name, x in self.fetch([s[0] for s in self.slots]):
                consume(name, x)
            return
        wanted = {s[0] for s in self.slots}
        computed = [s[0] for s in self.slots if s[0] in self.producer]
        for name, x in self.fetch([s[0] for s in self.slots if s[0] not in self.producer]):
            consume(name, x)  # feeds and initializers

        def observe(node: onnx.NodeProto, outputs: Mapping[str, Any]) -> None:
            for name, t in outputs.items():
                if name in wanted:
                    consume(name, self._as_array(name, t))

        # every value nobody reads is requested, so that every node runs (and no dead branch is skipped)
        read = {x for n in self.model.graph.node for x in n.input}
        outputs = {o.name for o in self.model.graph.output}
        leaves = [n for n in computed if n not in read or n in outputs]
        self.runs += 1
        self._torch_evaluator().run(leaves or None, self.feeds, observe=observe)

    def _torch_evaluator(self) -> Any:
        if self._evaluator is None:
            from ..runtimes.evaluator import TorchEvaluator
            from ..runtimes.providers import torch_device

            self._evaluator = TorchEvaluator(self.model, device=torch_device(self.provider), missing="ort", check_model=False)
        return self._evaluator

    def _as_array(self, name: str, t: Any) -> np.ndarray:
        from ..numerics.tensors import to_numpy

        if not isinstance(t, torch.Tensor | np.ndarray):
            raise TypeError(f"{self.label}: value {name!r} is a {type(t).__name__}; compare_executions aligns tensors only (sequences and optionals are not fingerprinted)")
        return to_numpy(t)

    def _run(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        from ..numerics.tensors import to_numpy

        self.runs += 1
        if self.runtime == "torch":
            got = self._torch_evaluator().run(list(names), self.feeds)
            return {n: self._as_array(n, t) for n, t in zip(names, got, strict=True)}
        # a copy of the graph whose outputs are its own plus this chunk's: one session per chunk, gone after
        exposed = onnx.ModelProto()
        exposed.CopyFrom(self.model)
        present = {o.name for o in exposed.graph.output}
        for name in names:
            if name not in present:
                exposed.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        data = exposed.SerializeToString()
        del exposed
        session = _session(data, self.provider, {**self.options, "graph_optimization_level": "disable"})
        if self._np_feeds is None:
            self._np_feeds = {k: to_numpy(v) for k, v in self.feeds.items()}
        outs = session.run(list(names), self._np_feeds)
        return {n: self._as_array(n, o) for n, o in zip(names, outs, strict=True)}


def _estimated_bytes(model: onnx.ModelProto, feeds: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Bytes of each value whose shape onnx's shape inference knows once the feeds' shapes are set (a
    chunk of values is sized by these; a value it does not know counts as the largest it knows)."""
    import onnx.shape_inference

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        t = feeds.get(vi.name)
        if isinstance(t, torch.Tensor) and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in t.shape:
                shape.dim.add().dim_value = int(d)
    # weights become typed inputs (no copy of them); small initializers stay: shapes are read from them
    declared = {vi.name for vi in fixed.graph.input}
    small = [i for i in fixed.graph.initializer if math.prod(i.dims) <= 64]
    for init in fixed.graph.initializer:
        if math.prod(init.dims) > 64 and init.name not in declared:
            fixed.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    fixed.graph.ClearField("initializer")
    fixed.graph.initializer.extend(small)
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed, strict_mode=False, data_prop=True)
    except Exception:  # shape inference is a best guess here: unknown sizes fall back
        return {}
    out: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            continue
        try:
            size = dtype_of(tt.elem_type).itemsize
        except ValueError:
            size = 8
        out[vi.name] = size * math.prod(d.dim_value for d in tt.shape.dim)
    return out


def _session(data: bytes, provider: str, options: Mapping[str, Any]) -> Any:
    """An onnxruntime session of its own (not OrtRunner's process-wide cache: the exposed copies of a graph
    are used once), with OrtRunner's checks: the provider is there, an op it lacks is named."""
    from ..runtimes.ort import OrtRunner

    return OrtRunner(data, provider=provider, session_options={"log_severity_level": 3, **options})._create()


def optimized_model(model: Any, *, provider: str = "CPU", level: str = "all", session_options: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """The graph onnxruntime runs on `provider` at optimization `level` ("disable", "basic", "extended",
    "all"): the session's own optimized model (`SessionOptions.optimized_model_filepath`), fused nodes
    included. "disable" gives `model` back as it is."""
    m = load_model(model)
    if level not in LEVELS:
        raise ValueError(f"graph optimization level {level!r}; valid: {', '.join(LEVELS)}")
    if level == "disable":
        return m
    with tempfile.TemporaryDirectory(prefix="ortdiff-align-") as tmp:
        path = str(Path(tmp, "optimized.onnx"))
        options = {**dict(session_options or {}), "graph_optimization_level": level, "optimized_model_filepath": path}
        _session(m.SerializeToString(), provider, options)
        return onnx.load(path)


# ------------------------------------------------------------------------------------------------
# the alignment


class _Features:
    """The columns the substitution cost reads, one entry per value."""

    def __init__(self, values: Sequence[Value], ids: dict[Any, int]) -> None:
        def ident(key: Any) -> int:
            return ids.setdefault(key, len(ids))

        self.kind = np.array([0 if v.kind == "input" else 1 if v.kind in ("initializer", "constant") else 2 for v in values], dtype=np.int64)
        self.dtype = np.array([ident(("dtype", v.dtype)) for v in values], dtype=np.int64)
        self.floating = np.array([_is_float(v.dtype) for v in values], dtype=bool)
        self.numel = np.array([v.numel for v in values], dtype=np.int64)
        self.shape = np.array([ident(("shape", v.shape)) for v in values], dtype=np.int64)
        self.op = np.array([ident(("op", v.domain, v.op_type)) for v in values], dtype=np.int64)
        self.name = np.array([ident(("name", v.name)) for v in values], dtype=np.int64)
        stats = np.array([(v.mean, v.std, v.min, v.max, v.abs_mean) for v in values], dtype=np.float64).reshape(len(values), 5)
        # each moment on a log-like scale relative to the value's range: a difference of d reads as a
        # relative change of about d, saturating for unlike values; a moment near zero (against the
        # range) is close to any other near zero
        scale = np.maximum(np.abs(stats[:, 2]), np.abs(stats[:, 3]))[:, None]
        self.stats = np.arcsinh(stats / (1e-3 * scale + 1e-30)).astype(np.float32)
        # float64: transformer graphs hold float32's min (-3.4e38, attention masks), whose sums overflow float32
        # (and an inf / inf cost is NaN, which the DP's integers turned into -2**63: every pairing went wrong)
        self.sample = np.array([v.sample or (0.0,) * _SAMPLES for v in values], dtype=np.float64).reshape(len(values), _SAMPLES)
        self.sample_norm = np.abs(self.sample).sum(axis=1)

    def __len__(self) -> int:
        return len(self.kind)


def _is_float(dtype: str) -> bool:
    try:
        return dtype_of(dtype).is_floating_point
    except ValueError:
        return False


def _substitution(fa: _Features, rows: slice, fb: _Features, lo: int, hi: int) -> np.ndarray:
    """The cost of pairing each of a's values `rows` with each of b's values lo..hi-1 (0: alike in every
    respect), as a matrix: a block of rows at once, so numpy's per-call overhead is paid per block."""
    sl = slice(lo, hi)

    def col(x: np.ndarray) -> np.ndarray:
        return x[rows][:, None]

    cost = np.where(fb.kind[sl] != col(fa.kind), _KIND, 0)
    same_dtype = fb.dtype[sl] == col(fa.dtype)
    cost += np.where(same_dtype, 0, np.where(fb.floating[sl] & col(fa.floating), _DTYPE_OTHER_FLOAT, _DTYPE_OTHER))
    same_shape = fb.shape[sl] == col(fa.shape)
    cost += np.where(same_shape, 0, np.where(fb.numel[sl] == col(fa.numel), _SHAPE_RESHAPED, _SHAPE_OTHER))
    computed = (fb.kind[sl] == 2) & (col(fa.kind) == 2)
    cost += np.where(computed & (fb.op[sl] != col(fa.op)), _OP, 0)
    cost += np.where(fb.name[sl] != col(fa.name), _NAME, 0)
    diff = np.abs(fb.stats[sl][None, :, :] - fa.stats[rows][:, None, :])
    d = np.minimum(diff, 1, out=diff).mean(axis=2)
    ds = np.abs(fb.sample[sl][None, :, :] - fa.sample[rows][:, None, :]).sum(axis=2) / (fb.sample_norm[sl] + col(fa.sample_norm) + 1e-30)
    d2 = np.where(same_shape, ds, d)  # a sample in flat order says something only for one layout
    out: np.ndarray = cost + np.rint(_STATS * np.clip(d, 0, 1) + _SAMPLE * np.clip(d2, 0, 1)).astype(np.int64)
    return out


def _align(fa: _Features, fb: _Features, band: int | None = None) -> tuple[list[tuple[int | None, int | None]], int]:
    """Needleman-Wunsch over the two value lists: a gap costs _GAP, a pair its substitution cost.

    Row by row in numpy: the row's diagonal and vertical moves are vectors; the horizontal moves (gaps in a,
    a constant cost) close in one cumulative minimum, D[j] = min_k<=j (T[k] + (j - k) * GAP). O(n*m) time,
    one byte per cell for the way back; beyond _FULL_DP_CELLS cells (or with `band`) only a band of that
    half-width around the diagonal is computed."""
    n, m = len(fa), len(fb)
    if band is None and n * m > _FULL_DP_CELLS:
        band = max(256, _FULL_DP_CELLS // (2 * max(n, m, 1)))
    windows: list[tuple[int, int]] = []
    for i in range(n + 1):
        if band is None or n == 0:
            windows.append((0, m))
        else:
            centre = round(i * m / n)
            w = max(band, math.ceil(m / n) + 1)
            windows.append((max(0, centre - w), min(m, centre + w)))
    inf = np.iinfo(np.int64).max // 4
    prev = np.full(m + 1, inf, dtype=np.int64)
    lo0, hi0 = windows[0]
    prev[lo0 : hi0 + 1] = np.arange(lo0, hi0 + 1, dtype=np.int64) * _GAP
    cur = np.full(m + 1, inf, dtype=np.int64)
    ways: list[np.ndarray] = []  # per row i >= 1: 0 diagonal, 1 up (a only), 2 left (b only), over its window
    block = np.zeros((0, 0), dtype=np.int64)
    block_rows, block_lo = 0, 0
    for i in range(1, n + 1):
        lo, hi = windows[i]
        width = hi - lo + 1
        t = prev[lo : hi + 1] + _GAP  # up: a's value i-1 alone
        way = np.ones(width, dtype=np.uint8)
        start = max(lo, 1)
        if i > block_rows:  # the substitution costs of the next rows, over the union of their windows
            block_rows = min(n, i + _BLOCK - 1)
            block_lo = max(windows[i][0], 1) - 1
            block = _substitution(fa, slice(i - 1, block_rows), fb, block_lo, windows[block_rows][1])
        if start <= hi:
            diag = prev[start - 1 : hi] + block[i - 1 - (block_rows - block.shape[0]), start - 1 - block_lo : hi - block_lo]
            seg = t[start - lo :]
            better = diag <= seg  # ties go to the pair
            seg[better] = diag[better]
            way[start - lo :][better] = 0
        k = np.arange(width, dtype=np.int64) * _GAP
        d = np.minimum.accumulate(t - k) + k
        way[d < t] = 2
        if i >= 2:  # cur still holds row i-2: clear its window only (a band never touches the rest)
            cur[windows[i - 2][0] : windows[i - 2][1] + 1] = inf
        cur[lo : hi + 1] = d
        ways.append(way)
        prev, cur = cur, prev
    cost = int(prev[m])
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i > 0 or j > 0:
        if i == 0:
            pairs.append((None, j - 1))
            j -= 1
            continue
        lo, _ = windows[i]
        w = int(ways[i - 1][j - lo])
        if w == 0:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif w == 1:
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    pairs.reverse()
    return pairs, cost


def _anchored_order(a: Sequence[Value], b: Sequence[Value]) -> list[int]:
    """b's values in the order that follows a's where the two surely share a value: the same name, dtype
    and shape (a graph and its optimized or edited copy), or the same fingerprint exactly, found once on
    each side. An edit distance cannot pair values that moved past each other (onnxruntime's optimized
    graph lists nodes in another topological order); the values between two such anchors keep b's order."""
    def exact(v: Value) -> tuple[Any, ...]:
        return (v.kind, v.dtype, v.shape, v.mean, v.std, v.min, v.max, v.sample)

    by_name = {(v.name, v.dtype, v.shape): k for k, v in enumerate(a)}
    counts_a: dict[tuple[Any, ...], int] = {}
    counts_b: dict[tuple[Any, ...], int] = {}
    first_a: dict[tuple[Any, ...], int] = {}
    for k, v in enumerate(a):
        key = exact(v)
        counts_a[key] = counts_a.get(key, 0) + 1
        first_a.setdefault(key, k)
    for v in b:
        counts_b[exact(v)] = counts_b.get(exact(v), 0) + 1
    used: set[int] = set()
    anchor: list[int | None] = []
    for v in b:
        hit = by_name.get((v.name, v.dtype, v.shape))
        if hit is None and v.numel > 1 and counts_a.get(exact(v)) == 1 and counts_b[exact(v)] == 1:
            hit = first_a[exact(v)]  # (a single element is too often alike by chance: a shape, a scalar)
        anchor.append(hit if hit is not None and hit not in used else None)
        if hit is not None:
            used.add(hit)
    keys = []
    last = -1.0
    for j, at in enumerate(anchor):
        last = float(at) if at is not None else last
        keys.append((last, at is None, j))  # an unanchored value follows the anchor before it in b
    return [j for *_, j in sorted(keys)]


# ------------------------------------------------------------------------------------------------
# comparing matched pairs


def _as_tolerance(tolerance: Any) -> Tolerance:
    from ..engine.check import (
        _as_tolerance as resolve,  # (private there: the one parser of tolerance=)
    )

    return resolve(tolerance)


def _bits_differ(a: np.ndarray, b: np.ndarray) -> int:
    """Elements of two arrays of one dtype and shape whose bit patterns differ (NaN payloads, signed zeros)."""
    if a.dtype.itemsize not in _UINT:
        return int(np.count_nonzero(np.ascontiguousarray(a).view(np.uint8) != np.ascontiguousarray(b).view(np.uint8)))
    view = _UINT[a.dtype.itemsize]
    return int(np.count_nonzero(np.ascontiguousarray(a).view(view) != np.ascontiguousarray(b).view(view)))


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _narrower(a: str, b: str) -> str:
    """The floating dtype of fewer bits (a's when alike)."""
    try:
        return b if dtype_of(b).itemsize < dtype_of(a).itemsize else a
    except ValueError:
        return a


def _saturated(x: np.ndarray, narrow: str) -> np.ndarray:
    """Finite values beyond a half type's range at its largest finite value, as a conversion to it writes
    them (the float16 converter stores float32's -3.4e38 mask values as -65504)."""
    top = float(torch.finfo(dtype_of(narrow).torch).max)
    if x.dtype.kind != "f" or not np.any(np.abs(x[np.isfinite(x)]) > top):
        return x
    return np.where(np.isfinite(x), np.clip(x, -top, top), x).astype(x.dtype)


def _pair(xa: np.ndarray, xb: np.ndarray, va: Value, vb: Value, tol: Tolerance, floor: str | None = None) -> tuple[str, float | None, float | None, str]:
    """(status, max abs, max rel, note) of a matched pair; a's value is the expected one. `floor`: a dtype the
    pair is judged in at the narrowest (b's compute dtype: its float32 values computed in float16)."""
    if xa.size != xb.size:
        return "?", None, None, f"sizes differ: {va.numel:,} vs {vb.numel:,} elements"
    note = ""
    narrow = va.dtype
    if va.dtype != vb.dtype:
        fa, fb = _is_float(va.dtype), _is_float(vb.dtype)
        if fa and fb:
            wide, narrow = (va.dtype, vb.dtype) if xa.dtype.itemsize >= xb.dtype.itemsize else (vb.dtype, va.dtype)
        elif fa or fb:
            wide = narrow = va.dtype if fa else vb.dtype
        else:
            wide = narrow = "int64"
        target = xa.dtype if wide == va.dtype else xb.dtype if wide == vb.dtype else np.dtype(np.int64)
        xa, xb = xa.astype(target), xb.astype(target)
        note = f"compared as {wide}"
        if fa and fb and narrow in ("float16", "bfloat16"):
            sa, sb = _saturated(xa, narrow), _saturated(xb, narrow)
            if sa is not xa or sb is not xb:
                xa, xb = sa, sb
                note += f"; beyond {narrow}'s range as {narrow} stores it (at its largest finite value)"
    if floor is not None and _is_float(va.dtype) and _is_float(vb.dtype) and _narrower(narrow, floor) != narrow:
        narrow = _narrower(narrow, floor)
        xa, xb = _saturated(xa, narrow), _saturated(xb, narrow)
        note = "; ".join(filter(None, [note, f"judged as {narrow}, b's compute dtype"]))
    if xa.shape != xb.shape:
        xa, xb = xa.reshape(-1), xb.reshape(-1)
        note = "flattened: shapes differ" + (f"; {note}" if note else "")
    elif va.dtype == vb.dtype and _bits_differ(xa, xb) == 0:
        return "=", 0.0, 0.0, ""
    resolved = tol.for_dtype(narrow)
    report = compare(xa, xb, tolerance=resolved, thresholds=tuple(sorted({*DEFAULT_THRESHOLDS, *resolved.thresholds})))
    broken = resolved.check(report)
    if not broken:
        return "~", report.max_abs, report.max_rel, note
    if "flattened" in note:
        return "?", report.max_abs, report.max_rel, note.replace("flattened: shapes differ", "layouts differ (flattened, beyond tolerance)")
    return "!", report.max_abs, report.max_rel, "; ".join(filter(None, [note, broken[0].message]))


# ------------------------------------------------------------------------------------------------
# compare_executions


def _values(ex: _Execution, keep_budget: int) -> tuple[list[Value], dict[str, np.ndarray]]:
    """Every value of `ex` fingerprinted as it is computed; the small ones kept whole, within `keep_budget` bytes."""
    values: list[Value] = []
    kept: dict[str, np.ndarray] = {}
    kept_bytes = 0
    slots = {s[0]: (k, s) for k, s in enumerate(ex.slots)}

    def consume(name: str, x: np.ndarray) -> None:
        nonlocal kept_bytes
        index, (_, kind, op, domain, node, output) = slots[name]
        values.append(Value(index=index, name=name, kind=kind, op_type=op, domain=domain, node=node, output=output, **_fingerprint(x)))
        if x.nbytes <= _KEEP_EACH and kept_bytes + x.nbytes <= keep_budget:
            kept[name] = x.copy()  # a view of a large value would keep all of it
            kept_bytes += x.nbytes

    ex.stream(consume)
    values.sort(key=lambda v: v.index)
    return values, kept


def _refuse_large(checked: CheckedModel, label: str) -> None:
    """Aligning serializes each model (every value exposed, each optimization level): not above 2 GB."""
    if not checked.data:
        raise ValueError(
            f"{label} is larger than 2 GB: aligning executions serializes the model again, which protobuf cannot do above 2 GB; "
            "check it and blame it from its path instead (Checker.check(path, feeds, blame=True))"
        )


def _execution(model: Any, feeds: Any, *, label: str, runtime: AlignRuntime, provider: str, session_options: Mapping[str, Any] | None, constants: bool, chunk_bytes: int, check: bool = True) -> _Execution:
    from ..runtimes.providers import parse_provider

    provider = parse_provider(provider)
    m = load_model(model)
    if check:
        _refuse_large(check_model(m, subject=label, path=model_path(model)), label)
    options = dict(session_options or {})
    if session_options is not None and not isinstance(session_options, Mapping):
        raise TypeError(f"session options for {label} must be a dict of SessionOptions attributes, e.g. {{'graph_optimization_level': 'basic'}}; got {type(session_options).__name__}")
    if runtime == "torch" and options:
        raise ValueError(f"session options for {label} are onnxruntime's; runtime='torch' runs the graph with the torch evaluator: leave them out")
    level = options.pop("graph_optimization_level", "disable")
    if runtime == "ort" and level != "disable":
        # exposing values as outputs would stop onnxruntime fusing the nodes that compute them: optimize
        # first, then run the optimized graph as it is with its values exposed
        m = optimized_model(m, provider=provider, level=level, session_options=options)
    return _Execution(m, _fed(m, feeds, label), label=label, runtime=runtime, provider=provider, options=options, constants=constants, chunk_bytes=chunk_bytes)


def compare_executions(
    model_a: Any,
    model_b: Any,
    feeds: Any,
    *,
    runtime: AlignRuntime = "ort",
    provider: str = "CPU",
    tolerance: Any = None,
    session_options_a: Mapping[str, Any] | None = None,
    session_options_b: Mapping[str, Any] | None = None,
    labels: tuple[str, str] = ("a", "b"),
    constants: bool = False,
    chunk_mb: float = 64.0,
    band: int | None = None,
) -> Alignment:
    """Run two graphs of one function (two exporters, before and after onnxruntime's optimizations, float32
    and its float16 conversion, two opsets) on the same inputs and align their values side by side.

    Every value of each run (inputs, then each node's outputs in graph order; `constants=True` adds
    initializers and Constant outputs) is fingerprinted as it is computed: dtype, shape, a few moments
    over its finite elements and a small sample. The two lists are aligned by an edit distance whose
    substitution cost grows with how unlike two values are (kind, dtype, shape, op type, name,
    fingerprint) and a gap costs as much as a fully unlike pair; matched pairs are then compared element
    by element (a's value expected), judged by `tolerance` (a Tolerance, a dict of its arguments or an
    (atol, rtol) pair; default: the dtype's defaults) resolved for the narrower dtype of each pair, and of
    a model's compute dtype when it computes in float16 behind float32 inputs and outputs
    (`model_io.compute_dtype`: its float32 values are float16 ones cast up).

    `feeds`: a dict by input name (matched by position for a model whose input names differ) or a list in
    input order; floating feeds are cast to each model's input dtype. `runtime="ort"` runs onnxruntime on
    `provider` with the session options of each side (a dict; `graph_optimization_level` defaults to
    "disable": the graph as written — pass "all" to see what onnxruntime runs by default: the graph is
    optimized first, then its fused nodes run with their values exposed); `runtime="torch"` the torch
    evaluator (ops it lacks run on onnxruntime).

    Memory: values are computed `chunk_mb` at a time (a run exposes only that chunk's values), small
    values kept whole within `chunk_mb`, and the pairs whose values were not kept are compared in a
    second pass, chunk by chunk: peak memory is the runtime's own live values plus about 2 x `chunk_mb`,
    not the sum of every value. The DP holds one byte per cell (a band around the diagonal beyond 25M cells).
    """
    if runtime not in ("ort", "torch"):
        raise ValueError(f"runtime={runtime!r}; valid: 'ort' (onnxruntime) or 'torch' (the torch evaluator)")
    if not (isinstance(chunk_mb, int | float) and chunk_mb > 0):
        raise ValueError(f"chunk_mb must be a positive number of MiB, got {chunk_mb!r}")
    chunk_bytes = int(chunk_mb * 2**20)
    common = {"runtime": runtime, "provider": provider, "constants": constants, "chunk_bytes": chunk_bytes}
    ex_a = _execution(model_a, feeds, label=labels[0], session_options=session_options_a, **common)  # type: ignore[arg-type]
    ex_b = _execution(model_b, feeds, label=labels[1], session_options=session_options_b, **common)  # type: ignore[arg-type]
    # a float16 model behind float32 I/O: its float32 values are float16 ones cast up, judged as float16
    floor = compute_dtype(ex_b.model) or compute_dtype(ex_a.model)
    return _compare(ex_a, ex_b, _as_tolerance(tolerance), chunk_bytes, band, floor=floor)


@dataclass
class _Observed:
    ex: _Execution
    values: list[Value]
    kept: dict[str, np.ndarray]


def _observe(ex: _Execution, chunk_bytes: int) -> _Observed:
    values, kept = _values(ex, chunk_bytes // 2)
    return _Observed(ex, values, kept)


def _compare(ex_a: _Execution | _Observed, ex_b: _Execution | _Observed, tol: Tolerance, chunk_bytes: int, band: int | None, floor: str | None = None) -> Alignment:
    oa = ex_a if isinstance(ex_a, _Observed) else _observe(ex_a, chunk_bytes)
    ob = ex_b if isinstance(ex_b, _Observed) else _observe(ex_b, chunk_bytes)
    ids: dict[Any, int] = {}
    order = _anchored_order(oa.values, ob.values)
    moved, cost = _align(_Features(oa.values, ids), _Features([ob.values[j] for j in order], ids), band)
    pairs = [(i, None if j is None else order[j]) for i, j in moved]
    results: dict[tuple[int, int], tuple[str, float | None, float | None, str]] = {}
    todo: list[tuple[int, int]] = []
    for i, j in pairs:
        if i is None or j is None:
            continue
        va, vb = oa.values[i], ob.values[j]
        if va.name in oa.kept and vb.name in ob.kept:
            results[(i, j)] = _pair(oa.kept[va.name], ob.kept[vb.name], va, vb, tol, floor)
        else:
            todo.append((i, j))
    # second pass: the pairs whose values were not kept, a chunk of both sides' values per run
    start = 0
    while start < len(todo):
        size, end = 0, start
        while end < len(todo) and (end == start or size + _nbytes(oa.values[todo[end][0]]) + _nbytes(ob.values[todo[end][1]]) <= chunk_bytes):
            size += _nbytes(oa.values[todo[end][0]]) + _nbytes(ob.values[todo[end][1]])
            end += 1
        group = todo[start:end]
        got_a = dict(oa.ex.fetch([oa.values[i].name for i, _ in group]))
        got_b = dict(ob.ex.fetch([ob.values[j].name for _, j in group]))
        for i, j in group:
            va, vb = oa.values[i], ob.values[j]
            results[(i, j)] = _pair(got_a.pop(va.name), got_b.pop(vb.name), va, vb, tol, floor)
        start = end
    rows = []
    for i, j in pairs:
        if i is None:
            rows.append(Row("+", b=ob.values[j]))  # type: ignore[index]
        elif j is None:
            rows.append(Row("-", a=oa.values[i]))
        else:
            status, max_abs, max_rel, note = results[(i, j)]
            rows.append(Row(status, oa.values[i], ob.values[j], max_abs, max_rel, note))
    return Alignment(oa.ex.label, ob.ex.label, tuple(rows), _describe(tol), runs=(oa.ex.runs, ob.ex.runs), cost=cost)


def _describe(tol: Tolerance) -> str:
    return tol.describe() if not tol.is_empty else "the dtype's defaults"


def _nbytes(v: Value) -> int:
    try:
        return v.numel * dtype_of(v.dtype).itemsize
    except ValueError:
        return v.numel * 8


# ------------------------------------------------------------------------------------------------
# check_optimization


@dataclass(frozen=True)
class FusedNode:
    """A node an optimization level put in the graph, and the nodes of the previous level's graph it replaced."""

    op_type: str
    domain: str
    name: str
    replaces: tuple[str, ...] = ()  # op types, in graph order

    def describe(self) -> str:
        op = f"{self.domain}:{self.op_type}" if self.domain not in ("", "ai.onnx") else self.op_type
        rep = f" (replaces {', '.join(self.replaces)})" if self.replaces else ""
        return f"{op} {self.name!r}{rep}"

    def to_dict(self) -> dict[str, Any]:
        return {"op_type": self.op_type, "domain": self.domain, "name": self.name, "replaces": list(self.replaces)}


@dataclass(frozen=True)
class LevelChange:
    """One optimization level against the previous one (and against the unoptimized graph)."""

    level: str
    previous: str  # "" for the first level
    nodes: int  # nodes of this level's graph
    new_nodes: tuple[FusedNode, ...] = ()  # nodes this level added to the previous level's graph
    bits_vs_previous: int = 0  # output elements whose bits differ from the previous level's
    bits_vs_unoptimized: int = 0
    n: int = 0  # output elements
    vs_previous: DiffReport | None = None
    vs_unoptimized: DiffReport | None = None
    violations: tuple[str, ...] = ()  # the tolerance rules broken (against the previous or the unoptimized)
    alignment: Alignment | None = None  # the previous level's graph vs this one's, side by side
    culprit: FusedNode | None = None  # the node this level produced that the first changed pair leads to
    culprit_note: str = ""

    @property
    def moved(self) -> bool:
        return self.bits_vs_previous > 0

    @property
    def within_tolerance(self) -> bool:
        return not self.violations

    def first_changed_pair(self) -> Row | None:
        if self.alignment is None:
            return None
        i = self.alignment.first_divergence
        if i is None:
            i = self.alignment.first_change
        return None if i is None else self.alignment.rows[i]

    def to_dict(self) -> dict[str, Any]:
        pair = self.first_changed_pair()
        return {
            "level": self.level,
            "previous": self.previous,
            "nodes": self.nodes,
            "new_nodes": [f.to_dict() for f in self.new_nodes],
            "moved": self.moved,
            "bits_vs_previous": self.bits_vs_previous,
            "bits_vs_unoptimized": self.bits_vs_unoptimized,
            "n": self.n,
            "max_abs_vs_previous": self.vs_previous.max_abs if self.vs_previous is not None else None,
            "max_abs_vs_unoptimized": self.vs_unoptimized.max_abs if self.vs_unoptimized is not None else None,
            "within_tolerance": self.within_tolerance,
            "violations": list(self.violations),
            "first_changed_pair": pair.to_dict() if pair is not None else None,
            "culprit": self.culprit.to_dict() if self.culprit is not None else None,
            "culprit_note": self.culprit_note,
            "alignment": self.alignment.to_dict() if self.alignment is not None else None,
        }


@dataclass(frozen=True)
class OptimizationReport:
    """Which onnxruntime graph optimization level moved a model's outputs, and the fused node it produced."""

    model: str
    provider: str
    tolerance: str
    levels: tuple[LevelChange, ...]
    notes: tuple[str, ...] = ()

    @property
    def moved(self) -> tuple[LevelChange, ...]:
        """The levels whose outputs differ in their bits from the previous level's."""
        return tuple(c for c in self.levels if c.moved)

    @property
    def passed(self) -> bool:
        return all(c.within_tolerance for c in self.levels)

    @property
    def culprit(self) -> LevelChange | None:
        """The first level beyond tolerance, else the first that moved the bits; None when none did."""
        return next((c for c in self.levels if not c.within_tolerance), None) or next(iter(self.moved), None)

    def worst(self) -> DiffReport:
        """The report of the level whose outputs are farthest from the unoptimized ones."""
        reports = [c.vs_unoptimized for c in self.levels if c.vs_unoptimized is not None]
        if not reports:
            return DiffReport(name=self.model)
        return max(reports, key=lambda r: (r.nan_mismatch + r.inf_mismatch, r.max_abs))

    def summary(self) -> str:
        if not self.moved:
            return "no optimization level moves the outputs' bits"
        parts = []
        for c in self.moved:
            where = f" by {c.culprit.describe()}" if c.culprit is not None else ""
            judged = "within tolerance" if c.within_tolerance else "BEYOND tolerance"
            parts.append(f"{c.level!r} moves {c.bits_vs_previous:,} of {c.n:,} output elements ({judged}){where}")
        return "; ".join(parts)

    def render(self, *, around: int = 4) -> str:
        head = ("level", "nodes", "bits vs previous", "max abs vs previous", "max abs vs unoptimized", "tolerance", "new nodes")
        body = []
        for c in self.levels:
            prev = f"{c.bits_vs_previous:,} of {c.n:,}" if c.previous else "-"
            body.append(
                (
                    c.level,
                    str(c.nodes),
                    prev,
                    g(c.vs_previous.max_abs) if c.vs_previous is not None else "-",
                    g(c.vs_unoptimized.max_abs) if c.vs_unoptimized is not None else "-",
                    "ok" if c.within_tolerance else "BROKEN",
                    ", ".join(f.describe() for f in c.new_nodes[:3]) + (f" (+{len(c.new_nodes) - 3})" if len(c.new_nodes) > 3 else "") or "-",
                )
            )
        lines = [f"ortdiff.check_optimization: {self.model} on {self.provider}, tolerance {self.tolerance}: {self.summary()}", *table(head, body, indent="  ")]
        lines.extend(f"note: {n}" for n in self.notes)
        for c in self.levels:
            if not c.moved and c.within_tolerance:
                continue
            lines.append("")
            if not c.moved:
                lines.append(f"{c.previous or 'the unoptimized graph'} -> {c.level}: the same outputs, bit for bit" + (", carrying the earlier levels' change:" if c.previous else ":"))
                lines.extend(f"  {v}" for v in c.violations)
                continue
            lines.append(f"{c.previous} -> {c.level}: {c.bits_vs_previous:,} of {c.n:,} output elements differ in their bits")
            lines.extend(f"  {v}" for v in c.violations)
            pair = c.first_changed_pair()
            if pair is not None:
                lines.append(f"  first changed pair: {pair.describe()}")
            if c.culprit is not None:
                lines.append(f"  produced by: {c.culprit.describe()}" + (f" ({c.culprit_note})" if c.culprit_note else ""))
            elif c.culprit_note:
                lines.append(f"  {c.culprit_note}")
            if c.alignment is not None:
                lines.extend("  " + line for line in c.alignment.render(around=around).splitlines())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        culprit = self.culprit
        return {
            "model": self.model,
            "provider": self.provider,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "culprit_level": culprit.level if culprit is not None else None,
            "notes": list(self.notes),
            "levels": [c.to_dict() for c in self.levels],
        }


def _node_key(node: onnx.NodeProto) -> tuple[str, str, tuple[str, ...]]:
    return (node.domain, node.op_type, tuple(node.output))


def _new_nodes(prev: onnx.GraphProto, cur: onnx.GraphProto) -> list[FusedNode]:
    """The nodes of `cur` that `prev` lacks, each with the removed nodes of `prev` between its inputs and outputs."""
    prev_nodes = list(prev.node)
    prev_keys = {_node_key(n) for n in prev_nodes}
    cur_keys = {_node_key(n) for n in cur.node}
    removed = {k for k, n in enumerate(prev_nodes) if _node_key(n) not in cur_keys}
    producer = {o: k for k, n in enumerate(prev_nodes) for o in n.output if o}
    out = []
    for node in cur.node:
        if _node_key(node) in prev_keys:
            continue
        stop = set(node.input)
        seen: set[int] = set()
        stack = [producer[o] for o in node.output if o in producer]
        while stack:  # prev's removed nodes from this node's outputs back to its inputs
            k = stack.pop()
            if k in seen or k not in removed:
                continue
            seen.add(k)
            stack.extend(producer[x] for x in prev_nodes[k].input if x and x not in stop and x in producer)
        out.append(FusedNode(node.op_type, node.domain, node.name, tuple(prev_nodes[k].op_type for k in sorted(seen))))
    return out


def _culprit(alignment: Alignment, graph: onnx.GraphProto, new: Sequence[FusedNode]) -> tuple[FusedNode | None, str]:
    """The new node that the first changed pair's value (b side) comes from: its own producer, else its
    nearest new ancestor; else the first new node of the graph, said so."""
    if not new:
        return None, "the level added no node: its change comes from the kernels it chose, not a fusion"
    i = alignment.first_divergence if alignment.first_divergence is not None else alignment.first_change
    by_name = {(f.domain, f.op_type, f.name): f for f in new}
    first = new[0]
    value = alignment.rows[i].b if i is not None else None
    if value is None:
        return first, "no aligned pair changed: the first node this level added"
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    queue = deque([producer[value.name]] if value.name in producer else [])
    seen: set[int] = set()
    while queue:  # breadth first: the nearest new node upstream of the changed value
        k = queue.popleft()
        if k in seen:
            continue
        seen.add(k)
        node = nodes[k]
        hit = by_name.get((node.domain, node.op_type, node.name))
        if hit is not None:
            return hit, ""
        queue.extend(producer[x] for x in node.input if x in producer)
    return first, "the changed value has no new node upstream: the first node this level added"


def check_optimization(
    model: Any,
    feeds: Any,
    *,
    provider: str = "CPU",
    levels: Sequence[str] = LEVELS,
    tolerance: Any = None,
    chunk_mb: float = 64.0,
) -> OptimizationReport:
    """Which onnxruntime graph optimization level moves `model`'s outputs on `provider`, and the fused node
    it produced (users meet this: ENABLE_ALL and DISABLE_ALL differ, fixed by disabling optimizations).

    For each level in `levels` (in order, e.g. disable -> basic -> extended -> all): the outputs of a
    session at that level (one intra-op thread, so that threads do not blur the comparison) against the
    previous level's and the unoptimized ones, bit for bit and by `tolerance` (default: the dtype's); the
    graph onnxruntime runs at that level (`optimized_model`) aligned with the previous level's
    (`compare_executions`), the first changed pair found, and the node the level added that it leads to
    (FusedMatMul, Gelu, LayerNormalization, Gemm, FusedConv, ...). Returns an `OptimizationReport`.
    """
    from ..numerics.tensors import to_numpy
    from ..runtimes.providers import parse_provider

    levels = tuple(levels)
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise ValueError(f"levels: {bad or 'none given'}; valid: {', '.join(LEVELS)} (in the order to compare)")
    provider = parse_provider(provider)
    tol = _as_tolerance(tolerance)
    m = load_model(model)
    _refuse_large(check_model(m, path=model_path(model)), "the model")
    chunk_bytes = int(chunk_mb * 2**20)
    names = [o.name for o in m.graph.output]
    one = {"intra_op_num_threads": 1}
    fed = _fed(m, feeds, "the model")
    np_feeds = {k: to_numpy(v) for k, v in fed.items()}
    data = m.SerializeToString()

    def outputs(level: str) -> list[np.ndarray]:
        session = _session(data, provider, {**one, "graph_optimization_level": level})
        return list(session.run(names, np_feeds))

    unoptimized = outputs("disable")
    changes: list[LevelChange] = []
    observed: dict[str, _Observed] = {}  # fingerprints of a level's graph, taken only when a comparison needs them

    notes: list[str] = []
    plain: dict[str, list[np.ndarray]] = {}

    def observe(level: str, graph: onnx.ModelProto) -> _Observed:
        if level not in observed:
            ex = _Execution(graph, _fed(graph, fed, level), label=level, runtime="ort", provider=provider, options=one, constants=False, chunk_bytes=chunk_bytes)
            observed[level] = obs = _observe(ex, chunk_bytes)
            # the optimized graph run with its values exposed must compute what the session at that level
            # does; say so where it does not (the side by side would then describe another computation)
            seen = {v.name: v for v in obs.values}
            for name, t in zip(names, plain[level], strict=True):
                v, fp = seen.get(name), _fingerprint(t)
                if v is not None and any(getattr(v, k) != fp.get(k, getattr(v, k)) for k in ("mean", "std", "min", "max", "sample")):
                    notes.append(f"{level}: output {name!r} of the optimized graph run with its values exposed differs from the session's at that level; its side by side is approximate")
        return observed[level]

    prev: tuple[str, onnx.ModelProto, list[np.ndarray]] | None = None
    for level in levels:
        graph = optimized_model(m, provider=provider, level=level, session_options=one)
        out = plain[level] = unoptimized if level == "disable" else outputs(level)
        n = sum(t.size for t in out)
        vs_unopt = compare(dict(zip(names, unoptimized, strict=True)), dict(zip(names, out, strict=True)), tolerance=tol)
        broken = [f"against the unoptimized graph: {v}" for v in tol.check(vs_unopt)]
        bits_unopt = sum(_bits_differ(a, b) for a, b in zip(unoptimized, out, strict=True))
        if prev is None:
            changes.append(LevelChange(level, "", len(graph.graph.node), n=n, bits_vs_unoptimized=bits_unopt, vs_unoptimized=vs_unopt, violations=tuple(broken)))
        else:
            prev_level, prev_graph, prev_out = prev
            vs_prev = compare(dict(zip(names, prev_out, strict=True)), dict(zip(names, out, strict=True)), tolerance=tol)
            against_prev = [f"against {prev_level!r}: {v}" for v in tol.check(vs_prev)]
            broken = against_prev + broken
            bits = sum(_bits_differ(a, b) for a, b in zip(prev_out, out, strict=True))
            new = _new_nodes(prev_graph.graph, graph.graph)
            alignment = culprit = None
            note = ""
            if bits or against_prev:  # (a level with the previous one's outputs carries its change, adds none)
                alignment = _compare(observe(prev_level, prev_graph), observe(level, graph), tol, chunk_bytes, None)
                culprit, note = _culprit(alignment, graph.graph, new)
            changes.append(LevelChange(level, prev_level, len(graph.graph.node), tuple(new), bits, bits_unopt, n, vs_prev, vs_unopt, tuple(broken), alignment, culprit, note))
        if prev is not None:  # two levels back: no longer compared
            observed.pop(prev[0], None)
            plain.pop(prev[0], None)
        prev = (level, graph, out)
    name = m.graph.name or "model"
    return OptimizationReport(name, provider, _describe(tol), tuple(changes), tuple(notes))



# ------------------------------------------------------------------------------------------------
# check_deployment


class DeploymentMoved(CheckFailed):
    """A deployed model's outputs moved beyond the tolerance from those of the model it was made from
    (`result`: the DeploymentReport, its first divergence named); `check_deployment(..., raise_on_failure=True)`."""


@dataclass(frozen=True)
class DeploymentReport:
    """Did a deployment step move the numbers: `deployed` (the optimized, float16, quantized, int4 file) against
    `original` (the float32 export it was made from), output to output, and the two graphs aligned node to node
    with the first divergence named. `dtype`: what the outputs were judged in (the narrower of the two models'
    output dtypes and the deployed model's compute dtype: a float16 model behind float32 I/O is judged as
    float16); `tolerance`: the rules, resolved for it."""

    original: str
    deployed: str
    provider: str
    runtime: str
    dtype: str
    tolerance: Tolerance
    outputs: DiffReport
    violations: tuple[Violation, ...] = ()
    alignment: Alignment | None = None
    compute_dtype: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def divergence(self) -> Row | None:
        """The first aligned pair beyond the tolerance (None: none, or not aligned)."""
        return self.alignment.divergence if self.alignment is not None else None

    def divergence_line(self) -> str | None:
        """"first divergence: 'linear' (com.microsoft::MatMulNBits, node '/q_proj/MatMul_Q4') in deployed.onnx,
        against 'linear' (MatMul) in original.onnx: max abs 0.0428"."""
        row = self.divergence
        if row is None or row.a is None or row.b is None:
            return None
        b = row.b
        op = f"{b.domain}::{b.op_type}" if b.domain not in ("", "ai.onnx") else b.op_type
        node = f", node {b.node!r}" if b.node and b.node != b.name else ""
        what = f"{b.name!r} ({op}{node})" if b.kind == "result" else f"{b.kind} {b.name!r}"
        err = f": max abs {g(row.max_abs)}" if row.max_abs is not None else ""
        return f"first divergence: {what} in {self.deployed}, against {row.a.label} in {self.original}{err}"

    def summary(self) -> str:
        verdict = "within tolerance" if self.passed else "MOVED beyond tolerance"
        line = f"{self.deployed} vs {self.original}: outputs {verdict} (max abs {g(self.outputs.max_abs)}, judged as {self.dtype})"
        where = self.divergence_line()
        return f"{line}; {where}" if where else line

    def render(self, *, around: int = 4) -> str:
        """The failure report: the headline, the rules broken, the outputs' histogram, the first divergence and
        the side by side around it."""
        dtype = self.dtype if self.compute_dtype is None else f"{self.dtype} (the deployed model's compute dtype)"
        verdict = "passed" if self.passed else "outputs moved beyond tolerance"
        lines = [
            f"ortdiff.check_deployment: {self.deployed} vs {self.original} on {self.provider} ({'onnxruntime' if self.runtime == 'ort' else 'torch evaluator'}), "
            f"judged as {dtype}: {verdict} ({self.tolerance.describe()})"
        ]
        lines += [f"  - {v}" for v in self.violations]
        lines.append(self.outputs.render())
        lines.extend(f"note: {n}" for n in self.notes)
        where = self.divergence_line()
        if where:
            lines.append(where)
        if self.alignment is not None:
            lines.append(self.alignment.render(around=around))
        elif not self.passed:
            lines.append("(not aligned: pass align=True to see the graphs side by side)")
        return "\n".join(lines)

    def row(self, dtype: str | None = None) -> CheckRow:
        """The summary row of this check (`dtype`: the case's, the matrix's column; default the one judged in);
        a failure's worst line is its first divergence."""
        where = self.divergence_line() if not self.passed else None
        # (a case's column whose dtype is not the one judged in says which was: its tolerance is that dtype's)
        judged = (f"judged as {self.dtype}",) if dtype is not None and dtype != self.dtype else ()
        return row_for(self.outputs, self.tolerance, self.passed, provider=self.provider, dtype=dtype or self.dtype, suffix=" [deployment]", worst=where, notes=judged)

    def to_dict(self) -> dict[str, Any]:
        row = self.divergence
        return {
            "original": self.original,
            "deployed": self.deployed,
            "provider": self.provider,
            "runtime": self.runtime,
            "dtype": self.dtype,
            "compute_dtype": self.compute_dtype,
            "tolerance": self.tolerance.describe(),
            "passed": self.passed,
            "violations": [str(v) for v in self.violations],
            "outputs": self.outputs.to_dict(),
            "first_divergence": row.to_dict() if row is not None else None,
            "notes": list(self.notes),
            "alignment": self.alignment.to_dict() if self.alignment is not None else None,
        }


def _labels(original: Any, deployed: Any) -> tuple[str, str]:
    """The two files' names ("model.onnx" twice: with their folders), else "original" and "deployed"."""
    pa, pb = model_path(original), model_path(deployed)
    a, b = (pa.name if pa else "original"), (pb.name if pb else "deployed")
    if a == b and pa is not None and pb is not None:
        a, b = f"{pa.parent.name}/{a}", f"{pb.parent.name}/{b}"
    return (a, b) if a != b else (f"original {a}", f"deployed {b}")


def _judged_dtype(arrays: Sequence[np.ndarray], compute: str | None) -> str:
    """The narrowest floating dtype among the outputs and the compute dtype (float32 with none floating)."""
    names = [_dtype_name(x.dtype) for x in arrays if x.dtype.kind == "f"] + ([compute] if compute else [])
    out = names[0] if names else "float32"
    for name in names[1:]:
        out = _narrower(out, name)
    return out


def _fits(x: np.ndarray, dtype: str) -> bool:
    """Whether every finite value of a floating `x` lies in `dtype`'s range (a non-floating one: True)."""
    if x.dtype.kind != "f":
        return True
    finite = x[np.isfinite(x)]
    return not finite.size or float(np.abs(finite).max()) <= float(torch.finfo(dtype_of(dtype).torch).max)


def _as_judged(x: np.ndarray, dtype: str) -> np.ndarray:
    """A floating output wider than the dtype judged in, as that dtype stores it (saturated, rounded)."""
    if x.dtype.kind != "f" or x.dtype.itemsize <= dtype_of(dtype).itemsize:
        return x
    from ..numerics.tensors import to_numpy

    return to_numpy(torch.from_numpy(np.ascontiguousarray(_saturated(x, dtype))).to(dtype_of(dtype).torch))


def check_deployment(
    original: Any,
    deployed: Any,
    feeds: Any,
    *,
    provider: str = "CPU",
    tolerance: Any = None,
    runtime: AlignRuntime = "ort",
    session_options: Mapping[str, Any] | None = None,
    align: bool | None = None,
    labels: tuple[str, str] | None = None,
    chunk_mb: float = 64.0,
    raise_on_failure: bool = False,
) -> DeploymentReport:
    """Did a deployment step move the numbers? `deployed` (onnxruntime's optimizer, the float16 converter,
    quantize_dynamic / QDQ, MatMulNBits int4, onnxruntime-genai's builder applied to `original`) against
    `original`, on the same `feeds`:

    - their outputs, `original`'s as the expected ones (matched by name, else by position: two tools name them
      differently), judged by `tolerance` (a Tolerance, a dict of its arguments or (atol, rtol); default the
      dtype's) resolved for the narrower of the two output dtypes and the deployed model's compute dtype: a
      float16 model behind float32 inputs and outputs (keep_io_types=True) is judged as float16;
    - when the outputs moved beyond it (or `align=True`), the two graphs aligned node to node
      (`compare_executions`: a fused node against the last node of the subgraph it replaced, float16 values
      with their Casts against float32 ones, MatMulNBits against MatMul, QDQ pairs against the float graph),
      each pair judged the same way, and the first divergence named: the deployed model's node, its op and its
      error.

    `feeds`: a dict by input name (a superset for two models whose inputs differ, e.g. a decoder's past
    key/values: each model takes its own; `models.transformer_feeds(deployed)` gives them) or a list in input
    order; floating feeds are cast to each model's input dtype. `runtime`, `session_options` (both sides; the
    graphs as written by default), `chunk_mb`: as for `compare_executions`. Returns a `DeploymentReport`
    (`.passed`, `.divergence`, `.render()`, `.row()`); `raise_on_failure=True` raises DeploymentMoved
    carrying it instead when the outputs moved; the `ortdiff` fixture's `check_deployment` fails the test.
    """
    if runtime not in ("ort", "torch"):
        raise ValueError(f"runtime={runtime!r}; valid: 'ort' (onnxruntime) or 'torch' (the torch evaluator)")
    if not (isinstance(chunk_mb, int | float) and chunk_mb > 0):
        raise ValueError(f"chunk_mb must be a positive number of MiB, got {chunk_mb!r}")
    chunk_bytes = int(chunk_mb * 2**20)
    lab = labels or _labels(original, deployed)
    common = {"runtime": runtime, "provider": provider, "constants": False, "chunk_bytes": chunk_bytes, "session_options": session_options}
    ex_a = _execution(original, feeds, label=lab[0], **common)  # type: ignore[arg-type]
    ex_b = _execution(deployed, feeds, label=lab[1], **common)  # type: ignore[arg-type]
    compute = compute_dtype(ex_b.model)
    names_a = [o.name for o in ex_a.model.graph.output]
    names_b = [o.name for o in ex_b.model.graph.output]
    notes: list[str] = []
    if all(n in names_b for n in names_a):
        matched = [(n, n) for n in names_a]
    else:
        matched = list(zip(names_a, names_b, strict=False))
        notes.append("outputs matched by position (their names differ): " + ", ".join(f"{a} ~ {b}" for a, b in matched))
    extra = [n for n in names_b if n not in {b for _, b in matched}]
    if extra:
        notes.append(f"{lab[1]}'s outputs {extra} have no counterpart in {lab[0]} (not compared)")
    out_a = dict(ex_a.fetch([a for a, _ in matched]))
    out_b = dict(ex_b.fetch([b for _, b in matched]))
    # the compute dtype judges only outputs that fit in its range: a value beyond it (a float32 scale after the
    # float16 part) would saturate on both sides and hide any difference
    fits = compute is None or all(_fits(x, compute) for x in [*out_a.values(), *out_b.values()])
    judged = _judged_dtype([*out_a.values(), *out_b.values()], compute if fits else None)
    if not fits:
        notes.append(f"outputs hold values beyond {compute}'s range (the deployed model computes in {compute}, then scales in a wider dtype): judged as {judged}")
    tol_spec = _as_tolerance(tolerance)
    tol = tol_spec.for_dtype(judged)
    expected = {a: _as_judged(out_a[a], judged) for a, _ in matched}
    got = {a: _as_judged(out_b[b], judged) for a, b in matched}
    for a, b in matched:
        if expected[a].shape != got[a].shape:
            raise ValueError(f"output {a!r} of {lab[0]} is {list(expected[a].shape)} and {b!r} of {lab[1]} is {list(got[a].shape)}: not one function's outputs on these feeds")
    report = compare(expected, got, tolerance=tol.allclose, thresholds=tuple(sorted({*DEFAULT_THRESHOLDS, *tol.thresholds})))
    violations = tuple(tol.check(report))
    if report.n == 0:  # every output empty on these feeds: nothing compared is not a pass
        from ..engine.check import _nothing_compared

        violations += (_nothing_compared(report, feeds if isinstance(feeds, Mapping) else {}),)
    alignment = None
    if align or (align is None and violations):
        alignment = _compare(ex_a, ex_b, tol_spec, chunk_bytes, None, floor=compute)
    result = DeploymentReport(
        original=lab[0], deployed=lab[1], provider=ex_a.provider, runtime=runtime, dtype=judged, tolerance=tol, outputs=report,
        violations=violations, alignment=alignment, compute_dtype=compute if fits else None, notes=tuple(notes),
    )
    if raise_on_failure and not result.passed:
        raise DeploymentMoved(result.render(), result)
    return result
