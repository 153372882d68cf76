"""Conformance of the torch evaluator against ONNX's own node test suite (`onnx.backend.test.case.node`).

Each case runs through `TorchEvaluator` and is classified pass / wrong / unsupported / no kernel / error.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "KNOWN_UNSUPPORTED",
    "STATUSES",
    "CaseResult",
    "load_cases",
    "main",
    "op_under_test",
    "run_case",
    "run_cases",
]

#: the outcomes, in report order. "wrong" is a value, shape or dtype that differs from ONNX's expected
#: output; "unsupported" a variant the evaluator refuses by name (UnsupportedVariantError, a value torch
#: cannot hold, or an entry of KNOWN_UNSUPPORTED); "no kernel" an op without a kernel (MissingKernelError).
STATUSES = ("pass", "wrong", "unsupported", "no kernel", "error")

#: Cases that fail with an error rather than a refusal by a kernel, and why. fnmatch patterns on the
#: case name; a case listed here still counts as "wrong" if it computes something, and an entry that
#: matches a passing case is stale (tests/test_conformance.py fails on it).
KNOWN_UNSUPPORTED: dict[str, str] = {}

_TORCHLESS_DTYPES = ("float8", "float4", "int4", "uint4", "int2", "uint2")


@dataclass(frozen=True)
class CaseResult:
    name: str
    op: str
    status: str
    detail: str = ""
    #: every op of the case's graph (an `_expanded` case runs its op's function body)
    ops: tuple[str, ...] = ()


@functools.cache
def load_cases() -> tuple[Any, ...]:
    """Every node test case of the installed onnx package (generating them takes a few seconds)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        # the generators divide by zero on purpose to produce their infinities
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def _op_name(node: Any) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain and node.domain != "ai.onnx" else node.op_type


def op_under_test(case: Any, cases_by_name: dict[str, Any] | None = None) -> str:
    """The op a case tests: its single node's op, or for `*_expanded*` the op of its unexpanded twin."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return _op_name(nodes[0])
    stem = re.sub(r"_expanded.*$", "", case.name)
    twin = (cases_by_name or {}).get(stem)
    if twin is not None and len(twin.model.graph.node) == 1:
        return _op_name(twin.model.graph.node[0])
    return "+".join(sorted({_op_name(n) for n in nodes}))


def _known_reason(name: str) -> str | None:
    for pattern, reason in KNOWN_UNSUPPORTED.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def _as_array(value: Any) -> Any:
    """Data sets hold numpy arrays, or TensorProtos for types numpy lacks (bfloat16, float8, ...)."""
    import onnx
    import onnx.numpy_helper

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _untensorable(value: Any, what: str) -> str | None:
    """Why `value` cannot be a torch tensor, or None."""
    if value is None:
        return f"{what} is an empty optional"
    if isinstance(value, list | tuple):
        return f"{what} is a sequence"
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "SU":
        return f"{what} is a string tensor"
    name = arr.dtype.name
    if name.startswith(_TORCHLESS_DTYPES):
        return f"{what} has dtype {name}, which these kernels do not compute in"
    return None


def _type_refusal(model: Any) -> str | None:
    for vi in list(model.graph.input) + list(model.graph.output):
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"{vi.name!r} is of {kind.removesuffix('_type') if kind else 'no'} type, not a tensor"
    return None


def _mismatch(expected: np.ndarray, got: Any, rtol: float, atol: float) -> str | None:
    """Why `got` (a torch tensor) is not `expected` within the case's tolerance, or None."""
    from .runtimes.tensors import to_numpy

    g = to_numpy(got)
    e = np.asarray(expected)
    if g.dtype != e.dtype:
        return f"dtype {g.dtype} instead of {e.dtype}"
    if g.shape != e.shape:
        return f"shape {g.shape} instead of {e.shape}"
    if e.dtype.kind in "biu":
        if not np.array_equal(g, e):
            bad = int(np.sum(g != e))
            return f"{bad} of {e.size} values differ"
        return None
    g64, e64 = g.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    bad = np.flatnonzero(~close)
    i = int(bad[0])
    return (
        f"{bad.size} of {e.size} values off (first at flat index {i}: "
        f"got {g64.flat[i]!r}, expected {e64.flat[i]!r})"
    )


