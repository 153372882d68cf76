"""Run-to-run reproducibility: the same model and feeds run repeatedly and under varied execution
settings (threads, graph optimizations, deterministic algorithms), compared bit for bit; for a setting
that differs, the first node whose output differs (every value of both runs compared)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import onnx
import onnx.helper
import torch

from ..numerics.diff import DiffReport, compare
from ..numerics.formatting import g, table
from ..runtimes.model_io import exposed_for_ort, model_path, serialized, too_large
from .baseline import bit_mismatches

__all__ = ["VARIATIONS", "ReproducibilityReport", "Variation", "check_reproducible"]

#: what `vary=` accepts
VARIATIONS = ("threads", "graph_optimization", "deterministic_compute")
_LEVELS = ("disable", "basic", "extended")  # each against "all", onnxruntime's default


@dataclass(frozen=True)
class Variation:
    """One comparison: outputs under `against` (the reference) vs under `got`, bit for bit."""

    kind: str  # "repeat", "threads", "graph_optimization", "deterministic_compute", "torch_deterministic"
    against: str
    got: str
    report: DiffReport | None = None  # reference (expected) vs varied (got), histogram included
    bit_mismatches: int = 0
    n: int = 0
    outputs_differ: tuple[str, ...] = ()
    note: str = ""
    error: str = ""  # the variation could not run here; it says why
    #: for a variation that differs: the first node (graph order) whose output differs between the two
    #: settings, e.g. "matmul (MatMul): output 'mm', 3 of 512 elements differ in their bits"
    first_node: str = ""

    @property
    def identical(self) -> bool:
        return not self.error and self.bit_mismatches == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "against": self.against,
            "got": self.got,
            "identical": self.identical,
            "bit_mismatches": self.bit_mismatches,
            "n": self.n,
            "outputs_differ": list(self.outputs_differ),
            "note": self.note,
            "error": self.error,
            "first_node": self.first_node,
            "report": self.report.to_dict() if self.report is not None else None,
        }


@dataclass(frozen=True)
class ReproducibilityReport:
    """Every variation of one model on one provider; `.reproducible` when all that ran are bitwise identical."""

    model: str
    provider: str
    dtype: str
    runs: int
    variations: tuple[Variation, ...]

    @property
    def reproducible(self) -> bool:
        return all(v.identical for v in self.variations if not v.error)

    @property
    def differing(self) -> tuple[Variation, ...]:
        return tuple(v for v in self.variations if not v.error and not v.identical)

    def worst(self) -> DiffReport:
        """The report of the variation with the largest difference (an exact one when none differs)."""
        reports = [v.report for v in self.variations if v.report is not None]
        if not reports:
            return DiffReport(name=self.model)
        return max(reports, key=lambda r: (r.nan_mismatch + r.inf_mismatch, r.max_abs, r.mismatches))

    def summary(self) -> str:
        ran = [v for v in self.variations if not v.error]
        if self.reproducible:
            return f"reproducible: {len(ran)} variation(s), all bitwise identical"
        return f"NOT reproducible: {len(self.differing)} of {len(ran)} variation(s) differ"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "provider": self.provider,
            "dtype": self.dtype,
            "runs": self.runs,
            "reproducible": self.reproducible,
            "variations": [v.to_dict() for v in self.variations],
        }

    def render(self) -> str:
        lines = [f"ortdiff.check_reproducible: {self.model} on {self.provider} ({self.dtype}): {self.summary()}"]
        head = ("variation", "reference", "varied", "elements differ", "max abs", "outputs differ")
        rows = []
        for v in self.variations:
            if v.error:
                rows.append((v.kind, v.against, v.got, "not run", "-", v.error))
                continue
            max_abs = "-" if v.report is None else g(v.report.max_abs)
            differ = f"{v.bit_mismatches:,} of {v.n:,}"
            rows.append((v.kind, v.against, v.got + (f" ({v.note})" if v.note else ""), differ, max_abs, ", ".join(v.outputs_differ) or "-"))
        lines += table(head, rows, indent="  ")
        for v in self.differing:
            lines.append(f"{v.kind}: {v.against} vs {v.got}: {v.bit_mismatches:,} of {v.n:,} elements differ in their bits" + (f" ({v.note})" if v.note else ""))
            if v.first_node:
                lines.append(f"  first node whose output differs: {v.first_node}")
            if v.report is not None:
                lines.append(v.report.render())
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------


def _diff(kind: str, against: str, got: str, expected: Sequence[torch.Tensor], actual: Sequence[torch.Tensor], names: Sequence[str], note: str = "") -> Variation:
    bits = [bit_mismatches(e, a) for e, a in zip(expected, actual, strict=True)]
    report = compare(dict(zip(names, expected, strict=True)), dict(zip(names, actual, strict=True)))
    return Variation(
        kind,
        against,
        got,
        report=report,
        bit_mismatches=sum(bits),
        n=sum(e.numel() for e in expected),
        outputs_differ=tuple(n for n, b in zip(names, bits, strict=True) if b),
        note=note,
    )


def _repeat(kind: str, against: str, run: Any, runs: int, names: Sequence[str]) -> Variation:
    """`runs` calls of `run()`, each compared with the first; reports the worst one and how many differ."""
    first = [t.clone() for t in run()]
    worst: Variation | None = None
    differ = 0
    for i in range(2, runs + 1):
        v = _diff(kind, against, f"run {i}", first, run(), names)
        differ += not v.identical
        if worst is None or (v.bit_mismatches, v.report.max_abs if v.report else 0) > (worst.bit_mismatches, worst.report.max_abs if worst.report else 0):
            worst = v
    assert worst is not None
    got = (f"runs 2-{runs}" if runs > 2 else "run 2") if worst.identical else f"{worst.got} (worst)"
    note = f"{differ} of {runs - 1} runs differ" if differ else ""
    return Variation(kind, against, got, worst.report, worst.bit_mismatches, worst.n, worst.outputs_differ, note)


def _label(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "default options"


def check_reproducible(
    model: Any,
    feeds: Mapping[str, Any],
    *,
    provider: str = "CPU",
    runs: int = 5,
    vary: Sequence[str] = ("threads", "graph_optimization"),
    torch_deterministic: bool | None = None,
    session_options: Mapping[str, Any] | None = None,
    threads: Sequence[int] | None = None,
    kernels: Mapping[Any, Any] | None = None,
    missing: Literal["error", "ort"] = "error",
    localise: bool = True,
) -> ReproducibilityReport:
    """Is `model` on onnxruntime `provider` bitwise reproducible?

    - repeat: one session run `runs` times (the user's `session_options`, else onnxruntime's defaults);
    - `vary` "threads": intra_op_num_threads 1 vs 2 (and vs os.cpu_count() when larger; `threads=` to
      choose), graph optimizations "all"; "graph_optimization": level "all" vs "disable", "basic",
      "extended", one thread; "deterministic_compute": onnxruntime's use_deterministic_compute off vs on;
    - torch evaluator with `torch.use_deterministic_algorithms` on and off, `runs` times each, side by
      side (and on vs off): by default on CUDA providers only (`torch_deterministic=True` forces it);
      `kernels=` are the evaluator's overrides (an op without a torch kernel: `{op: "ort"}`, or every such
      op with `missing="ort"`).

    Every comparison is bit for bit; the report holds a DiffReport (histogram) per variation. With
    `localise` (the default), a variation that differs is run again with every value of the graph exposed
    (a copy of the model whose outputs are every node's outputs; the torch evaluator's intermediates) under
    both settings, and `Variation.first_node` names the first node whose output differs.
    """
    from ..runtimes.model_io import load_model
    from ..runtimes.ort import OrtRunner
    from ..runtimes.providers import parse_provider, torch_device

    if isinstance(vary, str):
        vary = (vary,)
    unknown = [v for v in vary if v not in VARIATIONS]
    if unknown:
        raise ValueError(f"vary: unknown variation(s) {unknown}; valid: {', '.join(VARIATIONS)}")
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 2:
        raise ValueError(f"runs must be an integer >= 2 (the first run is the reference), got {runs!r}")
    provider = parse_provider(provider)
    m = load_model(model)
    path = model_path(model)
    data = serialized(m, path)
    if data is None and path is None:
        raise too_large("the model", m)
    source = data if data is not None else str(path)  # (a model above 2 GB: onnxruntime opens its file)
    names = [o.name for o in m.graph.output]
    base = dict(session_options or {})
    variations: list[Variation] = []
    settings: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []  # per variation: (against, got); None: the same, repeated

    def runner(options: Mapping[str, Any] | None) -> Any:
        r = OrtRunner(source, provider=provider, session_options=dict(options) if options else None)
        return lambda: r.run(None, feeds)

    variations.append(_repeat("repeat", f"run 1 ({_label(base)})", runner(base), runs, names))
    settings.append((base, None))
    if "threads" in vary:
        counts = list(threads) if threads is not None else sorted({1, 2, os.cpu_count() or 2})
        if len(counts) < 2:
            raise ValueError(f"threads must list at least two thread counts, got {counts}")
        ref_opts = {**base, "intra_op_num_threads": counts[0]}
        ref = runner(ref_opts)()
        for c in counts[1:]:
            opts = {**base, "intra_op_num_threads": c}
            variations.append(_diff("threads", f"intra_op_num_threads={counts[0]}", f"intra_op_num_threads={c}", ref, runner(opts)(), names))
            settings.append((ref_opts, opts))
    if "graph_optimization" in vary:
        one = {"intra_op_num_threads": 1, **base}
        ref = runner({**one, "graph_optimization_level": "all"})()
        for level in _LEVELS:
            got = runner({**one, "graph_optimization_level": level})()
            variations.append(_diff("graph_optimization", "graph_optimization_level=all", f"graph_optimization_level={level}", ref, got, names))
            settings.append(({**one, "graph_optimization_level": "all"}, {**one, "graph_optimization_level": level}))
    if "deterministic_compute" in vary:
        ref = runner({**base, "use_deterministic_compute": False})()
        got = runner({**base, "use_deterministic_compute": True})()
        variations.append(_diff("deterministic_compute", "use_deterministic_compute=False", "use_deterministic_compute=True", ref, got, names))
        settings.append(({**base, "use_deterministic_compute": False}, {**base, "use_deterministic_compute": True}))
    if localise and any(not v.identical and not v.error for v in variations):
        exposed, config = exposed_for_ort(m, data, path)  # (serialized once for all the sessions below)
        for at, (v, (a, b)) in enumerate(zip(variations, settings, strict=True)):
            if not v.identical and not v.error:
                variations[at] = replace(v, first_node=_localise_ort(exposed, config, m, feeds, provider, a, b, runs))
    device = torch_device(provider)
    if torch_deterministic if torch_deterministic is not None else device.startswith("cuda"):
        variations += _torch_deterministic(m, feeds, device, runs, names, kernels, missing, localise)
    first = variations[0].report
    return ReproducibilityReport(m.graph.name or "model", provider, first.dtype if first else "", runs, tuple(variations))


def _torch_deterministic(
    model: Any,
    feeds: Mapping[str, Any],
    device: str,
    runs: int,
    names: Sequence[str],
    kernels: Mapping[Any, Any] | None = None,
    missing: str = "error",
    localise: bool = True,
) -> list[Variation]:
    """The torch evaluator `runs` times with deterministic algorithms on, then off, then on vs off;
    the process's previous setting is restored whatever happens."""
    from ..runtimes.evaluator import TorchEvaluator

    extra: dict[str, Any] = {"missing": missing} if missing != "error" else {}  # the evaluator's default
    evaluator = TorchEvaluator(model, device=device, kernels=kernels, **extra)
    tfeeds = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feeds.items()}
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    out: list[Variation] = []
    firsts: dict[bool, list[torch.Tensor]] = {}
    try:
        for flag in (True, False):
            label = f"torch {device} deterministic_algorithms={flag}"
            try:
                torch.use_deterministic_algorithms(flag)

                def run() -> list[torch.Tensor]:
                    outs = evaluator.run(None, tfeeds)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    return outs

                firsts[flag] = [t.clone() for t in run()]
                v = _repeat("torch_deterministic", f"{label}: run 1", run, runs, names)
                if localise and not v.identical:
                    v = replace(v, first_node=_localise_torch(evaluator, tfeeds, [flag] * runs))
                out.append(v)
            except RuntimeError as exc:  # e.g. cuBLAS without CUBLAS_WORKSPACE_CONFIG=:4096:8
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                out.append(Variation("torch_deterministic", f"{label}: run 1", f"runs 2-{runs}", error=msg))
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    if True in firsts and False in firsts:
        v = _diff("torch_deterministic", f"torch {device} deterministic_algorithms=True", "deterministic_algorithms=False", firsts[True], firsts[False], names)
        if localise and not v.identical:
            v = replace(v, first_node=_localise_torch(evaluator, tfeeds, [True, False]))
        out.append(v)
    return out


