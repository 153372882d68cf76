"""Export parity: an `nn.Module` in eager torch against its ONNX export run by onnxruntime, and, where the
two part, the first module scope (and FX node) whose output diverges, from the exporter's node metadata."""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import onnx
import torch
from torch.utils import _pytree as pytree

from ..engine.blame import node_scope
from ..engine.check import Checker, ToleranceLike, row_for
from ..numerics.diff import DiffReport
from ..numerics.formatting import g, table
from ..numerics.results import CheckRow
from ..numerics.tolerance import Tolerance, Violation
from ..runtimes.model_io import CheckedModel, expose_all_values

__all__ = ["EXPORTERS", "ExportFailed", "ExportParityReport", "Exporter", "NodeParity", "ScopeParity", "check_export", "module_scope"]

Exporter = Literal["dynamo", "torchscript"]
#: what `exporter=` takes: torch.onnx.export(dynamo=True) and the TorchScript exporter (dynamo=False)
EXPORTERS: tuple[Exporter, ...] = ("dynamo", "torchscript")
# the arguments check_export sets itself; export_options= may not override them
_OWN_OPTIONS = frozenset({"f", "args", "kwargs", "dynamo", "opset_version", "dynamic_shapes", "verbose"})


class ExportFailed(Exception):
    """torch.onnx.export could not export the module: an export failure, not a numerical one. `detail`
    holds the meaningful lines of the exporter's error, `full` all of it, `error` the exception."""

    def __init__(self, exporter: str, module: str, detail: str, full: str = "", error: BaseException | None = None) -> None:
        self.exporter = exporter
        self.module = module
        self.detail = detail
        self.full = full or detail
        self.error = error
        flag = "True" if exporter == "dynamo" else "False"
        super().__init__(f"torch.onnx.export(dynamo={flag}) cannot export {module}:\n{detail}")

    @property
    def headline(self) -> str:
        """The line that names the problem: the first exception line ("DispatchError: No ONNX function found
        for ..."), rather than the dynamo exporter's "step 3/3" preamble."""
        lines = self.detail.splitlines()
        return next((line for line in lines if _EXCEPTION_LINE.match(line)), lines[0] if lines else "export failed")

    def row(self, provider: str, dtype: str, tolerance: Tolerance) -> CheckRow:
        """The summary row of the failed export: no numbers, the headline of the exporter's error instead."""
        return row_for(
            DiffReport(name=self.module, differ=0), tolerance, False, provider=provider, dtype=dtype, suffix=f" [export {self.exporter}]",
            worst=f"export failed: {_shorten(self.headline, 160)}",
        )


# ------------------------------------------------------------------------------------------------
# typed results


@dataclass(frozen=True)
class ScopeParity:
    """One call of a submodule: its eager output against the ONNX value(s) the export computes it in.

    `scope` is the module's qualified name ("encoder.layers.1.self_attn"), `call` counts the calls of a
    module used more than once (1 for the first), `values` the ONNX values compared (empty: the export
    has no value for it, `note` says why), `report` eager (expected) vs onnxruntime (got)."""

    scope: str
    module_type: str
    call: int
    values: tuple[str, ...]
    report: DiffReport | None
    diverged: bool
    note: str = ""

    @property
    def label(self) -> str:
        return self.scope if self.call == 1 else f"{self.scope} (call {self.call})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "module_type": self.module_type,
            "call": self.call,
            "values": list(self.values),
            "report": self.report.to_dict() if self.report is not None else None,
            "diverged": self.diverged,
            "note": self.note,
        }


@dataclass(frozen=True)
class NodeParity:
    """One FX node of the exported program (dynamo exports): its value when the program runs in eager torch
    against the ONNX value of the same name on onnxruntime; `target` is the ATen op, `scope` the module."""

    node: str
    target: str
    scope: str
    report: DiffReport
    diverged: bool

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "target": self.target, "scope": self.scope, "report": self.report.to_dict(), "diverged": self.diverged}