def run_case(case: Any, op: str | None = None) -> CaseResult:
    """Run every data set of `case` through TorchEvaluator and classify the outcome."""
    from .runtimes.evaluator import MissingKernelError, TorchEvaluator
    from .runtimes.kernels import UnsupportedVariantError
    from .runtimes.tensors import to_torch

    model = case.model
    op = op or op_under_test(case)
    ops = tuple(sorted({_op_name(n) for n in model.graph.node}))

    def result(status: str, detail: str = "") -> CaseResult:
        return CaseResult(case.name, op, status, detail, ops)

    refusal = _type_refusal(model)
    if refusal:
        return result("unsupported", refusal)
    init_names = {i.name for i in model.graph.initializer}
    input_names = [vi.name for vi in model.graph.input if vi.name not in init_names]
    output_names = [vi.name for vi in model.graph.output]
    data_sets = [
        ([_as_array(v) for v in inputs], [_as_array(v) for v in outputs])
        for inputs, outputs in case.data_sets
    ]
    for inputs, outputs in data_sets:
        for what, values, names in (("input", inputs, input_names), ("output", outputs, output_names)):
            for name, value in zip(names, values, strict=False):
                why = _untensorable(value, f"{what} {name!r}")
                if why:
                    return result("unsupported", why)

    try:
        ev = TorchEvaluator(model)
    except MissingKernelError as exc:
        missing = str(exc).split(";")[0].removeprefix("no torch kernel for ")
        return result("no kernel", missing)
    except UnsupportedVariantError as exc:
        return result("unsupported", str(exc))
    except Exception as exc:
        return _failed(result, case.name, f"construction: {type(exc).__name__}: {exc}")

    for k, (inputs, outputs) in enumerate(data_sets):
        feeds = {n: to_torch(np.asarray(v)) for n, v in zip(input_names, inputs, strict=False)}
        try:
            got = ev.run(output_names, feeds)
        except Exception as exc:
            cause: BaseException = exc
            while cause.__cause__ is not None:
                cause = cause.__cause__
            if isinstance(cause, UnsupportedVariantError):
                return result("unsupported", str(cause))
            return _failed(result, case.name, f"run: {type(exc).__name__}: {exc}")
        for name, e, g in zip(output_names, outputs, got, strict=True):
            why = _mismatch(e, g, case.rtol, case.atol)
            if why:
                where = f"data set {k}, output {name!r}" if len(data_sets) > 1 else f"output {name!r}"
                return result("wrong", f"{where}: {why}")
    return result("pass")


def _failed(result: Any, name: str, detail: str) -> CaseResult:
    reason = _known_reason(name)
    if reason:
        return result("unsupported", f"known: {reason}")
    return result("error", detail.splitlines()[0][:400])


def run_cases(
    cases: Sequence[Any] | None = None, *, ops: Sequence[str] | None = None, pattern: str | None = None
) -> list[CaseResult]:
    """Run the (selected) node test cases; `ops` keeps cases testing those ops, `pattern` matches names."""
    cases = load_cases() if cases is None else cases
    by_name = {c.name: c for c in cases}
    results = []
    for case in cases:
        if pattern and not fnmatch.fnmatchcase(case.name, pattern):
            continue
        op = op_under_test(case, by_name)
        if ops and op not in ops:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append(run_case(case, op))
    return results


def render(results: Sequence[CaseResult], *, verbose: bool = False) -> str:
    """A table of counts by op (ops with no case run by a kernel last), totals, and with `verbose` every non-pass."""
    by_op: dict[str, Counter[str]] = {}
    for r in results:
        by_op.setdefault(r.op, Counter())[r.status] += 1
    width = max([len(op) for op in by_op] + [10])
    head = f"{'op':<{width}} {'cases':>5} " + " ".join(f"{s:>11}" for s in STATUSES)
    lines = [head, "-" * len(head)]

    def row(name: str, counts: Counter[str]) -> str:
        total = sum(counts.values())
        return f"{name:<{width}} {total:>5} " + " ".join(f"{counts.get(s, 0):>11}" for s in STATUSES)

    covered = sorted(op for op, c in by_op.items() if c["no kernel"] < sum(c.values()))
    uncovered = sorted(op for op in by_op if op not in covered)
    lines.extend(row(op, by_op[op]) for op in covered)
    if uncovered:
        lines.append("-" * len(head))
        lines.extend(row(op, by_op[op]) for op in uncovered)
    total: Counter[str] = Counter(r.status for r in results)
    lines += ["-" * len(head), row("total", total)]
    lines.append(
        f"\n{total['pass']} of {len(results)} cases pass, {total['wrong']} wrong, "
        f"{total['unsupported']} unsupported, {total['no kernel']} without a kernel, {total['error']} errors; "
        f"{len(covered)} ops with a kernel, {len(uncovered)} without"
    )
    if verbose:
        for status in ("wrong", "error", "unsupported"):
            chosen = [r for r in results if r.status == status]
            if chosen:
                lines.append(f"\n{status}:")
                lines.extend(f"  {r.name} [{r.op}]: {r.detail}" for r in chosen)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_ortdiff conformance", description=__doc__
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", action="append", help="only cases testing this op (repeat)")
    parser.add_argument("-k", "--pattern", help="only cases whose name matches this fnmatch pattern")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that does not pass, with why")


def run_from_args(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    results = run_cases(ops=args.op, pattern=args.pattern)
    print(render(results, verbose=args.verbose))
    print(f"\n({time.perf_counter() - t0:.1f} s, case generation included)")
    return 1 if any(r.status == "wrong" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
