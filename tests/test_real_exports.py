"""Real architectures through both torch exporters, in float32 and float16: the torch evaluator against
onnxruntime and eager torch at the output's scale, quantized models within one quantization step.

`python tests/test_real_exports.py` writes the table (model × exporter × dtype) to /work/notes/real_exports_table.md.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import pytest
import torch
from kernel_harness import run_ort
from onnxruntime import __version__ as ort_version
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented
from real_models import MODELS, export, quantize

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.numerics.tensors import to_numpy

DTYPES = {"float32": torch.float32, "float16": torch.float16}
Runs = list[list[np.ndarray]]  # per input set, the outputs


class Case(NamedTuple):
    model: str
    exporter: str
    dtype: str

    @property
    def id(self) -> str:
        return "-".join(self)


class QuantCase(NamedTuple):
    model: str
    exporter: str  # of the float32 model that was quantized
    method: str  # "static" (QDQ) or "dynamic"

    @property
    def id(self) -> str:
        return "-".join(self)

    @property
    def source(self) -> Case:
        return Case(self.model, self.exporter, "float32")


# Every module with every exporter that can export it (real_models.MODELS says which cannot and why:
# torch.cond has no TorchScript export, a scripted Python loop no dynamo export), in both dtypes.
CASES = [Case(m, e, d) for m, spec in MODELS.items() for e in spec.exporters for d in DTYPES]
QUANT_CASES = [
    QuantCase("resnet_folded", "torchscript", "static"),  # Conv → QDQ around int8 Conv
    QuantCase("whisper", "dynamo", "static"),  # Conv1d, Gelu, Add between QDQ pairs
    QuantCase("vit", "dynamo", "dynamic"),  # DynamicQuantizeLinear + MatMulInteger / ConvInteger
]

#: ops each export must contain, so that a case tests what its name says
EXPECTED_OPS: dict[str, set[str]] = {
    "resnet_folded": {"Conv", "Relu", "Add"},
    "resnet_unfolded": {"Conv", "BatchNormalization"},
    "vit": {"Conv", "LayerNormalization", "Softmax", "MatMul"},
    "convnext": {"Conv", "ReduceMean", "Sqrt"},
    "unet": {"MaxPool", "ConvTranspose", "Resize", "Concat"},
    "pool_norm": {"AveragePool", "InstanceNormalization", "Gemm"},
    "whisper": {"Conv"},
    "mamba": {"Conv", "Slice", "Sigmoid"},
    "lstm": {"LSTM"},
    "gru": {"GRU"},
    "control_cond": {"If"},
    "control_loop": {"Loop"},
}
QUANT_OPS = {
    "static": {"QuantizeLinear", "DequantizeLinear"},
    "dynamic": {"DynamicQuantizeLinear"},
}


# -- tolerances at the output's scale ----------------------------------------------------------------


def float16_ulp(x: float) -> float:
    """The spacing of float16 numbers at magnitude `x` (2**-24 below the normal range)."""
    return float(np.spacing(np.float16(abs(x))))


def ort_tolerance(dtype: str, scale: float) -> float:
    """The evaluator vs onnxruntime: 1e-5 of the scale in float32 (a handful of float32 roundings on values
    of that size); 4 float16 ULPs at the scale in float16 (both round every op to float16; they may differ
    by one rounding per op and that difference is carried through a few ops)."""
    return 1e-5 * scale if dtype == "float32" else 4 * float16_ulp(scale)


def eager_tolerance(dtype: str, scale: float) -> float:
    """A runtime vs eager torch: looser (5e-5 of the scale, 8 float16 ULPs), since an exporter may reorder
    arithmetic (BatchNorm folded into Conv, Gelu fused or written with Erf) and eager float16 kernels may
    keep float32 between steps that ONNX ops round. (onnxruntime itself is within 4e-7 and 2 ULPs here.)"""
    return 5e-5 * scale if dtype == "float32" else 8 * float16_ulp(scale)


def oracle_tolerance(scale: float) -> float:
    """The float64 oracle on a float32 export vs the module run in float64: 1e-6 of the scale. Not tighter,
    because exports bake float32 constants in (BatchNorm folded into Conv weights, the attention scale,
    Gelu's 1/sqrt(2)): the oracle computes exactly the function the graph states, which is 1e-8–1e-9 away."""
    return 1e-6 * scale


def quant_step(reference: np.ndarray) -> float:
    """One step of an 8-bit quantizer covering the output's range (zero included), as
    DynamicQuantizeLinear or a calibrated QDQ pair would choose it."""
    r = reference.astype(np.float64)
    return float(max(0.0, r.max()) - min(0.0, r.min())) / 255


class Gap(NamedTuple):
    """The largest |a - b| over one output for one input set, the output's scale (max |reference|), and
    the tolerance at that scale."""

    feed: int
    output: int
    err: float
    scale: float
    tol: float

    @property
    def at_scale(self) -> float:
        return self.err / self.scale if self.scale else self.err

    @property
    def ok(self) -> bool:
        return self.err <= self.tol  # False for NaN


def gaps(got: Runs, expected: Runs, tolerance: Callable[[float], float]) -> list[Gap]:
    """Per input set and output: the largest |got - expected| at the scale of `expected`."""
    assert len(got) == len(expected), f"{len(got)} runs instead of {len(expected)}"
    out = []
    for f, (run_g, run_e) in enumerate(zip(got, expected, strict=True)):
        assert len(run_g) == len(run_e), f"{len(run_g)} outputs instead of {len(run_e)}"
        for i, (g, e) in enumerate(zip(run_g, run_e, strict=True)):
            assert g.shape == e.shape, f"output {i}: shape {g.shape} instead of {e.shape}"
            assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} instead of {e.dtype}"
            e64 = e.astype(np.float64)
            err = float(np.max(np.abs(g.astype(np.float64) - e64))) if e.size else 0.0
            scale = float(np.max(np.abs(e64))) if e.size else 0.0
            out.append(Gap(f, i, err, scale, tolerance(scale)))
    return out