@dataclass(frozen=True)
class ExportParityReport:
    """What `check_export` found: the module's eager outputs against onnxruntime's outputs of its export
    (`outputs`, judged by `tolerance`: `violations`), and, when localized, every submodule call's output
    in execution order (`scopes`) and, for dynamo exports, every FX node's (`nodes`)."""

    module: str
    exporter: Exporter
    opset: int
    provider: str
    dtype: str
    tolerance: Tolerance
    outputs: DiffReport
    violations: tuple[Violation, ...]
    scopes: tuple[ScopeParity, ...] = ()
    nodes: tuple[NodeParity, ...] = ()
    localized: bool = False
    notes: tuple[str, ...] = ()
    model: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    #: scope rows `render()` shows before "... N more scopes"
    TOP = 40

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def first_scope(self) -> ScopeParity | None:
        """The first submodule call, in execution order, whose output diverges beyond the tolerance."""
        return next((s for s in self.scopes if s.diverged), None)

    @property
    def first_node(self) -> NodeParity | None:
        """The first FX node, in execution order, whose value diverges beyond the tolerance (dynamo)."""
        return next((n for n in self.nodes if n.diverged), None)

    def row(self) -> CheckRow:
        """The summary row: the outputs' diff, judged by the tolerance."""
        return row_for(self.outputs, self.tolerance, self.passed, provider=self.provider, dtype=self.dtype, suffix=f" [export {self.exporter}]")

    def to_dict(self) -> dict[str, Any]:
        first_scope, first_node = self.first_scope, self.first_node
        return {
            "module": self.module,
            "exporter": self.exporter,
            "opset": self.opset,
            "provider": self.provider,
            "dtype": self.dtype,
            "tolerance": self.tolerance.describe(),
            "passed": self.passed,
            "outputs": self.outputs.to_dict(),
            "violations": [str(v) for v in self.violations],
            "localized": self.localized,
            "first_scope": first_scope.label if first_scope else None,
            "first_node": first_node.node if first_node else None,
            "scopes": [s.to_dict() for s in self.scopes],
            "nodes": [n.to_dict() for n in self.nodes],
            "notes": list(self.notes),
        }

    def render(self) -> str:
        """The verdict, the broken rules and the outputs' histogram; then where eager and the export first
        part (scope and FX node) and the per-scope table in execution order."""
        head = f"ortdiff: export parity of {self.module} ({self.exporter} exporter, opset {self.opset}) on onnxruntime {self.provider} {self.dtype}"
        if self.passed:
            lines = [f"{head}: passed ({self.tolerance.describe()})", f"  {self.outputs.summary()}"]
        else:
            lines = [f"{head}: tolerance broken ({self.tolerance.describe()})", *(f"  - {v}" for v in self.violations), self.outputs.render()]
        if self.localized:
            lines += self._render_localization()
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _render_localization(self) -> list[str]:
        lines: list[str] = []
        first, node = self.first_scope, self.first_node
        if first is not None and first.report is not None:
            lines.append(
                f"first diverging scope: {first.label} ({first.module_type}), ONNX value {', '.join(first.values)}: "
                f"max abs {g(first.report.max_abs)}, {first.report.mismatches:,}/{first.report.n:,} elements differ"
            )
        elif self.scopes:
            lines.append("no submodule's output diverges")
        if node is not None:
            r = node.report
            lines.append(
                f"first diverging FX node: {node.node} ({node.target}) in {node.scope or '(top level)'}: max abs {g(r.max_abs)} "
                f"at {_index(r.argmax)}: eager {g(r.expected_at_max, 8)}, onnxruntime {g(r.got_at_max, 8)}"
            )
        elif self.nodes:
            lines.append(f"no FX node diverges ({len(self.nodes)} compared)")
        if self.scopes:
            lines.append("per module scope, in execution order (eager torch vs onnxruntime at the scope's output):")
            lines += self._scope_table()
        return lines

    def _scope_table(self) -> list[str]:
        rows = list(self.scopes)
        start, stop = 0, len(rows)
        if len(rows) > self.TOP + 1:
            # a window that holds the first divergence
            at = next((i for i, s in enumerate(rows) if s.diverged), 0)
            start = max(0, min(at - self.TOP // 2, len(rows) - self.TOP))
            stop = start + self.TOP
        first = self.first_scope
        body = []
        for s in rows[start:stop]:
            r = s.report
            verdict = "first divergence" if s is first else "diverges" if s.diverged else "ok" if r is not None else s.note
            body.append(
                (
                    s.label,
                    s.module_type,
                    _shorten(", ".join(s.values), 40) if s.values else "-",
                    g(r.max_abs) if r is not None else "-",
                    g(r.mean_abs) if r is not None else "-",
                    f"{r.mismatches:,}/{r.n:,}" if r is not None else "-",
                    verdict,
                )
            )
        # (no max rel: an eager 0 that onnxruntime computes as 1e-8, after a ReLU, makes it astronomic)
        out = table(("scope", "module", "onnx value", "max abs", "mean abs", "differ", "verdict"), body, indent="  ")
        hidden = len(rows) - (stop - start)
        if hidden:
            out.append(f"  ... {hidden:,} more scopes ({sum(s.diverged for s in rows[:start] + rows[stop:]):,} of them diverge)")
        return out


def _index(idx: Sequence[int] | None) -> str:
    return "-" if idx is None else "(" + ", ".join(str(int(i)) for i in idx) + ")"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------------------------------------
# check_export


def check_export(
    module: torch.nn.Module,
    args: Any,
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    exporter: Exporter = "dynamo",
    opset: int | None = None,
    provider: str = "CPU",
    dtype: Any = "float32",
    tolerance: ToleranceLike = None,
    custom_translation_table: Mapping[Any, Any] | None = None,
    export_options: Mapping[str, Any] | None = None,
    localize: bool | None = None,
) -> ExportParityReport:
    """Export `module` with `args`/`kwargs` and judge onnxruntime's outputs of the export on `provider`
    against the module's eager outputs under `tolerance` (default: the dtype's).

    `exporter`: "dynamo" (`torch.onnx.export(dynamo=True)`, with `dynamic_shapes`) or "torchscript"
    (`dynamo=False`); `opset`: the exporter's default when None; `custom_translation_table`: torch op ->
    onnxscript function, for ops of your own (dynamo); `export_options`: any other keyword argument of
    `torch.onnx.export` (`optimize=`, `dynamic_axes=`, `input_names=`, ...).
    The module and the floating inputs are cast to `dtype` and moved to the provider's device (on a
    copy: `module` itself is left as it is).

    `localize`: where the outputs diverge (None, the default), always (True) or never (False), every
    submodule call's output is captured in eager torch (forward hooks) and compared with the ONNX value
    that computes it (each ONNX node is mapped to its module scope from the exporter's metadata), in
    execution order; for dynamo exports every FX node of the exported program is compared too (the
    program run by `torch.fx.Interpreter` against the ONNX value of the same name).

    Returns the ExportParityReport (`passed`, `render()`, `first_scope`). Raises ExportFailed when the
    module cannot be exported (the exporter's error, shortened), UnsupportedByProvider when onnxruntime
    has no kernel for an op at this dtype, OrtRunError when it refuses the model.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be 'dynamo' (torch.onnx.export(dynamo=True)) or 'torchscript' (dynamo=False), got {exporter!r}")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"check_export takes a torch.nn.Module, got {type(module).__name__}; export an ONNX model yourself and use Checker.check for a model file")
    checker = Checker(provider, dtype, tolerance=tolerance)
    tol = checker.tolerance
    device = torch.device(checker.device)
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    kwargs = dict(kwargs or {})
    module, args, kwargs = _cast(module, args, kwargs, checker.torch_dtype, device)
    name = type(module).__name__

    options = dict(export_options or {})
    if custom_translation_table is not None:
        if exporter != "dynamo" or "custom_translation_table" in options:
            raise ValueError("custom_translation_table is for exporter='dynamo', given once (not also in export_options)")
        options["custom_translation_table"] = dict(custom_translation_table)
    proto, program = _export(module, args, kwargs, exporter=exporter, opset=opset, dynamic_shapes=dynamic_shapes, options=options, name=name)
    feeds = _feeds(proto, module, args, kwargs, exporter, program)
    out_names = [o.name for o in proto.graph.output]
    with torch.no_grad():
        eager = _tensor_leaves(module(*args, **kwargs))
    if len(eager) != len(out_names):
        raise ValueError(f"{name} returns {len(eager)} tensor(s) but its export has {len(out_names)} output(s) ({', '.join(out_names)}): they cannot be paired")
    got = checker.run_ort(checker.prepare(proto, feeds), feeds)
    outputs = checker.compare(eager, got, tolerance=tol, names=out_names)
    violations = tuple(tol.check(outputs))
    report = ExportParityReport(
        module=name, exporter=exporter, opset=_opset(proto), provider=checker.provider, dtype=checker.dtype,
        tolerance=tol, outputs=outputs, violations=violations, model=proto,
    )
    if localize is False or (localize is None and report.passed):
        return report
    return _localize(report, checker, module, args, kwargs, proto, program, feeds, eager)


def _opset(proto: onnx.ModelProto) -> int:
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


# -- inputs --------------------------------------------------------------------------------------


def _cast(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype, device: torch.device) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    """The module and the inputs in `dtype` (floating tensors only) on `device`: a copy of the module
    when anything changes, so the caller's module is never cast in place."""
    state = [*module.parameters(), *module.buffers()]
    if any(t.device != device or (t.is_floating_point() and t.dtype != dtype) for t in state):
        module = copy.deepcopy(module).to(device=device)
        module.to(dtype)  # nn.Module.to(dtype) casts floating parameters and buffers only

    def cast(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)

    return module, tuple(pytree.tree_map(cast, list(args))), pytree.tree_map(cast, kwargs)


def _tensor_leaves(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _feeds(proto: onnx.ModelProto, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], exporter: Exporter, program: Any) -> dict[str, torch.Tensor]:
    """The tensors of args/kwargs by the export's input names, in the order the exporter flattened them:
    dynamo by the exported program's input spec (kwargs as given), TorchScript by the forward's
    signature (kwargs bound to their parameters)."""
    if program is not None:
        from torch.fx._pytree import tree_flatten_spec

        flat = tree_flatten_spec((args, kwargs), program.call_spec.in_spec)
    else:
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            flat = pytree.tree_leaves(list(bound.arguments.values()))
        except TypeError:
            flat = pytree.tree_leaves((list(args), kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    if len(tensors) != len(names):
        raise ValueError(
            f"the export of {type(module).__name__} has {len(names)} input(s) ({', '.join(names)}) for {len(tensors)} tensor(s) in args and kwargs: "
            "the exporter dropped or added inputs (an input the module does not use, a non-tensor argument); pass only the tensors the module reads"
        )
    return dict(zip(names, (t.detach() for t in tensors), strict=True))


# -- export ----------------------------------------------------------------------------------------


def _export(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    exporter: Exporter,
    opset: int | None,
    dynamic_shapes: Any,
    options: Mapping[str, Any],
    name: str,
) -> tuple[onnx.ModelProto, Any]:
    """(the ONNX model, the exported program for dynamo exports / None); ExportFailed with the meaningful
    lines of the exporter's error."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    clash = sorted(set(options) & _OWN_OPTIONS)
    if clash:
        raise ValueError(f"export_options may not set {', '.join(clash)}: check_export sets them (pass opset=, dynamic_shapes=, exporter= instead)")
    if exporter == "torchscript" and dynamic_shapes is not None:
        raise ValueError("dynamic_shapes is for exporter='dynamo'; the TorchScript exporter takes export_options={'dynamic_axes': {...}, 'input_names': [...]}")
    try:
        # both exporters warn about their own internals (deprecations, the tracer), none about the
        # module; dynamo prints progress lines even with verbose=False
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(module, args, kwargs=kwargs or None, dynamo=True, dynamic_shapes=dynamic_shapes, opset_version=opset, verbose=False, **options)
                if program is None:
                    raise RuntimeError("torch.onnx.export(dynamo=True) returned no ONNXProgram")
                return program.model_proto, program.exported_program
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, kwargs=kwargs or None, dynamo=False, opset_version=opset, **options)  # type: ignore[arg-type]  # file-like objects work too
    except Exception as exc:
        full = _plain(str(exc))
        raise ExportFailed(exporter, name, _short_error(exc, full), full, exc) from None
    return onnx.load_from_string(buf.getvalue()), None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Z]\w*(Error|Exception|Failure)\b.*:")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:\s*")
#: the lines of the exporter's error worth reading at most, and their width
_MAX_LINES, _MAX_WIDTH = 8, 300


def _plain(text: str) -> str:
    return _ANSI.sub("", text).strip()


def _short_error(exc: BaseException, full: str) -> str:
    """The exporter's error in its meaningful lines: the dynamo exporter's step line and its exception
    summary (`DispatchError: No ONNX function found for ...`) without the advice and the pointers; the
    TorchScript exporter's message without the TorchScript IR graph it appends."""
    # the TorchScript IR both exporters may append says nothing a user acts on
    full = full.split("Torch IR graph at exception", 1)[0]
    lines = full.splitlines()
    kept: list[str] = []
    if "## Exception summary" in full:
        step = lines[0].split(" Next steps:")[0].strip() if lines else ""
        if step:
            kept.append(step)
        after = full.split("## Exception summary", 1)[1].splitlines()
        for line in after:
            text = line.strip()
            if not text or text.startswith(("⬆", "(Refer to the full stack trace")):
                continue
            kept.append(_CLASS.sub(lambda m: f"{m.group(1)}: ", text))
    else:
        kept = [line.strip() for line in lines if line.strip()]
        if not kept:
            kept = [type(exc).__name__]
        elif not kept[0].startswith(type(exc).__name__):
            kept[0] = f"{type(exc).__name__}: {kept[0]}"
    kept = [_shorten(line, _MAX_WIDTH) for line in kept]
    if len(kept) > _MAX_LINES:
        kept = [*kept[:_MAX_LINES], f"... ({len(kept) - _MAX_LINES} more lines: ExportFailed.full has them)"]
    return "\n".join(kept)


# -- localization ----------------------------------------------------------------------------------


def module_scope(node: onnx.NodeProto, names: frozenset[str] | set[str]) -> str:
    """The qualified name of the module an ONNX node comes from (one of `names`, the module's
    `named_modules()`), from blame's `node_scope` (the exporters' metadata and node names). TorchScript
    names each path segment relative to an enclosing module (`/layers.0/self_attn/seq/seq.1/seq.1.0/Relu`)
    and numbers repeated calls (`/shared_1/MatMul`); each segment is resolved against `names` here."""
    raw = node_scope(node)
    if raw in names or not raw:
        return raw
    if node.name.startswith("/"):
        qualified = ""
        for seg in node.name.split("/")[1:-1]:
            if seg:
                qualified = _resolve(qualified, seg, names)
        return qualified
    return raw


def _resolve(parent: str, seg: str, names: frozenset[str] | set[str]) -> str:
    for part in dict.fromkeys((seg, re.sub(r"_\d+$", "", seg))):  # "shared_1": the 2nd call of "shared"
        anc = parent
        while True:
            cand = f"{anc}.{part}" if anc else part
            if cand in names and (not parent or cand.startswith(parent + ".")):
                return cand
            if not anc:
                break
            anc = anc.rpartition(".")[0]
    return f"{parent}.{seg}" if parent else seg


@dataclass
class _Call:
    scope: str
    module_type: str
    call: int
    outputs: list[torch.Tensor]


@contextlib.contextmanager
def _hooks(module: torch.nn.Module) -> Iterator[list[_Call]]:
    """Every submodule call's tensor outputs (copies: a later in-place op must not change them), in the
    order the calls complete: the order their values are produced."""
    calls: list[_Call] = []
    counts: dict[str, int] = {}

    def hook_for(scope: str) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, inputs: Any, output: Any) -> None:
            counts[scope] = counts.get(scope, 0) + 1
            calls.append(_Call(scope, type(mod).__name__, counts[scope], [t.detach().clone() for t in _tensor_leaves(output)]))

        return hook

    handles = [sub.register_forward_hook(hook_for(scope)) for scope, sub in module.named_modules() if scope]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _within(scope: str, outer: str) -> bool:
    return scope == outer or scope.startswith(outer + ".")


def _localize(
    report: ExportParityReport,
    checker: Checker,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    proto: onnx.ModelProto,
    program: Any,
    feeds: Mapping[str, torch.Tensor],
    eager: list[torch.Tensor],
) -> ExportParityReport:
    """The report with its per-scope table (and FX nodes): onnxruntime runs the export with every value
    exposed as an output, eager torch runs the module again with forward hooks."""
    from dataclasses import replace

    tol = report.tolerance
    exposed = expose_all_values(proto)
    ort_names = [o.name for o in exposed.graph.output]
    try:
        values = dict(zip(ort_names, checker.run_ort(CheckedModel(exposed, exposed.SerializeToString(), ""), feeds), strict=True))
    except Exception as exc:  # the exposed copy is a bonus: the verdict stands, the note says why there is no table
        text = str(exc).strip()
        why = text.splitlines()[0] if text else type(exc).__name__
        return replace(report, localized=True, notes=(*report.notes, f"not localized: the export with every value exposed as an output did not run on onnxruntime ({why})"))
    with _hooks(module) as calls, torch.no_grad():
        module(*args, **kwargs)

    names = frozenset(n for n, _ in module.named_modules())
    nodes = list(proto.graph.node)
    scopes = [module_scope(n, names) for n in nodes]
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.input:
            consumers.setdefault(x, []).append(i)
    graph_outputs = {o.name for o in proto.graph.output}

    def judge(expected: list[torch.Tensor], got: list[torch.Tensor], labels: list[str]) -> tuple[DiffReport, bool]:
        r = checker.compare(expected, got, tolerance=tol, names=labels)
        return r, bool(tol.check(r))

    taken: dict[str, set[str]] = {}  # values given to earlier calls of a scope (a parent may share its last child's)
    repeated = {c.scope for c in calls if c.call > 1}
    rows: list[ScopeParity] = []
    for c in calls:
        inside = [o for i, n in enumerate(nodes) if _within(scopes[i], c.scope) for o in n.output if o in values]
        if not c.outputs:
            rows.append(ScopeParity(c.scope, c.module_type, c.call, (), None, False, "no tensor output"))
            continue
        if not inside:
            rows.append(ScopeParity(c.scope, c.module_type, c.call, (), None, False, "not in the export (folded away, or an identity)"))
            continue
        boundary = {o for o in inside if o in graph_outputs or any(not _within(scopes[j], c.scope) for j in consumers.get(o, ()))}
        picked: list[str] = []
        for t in c.outputs:
            name = _pick(t, inside, boundary, taken.get(c.scope, set()) | set(picked), values, checker, tol, c.scope in repeated)
            if name is None:
                break
            picked.append(name)
        if len(picked) != len(c.outputs):
            rows.append(ScopeParity(c.scope, c.module_type, c.call, (), None, False, "no ONNX value of its shape"))
            continue
        taken.setdefault(c.scope, set()).update(picked)
        r, diverged = judge(c.outputs, [values[p] for p in picked], picked)
        rows.append(ScopeParity(c.scope, c.module_type, c.call, tuple(picked), r, diverged))
    _folded(rows, calls, values, judge)

    fx_rows: list[NodeParity] = []

    def visit(fx_node: torch.fx.Node, eager_value: torch.Tensor) -> None:
        got = values.get(fx_node.name)
        if not isinstance(got, torch.Tensor) or got.shape != eager_value.shape or got.dtype != eager_value.dtype:
            return
        i = producer.get(fx_node.name)
        r, diverged = judge([eager_value], [got], [fx_node.name])
        fx_rows.append(NodeParity(fx_node.name, str(fx_node.target), scopes[i] if i is not None else "", r.leaves()[0], diverged))

    if program is not None:
        _run_program(program, args, kwargs, visit)

    notes = list(report.notes)
    if not report.passed:
        out_names = [x.name for x in proto.graph.output]
        _, exposed_diverges = judge(eager, [values[o] for o in out_names], out_names)
        if not exposed_diverges:
            notes.append(
                "with every value exposed as an output (which stops onnxruntime fusing the nodes that compute them) the outputs agree "
                "with eager: the divergence comes from onnxruntime's graph optimizations, not from the export; see check_optimization"
            )
        elif not any(s.diverged for s in rows) and rows:
            notes.append("no submodule's output diverges: the difference arises in the top-level module's own operations")
    return replace(report, scopes=tuple(rows), nodes=tuple(fx_rows), localized=True, notes=tuple(notes))


#: how many later calls may have absorbed a module (Conv then BatchNorm: the next one)
_FOLD_WINDOW = 4


def _folded(rows: list[ScopeParity], calls: list[_Call], values: Mapping[str, torch.Tensor], judge: Callable[..., tuple[DiffReport, bool]]) -> None:
    """Modules the exporter folded into a later one (an eval-mode BatchNorm into the Conv before it: one
    Conv computes both, named after either): a diverging value that computes one of the next calls'
    eager output is that call's, not a divergence of this one."""
    for i, row in enumerate(rows):
        if not row.diverged:
            continue
        got = [values[v] for v in row.values]
        for j in range(i + 1, min(len(rows), i + 1 + _FOLD_WINDOW)):
            later = calls[j]
            if later.scope == row.scope or [(t.shape, t.dtype) for t in later.outputs] != [(t.shape, t.dtype) for t in got]:
                continue
            r, diverged = judge(later.outputs, got, list(row.values))
            if diverged:
                continue
            rows[i] = ScopeParity(row.scope, row.module_type, row.call, (), None, False, f"folded into {rows[j].label}")
            if rows[j].report is None:
                rows[j] = ScopeParity(later.scope, later.module_type, later.call, row.values, r, False)
            break


def _pick(
    t: torch.Tensor,
    inside: list[str],
    boundary: set[str],
    taken: set[str],
    values: Mapping[str, torch.Tensor],
    checker: Checker,
    tol: Tolerance,
    repeated: bool,
) -> str | None:
    """The ONNX value that computes eager output `t` of a scope: one of the scope's values of its shape and
    dtype, those leaving the scope first, the closest of them; a module called more than once leaves
    the scope only from its last call (dynamo names every call alike), so its interior values count
    too when no leaving one matches."""

    def fits(name: str) -> bool:
        v = values[name]
        return name not in taken and isinstance(v, torch.Tensor) and v.shape == t.shape and v.dtype == t.dtype

    def closest(names: list[str]) -> tuple[str | None, bool]:
        best, best_err, ok = None, float("inf"), False
        for name in names:
            r = checker.compare(t, values[name], tolerance=tol)
            err = r.mean_abs if r.max_abs == r.max_abs else float("inf")  # NaN: last
            if err < best_err or best is None:
                best, best_err, ok = name, err, not tol.check(r)
        return best, ok

    leaving = [o for o in inside if o in boundary and fits(o)]
    name, ok = closest(leaving)
    if ok or (name is not None and not repeated):
        return name
    other, other_ok = closest([o for o in inside if o not in boundary and fits(o)])
    if other is not None and (other_ok or name is None):
        return other
    return name


def _run_program(program: Any, args: tuple[Any, ...], kwargs: dict[str, Any], visit: Callable[[torch.fx.Node, torch.Tensor], None]) -> None:
    """The exported program run in eager torch by `torch.fx.Interpreter`, `visit` called with each
    call_function node and its tensor value as it is computed (the interpreter frees values after their
    last use: nothing is kept for all nodes at once)."""
    from torch.fx._pytree import tree_flatten_spec

    flat = tree_flatten_spec((args, kwargs), program.call_spec.in_spec)

    class Visiting(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if n.op == "call_function" and isinstance(out, torch.Tensor):
                visit(n, out.detach())
            return out

    with torch.no_grad():
        Visiting(program.module()).run(*flat)
