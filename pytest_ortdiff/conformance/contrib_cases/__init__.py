"""One-node conformance cases for onnxruntime's contrib ops: each torch kernel checked against onnxruntime.

A family module (normalization, activation, attention, quantization, layout) lists `CASES`; `run_case`
runs one through the torch evaluator, its float64 oracle and onnxruntime, and classifies the outcome.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAMILIES",
    "STATUSES",
    "ContribCase",
    "ContribResult",
    "all_cases",
    "float32_twin",
    "render",
    "run_case",
    "run_cases",
    "summary",
]

#: the family modules of this package, in report order (a module not yet written is skipped)
FAMILIES = ("normalization", "activation", "matmul", "attention", "quantization", "layout")

#: outcomes, in report order. "pass": ours is within the case's ULPs of onnxruntime (16-bit: within
#: onnxruntime's own rounding plus those ULPs); "departs": onnxruntime departs from the op's meaning on
#: purpose (the case says how) and the ULPs measured are shown, not judged; "wrong": ours differs;
#: "unsupported": the kernel refuses the variant by name; "no kernel": no torch kernel; "no onnxruntime":
#: onnxruntime has no kernel for the variant on that provider (or the provider is absent), so there is
#: nothing to compare with; "error": anything else (a bug).
STATUSES = ("pass", "departs", "wrong", "unsupported", "no kernel", "no onnxruntime", "error")

Feeds = Mapping[str, Any]


@dataclass(frozen=True)
class ContribCase:
    """One contrib op on one set of attributes and inputs, in one dtype.

    `build()` returns the one-node model (opset imports for "" and "com.microsoft" as the op needs) and its
    feeds (torch tensors, on the CPU; the runner moves them). `max_ulp` is the largest floored ULP distance
    (at the output's scale, see DiffReport.max_ulp_floored) between ours and onnxruntime that passes; for
    float16/bfloat16 it is added to onnxruntime's own rounding, measured as the distance between
    onnxruntime's 16-bit output and its output on the model's float32 twin. `departs` (non-empty) says
    how onnxruntime's kernel departs from the op's meaning on purpose (approximations, int8 activations):
    such a case is not judged, its measured distance is reported."""

    name: str
    op: str  # "com.microsoft::SkipLayerNormalization", "SimplifiedLayerNormalization" (default domain)
    dtype: str  # "float32", "float16", "bfloat16"
    build: Callable[[], tuple[Any, dict[str, Any]]]
    providers: tuple[str, ...] = ("CPU",)
    max_ulp: float | None = None  # None: 4 for float32, 1 for 16-bit
    departs: str = ""
    #: the first onnxruntime that runs the case, and what an older one does ("crashes", "refuses the node"):
    #: on an older one there is nothing to compare with (the newest onnxruntime-gpu lags the newest onnxruntime)
    min_onnxruntime: str = ""
    before: str = ""
    #: the oracle (the kernel in float64) against onnxruntime's float32 output: at most this many
    #: floored float32 ULPs (None: 64, or 4 x max_ulp when larger)
    oracle_max_ulp: float | None = None
    #: (output, input) pairs onnxruntime must run with one buffer for both (through IO binding): ops whose
    #: kernel updates a KV cache in place and refuses distinct past/present buffers (SparseAttention)
    shared_buffers: tuple[tuple[str, str], ...] = ()

    @property
    def ulp_budget(self) -> float:
        if self.max_ulp is not None:
            return self.max_ulp
        return 4.0 if self.dtype in ("float32", "float64") else 1.0


@dataclass(frozen=True)
class ContribResult:
    name: str
    op: str
    dtype: str
    provider: str
    status: str
    #: floored ULPs of `dtype` between ours and onnxruntime (None when not compared)
    ulp: float | None = None
    #: what passing allowed: the case's ULPs (+ onnxruntime's own rounding in 16 bits)
    allowed: float | None = None
    #: floored float32 ULPs between the float64 oracle and onnxruntime on the float32 twin
    oracle_ulp: float | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def all_cases(families: Sequence[str] = FAMILIES) -> list[ContribCase]:
    """Every case of the family modules that exist, in FAMILIES order; names are unique."""
    out: list[ContribCase] = []
    for family in families:
        try:
            module = importlib.import_module(f"{__name__}.{family}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{family}":
                continue
            raise
        out.extend(module.CASES)
    seen: set[str] = set()
    for case in out:
        if case.name in seen:
            raise ValueError(f"two contrib cases named {case.name!r}")
        seen.add(case.name)
    return out


_SIXTEEN = {"float16", "bfloat16"}


def float32_twin(model: Any) -> Any:
    """The model with every float16/bfloat16 tensor type made float32: inputs, outputs, value infos,
    initializers, tensor attributes and Cast/`to`-style type attributes that name a 16-bit type."""
    import onnx
    import onnx.numpy_helper
    from onnx import TensorProto

    sixteen = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
    twin = onnx.ModelProto()
    twin.CopyFrom(model)

    def fix_type(t: Any) -> None:
        kind = t.WhichOneof("value")
        if kind == "tensor_type" and t.tensor_type.elem_type in sixteen:
            t.tensor_type.elem_type = TensorProto.FLOAT
        elif kind == "sequence_type":
            fix_type(t.sequence_type.elem_type)
        elif kind == "optional_type":
            fix_type(t.optional_type.elem_type)

    def fix_tensor(tensor: Any) -> None:
        if tensor.data_type in sixteen:
            arr = onnx.numpy_helper.to_array(tensor).astype("float32")
            tensor.CopyFrom(onnx.numpy_helper.from_array(arr, tensor.name))

    def fix_graph(g: Any) -> None:
        for vi in (*g.input, *g.output, *g.value_info):
            fix_type(vi.type)
        for init in g.initializer:
            fix_tensor(init)
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype", "output_dtype") and a.i in sixteen:
                    a.i = TensorProto.FLOAT
                if a.HasField("t"):
                    fix_tensor(a.t)
                if a.HasField("g"):
                    fix_graph(a.g)
                for sub in a.graphs:
                    fix_graph(sub)

    fix_graph(twin.graph)
    return twin


def _to_float32(feeds: Feeds) -> dict[str, Any]:
    import torch

    return {k: (v.float() if isinstance(v, torch.Tensor) and v.dtype in (torch.float16, torch.bfloat16) else v) for k, v in feeds.items()}


def _on(feeds: Feeds, device: Any) -> dict[str, Any]:
    import torch

    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feeds.items()}


def _floored_ulp(expected: Sequence[Any], got: Sequence[Any], dtype: str | None = None) -> float:
    """The largest floored ULP distance over the outputs (exact for integer outputs: 0 or inf)."""
    import torch

    from ...numerics.diff import compare

    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        if dtype is not None and e.is_floating_point():
            e = e.to(getattr(torch, dtype))
            g = g.to(getattr(torch, dtype))
        if e.shape != g.shape:
            return math.inf
        if e.numel() == 0:
            continue
        if not e.is_floating_point():
            if not torch.equal(e.cpu(), g.cpu()):
                return math.inf
            continue
        report = compare(e.cpu(), g.cpu())
        if report.nan_mismatch or report.inf_mismatch:
            return math.inf
        worst = max(worst, float(report.max_ulp_floored or 0.0))
    return worst


def _too_old(case: ContribCase) -> str | None:
    """Why this onnxruntime cannot run `case` (older than its `min_onnxruntime`), or None."""
    if not case.min_onnxruntime:
        return None
    import onnxruntime

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())

    if version(onnxruntime.__version__) >= version(case.min_onnxruntime):
        return None
    return f"onnxruntime {onnxruntime.__version__} {case.before or 'cannot run this variant'}; onnxruntime {case.min_onnxruntime} runs it"


def _ort(model: Any, provider: str, feeds: Feeds, shared: Sequence[tuple[str, str]] = ()) -> list[Any]:
    from ...runtimes.ort import OrtRunner

    runner = OrtRunner(model, provider=provider, session_options={"log_severity_level": 3})  # (shape warnings of one-node models)
    if not shared:
        return list(runner.run(None, feeds))
    import numpy as np
    import onnxruntime as ort
    import torch

    from ...numerics.tensors import to_numpy, to_torch

    # each shared output is bound to its input's OrtValue: onnxruntime writes into the input's buffer (a
    # copy: the feeds stay as they were for the torch runs)
    session = runner.session
    binding = session.io_binding()
    where = "cuda" if provider == "CUDA" else "cpu"
    arrays = {name: np.array(to_numpy(t), copy=True) for name, t in feeds.items()}  # alive while bound
    values = {name: ort.OrtValue.ortvalue_from_numpy(a, where, 0) for name, a in arrays.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    into = dict(shared)
    names = [o.name for o in session.get_outputs()]
    for name in names:
        if name in into:
            binding.bind_ortvalue_output(name, values[into[name]])
        else:
            binding.bind_output(name)
    session.run_with_iobinding(binding)
    device = next((t.device for t in feeds.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    outputs = [to_torch(np.array(v.numpy(), copy=True), device=device) for v in binding.get_outputs()]
    del arrays
    return outputs


def run_case(case: ContribCase, provider: str | None = None) -> ContribResult:
    """Run `case` through the torch evaluator, its float64 oracle and onnxruntime on `provider` (default:
    the case's first), and classify the outcome (see STATUSES)."""
    from ...runtimes.evaluator import MissingKernelError, TorchEvaluator
    from ...runtimes.kernels import UnsupportedVariantError
    from ...runtimes.ort import UnsupportedByProviderError
    from ...runtimes.providers import torch_device, unavailable_reason

    provider = provider or case.providers[0]

    def result(status: str, detail: str = "", **kw: Any) -> ContribResult:
        return ContribResult(case.name, case.op, case.dtype, provider, status, detail=detail, **kw)

    why = unavailable_reason(provider) or _too_old(case)
    if why:
        return result("no onnxruntime", why)
    model, feeds = case.build()
    device = torch_device(provider)
    feeds = _on(feeds, device)
    try:
        got = _ort(model, provider, feeds, case.shared_buffers)
    except UnsupportedByProviderError as exc:
        return result("no onnxruntime", str(exc))
    except Exception as exc:
        text = str(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            return result("no onnxruntime", text.splitlines()[0][:300])
        return result("error", f"onnxruntime failed: {type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}")
    try:
        ours = TorchEvaluator(model, device=device).run(None, feeds)
    except MissingKernelError as exc:
        return result("no kernel", str(exc).splitlines()[0])
    except UnsupportedVariantError as exc:
        return result("unsupported", str(exc))
    except Exception as exc:
        return result("error", f"{type(exc).__name__}: {exc}")
    oracle: list[Any] | None
    try:
        oracle = TorchEvaluator(model, device=device, compute_dtype="float64").run(None, feeds)
    except UnsupportedVariantError:  # a variant the float64 oracle refuses (it says why): no oracle to judge
        oracle = None
    except Exception as exc:
        return result("error", f"the float64 oracle: {type(exc).__name__}: {exc}")
    for i, (o, g) in enumerate(zip(ours, got, strict=True)):
        if o.dtype != g.dtype or tuple(o.shape) != tuple(g.shape):
            return result("wrong", f"output {i}: ours {o.dtype}{list(o.shape)}, onnxruntime {g.dtype}{list(g.shape)}")
    ulp = _floored_ulp(got, ours)
    allowed = case.ulp_budget
    reference = got
    if case.dtype in _SIXTEEN:
        try:  # onnxruntime's own rounding: its 16-bit output against its float32 twin's, rounded to 16 bits
            reference = _ort(float32_twin(model), provider, _to_float32(feeds), case.shared_buffers)
            allowed += _floored_ulp(reference, got, case.dtype)
        except Exception:
            reference = []
    oracle_ulp = None
    if reference and oracle is not None:
        oracle_ulp = _floored_ulp([r.float() if r.is_floating_point() else r for r in reference], [o.float() if o.is_floating_point() else o for o in oracle])
    limit = case.oracle_max_ulp if case.oracle_max_ulp is not None else max(64.0, 4 * allowed)
    kw: dict[str, Any] = {"ulp": ulp, "allowed": allowed, "oracle_ulp": oracle_ulp}
    if case.departs:
        return result("departs", case.departs, **kw)
    if ulp > allowed:
        return result("wrong", f"{ulp:.3g} floored ulp from onnxruntime (allowed {allowed:.3g})", **kw)
    if oracle_ulp is not None and oracle_ulp > limit:
        return result("wrong", f"the float64 oracle is {oracle_ulp:.3g} floored float32 ulp from onnxruntime's float32 (allowed {limit:.3g})", **kw)
    return result("pass", **kw)


def run_cases(cases: Sequence[ContribCase] | None = None) -> Iterator[ContribResult]:
    for case in all_cases() if cases is None else cases:
        for provider in case.providers:
            yield run_case(case, provider)


def summary(results: Sequence[ContribResult]) -> str:
    """The totals line: '212 of 240 contrib cases pass, 6 depart on purpose, ...; 31 ops'."""
    from collections import Counter

    total = Counter(r.status for r in results)
    ops = {r.op for r in results}
    parts = [f"{total['pass']} of {len(results)} contrib cases pass"]
    for status, words in (
        ("departs", "depart from the op's meaning on purpose"),
        ("wrong", "wrong"),
        ("unsupported", "unsupported"),
        ("no kernel", "without a kernel"),
        ("no onnxruntime", "without onnxruntime to compare with"),
        ("error", "error"),
    ):
        if total[status]:
            parts.append(f"{total[status]} {words}")
    return ", ".join(parts) + f"; {len(ops)} op{'' if len(ops) == 1 else 's'}"


def render(results: Sequence[ContribResult], *, verbose: bool = False) -> str:
    """A table of counts by op and the worst ULPs measured, the totals line, and with `verbose` every case
    that does not pass, with why (failures last)."""
    from collections import Counter

    by_op: dict[str, list[ContribResult]] = {}
    for r in results:
        by_op.setdefault(r.op, []).append(r)
    width = max([len(op) for op in by_op] + [10])
    head = f"{'contrib op':<{width}} {'cases':>5} " + " ".join(f"{s:>14}" for s in STATUSES) + f" {'worst ulp':>10}"
    lines = [head, "-" * len(head)]

    def row(name: str, rs: Sequence[ContribResult]) -> str:
        counts = Counter(r.status for r in rs)
        ulps = [r.ulp for r in rs if r.ulp is not None and r.status == "pass"]
        worst = f"{max(ulps):.3g}" if ulps else "-"
        return f"{name:<{width}} {len(rs):>5} " + " ".join(f"{counts.get(s, 0):>14}" for s in STATUSES) + f" {worst:>10}"

    lines.extend(row(op, by_op[op]) for op in sorted(by_op))
    lines += ["-" * len(head), row("total", results), "", summary(results)]
    if verbose:
        for status in ("departs", "no onnxruntime", "unsupported", "no kernel", "wrong", "error"):
            chosen = [r for r in results if r.status == status]
            if chosen:
                lines.append(f"\n{status}:")
                for r in chosen:
                    ulp = f" ({r.ulp:.3g} ulp)" if r.ulp is not None and status in ("departs", "wrong") else ""
                    lines.append(f"  {r.name} [{r.op}, {r.dtype}, {r.provider}]{ulp}: {r.detail}")
    return "\n".join(lines)
