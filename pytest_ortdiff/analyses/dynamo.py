"""A torch.compile backend running onnxruntime: each FX graph dynamo captures (forward, and backward through
aot_autograd) is exported to ONNX and run by onnxruntime, optionally compared with eager torch on every call."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..engine.check import (
    CheckFailed,
    ToleranceBroken,
    ToleranceLike,
    UnsupportedByProvider,
    _as_tolerance,
    row_for,
)
from ..numerics.diff import DEFAULT_THRESHOLDS, DiffReport, compare
from ..numerics.formatting import g, table
from ..numerics.tolerance import Tolerance, Violation
from ..runtimes.providers import KNOWN, parse_provider, torch_device, unavailable_reason

if TYPE_CHECKING:
    import onnx

    from ..numerics.results import CheckRow
    from ..runtimes.ort import OrtRunner

__all__ = [
    "CallRecord",
    "CompileCheck",
    "CompiledGraph",
    "ExportFailed",
    "ExportUnavailable",
    "Fallback",
    "OrtBackend",
    "OrtDiffFallbackWarning",
    "StepRow",
    "backward_decompositions",
    "check_compile",
    "export_graph",
    "make_backend",
    "ort_backend",
    "shorten_error",
]

GraphKind = Literal["forward", "backward", "inference"]
Stage = Literal["export", "onnxruntime", "outputs"]
#: a compiled graph's input signature: per argument (shape, dtype, device) of a tensor, or the value itself
Signature = tuple[Any, ...]


class ExportUnavailable(ImportError):
    """torch.onnx.export(dynamo=True) needs onnxscript, which is not installed."""


class ExportFailed(RuntimeError):
    """With `fallback=False`: a graph the exporter (or onnxruntime) cannot take. `fallback` says which graph,
    at which stage, and the exporter's error, shortened."""

    def __init__(self, fallback: Fallback) -> None:
        self.fallback = fallback
        super().__init__(
            f"{fallback.graph} [{fallback.shapes}]: {fallback.stage} failed: {fallback.reason}; "
            "make_backend(fallback=True) runs such a graph eagerly instead (and records why)"
        )


class OrtDiffFallbackWarning(UserWarning):
    """A graph runs eagerly: the exporter or onnxruntime could not take it (the message says why)."""


@dataclass(frozen=True)
class Fallback:
    """A graph (at one input signature) that runs eagerly: the stage that failed ("export": torch.onnx's
    exporter; "onnxruntime": the session refused the model or failed on it; "outputs": onnxruntime's outputs
    have other shapes or dtypes than eager's) and why, shortened. `error` is the exception itself."""

    graph: str
    shapes: str
    stage: Stage
    reason: str
    error: BaseException | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return f"{self.graph} [{self.shapes}]: {self.stage} failed, runs eagerly: {self.reason}"

    @property
    def short(self) -> str:
        """The reason in a few words, for a summary row: "no ONNX function for aten.avg_pool2d_backward"."""
        m = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", self.reason)
        return f"no ONNX function for {m.group(1)}" if m else _clip(self.reason, 80)


@dataclass(frozen=True)
class CallRecord:
    """One call of a compiled graph in `check=True` mode: onnxruntime's outputs against the same FX graph run
    eagerly on the same inputs (`report`, judged by the backend's tolerance into `violations`); for a graph
    that fell back, `ran_on` is "eager", `fallback` says why, and there is nothing to compare."""

    graph: str
    call: int
    shapes: str
    ran_on: Literal["onnxruntime", "eager"]
    report: DiffReport | None = None
    violations: tuple[Violation, ...] = ()
    fallback: Fallback | None = None

    @property
    def max_abs(self) -> float | None:
        return self.report.max_abs if self.report is not None else None

    @property
    def max_ulp(self) -> float | None:
        return self.report.max_ulp if self.report is not None else None

    @property
    def passed(self) -> bool | None:
        """True/False: within/beyond the tolerance; None: nothing compared (the graph ran eagerly)."""
        return None if self.report is None else not self.violations

    @property
    def verdict(self) -> str:
        if self.fallback is not None:
            return f"eager ({self.fallback.stage} failed)"
        if self.report is None:
            return "-"
        return "ok" if not self.violations else "BROKEN"


# ------------------------------------------------------------------------------------------------
# export of one aot graph


_REGISTRIES: dict[int, Any] = {}
#: exported models (or the exporter's error) by (graph code, input signature, export settings); aot graphs
#: take the weights as inputs, so these models are small
_EXPORTS: OrderedDict[Any, Any] = OrderedDict()
_EXPORTS_KEPT = 128
_REGISTRY_LOCK = threading.Lock()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEPS = {"1": "torch.export", "2": "decomposition", "3": "ONNX translation"}


def _require_onnxscript() -> None:
    try:
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ExportUnavailable(
            "the onnxruntime backend exports graphs with torch.onnx.export(dynamo=True), which needs onnxscript: "
            "pip install 'pytest-ortdiff[export]' (or pip install onnxscript)"
        ) from exc