def violations(found: list[Gap], what: str) -> list[str]:
    return [
        f"{what}, input set {g.feed}, output {g.output}: max |Δ| {g.err:.3g} > {g.tol:.3g} "
        f"(scale {g.scale:.3g}: {g.at_scale:.2e} of it)"
        for g in found
        if not g.ok
    ]


# -- the lab: exports, runs and results, each computed once per session ------------------------------------


class OrtLacksKernel(Exception):
    """onnxruntime's CPU provider has no kernel for an op at this dtype (session creation: NOT_IMPLEMENTED)."""

    def __init__(self, op: str) -> None:
        super().__init__(op)
        self.op = op


@dataclass
class Exported:
    model: onnx.ModelProto
    feeds: list[dict[str, np.ndarray]]  # per input set, by graph input name
    eager: Runs  # the module's outputs on each input set
    eager64: Runs | None  # the same in float64 (for float32 exports: what the oracle is held to)


class Lab:
    """Exports, quantizations and runs, each done once per session (an export costs about a second)."""

    def __init__(self) -> None:
        self._exports: dict[Case, Exported] = {}
        self._quantized: dict[QuantCase, onnx.ModelProto] = {}
        self._ort: dict[Case | QuantCase, Runs | OrtLacksKernel] = {}
        self._evaluated: dict[Case | QuantCase, Runs] = {}
        self._oracle: dict[Case, Runs] = {}
        #: (case id, "ort" | "eager") -> the table's cell
        self.table: dict[tuple[str, str], str] = {}

    def exported(self, case: Case) -> Exported:
        if case not in self._exports:
            spec, dtype = MODELS[case.model], DTYPES[case.dtype]
            model = export(case.model, case.exporter, dtype)
            module, input_sets = spec.module(dtype), spec.all_inputs(dtype)
            inits = {i.name for i in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in inits]
            assert len(names) == len(input_sets[0]), f"{case.id}: graph inputs {names} for {len(input_sets[0])} arguments"
            feeds = [{n: to_numpy(a) for n, a in zip(names, args, strict=True)} for args in input_sets]
            eager = _run_module(module, input_sets)
            eager64 = None
            if case.dtype == "float32":
                eager64 = _run_module(spec.module(torch.float64), spec.all_inputs(torch.float64))
            self._exports[case] = Exported(model, feeds, eager, eager64)
        return self._exports[case]

    def quantized(self, q: QuantCase) -> onnx.ModelProto:
        if q not in self._quantized:
            self._quantized[q] = quantize(self.exported(q.source).model, q.method)
        return self._quantized[q]

    def made(self, key: Case | QuantCase) -> onnx.ModelProto | None:
        """The export or quantized model if this session made it (None otherwise)."""
        if isinstance(key, QuantCase):
            return self._quantized.get(key)
        exp = self._exports.get(key)
        return exp.model if exp is not None else None

    def model_and_feeds(self, key: Case | QuantCase) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
        if isinstance(key, QuantCase):  # the quantized float32 export, fed what the export is fed
            return self.quantized(key), self.exported(key.source).feeds
        exp = self.exported(key)
        return exp.model, exp.feeds

    def ort(self, key: Case | QuantCase) -> Runs:
        """onnxruntime's outputs (CPU, graph optimizations disabled) on each input set."""
        if key not in self._ort:
            model, feeds = self.model_and_feeds(key)
            try:
                self._ort[key] = [run_ort(model, f) for f in feeds]
            except OrtNotImplemented as exc:
                m = re.search(r"implementation for (\w+)\((\d+)\)", str(exc))
                self._ort[key] = OrtLacksKernel(f"{m.group(1)}({m.group(2)})" if m else str(exc))
        found = self._ort[key]
        if isinstance(found, OrtLacksKernel):
            raise found
        return found

    def evaluated(self, key: Case | QuantCase) -> Runs:
        """The torch evaluator's outputs on each input set (a MissingKernelError is raised on every call)."""
        if key not in self._evaluated:
            model, feeds = self.model_and_feeds(key)
            evaluator = TorchEvaluator(model)
            self._evaluated[key] = [
                [to_numpy(t) for t in evaluator.run(None, {k: torch.from_numpy(v) for k, v in f.items()})]
                for f in feeds
            ]
        return self._evaluated[key]

    def oracle(self, case: Case) -> Runs:
        """The float64 oracle's outputs (`compute_dtype=torch.float64`) on each input set."""
        if case not in self._oracle:
            model, feeds = self.model_and_feeds(case)
            evaluator = TorchEvaluator(model, compute_dtype=torch.float64)
            self._oracle[case] = [
                [to_numpy(t) for t in evaluator.run(None, {k: torch.from_numpy(v) for k, v in f.items()})]
                for f in feeds
            ]
        return self._oracle[case]

    def record(self, key: Case | QuantCase, comparison: str, found: list[Gap]) -> None:
        """The table's cell: the largest error at scale (and in float16 ULPs at scale, or quantization steps)."""
        cell = f"{max(g.at_scale for g in found):.1e}"
        if isinstance(key, QuantCase):
            cell += f" ({max(g.err / g.tol for g in found):.2f} step)"
        elif key.dtype == "float16":
            cell += f" ({max(g.err / float16_ulp(g.scale) for g in found):.1f} ulp)"
        if not all(g.ok for g in found):
            cell += " **over tolerance**"
        self.table[(key.id, comparison)] = cell