# -- the first node that differs -------------------------------------------------------------------

_NOT_LOCALISED = (
    "no node's output differs once every value is a graph output: the difference comes from how onnxruntime "
    "rewrites the graph across nodes (a fusion, which exposing every value prevents), or it did not recur"
)


def _first_differing(nodes: Sequence[onnx.NodeProto], reference: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> str:
    """The first node (graph order) with an output whose bits differ between `reference` and any of `others`."""
    for i, node in enumerate(nodes):
        for o in node.output:
            if not o or not isinstance(reference.get(o), torch.Tensor):
                continue
            a = reference[o]
            for other in others:
                b = other.get(o)
                if not isinstance(b, torch.Tensor):
                    continue
                if a.shape != b.shape or a.dtype != b.dtype:
                    return f"{node.name or f'{node.op_type}_{i}'} ({node.op_type}): output {o!r} is {b.dtype}{tuple(b.shape)} instead of {a.dtype}{tuple(a.shape)}"
                bits = bit_mismatches(a, b)
                if bits:
                    return f"{node.name or f'{node.op_type}_{i}'} ({node.op_type}): output {o!r}, {bits:,} of {a.numel():,} elements differ in their bits"
    return _NOT_LOCALISED


def _localise_ort(
    exposed: bytes, config: Mapping[str, str], m: onnx.ModelProto, feeds: Mapping[str, Any], provider: str, against: Mapping[str, Any], got: Mapping[str, Any] | None, runs: int
) -> str:
    """Every value under `against` vs under `got` (None: `against` again, `runs` times). `config`: the
    session config entries the exposed copy needs (where a model above 2 GB reads its weights)."""
    from ..runtimes.ort import OrtRunner

    def values(options: Mapping[str, Any], times: int) -> list[dict[str, Any]]:
        merged = {**options, **config}
        r = OrtRunner(exposed, provider=provider, session_options=merged or None)
        names = r.output_names
        return [dict(zip(names, r.run(names, feeds), strict=True)) for _ in range(times)]

    try:
        if got is None:
            first, *others = values(against, runs)
        else:
            (first,) = values(against, 1)
            others = values(got, 1)
    except Exception as exc:  # the exposed copy is a bonus: say why it could not run, keep the report
        return f"not localised: the copy of the model with every value exposed did not run ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
    return _first_differing(list(m.graph.node), first, others)


def _localise_torch(evaluator: Any, feeds: Mapping[str, Any], flags: Sequence[bool]) -> str:
    """Every value of the torch evaluator with deterministic algorithms set to each of `flags` in turn,
    the first run against the others; the process's setting is restored after."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    runs = []
    try:
        for flag in flags:
            torch.use_deterministic_algorithms(flag)
            runs.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in evaluator.run(None, feeds, intermediates=True).items()})
    except RuntimeError as exc:
        return f"not localised: the torch evaluator's run with every value kept failed ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    return _first_differing(evaluator.nodes, runs[0], runs[1:])