def _registry(opset: int, custom_translation_table: Mapping[Any, Callable[..., Any]] | None) -> Any:
    """torchlib's ONNX registry for `opset`, built once per process (about 1 s each time torch.onnx.export
    builds it), with `custom_translation_table` registered on a copy. None when this torch lays its exporter
    out otherwise (export_graph then goes through the public torch.onnx.export)."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return None
    with _REGISTRY_LOCK:
        base = _REGISTRIES.get(opset)
        if base is None:
            noisy = logging.getLogger(_registration.__name__)
            level = noisy.level
            noisy.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms", ...
            try:
                base = _REGISTRIES[opset] = _registration.ONNXRegistry.from_torchlib(opset_version=opset)
            finally:
                noisy.setLevel(level)
    if not custom_translation_table:
        return base
    registry = copy.copy(base)  # the cached one stays as torchlib has it
    registry.functions = {k: list(v) for k, v in base.functions.items()}
    for op, function in custom_translation_table.items():
        registry.register_op(op, function, is_complex=False)
    return registry


def _torchlib_opset() -> int:
    """The opset torchlib implements (its registry's floor: lower ones are reached by version conversion)."""
    try:
        from torch.onnx._internal.exporter import _constants
    except ImportError:
        return 18
    return int(_constants.TORCHLIB_OPSET)


def _in_fresh_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` in a new thread. aot_autograd calls a compiled graph inside an autograd.Function whose
    thread-local dispatch state breaks the exporter's functionalization ("Attempting to use FunctionalTensor
    on its own"); a fresh thread starts with clean thread-local state (and grad mode on)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="ortdiff-export")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def export_graph(
    module: torch.nn.Module,
    args: Sequence[torch.Tensor],
    *,
    opset: int | None = None,
    custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
    optimize: bool = False,
) -> onnx.ModelProto:
    """`module(*args)` exported by torch.onnx's dynamo exporter (torch.export, then torchlib), as a model proto.

    The TorchScript exporter cannot take aot_autograd's backward graphs (it has no symbolic for
    `aten::threshold_backward` and the like); torchlib has them. The registry is built once per opset and
    the export runs in a fresh thread (see `_in_fresh_thread`). `optimize=False` by default: onnxruntime
    optimizes the graph itself, and onnxscript's optimizer costs more than the export.
    """
    _require_onnxscript()
    target = opset if opset is not None else _torchlib_opset()
    registry = _registry(max(target, _torchlib_opset()), custom_translation_table)

    def run() -> onnx.ModelProto:
        program: Any
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            # the exporter's own deprecations and progress lines: none is about the user's graph
            warnings.simplefilter("ignore")
            if registry is not None:
                from torch.onnx._internal.exporter import _core

                program = _core.export(module, tuple(args), registry=registry, optimize=optimize, verbose=False, opset_version=target)
            else:
                program = torch.onnx.export(
                    module,
                    tuple(args),
                    dynamo=True,
                    optimize=optimize,
                    verbose=False,
                    opset_version=target,
                    custom_translation_table=dict(custom_translation_table) if custom_translation_table else None,
                )
        if program is None:
            raise RuntimeError("torch.onnx.export returned no program")
        return program.model_proto

    result: onnx.ModelProto = _in_fresh_thread(run)
    return result


_BACKWARD_DECOMPOSITIONS: dict[Any, dict[Any, Callable[..., Any]]] = {}


def backward_decompositions(
    opset: int | None = None, custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None
) -> dict[Any, Callable[..., Any]]:
    """The decompositions aot_autograd applies so that backward graphs export: torch's decomposition of every
    `*_backward` op torchlib has no ONNX function for (silu_backward, native_layer_norm_backward,
    _softmax_backward_data, max_pool2d_with_indices_backward, ...), and `convolution_backward` as convolutions
    (torch has no decomposition of it, torchlib no function; avg_pool2d_backward has neither: it falls back).
    Forward ops are left alone: they export as the ONNX ops users ship (LayerNormalization, Gelu, ...). Built
    once per registry."""
    _require_onnxscript()
    key = (opset, tuple(sorted((str(k), id(v)) for k, v in (custom_translation_table or {}).items())))
    table = _BACKWARD_DECOMPOSITIONS.get(key)
    if table is None:
        # (torch's registry of decompositions: the core-ATen ones and the others; the backward ops missing from
        # it are composite ones that aot_autograd never sees)
        from torch._decomp import decomposition_table

        registry = _registry(max(opset or _torchlib_opset(), _torchlib_opset()), custom_translation_table)
        table = {
            op: fn
            for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and "backward" in op.name() and not (registry is not None and registry.is_registered(op))
        }
        table[torch.ops.aten.convolution_backward.default] = _convolution_backward
        _BACKWARD_DECOMPOSITIONS[key] = table
    return table


def _convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """aten.convolution_backward as forward convolutions. The input's gradient: a transposed convolution of
    grad_output by the weight (a plain one for a transposed convolution). The weight's: a correlation of the
    input with grad_output (of grad_output with the input when transposed), batch and channels exchanged per
    group, stride and dilation swapped. The bias's: a sum."""
    aten = torch.ops.aten
    spatial = list(range(2, input.dim()))
    k = list(weight.shape[2:])
    zeros = [0] * len(k)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            grad_input = aten.convolution.default(grad_output, weight, None, stride, padding, dilation, False, zeros, groups)
        else:
            # the rows of input the forward's stride skipped at the end: the transposed convolution's output_padding
            extra = [input.shape[d] + 2 * padding[i] - dilation[i] * (k[i] - 1) - 1 - (grad_output.shape[d] - 1) * stride[i] for i, d in enumerate(spatial)]
            grad_input = aten.convolution.default(grad_output, weight, None, stride, padding, dilation, True, extra, groups)
    if output_mask[1]:
        src, dst = (grad_output, input) if transposed else (input, grad_output)
        n, sg, dg = src.shape[0], src.shape[1] // groups, dst.shape[1] // groups
        rest_src, rest_dst = list(src.shape[2:]), list(dst.shape[2:])
        dims = list(range(3, 3 + len(k)))
        # x[sg, (group, n), ...] correlated with w[(group, dg), n, ...], `groups` groups: [sg, groups * dg, k' >= k]
        x = src.reshape([n, groups, sg, *rest_src]).permute([2, 1, 0, *dims]).reshape([sg, groups * n, *rest_src])
        w = dst.reshape([n, groups, dg, *rest_dst]).permute([1, 2, 0, *dims]).reshape([groups * dg, n, *rest_dst])
        out = aten.convolution.default(x, w, None, dilation, padding, stride, False, zeros, groups)
        for i, size in enumerate(k):
            out = out.narrow(2 + i, 0, size)
        grad_weight = out.transpose(0, 1)
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *spatial])
    return grad_input, grad_weight, grad_bias


def shorten_error(exc: BaseException, limit: int = 400) -> str:
    """The exporter's error as one line: the failing step and the root cause from its "Exception summary"
    (`DispatchError: No ONNX function found for <OpOverload(op='ns.op', ...)>`), at most `limit` characters."""
    text = _ANSI.sub("", str(exc)).strip()
    summary = re.search(r"## Exception summary\s*\n\s*(\S[^\n]*)", text)
    line = summary.group(1) if summary else next((x.strip() for x in text.splitlines() if x.strip()), "")
    line = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", line)
    step = re.search(r"step (\d)/3", text)
    where = f" at step {step.group(1)}/3 ({_STEPS.get(step.group(1), '?')})" if step else ""
    out = f"{type(exc).__name__}{where}: {line}" if line else f"{type(exc).__name__}{where}"
    return out if len(out) <= limit else out[: limit - 3] + "..."


class _GraphOutputs(torch.nn.Module):
    """An aot graph as the exporter sees it: its tensor arguments in (the others baked in as this input
    signature's constants), its computed tensor outputs out (not the None/int ones, nor inputs passed through)."""

    def __init__(self, gm: torch.fx.GraphModule, values: Sequence[Any], outputs: Sequence[int]) -> None:
        super().__init__()
        self.gm = gm
        self.tensor_positions = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        self.values = [None if isinstance(v, torch.Tensor) else v for v in values]  # (no tensor kept alive)
        self.outputs = list(outputs)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(self.values)
        for i, t in zip(self.tensor_positions, tensors, strict=True):
            values[i] = t
        out = self.gm(*values)
        return tuple(out[j] for j in self.outputs)


# ------------------------------------------------------------------------------------------------
# the compiled graphs


_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "int32": "i32", "bool": "b8"}


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        from ..numerics.dtypes import dtype_of

        try:
            name = dtype_of(value.dtype).short
        except (ValueError, KeyError):
            name = str(value.dtype).removeprefix("torch.")
        return f"{_SHORT_DTYPES.get(name, name)}[{','.join(map(str, value.shape))}]"
    return repr(value)


def _signature(values: Sequence[Any], free: frozenset[int]) -> Signature:
    """What an exported model is specific to: tensors' shapes, dtypes and devices, and the other arguments'
    values, except those (`free`) the graph only passes through to its outputs (a symbolic size or storage
    offset saved for the backward): these do not change the model."""
    return tuple(
        (tuple(v.shape), v.dtype, v.device.type)
        if isinstance(v, torch.Tensor)
        else ("passed through",)
        if i in free
        else ("value", type(v).__name__, repr(v))
        for i, v in enumerate(values)
    )


@dataclass
class _Entry:
    """One input signature of a compiled graph: its ONNX model and session, or why it runs eagerly."""

    shapes: str
    #: per graph output: ("ort", k) k-th onnxruntime output, ("input", i) argument i, ("value", v) a constant
    template: list[tuple[str, Any]]
    names: list[str]  # the fx output node of each onnxruntime output (the check's report names them)
    devices: list[torch.device]  # where eager puts each onnxruntime output
    runner: OrtRunner | None = None
    model: onnx.ModelProto | None = None
    fallback: Fallback | None = None


class CompiledGraph:
    """One graph aot_autograd handed to the backend (`id`: "forward 0", "backward 0", "inference 1": the kind
    and the index of the dynamo graph it comes from), callable with aot's boxed convention.

    On the first call at each input signature (shapes, dtypes, and the values of int arguments: a graph
    compiled with symbolic shapes is exported once per concrete shape) the graph runs eagerly once, is
    exported to ONNX and gets an onnxruntime session; later calls run onnxruntime only (and eager too in
    `check=True` mode). `models` holds the ONNX model per signature, `calls` counts the calls.
    """

    def __init__(self, backend: OrtBackend, gm: torch.fx.GraphModule, kind: GraphKind, index: int) -> None:
        self.backend = backend
        self.gm = gm
        self.kind = kind
        self.index = index
        self.id = f"{kind} {index}"
        self.calls = 0
        self._entries: dict[Signature, _Entry] = {}
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._free = frozenset(i for i, n in enumerate(self._placeholders) if all(u.op == "output" for u in n.users))
        # an instance attribute: aot_autograd wraps the bw compiler's result with functools.wraps, which
        # copies the instance's __dict__ (not class attributes) onto the wrapper it calls
        self._boxed_call = True

    def __repr__(self) -> str:
        return f"CompiledGraph({self.id!r}, signatures={len(self._entries)}, calls={self.calls})"

    @property
    def models(self) -> dict[str, onnx.ModelProto]:
        """Input signature ("f32[3,10] f32[32,10] ...") -> the ONNX model onnxruntime runs for it."""
        return {e.shapes: e.model for e in self._entries.values() if e.model is not None}

    @property
    def fallbacks(self) -> list[Fallback]:
        return [e.fallback for e in self._entries.values() if e.fallback is not None]

    def __call__(self, args: list[Any]) -> list[Any]:
        values = list(args)
        args.clear()  # the boxed convention: aot frees the inputs as soon as the graph is done with them
        key = _signature(values, self._free)
        entry = self._entries.get(key)
        expected: list[Any] | None = None
        got: list[Any] | None = None
        if entry is None:
            entry, expected, got = self._prepare(key, values)
            self._entries[key] = entry
        self.calls += 1
        if entry.fallback is not None:
            out = expected if expected is not None else list(self.gm(*values))
            if self.backend.check:
                self.backend._add(CallRecord(self.id, self.calls, entry.shapes, "eager", fallback=entry.fallback))
            return out
        if got is None:
            got = self._run(entry, values)
        if self.backend.check:
            if expected is None:
                expected = list(self.gm(*values))
            self.backend._add(self._judge(entry, expected, got))
        return got

    def _judge(self, entry: _Entry, expected: list[Any], got: list[Any]) -> CallRecord:
        pairs = [(entry.names[ref], j) for j, (kind, ref) in enumerate(entry.template) if kind == "ort"]
        seen: dict[str, int] = {}
        for name, j in pairs:
            seen.setdefault(name, j)
        tol = self.backend.tolerance
        report = compare(
            {name: expected[j] for name, j in seen.items()},
            {name: got[j] for name, j in seen.items()},
            thresholds=sorted(set(DEFAULT_THRESHOLDS) | set(tol.thresholds)),
            tolerance=tol,
        )
        return CallRecord(self.id, self.calls, entry.shapes, "onnxruntime", report, tuple(tol.check(report)))

    def _run(self, entry: _Entry, values: Sequence[Any]) -> list[Any]:
        outs: list[torch.Tensor] = []
        if entry.runner is not None:
            tensors = [v.detach() for v in values if isinstance(v, torch.Tensor)]
            if entry.runner.device.type == "cpu":  # a CPU session cannot read device memory: the one copy it forces
                tensors = [t if t.device.type == "cpu" else t.cpu() for t in tensors]
            outs = entry.runner.run(None, dict(zip(entry.runner.input_names, tensors, strict=True)))
        result: list[Any] = []
        for kind, ref in entry.template:
            if kind == "ort":
                t = outs[ref]
                result.append(t if t.device == entry.devices[ref] else t.to(entry.devices[ref]))
            elif kind == "input":
                result.append(values[ref])
            else:
                result.append(ref)
        return result

    def _prepare(self, key: Signature, values: list[Any]) -> tuple[_Entry, list[Any], list[Any] | None]:
        """The entry for a new input signature: eager outputs (the template of what is a tensor, an input
        passed through, a constant), then export, session and a first run checked against eager's shapes.
        Returns (entry, eager outputs, onnxruntime's outputs or None when it falls back)."""
        shapes = " ".join(_describe(v) for v in values)
        expected = list(self.gm(*values))
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        out_args = out_node.args[0]
        out_args = list(out_args) if isinstance(out_args, list | tuple) else [out_args]
        placeholders = self._placeholders
        template: list[tuple[str, Any]] = []
        names: list[str] = []
        devices: list[torch.device] = []
        computed: list[int] = []  # graph output positions onnxruntime computes
        by_node: dict[Any, int] = {}
        for j, (arg, value) in enumerate(zip(out_args, expected, strict=True)):
            if isinstance(arg, torch.fx.Node) and arg.op == "placeholder":
                template.append(("input", placeholders.index(arg)))  # passed through, whatever its type
            elif not isinstance(value, torch.Tensor):
                template.append(("value", value))  # None, or a size computed from this signature's shapes
            elif isinstance(arg, torch.fx.Node) and arg in by_node:
                template.append(("ort", by_node[arg]))
            else:
                k = len(computed)
                if isinstance(arg, torch.fx.Node):
                    by_node[arg] = k
                computed.append(j)
                names.append(arg.name if isinstance(arg, torch.fx.Node) else f"output {j}")
                devices.append(value.device)
                template.append(("ort", k))
        entry = _Entry(shapes, template, names, devices)
        if not computed:  # inputs passed through and constants only: nothing to export
            return entry, expected, expected
        tensors = [v.detach() for v in values if isinstance(v, torch.Tensor)]
        try:
            entry.model = self.backend._export(self.gm, key, values, computed, tensors)
        except ExportUnavailable:
            raise
        except Exception as exc:
            return self._fall_back(entry, "export", shorten_error(exc), exc), expected, None
        n_in, n_out = len(entry.model.graph.input), len(entry.model.graph.output)
        if n_in != len(tensors) or n_out != len(computed):
            reason = (
                f"the exported model has {n_in} inputs and {n_out} outputs, "
                f"the graph {len(tensors)} tensor inputs and {len(computed)} computed outputs"
            )
            return self._fall_back(entry, "export", reason), expected, None
        from ..runtimes.ort import OrtRunner, ProviderUnavailableError, UnsupportedByProviderError

        try:
            # (errors only in onnxruntime's log: exported graphs declare shapes it re-infers and warns about)
            entry.runner = OrtRunner(entry.model, provider=self.backend.provider, session_options={"log_severity_level": 3})
            got = self._run(entry, values)
        except ProviderUnavailableError:
            raise
        except UnsupportedByProviderError as exc:
            entry.runner = None
            return self._fall_back(entry, "onnxruntime", str(exc).splitlines()[0], exc), expected, None
        except Exception as exc:
            entry.runner = None
            return self._fall_back(entry, "onnxruntime", shorten_error(exc), exc), expected, None
        for k, j in enumerate(computed):
            e, o = expected[j], got[j]
            if e.numel() == 0 and e.dtype == o.dtype and tuple(e.shape) != tuple(o.shape):
                # eval-mode batch norm saves empty mean/invstd for its backward, torchlib's translation the
                # running stats: eager's empty tensor is the value (it has no elements to differ in)
                same = [i for i, (kind, ref) in enumerate(entry.template) if kind == "ort" and ref == k]
                for i in same:
                    entry.template[i] = ("value", e)
                    got[i] = e
                continue
            if tuple(e.shape) != tuple(o.shape) or e.dtype != o.dtype:
                entry.runner = None
                reason = f"output {names[k]!r}: onnxruntime gives {_describe(o)}, eager {_describe(e)}"
                return self._fall_back(entry, "outputs", reason), expected, None
        return entry, expected, got

    def _fall_back(self, entry: _Entry, stage: Stage, reason: str, error: BaseException | None = None) -> _Entry:
        fallback = Fallback(self.id, entry.shapes, stage, reason, error)
        if not self.backend.fallback:
            raise ExportFailed(fallback) from error
        entry.fallback = fallback
        self.backend.fallbacks.append(fallback)
        warnings.warn(str(fallback), OrtDiffFallbackWarning, stacklevel=2)
        return entry


# ------------------------------------------------------------------------------------------------
# the backend


class OrtBackend:
    """A torch.compile backend: `torch.compile(model, backend=OrtBackend(...))`. Each dynamo graph goes through
    aot_autograd; its forward, backward and inference graphs become `CompiledGraph`s run by onnxruntime on
    `provider`.

    - `check=True`: every call also runs the FX graph eagerly and appends a `CallRecord` (max abs, max ulp,
      verdict under `tolerance`) to `records`; `report()` renders them.
    - A graph the exporter or onnxruntime cannot take runs eagerly, with a `Fallback` in `fallbacks` and an
      `OrtDiffFallbackWarning`; `fallback=False` raises `ExportFailed` instead.
    - `opset`: the exported models' opset (default: torchlib's, 18); `custom_translation_table`: onnxscript
      functions for ops torchlib lacks, as `torch.onnx.export` takes it.
    Graphs are exported on their first call at each input signature (shapes; with symbolic shapes, once per
    concrete shape), not at compile time, when dynamo only has fake tensors.
    """

    def __init__(
        self,
        *,
        provider: str = "CPU",
        check: bool = False,
        tolerance: ToleranceLike = None,
        fallback: bool = True,
        opset: int | None = None,
        custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
        optimize: bool = False,
    ) -> None:
        self.provider = parse_provider(provider)
        self.check = check
        self.tolerance: Tolerance = _as_tolerance(tolerance)
        self.fallback = fallback
        if opset is not None and (not isinstance(opset, int) or opset < 7):
            raise ValueError(f"opset must be an ONNX opset version (an int, 18 or above for torchlib's own), got {opset!r}")
        self.opset = opset
        self.custom_translation_table = dict(custom_translation_table) if custom_translation_table else None
        self.optimize = optimize
        self.graphs: list[CompiledGraph] = []
        self.records: list[CallRecord] = []
        self.fallbacks: list[Fallback] = []
        self._dynamo_graphs = 0
        self._ready = False

    def __repr__(self) -> str:
        return f"OrtBackend(provider={self.provider!r}, check={self.check}, graphs={len(self.graphs)}, fallbacks={len(self.fallbacks)})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        if not self._ready:
            reason = unavailable_reason(self.provider)
            if reason:
                raise RuntimeError(f"the onnxruntime backend cannot run on {self.provider}: {reason}")
            _require_onnxscript()
            self._ready = True
        from functools import partial

        from torch._dynamo.backends.common import aot_autograd

        index = self._dynamo_graphs
        self._dynamo_graphs += 1
        compiler = aot_autograd(
            fw_compiler=partial(self._compile, "forward", index),
            bw_compiler=partial(self._compile, "backward", index),
            inference_compiler=partial(self._compile, "inference", index),
            decompositions=backward_decompositions(self.opset, self.custom_translation_table),
        )
        compiled: Callable[..., Any] = compiler(gm, example_inputs)
        return compiled

    def _compile(self, kind: GraphKind, index: int, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        graph = CompiledGraph(self, gm, kind, index)
        self.graphs.append(graph)
        return graph

    def _export(
        self, gm: torch.fx.GraphModule, key: Signature, values: Sequence[Any], computed: Sequence[int], tensors: Sequence[torch.Tensor]
    ) -> onnx.ModelProto:
        """The ONNX model of `gm` at this input signature, exported once per process for every backend with
        these export settings: the same module class (checked again, or under another backend) gives the
        same aot graph code. Graphs holding tensors of their own (get_attr) are exported each time."""
        cacheable = not any(n.op == "get_attr" for n in gm.graph.nodes)
        table = tuple(sorted((str(k), id(v)) for k, v in (self.custom_translation_table or {}).items()))
        cache_key = (gm.code, key, tuple(computed), self.opset, table, self.optimize)
        cached = _EXPORTS.get(cache_key) if cacheable else None
        if cached is not None:
            _EXPORTS.move_to_end(cache_key)
            if isinstance(cached, BaseException):
                raise cached
            return cached
        try:
            module = _GraphOutputs(gm, values, computed)
            model = export_graph(module, tensors, opset=self.opset, custom_translation_table=self.custom_translation_table, optimize=self.optimize)
        except ExportUnavailable:
            raise
        except Exception as exc:
            if cacheable:  # the same graph fails the same way: fall back at once next time
                _EXPORTS[cache_key] = exc.with_traceback(None)
            raise
        if cacheable:
            _EXPORTS[cache_key] = model
            while len(_EXPORTS) > _EXPORTS_KEPT:
                _EXPORTS.popitem(last=False)
        return model

    def _add(self, record: CallRecord) -> None:
        self.records.append(record)

    def reset(self) -> None:
        """Forget the records and fallbacks (the compiled graphs stay: dynamo keeps calling them)."""
        self.records.clear()
        self.fallbacks.clear()

    def report(self, records: Sequence[CallRecord] | None = None) -> str:
        """The per-graph, per-call table (graph, call, input shapes, where it ran, max abs, max ulp, verdict),
        then the fallbacks with their reasons."""
        chosen = self.records if records is None else records
        return render_records(chosen, provider=self.provider, tolerance=self.tolerance, graphs=self.graphs)

    def summary(self, records: Sequence[CallRecord] | None = None) -> str:
        """One row per graph (for long loops, where `report()` has a row per call): calls, input signatures,
        the worst max abs and max ulp over its calls, how many calls broke the tolerance or ran eagerly."""
        chosen = self.records if records is None else records
        by_graph: dict[str, list[CallRecord]] = {}
        for r in chosen:
            by_graph.setdefault(r.graph, []).append(r)
        body = []
        for graph, rs in by_graph.items():
            abs_ = [r.max_abs for r in rs if r.max_abs is not None]
            ulp = [r.max_ulp for r in rs if r.max_ulp is not None]
            body.append(
                [
                    graph,
                    str(len(rs)),
                    str(len({r.shapes for r in rs})),
                    g(max(abs_, default=None)),
                    g(max(ulp, default=None)),
                    str(sum(r.passed is False for r in rs)),
                    str(sum(r.ran_on == "eager" for r in rs)),
                ]
            )
        ep = KNOWN.get(self.provider, self.provider)
        head = f"onnxruntime ({ep}) vs the same FX graph in eager torch, per graph ({self.tolerance.describe()}): {len(chosen)} calls"
        return "\n".join([head, *table(["graph", "calls", "shapes", "worst max abs", "worst max ulp", "broken", "eager"], body, indent="  ")])


def _clip(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_records(records: Sequence[CallRecord], *, provider: str, tolerance: Tolerance, graphs: Sequence[CompiledGraph] = ()) -> str:
    ep = KNOWN.get(provider, provider)
    ids = list(dict.fromkeys(r.graph for r in records)) or [gr.id for gr in graphs]
    lines = [
        f"onnxruntime ({ep}) vs the same FX graph in eager torch, per graph and call ({tolerance.describe()}): "
        f"{len(ids)} graphs, {len(records)} calls"
    ]
    if records:
        body = [[r.graph, str(r.call), _clip(r.shapes), r.ran_on, g(r.max_abs), g(r.max_ulp), r.verdict] for r in records]
        lines += table(["graph", "call", "inputs", "ran on", "max abs", "max ulp", "verdict"], body, indent="  ")
    else:
        lines.append("  (no call recorded: check=True records every call)")
    fallbacks = list(dict.fromkeys(r.fallback for r in records if r.fallback is not None))
    if fallbacks:
        lines.append("fallbacks (these graphs ran eagerly):")
        lines += [f"  {f}" for f in fallbacks]
    broken = [r for r in records if r.violations]
    if broken:  # the first in full: the table has the others
        r = broken[0]
        others = f" (and {len(broken) - 1} more calls, in the table)" if len(broken) > 1 else ""
        lines.append(f"{r.graph}, call {r.call}: tolerance broken{others}")
        lines += [f"  - {v}" for v in r.violations]
        assert r.report is not None
        lines.append(r.report.render())
    return "\n".join(lines)


def make_backend(
    *,
    provider: str = "CPU",
    check: bool = False,
    tolerance: ToleranceLike = None,
    fallback: bool = True,
    opset: int | None = None,
    custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
    optimize: bool = False,
) -> OrtBackend:
    """A torch.compile backend running onnxruntime on `provider`; see `OrtBackend`."""
    return OrtBackend(
        provider=provider,
        check=check,
        tolerance=tolerance,
        fallback=fallback,
        opset=opset,
        custom_translation_table=custom_translation_table,
        optimize=optimize,
    )


#: `torch.compile(model, backend=ort_backend)`: onnxruntime on CPU, falling back to eager (with a warning)
#: for graphs the exporter cannot take
ort_backend = make_backend()


# ------------------------------------------------------------------------------------------------
# a module under compile vs eager


@dataclass(frozen=True)
class StepRow:
    """One training step: the eager and compiled losses, and the largest gradient difference."""

    step: int
    eager_loss: float
    compiled_loss: float
    grad_max_abs: float | None


@dataclass(frozen=True)
class CompileCheck:
    """What `check_compile` found: the module's outputs (and per training step its loss and gradients, and the
    parameters after the last step) under torch.compile + onnxruntime against eager (`report`, judged into
    `violations`); the per-graph, per-call records of the backend, its fallbacks, and the graphs it ran."""

    provider: str
    dtype: str
    tolerance: Tolerance
    report: DiffReport
    violations: tuple[Violation, ...]
    steps: tuple[StepRow, ...]
    records: tuple[CallRecord, ...]
    fallbacks: tuple[Fallback, ...]
    graphs: tuple[str, ...]
    problems: tuple[str, ...] = ()
    #: why dynamo broke the graph or skipped code (that code ran eagerly, outside the backend), from its counters
    graph_breaks: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.violations and not self.problems and all(r.passed is not False for r in self.records)

    @property
    def on_onnxruntime(self) -> tuple[str, ...]:
        """The graphs that ran on onnxruntime (at least once)."""
        return tuple(dict.fromkeys(r.graph for r in self.records if r.ran_on == "onnxruntime"))

    def render(self) -> str:
        broken = self.violations or any(r.violations for r in self.records)
        verdict = "passed" if self.passed else "tolerance broken" if broken else "failed"
        lines = [f"ortdiff: torch.compile (onnxruntime {self.provider}) vs eager {self.dtype}: {verdict} ({self.tolerance.describe()})"]
        lines += [f"  - {p}" for p in self.problems]
        lines += [f"  - {v}" for v in self.violations]
        if self.steps:
            lines.append("training steps:")
            body = [
                [str(s.step), repr(s.eager_loss), repr(s.compiled_loss), g(abs(s.eager_loss - s.compiled_loss)), g(s.grad_max_abs)] for s in self.steps
            ]
            lines += table(["step", "eager loss", "compiled loss", "|diff|", "max |grad diff|"], body, indent="  ")
        lines.append(render_records(self.records, provider=self.provider, tolerance=self.tolerance))
        if self.graph_breaks:
            lines.append("dynamo graph breaks (that code ran eagerly, outside the backend):")
            lines += [f"  {b}" for b in self.graph_breaks]
        if self.violations:
            lines.append("module under compile vs eager:")
            lines.append(self.report.render())
        return "\n".join(lines)

    def row(self) -> CheckRow:
        parts = list(self.problems)
        if self.fallbacks:
            first = self.fallbacks[0]
            more = f" and {len(self.fallbacks) - 1} more" if len(self.fallbacks) > 1 else ""
            parts.append(f"ran eagerly: {first.graph} ({first.short}){more}")
        worst = "; ".join(parts) if parts else None
        return row_for(self.report, self.tolerance, self.passed, provider=self.provider, dtype=self.dtype, suffix=" [compile]", worst=worst)


#: one backend per configuration, reused by every check_compile: dynamo keys its cache on the backend
#: object, so a new backend per check would recompile every module and, past torch._dynamo.config.
#: recompile_limit (8) checks of one class, silently run it eagerly
_CHECK_BACKENDS: dict[Any, OrtBackend] = {}


def _backend_for(
    provider: str, tolerance: Tolerance, opset: int | None, custom_translation_table: Mapping[Any, Callable[..., Any]] | None
) -> OrtBackend:
    table_key = tuple(sorted((str(k), id(v)) for k, v in (custom_translation_table or {}).items()))
    key = (provider, repr(tolerance), opset, table_key)
    backend = _CHECK_BACKENDS.get(key)
    if backend is None:
        backend = OrtBackend(provider=provider, check=True, tolerance=tolerance, opset=opset, custom_translation_table=custom_translation_table)
        _CHECK_BACKENDS[key] = backend
    return backend


def _default_loss(output: Any) -> torch.Tensor:
    """The mean of squares of every floating output (in float32): a loss every output contributes to."""
    leaves = [t for t in _tensors(output) if t.is_floating_point()]
    if not leaves:
        raise ValueError("the module has no floating output to train on: pass loss_fn=(output) -> scalar tensor")
    return torch.stack([t.float().square().mean() for t in leaves]).sum()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_detached(v) for v in value]
    return value


def _cast(value: Any, dtype: torch.dtype | None, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.to(device)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t
    if isinstance(value, Mapping):
        return {k: _cast(v, dtype, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cast(v, dtype, device) for v in value)
    return value


def _run(
    model: Callable[..., Any],
    params: Sequence[tuple[str, torch.nn.Parameter]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    steps: int,
    loss_fn: Callable[[Any], torch.Tensor],
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
) -> dict[str, Any]:
    """The values a check compares: the output (of the first step), per step the loss and gradients, and the
    parameters after the last step."""
    if steps == 0:
        with torch.no_grad():
            return {"output": _detached(model(*_detached(args), **_detached(kwargs)))}
    optimizer = make_optimizer([p for _, p in params])
    out: dict[str, Any] = {}
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        output = model(*_detached(args), **_detached(kwargs))
        loss = loss_fn(output)
        loss.backward()
        if step == 1:
            out["output"] = _detached(output)
        grads = {name: p.grad.detach().clone() for name, p in params if p.grad is not None}
        out[f"step {step}"] = {"loss": loss.detach().clone(), "grad": grads}
        optimizer.step()
    out["params"] = {name: p.detach().clone() for name, p in params}
    return out


def check_compile(
    module: torch.nn.Module,
    args: Sequence[Any] | Any,
    kwargs: Mapping[str, Any] | None = None,
    *,
    provider: str = "CPU",
    dtype: str | None = None,
    tolerance: ToleranceLike = None,
    train_steps: int = 0,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    opset: int | None = None,
    custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = False,
    allow_fallback: bool = True,
) -> CompileCheck:
    """`module` under `torch.compile(backend=onnxruntime on provider)` against eager `module`: two deep copies
    of it (the same weights), `dtype` ("float16", ...) casting it and the floating inputs.

    `train_steps=0`: one forward under no_grad (inference graphs). `train_steps=N`: N steps of `optimizer`
    (a callable params -> Optimizer; default SGD lr=0.01) on `loss_fn(output)` (default: the mean of squares
    of the floating outputs), comparing per step the loss and every gradient, then the parameters. The
    backend runs `check=True`: each graph's onnxruntime outputs are compared with the same FX graph in eager
    on every call. Fails (ToleranceBroken carrying the CompileCheck) when a comparison breaks `tolerance`,
    when nothing ran on onnxruntime (every graph fell back, or dynamo captured none), or, with
    `allow_fallback=False`, when any graph fell back; fallbacks are listed in the report either way.
    """
    __tracebackhide__ = True
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"check_compile takes a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(train_steps, int) or isinstance(train_steps, bool) or train_steps < 0:
        raise ValueError(f"train_steps must be an int >= 0, got {train_steps!r}")
    if train_steps and not any(p.requires_grad for p in module.parameters()):
        raise ValueError(
            f"train_steps={train_steps} needs parameters to train, and {type(module).__name__} has none that requires grad "
            "(weights kept as buffers?): check the forward alone with train_steps=0"
        )
    provider = parse_provider(provider)
    reason = unavailable_reason(provider)
    if reason:
        raise RuntimeError(f"check_compile cannot run on {provider}: {reason}")
    _require_onnxscript()
    from ..numerics.dtypes import dtype_of

    dt = dtype_of(dtype) if dtype is not None else None
    tol = _as_tolerance(tolerance)
    if dt is not None:
        tol = tol.for_dtype(dt.short)
    device = torch_device(provider)
    arg_list = list(args) if isinstance(args, list | tuple) else [args]
    arg_list = _cast(arg_list, dt.torch if dt else None, device)
    kw = _cast(dict(kwargs or {}), dt.torch if dt else None, device)
    eager_module = copy.deepcopy(module).to(device)
    compiled_module = copy.deepcopy(module).to(device)
    if dt is not None:
        eager_module = eager_module.to(dt.torch)
        compiled_module = compiled_module.to(dt.torch)
    loss = loss_fn or _default_loss
    make_optimizer = optimizer or (lambda params: torch.optim.SGD(params, lr=0.01))

    backend = _backend_for(provider, tol, opset, custom_translation_table)
    start = len(backend.records)
    fallbacks_before = len(backend.fallbacks)
    compiled = torch.compile(compiled_module, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    expected = _run(eager_module, list(eager_module.named_parameters()), arg_list, kw, train_steps, loss, make_optimizer)
    breaks_before = _dynamo_breaks()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrtDiffFallbackWarning)  # the report lists them
            got = _run(compiled, list(compiled_module.named_parameters()), arg_list, kw, train_steps, loss, make_optimizer)
    finally:
        records = tuple(backend.records[start:])
        del backend.records[start:]  # the backend outlives the check: keep its memory bounded
    graph_breaks = tuple(k for k, n in _dynamo_breaks().items() if breaks_before.get(k, 0) != n)
    new_fallbacks = tuple(backend.fallbacks[fallbacks_before:])
    del backend.fallbacks[fallbacks_before:]
    fallbacks = tuple(dict.fromkeys([*(r.fallback for r in records if r.fallback is not None), *new_fallbacks]))

    report = compare(expected, got, thresholds=sorted(set(DEFAULT_THRESHOLDS) | set(tol.thresholds)), tolerance=tol)
    violations = tuple(tol.check(report))
    steps = tuple(_step_row(i, expected[f"step {i}"], got[f"step {i}"]) for i in range(1, train_steps + 1))
    problems: list[str] = []
    on_ort = [r for r in records if r.ran_on == "onnxruntime"]
    if not records:
        why = "; ".join(graph_breaks) or (
            "dynamo disabled, or its recompile limit (torch._dynamo.config.recompile_limit) reached for this module: "
            "torch._dynamo.reset() before the check starts afresh"
        )
        problems.append(f"nothing ran on onnxruntime: torch.compile captured no graph, the module ran eagerly ({why})")
    elif not on_ort:
        why = fallbacks[0].reason if fallbacks else "see the table"
        problems.append(f"nothing ran on onnxruntime: every graph fell back to eager ({why})")
    if fallbacks and not allow_fallback:
        problems.append(f"{len(fallbacks)} graph(s) fell back to eager (allow_fallback=False)")
    from ..runtimes.ort import UnsupportedByProviderError

    unsupported = next((f.error for f in fallbacks if isinstance(f.error, UnsupportedByProviderError)), None)
    if unsupported is not None:  # a hole in the provider x dtype matrix, named (the fixture skips)
        raise UnsupportedByProvider(provider, dt.short if dt else _dtype_name(module), unsupported.op, str(unsupported))
    result = CompileCheck(
        provider=provider,
        dtype=dt.short if dt else _dtype_name(module),
        tolerance=tol,
        report=report,
        violations=violations,
        steps=steps,
        records=records,
        fallbacks=fallbacks,
        graphs=tuple(dict.fromkeys(r.graph for r in records)),
        problems=tuple(problems),
        graph_breaks=graph_breaks,
    )
    if not result.passed:
        broken = result.violations or any(r.violations for r in records)
        raise (ToleranceBroken if broken else CheckFailed)(result.render(), result)
    return result


def _dynamo_breaks() -> dict[str, int]:
    """dynamo's graph-break and unsupported-code reasons so far (first line and first hint of each), with
    their counts: what changes during a check is what that check met."""
    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for group in ("graph_break", "unimplemented"):
        for reason, n in counters[group].items():
            lines = [x.strip() for x in str(reason).splitlines() if x.strip()]
            hint = next((x for x in lines[1:] if x.startswith("Hint:")), "")
            key = f"{lines[0] if lines else reason}{f' ({hint})' if hint else ''}"
            out[key] = out.get(key, 0) + n
    return out


def _step_row(step: int, expected: Mapping[str, Any], got: Mapping[str, Any]) -> StepRow:
    diffs = [float((e.float() - g_.float()).abs().max()) for e, g_ in zip(expected["grad"].values(), got["grad"].values(), strict=True) if e.numel()]
    return StepRow(step, float(expected["loss"]), float(got["loss"]), max(diffs, default=None))


def _dtype_name(module: torch.nn.Module) -> str:
    from ..numerics.dtypes import dtype_of

    p = next((p for p in module.parameters() if p.is_floating_point()), None)
    return dtype_of(p.dtype).short if p is not None else "float32"