def _run_module(module: torch.nn.Module, input_sets: list[tuple[torch.Tensor, ...]]) -> Runs:
    runs = []
    with torch.no_grad():
        for args in input_sets:
            out = module(*args)
            runs.append([to_numpy(t) for t in (out if isinstance(out, tuple) else (out,))])
    return runs


def check_case(lab: Lab, case: Case) -> list[str]:
    """The evaluator vs eager torch, then vs onnxruntime, and onnxruntime vs eager torch; in float32 also
    the float64 oracle vs the module run in float64: what is out of tolerance, one line each. Raises
    OrtLacksKernel (after the eager comparisons) where onnxruntime cannot run the export at this dtype."""
    exp = lab.exported(case)
    ops = set(_all_ops(exp.model.graph))
    # each export must contain the ops its name promises: an exporter that changed how it lowers a module
    # would otherwise turn, say, a Conv test into a MatMul test silently
    assert EXPECTED_OPS[case.model] <= ops, f"{case.id}: no {EXPECTED_OPS[case.model] - ops} in {sorted(ops)}"
    assert not (case.model == "resnet_folded" and "BatchNormalization" in ops), "BatchNorm was not folded"
    evaluated = lab.evaluated(case)
    eager_tol = functools.partial(eager_tolerance, case.dtype)
    found = gaps(evaluated, exp.eager, eager_tol)
    lab.record(case, "eager", found)
    problems = violations(found, "evaluator vs eager torch")
    if exp.eager64 is not None:
        found = gaps(lab.oracle(case), exp.eager64, oracle_tolerance)
        lab.record(case, "oracle", found)
        problems += violations(found, "float64 oracle vs eager torch in float64")
    try:
        expected = lab.ort(case)
    except OrtLacksKernel as exc:
        lab.table[(case.id, "ort")] = f"skipped: onnxruntime has no {case.dtype} {exc.op}"
        assert not problems, "\n".join(problems)
        raise
    found = gaps(evaluated, expected, functools.partial(ort_tolerance, case.dtype))
    lab.record(case, "ort", found)
    problems += violations(found, "evaluator vs onnxruntime")
    problems += violations(gaps(expected, exp.eager, eager_tol), "onnxruntime vs eager torch")
    return problems


def check_quantized(lab: Lab, q: QuantCase) -> list[str]:
    """The quantized model on the evaluator vs onnxruntime, within one quantization step of the output."""
    ops = set(_all_ops(lab.quantized(q).graph))
    assert QUANT_OPS[q.method] <= ops, f"{q.id}: no {QUANT_OPS[q.method] - ops} in {sorted(ops)}"
    expected = lab.ort(q)
    steps = [quant_step(run[0]) for run in expected]
    found = [
        g._replace(tol=steps[g.feed]) for g in gaps(lab.evaluated(q), expected, lambda s: 0.0)
    ]
    lab.record(q, "ort", found)
    return violations(found, "evaluator vs onnxruntime")


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    found = Lab()
    yield found
    if found.table:  # shown with -s: the figures behind the closing note
        print("\n" + render_table(found))


# -- tests --------------------------------------------------------------------------------------------------
# One test per export, so that under pytest-xdist each export is made by one worker only.


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_real_export_evaluator_vs_onnxruntime_vs_eager(lab: Lab, case: Case) -> None:
    try:
        problems = check_case(lab, case)
    except OrtLacksKernel as exc:
        pytest.skip(f"onnxruntime's CPU provider has no {case.dtype} kernel for {exc.op}")
    assert not problems, f"{case.id}:\n" + "\n".join(problems)


@pytest.mark.parametrize("q", QUANT_CASES, ids=lambda q: q.id)
def test_quantized_evaluator_matches_onnxruntime_within_one_step(lab: Lab, q: QuantCase) -> None:
    problems = check_quantized(lab, q)
    assert not problems, f"{q.id}:\n" + "\n".join(problems)


def _all_ops(graph: onnx.GraphProto) -> Iterator[str]:
    for node in graph.node:
        yield node.op_type
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_ops(attr.g)


# -- the table ----------------------------------------------------------------------------------------------


def render_table(lab: Lab) -> str:
    """Markdown: per case, max |evaluator - onnxruntime| / max |onnxruntime| and the same against eager."""

    def cell(key: Case | QuantCase, comparison: str) -> str:
        return lab.table.get((key.id, comparison), "—")

    def nodes(key: Case | QuantCase) -> str:  # top-level nodes of the graph, when it was made
        model = lab.made(key)
        return str(len(model.graph.node)) if model is not None else "—"

    head = [
        "| model | exporter | dtype | nodes | evaluator vs onnxruntime | evaluator vs eager torch | float64 oracle vs eager float64 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [
        f"| {c.model} | {c.exporter} | {c.dtype} | {nodes(c)} | {cell(c, 'ort')} | {cell(c, 'eager')} | {cell(c, 'oracle')} |"
        for c in CASES
    ]
    quant = [
        f"| {q.model} (quantize_{q.method}) | {q.exporter} | int8 | {nodes(q)} | {cell(q, 'ort')} | — | — |"
        for q in QUANT_CASES
    ]
    return "\n".join(head + rows + quant)


def main(path: Path) -> None:
    """Every case outside pytest, what fails written into the table instead of raised."""
    lab = Lab()
    start = time.process_time()
    checks: list[tuple[Case | QuantCase, Callable[[], list[str]]]] = [
        *((c, functools.partial(check_case, lab, c)) for c in CASES),
        *((q, functools.partial(check_quantized, lab, q)) for q in QUANT_CASES),
    ]
    for key, check in checks:
        try:
            check()
        except OrtLacksKernel:
            pass  # check_case wrote the cell
        except Exception as exc:
            lab.table.setdefault((key.id, "ort"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    cpu = time.process_time() - start
    table = render_table(lab)
    path.write_text(
        "# Real exports: the torch evaluator's largest error at the output's scale\n\n"
        "max |Δ| / max |reference| over each case's outputs and input sets; onnxruntime on CPU with graph "
        "optimizations disabled. Tolerances: vs onnxruntime 1e-5 of the scale (float32), 4 float16 ULPs at "
        "the scale (float16), one 8-bit quantization step of the output's range (int8); vs eager torch 5e-5 "
        "of the scale (float32), 8 float16 ULPs at the scale (float16); the float64 oracle on the float32 "
        "export vs the module run in float64, 1e-6 of the scale (the exports hold float32 constants).\n\n"
        f"Written by `python tests/test_real_exports.py` (torch {torch.__version__}, "
        f"onnxruntime {ort_version}, {cpu:.0f} s of CPU).\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/notes/real_exports_table.md"))
